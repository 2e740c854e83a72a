"""One round, on every rank, as one function over explicit parts: `run_round(parts, t, ...) -> RoundOutcome`.

A round happens in this order, and `run_round` is the only place that says so:
  plan       round t's RoundPlan (who trains, whose update counts), the same on every rank
  broadcast  the server's payload (header only unless the protocol needs the model); a stop ends every rank here
  training   this rank's clients, one per-client loop for every protocol (batched groups where vectorizable)
  uploads    the upload stages' per-client transform and sums, inside the protocol's handling of a trained client
  combine    reduction / gather / routing / release of held updates, as the protocol says
  server     the server step (unless the protocol skips it this round)
  evaluate   when due, every rank evaluates its share of the test set; local evaluation on the clients' hosts
  record     the server's row of /metrics, /clients and /timing, and what of it is non-finite

How uploads travel is the algorithm's `protocol` declaration; each family is a value in fedmpi.round.protocols
(REDUCE, GATHER, ROUTE, BUFFER) that supplies only what differs: which clients this rank trains and from
what start, what happens to a trained client, and how the uploads are combined; the helpers they share
(`from_broadcast`, `upload_client`, `reduce`, `Training`, `Closing`) are here.

What a protocol keeps from round to round (ROUTE's period start and previous plan, REDUCE's drift scratch)
is in `parts.state`, made by the family. Control goes in as arguments (`stopping`, `after_broadcast`) and
comes out in the RoundOutcome (the record, the stop votes, the non-finite finding): nothing on the parts
is set from outside to steer a round.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from fedmpi.algorithms.base import Algorithm
from fedmpi.algorithms.state import ClientStateStore
from fedmpi.core.flat import FlatModel
from fedmpi.core.timing import Timer
from fedmpi.mpi import signals
from fedmpi.mpi.base import Comm
from fedmpi.plans.base import Participation
from fedmpi.round.clients import ClientHost
from fedmpi.round.drift import ClientDrift
from fedmpi.round.evaluation import SplitEvaluation
from fedmpi.round.local_eval import LocalEvaluation
from fedmpi.round.server import Server
from fedmpi.round.shadow import Shadow
from fedmpi.round.wire import CMD_RUN, CMD_STOP, HEADER, RoundBuffers


@dataclass(frozen=True)
class RoundParts:
    """What a round works with on one rank, assembled once by `Experiment`. `server` and `shadow` are None
    off rank 0 (the shadow also without eval.divergence); `state` is the protocol's own state across rounds."""

    algo: Algorithm
    clients: ClientHost
    wire: RoundBuffers
    server: Server | None       # rank 0 only
    participation: Participation
    stages: tuple               # the upload stages (fedmpi.uploads.base.UploadStage), in upload order
    evaluation: SplitEvaluation
    shadow: Shadow | None       # rank 0 with eval.divergence only
    client_store: ClientStateStore
    comm: Comm                  # MpiComm or LocalComm
    timer: Timer                # the communicator's
    flat: FlatModel
    test_set: Callable          # () -> (x_test, y_test) on the device, for the shadow's accuracy
    protocol: Family             # fedmpi.round.protocols: how uploads travel: REDUCE, GATHER, ROUTE or BUFFER
    state: object               # what `protocol.new_state` made
    rounds: int                 # cfg.rounds
    eval_every: int             # cfg.eval.every
    eval_batch: int             # cfg.eval.batch_size
    client_drift: bool          # cfg.eval.client_drift
    local_eval: LocalEvaluation | None = None   # eval.local_every: clients on their own test splits (or None)
    backdoor: SplitEvaluation | None = None     # attack.name = backdoor: the triggered test set (backdoor_acc)

    @property
    def num_clients(self):
        return len(self.clients.parts)

    def eval_due(self, t):
        return (t + 1) % self.eval_every == 0 or t + 1 == self.rounds


@dataclass
class RoundRecord:
    """What the server logs for a round: /metrics (name -> value, or a row for [round, k] figures),
    /clients (name -> [num_clients] row) and /timing ([rank, phase] seconds)."""

    metrics: dict
    clients: dict
    timing: np.ndarray
    model: torch.Tensor = None      # the global model after the round; its fingerprint is taken when logged


@dataclass(frozen=True)
class RoundOutcome:
    """What a round tells the run loop. On the server: the record, how many ranks asked to stop (pass it as
    the next round's `stopping`) and what was non-finite ('' when all was finite); elsewhere None, 0, ''."""

    record: RoundRecord | None = None
    stop_votes: int = 0
    nonfinite: str = ""


