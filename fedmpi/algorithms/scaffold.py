"""SCAFFOLD, option II (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", ICML 2020).

Down: the global model x and the server control c. Each selected client i trains with the correction
c - c_i, then sets c_i+ = c_i - c + (x_t - y_i) / (K eta_l) (K its local steps, eta_l the round's client
lr). Up: Delta y_i and Delta c_i = c_i+ - c_i, two vectors per client, so bytes_up and bytes_down are twice
FedAvg's. Server: the update is sum_i p_i Delta y_i (FedAvg's weights, so that with zero controls the first
round is FedAvg's, as in NIID-Bench), c <- c + (S/N) * mean_i Delta c_i = c + (1/N) sum_i Delta c_i.

Where the correction enters (`correction`):
  gradient    the paper's rule: every step uses g - c_i + c, so momentum and weight decay see it (default)
  after_step  NIID-Bench's code (the FedSkip and MOON papers' baselines): the optimizer steps on g, then
              w <- w - eta_l (c - c_i). Without momentum both give the same model (up to float rounding).
Initial controls (`initial_controls`):
  zero        c = c_i = 0, the paper's (default)
  model_init  c = c_i = c0, NIID-Bench's: there the controls are a freshly constructed network's weights;
              here c0 is a fresh draw of the model's initialisation from (seed, INIT, INIT_KEY)
              (fedmpi.algorithms.reinit), the same on every rank. The stored vectors (checkpoints, state
              dicts) are then c - c0 and c_i - c0: the correction c - c_i is the same, and the control
              update gains the term -c0, which every client derives itself.

Controls cover the trainable part of the flat vector only (buffers such as batch-norm statistics have no
gradient; NIID-Bench also "corrects" them, fedmpi does not); their slots past `n_params` in the down and up
vectors stay zero.
"""

from dataclasses import dataclass
from typing import Literal

from fedmpi.algorithms.base import AlgorithmKeys
from fedmpi.algorithms.catalog import register
from fedmpi.algorithms.fedavg import FedAvg
from fedmpi.algorithms.reinit import fresh_init
from fedmpi.algorithms.state import ClientVectors, ServerVectors

INIT_KEY = 21     # (seed, INIT, INIT_KEY): the stream of the model_init controls c0


@dataclass(frozen=True)
class ScaffoldKeys(AlgorithmKeys):
    name: str = "scaffold"
    correction: Literal["gradient", "after_step"] = "gradient"
    """Where c - c_i enters: added to the gradient before each step (the paper), or w -= eta_l (c - c_i) after
    each optimizer step (NIID-Bench's code). They differ when client.momentum > 0."""
    initial_controls: Literal["zero", "model_init"] = "zero"
    """c = c_i = 0 (the paper), or a fresh draw of the model's initialisation (NIID-Bench's code)."""


@register
class Scaffold(FedAvg):
    name = "scaffold"
    robust_aggregation = False   # its own aggregate or upload: not a weighted mean of one vector
    uploads_model_delta = False  # its accumulate uploads more than the model's change
    Keys = ScaffoldKeys
    vectorizable = False
    keeps_client_state = True
    down_vectors = 2    # x, c
    up_vectors = 2      # Delta y_i, Delta c_i

    @classmethod
    def privacy_problems(cls, keys, client_steps):
        return ["each client also uploads its control-variate change, which is neither clipped nor noised, "
                "and the server broadcasts the control variate built from it"]

    def __init__(self, keys, context):
        super().__init__(keys, context)
        self.num_clients = context.num_clients   # N in c's update
        self.server = ServerVectors(c=self.n_params)     # c (- c0), on rank 0
        self.controls = ClientVectors("c_i", length=self.n_params)  # c_i (- c0) on the hosting rank; absent = zero
        self._correction = None                     # c - c_i of the client being trained
        self._lr = 0.0                              # its round's learning rate (after_step)
        self._c0 = None                             # model_init: c0 on this rank, drawn at first use
        if self.keys.correction == "after_step":
            self.grad_hook, self.step_hook = None, self._correct_after_step

    # -- server ---------------------------------------------------------------------------------
    def down_payload(self, x, out):
        dim, n = self.dim, self.n_params
        out[:dim].copy_(x)
        out[dim:dim + n].copy_(self.server.get("c", x.device))
        out[dim + n:].zero_()

    def aggregate(self, x, up_sum, weight_sum, round_):
        if weight_sum <= 0:
            return None
        dim, n = self.dim, self.n_params
        c = self.server.get("c", x.device)
        c.add_((up_sum[dim:dim + n] / self.num_clients).to(c.dtype))
        return super().aggregate(x, up_sum, weight_sum, round_)

    # -- client ---------------------------------------------------------------------------------
    def client_start(self, run, down, model):
        super().client_start(run, down, model)
        c = down[self.dim:self.dim + self.n_params]
        self._correction = c - self.controls.or_zeros(run.cid, self.n_params, model.device)
        self._lr = run.lr

    def grad_hook(self, params, grad):
        grad.add_(self._correction)

    def _correct_after_step(self, params):
        params.add_(self._correction, alpha=-self._lr)

    def initial_control(self, model):
        """c0 (trainable part) on this rank: None for `zero`, else the seeded fresh initialisation."""
        if self.keys.initial_controls == "zero":
            return None
        if self._c0 is None or self._c0.device != model.vec.device:
            self._c0 = fresh_init(model, self.context.seed, INIT_KEY)[: self.n_params]
        return self._c0

    def accumulate(self, run, down, model, acc):
        dim, n = self.dim, self.n_params
        w = run.weight
        delta = model.vec - down[:dim]
        acc[:dim].add_(delta, alpha=w)
        c, c_i = down[dim:dim + n], self.controls.or_zeros(run.cid, n, model.device)
        # Option II: c_i+ = c_i - c + (x_t - y_i) / (K eta_l), with x_t - y_i = -delta. Stored relative to
        # c0 (model_init), the same rule gains -c0: (c_i+ - c0) = (c_i - c0) - (c - c0) + ... - c0.
        c_new = c_i - c - delta[:n] / (run.steps * run.lr)
        c0 = self.initial_control(model)
        if c0 is not None:
            c_new = c_new - c0
        acc[dim:dim + n].add_(c_new - c_i)
        self.controls[run.cid] = c_new
        return w
