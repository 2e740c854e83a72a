"""Per-FedAvg, first-order (Fallah, Mokhtari, Ozdaglar, "Personalized Federated Learning with Theoretical
Guarantees: A Model-Agnostic Meta-Learning Approach", NeurIPS 2020; the FO variant, as PFLlib implements it).

Each local meta-step takes two batches of the client's own stream: an inner step from theta on the first, theta' =
theta - alpha grad f(theta; D), then the outer step applied to theta with the gradient at theta' on the second,
theta <- theta - beta grad f(theta'; D'). A round runs one meta-step per scheduled step (2 steps batches,
`meta_steps: steps`, the default): PFLlib's round, whose server (serverperavg.py) calls clientPerAvg.train() twice
per round, each call one meta-step per batch of 2B split into halves, floor(n / 2B) per epoch; the counts agree
exactly where 2B divides n (docs/explanation/baselines.md). It is also the paper's Algorithm 1 with tau, its number of
local updates, read as the client's step count. `meta_steps: pairs` runs floor(steps / 2) meta-steps (at least one), as
much data as a FedAvg client: one clientPerAvg.train() call, half of PFLlib's round. The update is uploaded and
averaged as FedAvg's. Personalization is the one-step adaptation at evaluation: eval.finetune_steps (1 in the
paper, PFLlib's evaluate_one_step) with lr alpha.

Implemented as one pass whose grad_hook alternates: on inner steps it keeps theta; on outer steps it puts
theta back into the parameters and scales the gradient by beta / alpha (the pass runs at lr alpha), so the
trainer's step is theta - beta g. That is exact for plain SGD, hence client.momentum must be 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from fedmpi.algorithms.base import AlgorithmKeys
from fedmpi.algorithms.catalog import register
from fedmpi.algorithms.fedavg import FedAvg
from fedmpi.core.config_checks import MAX_FACTOR, Checks, Range


@dataclass(frozen=True)
class PerFedAvgKeys(AlgorithmKeys):
    name: str = "perfedavg"
    alpha: float | None = None
    """Inner (adaptation) step size (> 0; None: the round's eta_l, PFLlib's choice)."""
    beta: float | None = None
    """Outer (meta) step size (> 0; None: the round's eta_l, PFLlib's choice)."""

    meta_steps: Literal["steps", "pairs"] = "steps"
    """How the client's scheduled steps become meta-steps: `steps`, one meta-step per step (2 steps batches;
    PFLlib's round of two clientPerAvg.train() calls under client.epochs, and the paper's tau local updates);
    `pairs`, two batches each, floor(steps / 2) (as much data as FedAvg; one clientPerAvg.train() call)."""

    # beta / alpha scales float32 gradients (MetaSteps): both within [1e-6, 1e6] keep it finite.
    RANGES: ClassVar[dict] = {"alpha": Range(1e-6, MAX_FACTOR), "beta": Range(1e-6, MAX_FACTOR)}


class MetaSteps:
    """The pass's grad_hook: even calls are inner steps (theta kept), odd calls outer steps (theta restored,
    the gradient scaled by beta / alpha)."""

    def __init__(self, alpha, beta):
        self.scale = float(beta) / float(alpha)
        self.calls, self.theta = 0, None

    def __call__(self, params, grad):
        if self.calls % 2 == 0:
            self.theta = params.detach().clone()
        else:
            params.copy_(self.theta)
            grad.mul_(self.scale)
        self.calls += 1


def meta_batches(steps, meta_steps="steps"):
    """Batches of a round: two per meta-step; `steps` of them (`steps`), or floor(steps / 2) meta-steps, at
    least one (`pairs`)."""
    if meta_steps == "steps":
        return 2 * int(steps)
    return 2 * max(int(steps) // 2, 1)


@register
class PerFedAvg(FedAvg):
    name = "perfedavg"
    Keys = PerFedAvgKeys
    vectorizable = False

    @classmethod
    def check(cls, cfg, model):
        super().check(cfg, model)
        c = Checks("client")
        c.require(cfg.client.momentum == 0, "momentum", cfg.client.momentum,
                  "perfedavg's meta-step (theta - beta grad f(theta')) is plain SGD; use client.momentum = 0")
        c.done()

    def local_training(self, run, down, model, local):
        alpha = run.lr if self.keys.alpha is None else float(self.keys.alpha)
        beta = run.lr if self.keys.beta is None else float(self.keys.beta)
        batches = meta_batches(local.steps, self.keys.meta_steps)
        return local.train(steps=batches, lr=alpha, grad_hook=MetaSteps(alpha, beta))