@dataclass(frozen=True)
class Training:
    """Which clients this rank trains this round, in order, and from what start: `start(run)` loads a
    client's start point into the model; `down` is the broadcast payload (None where it is not the start)."""

    cids: list
    start: Callable | None = None
    down: torch.Tensor | None = None
    slots: dict = field(default_factory=dict)     # ROUTE: client id -> its model slot this round


@dataclass(frozen=True)
class Closing:
    """What the protocol's combination says about the rest of its round: whether the server steps, whether
    to evaluate (None: when due), the drift measurements for the clients' cosines (eval.client_drift) or None."""

    update: bool = True
    evaluate: bool | None = None
    drift: ClientDrift | None = None


class Family:
    """A protocol family (its values are in fedmpi.round.protocols): what differs between the ways uploads
    travel. Instances hold no state: what a family keeps across rounds lives in the object `new_state` makes
    (RoundParts.state)."""

    name = ""
    drift_figures = False    # the reduced sums are the clients' weighted updates (gradient diversity applies)
    # Dealt clients may go to whichever worker is free (ClientHost.round_clients): no rank needs to know who
    # trained which client, only each rank's sums.
    deals_as_free = False

    def new_state(self, num_clients, client_drift):
        return None

    def full_broadcast(self, parts, state, t):
        """Whether round t's broadcast carries the payload (else the header only)."""
        return True

    def training(self, parts, state, plan) -> Training:
        """This rank's clients of the round, from the broadcast (hosted clients, in plan order)."""
        if not parts.clients.mine:
            return Training([])
        down, start = from_broadcast(parts, plan.round)
        return Training(parts.clients.hosted(plan.selected), start, down)

    def trained(self, parts, plan, run, training, tally):
        """A client has trained (its model in `parts.clients.flat`): its upload, gate, hold or slot."""

    def combine(self, parts, state, plan, tally, kept) -> Closing:
        """After training: the uploads to the server."""
        reduce(parts, tally)
        return Closing()

    def figures(self, state) -> tuple:
        """Server: the family's own figures of the round just combined, ({metric: value}, {name: [N] row})
        (e.g. the chunked gather's robust weights); none by default."""
        return {}, {}

    def __repr__(self):
        return f"<protocol {self.name}>"


def run_round(parts: RoundParts, t: int, *, stopping: int = 0, after_broadcast: Callable | None = None
              ) -> RoundOutcome:
    """Round t on this rank. `stopping` (server): the ranks that asked to stop in the previous round (its
    outcome's `stop_votes`; True counts as one): non-zero broadcasts CMD_STOP and every rank raises
    StopRequested instead of running round t. `after_broadcast` (server): called right after the broadcast,
    while the workers train (the run loop's deferred log row)."""
    parts.comm.enter_round(t)
    _inject_fault(parts.comm.rank, t)
    protocol, state = parts.protocol, parts.state
    plan = parts.participation.plan(t)      # who trains, whose update counts: the same on every rank
    _broadcast(parts, plan, protocol.full_broadcast(parts, state, t), stopping, after_broadcast)
    for stage in parts.stages:
        stage.round_plan(plan)
    tally = parts.wire.new_tally()
    training = protocol.training(parts, state, plan)        # this rank's clients and their start
    kept = train_clients(parts, plan, training, tally, protocol.trained)    # local training, then uploads
    for stage in parts.stages:          # a stage's own collective (secure aggregation's integer sum)
        stage.collective(parts.comm, plan, tally.acc)
    closing = protocol.combine(parts, state, plan, tally, kept)     # reduction / gather / routing
    parts.participation.done(plan)          # the provider hears of the round (e.g. advances its clock)
    parts.client_store.end_round()          # the round's client vectors back to host memory (or the spill file)
    stats, sums = _server_step(parts, plan, closing.update)
    evaluated, local = _evaluate(parts, plan, closing.evaluate)
    cosines = closing.drift.cosines(parts, sums, stats) if closing.drift is not None else None
    return _outcome(parts, plan, stats, sums, evaluated, cosines, local)


# -- the steps ---------------------------------------------------------------------------------------------

