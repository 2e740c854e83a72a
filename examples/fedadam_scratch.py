"""FedAdam from scratch: server-side Adam (Reddi et al., "Adaptive Federated Optimization", ICLR 2021)
written as an algorithm, in one file.

    export PYTHONPATH=$PWD      # in the repository root: every rank must be able to import `examples`
    mpiexec -n 3 fedmpi run jobs/configs/quickstart.yaml \
        algorithm.name=examples.fedadam_scratch:FedAdamScratch algorithm.lr=0.01

The clients are FedAvg's; the
server keeps Adam's moments m and v in a `ServerVectors`, which checkpoints save and --resume restores with
no code here. fedmpi has the same rule built in as a setting, `server.optimizer: adam` (with `server.lr`,
`server.betas`, `server.tau`), which composes with every reduce-based algorithm: use that in practice. This
file shows how an algorithm owns its server-side step and state.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from fedmpi.algorithms.base import AlgorithmKeys, Reduce, weighted_mean_update
from fedmpi.algorithms.state import ServerVectors
from fedmpi.core.config_checks import Checks, Range, factor


@dataclass(frozen=True)
class FedAdamScratchKeys(AlgorithmKeys):
    """The `algorithm:` section: `name` plus the server's Adam settings."""

    name: str = "fedadam_scratch"
    lr: float = 0.01
    """eta: the server's step size."""
    beta1: float = 0.9
    """Decay of the first moment m."""
    beta2: float = 0.99
    """Decay of the second moment v."""
    tau: float = 1e-3
    """Adaptivity: v starts at tau^2 and tau is added to sqrt(v)."""

    # checked when the config is built, as fedmpi's own sections' ranges are
    RANGES: ClassVar[dict] = {"lr": factor(low_open=True), "beta1": Range(0, 1, high_open=True),
                              "beta2": Range(0, 1, high_open=True), "tau": Range(1e-12, 1.0)}

    def __post_init__(self):
        c = Checks("algorithm")
        c.require(self.lr > 0, "lr", self.lr, "must be > 0")
        c.require(0 <= self.beta1 < 1, "beta1", self.beta1, "must be in [0, 1)")
        c.require(0 <= self.beta2 < 1, "beta2", self.beta2, "must be in [0, 1)")
        c.require(self.tau > 0, "tau", self.tau, "must be > 0")
        c.done()


class FedAdamScratch(Reduce):
    name = "fedadam_scratch"
    Keys = FedAdamScratchKeys
    vectorizable = True             # clients only load the broadcast and train: they may train as a batch
    uses_server_optimizer = False   # `aggregate` returns the whole step: the server adds it to x as it is

    def __init__(self, keys, context):
        super().__init__(keys, context)
        # float64 moments over the trainable part, on rank 0, created at first use; saved in checkpoints
        n = self.n_params
        self.moments = ServerVectors(dtype=torch.float64, fill={"v": keys.tau ** 2}, m=n, v=n)

    def accumulate(self, run, down, model, acc):
        """Client side: adds n_i (y_i - x_t) to the accumulator, returns the weight n_i."""
        acc[: self.dim].add_(model.vec - down[: self.dim], alpha=run.weight)
        return run.weight

    def aggregate(self, x, up_sum, weight_sum, round_):
        """Server side: Delta = sum_i p_i Delta_i; m = b1 m + (1 - b1) Delta; v = b2 v + (1 - b2) Delta^2;
        the step is eta m / (sqrt(v) + tau) (Reddi et al.'s Algorithm 2, no bias correction)."""
        delta = weighted_mean_update(up_sum, weight_sum, self.dim)
        if delta is None:               # nobody uploaded: keep x
            return None
        k, n = self.keys, self.n_params
        m, v = self.moments.get("m", x.device), self.moments.get("v", x.device)
        d = delta[:n]
        m.mul_(k.beta1).add_(d, alpha=1 - k.beta1)
        v.mul_(k.beta2).add_(d * d, alpha=1 - k.beta2)
        step = delta.clone()            # float buffers (batch-norm statistics) take the plain average
        step[:n] = k.lr * m / (v.sqrt() + k.tau)
        return step
