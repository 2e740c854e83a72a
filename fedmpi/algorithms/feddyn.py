"""FedDyn (Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021).

Client i minimises f_i(w) - <g_i, w> + alpha/2 ||w - x_t||^2, i.e. adds -g_i + alpha (w - x_t) to its
gradient, then updates g_i <- g_i - alpha (y_i - x_t) (g_i starts at zero). The server keeps h (zero at
the start): h <- h - alpha/N * sum_{i in P_t} (y_i - x_t) with N all clients, and
x_{t+1} = mean_{i in P_t} y_i - h / alpha, an unweighted mean over the participants as in the paper and
its reference code. The rule has no server step size: the update is x_{t+1} - x_t, applied as is, so
server.lr must stay 1.0 and the server optimizer `sgd`.

g_i and h cover the trainable part of the flat vector only; buffers (batch-norm statistics) are averaged.
"""

from dataclasses import dataclass
from typing import ClassVar

from fedmpi.algorithms.base import AlgorithmKeys
from fedmpi.algorithms.catalog import register
from fedmpi.algorithms.fedavg import FedAvg
from fedmpi.algorithms.state import ClientVectors, ServerVectors
from fedmpi.core.config_checks import Checks, factor


@dataclass(frozen=True)
class FedDynKeys(AlgorithmKeys):
    name: str = "feddyn"
    alpha: float = 0.01
    """Weight of the dynamic regulariser (> 0)."""

    RANGES: ClassVar[dict] = {"alpha": factor(low_open=True)}


@register
class FedDyn(FedAvg):
    name = "feddyn"
    robust_aggregation = False   # its own aggregate or upload: not a weighted mean of one vector
    uploads_model_delta = False  # its accumulate uploads more than the model's change
    Keys = FedDynKeys
    vectorizable = False
    keeps_client_state = True
    uses_server_optimizer = False

    @classmethod
    def check(cls, cfg, model):
        super().check(cfg, model)
        c = Checks("server")
        c.require(cfg.server.lr == 1.0, "lr", cfg.server.lr,
                  "feddyn's server update (x = mean y_i - h / alpha) has no step size; use server.lr = 1.0")
        c.done()

    def __init__(self, keys, context):
        super().__init__(keys, context)
        self.alpha = float(self.keys.alpha)
        self.num_clients = context.num_clients   # N in h's update
        self.server = ServerVectors(h=self.n_params)     # h, on rank 0
        self.grads = ClientVectors("g_i", length=self.n_params)  # on the rank hosting the client; absent = zero
        self._offset = None                         # g_i + alpha x_t of the client being trained

    # -- server ---------------------------------------------------------------------------------
    def aggregate(self, x, up_sum, weight_sum, round_):
        if weight_sum <= 0:
            return None
        n = self.n_params
        h = self.server.get("h", x.device)
        h.sub_((up_sum[:n] * (self.alpha / self.num_clients)).to(h.dtype))
        # up_sum holds sum_i (y_i - x_t) and weight_sum the number of participants: x_t + that / |P_t| is
        # their mean model, and the update moves x there and then by -h / alpha.
        update = up_sum[: self.dim] / weight_sum
        update[:n].sub_(h.double() / self.alpha)
        return update

    # -- client ---------------------------------------------------------------------------------
    def client_start(self, run, down, model):
        super().client_start(run, down, model)
        # -g_i + alpha (w - x_t) = alpha w - (g_i + alpha x_t): the bracket is fixed for the whole client,
        # so each step costs two in-place operations.
        self._offset = self.grads.or_zeros(run.cid, self.n_params, model.device) + self.alpha * down[: self.n_params]

    def grad_hook(self, params, grad):
        grad.add_(params, alpha=self.alpha).sub_(self._offset)

    def accumulate(self, run, down, model, acc):
        delta = model.vec - down[: self.dim]
        acc[: self.dim].add_(delta)
        g_i = self.grads.or_zeros(run.cid, self.n_params, model.device)
        self.grads[run.cid] = g_i - self.alpha * delta[: self.n_params]
        return 1.0     # unweighted mean over the participants