def _broadcast(parts, plan, full, stopping, after_broadcast):
    """The round's broadcast (header only unless `full`); every rank leaves here on a stop. Rank 0 then
    writes the deferred row and trains the divergence shadow while the workers train their clients."""
    t, wire, server = plan.round, parts.wire, parts.server
    signals.test_pause("broadcast")     # (the first round's: a test's Ctrl-C at the end of set-up)
    command = CMD_STOP if stopping else CMD_RUN
    wire.start_round(plan.selected)
    parts.clients.open_deal()       # before the broadcast: no ticket of this round is taken before it
    fill = server.fill_down if server else None
    extra = _header_extra(parts.stages) if server and wire.header_len > HEADER else ()
    received, round_ = wire.broadcast(t, command, fill, full, extra)
    if received == CMD_RUN and round_ != t:
        raise RuntimeError(f"rank {parts.comm.rank} expected round {t}, server broadcast round {round_}: "
                           f"ranks out of step")
    if received == CMD_STOP:
        raise signals.stop_error(round_, int(stopping) or None)
    if server and after_broadcast is not None:
        with parts.timer.phase("server"):
            after_broadcast()
    if wire.header_len > HEADER:
        values = wire.header_values()
        for stage in parts.stages:
            stage.receive(values[stage.header_offset: stage.header_offset + stage.header_size])
    if parts.shadow is not None:
        with parts.timer.phase("train"):
            parts.shadow.train_round(t, plan.selected)


def _header_extra(stages):
    """Server: the upload stages' header values for the round's broadcast."""
    return [float(v) for stage in stages for v in stage.header()]


def train_clients(parts, plan, training, tally, trained):
    """The one per-client loop of every protocol: trains `training.cids` (batched groups first where
    `client.vectorize` allows), hands each trained client to `trained(parts, plan, run, training, tally)`
    (the protocol's part: accumulate, gate, hold, keep the slot) and adds its loss and figures to the tally;
    returns what `trained` returned, per client."""
    kept = []
    if not training.cids:
        return kept
    with parts.timer.phase("train"):
        for run in parts.clients.train(plan.round, training.cids, plan.standard, training.down, training.start):
            kept.append(trained(parts, plan, run, training, tally))
            tally.record(run)
    return kept


def from_broadcast(parts, t):
    """(the round's broadcast payload on this rank, the client start that loads it: `algo.client_start`);
    the algorithm's `round_start` hook sees the payload first."""
    algo, flat = parts.algo, parts.clients.flat
    down = parts.wire.down()
    if algo.round_start is not None:
        algo.round_start(t, down)

    def start(run):
        algo.client_start(run, down, flat)
        algo.load_personal(run.cid, flat)       # personal entries: the client's own (no-op without a split)

    return down, start


def upload_client(algo, stages, run, down, model, acc):
    """A counted client's upload into the accumulator `acc`: the upload stages' transform of the trained
    model (e.g. clipping and compression), the algorithm's `accumulate`, then the stages' per-client sums;
    returns the upload's weight."""
    for stage in stages:
        stage.client(run, down, model)
    weight = algo.accumulate(run, down, model, acc)
    for stage in stages:
        for i, value in enumerate(stage.scalars(run)):
            acc[stage.up_offset + i] += value
    return weight


def reduce(parts, tally, sums=True):
    """The round's one reduction to rank 0 (`sums=False`: statistics and per-client figures only), with
    this rank's stop request. Where an upload stage carries the model update itself (secure aggregation),
    the reduction leaves the model vector out: no float model vector travels."""
    own = sums and any(stage.own_vector_transport for stage in parts.stages)
    parts.wire.reduce(tally, signals.requested(), sums, skip=parts.wire.dim if own else 0)


def _server_step(parts, plan, update):
    """Server: the reduced statistics and sums, and (where `update`) the upload stages' and the server's
    step from them; (None, None) elsewhere."""
    server = parts.server
    if not server:
        return None, None
    with parts.timer.phase("server"):
        stats = parts.wire.stats()
        sums, weight = parts.wire.sums(), stats.weight
        if update:
            for stage in parts.stages:
                weight = stage.server(plan.round, sums, weight)
            server.apply(plan.round, sums, weight)
    return stats, sums


def _evaluate(parts, plan, evaluate):
    """Collective when due (`evaluate`, None: every eval.every rounds and the last): every rank evaluates its
    share of the test set on the global model; then, when eval.local_every says so (and `evaluate` is not
    False), the local evaluation of its hosted clients. (global figures, local (figures, columns)) on the
    server, each None elsewhere or when not due."""
    due = parts.eval_due(plan.round) if evaluate is None else evaluate
    local = parts.local_eval is not None and evaluate is not False and parts.local_eval.due(plan.round)
    if not (due or local):
        return None, None
    server = parts.server
    with parts.timer.phase("eval"):
        x = parts.wire.share(server.x if server else None)
        evaluated = parts.evaluation.run(x) if due else None
        if due and parts.backdoor is not None:
            # The attack success rate: the share of triggered non-target test samples classified as the target.
            backdoor = parts.backdoor.run(x)
            if evaluated is not None and backdoor is not None:
                evaluated = (*evaluated, backdoor[0])
        return evaluated, (parts.local_eval.run(plan, x) if local else None)


