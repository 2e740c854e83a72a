"""One round, on every rank, as one function over explicit parts: `run_round(parts, t, ...) -> RoundOutcome`.

A round happens in this order, and `run_round` is the only place that says so:
  plan       round t's RoundPlan (who trains, whose update counts), the same on every rank
  broadcast  the server's payload (header only unless the transport needs the model); a stop ends every rank here
  training   this rank's clients, one per-client loop for every transport (batched groups where vectorizable),
             each trained client handed on as a ClientUpdate value as it finishes
  local      the transport's part of this rank: the upload stages' transform and the algorithm's upload of
             each counted client, or its gate, hold or slot
  combine    the transport's collectives: reduction / gather / routing / release of held updates
  server     the upload stages' server step and the server's update (unless the transport skips it this round)
  evaluate   when due, every rank evaluates its share of the test set; local evaluation on the clients' hosts
  record     the server's row of /metrics, /clients and /timing, and what of it is non-finite

How uploads travel is the algorithm's `protocol` declaration; each family is a transport
(fedmpi.round.protocols: REDUCE, GATHER and BUFFER there, ROUTE in fedmpi.round.route, the chunked robust
gather in fedmpi.round.robust_gather) that exchanges values with the round: `local(round_, updates)` ->
LocalPart and `combine(comm, round_, local)` -> Combined. Control goes in as arguments (`stopping`,
`after_broadcast`) and comes out in the RoundOutcome (the record, the stop votes, the non-finite finding):
nothing on the parts is set from outside to steer a round.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from fedmpi.algorithms.base import Algorithm
from fedmpi.algorithms.state import ClientStateStore
from fedmpi.core.flat import FlatModel
from fedmpi.core.perplexity import perplexity_figures
from fedmpi.core.timing import Timer
from fedmpi.mpi import signals
from fedmpi.mpi.base import Comm
from fedmpi.plans.base import Participation
from fedmpi.round.clients import ClientHost
from fedmpi.round.evaluation import SplitEvaluation
from fedmpi.round.local_eval import LocalEvaluation
from fedmpi.round.observers import Observed
from fedmpi.round.protocols import RoundInput, Transport
from fedmpi.round.server import Server
from fedmpi.round.wire import CMD_RUN, CMD_STOP, HEADER, RoundBuffers
from fedmpi.uploads.base import ClientUpdate, UploadPath


@dataclass(frozen=True)
class RoundParts:
    """What a round works with on one rank, assembled once by `Experiment`. `server` is None off rank 0;
    `observers` are the figures' observers this rank calls (fedmpi.round.observers)."""

    algo: Algorithm
    clients: ClientHost
    wire: RoundBuffers
    server: Server | None       # rank 0 only
    participation: Participation
    stages: UploadPath          # the upload stages (fedmpi.uploads.base.UploadStage), in their order
    evaluation: SplitEvaluation
    client_store: ClientStateStore
    comm: Comm                  # MpiComm or LocalComm
    timer: Timer                # the communicator's
    flat: FlatModel
    transport: Transport        # how uploads travel (fedmpi.round.protocols): REDUCE, GATHER, ROUTE, BUFFER...
    rounds: int                 # cfg.rounds
    eval_every: int             # cfg.eval.every
    local_eval: LocalEvaluation | None = None   # eval.local_every: clients on their own test splits (or None)
    observers: tuple = ()       # the figures' observers (fedmpi.round.observers), in the order they report
    perplexity: bool = False    # a next-token task: the row gains exp of its cross-entropies (fedmpi.core.perplexity)

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


def run_round(parts: RoundParts, t: int, *, stopping: int = 0, after_broadcast: Callable | None = None
              ) -> RoundOutcome:
    """Round t on this rank. `stopping` (server): the ranks that asked to stop in the previous round (its
    outcome's `stop_votes`; True counts as one): non-zero broadcasts CMD_STOP and every rank raises
    StopRequested instead of running round t. `after_broadcast` (server): called right after the broadcast,
    while the workers train (the run loop's deferred log row)."""
    parts.comm.enter_round(t)
    _inject_fault(parts.comm.rank, t)
    transport = parts.transport
    plan = parts.participation.plan(t)      # who trains, whose update counts: the same on every rank
    header = _broadcast(parts, plan, transport.full_broadcast(t), stopping, after_broadcast)
    round_ = RoundInput(plan, transport.training(plan), parts.stages.begin(plan, header))
    local = transport.local(round_, client_updates(parts, round_))     # local training, then this rank's part
    combined = transport.combine(parts.comm, round_, local)     # reduction / gather / routing
    parts.participation.done(plan)          # the provider hears of the round (e.g. advances its clock)
    parts.client_store.end_round()          # the round's client vectors back to host memory (or the spill file)
    stage_metrics = _server_step(parts, round_, combined)
    due, evaluated, local_figures, x = _evaluate(parts, plan, combined.evaluate)
    observed = Observed(plan, due, combined.sums, combined.weight, combined.stats)
    figures = _observe(parts, t, parts.server.x if parts.server else x, observed)   # every rank: collectives
    return _outcome(parts, plan, combined, evaluated, figures, local_figures, stage_metrics)


# -- the steps ---------------------------------------------------------------------------------------------

