"""Transports: how one round's uploads travel from the clients' ranks to the server, as values in and out.

A transport is built once per run with the collaborators it works with (the algorithm, the rank's flat
model, the round's buffers, the upload path, the communicator's view of who hosts whom), and each round:

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

The families, by the algorithm's `protocol` declaration, are in fedmpi.round.protocols (REDUCE and its
secure variant, GATHER, ROUTE, BUFFER), the chunked robust gather in fedmpi.round.robust_gather.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from fedmpi.mpi import signals


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
    upload stages' views (fedmpi.uploads.path.RoundStages)."""

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
    eval.client_drift)."""

    sums: torch.Tensor | None = None
    weight: float = 0.0
    stats: object = None
    metrics: dict = field(default_factory=dict)
    columns: dict = field(default_factory=dict)
    update: bool = True
    evaluate: bool | None = None
    drift: object = None


class Transport:
    name = ""
    drift_figures = False    # the reduced sums are the clients' weighted updates (gradient diversity applies)
    # Dealt clients may go to whichever worker is free (ClientHost.round_clients): no rank needs to know who
    # trained which client, only each rank's sums.
    deals_as_free = False

    def __init__(self, algo, clients, wire, path):
        """`algo`: the algorithm; `clients`: the rank's ClientHost (placement, the flat model); `wire`: the
        round's RoundBuffers; `path`: the upload path (fedmpi.uploads.path.UploadPath)."""
        self.algo, self.clients, self.wire, self.path = algo, clients, wire, path
        self.flat = clients.flat

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
        if len(self.path):
            update = self.path.client(update, round_.stages)
        run = update.run if update.weight == update.run.weight else dataclasses.replace(update.run,
                                                                                          weight=update.weight)
        weight = self.algo.accumulate(run, round_.training.down, self.flat, acc)
        if len(self.path):
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
