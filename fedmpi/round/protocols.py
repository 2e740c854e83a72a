"""The protocol families as transports (fedmpi.round.transport): how one round's uploads travel, by the
`protocol` an algorithm's family declares.

- REDUCE (FedAvg and most algorithms): the selected clients' weighted uploads into one accumulator, one
  Reduce to the server. Under secure aggregation (`SecureReduce`) the update travels as masked integers
  summed modulo 2^b, and the float Reduce carries only the statistics.
- GATHER (SAFL with upload gating): clients decide after training whether to upload; the server first
  gathers the mask of who uploads, then only the uploaders' vectors (`masked_gather`, Gatherv).
- ROUTE (FedSkip): model slots persist between aggregations; inside a period they move between the ranks
  hosting consecutive clients with point-to-point transfers, and only the round's statistics are reduced;
  at aggregation rounds the slots are reduced like FedAvg's uploads.
- BUFFER (FedBuff): clients train in the round of the model version they start from and hold their
  updates until the round of their simulated arrival; the arrivals are reduced like FedAvg's uploads.

A client whose update does not count this round (the plan says so: dropped out, past the deadline) leaves
its state as it was: REDUCE skips its accumulate, GATHER its gate (its figures are NaN), ROUTE keeps the
slot's parameters from before the round and its weight does not grow, BUFFER never holds its update.
The order of a round's steps is fedmpi.round.engine.run_round's; a transport is called at its fixed points.
"""

from __future__ import annotations

import numpy as np
import torch

from fedmpi.algorithms import base
from fedmpi.round.transport import Combined, LocalPart, Training, Transport
from fedmpi.uploads.precision import round_to


class Reduce(Transport):
    name = base.REDUCE
    drift_figures = True
    deals_as_free = True        # runtime.client_dealing auto may deal the round's clients to whoever is free

    def __init__(self, algo, clients, wire, path, drift):
        """`drift`: the round's drift measurements (fedmpi.round.drift.ClientDrift)."""
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
                self.take(update, part)
                self.drift.measure(update.run, update.delta(), weight, tally)
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
        return Combined(sums, weight, stats, metrics, drift=self._drift())


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


class Route(Transport):
    """FedSkip's slots. What it keeps across rounds is its own: the current period's broadcast global model,
    where slots train (`period_start`), and the previous round's plan (None before this process's first round)."""

    name = base.ROUTE

    def __init__(self, algo, clients, wire, path, participation, comm):
        """`participation`: the provider (whose past plans and counted clients weigh the slots); `comm`: the
        communicator the slots move over."""
        super().__init__(algo, clients, wire, path)
        self.participation, self.comm = participation, comm
        self.period_start, self.previous = None, None

    def full_broadcast(self, t):
        # The model travels at period starts, and at this process's first round (a resumed run's slots
        # train from the broadcast too).
        return self.algo.is_period_start(t) or self.previous is None

    def training(self, plan):
        algo, clients, t = self.algo, self.clients, plan.round
        if self.full_broadcast(t) and clients.mine:
            self.period_start = self.wire.down()[: self.flat.dim].clone()
        order = [int(c) for c in algo.order(t, plan.selected)]
        if not algo.is_period_start(t):
            previous = self.previous if self.previous is not None else self.participation.plan(t - 1)
            self.move_slots(algo.order(t - 1, previous.selected), order)
        slots = {cid: slot for slot, cid in enumerate(order)}
        period_start = self.period_start

        def start(run):
            algo.start_slot(run, slots[run.cid], period_start, clients.flat)

        return Training([cid for cid in order if cid in clients.mine], start, None, slots)

    def local(self, round_, updates):
        tally, training = self.wire.new_tally(), round_.training
        for update in updates:
            run = update.run
            if round_.plan.counts(run.cid):
                tally.upload()
            else:       # dropped or too late: the slot keeps its parameters from before the round
                training.start(run)
            self.algo.finish_slot(run, training.slots[run.cid], self.flat)
            self.record(tally, update)
        return LocalPart(tally)

    def combine(self, comm, round_, local):
        algo, clients, plan = self.algo, self.clients, round_.plan
        t, tally = plan.round, local.tally
        aggregate = algo.is_aggregation(t)
        if aggregate and clients.mine:
            counted = self.participation.counted
            weights = algo.slot_weights(t, lambda s, c: len(clients.parts[c]) if counted(s, c) else 0)
            tally.weight += algo.accumulate_slots(self.period_start, weights, tally.acc)
        # Inside a period only the statistics travel; the model moves with the slots.
        sums, stats = self.reduce(tally, sums=aggregate)
        self.previous = plan
        # Evaluated at aggregation rounds only: x does not change in between, and a run's length must not
        # change its log (a resumed run would otherwise carry an extra evaluation at the first run's end).
        return Combined(sums, stats.weight if stats else 0.0, stats, update=aggregate, evaluate=aggregate)

    def move_slots(self, previous, order):
        """Sends each slot from the rank of its previous client to the rank of its next one."""
        algo, comm = self.algo, self.comm
        host, dim = self.clients.host, self.flat.dim
        sends, receives = [], {}
        for slot, (src_c, dst_c) in enumerate(zip(previous, order)):
            src, dst = int(host[src_c]), int(host[dst_c])
            if src == dst:
                continue
            if comm.rank == src:
                sends.append((dst, slot, algo.take_slot(slot).to("cpu", torch.float32).numpy()))
            elif comm.rank == dst:
                receives[slot] = (src, np.empty(dim, dtype=np.float32))
        comm.route(sends, [(src, slot, buf) for slot, (src, buf) in receives.items()])
        for slot, (_, buf) in receives.items():
            algo.put_slot(slot, torch.from_numpy(buf).to(self.flat.device))


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
