"""SCAFFOLD, option II (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", ICML 2020).

Down: the global model x and the server control c. Each selected client i steps with the corrected gradient
g - c_i + c, then sets c_i+ = c_i - c + (x_t - y_i) / (K eta_l) (K its local steps, eta_l the client lr).
Up: Delta y_i and Delta c_i = c_i+ - c_i, two vectors per client, so bytes_up and bytes_down are twice
FedAvg's. Server: x <- x + eta_g * sum_i p_i Delta y_i (FedAvg's weights, so that with zero controls the
first round is FedAvg's, as in NIID-Bench), c <- c + (S/N) * mean_i Delta c_i = c + (1/N) sum_i Delta c_i.

Controls cover the trainable part of the flat vector only (buffers such as batch-norm statistics have no
gradient); their slots past `n_params` in the down and up vectors stay zero.
"""

import numpy as np
import torch

from fedmpi.algorithms.base import Algorithm, ClientVectors


class Scaffold(Algorithm):
    name = "scaffold"
    down_vectors = 2    # x, c
    up_vectors = 2      # Delta y_i, Delta c_i

    def __init__(self, cfg, dim, n_params):
        super().__init__(cfg, dim, n_params)
        self.num_clients = cfg.partition.clients   # N in c's update
        self._c = None                 # server control (rank 0), created at first use on x's device
        self._controls = ClientVectors("c_i")   # on the rank hosting the client; absent = zero
        self._correction = None        # c - c_i of the client being trained

    # -- server ---------------------------------------------------------------------------------
    def _server_control(self, device):
        if self._c is None:
            self._c = torch.zeros(self.n_params, dtype=torch.float32, device=device)
        elif self._c.device != device:
            self._c = self._c.to(device)
        return self._c

    def down_payload(self, x, out):
        dim, n = self.dim, self.n_params
        out[:dim].copy_(x)
        out[dim:dim + n].copy_(self._server_control(x.device))
        out[dim + n:].zero_()

    def server_update(self, x, up_sum, weight_sum, round_):
        if weight_sum <= 0:
            return x
        dim, n = self.dim, self.n_params
        c = self._server_control(x.device)
        c.add_((up_sum[dim:dim + n] / self.num_clients).to(c.dtype))
        return x + (up_sum[:dim] * (self.cfg.server.lr / weight_sum)).to(x.dtype)

    # -- client ---------------------------------------------------------------------------------
    def _client_control(self, cid, device):
        c_i = self._controls.on(cid, device)
        return torch.zeros(self.n_params, dtype=torch.float32, device=device) if c_i is None else c_i

    def client_start(self, run, down, model):
        super().client_start(run, down, model)
        c = down[self.dim:self.dim + self.n_params]
        self._correction = c - self._client_control(run.cid, model.device)

    def grad_hook(self, params, grad):
        grad.add_(self._correction)

    def accumulate(self, run, down, model, acc):
        dim, n = self.dim, self.n_params
        w = float(run.n_samples)
        delta = model.vec - down[:dim]
        acc[:dim].add_(delta, alpha=w)
        c, c_i = down[dim:dim + n], self._client_control(run.cid, model.device)
        # Option II: c_i+ = c_i - c + (x_t - y_i) / (K eta_l), with x_t - y_i = -delta.
        c_new = c_i - c - delta[:n] / (run.steps * self.cfg.client.lr)
        acc[dim:dim + n].add_(c_new - c_i)
        self._controls[run.cid] = c_new
        return w

    # -- checkpoint state -----------------------------------------------------------------------
    def server_state(self):
        c = self._c if self._c is not None else torch.zeros(self.n_params, dtype=torch.float32)
        return {"c": c.detach().cpu().numpy().copy()}

    def load_server_state(self, state):
        self._c = torch.from_numpy(np.array(state["c"], dtype=np.float32))

