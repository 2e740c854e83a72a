"""FedAvg (McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data", 2017).

Each selected client trains from x_t and uploads n_i Delta_i; the update is sum_i p_i Delta_i with
p_i = n_i / sum_j n_j, which the server optimizer applies (`sgd`: x + eta_g * update). Most algorithms
extend this class: their clients train differently but upload and average the same way.
"""

from dataclasses import dataclass

from fedmpi.algorithms.base import AlgorithmKeys, Reduce, weighted_mean_update
from fedmpi.algorithms.catalog import register
from fedmpi.algorithms.hooks import Algorithm
from fedmpi.core.flat import add_update


@dataclass(frozen=True)
class FedAvgKeys(AlgorithmKeys):
    name: str = "fedavg"


@register
class FedAvg(Reduce):
    name = "fedavg"
    Keys = FedAvgKeys
    vectorizable = True
    robust_aggregation = True
    uploads_model_delta = True

    def __init__(self, keys, context):
        super().__init__(keys, context)
        self._mean = None       # the aggregate's buffer, reused every round (server)

    def accumulate(self, run, down, model, acc):
        w = run.weight
        add_update(acc[: self.dim], model.vec, down[: self.dim], w)      # acc += w (vec - down), in blocks
        return w

    def aggregate(self, x, up_sum, weight_sum, round_):
        self._mean = weighted_mean_update(up_sum, weight_sum, self.dim, out=self._mean)
        return self._mean

    @property
    def update_is_the_mean(self):
        """True where this algorithm keeps FedAvg's aggregate and server step: a subclass with an aggregate or an
        `after_step` of its own, personal entries (which the server never changes) or no server optimizer is
        not the plain mean. Inferred, unlike robust_aggregation, because it only chooses how the same
        arithmetic is done."""
        cls = type(self)
        return (cls.aggregate is FedAvg.aggregate and cls.after_step is Algorithm.after_step
                and self.split is None and self.uses_server_optimizer)
