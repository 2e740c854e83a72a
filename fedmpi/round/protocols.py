"""Transports: how one round's uploads travel from the clients' ranks to the server, as values in and out, and
the protocol families that are transports (the `protocol` an algorithm's family declares).

A transport is built once per run with the collaborators it works with (the algorithm, the rank's client
host and flat model, the round's buffers, the upload path), and each round:

  training(plan) -> Training                      which clients this rank trains, from what start
  local(round_, updates) -> LocalPart             this rank's part, from the stream of its trained clients'
                                                  `ClientUpdate`s, consumed as each client finishes
  combine(comm, round_, local) -> Combined        the collective(s) that bring the parts to rank 0: its
                                                  sums, their total weight, the transport's figures

`round_` is a `RoundInput`: the round's plan, the Training and the upload stages' views. No transport reads
another part of the round or writes into the server's buffers behind a call: what it gives the server is
the Combined it returns. The algorithm's own hooks (`accumulate`, `gate`, `hold`/`release`, the slots)
stay the algorithm's contract; a transport calls them. What a transport keeps across rounds (ROUTE's
period start and previous plan) is its own.

The families:
- REDUCE (FedAvg and most algorithms): the selected clients' weighted uploads into one accumulator, one
  Reduce to the server. Under secure aggregation (`SecureReduce`) the update travels as masked integers
  summed modulo 2^b, and the float Reduce carries only the statistics.
- GATHER (SAFL with upload gating): clients decide after training whether to upload; the server first
  gathers the mask of who uploads, then only the uploaders' vectors (`masked_gather`, Gatherv).
- ROUTE (FedSkip, fedmpi.round.route): model slots persist between aggregations; inside a period they move
  between the ranks hosting consecutive clients with point-to-point transfers, and only the round's
  statistics are reduced; at aggregation rounds the slots are reduced like FedAvg's uploads.
- BUFFER (FedBuff): clients train in the round of the model version they start from and hold their
  updates until the round of their simulated arrival; the arrivals are reduced like FedAvg's uploads.
- the chunked robust gather (fedmpi.round.robust_gather): every counted update to rank 0 chunk by chunk.

A client whose update does not count this round (the plan says so: dropped out, past the deadline) leaves
its state as it was: REDUCE skips its accumulate, GATHER its gate (its figures are NaN), ROUTE keeps the
slot's parameters from before the round and its weight does not grow, BUFFER never holds its update.
The order of a round's steps is fedmpi.round.engine.run_round's; a transport is called at its fixed points.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from fedmpi.algorithms import base
from fedmpi.mpi import signals
from fedmpi.uploads.precision import round_to


@dataclass(frozen=True)
class Training:
    """Which clients this rank trains this round, in order, and from what start: `start(run)` loads a
    client's start point into the model; `down` is the broadcast payload (None where it is not the start)."""

    cids: list
    start: Callable | None = None
    down: torch.Tensor | None = None
    slots: dict = field(default_factory=dict)     # ROUTE: client id -> its model slot this round


@dataclass(frozen=True)
class RoundInput:
    """What a transport knows of the round: the plan (the same on every rank), this rank's Training and the
    upload stages' views (fedmpi.uploads.base.RoundStages)."""

    plan: object
    training: Training
    stages: object = None


@dataclass
class LocalPart:
    """One rank's part of a round: `tally`, its running totals and per-client figures (fedmpi.round.wire), whose
    accumulator holds its weighted sums; `kept`, what the family keeps per client for its combination (GATHER's
    vectors, the gather's rows); `total`, secure aggregation's masked integer sum."""

    tally: object
    kept: list = field(default_factory=list)
    total: object = None


@dataclass(frozen=True)
class Combined:
    """What the combination gives the round: on rank 0 the sums the server steps from (`sums`, `weight`), the
    reduced statistics, the transport's own figures ({metric: value}, {name: [N] row}); everywhere whether
    the server steps (`update`), whether to evaluate (None: when due) and the drift measurements (REDUCE with
    eval.client_drift); `down_bytes`: what the round's clients received beyond the broadcast model (secure
    aggregation's keys and shares), added to /metrics/bytes_down."""

    sums: torch.Tensor | None = None
    weight: float = 0.0
    stats: object = None
    metrics: dict = field(default_factory=dict)
    columns: dict = field(default_factory=dict)
    update: bool = True
    evaluate: bool | None = None
    drift: object = None
    down_bytes: float = 0.0


