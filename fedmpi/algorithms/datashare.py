"""FedAvg with a globally shared data set (Zhao et al., "Federated Learning with Non-IID Data").

The server holds G (`server_data`; Zhao et al.: uniform over classes, `scheme: classes`, drawn from a
holdout H with `server_data.holdout` and sized relative to the clients' data with `server_data.fraction`).
At start a warm-up model is trained on G and becomes x_0 (`warmup_epochs`, `warmup_lr`; 0 epochs = no
warm-up). With `warmup_target_acc` the warm-up stops after the first epoch whose model reaches that test
accuracy (the paper trains it "to a test accuracy of ~60%"), `warmup_epochs` being the most it runs;
/metrics/warmup_epochs and /metrics/warmup_acc (round 0) say where it stopped. Each client receives its own
random fraction `alpha` of G, drawn from the stream (seed, DATA, client), and trains FedAvg on D_i ∪ G_i,
weighted by |D_i ∪ G_i|. The FSL paper's "DS" baseline is alpha = 1 with G = D0. The EMD of the clients'
label distributions before and after sharing is logged (`/partition` and `/partition/shared`).
"""

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fedmpi.algorithms.base import AlgorithmKeys
from fedmpi.algorithms.catalog import register
from fedmpi.algorithms.fedavg import FedAvg
from fedmpi.core import rng
from fedmpi.core.config_checks import Checks, Range, count, factor

WARMUP_ROUND = 10**9 + 1   # stream key for the warm-up, distinct from every real round
SHARE_KEY = 7              # distinguishes the per-client share draw from other DATA streams


@dataclass(frozen=True)
class DataShareKeys(AlgorithmKeys):
    name: str = "datashare"
    alpha: float = 0.5
    """Fraction of G each client receives, in [0, 1]."""
    warmup_epochs: int = 0
    """Epochs of SGD on G before round 0 (the warm-up model becomes x_0); 0 = no warm-up."""
    warmup_lr: float = 0.01
    """Learning rate of the warm-up."""
    warmup_target_acc: float | None = None
    """Stop the warm-up once the test accuracy reaches this (checked after each epoch, at most
    warmup_epochs epochs); null = exactly warmup_epochs epochs."""

    RANGES: ClassVar[dict] = {"alpha": Range(0, 1), "warmup_epochs": count(0), "warmup_lr": factor(low_open=True),
                              "warmup_target_acc": Range(0, 1, low_open=True)}

    def __post_init__(self):
        c = Checks("algorithm")
        t = self.warmup_target_acc
        c.require(t is None or self.warmup_epochs > 0, "warmup_target_acc", t,
                  "needs algorithm.warmup_epochs > 0, the most epochs the warm-up may take")
        c.done()


@register
class DataShare(FedAvg):
    name = "datashare"
    Keys = DataShareKeys
    uses_server_set = True
    server_set_hint = "it is the shared set G; Zhao et al. use 10% of the training set, uniform over classes"
    shares_data = True

    def clients(self, parts, server_idx):
        share = int(round(self.keys.alpha * len(server_idx)))
        merged = []
        for cid, part in enumerate(parts):
            g = rng.stream(self.context.seed, rng.DATA, SHARE_KEY, cid)
            mine = g.choice(server_idx, size=share, replace=False) if share else np.empty(0, np.int64)
            merged.append(np.concatenate([part, np.sort(mine)]).astype(np.int64))
        return merged

    def __init__(self, keys, context):
        super().__init__(keys, context)
        self.warmup = {}     # warm-up figures for /metrics at round 0 (warmup_target_acc)
        self._round = None

    def initial_model(self, x0, server_trainer):
        k = self.keys
        if k.warmup_epochs <= 0:
            return x0
        batch = self.context.client.batch_size
        if k.warmup_target_acc is None:
            x0, _ = server_trainer.train(x0, WARMUP_ROUND, server_trainer.steps_for(k.warmup_epochs, batch), batch,
                                         k.warmup_lr)
            return x0
        x0, epochs, acc = server_trainer.train_until(x0, WARMUP_ROUND, k.warmup_epochs, batch, k.warmup_lr,
                                                     target=k.warmup_target_acc)
        self.warmup = {"warmup_epochs": float(epochs), "warmup_acc": acc}
        return x0

    def aggregate(self, x, up_sum, weight_sum, round_):
        self._round = round_
        return super().aggregate(x, up_sum, weight_sum, round_)

    def round_metrics(self):
        return dict(self.warmup) if self._round == 0 else {}
