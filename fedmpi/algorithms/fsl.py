"""FL with Server Learning (Mai, La, Zhang; papers/000; ALGORITHMS.md "FSL").

Incremental (Algorithm 1): xbar_t = x_t + eta_g * sum_i p_i Delta_i (FedAvg's lines 1-9), then the server
runs K0 SGD steps on its own set D0 from xbar_t with learning rate gamma * eta0 (line 10) -> x_{t+1}.
Parallel ("non-incremental SL", §II): the server trains from x_t on D0 like a client, and
x_{t+1} = x_t + eta_g * (sum_i p_i Delta_i + gamma Delta_0) / (1 + gamma).

Paper defaults where a key is null: server epochs E_s = ceil(n / (N n0) * E_c), B0 = B,
eta0 = sqrt(S) * eta_l * K / K0 with K the clients' local steps (for a client of mean size) and K0 the
server's. Interpretations (the extract leaves them open): in parallel mode the server's step size is
`server_lr` if set, else the clients' eta_l, since there the server acts as one more client; eta_g stays
`server.lr` (the paper's sqrt(S) is set in the paper configs, not forced here).
"""

import math

import numpy as np

from fedmpi.algorithms.base import Algorithm

PRETRAIN_ROUND = 10**9    # stream key for pretraining, distinct from every real round


class Fsl(Algorithm):
    name = "fsl"
    uses_server_set = True
    server_set_required = "it is D0, e.g. server_data: {size: 500, scheme: iid}"

    def __init__(self, cfg, dim, n_params):
        super().__init__(cfg, dim, n_params)
        self.server = None
        self.server_loss = np.nan

    # -- the paper's default rules ----------------------------------------------------------------
    def client_steps(self, sizes):
        c = self.cfg.client
        return c.steps or c.epochs * math.ceil(float(np.mean(sizes)) / c.batch_size)

    def server_schedule(self, sizes):
        """(batch size B0, steps K0, learning rate gamma * eta0) of one round of server learning."""
        k, c = self.keys, self.cfg.client
        n0 = len(self.server_idx)
        batch = k.server_batch_size or c.batch_size
        epochs = k.server_epochs or math.ceil(float(np.sum(sizes)) / (len(sizes) * n0) * c.epochs)
        steps = epochs * math.ceil(n0 / batch)
        if k.mode == "parallel":
            return batch, steps, k.server_lr or c.lr
        eta0 = k.server_lr or math.sqrt(self.cfg.server.clients_per_round) * c.lr * self.client_steps(sizes) / steps
        return batch, steps, k.gamma * eta0

    # -- hooks ----------------------------------------------------------------------------------
    def initial_model(self, x0, server_trainer):
        self.server = server_trainer
        k = self.keys
        if k.pretrain_epochs <= 0:
            return x0
        batch = k.server_batch_size or self.cfg.client.batch_size
        steps = server_trainer.steps_for(k.pretrain_epochs, batch)
        x0, _ = server_trainer.train(x0, PRETRAIN_ROUND, steps, batch, k.pretrain_lr)
        return x0

    def server_update(self, x, up_sum, weight_sum, round_):
        k = self.keys
        batch, steps, lr = self.server_schedule(self.sizes)
        if k.mode == "parallel":
            mean_delta = (up_sum[: self.dim] / weight_sum).to(x.dtype) if weight_sum > 0 else 0 * x
            y0, self.server_loss = self.server.train(x, round_, steps, batch, lr)
            return x + self.cfg.server.lr * (mean_delta + k.gamma * (y0 - x)) / (1 + k.gamma)
        xbar = super().server_update(x, up_sum, weight_sum, round_)
        if k.gamma == 0:
            return xbar
        x_next, self.server_loss = self.server.train(xbar, round_, steps, batch, lr)
        return x_next

    def round_metrics(self):
        return {"server_loss": self.server_loss}
