"""Walk-through 6 of docs/how-to/own-algorithm.md: an upload stage in one file, run by
`uploads: {stages: [examples.norm_clip_stage:NormClip], keys: {max_norm: 1.0}}`.

Each counted client's update Delta = y_i - x_t is scaled down on its host to an L2 norm of at most max_norm
before anything later on the upload path (privacy, secure aggregation, the wire) sees it; the round's share of
clipped uploads reaches /metrics/norm_clip_fraction through the stage's two sums in the reduction.
"""

import torch

from fedmpi.core.config_checks import Range
from fedmpi.uploads.base import UploadStage


class NormClip(UploadStage):
    name = "norm_clip"
    order = 25                  # after compression (20), before privacy (30) and secure aggregation (40)
    reads = ("uploads",)        # the sections build() takes: here its keys, uploads.keys
    uses = ("max_norm",)        # the uploads.keys it reads; another key set is refused
    # checked at set-up: a bound > 0 and finite (1e30 is above any update's norm: nothing is clipped)
    RANGES = {"max_norm": Range(0, 1e30, "a larger bound clips nothing more", low_open=True)}
    up_scalars = 2              # its sums in the round's reduction: uploads clipped, uploads counted
    columns = ("clip_factor",)  # its per-client figure, /clients/clip_factor
    works_with_secure_aggregation = True    # it bounds each update before the update is masked

    @classmethod
    def build(cls, setting, *, uploads):
        return cls(float(uploads.keys.get("max_norm", 1.0)))

    def __init__(self, max_norm):
        self.max_norm = max_norm

    def client(self, update, view):
        # update.vector is the trained model (a view of the rank's model: transform it in place), update.start
        # the round's start point; the rest of the update is replaced, never set on the stage
        delta = update.delta()
        norm = float(torch.linalg.vector_norm(delta.double()))
        factor = min(1.0, self.max_norm / norm) if norm > 0 else 1.0
        if factor < 1.0:
            update.vector.copy_(update.start + delta * factor)
        return update.adding(scalars={self.name: (float(factor < 1.0), 1.0)}, figures={"clip_factor": factor})

    def server(self, sums, weight, view):
        # view.scalars: this stage's two sums over every rank's counted clients
        clipped, counted = float(view.scalars[0]), float(view.scalars[1])
        return sums, weight, {"norm_clip_fraction": clipped / counted if counted else float("nan")}
