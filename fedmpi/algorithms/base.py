"""The algorithm-hooks interface: what an FL algorithm is, as far as the round loop is concerned.

An algorithm is a small class of hooks in the spirit of pfl-research's FedAvg. It does tensor arithmetic
only: no MPI, no files. The round loop (`fedmpi.experiment`) owns communication and calls, per round:

  server:  down = down_payload(x)                  -> broadcast to every worker
  worker:  for each selected client hosted here:
               client_start(client, down, model)      (load the start point into the model, in place)
               train with grad_hook / loss_fn         (local SGD)
               weight = accumulate(client, down, model, stats, acc)   (add this client's upload to acc)
  both:    acc summed over ranks (one Reduce)
  server:  x = server_update(x, acc, weight_sum)

Upload sums arrive as float64 (exact enough that the result does not depend on the number of ranks);
the global model `x` and the broadcast are float32. Vectors have `dim` elements (the flat model).
`down_vectors` and `up_vectors` say how many such vectors travel per client in each direction (SCAFFOLD: 2
and 2); `bytes_up`/`bytes_down` are derived from them.
`up_scalars` extra sums ride after the upload vectors in the same reduction (FedNova's sum of p_i a_i):
the accumulator has `up_vectors * dim + up_scalars` elements.

Per-client state (SCAFFOLD controls, SAFL models, ...) lives in the algorithm instance on the rank that
hosts the client and is exposed through `client_state`/`load_client_state` for checkpoints; server state
(on rank 0) through `server_state`/`load_server_state`. States are dicts of arrays, never pickled.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from fedmpi.errors import ConfigError


@dataclass
class ClientRun:
    """What a worker knows about one client's training this round."""

    cid: int
    round: int
    n_samples: int
    steps: int = 0
    loss_sum: float = 0.0
    figures: dict = field(default_factory=dict)   # per-client figures for /clients/<name> this round


