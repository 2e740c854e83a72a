"""State helpers for algorithms: named vectors that checkpoints save and restore without code of their own.

`ClientVectors` holds one flat vector per client on the rank that hosts the client (SCAFFOLD's c_i, FedDyn's
g_i, MOON's previous model, SAFL's z_k); `ServerVectors` holds the server's vectors on rank 0 (SCAFFOLD's c,
FedDyn's h, the server optimizer's moments). An algorithm declares them as attributes in `__init__`; the
base class's state hooks find every such attribute and save or load it under the vector's name, so a
stateful algorithm writes no checkpoint code. States travel as dicts of numpy arrays, never pickled.
"""

from __future__ import annotations

import numpy as np
import torch


class ClientVectors(dict):
    """One flat vector per client (cid -> tensor), kept on the rank that hosts the client and saved in
    checkpoints under `name`. A client without one has none (never trained); loaded vectors arrive on the
    CPU and move to the model's device at first use (`on`)."""

    def __init__(self, name):
        super().__init__()
        self.name = name

    def on(self, cid, device):
        vec = self.get(cid)
        if vec is not None and vec.device != device:
            vec = self[cid] = vec.to(device)
        return vec

    def or_zeros(self, cid, length, device):
        """The client's vector, or zeros of `length` for a client that has none yet (not stored)."""
        vec = self.on(cid, device)
        return torch.zeros(length, dtype=torch.float32, device=device) if vec is None else vec

    def state(self, cid) -> dict:
        vec = self.get(cid)
        return {} if vec is None else {self.name: vec.detach().cpu().numpy().copy()}

    def load(self, cid, state: dict):
        if self.name in state:
            self[cid] = torch.from_numpy(np.array(state[self.name], dtype=np.float32))
        else:
            self.pop(cid, None)


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