def _outcome(parts, plan, stats, sums, evaluated, cosines, local=None):
    """The server's RoundOutcome: the round's record, the stop votes and what is non-finite."""
    server, timer = parts.server, parts.timer
    if not server:
        return RoundOutcome()
    with timer.phase("server"):
        record = _record(parts, plan, stats, sums, evaluated, cosines, local)
    record.timing[0] += timer.take()     # the server's own time after the reduction
    return RoundOutcome(record, stats.stop_votes, nonfinite(record.metrics, stats, server.x))


def _record(parts, plan, stats, sums, evaluated, cosines, local=None):
    """The round's row of /metrics, /clients and /timing."""
    t, server, shadow = plan.round, parts.server, parts.shadow
    metrics, clients = server.figures(t, plan.selected, stats, parts.wire.client_figures(), parts.num_clients)
    if stats.weight > 0 and parts.protocol.drift_figures:
        head = sums[: parts.flat.dim]
        metrics["update_sq_norm"] = stats.update_sq / stats.weight
        metrics["aggregate_sq_norm"] = float(torch.dot(head, head)) / stats.weight ** 2
        metrics["gradient_diversity"] = metrics["update_sq_norm"] / max(metrics["aggregate_sq_norm"], 1e-300)
    if evaluated is not None:
        metrics["test_acc"], metrics["test_loss"], metrics["class_acc"] = evaluated[:3]
        if len(evaluated) > 3:
            metrics["backdoor_acc"] = evaluated[3]
    if cosines is not None:
        clients["update_cosine"][plan.selected] = cosines[plan.selected]
    if local is not None:
        metrics.update(local[0])
        clients.update(local[1])
    if shadow is not None:
        metrics["weight_divergence"], metrics["weight_divergence_layers"] = shadow.divergence(server.x)
        if evaluated is not None:
            metrics["shadow_acc"] = shadow.accuracy(*parts.test_set(), parts.eval_batch)
    extra_metrics, extra_clients = parts.protocol.figures(parts.state)
    metrics.update(extra_metrics)
    clients.update(extra_clients)
    metrics.update(parts.algo.round_metrics())
    metrics.update(plan.metrics)
    for stage in parts.stages:
        metrics.update(stage.round_metrics(t))
    clients.update(plan.columns)
    return RoundRecord(metrics, clients, parts.wire.timing(), server.x)


def nonfinite(metrics, stats, x):
    """What of the round's outcome is non-finite: the training loss (where clients trained), the test loss
    (where evaluated), the global model; '' when all are finite."""
    found = []
    if stats.seen and not math.isfinite(metrics["train_loss"]):
        found.append(f"train_loss {metrics['train_loss']}")
    if "test_loss" in metrics and not math.isfinite(metrics["test_loss"]):
        found.append(f"test_loss {metrics['test_loss']}")
    # A sum is finite only where every entry is, so a finite float32 sum settles it in one vectorised pass
    # (~0.3 ms for W1's 1.66 M entries, on the path between the reduction and the next broadcast, where every
    # worker waits). A non-finite one may also be finite entries overflowing: the float64 sum of float32
    # values cannot overflow, so it decides (~10-20 ms: torch's cast-and-sum kernel is not vectorised).
    if not math.isfinite(float(x.sum())) and not math.isfinite(float(x.sum(dtype=torch.float64))):
        found.append(f"{int((~torch.isfinite(x)).sum())} non-finite entries in the global model")
    return ", ".join(found)


# -- test aids ---------------------------------------------------------------------------------------------

def _inject_fault(rank, t):
    """Test aid: FEDMPI_INJECT_FAULT="RANK:ROUND" raises on that rank at the start of that round, so the
    failure path (one rank fails, the whole job ends, run.h5 says failed) can be exercised for real;
    "RANK:ROUND:memory" raises a MemoryError instead (a rank out of memory)."""
    spec = os.environ.get("FEDMPI_INJECT_FAULT")
    if spec and spec.startswith(f"{rank}:{t}") and spec[len(f"{rank}:{t}"):] in ("", ":memory"):
        if spec.endswith(":memory"):
            raise MemoryError(f"injected: unable to allocate (FEDMPI_INJECT_FAULT={spec})")
        raise RuntimeError(f"injected fault (FEDMPI_INJECT_FAULT={spec})")
    # Test aid: FEDMPI_ROUND_DELAY_S=SECONDS sleeps at the start of every round, so that a test can signal
    # or kill a rank mid-run without heavy training; results do not change (wall_s aside).
    delay = os.environ.get("FEDMPI_ROUND_DELAY_S")
    if delay:
        time.sleep(float(delay))
