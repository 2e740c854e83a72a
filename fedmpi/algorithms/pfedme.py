"""pFedMe (Dinh, Tran, Nguyen, "Personalized Federated Learning with Moreau Envelopes", NeurIPS 2020), with
the client loop of the authors' code and PFLlib (clientpFedMe, pFedMeOptimizer).

Each selected client starts its local model w and its personal model theta from the global x. For each of
its scheduled batches it takes K steps of the personal model on that batch,
    theta <- theta - eta_p (grad f(theta; batch) + lam (theta - w) + mu theta),
(an approximate solution of the Moreau envelope's inner problem; mu is the authors' small L2 term), then moves
its local model towards it, w <- w - lam eta_l (w - theta). It uploads w. The server takes
x <- (1 - beta) x + beta * mean_i w_i, which is fedmpi's server step x += eta_g sum_i p_i (w_i - x) with
eta_g = beta: pFedMe's beta is `server.lr` (1 by default, the plain average; the paper also uses 2), with
the usual sample-count weights p_i (PFLlib's aggregate_parameters).

A client's local evaluation uses its personal model theta from its last round (the global model where it has
not trained yet), the paper's personalized model. PFLlib's `personalized_params` alias the model's
parameters, which it resets to w after training, so its "personalized" accuracy is in fact w's
(docs/explanation/baselines.md). Buffers (BatchNorm statistics) are uploaded as trained.

Limits: lam = 0 and mu = 0 make theta plain local SGD at eta_p (K steps per batch) and leave w at x, so the
global model never moves; plain SGD only (the rule is a proximal step), so client.momentum and
client.weight_decay must be 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedmpi.algorithms.base import AlgorithmKeys
from fedmpi.algorithms.catalog import register
from fedmpi.algorithms.fedavg import FedAvg
from fedmpi.algorithms.layers import refuse_personal_entries
from fedmpi.algorithms.state import ClientVectors
from fedmpi.core.config_checks import Checks, count, factor


@dataclass(frozen=True)
class PFedMeKeys(AlgorithmKeys):
    name: str = "pfedme"
    lam: float = 15.0
    """lambda of the Moreau envelope: how strongly theta is tied to w (>= 0; the paper's 15 on MNIST)."""
    inner_steps: int = 5
    """K: personal-model steps on each batch (>= 1; PFLlib's default 5)."""
    personal_lr: float = 0.01
    """eta_p, the personal model's step size (> 0; PFLlib's default 0.01)."""
    mu: float = 0.001
    """The authors' L2 term mu theta in the personal step (>= 0; their and PFLlib's 0.001)."""

    RANGES: ClassVar[dict] = {"lam": factor(), "inner_steps": count(), "personal_lr": factor(low_open=True),
                              "mu": factor()}


class MoreauSteps:
    """The pass's hooks. `grad(theta, g)`: g += lam (theta - w) + mu theta (the personal step's gradient);
    `step(theta)`: after every K-th step (one batch done), w <- w - lam eta_l (w - theta)."""

    def __init__(self, w, lam, mu, eta, k):
        self.w, self.lam, self.mu, self.eta, self.k = w, float(lam), float(mu), float(eta), int(k)
        self.steps = 0

    def grad(self, theta, g):
        g.add_(theta, alpha=self.lam + self.mu).sub_(self.w, alpha=self.lam)

    def step(self, theta):
        self.steps += 1
        if self.steps % self.k == 0:
            self.w.sub_(self.w - theta, alpha=self.lam * self.eta)


@register
class PFedMe(FedAvg):
    name = "pfedme"
    Keys = PFedMeKeys
    vectorizable = False
    keeps_client_state = True

    @classmethod
    def check(cls, cfg, model):
        super().check(cfg, model)
        refuse_personal_entries(cfg, "pfedme keeps a whole personal model per client")
        c = Checks("client")
        for key in ("momentum", "weight_decay"):
            c.require(getattr(cfg.client, key) == 0, key, getattr(cfg.client, key),
                      "pfedme's personal step is plain SGD (its own L2 term is algorithm.mu); use 0")
        c.done()

    def __init__(self, keys, context):
        super().__init__(keys, context)
        self.personal = ClientVectors("theta", length=self.dim)     # theta_k, on the hosting rank

    def local_training(self, run, down, model, local):
        x = down[: self.dim]
        model.load(x)
        k = self.keys
        moreau = MoreauSteps(x[: self.n_params].clone(), k.lam, k.mu, run.lr, k.inner_steps)
        loss = local.train(lr=k.personal_lr, repeat=k.inner_steps, grad_hook=moreau.grad, step_hook=moreau.step)
        self.personal[run.cid] = model.vec.clone()
        model.vec[: self.n_params].copy_(moreau.w)      # the upload is w; buffers as trained
        return loss

    def eval_start(self, run, down, model):
        """The client's personal model theta_k (the global model where it has none yet)."""
        theta = self.personal.on(run.cid, model.device)
        model.load(down[: self.dim] if theta is None else theta)
