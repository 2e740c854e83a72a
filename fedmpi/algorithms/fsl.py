"""FL with Server Learning (Mai, La, Zhang, "Federated Learning with Server Learning"; docs/explanation/algorithms.md
"FSL").

Incremental (Algorithm 1): xbar_t = x_t + eta_g * sum_i p_i Delta_i (FedAvg's lines 1-9, applied by the server
optimizer), then the server runs K0 SGD steps on its own set D0 from xbar_t with learning rate gamma * eta0
(line 10, `after_step`) -> x_{t+1}.
Parallel ("non-incremental SL", §II): the server trains from x_t on D0 like a client, and the update is
(sum_i p_i Delta_i + gamma Delta_0) / (1 + gamma), so x_{t+1} = x_t + eta_g * that under `sgd`.

Paper defaults where a key is null: server epochs E_s = ceil(n / (N n0) * E_c), B0 = B,
eta0 = sqrt(S) * eta_l * K / K0 with K the clients' local steps (for a client of mean size), K0 the
server's and eta_l the round's client learning rate. Interpretations (the extract leaves them open): in
parallel mode the server's step size is `server_lr` if set, else the clients' eta_l, since there the server
acts as one more client; eta_g stays `server.lr` (the paper's sqrt(S) is set in the paper configs).
"""

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from fedmpi.algorithms.base import AlgorithmKeys, weighted_mean_update
from fedmpi.algorithms.catalog import register
from fedmpi.algorithms.fedavg import FedAvg
from fedmpi.core.config_checks import Range, count, factor

PRETRAIN_ROUND = 10**9    # stream key for pretraining, distinct from every real round


@dataclass(frozen=True)
class FslKeys(AlgorithmKeys):
    name: str = "fsl"
    gamma: float = 1.0
    """Weight of the server's objective: the target is (F + gamma f0) / (1 + gamma); 0 = FedAvg."""
    mode: Literal["incremental", "parallel"] = "incremental"
    """incremental: the server trains from the aggregate (Algorithm 1); parallel: from x_t, like a client."""
    server_epochs: int | None = None
    """Server epochs E_s per round; null = ceil(n / (N n0) * E_c)."""
    server_lr: float | None = None
    """eta0; null = sqrt(S) * eta_l * K / K0 (incremental) or eta_l (parallel)."""
    server_batch_size: int | None = None
    """B0; null = the clients' batch size."""
    pretrain_epochs: int = 0
    """Epochs of SGD on D0 before round 0; 0 = none (the paper pretrains 500 epochs)."""
    pretrain_lr: float = 0.01
    """Learning rate of the pretraining."""

    RANGES: ClassVar[dict] = {"gamma": factor(), "server_epochs": count(), "server_lr": factor(low_open=True),
                              "server_batch_size": Range(1, 2 ** 31 - 1), "pretrain_epochs": count(0),
                              "pretrain_lr": factor(low_open=True)}


@register
class Fsl(FedAvg):
    name = "fsl"
    robust_aggregation = False   # its own aggregate or upload: not a weighted mean of one vector
    Keys = FslKeys
    uses_server_set = True
    server_set_hint = "it is D0, e.g. server_data: {size: 500, scheme: iid}"

    def __init__(self, keys, context):
        super().__init__(keys, context)
        self.server = None
        self.server_loss = np.nan

    # -- the paper's default rules ----------------------------------------------------------------
    def client_steps(self, sizes):
        c = self.context.client
        mean = float(np.mean(sizes))
        per_epoch = max(1, math.floor(mean / c.batch_size)) if c.drop_last else math.ceil(mean / c.batch_size)
        return c.steps or c.epochs * per_epoch

    def server_schedule(self, sizes, round_=0):
        """(batch size B0, steps K0, learning rate gamma * eta0) of round `round_`'s server learning."""
        k, c = self.keys, self.context.client
        eta_l = self.context.client_lr(round_)
        n0 = len(self.server_idx)
        batch = k.server_batch_size or c.batch_size
        epochs = k.server_epochs or math.ceil(float(np.sum(sizes)) / (len(sizes) * n0) * c.epochs)
        steps = epochs * math.ceil(n0 / batch)
        if k.mode == "parallel":
            return batch, steps, k.server_lr or eta_l
        eta0 = k.server_lr or math.sqrt(self.context.clients_per_round) * eta_l * self.client_steps(sizes) / steps
        return batch, steps, k.gamma * eta0

    # -- hooks ----------------------------------------------------------------------------------
    def initial_model(self, x0, server_trainer):
        self.server = server_trainer
        k = self.keys
        if k.pretrain_epochs <= 0:
            return x0
        batch = k.server_batch_size or self.context.client.batch_size
        steps = server_trainer.steps_for(k.pretrain_epochs, batch)
        x0, _ = server_trainer.train(x0, PRETRAIN_ROUND, steps, batch, k.pretrain_lr)
        return x0

    def aggregate(self, x, up_sum, weight_sum, round_):
        mean_delta = self._mean = weighted_mean_update(up_sum, weight_sum, self.dim, out=self._mean)
        if self.keys.mode != "parallel":
            return mean_delta
        batch, steps, lr = self.server_schedule(self.sizes, round_)
        y0, self.server_loss = self.server.train(x, round_, steps, batch, lr)
        server_delta = (y0 - x).double() * self.keys.gamma
        return (server_delta if mean_delta is None else mean_delta + server_delta) / (1 + self.keys.gamma)

    def after_step(self, x, round_):
        if self.keys.mode == "parallel" or self.keys.gamma == 0:
            return x
        batch, steps, lr = self.server_schedule(self.sizes, round_)
        x_next, self.server_loss = self.server.train(x, round_, steps, batch, lr)
        return x_next

    def round_metrics(self):
        return {"server_loss": self.server_loss}
