"""APFL (Deng, Kamani, Mahdavi, "Adaptive Personalized Federated Learning", 2020, Algorithm 1).

Each client keeps a personal model v_k and a mixing weight alpha_k; its personalized model is
v̄_k = alpha_k v_k + (1 - alpha_k) w. The global model is FedAvg's: w is trained locally (the client's own
stream, exactly FedAvg's pass) and its update uploaded. Then v_k is trained on a second pass of the
client's data ((seed, PERSONAL, round, client, 1)) by the paper's rule, with w the client's locally trained
model:
    v <- v - eta_l * alpha grad f(v̄),               grad_v f(alpha v + (1 - alpha) w) = alpha grad f(v̄)
    alpha <- clip(alpha - eta_alpha <v - w, grad f(v̄)>, 0, 1)    (only with `adaptive: true`)
each step at the mixed model v̄ (the rank's model holds v̄; the hook steps v and alpha itself, then puts
v̄ back, so client.momentum and weight_decay do not apply to v). The client's local evaluation uses the
v̄_k of its last round. With alpha = 0 (fixed) v̄ is the local w: no personal pass, and the global model
is FedAvg's at every alpha.

Differences to the paper: the paper interleaves the steps of w and v (v̄ uses the w of the same step);
here w is the round's locally trained model throughout the personal pass. PFLlib trains v on its own loss
(not at v̄), adds 0.02 alpha to alpha's gradient and overwrites v by v̄ after each round (docs/explanation/baselines.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedmpi.algorithms.base import AlgorithmKeys
from fedmpi.algorithms.catalog import register
from fedmpi.algorithms.fedavg import FedAvg
from fedmpi.algorithms.layers import refuse_personal_entries
from fedmpi.algorithms.state import ClientVectors
from fedmpi.core.config_checks import Checks, Range, factor, refuse_unused
from fedmpi.core.lazy import torch

PERSONAL_PASS = 1


@dataclass(frozen=True)
class ApflKeys(AlgorithmKeys):
    name: str = "apfl"
    alpha: float = 0.5
    """Mixing weight of the personal model in [0, 1] (the start value with `adaptive`); 0 is FedAvg."""
    adaptive: bool = False
    """Update each client's alpha by the paper's gradient step after every personal step."""
    alpha_lr: float | None = None
    """Step size of alpha's update (None: the round's eta_l)."""

    RANGES: ClassVar[dict] = {"alpha": Range(0, 1), "alpha_lr": factor(low_open=True)}

    def __post_init__(self):
        c = Checks("algorithm")
        refuse_unused(c, self, "adaptive", {True: ("alpha_lr",), False: ()}, "setting")
        c.done()


class MixedStep:
    """The personal pass's grad_hook: the rank's parameters hold v̄ = alpha v + (1 - alpha) w; each call
    steps v (and alpha when adaptive) from the gradient at v̄, writes the new v̄ into the parameters and
    zeroes the gradient (the trainer's own step then changes nothing)."""

    def __init__(self, v, w, alpha, lr, alpha_lr=None):
        self.v, self.w, self.alpha, self.lr, self.alpha_lr = v, w, float(alpha), float(lr), alpha_lr

    def mixed(self):
        return self.v * self.alpha + self.w * (1.0 - self.alpha)

    def __call__(self, params, grad):
        if self.alpha_lr is not None:
            slope = float(torch.dot((self.v - self.w).double(), grad.double()))
            new_alpha = min(max(self.alpha - self.alpha_lr * slope, 0.0), 1.0)
        else:
            new_alpha = self.alpha
        self.v.add_(grad, alpha=-self.lr * self.alpha)
        self.alpha = new_alpha
        params.copy_(self.mixed())
        grad.zero_()


@register
class Apfl(FedAvg):
    name = "apfl"
    Keys = ApflKeys
    vectorizable = False
    keeps_client_state = True
    client_columns = ("alpha",)      # each trained client's alpha after the round

    @classmethod
    def check(cls, cfg, model):
        super().check(cfg, model)
        c = Checks("client")
        c.require(cfg.client.weight_decay == 0, "weight_decay", cfg.client.weight_decay,
                  "apfl steps its personal model itself (plain SGD on v); use client.weight_decay = 0")
        c.done()
        refuse_personal_entries(cfg, "apfl keeps a whole personal model per client")

    def __init__(self, keys, context):
        super().__init__(keys, context)
        self.personal = ClientVectors("v", length=self.n_params)     # v_k (trainable part)
        self.mixed = ClientVectors("vbar", length=self.dim)          # v̄_k of the client's last round
        self.alphas = ClientVectors("alpha", length=1, within=(0.0, 1.0))      # alpha_k (adaptive)

    def local_training(self, run, down, model, local):
        figures = local.train()                 # w: FedAvg's pass
        alpha = self.alphas.get(run.cid)
        alpha = float(self.keys.alpha) if alpha is None else float(alpha[0])
        run.figures["alpha"] = alpha
        if alpha == 0.0 and not self.keys.adaptive:
            self.mixed[run.cid] = model.vec.clone()
            return figures
        trained = model.vec.clone()
        n = self.n_params
        v = self.personal.on(run.cid, model.device)
        v = trained[:n].clone() if v is None else v.clone()
        alpha_lr = None
        if self.keys.adaptive:
            alpha_lr = run.lr if self.keys.alpha_lr is None else float(self.keys.alpha_lr)
        step = MixedStep(v, trained[:n], alpha, run.lr, alpha_lr)
        model.vec[:n].copy_(step.mixed())
        local.train(grad_hook=step, stream=PERSONAL_PASS)
        self.personal[run.cid] = step.v
        self.alphas[run.cid] = torch.tensor([step.alpha])
        run.figures["alpha"] = step.alpha
        self.mixed[run.cid] = model.vec.clone()
        model.load(trained)                     # the upload: the trained w
        return figures

    def eval_start(self, run, down, model):
        """The client's v̄_k (the global model where it has none yet)."""
        vbar = self.mixed.on(run.cid, model.device)
        model.load(down[: self.dim] if vbar is None else vbar)
