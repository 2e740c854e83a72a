"""FedBuff (Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation", AISTATS 2022).

Clients train asynchronously: `concurrency` of them are in flight at any time, each from the model
version current when it started; the server adds each arriving update, scaled by its staleness, to a
buffer and updates the model every `buffer_size` (K) arrivals:

    x <- x + eta_g * (1/K) sum_{i in buffer} s(tau_i) Delta_i,   Delta_i = y_i - x_{v_i},   s(tau) = (1 + tau)^-a

with tau_i = t - v_i the number of server updates since client i started, and a = 1/2 the paper's choice
(its polynomial staleness scaling 1/sqrt(1 + tau), Section 5); eta_g and its schedule are the server
optimizer's (`server.lr`, `server.optimizer`). The average is unweighted over the buffer, as in the
paper's Algorithm 1.

In fedmpi one round is one server update. The simulated clock (fedmpi.deploy.buffered, `clients:` keys)
decides who starts from which version and who arrives when; a client trains in the round of its start
version (from that round's broadcast) and holds its update on its host until the round of its arrival,
so the held updates are client state, saved in checkpoints (`pending_v<version>`).
"""

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fedmpi.algorithms.base import AlgorithmKeys, BufferedUploads, weighted_mean_update
from fedmpi.algorithms.catalog import register
from fedmpi.core.config_checks import Checks, Range
from fedmpi.core.lazy import torch

PENDING = "pending_v"


def staleness_weight(tau, exponent=0.5):
    """s(tau) = (1 + tau)^-exponent: 1 for a fresh update, 1/sqrt(1 + tau) with FedBuff's exponent 1/2."""
    return float((1.0 + tau) ** -exponent)


@dataclass(frozen=True)
class FedBuffKeys(AlgorithmKeys):
    name: str = "fedbuff"
    buffer_size: int = 10
    """K: arrivals per server update (one round)."""
    concurrency: int = 20
    """Clients training at the same time; at most partition.clients."""
    staleness_exponent: float = 0.5
    """a in s(tau) = (1 + tau)^-a: 0.5 is FedBuff's 1/sqrt(1 + tau); 0 weighs stale updates like fresh ones."""

    RANGES: ClassVar[dict] = {"buffer_size": Range(1, 2 ** 31 - 1), "concurrency": Range(1, 2 ** 31 - 1),
                              # (1 + s)^-a of a staleness s: beyond 10 even s = 1 weighs 2^-10 of a fresh update
                              "staleness_exponent": Range(0, 10)}


@register
class FedBuff(BufferedUploads):
    name = "fedbuff"
    Keys = FedBuffKeys

    @classmethod
    def check(cls, cfg, model):
        super().check(cfg, model)
        c = Checks("algorithm")
        c.require(cfg.algorithm.concurrency <= cfg.partition.clients, "concurrency", cfg.algorithm.concurrency,
                  f"must be <= partition.clients ({cfg.partition.clients}): a client trains one update at a time")
        c.done()

    def __init__(self, keys, context):
        super().__init__(keys, context)
        self.pending = {}       # (cid, start version) -> Delta_i, on the rank hosting the client

    def hold(self, run, down, model):
        self.pending[(run.cid, run.round)] = model.vec - down[: self.dim]

    def release(self, cid, version, round_, acc):
        delta = self.pending.pop((cid, version))
        weight = staleness_weight(round_ - version, self.keys.staleness_exponent)
        acc[: self.dim].add_(delta.to(acc.device), alpha=weight)
        return 1.0

    def aggregate(self, x, up_sum, weight_sum, round_):
        return weighted_mean_update(up_sum, weight_sum, self.dim)

    # -- state for checkpoints: a client's held updates, by the version they started from ---------------------
    def client_state(self, cid):
        return {f"{PENDING}{v}": d.detach().cpu().numpy().copy()
                for (c, v), d in sorted(self.pending.items()) if c == cid}

    def load_client_state(self, cid, state):
        self.pending = {key: d for key, d in self.pending.items() if key[0] != cid}
        for name, array in state.items():
            if name.startswith(PENDING) and name[len(PENDING):].isdigit():
                self.pending[(cid, int(name[len(PENDING):]))] = torch.from_numpy(np.array(array, dtype=np.float32))