class Transport:
    name = ""
    drift_figures = False    # the reduced sums are the clients' weighted updates (gradient diversity applies)
    # Dealt clients may go to whichever worker is free (ClientHost.round_clients): no rank needs to know who
    # trained which client, only each rank's sums.
    deals_as_free = False

    def __init__(self, algo, clients, wire, path):
        """`algo`: the algorithm; `clients`: the rank's ClientHost (placement, the flat model); `wire`: the
        round's RoundBuffers; `path`: the upload path (fedmpi.uploads.base.UploadPath)."""
        self.algo, self.clients, self.wire, self.path = algo, clients, wire, path
        self.flat = clients.flat
        self.staged = path is not None and len(path) > 0     # an upload stage is configured

    def full_broadcast(self, t) -> bool:
        """Whether round t's broadcast carries the payload (else the header only)."""
        return True

    def training(self, plan) -> Training:
        """This rank's clients of the round, from the broadcast (hosted clients, in plan order)."""
        if not self.clients.mine:
            return Training([])
        down, start = self.from_broadcast(plan.round)
        return Training(self.clients.hosted(plan.selected), start, down)

    def local(self, round_: RoundInput, updates) -> LocalPart:
        raise NotImplementedError

    def combine(self, comm, round_: RoundInput, local: LocalPart) -> Combined:
        raise NotImplementedError

    def __repr__(self):
        return f"<transport {self.name}>"

    # -- what the families share ---------------------------------------------------------------------
    def from_broadcast(self, t):
        """(the round's broadcast payload on this rank, the client start that loads it: `algo.client_start`);
        the algorithm's `round_start` hook sees the payload first."""
        algo, flat = self.algo, self.flat
        down = self.wire.down()
        if algo.round_start is not None:
            algo.round_start(t, down)

        def start(run):
            algo.client_start(run, down, flat)
            algo.load_personal(run.cid, flat)       # personal entries: the client's own (no-op without a split)

        return down, start

    def upload(self, update, round_: RoundInput, acc):
        """A counted client's upload into `acc`: the upload path's transform of `update`, the algorithm's
        `accumulate` of what it passed on, then the stages' scalars; (the upload's weight, the update)."""
        if self.staged:
            update = self.path.client(update, round_.stages)
        run = update.run if update.weight == update.run.weight else dataclasses.replace(update.run,
                                                                                          weight=update.weight)
        weight = self.algo.accumulate(run, round_.training.down, self.flat, acc)
        if self.staged:
            self.path.add_scalars(update, acc)
        return weight, update

    @staticmethod
    def record(tally, update):
        """A trained client's loss and per-client figures (its training's, then those the upload path added)."""
        tally.record(update.run)
        for name, value in update.figures.items():
            tally.columns[name][update.cid] = value

    def reduce(self, tally, sums=True, skip=0):
        """The round's one reduction to rank 0 (`sums=False`: statistics and per-client figures only, `skip`:
        leaves the first sums out), with this rank's stop request; on rank 0 (sums, stats)."""
        self.wire.reduce(tally, signals.requested(), sums, skip=skip)
        if not self.wire.comm.is_server:
            return None, None
        return self.wire.sums(), self.wire.stats()


class Reduce(Transport):
    name = base.REDUCE
    drift_figures = True
    deals_as_free = True        # runtime.client_dealing auto may deal the round's clients to whoever is free

    def __init__(self, algo, clients, wire, path, drift):
        """`drift`: the round's drift measurements (fedmpi.round.observers.ClientDrift)."""
        super().__init__(algo, clients, wire, path)
        self.drift = drift

    def training(self, plan):
        clients = self.clients
        if not clients.trains:
            return Training([])
        down, start = self.from_broadcast(plan.round)
        # Only each rank's sums leave it: which worker trains which client may follow who is free first.
        return Training(clients.round_clients(plan.selected, as_free=self.deals_as_free), start, down)

    def local(self, round_, updates):
        part = LocalPart(self.wire.new_tally(), total=self.new_total())
        tally, plan, down, flat = part.tally, round_.plan, round_.training.down, self.flat
        for update in updates:
            if plan.counts(update.cid):     # else dropped or too late: its update and its state are lost
                # Personal entries to the client's state; the upload then carries the broadcast's (no change) there.
                self.algo.keep_personal(update.cid, flat, down)
                weight, update = self.upload(update, round_, tally.acc)
                if part.total is not None:
                    self.take(update, part)
                self.drift.measure(update, weight, tally)
                tally.weight += weight
                tally.upload(update.bytes)
            self.record(tally, update)
        return part

    def new_total(self):
        return None

    def take(self, update, part):
        """A counted update's encoded payload into the rank's part (secure aggregation's; none here)."""

    def combine(self, comm, round_, local):
        sums, stats = self.reduce(local.tally)
        return Combined(sums, stats.weight if stats else 0.0, stats, drift=self._drift())

    def _drift(self):
        return self.drift if self.drift.keep else None


