"""The client-to-server path of an upload, as stages: pure transforms between a client's training and the
round's transport (pfl-research's Postprocessor shape).

A stage sees values and returns values:
  client(update, view) -> update            worker, per counted client: a `ClientUpdate` in, one out (its
                                            vector transformed, its weight, bytes, scalars, figures replaced)
  server(sums, weight, view) -> (sums, weight, metrics)   rank 0, after the round's combination
and, for the stages that must talk over the round, two more hooks (none by default):
  header(t) -> list                          rank 0, before round t's broadcast: `header_size` floats for
                                            every rank (e.g. differential privacy's adaptive clip)
  begin(plan, view)                          every rank, after the broadcast (secure aggregation's round set-up)
A stage that carries the update itself (`own_vector_transport`: secure aggregation's masked integers, in the
update's `encoded`) is summed by its own transport (fedmpi.round.protocols.SecureReduce).
What a stage tells the others is in the values it returns, never in attributes set on it or on a shared
record: the update's weight (DP's and secure aggregation's uniform 1), its bytes on the wire, its scalar
contributions to the stage's own sums in the reduction (`up_scalars` of them, in the returned update's
`scalars[name]`) and its per-client figures. The `StageView` hands each stage its own slots: the header
values as every rank received them (float32 values), and on rank 0 its reduced scalar sums.

The order of the stages is their own declaration (`order`, lower first: an attack crafts the update, then
compression, privacy or secure aggregation, the norm bound, and the wire's rounding last: what leaves).
Where the slots of every stage lie is a `Layout` value made once from the ordered stages; nothing writes
offsets onto a stage. Stages apply to the uploads of REDUCE algorithms (and the chunked robust gather).
With no stage configured (the default) the path is exactly the algorithm's own.

The vector of an update is a view of the rank's one flat model, holding the trained model as uploaded
(start + the update). A stage writes its transform into that view, as the memory rules ask (no copy of a
model per client), and returns the update with its other fields replaced: the vector has one owner, the
update, until the transport sums it. What a stage keeps across rounds (a compression residual, the
adaptive clip's estimator, the privacy accountant) and saves in checkpoints is fedmpi.uploads.persist's.

The upload path of a run (`UploadPath`) holds its stages in their declared order with the `Layout` of their
slots, and is what the round calls. What a round learns from the broadcast (each stage's header values)
comes back as a value, `RoundStages`, which the round hands to the stages' client and server hooks: nothing
is kept on the path between those calls.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from fedmpi.uploads.persist import StageState

ORDER_ATTACK, ORDER_COMPRESS, ORDER_PRIVACY, ORDER_SECAGG, ORDER_BOUND, ORDER_WIRE = 10, 20, 30, 40, 50, 90


@dataclass(frozen=True)
class ClientUpdate:
    """One counted client's upload (a value). `vector`: the trained model as uploaded, a view of the rank's
    flat model; `start`: the round's start point it trained from (the broadcast's first `dim` entries)."""

    cid: int
    round: int
    vector: object                  # torch.Tensor, dim entries (see the module docstring on ownership)
    start: object                   # torch.Tensor, dim entries, read-only
    weight: float                   # its weight in the average (n_i, or 1 under uniform weights)
    bytes: int | None = None        # what it costs on the wire (None: the dense default)
    encoded: object = None          # the payload where it is not the float vector (secure aggregation's)
    scalars: dict = field(default_factory=dict)     # stage name -> its `up_scalars` contributions
    figures: dict = field(default_factory=dict)     # per-client figures for /clients (e.g. robust_weight)
    run: object = None              # the algorithm's record of the client's training (its hooks take it)

    def delta(self):
        """The update itself, vector - start (a new tensor)."""
        return self.vector - self.start

    def replace(self, **changes) -> ClientUpdate:
        return dataclasses.replace(self, **changes)

    def adding(self, *, scalars=None, figures=None, **changes) -> ClientUpdate:
        """A copy with `changes`, and a stage's scalars ({name: values}) and figures added to the update's."""
        if scalars:
            changes["scalars"] = {**self.scalars, **scalars}
        if figures:
            changes["figures"] = {**self.figures, **figures}
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class StageView:
    """A stage's slots of the round: its header values (as received, float64 copies of float32 values), and on
    rank 0 after the combination its reduced scalar sums (a view of the reduction buffer); the round's plan."""

    plan: object
    header: tuple = ()
    scalars: object = None


