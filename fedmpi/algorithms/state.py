"""State helpers for algorithms: named vectors that checkpoints save and restore without code of their own.

`ClientVectors` holds one flat vector per client on the rank that hosts the client (SCAFFOLD's c_i, FedDyn's
g_i, MOON's previous model, SAFL's z_k); `ServerVectors` holds the server's vectors on rank 0 (SCAFFOLD's c,
FedDyn's h, the server optimizer's moments). An algorithm declares them as attributes in `__init__`; the
base class's state hooks find every such attribute and save or load it under the vector's name, so a
stateful algorithm writes no checkpoint code. States travel as dicts of numpy arrays, never pickled.

Where client vectors live: a rank's vectors are kept in its `ClientStateStore`, in host memory
up to `runtime.client_state_memory` bytes and in files of the rank's beyond that (in $TMPDIR, unlinked at
creation, so they go with the process; read and written with pread/pwrite, so spilled state counts in the
kernel's reclaimable page cache, not in the process's memory). A round's clients meet their vectors on the
model's device: `on` copies a vector there for the round, `[cid] = vec` keeps the new one there, and
`end_round` (the experiment calls it after every round) writes the changed ones back to the store and
drops the device copies. Device memory thus holds the round's clients only, whatever N is.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import MutableMapping

import numpy as np

from fedmpi.core.lazy import torch


class ClientStateStore:
    """One rank's per-client arrays, by key (the vector's name, client id): host memory up to `budget` bytes
    (None: no limit), the rest in spill files of the rank's under `folder` (default $TMPDIR), one file per
    vector length and dtype. Arrays keep their place: a key once spilled is rewritten in its file."""

    def __init__(self, budget=None, folder=None):
        self.budget, self.folder = budget, folder
        self.memory = {}            # key -> np.ndarray
        self.spilled = {}           # key -> (SpillFile, row)
        self.memory_bytes = 0
        self.files = {}             # (length, dtype) -> SpillFile
        self.bound = []             # the ClientVectors that keep their vectors here (`end_round`)

    def put(self, key, array):
        """Stores a copy of the 1-D `array` under `key` (in memory a new copy: a view handed out before keeps
        the old values, as a replaced tensor would)."""
        array = np.asarray(array)
        place = self.spilled.get(key)
        if place is not None and place[0].fits(array):
            place[0].write(place[1], array)
            return
        self.drop(key)
        if self.budget is None or self.memory_bytes + array.nbytes <= self.budget:
            self.memory[key] = array.copy()
            self.memory_bytes += array.nbytes
            return
        spill = self.files.get((array.size, array.dtype.str))
        if spill is None:
            spill = self.files[(array.size, array.dtype.str)] = SpillFile(array.size, array.dtype, self.folder)
        row = spill.take()
        spill.write(row, array)
        self.spilled[key] = (spill, row)

    def get(self, key):
        """The stored array (in memory), a copy read from its spill file, or None."""
        if key in self.memory:
            return self.memory[key]
        place = self.spilled.get(key)
        return None if place is None else place[0].read(place[1])

    def drop(self, key):
        old = self.memory.pop(key, None)
        if old is not None:
            self.memory_bytes -= old.nbytes
        place = self.spilled.pop(key, None)
        if place is not None:
            place[0].give_back(place[1])

    def keys(self):
        return list(self.memory) + list(self.spilled)

    @property
    def spilled_bytes(self):
        return sum(f.row_bytes for f, _ in self.spilled.values())

    def end_round(self):
        """After a round, on every rank: the round's changed vectors back to the store, device copies dropped."""
        for vectors in self.bound:
            vectors.end_round()


