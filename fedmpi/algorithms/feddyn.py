"""FedDyn (Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021).

Client i minimises f_i(w) - <g_i, w> + alpha/2 ||w - x_t||^2, i.e. adds -g_i + alpha (w - x_t) to its
gradient, then updates g_i <- g_i - alpha (y_i - x_t) (g_i starts at zero). The server keeps h (zero at
the start): h <- h - alpha/N * sum_{i in P_t} (y_i - x_t) with N all clients, and
x_{t+1} = mean_{i in P_t} y_i - h / alpha, an unweighted mean over the participants as in the paper and
its reference code. The rule has no server step size, so server.lr must stay 1.0.

g_i and h cover the trainable part of the flat vector only; buffers (batch-norm statistics) are averaged.
"""

import numpy as np
import torch

from fedmpi.algorithms.base import Algorithm, ClientVectors
from fedmpi.errors import ConfigError


class FedDyn(Algorithm):
    name = "feddyn"

    def __init__(self, cfg, dim, n_params):
        super().__init__(cfg, dim, n_params)
        if cfg.server.lr != 1.0:
            raise ConfigError(f"server.lr = {cfg.server.lr!r}: feddyn's server update "
                              "(x = mean y_i - h / alpha) has no step size; use server.lr = 1.0")
        self.alpha = float(self.keys.alpha)
        self.num_clients = cfg.partition.clients   # N in h's update
        self._h = None                 # server state (rank 0), created at first use on x's device
        self._grads = ClientVectors("g_i")   # on the rank hosting the client; absent = zero
        self._offset = None            # g_i + alpha x_t of the client being trained

    # -- server ---------------------------------------------------------------------------------
    def _server_h(self, device):
        if self._h is None:
            self._h = torch.zeros(self.n_params, dtype=torch.float32, device=device)
        elif self._h.device != device:
            self._h = self._h.to(device)
        return self._h

    def server_update(self, x, up_sum, weight_sum, round_):
        if weight_sum <= 0:
            return x
        n = self.n_params
        h = self._server_h(x.device)
        h.sub_((up_sum[:n] * (self.alpha / self.num_clients)).to(h.dtype))
        # up_sum holds sum_i (y_i - x_t) and weight_sum the number of participants: x_t + that / |P_t|
        # is their mean model.
        new = x + (up_sum[: self.dim] / weight_sum).to(x.dtype)
        new[:n].sub_(h / self.alpha)
        return new

    # -- client ---------------------------------------------------------------------------------
    def _client_grad(self, cid, device):
        g_i = self._grads.on(cid, device)
        return torch.zeros(self.n_params, dtype=torch.float32, device=device) if g_i is None else g_i

    def client_start(self, run, down, model):
        super().client_start(run, down, model)
        # -g_i + alpha (w - x_t) = alpha w - (g_i + alpha x_t): the bracket is fixed for the whole client,
        # so each step costs two in-place operations.
        self._offset = self._client_grad(run.cid, model.device) + self.alpha * down[: self.n_params]

    def grad_hook(self, params, grad):
        grad.add_(params, alpha=self.alpha).sub_(self._offset)

    def accumulate(self, run, down, model, acc):
        delta = model.vec - down[: self.dim]
        acc[: self.dim].add_(delta)
        g_i = self._client_grad(run.cid, model.device)
        self._grads[run.cid] = g_i - self.alpha * delta[: self.n_params]
        return 1.0     # unweighted mean over the participants

    # -- checkpoint state -----------------------------------------------------------------------
    def server_state(self):
        h = self._h if self._h is not None else torch.zeros(self.n_params, dtype=torch.float32)
        return {"h": h.detach().cpu().numpy().copy()}

    def load_server_state(self, state):
        self._h = torch.from_numpy(np.array(state["h"], dtype=np.float32))

