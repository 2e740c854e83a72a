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

The observers here: the backdoor's success rate on the triggered test set (`TriggeredAccuracy`); the
divergence from centralized SGD (fedmpi.round.shadow.Shadow); the clients' drift figures
(fedmpi.round.drift: the gradient diversity from the reduced sums, the per-client cosines).
"""

from __future__ import annotations

from dataclasses import dataclass


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
