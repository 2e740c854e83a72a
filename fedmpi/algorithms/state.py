"""State helpers for algorithms: named vectors that checkpoints save and restore without code of their own.

`ClientVectors` holds one flat vector per client on the rank that hosts the client (SCAFFOLD's c_i, FedDyn's
g_i, MOON's previous model, SAFL's z_k); `ServerVectors` holds the server's vectors on rank 0 (SCAFFOLD's c,
FedDyn's h, the server optimizer's moments). An algorithm declares them as attributes in `__init__`; the
base class's state hooks find every such attribute and save or load it under the vector's name, so a
stateful algorithm writes no checkpoint code. States travel as dicts of numpy arrays, never pickled.

Where client vectors live (issue 14): a rank's vectors are kept in its `ClientStateStore`, in host memory
up to `runtime.client_state_memory` bytes and in a file of the rank's beyond that (a numpy memmap in
$TMPDIR, unlinked at creation, so it goes with the process). A round's clients meet their vectors on the
model's device: `on` copies a vector there for the round, `[cid] = vec` keeps the new one there, and
`end_round` (the experiment calls it after every round) writes the changed ones back to the store and
drops the device copies. Device memory thus holds the round's clients only, whatever N is.
"""

from __future__ import annotations

import tempfile
from collections.abc import MutableMapping

import numpy as np
import torch

SPILL_FIRST_ROWS = 64      # rows of a spill file's first extent; it doubles as it fills


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
            place[0].rows[place[1]] = array
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
        spill.rows[row] = array.reshape(-1)
        self.spilled[key] = (spill, row)

    def get(self, key):
        """The stored array (in memory, or a row of its spill file), or None."""
        if key in self.memory:
            return self.memory[key]
        place = self.spilled.get(key)
        return None if place is None else place[0].rows[place[1]]

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
        return sum(f.rows.itemsize * f.rows.shape[1] for f, _ in self.spilled.values())

    def end_round(self):
        """After a round, on every rank: the round's changed vectors back to the store, device copies dropped."""
        for vectors in self.bound:
            vectors.end_round()


class SpillFile:
    """Rows of one length and dtype in an anonymous file (numpy memmap), grown by doubling; freed rows reused."""

    def __init__(self, length, dtype, folder=None):
        self.length, self.dtype = int(length), np.dtype(dtype)
        self.file = tempfile.TemporaryFile(dir=folder or None, prefix="fedmpi-client-state-")
        self.rows = np.zeros((0, self.length), dtype=self.dtype)
        self.free, self.used = [], 0

    def fits(self, array):
        return array.size == self.length and array.dtype == self.dtype

    def take(self):
        if self.free:
            return self.free.pop()
        if self.used == len(self.rows):
            capacity = max(SPILL_FIRST_ROWS, 2 * len(self.rows))
            self.file.truncate(capacity * self.length * self.dtype.itemsize)
            self.rows = np.memmap(self.file, dtype=self.dtype, mode="r+", shape=(capacity, self.length))
        self.used += 1
        return self.used - 1

    def give_back(self, row):
        self.free.append(row)


class ClientVectors(MutableMapping):
    """One flat vector per client (cid -> tensor), kept on the rank that hosts the client and saved in
    checkpoints under `name`. A client without one has none (never trained).

    Vectors live in a ClientStateStore (their own until the experiment binds them to the rank's). `on(cid,
    device)` and `vectors[cid]` give the client's vector, on `device` for `on` (a copy kept for the round on
    a GPU; on the CPU a view of the stored array); `vectors[cid] = tensor` sets it for the rest of the round;
    `end_round` writes the round's new vectors to the store. Mapping methods (`get`, `in`, `len`, `pop`)
    see both."""

    def __init__(self, name, store=None):
        self.name = name
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
        stored = self.store.get((self.name, cid))
        if stored is None:
            raise KeyError(cid)
        return torch.from_numpy(stored)

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
        """The client's vector on `device` (kept there until `end_round`), or None."""
        vec = self.get(cid)
        if vec is not None and vec.device != torch.device(device):
            vec = vec.to(device)
            self._round[cid] = vec
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

    def state(self, cid) -> dict:
        vec = self.get(cid)
        return {} if vec is None else {self.name: vec.detach().cpu().numpy().copy()}

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

    def __init__(self, dtype=torch.float32, fill=None, **lengths):
        self.dtype, self.lengths, self._vectors = dtype, dict(lengths), {}
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

    def load(self, state: dict):
        for name in self.lengths:
            if name in state:
                self._vectors[name] = torch.from_numpy(np.array(state[name])).to(self.dtype)
            else:
                self._vectors.pop(name, None)


def as_numpy_state(state: dict) -> dict:
    """A state dict with every tensor as a CPU numpy array (what checkpoints store)."""
    return {k: (v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v))
            for k, v in state.items()}
