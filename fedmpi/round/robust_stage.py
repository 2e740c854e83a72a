"""norm_bound under the plain reduction: each counted client's update clipped at server.robust.bound on its
host before the weighted sum, so no gather is needed (fedmpi.robust.rules.NormBound is the same rule on the
gathered rows, used when an omniscient attack forces the gather). /clients/robust_weight is the clip factor
min(1, bound / ||u_i||), as there."""

from __future__ import annotations

from fedmpi.core.lazy import torch
from fedmpi.robust.aggregators import clip_factors
from fedmpi.uploads.base import UploadStage


class NormBoundStage(UploadStage):
    name = "norm_bound"

    def __init__(self, keys, dim):
        self.bound, self.weighted, self.dim = float(keys.bound), bool(keys.weighted), dim

    def client(self, run, down, model):
        start = down[: self.dim]
        delta = model.vec - start
        norm = float(torch.linalg.vector_norm(delta.double()))
        factor = float(clip_factors([norm], self.bound)[0])
        if factor < 1.0:
            model.vec.copy_(start + delta * factor)
        run.figures["robust_weight"] = factor
        if not self.weighted:
            run.weight = 1.0