def _broadcast(parts, plan, full, stopping, after_broadcast):
    """The round's broadcast (header only unless `full`); every rank leaves here on a stop. Rank 0 then
    writes the deferred row, and the observers start the round (while the workers train their clients)."""
    t, wire, server = plan.round, parts.wire, parts.server
    signals.test_pause("broadcast")     # (the first round's: a test's Ctrl-C at the end of set-up)
    command = CMD_STOP if stopping else CMD_RUN
    wire.start_round(plan.selected)
    parts.clients.open_deal()       # before the broadcast: no ticket of this round is taken before it
    fill = server.fill_down if server else None
    extra = parts.stages.header(t) if server and wire.header_len > HEADER else ()
    received, round_ = wire.broadcast(t, command, fill, full, extra)
    if received == CMD_RUN and round_ != t:
        raise RuntimeError(f"rank {parts.comm.rank} expected round {t}, server broadcast round {round_}: "
                           f"ranks out of step")
    if received == CMD_STOP:
        raise signals.stop_error(round_, int(stopping) or None)
    if server and after_broadcast is not None:
        with parts.timer.phase("server"):
            after_broadcast()
    if parts.observers:
        with parts.timer.phase("train"):
            for observer in parts.observers:
                observer.round_start(t, plan)
    return wire.header_values() if wire.header_len > HEADER else ()


def client_updates(parts, round_):
    """The one per-client loop of every transport: trains `round_.training.cids` (batched groups first where
    `client.vectorize` allows) and yields each trained client as a ClientUpdate (its vector a view of the
    rank's flat model, valid until the next one is asked for: the transport consumes it as it comes)."""
    plan, training, flat = round_.plan, round_.training, parts.clients.flat
    if not training.cids:
        return
    start = training.down[: flat.dim] if training.down is not None else None
    with parts.timer.phase("train"):
        for run in parts.clients.train(plan.round, training.cids, plan.standard, training.down, training.start):
            yield ClientUpdate(run.cid, run.round, flat.vec, start, run.weight, run=run)


def _server_step(parts, round_, combined):
    """Server, where the transport says the server steps: the upload stages' server step from the combined
    sums and weight, then the server's update; the stages' figures ({} elsewhere)."""
    server = parts.server
    if not (server and combined.update):
        return {}
    with parts.timer.phase("server"):
        sums, weight, metrics = parts.stages.server(combined.sums, combined.weight, round_.stages)
        server.apply(round_.plan.round, sums, weight)
    return metrics


def _evaluate(parts, plan, evaluate):
    """Collective when due (`evaluate`, None: every eval.every rounds and the last): every rank evaluates its
    share of the test set on the global model; then, when eval.local_every says so (and `evaluate` is not
    False), the local evaluation of its hosted clients. (whether the global model was evaluated, global
    figures, local (figures, columns), the global model): the figures on the server, None elsewhere or when
    not due; the model where anything was evaluated (a view of the broadcast buffer off rank 0), else None."""
    due = bool(parts.eval_due(plan.round) if evaluate is None else evaluate)
    local = parts.local_eval is not None and evaluate is not False and parts.local_eval.due(plan.round)
    server = parts.server
    if not (due or local):
        return False, None, None, None
    with parts.timer.phase("eval"):
        x = parts.wire.share(server.x if server else None)
        evaluated = parts.evaluation.run(x) if due else None
        return due, evaluated, (parts.local_eval.run(plan, x) if local else None), x


def _observe(parts, t, x, observed):
    """Every rank: the observers' figures of the round (rank 0's row), each in its turn."""
    metrics, columns = {}, {}
    if parts.observers:
        with parts.timer.phase("eval"):
            for observer in parts.observers:
                more, rows = observer.round_figures(t, x, observed)
                metrics.update(more)
                columns.update(rows)
    return metrics, columns


def _outcome(parts, plan, combined, evaluated, observed, local, stage_metrics):
    """The server's RoundOutcome: the round's record, the stop votes and what is non-finite."""
    server, timer = parts.server, parts.timer
    if not server:
        return RoundOutcome()
    with timer.phase("server"):
        record = _record(parts, plan, combined, evaluated, observed, local, stage_metrics)
    record.timing[0] += timer.take()     # the server's own time after the reduction
    stats = combined.stats
    return RoundOutcome(record, stats.stop_votes, nonfinite(record.metrics, stats, server.x))


def _record(parts, plan, combined, evaluated, observed, local, stage_metrics):
    """The round's row of /metrics, /clients and /timing."""
    t, server, stats = plan.round, parts.server, combined.stats
    metrics, clients = server.figures(t, plan.selected, stats, parts.wire.client_figures(), parts.num_clients)
    if evaluated is not None:
        metrics["test_acc"], metrics["test_loss"], metrics["class_acc"] = evaluated
    metrics.update(observed[0])
    clients.update(observed[1])
    if local is not None:
        metrics.update(local[0])
        clients.update(local[1])
    metrics.update(combined.metrics)
    metrics["bytes_down"] += combined.down_bytes        # e.g. secure aggregation's keys and shares received
    clients.update(combined.columns)
    metrics.update(parts.algo.round_metrics())
    metrics.update(plan.metrics)
    metrics.update(stage_metrics)
    clients.update(plan.columns)
    if parts.perplexity:
        metrics.update(perplexity_figures(metrics))
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