class SecureReduce(Reduce):
    """REDUCE under secure aggregation: each counted client's update leaves its rank only as the masked integer
    vector the secure-aggregation stage made of it (`ClientUpdate.encoded`); the rank sums them modulo 2^64
    (`LocalPart.total`), one integer reduction sums the ranks' modulo 2^b (`Comm.reduce_sum_mod`), and rank 0
    unmasks and decodes the total into the place of the model's sums. The float Reduce leaves the model vector
    out: it carries the statistics, the stages' scalars and the per-client figures only."""

    def __init__(self, algo, clients, wire, path, drift, secure):
        """`secure`: the secure-aggregation stage (fedmpi.secagg.stage.SecAggStage) of `path`."""
        super().__init__(algo, clients, wire, path, drift)
        self.secure = secure

    def new_total(self):
        return self.secure.zeros()

    def take(self, update, part):
        np.add(part.total, update.encoded, out=part.total)     # uint64: wraps modulo 2^64

    def combine(self, comm, round_, local):
        comm.reduce_sum_mod(local.total, self.secure.keys.bits)
        sums, stats = self.reduce(local.tally, skip=self.wire.dim)
        if sums is None:
            return Combined(drift=self._drift())
        weight, metrics = self.secure.decode(round_.plan, local.total, sums, stats.weight)
        # every client of the cohort (the selected) received its neighbours' keys and shares
        received = metrics.get("secagg_extra_down_bytes", 0.0) * len(round_.plan.selected)
        return Combined(sums, weight, stats, metrics, drift=self._drift(), down_bytes=received)


class Gather(Transport):
    name = base.GATHER

    def __init__(self, algo, clients, wire, path, participation, server=None):
        """`participation`: the provider, told who uploaded (`settle`); `server` (rank 0): the Server whose
        global model the fusion weighs against."""
        super().__init__(algo, clients, wire, path)
        self.participation, self.server = participation, server

    def local(self, round_, updates):
        """Keeps (whether the client uploads, its vector on the CPU or None) per trained client."""
        tally, kept = self.wire.new_tally(), []
        algo, flat, plan, down = self.algo, self.flat, round_.plan, round_.training.down
        for update in updates:
            # A client whose update does not count (dropped, too late) neither gates nor keeps its model.
            counts = plan.counts(update.cid)
            uploaded = counts and algo.gate(update.run, down, flat)
            if not counts:
                update.run.figures.update(dict.fromkeys(algo.client_columns, np.nan))
            vector = None
            if uploaded:
                vector = flat.vec.detach().to("cpu", torch.float32).numpy().copy()
                round_to(torch.from_numpy(vector), self.wire.wire_dtype)      # the model travels at the wire dtype
                tally.upload()
            kept.append((uploaded, vector))
            self.record(tally, update)
        return LocalPart(tally, kept)

    def combine(self, comm, round_, local):
        clients, plan = self.clients, round_.plan
        _, stats = self.reduce(local.tally, sums=False)    # statistics and figures: the vectors by masked_gather
        mask = np.array([uploaded for uploaded, _ in local.kept], dtype=np.int8)
        vectors = [vector for uploaded, vector in local.kept if uploaded]
        by_rank = {r: [int(c) for c in plan.selected if clients.host[c] == r] for r in clients.workers}
        gathered = comm.masked_gather(mask, vectors, by_rank, self.flat.dim)
        self.participation.settle(plan, comm, gathered)     # e.g. gated-out clients finish earlier
        if not comm.is_server:
            return Combined()
        sums, weight = self._fuse(gathered, self.server.x)
        return Combined(sums, weight, stats)

    def _fuse(self, gathered, x):
        """Server: the uploaders' vectors, in client-id order (so the sum does not depend on -n), as the sums
        the ordinary server update reads, and their total weight."""
        x64 = x.double()
        acc = torch.zeros(self.wire.up_len, dtype=torch.float64, device=x.device)
        weight = 0.0
        for cid, vec in sorted(gathered.items()):
            z = torch.from_numpy(vec).to(x.device)
            w = self.algo.fusion_weight(len(self.clients.parts[cid]), z, x)
            acc[: self.flat.dim].add_(z.double() - x64, alpha=w)
            weight += w
        return acc, weight


class Buffer(Transport):
    """FedBuff's round: one server update. The round's starters train from the broadcast x_t (their model
    version t) and hold their updates; then the round's arrivals (`plan.arrivals`, planned on the simulated
    clock by fedmpi.deploy.buffered) release theirs into the accumulator, and one Reduce sums them."""

    name = base.BUFFER

    def local(self, round_, updates):
        tally, plan = self.wire.new_tally(), round_.plan
        for update in updates:
            if plan.counts(update.cid):        # a client that drops out never delivers its update
                self.algo.hold(update.run, round_.training.down, self.flat)
            self.record(tally, update)
        for cid, version in plan.arrivals:      # after training: a fast starter may arrive this round
            if cid in self.clients.mine:
                tally.weight += self.algo.release(cid, version, plan.round, tally.acc)
                tally.upload()
        return LocalPart(tally)

    def combine(self, comm, round_, local):
        sums, stats = self.reduce(local.tally)
        return Combined(sums, stats.weight if stats else 0.0, stats)
