"""The upload path of a run: its stages (fedmpi.uploads.base) in their declared order, with the `Layout` of
their slots, called at the round's fixed points. What a round learns from the broadcast (each stage's header
values) comes back as a value, `RoundStages`, which the round hands to the stages' client and server hooks:
nothing is kept here between those calls.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedmpi.uploads.base import ClientUpdate, Layout, ordered


@dataclass(frozen=True)
class RoundStages:
    """The round's views of every stage (in the path's order), made after the broadcast."""

    plan: object
    header: tuple = ()      # every stage's header values, as received


class UploadPath:
    def __init__(self, stages, algo_up_len):
        """`stages`: the built stages (any order); `algo_up_len`: the algorithm's upload sums, after which the
        stages' sums lie in the reduction."""
        self.stages = tuple(ordered(stages))
        self.layout = Layout.of(self.stages, algo_up_len)

    def __iter__(self):
        return iter(self.stages)

    def __len__(self):
        return len(self.stages)

    @property
    def keeps_client_state(self) -> bool:
        return any(stage.keeps_client_state for stage in self.stages)

    def carrier(self):
        """The stage that carries the update itself (`own_vector_transport`), or None."""
        return next((stage for stage in self.stages if stage.own_vector_transport), None)

    def header(self, t) -> list:
        """Rank 0, before round t's broadcast: every stage's header values, in order."""
        return [float(v) for stage in self.stages for v in stage.header(t)]

    def begin(self, plan, header_values=()) -> RoundStages:
        """Every rank, after the broadcast: each stage's `begin`; the round's views for the hooks below."""
        round_ = RoundStages(plan, tuple(header_values))
        for stage, view in zip(self.stages, self.layout.views(plan, round_.header)):
            stage.begin(plan, view)
        return round_

    def client(self, update: ClientUpdate, round_: RoundStages) -> ClientUpdate:
        """Worker: a counted client's update through every stage."""
        for stage, view in zip(self.stages, self.layout.views(round_.plan, round_.header)):
            update = stage.client(update, view)
        return update

    def add_scalars(self, update: ClientUpdate, acc):
        """Adds the update's stage scalars into their slots of the accumulator `acc` (after the algorithm's
        own sums), stage by stage in order."""
        for stage, slots in zip(self.stages, self.layout.slots):
            for i, value in enumerate(update.scalars.get(stage.name, ())):
                acc[slots.scalars.start + i] += value

    def server(self, sums, weight, round_: RoundStages) -> tuple:
        """Rank 0, after the combination: (sums, weight, /metrics figures) through every stage in order."""
        metrics = {}
        for stage, view in zip(self.stages, self.layout.views(round_.plan, round_.header, sums)):
            sums, weight, figures = stage.server(sums, weight, view)
            metrics.update(figures)
        return sums, weight, metrics
