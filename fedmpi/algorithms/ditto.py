"""Ditto (Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning Through Personalization", ICML 2021).

The global model is FedAvg's: each selected client trains it locally (its own stream, exactly FedAvg's pass)
and uploads the update. Beside it every client keeps a personal model v_k (its ClientVectors), trained in
the same round from its last value with the proximal term lam/2 ||v - w||^2 towards the round's global
model w (the gradient lam (v - w) added to every step, on the trainable part), on a second pass of its data
drawn from (seed, PERSONAL, round, client, 1). A client's local evaluation uses v_k (a client that never
trained: the global model).

Limits: lam = 0 trains v_k as `local` does (no pull towards w); lam = 1/eta_l with plain SGD puts v back on
w before every gradient step (v - eta_l (g + (v - w)/eta_l) = w - eta_l g), so v_k is one step of local SGD
from w; lam larger than 2/eta_l diverges (plain SGD on a lam-strongly-convex term). The global model never
depends on lam: it is FedAvg's, bit for bit. A client's first v_k starts from the global model of the round
it first trains in (PFLlib copies the initial model; docs/explanation/baselines.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedmpi.algorithms.base import AlgorithmKeys
from fedmpi.algorithms.catalog import register
from fedmpi.algorithms.fedavg import FedAvg
from fedmpi.algorithms.layers import refuse_personal_entries
from fedmpi.algorithms.state import ClientVectors
from fedmpi.core.config_checks import count, factor

PERSONAL_PASS = 1     # the personal model's stream key: (seed, PERSONAL, round, client, 1)


@dataclass(frozen=True)
class DittoKeys(AlgorithmKeys):
    name: str = "ditto"
    lam: float = 0.1
    """Weight of lam/2 ||v - w||^2 pulling the personal model v towards the global w (>= 0)."""
    personal_steps: int | None = None
    """SGD steps of the personal model per round (None: the client's schedule, as the global pass)."""

    RANGES: ClassVar[dict] = {"lam": factor(), "personal_steps": count()}


def prox_gradient(grad, params, anchor, lam):
    """grad += lam (params - anchor), in place: the gradient of lam/2 ||params - anchor||^2."""
    return grad.add_(params, alpha=lam).sub_(anchor, alpha=lam)


@register
class Ditto(FedAvg):
    name = "ditto"
    Keys = DittoKeys
    vectorizable = False
    keeps_client_state = True

    @classmethod
    def check(cls, cfg, model):
        super().check(cfg, model)
        refuse_personal_entries(cfg, "ditto keeps a whole personal model per client")

    def __init__(self, keys, context):
        super().__init__(keys, context)
        self.lam = float(keys.lam)
        self.personal = ClientVectors("v", length=self.dim)     # v_k, on the hosting rank

    def local_training(self, run, down, model, local):
        w = down[: self.dim]
        anchor = w[: self.n_params]
        start = self.personal.on(run.cid, model.device)
        model.load(w if start is None else start)
        local.train(steps=self.keys.personal_steps, stream=PERSONAL_PASS,
                    grad_hook=lambda params, grad: prox_gradient(grad, params, anchor, self.lam))
        self.personal[run.cid] = model.vec.clone()
        model.load(w)
        return local.train()            # the global model's pass: FedAvg's, on the client's own stream

    def eval_start(self, run, down, model):
        """The client's personal model v_k (the global model where it has none yet)."""
        v = self.personal.on(run.cid, model.device)
        model.load(down[: self.dim] if v is None else v)
