"""Weight divergence (Zhao et al., "Federated Learning with Non-IID Data", Fig. 2): how far the federated model
has drifted from a model trained by centralized SGD from the same start (`eval.divergence: true`).

A shadow model starts from the federated x_0 (after any pretraining or warm-up) and trains in lockstep with
the rounds: each round it sees as many samples as the round's selected clients (E * sum n_i, or K * B per
client), in batches of B, at the round's client learning rate, on the union of the clients' data, its
batches drawn from the stream (seed, SHADOW, round). After the round

    weight_divergence = ||x_FL - x_SGD|| / ||x_SGD||

over the trainable parameters, and per layer (each parameter tensor) in `weight_divergence_layers`
[round, layer] (the names in the dataset's `layers` attribute); `shadow_acc` is the shadow's test
accuracy when the federated model is evaluated. The shadow trains on rank 0 between the round's broadcast
and its reduction, while the workers train (the observer's `round_start`), so it adds no time to the round's
critical path where rank 0 has a core (at -n 1 it runs before the clients). Momentum and weight decay follow
`client`; the momentum buffer restarts every round, as a client's does.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch

from fedmpi.core import rng
from fedmpi.core.flat import FlatModel
from fedmpi.core.train import LocalTrainer, Schedule, evaluate, seed_torch_on
from fedmpi.round.observers import Observer


class Shadow(Observer):
    """An observer (fedmpi.round.observers) on rank 0 only: it trains at the round's start and gives the
    divergence, and the shadow's accuracy when the round evaluates, in the round's figures."""

    def __init__(self, flat, x0, x_train, y_train, parts, *, client, seed, client_rate, test_set, eval_batch,
                 loss=None):
        """From the `client` section (batches, epochs or steps, momentum), the run's `seed` and eta_l under
        client.lr_schedule (`client_rate`, the schedules.LearningRate the clients train with); `test_set()`:
        the test set's tensors on the device, evaluated in batches of `eval_batch` (eval.batch_size)."""
        self.client, self.seed, self.client_rate = client, seed, client_rate
        self.test_set, self.eval_batch = test_set, eval_batch
        self.flat = FlatModel(copy.deepcopy(flat.module), flat.device)
        self.flat.load(x0)
        self.sizes = np.array([len(p) for p in parts])
        self.union = torch.from_numpy(np.sort(np.concatenate(parts))).to(flat.device)
        self.trainer = LocalTrainer(self.flat, client, x_train, y_train, loss=loss)
        self.loss = loss
        spans, offset = [], 0
        for name, p in self.flat.module.named_parameters():
            if p.requires_grad:
                spans.append((name, offset, offset + p.numel()))
                offset += p.numel()
        self.layers = [name for name, _, _ in spans]
        self.spans = [(a, b) for _, a, b in spans]

    def steps(self, selected):
        c = self.client
        samples = c.steps * c.batch_size * len(selected) if c.steps else c.epochs * int(self.sizes[selected].sum())
        return max(1, math.ceil(samples / c.batch_size))

    def train_round(self, t, selected):
        seed_torch_on(self.flat.device, self.seed, rng.SHADOW, t, 1)
        self.trainer.train(self.union, rng.stream(self.seed, rng.SHADOW, t),
                           Schedule(self.client.batch_size, self.steps(np.asarray(selected))),
                           lr=self.client_rate.at(t))

    # -- the observer's hooks -------------------------------------------------------------------------------
    def round_start(self, t, plan):
        self.train_round(t, plan.selected)

    def round_figures(self, t, x, round_):
        metrics = dict(zip(("weight_divergence", "weight_divergence_layers"), self.divergence(x)))
        if round_.evaluated:
            metrics["shadow_acc"] = self.accuracy(*self.test_set(), self.eval_batch)
        return metrics, {}

    def metric_attrs(self) -> dict:
        return {"weight_divergence_layers": {"layers": self.layers}}

    def divergence(self, x):
        """(||x - w|| / ||w|| over the trainable part, the same per layer) against the shadow w."""
        n = self.flat.n_params
        w, d = self.flat.vec[:n].double(), x[:n].double() - self.flat.vec[:n].double()
        total = float(torch.linalg.vector_norm(d) / torch.linalg.vector_norm(w).clamp_min(1e-30))
        layers = np.array([float(torch.linalg.vector_norm(d[a:b]) / torch.linalg.vector_norm(w[a:b]).clamp_min(1e-30))
                           for a, b in self.spans])
        return total, layers

    def accuracy(self, x_test, y_test, batch_size):
        return evaluate(self.flat.module, x_test, y_test, batch_size, loss=self.loss)[0]
