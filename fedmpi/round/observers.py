"""Observers: figures of a round that the round itself does not need (pfl-research's callbacks).

An observer is built by the assembler where the config asks for its figures, and the round calls it at two
fixed points, on every rank (an observer whose figures need a collective makes it there; one that works on
rank 0 alone does nothing elsewhere):

  round_start(t, plan)           after the broadcast, while the workers train (the divergence shadow trains)
  round_figures(t, x, round_)    after the server step and the round's evaluation: ({metric: value},
                                 {name: [N] row}) for rank 0's row, ({}, {}) elsewhere. `x`: the global
                                 model: rank 0's own; on the other ranks the copy the evaluation shared
                                 when the round evaluated (a view of the broadcast buffer: an observer
                                 that shares a vector itself reports after those that read it), else None;
                                 `round_`: an `Observed`, the round's plan, whether it evaluated and, on
                                 rank 0, the combination the server stepped from.
  metric_attrs()                 attributes of its /metrics datasets (e.g. the divergence's layer names)

The observers: the backdoor's success rate on the triggered test set (`TriggeredAccuracy`); the divergence
from centralized SGD (fedmpi.round.shadow.Shadow); the clients' drift figures (below: `GradientDiversity`
from the reduced sums, the per-client cosines of `ClientDrift`).

Client drift (Li et al., FedProx; Karimireddy et al., SCAFFOLD). Every round, at no extra collective:
sum_i p_i ||Delta_i||^2 rides in the reduction as a statistic (`ClientDrift.measure`, called by the REDUCE
transport for each counted client), and rank 0 forms ||sum_i p_i Delta_i||^2 from the reduced sums; their
ratio, the gradient diversity or dissimilarity B^2, is 1 when every client moves the same way and grows as
they disagree. Delta_i is the client's update as uploaded (after any upload stage), p_i its weight in the
average. With `eval.client_drift: true`, also per client (/clients): ||Delta_i|| in the reduction, and the
cosine of Delta_i with the round's aggregate, which needs the aggregate on the client's rank after the
reduction: the hosting ranks keep the round's updates, rank 0 broadcasts the aggregate, and one reduction of
a per-client column brings the cosines back. That costs a broadcast, a reduction and the memory of the
round's updates on each rank, hence opt-in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedmpi.core.flat import sq_distance


@dataclass(frozen=True)
class Observed:
    """What an observer sees of the round: its plan, whether the global model was evaluated (then `x` is
    every rank's), and on rank 0 the combination's sums, weight and reduced statistics (None elsewhere)."""

    plan: object
    evaluated: bool = False
    sums: object = None
    weight: float = 0.0
    stats: object = None


class Observer:
    def round_start(self, t, plan):
        """Every rank, right after round t's broadcast."""

    def round_figures(self, t, x, round_: Observed) -> tuple:
        """Every rank, after the server step and the evaluation: rank 0's (metrics, columns) of the round."""
        return {}, {}

    def metric_attrs(self) -> dict:
        return {}


class TriggeredAccuracy(Observer):
    """The backdoor's attack success rate (`backdoor_acc`): the share of triggered test samples outside the
    target class that the global model classifies as the target, evaluated when the test set is, split across
    the ranks like it (`evaluation`: a SplitEvaluation of the triggered set)."""

    def __init__(self, evaluation):
        self.evaluation = evaluation

    def round_figures(self, t, x, round_):
        if not round_.evaluated:
            return {}, {}
        result = self.evaluation.run(x)         # collective
        return ({"backdoor_acc": result[0]} if result is not None else {}), {}


class ClientDrift(Observer):
    """The round's drift measurements on every rank (`measure`, by the REDUCE transport, for each counted
    client), and with `keep_updates` (eval.client_drift) the observer of the clients' cosines."""

    def __init__(self, num_clients, keep_updates, comm=None, share=None):
        """`comm`: the communicator the cosines are reduced over; `share(x)`: rank 0's vector to every rank
        (RoundBuffers.share); both only needed with `keep_updates`."""
        self.num_clients, self.keep = num_clients, keep_updates
        self.comm, self.share = comm, share
        self.updates = {}

    def measure(self, update, weight, tally):
        """Adds counted client `update`'s vector - start to the round's drift statistics (its squared norm in
        float64, then rounded to float32; the difference itself is only made where `keep_updates` keeps it).
        The rounding keeps the -n promise: a float32 norm times a sample-count weight has few enough significant
        bits that the float64 sum of a rank's terms, and the reduction over ranks, is exact in any grouping; a
        full 53-bit norm made update_sq and gradient_diversity differ in the last bit between -n 1 and -n 3."""
        with np.errstate(over="ignore"):     # a diverged update's norm is inf, as its float32 dot was
            sq = float(np.float32(sq_distance(update.vector, update.start)))
        tally.update_sq += weight * sq
        if self.keep:
            tally.columns["update_norm"][update.cid] = sq ** 0.5
            self.updates[update.cid] = update.delta()

    def round_figures(self, t, x, round_):
        """Collective: every rank's clients' cosines with the aggregate; the column on rank 0."""
        if not self.keep:
            return {}, {}
        sums, stats, comm = round_.sums, round_.stats, self.comm
        aggregate = None
        if comm.is_server:
            dim = len(x)
            aggregate = (sums[:dim] / stats.weight).float() if stats.weight > 0 else torch.zeros(dim)
        aggregate = self.share(aggregate)
        column = np.zeros(self.num_clients)
        norm = float(torch.linalg.vector_norm(aggregate))
        for cid, delta in self.updates.items():
            denom = norm * float(torch.linalg.vector_norm(delta))
            column[cid] = float(torch.dot(delta, aggregate.to(delta.device))) / denom if denom > 0 else np.nan
        self.updates.clear()
        comm.reduce_sum(column)
        if not comm.is_server:
            return {}, {}
        selected = round_.plan.selected
        row = np.full(self.num_clients, np.nan, dtype=np.float32)
        row[selected] = column[selected]
        return {}, {"update_cosine": row}


class GradientDiversity(Observer):
    """Rank 0: sum_i p_i ||Delta_i||^2 (a statistic of the reduction) against ||sum_i p_i Delta_i||^2 from the
    reduced sums, where the transport's sums are the clients' weighted updates (its `drift_figures`)."""

    def __init__(self, dim):
        self.dim = dim

    def round_figures(self, t, x, round_):
        stats = round_.stats
        if stats is None or not stats.weight > 0:
            return {}, {}
        head = round_.sums[: self.dim]
        update_sq = stats.update_sq / stats.weight
        aggregate_sq = float(torch.dot(head, head)) / stats.weight ** 2
        return {"update_sq_norm": update_sq, "aggregate_sq_norm": aggregate_sq,
                "gradient_diversity": update_sq / max(aggregate_sq, 1e-300)}, {}