class SpillFile:
    """Rows of one length and dtype in an anonymous file, read and written with pread/pwrite: the rows pass
    through the kernel's page cache, which it can reclaim, never through this process's own memory (a
    memory map would count them in the process's resident set). Freed rows are reused."""

    def __init__(self, length, dtype, folder=None):
        self.length, self.dtype = int(length), np.dtype(dtype)
        self.row_bytes = self.length * self.dtype.itemsize
        self.file = tempfile.TemporaryFile(dir=folder or None, prefix="fedmpi-client-state-")
        self.free, self.used = [], 0

    def fits(self, array):
        return array.size == self.length and array.dtype == self.dtype

    def take(self):
        if self.free:
            return self.free.pop()
        self.used += 1
        return self.used - 1

    def give_back(self, row):
        self.free.append(row)

    def write(self, row, array):
        data = np.ascontiguousarray(array, dtype=self.dtype).reshape(-1)
        written = os.pwrite(self.file.fileno(), memoryview(data).cast("B"), row * self.row_bytes)
        if written != self.row_bytes:
            raise OSError(f"client-state spill file: wrote {written} of {self.row_bytes} bytes")

    def read(self, row):
        """A new writable array holding row `row`."""
        out = np.empty(self.length, dtype=self.dtype)
        if os.preadv(self.file.fileno(), [memoryview(out).cast("B")], row * self.row_bytes) != self.row_bytes:
            raise OSError(f"client-state spill file: row {row} is shorter than {self.row_bytes} bytes")
        return out


class ClientVectors(MutableMapping):
    """One flat vector per client (cid -> tensor), kept on the rank that hosts the client and saved in
    checkpoints under `name`. A client without one has none (never trained).

    Vectors live in a ClientStateStore (their own until the experiment binds them to the rank's). `on(cid,
    device)` and `vectors[cid]` give the client's vector, on `device` for `on` (a copy kept for the round on
    a GPU or when read from a spill file; on the CPU otherwise a view of the stored array); `vectors[cid] =
    tensor` sets it for the rest of the round; `end_round` writes the round's vectors (set, or copies that
    may have been changed in place) to the store. Mapping methods (`get`, `in`, `len`, `pop`) see both."""

    def __init__(self, name, store=None, length=None, within=None, whole=False):
        self.name = name
        self.length = length    # the declared vector length (checked when a checkpoint is loaded); None: any
        # The declared values, checked when a checkpoint is loaded: (low, high) bounds (APFL's alpha in [0, 1]),
        # `whole` for indices kept as floats (IFCA's cluster choice); None: any finite value.
        self.within, self.whole = within, bool(whole)
        self.store = store if store is not None else ClientStateStore()
        self.store.bound.append(self)
        self._round = {}        # cid -> tensor: this round's vectors on the device they were used on
        self._changed = set()   # cids set this round (written back by end_round)

    def bind(self, store):
        """Moves every vector into `store` (the rank's), which from now on keeps them."""
        if store is self.store:
            return
        self.end_round()
        for cid in self._stored_ids():
            store.put((self.name, cid), self.store.get((self.name, cid)))
            self.store.drop((self.name, cid))
        self.store.bound.remove(self)
        self.store = store
        store.bound.append(self)

    def _stored_ids(self):
        return [cid for name, cid in self.store.keys() if name == self.name]

    def __getitem__(self, cid):
        vec = self._round.get(cid)
        if vec is not None:
            return vec
        key = (self.name, cid)
        stored = self.store.get(key)
        if stored is None:
            raise KeyError(cid)
        vec = torch.from_numpy(stored)
        if key not in self.store.memory:
            # A copy read from the spill file: kept for the round and written back at its end, so that a
            # change made in place (MOON updates its previous model so) is kept as with a vector in memory.
            self._round[cid] = vec
            self._changed.add(cid)
        return vec

    def __setitem__(self, cid, vec):
        self._round[cid] = vec
        self._changed.add(cid)

    def __delitem__(self, cid):
        present = cid in self._round or self.store.get((self.name, cid)) is not None
        self._round.pop(cid, None)
        self._changed.discard(cid)
        self.store.drop((self.name, cid))
        if not present:
            raise KeyError(cid)

    def __iter__(self):
        return iter(sorted(set(self._round) | set(self._stored_ids())))

    def __len__(self):
        return len(set(self._round) | set(self._stored_ids()))

    def on(self, cid, device):
        """The client's vector on `device`, or None. A copy made for `device` is kept there for the round and
        written back at its end (it may be changed in place)."""
        vec = self.get(cid)
        if vec is not None and vec.device != torch.device(device):
            vec = vec.to(device)
            self._round[cid] = vec
            self._changed.add(cid)
        return vec

    def or_zeros(self, cid, length, device):
        """The client's vector, or zeros of `length` for a client that has none yet (not stored)."""
        vec = self.on(cid, device)
        return torch.zeros(length, dtype=torch.float32, device=device) if vec is None else vec

    def end_round(self):
        """The vectors set this round to the store (host memory or its spill file); device copies dropped."""
        for cid in self._changed:
            self.store.put((self.name, cid), self._round[cid].detach().to("cpu").numpy())
        self._round.clear()
        self._changed.clear()

    def __contains__(self, cid):
        return cid in self._round or (self.name, cid) in self.store.memory or (self.name, cid) in self.store.spilled

    def state(self, cid) -> dict:
        """The client's vector for its checkpoint (read without keeping a copy: a checkpoint reads them all)."""
        vec = self._round.get(cid)
        if vec is not None:
            return {self.name: vec.detach().cpu().numpy().copy()}
        stored = self.store.get((self.name, cid))
        return {} if stored is None else {self.name: np.array(stored)}

    def spec(self) -> dict:
        """{name: (shape, dtype)} of what a client's checkpoint entry must be (shape None: any 1-D length)."""
        return {self.name: (None if self.length is None else (int(self.length),), np.dtype(np.float32))}

    def bounds(self) -> dict:
        """{name: (low, high, whole)} of the values a client's entry may hold; {} when any finite value may."""
        return {} if self.within is None and not self.whole else {self.name: (*(self.within or (None, None)),
                                                                                self.whole)}

    def load(self, cid, state: dict):
        self._round.pop(cid, None)
        self._changed.discard(cid)
        if self.name in state:
            self.store.put((self.name, cid), np.array(state[self.name], dtype=np.float32).reshape(-1))
        else:
            self.store.drop((self.name, cid))