@dataclass(frozen=True)
class StageSetting:
    """What the build of a stage knows beside its config sections: the algorithm (its declarations:
    up_vectors, protocol, dim), the flat model's length, the run's malicious clients and whether this rank
    is the server (rank 0 resolves what only it needs, e.g. the accountant's epsilon curve)."""

    algo: object
    dim: int
    malicious: tuple = ()
    on_server: bool = False


class UploadStage(StageState):
    """A stage class declares `name`, `order`, `reads` (the config's sections, and top-level values such as
    `seed`, that `build` takes by name; nothing else of the config reaches it) and `build`."""

    name = ""
    reads: tuple = ()
    order = 50                    # its place on the upload path, lower first (module docstring)
    keeps_client_state = False    # per-client state (e.g. a compression residual): clients train on their host
    # The model update reaches the server in the update's `encoded` payload, summed by the stage's own transport
    # (secure aggregation's integer sum): the float reduction leaves out the algorithm's first upload vector.
    own_vector_transport = False
    header_size = 0     # broadcast header floats (module docstring)
    up_scalars = 0      # float64 sums in the reduction
    columns: tuple = ()     # the per-client figures its updates carry (/clients/<name>)
    # A plug-in's declarations (fedmpi.uploads.catalog): the uploads.keys it reads, and whether it may run
    # under differential privacy and secure aggregation.
    uses: tuple = ()
    works_with_dp = False
    works_with_secure_aggregation = False

    @classmethod
    def build(cls, setting: StageSetting, **sections) -> UploadStage | None:
        """The stage the config's `sections` (those `reads` names) ask for, or None where they leave it off."""
        return None

    def header(self, t) -> list:
        """Rank 0, at round t's broadcast: `header_size` floats for every rank."""
        return []

    def begin(self, plan, view: StageView):
        """Every rank, after the round's broadcast: the round's plan and the header values rank 0 sent."""

    def client(self, update: ClientUpdate, view: StageView) -> ClientUpdate:
        """Worker, per counted client: the update as this stage passes it on."""
        return update

    def server(self, sums, weight, view: StageView) -> tuple:
        """Rank 0, after the combination: (sums, total weight to divide by, /metrics figures of the round)."""
        return sums, weight, {}


@dataclass(frozen=True)
class Slots:
    header: slice
    scalars: slice


@dataclass(frozen=True)
class Layout:
    """Where each stage's slots lie (in the stages' order): its header floats among all stages' and its sums
    in the reduced upload vector, after the algorithm's `algo_up_len` sums."""

    slots: tuple
    header_len: int
    up_extra: int

    @classmethod
    def of(cls, stages, algo_up_len) -> Layout:
        slots, header, up = [], 0, 0
        for stage in stages:
            slots.append(Slots(slice(header, header + stage.header_size),
                               slice(algo_up_len + up, algo_up_len + up + stage.up_scalars)))
            header += stage.header_size
            up += stage.up_scalars
        return cls(tuple(slots), header, up)

    def views(self, plan, header_values=(), sums=None) -> tuple:
        """Each stage's StageView of the round (`sums`: rank 0's reduced sums, after the combination)."""
        return tuple(StageView(plan, tuple(header_values[s.header]) if self.header_len else (),
                               None if sums is None else sums[s.scalars]) for s in self.slots)


def ordered(stages) -> list:
    """The stages in their declared order (ties keep the order given)."""
    return sorted(stages, key=lambda stage: stage.order)


# -- the upload path: a run's stages in order, called at the round's fixed points ------------------------

@dataclass(frozen=True)
class RoundStages:
    """The round's views of every stage (in the path's order), made after the broadcast."""

    plan: object
    header: tuple = ()      # every stage's header values, as received
    views: tuple = ()       # each stage's StageView of the round (its header slots)


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
        header = tuple(header_values)
        round_ = RoundStages(plan, header, self.layout.views(plan, header))
        for stage, view in zip(self.stages, round_.views):
            stage.begin(plan, view)
        return round_

    def client(self, update: ClientUpdate, round_: RoundStages) -> ClientUpdate:
        """Worker: a counted client's update through every stage."""
        for stage, view in zip(self.stages, round_.views):
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
