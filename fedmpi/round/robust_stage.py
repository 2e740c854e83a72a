"""norm_bound under the plain reduction: each counted client's update clipped at server.robust.bound on its
host before the weighted sum, so no gather is needed (fedmpi.robust.rules.NormBound is the same rule on the
gathered rows, used when an omniscient attack forces the gather). /clients/robust_weight is the clip factor
min(1, bound / ||u_i||), as there."""

from __future__ import annotations

from fedmpi.core.lazy import torch
from fedmpi.robust.aggregators import clip_factors
from fedmpi.round.robust_checks import uses_gather
from fedmpi.uploads.base import ORDER_BOUND, UploadStage


class NormBoundStage(UploadStage):
    name, order = "norm_bound", ORDER_BOUND
    reads = ("server", "attack")
    columns = ("robust_weight",)

    @classmethod
    def build(cls, setting, *, server, attack):
        """The stage of server.aggregator = norm_bound where the plain reduction serves; None otherwise."""
        if server.aggregator != "norm_bound" or uses_gather(server.aggregator, attack.name):
            return None
        return cls(server.robust, setting.dim)

    def __init__(self, keys, dim):
        self.bound, self.weighted, self.dim = float(keys.bound), bool(keys.weighted), dim

    def client(self, update, view):
        delta = update.delta()
        norm = float(torch.linalg.vector_norm(delta.double()))
        factor = float(clip_factors([norm], self.bound)[0])
        if factor < 1.0:
            update.vector.copy_(update.start + delta * factor)
        return update.adding(figures={"robust_weight": factor}, **({} if self.weighted else {"weight": 1.0}))
