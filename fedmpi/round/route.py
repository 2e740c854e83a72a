"""ROUTE (FedSkip) as a transport (fedmpi.round.protocols): model slots persist between aggregations; inside a
period they move between the ranks hosting consecutive clients with point-to-point transfers (`move_slots`),
and only the round's statistics are reduced; at aggregation rounds the slots are reduced like FedAvg's
uploads. A dropped or late client's slot keeps its parameters from before the round."""

from __future__ import annotations

import numpy as np
import torch

from fedmpi.algorithms import base
from fedmpi.round.protocols import Combined, LocalPart, Training, Transport


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