class Algorithm:
    name = "base"
    down_vectors = 1
    up_vectors = 1
    up_scalars = 0
    client_columns = ()   # names of per-client figures the algorithm sets in ClientRun.figures
    uses_server_set = False   # needs the server's own set (FSL's D0, data sharing's G, SAFL's probe)
    protocol = "reduce"       # how uploads travel: "reduce" (one Reduce), "route" (FedSkip), "gather" (gated SAFL)

    def __init__(self, cfg, dim, n_params):
        self.cfg, self.dim, self.n_params = cfg, dim, n_params
        self.keys = cfg.algorithm

    # -- set-up ---------------------------------------------------------------------------------
    server_set_required = ""  # non-empty: a hint why the server's set must not be empty
    shares_data = False       # `clients` merges shared data into the clients' sets (/partition/shared)

    def setup(self, sizes, server_idx, x0=None):
        """Called on every rank before training: the clients' sample counts (of the partition, before
        `clients` reshapes it), the indices of the server's own set into the training set (empty if none),
        and the initial model x_0 (the same on every rank)."""
        self.sizes, self.server_idx = np.asarray(sizes), np.asarray(server_idx, dtype=np.int64)
        if self.server_set_required and len(self.server_idx) == 0:
            raise ConfigError(f"algorithm.name = {self.name!r} needs the server's set: set server_data.size > 0 "
                              f"({self.server_set_required})")

    def initial_model(self, x0, server_trainer):
        """x_0 on the server; pretraining or warm-up on the server's set goes here."""
        return x0

    def round_metrics(self) -> dict:
        """Extra per-round figures for /metrics (server side), e.g. FSL's server loss."""
        return {}

    # -- federation shape ---------------------------------------------------------------------
    def clients(self, parts):
        """The client index sets this algorithm trains on (central: the union as one client)."""
        return parts

    def select(self, round_, selected, sizes):
        """The clients that train this round, given the standard draw `selected`."""
        return selected

    def schedule(self, client, sizes, selected):
        """(batch size, steps) for a client this round; None = the client config's rule."""
        return None

    # -- server side ----------------------------------------------------------------------------
    def init_server(self, x0: torch.Tensor):
        pass

    def down_payload(self, x: torch.Tensor, out: torch.Tensor):
        out[: self.dim].copy_(x)

    def server_update(self, x: torch.Tensor, up_sum: torch.Tensor, weight_sum: float, round_) -> torch.Tensor:
        """FedAvg's rule: x + eta_g * (sum_i n_i Delta_i) / (sum_i n_i)."""
        if weight_sum <= 0:
            return x
        return x + (up_sum[: self.dim] * (self.cfg.server.lr / weight_sum)).to(x.dtype)

    # -- client side ----------------------------------------------------------------------------
    def client_start(self, run: ClientRun, down: torch.Tensor, model):
        model.load(down[: self.dim])

    grad_hook = None    # optional callable(params, grad) adding a correction to the flat gradient
    loss_fn = None      # optional callable(xb, yb) replacing the plain cross-entropy (MOON)
    # May the round's clients train as one batched computation (`client.vectorize`, fedmpi.vectorized)?
    # None: decided from the hooks by `vectorize_blocker`; True or False: declared by the algorithm.
    vectorizable = None

    def movable_clients(self):
        """True when no client keeps anything between rounds (no client state, the "reduce" protocol): any
        worker may then train any client, and the round loop deals each round's selected clients to the
        workers evenly (`Experiment.round_clients`) instead of training them on their fixed host."""
        cls = type(self)
        return (self.protocol == "reduce" and not self._client_stores()
                and cls.client_state is Algorithm.client_state
                and cls.load_client_state is Algorithm.load_client_state)

    def vectorize_blocker(self):
        """Why this algorithm's clients cannot train as a batched group, or None when they can.

        A group trains every client from the broadcast vector with the plain loss and plain SGD, then loads
        each client's result into the model and calls `accumulate` as the loop would. That equals the loop
        when the algorithm uses the "reduce" protocol, `client_start` only loads the broadcast vector, and
        there is no `grad_hook` or `loss_fn` (FedAvg, FSL, data sharing, central, FedNova)."""
        name = f"algorithm.name = {self.name!r}"
        if self.vectorizable is not None:
            return None if self.vectorizable else f"{name} declares itself not vectorizable"
        if self.protocol != "reduce":
            return f"{name} moves uploads by its own protocol ({self.protocol!r})"
        if type(self).client_start is not Algorithm.client_start:
            return f"{name} starts each client from its own point or state"
        if self.grad_hook is not None or self.loss_fn is not None:
            return f"{name} adds its own loss terms or gradient corrections per client"
        return None

    def accumulate(self, run: ClientRun, down: torch.Tensor, model, acc: torch.Tensor) -> float:
        """Adds this client's weighted upload to `acc`; returns its weight (FedAvg: n_i * Delta_i, n_i)."""
        w = float(run.n_samples)
        acc[: self.dim].add_(model.vec - down[: self.dim], alpha=w)
        return w

    # -- state for checkpoints ------------------------------------------------------------------
    def server_state(self) -> dict:
        return {}

    def load_server_state(self, state: dict):
        pass

    def client_state(self, cid) -> dict:
        """Every ClientVectors attribute's vector for `cid` (an algorithm with other state overrides)."""
        state = {}
        for store in self._client_stores():
            state.update(store.state(cid))
        return state

    def load_client_state(self, cid, state: dict):
        for store in self._client_stores():
            store.load(cid, state)

    def _client_stores(self):
        return [v for v in vars(self).values() if isinstance(v, ClientVectors)]


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

    def state(self, cid) -> dict:
        vec = self.get(cid)
        return {} if vec is None else {self.name: vec.detach().cpu().numpy().copy()}

    def load(self, cid, state: dict):
        if self.name in state:
            self[cid] = torch.from_numpy(np.array(state[self.name], dtype=np.float32))
        else:
            self.pop(cid, None)


def as_numpy_state(state: dict) -> dict:
    """A state dict with every tensor as a CPU numpy array (what checkpoints store)."""
    return {k: (v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v))
            for k, v in state.items()}
