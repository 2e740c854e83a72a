"""Centralized SGD baseline (Zhao et al.): ordinary SGD on the union of the clients' data.

The union is one pseudo-client. Each round it sees as many samples as the round's selected clients would
(`epochs * sum n_i`, or `steps * B` per client), in batches of `B * S`, so curves compare per round.
"""

import math

import numpy as np

from fedmpi.algorithms.base import Algorithm


class Central(Algorithm):
    name = "central"

    def clients(self, parts):
        return [np.sort(np.concatenate(parts))]

    def select(self, round_, selected, sizes):
        return np.array([0])

    def schedule(self, client, sizes, selected):
        c, s = self.cfg.client, len(selected)
        batch = c.batch_size * s
        if c.steps:
            samples = c.steps * c.batch_size * s
        else:
            samples = c.epochs * int(sum(sizes[i] for i in selected))
        return batch, max(1, math.ceil(samples / batch))

    def server_update(self, x, up_sum, weight_sum, round_):
        # The one pseudo-client's model is the new model: plain SGD, no averaging step size.
        return x + (up_sum[: self.dim] / weight_sum).to(x.dtype) if weight_sum > 0 else x
