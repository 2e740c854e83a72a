"""SCAFFOLD, option II (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", ICML 2020).

Down: the global model x and the server control c. Each selected client i steps with the corrected gradient
g - c_i + c, then sets c_i+ = c_i - c + (x_t - y_i) / (K eta_l) (K its local steps, eta_l the round's client
lr). Up: Delta y_i and Delta c_i = c_i+ - c_i, two vectors per client, so bytes_up and bytes_down are twice
FedAvg's. Server: the update is sum_i p_i Delta y_i (FedAvg's weights, so that with zero controls the first
round is FedAvg's, as in NIID-Bench), c <- c + (S/N) * mean_i Delta c_i = c + (1/N) sum_i Delta c_i.

Controls cover the trainable part of the flat vector only (buffers such as batch-norm statistics have no
gradient); their slots past `n_params` in the down and up vectors stay zero.
"""

from dataclasses import dataclass

from fedmpi.algorithms.base import AlgorithmKeys
from fedmpi.algorithms.fedavg import FedAvg
from fedmpi.algorithms.registry import register
from fedmpi.algorithms.state import ClientVectors, ServerVectors


@dataclass(frozen=True)
class ScaffoldKeys(AlgorithmKeys):
    name: str = "scaffold"


@register
class Scaffold(FedAvg):
    name = "scaffold"
    Keys = ScaffoldKeys
    vectorizable = False
    keeps_client_state = True
    down_vectors = 2    # x, c
    up_vectors = 2      # Delta y_i, Delta c_i

    def __init__(self, cfg, dim, n_params):
        super().__init__(cfg, dim, n_params)
        self.num_clients = cfg.partition.clients   # N in c's update
        self.server = ServerVectors(c=n_params)     # c, on rank 0
        self.controls = ClientVectors("c_i")        # on the rank hosting the client; absent = zero
        self._correction = None                     # c - c_i of the client being trained

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

    def grad_hook(self, params, grad):
        grad.add_(self._correction)

    def accumulate(self, run, down, model, acc):
        dim, n = self.dim, self.n_params
        w = run.weight
        delta = model.vec - down[:dim]
        acc[:dim].add_(delta, alpha=w)
        c, c_i = down[dim:dim + n], self.controls.or_zeros(run.cid, n, model.device)
        # Option II: c_i+ = c_i - c + (x_t - y_i) / (K eta_l), with x_t - y_i = -delta.
        c_new = c_i - c - delta[:n] / (run.steps * run.lr)
        acc[dim:dim + n].add_(c_new - c_i)
        self.controls[run.cid] = c_new
        return w
