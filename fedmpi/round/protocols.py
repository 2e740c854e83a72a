"""The protocol families: how one round's uploads travel (the `protocol` an algorithm's family declares).

How uploads travel is the algorithm's `protocol` declaration; each family is a value here (REDUCE, GATHER,
ROUTE, BUFFER) that supplies only what differs: which clients this rank trains and from what start, what
happens to a trained client, and how the uploads are combined.

- REDUCE (FedAvg and most algorithms): the selected clients' weighted uploads into one accumulator, one
  Reduce to the server.
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

A family holds no state; what it keeps from round to round (ROUTE's period start and previous plan,
REDUCE's drift measurements) lives in the object its `new_state` makes, held in RoundParts.state. The order
of a round's steps is fedmpi.round.engine.run_round's; a family is called at its fixed points.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedmpi.algorithms import base
from fedmpi.round.drift import ClientDrift
from fedmpi.round.engine import Closing, Family, Training, from_broadcast, reduce, upload_client
from fedmpi.uploads.precision import round_to


@dataclass
class ReduceState:
    drift: ClientDrift      # the round's drift measurements (and, with eval.client_drift, updates kept)


class Reduce(Family):
    name = base.REDUCE
    drift_figures = True
    deals_as_free = True        # runtime.client_dealing auto may deal the round's clients to whoever is free

    def new_state(self, num_clients, client_drift):
        return ReduceState(ClientDrift(num_clients, client_drift))

    def training(self, parts, state, plan):
        clients = parts.clients
        if not clients.trains:
            return Training([])
        down, start = from_broadcast(parts, plan.round)
        # Only each rank's sums leave it: which worker trains which client may follow who is free first.
        return Training(clients.round_clients(plan.selected, as_free=self.deals_as_free), start, down)

    def trained(self, parts, plan, run, training, tally):
        if not plan.counts(run.cid):    # dropped or too late: its update and its state are lost
            return
        flat, down = parts.clients.flat, training.down
        # Personal entries to the client's state; the upload then carries the broadcast's (no change) there.
        parts.algo.keep_personal(run.cid, flat, down)
        weight = upload_client(parts.algo, parts.stages, training.stages, run, down, flat, tally.acc)
        parts.state.drift.measure(run, flat.vec - down[: flat.dim], weight, tally)
        tally.weight += weight
        tally.upload(run)

    def combine(self, parts, state, plan, tally, kept):
        reduce(parts, tally)
        return Closing(drift=state.drift if parts.client_drift else None)


class Gather(Family):
    name = base.GATHER

    def trained(self, parts, plan, run, training, tally):
        """(whether the client uploads, its vector on the CPU or None)."""
        algo, flat = parts.algo, parts.clients.flat
        # A client whose update does not count (dropped, too late) neither gates nor keeps its model.
        counts = plan.counts(run.cid)
        uploaded = counts and algo.gate(run, training.down, flat)
        if not counts:
            run.figures.update(dict.fromkeys(algo.client_columns, np.nan))
        vector = None
        if uploaded:
            vector = flat.vec.detach().to("cpu", torch.float32).numpy().copy()
            round_to(torch.from_numpy(vector), parts.wire.wire_dtype)      # the model travels at the wire dtype
            tally.upload(run)
        return uploaded, vector

    def combine(self, parts, state, plan, tally, kept):
        clients, comm = parts.clients, parts.comm
        reduce(parts, tally, sums=False)     # statistics and figures: the vectors travel by masked_gather
        mask = np.array([uploaded for uploaded, _ in kept], dtype=np.int8)
        vectors = [vector for uploaded, vector in kept if uploaded]
        by_rank = {r: [int(c) for c in plan.selected if clients.host[c] == r] for r in clients.workers}
        gathered = comm.masked_gather(mask, vectors, by_rank, clients.flat.dim)
        parts.participation.settle(plan, comm, gathered)     # e.g. gated-out clients finish earlier
        if comm.is_server:
            _fuse(parts, gathered)
        return Closing()


def _fuse(parts, gathered):
    """Server: the uploaders' vectors, in client-id order (so the sum does not depend on -n), into the sums
    that the ordinary server update reads."""
    x = parts.server.x
    x64 = x.double()
    acc = torch.zeros(parts.wire.up_len, dtype=torch.float64, device=x.device)
    weight = 0.0
    for cid, vec in sorted(gathered.items()):
        z = torch.from_numpy(vec).to(x.device)
        w = parts.algo.fusion_weight(len(parts.clients.parts[cid]), z, x)
        acc[: parts.flat.dim].add_(z.double() - x64, alpha=w)
        weight += w
    parts.wire.set_sums(acc, weight)


@dataclass
class RouteState:
    period_start: torch.Tensor | None = None    # the current period's broadcast global model, where slots train
    previous: object = None     # the previous round's RoundPlan (None before this process's first round)


class Route(Family):
    name = base.ROUTE

    def new_state(self, num_clients, client_drift):
        return RouteState()

    def full_broadcast(self, parts, state, t):
        # The model travels at period starts, and at this process's first round (a resumed run's slots
        # train from the broadcast too).
        return parts.algo.is_period_start(t) or state.previous is None

    def training(self, parts, state, plan):
        algo, clients, t = parts.algo, parts.clients, plan.round
        if self.full_broadcast(parts, state, t) and clients.mine:
            state.period_start = parts.wire.down()[: clients.flat.dim].clone()
        order = [int(c) for c in algo.order(t, plan.selected)]
        if not algo.is_period_start(t):
            previous = state.previous if state.previous is not None else parts.participation.plan(t - 1)
            _move_slots(parts, algo.order(t - 1, previous.selected), order)
        slots = {cid: slot for slot, cid in enumerate(order)}

        def start(run):
            algo.start_slot(run, slots[run.cid], state.period_start, clients.flat)

        return Training([cid for cid in order if cid in clients.mine], start, None, slots)

    def trained(self, parts, plan, run, training, tally):
        if plan.counts(run.cid):
            tally.upload(run)
        else:       # dropped or too late: the slot keeps its parameters from before the round
            training.start(run)
        parts.algo.finish_slot(run, training.slots[run.cid], parts.clients.flat)

    def combine(self, parts, state, plan, tally, kept):
        algo, clients, t = parts.algo, parts.clients, plan.round
        aggregate = algo.is_aggregation(t)
        if aggregate and clients.mine:
            counted = parts.participation.counted
            weights = algo.slot_weights(t, lambda s, c: len(clients.parts[c]) if counted(s, c) else 0)
            tally.weight += algo.accumulate_slots(state.period_start, weights, tally.acc)
        # Inside a period only the statistics travel; the model moves with the slots.
        reduce(parts, tally, sums=aggregate)
        state.previous = plan
        # Evaluated at aggregation rounds only: x does not change in between, and a run's length must not
        # change its log (a resumed run would otherwise carry an extra evaluation at the first run's end).
        return Closing(update=aggregate, evaluate=aggregate)


def _move_slots(parts, previous, order):
    """Sends each slot from the rank of its previous client to the rank of its next one."""
    algo, comm = parts.algo, parts.comm
    host, dim = parts.clients.host, parts.flat.dim
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
        algo.put_slot(slot, torch.from_numpy(buf).to(parts.flat.device))


class Buffer(Family):
    """FedBuff's round: one server update. The round's starters train from the broadcast x_t (their model
    version t) and hold their updates; then the round's arrivals (`plan.arrivals`, planned on the simulated
    clock by fedmpi.deploy.buffered) release theirs into the accumulator, and one Reduce sums them."""

    name = base.BUFFER

    def trained(self, parts, plan, run, training, tally):
        if plan.counts(run.cid):        # a client that drops out never delivers its update
            parts.algo.hold(run, training.down, parts.clients.flat)

    def combine(self, parts, state, plan, tally, kept):
        clients = parts.clients
        for cid, version in plan.arrivals:      # after training: a fast starter may arrive this round
            if cid in clients.mine:
                tally.weight += parts.algo.release(cid, version, plan.round, tally.acc)
                tally.upload(clients.new_run(plan.round, cid))
        reduce(parts, tally)
        return Closing()


REDUCE, GATHER, ROUTE, BUFFER = Reduce(), Gather(), Route(), Buffer()
PROTOCOLS = {p.name: p for p in (REDUCE, GATHER, ROUTE, BUFFER)}
