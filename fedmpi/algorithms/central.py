"""Centralized SGD baseline (Zhao et al.): ordinary SGD on the union of the clients' data.

The union is one pseudo-client. Each round it sees as many samples as the round's selected clients would
(`epochs * sum n_i`, or `steps * B` per client), in batches of `B * S`, so curves compare per round. Its
trained model is the next global model: no averaging step, so `server.lr` does not apply and the server
optimizer must be `sgd`.
"""

import math
from dataclasses import dataclass

import numpy as np

from fedmpi.algorithms.base import AlgorithmKeys
from fedmpi.algorithms.catalog import register
from fedmpi.algorithms.fedavg import FedAvg


@dataclass(frozen=True)
class CentralKeys(AlgorithmKeys):
    name: str = "central"


@register
class Central(FedAvg):
    name = "central"
    robust_aggregation = False   # its own aggregate or upload: not a weighted mean of one vector
    Keys = CentralKeys
    uses_server_optimizer = False
    fixed_cohort_only = "it trains one pseudo-client on as many samples as the fixed-size draw holds"

    @classmethod
    def privacy_problems(cls, keys, client_steps):
        return ["there are no clients to clip: centralized SGD would need per-example DP-SGD"]

    @classmethod
    def client_count(cls, keys, num_clients):
        return 1

    def clients(self, parts, server_idx):
        return [np.sort(np.concatenate(parts))]

    def select(self, round_, selected, sizes):
        return np.array([0])

    def schedule(self, client, sizes, selected):
        c, s = self.context.client, len(selected)
        batch = c.batch_size * s
        if c.steps:
            samples = c.steps * c.batch_size * s
        else:
            samples = c.epochs * int(sum(sizes[i] for i in selected))
        return batch, max(1, math.ceil(samples / batch))
