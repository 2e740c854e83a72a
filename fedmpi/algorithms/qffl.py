"""q-FFL solved by q-FedAvg (Li, Sanjabi, Beirami, Smith, "Fair Resource Allocation in Federated Learning",
ICLR 2020, Algorithm 2).

Each selected client k evaluates its loss F_k at the round's global model w on its training data, trains
locally as FedAvg does to w_k, and uploads, with L the Lipschitz estimate (L = 1/eta_l as in the paper's
experiments, or the key `L`) and Delta w_k = L (w - w_k):
    Delta_k = F_k^q Delta w_k,     h_k = q F_k^(q-1) ||Delta w_k||^2 + L F_k^q.
The server moves to w - sum_k Delta_k / sum_k h_k. Clients with higher loss weigh more; q = 0 averages the
clients' models uniformly (sum_k L (w_k - w) / (S L)), which is FedAvg's average when the clients hold equally
many samples. As in the authors' code (litian96/fair_flearn), F_k is raised with 1e-10 added, so that a
zero loss with q < 1 stays finite.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from fedmpi.algorithms.base import AlgorithmKeys, Reduce
from fedmpi.algorithms.catalog import register
from fedmpi.core.config_checks import Checks, Range, factor
from fedmpi.core.lazy import torch

MAX_Q = 100
LOSS_FLOOR = 1e-10      # added to F_k before the powers (the authors' code)


@dataclass(frozen=True)
class QfflKeys(AlgorithmKeys):
    name: str = "qffl"
    q: float = 1.0
    """Fairness exponent (>= 0; 0 averages the clients' models uniformly)."""
    L: float | None = None
    """Lipschitz constant of the gradient (> 0); None: 1 / the round's eta_l (the paper's choice)."""

    # The paper uses q <= 15. F^q overflows float64 once q log10(F) > 308: q = 1e5 already at a loss F of
    # 1.01, q = 100 only at a loss above 1e3 (a run that diverged; qffl_upload then gives inf, not a crash).
    RANGES: ClassVar[dict] = {"q": Range(0, MAX_Q), "L": factor(low_open=True)}


def qffl_upload(delta_w: torch.Tensor, loss: float, q: float, lipschitz: float):
    """(Delta_k, h_k) of one client, from Delta w_k = L (w - w_k) and its loss F_k at w."""
    f = float(loss) + LOSS_FLOOR
    sq = float(torch.dot(delta_w.double(), delta_w.double()))
    return delta_w.double() * _power(f, q), q * _power(f, q - 1) * sq + lipschitz * _power(f, q)


def _power(f, q):
    """f ** q, inf where it overflows float64 (a diverged loss; Python's float power raises instead)."""
    try:
        return f ** q
    except OverflowError:
        return math.inf


@register
class Qffl(Reduce):
    name = "qffl"
    Keys = QfflKeys
    uses_server_optimizer = False    # the step is -sum Delta / sum h, no server step size
    up_scalars = 1                   # h_k
    client_columns = ("start_loss",)   # F_k at the round's global model

    @classmethod
    def check(cls, cfg, model):
        super().check(cfg, model)
        c = Checks("server")
        c.require(cfg.server.lr == 1.0 and cfg.server.lr_schedule.name == "constant", "lr", cfg.server.lr,
                  "q-FedAvg's step -sum Delta_k / sum h_k has no server step size; use server.lr = 1.0 with a "
                  "constant server.lr_schedule")
        c.done()

    @classmethod
    def privacy_problems(cls, keys, client_steps):
        return ["each client also uploads h_k, built from its loss and its update's norm, neither clipped nor "
                "noised, and its update is scaled by its loss to the power q"]

    def __init__(self, keys, context):
        super().__init__(keys, context)
        self.q = float(keys.q)
        self._loss = {}         # cid -> F_k at the round's global model (between training and accumulate)

    def lipschitz(self, lr):
        return float(self.keys.L) if self.keys.L is not None else 1.0 / lr

    def local_training(self, run, down, model, local):
        self._loss[run.cid] = loss = local.loss()      # the model holds the broadcast w (client_start)
        run.figures["start_loss"] = loss
        return local.train()

    def accumulate(self, run, down, model, acc):
        lipschitz = self.lipschitz(run.lr)
        delta, h = qffl_upload((down[: self.dim] - model.vec) * lipschitz, self._loss.pop(run.cid), self.q,
                               lipschitz)
        acc[: self.dim].add_(delta)
        acc[self.dim] += h
        return 1.0

    def aggregate(self, x, up_sum, weight_sum, round_):
        h = float(up_sum[self.dim])
        if weight_sum <= 0 or h <= 0:
            return None
        return -up_sum[: self.dim] / h
