"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020).

Each client minimises its loss plus the proximal term mu/2 ||w - x_t||^2, which keeps the local model near
the round's global model. Its gradient mu (w - x_t) is added to the flat gradient after every backward
pass; uploads and the update are FedAvg's. With mu = 0 FedProx is FedAvg.
"""

from dataclasses import dataclass
from typing import ClassVar

from fedmpi.algorithms.base import AlgorithmKeys
from fedmpi.algorithms.catalog import register
from fedmpi.algorithms.fedavg import FedAvg
from fedmpi.core.config_checks import factor


@dataclass(frozen=True)
class FedProxKeys(AlgorithmKeys):
    name: str = "fedprox"
    mu: float = 0.01
    """Weight of the proximal term mu/2 ||w - x_t||^2 (>= 0; 0 is FedAvg)."""

    RANGES: ClassVar[dict] = {"mu": factor()}


@register
class FedProx(FedAvg):
    name = "fedprox"
    Keys = FedProxKeys
    vectorizable = False

    def __init__(self, keys, context):
        super().__init__(keys, context)
        self.mu = float(self.keys.mu)
        self._mu_anchor = None   # mu * x_t over the trainable part, for the client being trained

    def client_start(self, run, down, model):
        super().client_start(run, down, model)
        # mu (w - x_t) = mu w - mu x_t: computing mu x_t once per client leaves two in-place operations
        # per step and no temporary the size of the model.
        self._mu_anchor = down[: self.n_params] * self.mu

    def grad_hook(self, params, grad):
        grad.add_(params, alpha=self.mu).sub_(self._mu_anchor)
