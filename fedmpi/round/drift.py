"""Client-drift diagnostics of the REDUCE protocol (Li et al., FedProx; Karimireddy et al., SCAFFOLD).

Every round, at no extra collective: sum_i p_i ||Delta_i||^2 rides in the reduction as a statistic, and rank
0 forms ||sum_i p_i Delta_i||^2 from the reduced sums; their ratio, the gradient diversity or
dissimilarity B^2, is 1 when every client moves the same way and grows as they disagree. Delta_i is the
client's update as uploaded (after any upload stage), p_i its weight in the average.

With `eval.client_drift: true`, also per client (/clients): ||Delta_i|| in the reduction, and the cosine of
Delta_i with the round's aggregate, which needs the aggregate on the client's rank after the reduction:
the hosting ranks keep the round's updates, rank 0 broadcasts the aggregate, and one reduction of a
per-client column brings the cosines back. That costs a broadcast, a reduction and the memory of the
round's updates on each rank, hence opt-in.
"""

from __future__ import annotations

import numpy as np
import torch


class ClientDrift:
    def __init__(self, num_clients, keep_updates):
        self.num_clients, self.keep = num_clients, keep_updates
        self.updates = {}

    def measure(self, run, delta, weight, tally):
        """Adds client `run.cid`'s update `delta` to the round's drift statistics."""
        sq = float(torch.dot(delta, delta))
        tally.update_sq += weight * sq
        if self.keep:
            tally.columns["update_norm"][run.cid] = sq ** 0.5
            self.updates[run.cid] = delta.clone()

    def cosines(self, parts, sums, stats):
        """Collective: every rank's clients' cosines with the aggregate; the column on rank 0, None elsewhere.
        `parts`: the round's parts (fedmpi.round.engine.RoundParts: its comm, wire and flat model)."""
        dim = parts.flat.dim
        aggregate = None
        if parts.comm.is_server:
            aggregate = (sums[:dim] / stats.weight).float() if stats.weight > 0 else torch.zeros(dim)
        aggregate = parts.wire.share(aggregate)
        column = np.zeros(self.num_clients)
        norm = float(torch.linalg.vector_norm(aggregate))
        for cid, delta in self.updates.items():
            denom = norm * float(torch.linalg.vector_norm(delta))
            column[cid] = float(torch.dot(delta, aggregate.to(delta.device))) / denom if denom > 0 else np.nan
        self.updates.clear()
        parts.comm.reduce_sum(column)
        return column if parts.comm.is_server else None