def bind_client_state(store, *owners):
    """Every ClientVectors attribute of `owners` (an algorithm, an upload stage's parts) keeps its vectors in
    the rank's `store` from now on."""
    for owner in owners:
        for value in list(vars(owner).values()):
            if isinstance(value, ClientVectors):
                value.bind(store)
            elif hasattr(value, "bind_client_state"):
                value.bind_client_state(store)


class ServerVectors:
    """Named server-side vectors, created on first use on the device asked for.

    `get(name, device)` returns the vector (allocating it with its declared length, dtype and initial value:
    zero unless `fill` names another), and the state round-trips through `state()` / `load()` for
    checkpoints."""

    def __init__(self, dtype=None, fill=None, **lengths):
        # None: float32 (a default read at call time, so that importing this module does not import torch)
        self.dtype, self.lengths, self._vectors = dtype or torch.float32, dict(lengths), {}
        self.fill = dict(fill or {})

    def _initial(self, name, device):
        return torch.full((self.lengths[name],), float(self.fill.get(name, 0.0)), dtype=self.dtype, device=device)

    def get(self, name, device) -> torch.Tensor:
        vec = self._vectors.get(name)
        if vec is None:
            vec = self._initial(name, device)
        elif vec.device != torch.device(device):
            vec = vec.to(device)
        self._vectors[name] = vec
        return vec

    def state(self) -> dict:
        """Every declared vector (its initial value where never used), as numpy arrays."""
        return {name: (self._vectors[name] if name in self._vectors else self._initial(name, "cpu"))
                .detach().cpu().numpy().copy() for name in self.lengths}

    def spec(self) -> dict:
        """{name: (shape, dtype)} of every declared vector, what a checkpoint must hold (nothing allocated)."""
        dtype = torch.empty(0, dtype=self.dtype).numpy().dtype
        return {name: ((int(length),), dtype) for name, length in self.lengths.items()}

    def load(self, state: dict):
        for name in self.lengths:
            if name in state:
                self._vectors[name] = torch.from_numpy(np.array(state[name])).to(self.dtype)
            else:
                self._vectors.pop(name, None)


def declared_specs(owner, kind) -> dict:
    """{name: (shape, dtype)} of every `kind` (ServerVectors or ClientVectors) attribute of `owner`: the state
    it declares, which a checkpoint's entries are checked against before they are loaded."""
    specs = {}
    for value in vars(owner).values():
        if isinstance(value, kind):
            specs.update(value.spec())
    return specs


def declared_bounds(owner) -> dict:
    """{name: (low, high, whole)} of every ClientVectors attribute of `owner` that declares its values."""
    bounds = {}
    for value in vars(owner).values():
        if isinstance(value, ClientVectors):
            bounds.update(value.bounds())
    return bounds


def as_numpy_state(state: dict) -> dict:
    """A state dict with every tensor as a CPU numpy array (what checkpoints store)."""
    return {k: (v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v))
            for k, v in state.items()}
