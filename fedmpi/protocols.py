"""How one round's uploads travel (the `protocol` an algorithm's family declares), on every rank.

- REDUCE (FedAvg and most algorithms): broadcast x, train the selected clients, add their weighted uploads
  into one accumulator, one Reduce to the server.
- GATHER (SAFL with upload gating): clients decide after training whether to upload; the server first
  gathers the mask of who uploads, then only the uploaders' vectors (`masked_gather`, Gatherv).
- ROUTE (FedSkip): model slots persist between aggregations; inside a period they move between the ranks
  hosting consecutive clients with point-to-point transfers, and only the round's statistics are reduced;
  at aggregation rounds the slots are reduced like FedAvg's uploads.

Each protocol is a small class over the experiment's parts (`exp.clients`, `exp.wire`, `exp.algo`); the
experiment opens and closes the round (broadcast, reduction, server update) for all of them alike.
"""

from __future__ import annotations

import numpy as np
import torch

from fedmpi.algorithms.base import GATHER, REDUCE, ROUTE


class ReduceRound:
    def __init__(self, exp):
        self.exp = exp

    def __call__(self, t):
        exp, algo, clients = self.exp, self.exp.algo, self.exp.clients
        plan = exp.plan(t)
        exp.open_round(t)
        tally = exp.wire.new_tally()
        if clients.trains:
            down = exp.wire.down()
            if algo.round_start is not None:
                algo.round_start(t, down)

            def start(run):
                algo.client_start(run, down, clients.flat)

            for run in clients.train(t, clients.round_clients(plan.selected), plan.standard, down, start):
                tally.record(run)
                if not plan.counts(run.cid):    # dropped or too late: its update and its state are lost
                    continue
                for stage in exp.stages:
                    stage.client(run, down, clients.flat)
                tally.weight += algo.accumulate(run, down, clients.flat, tally.acc)
                tally.upload(run)
        exp.reduce(tally)
        return exp.close_round(plan)


class GatherRound:
    def __init__(self, exp):
        self.exp = exp

    def __call__(self, t):
        exp, algo, clients = self.exp, self.exp.algo, self.exp.clients
        plan = exp.plan(t)
        selected = plan.selected
        exp.open_round(t)
        tally = exp.wire.new_tally()
        mask, vectors = [], []
        if clients.mine:
            down = exp.wire.down()
            if algo.round_start is not None:
                algo.round_start(t, down)

            def start(run):
                algo.client_start(run, down, clients.flat)

            for cid in clients.hosted(selected):
                run = clients.train_one(t, cid, plan.standard, start)
                uploaded = algo.gate(run, down, clients.flat)
                mask.append(uploaded)
                if uploaded:
                    vectors.append(clients.flat.vec.detach().to("cpu", torch.float32).numpy().copy())
                    tally.upload(run)
                tally.record(run)
        exp.reduce(tally, sums=False)     # statistics and figures: the vectors travel by masked_gather
        by_rank = {r: [int(c) for c in selected if clients.host[c] == r] for r in exp.comm.workers}
        gathered = exp.comm.masked_gather(np.array(mask, dtype=np.int8), vectors, by_rank, clients.flat.dim)
        if exp.comm.is_server:
            self._fuse(gathered)
        return exp.close_round(plan)

    def _fuse(self, gathered):
        """Server: the uploaders' vectors, in client-id order (so the sum does not depend on -n), into the
        sums that the ordinary server update reads."""
        exp = self.exp
        x = exp.server.x
        x64 = x.double()
        acc = torch.zeros(exp.wire.up_len, dtype=torch.float64, device=x.device)
        weight = 0.0
        for cid, vec in sorted(gathered.items()):
            z = torch.from_numpy(vec).to(x.device)
            w = exp.algo.fusion_weight(len(exp.clients.parts[cid]), z, x)
            acc[: exp.clients.flat.dim].add_(z.double() - x64, alpha=w)
            weight += w
        exp.wire.set_sums(acc, weight)


class RouteRound:
    def __init__(self, exp):
        self.exp = exp
        self.period_start = None    # the broadcast global model of the current period, where slots train

    def __call__(self, t):
        exp, algo, clients = self.exp, self.exp.algo, self.exp.clients
        plan = exp.plan(t)
        full = algo.is_period_start(t) or t == exp.first_round
        exp.open_round(t, full=full)
        if full and clients.mine:
            self.period_start = exp.wire.down()[: clients.flat.dim].clone()
        order = algo.order(t, plan.selected)
        if not algo.is_period_start(t):
            self._move_slots(algo.order(t - 1, exp.plan(t - 1).selected), order)
        tally = exp.wire.new_tally()
        for slot, cid in enumerate(int(c) for c in order):
            if cid not in clients.mine:
                continue

            def start(run, slot=slot):
                algo.start_slot(run, slot, self.period_start, clients.flat)

            run = clients.train_one(t, cid, plan.standard, start)
            algo.finish_slot(run, slot, clients.flat)
            tally.upload(run)
            tally.record(run)
        aggregate = algo.is_aggregation(t)
        if aggregate and clients.mine:
            weights = algo.slot_weights(t, lambda c: len(clients.parts[c]))
            tally.weight += algo.accumulate_slots(self.period_start, weights, tally.acc)
        # Inside a period only the statistics travel; the model moves with the slots.
        exp.reduce(tally, sums=aggregate)
        # Evaluated at aggregation rounds only: x does not change in between, and a run's length must not
        # change its log (a resumed run would otherwise carry an extra evaluation at the first run's end).
        return exp.close_round(plan, update=aggregate, evaluate=aggregate)

    def _move_slots(self, previous, order):
        """Sends each slot from the rank of its previous client to the rank of its next one."""
        exp, algo = self.exp, self.exp.algo
        host, rank, dim = exp.clients.host, exp.comm.rank, exp.clients.flat.dim
        sends, receives = [], {}
        for slot, (src_c, dst_c) in enumerate(zip(previous, order)):
            src, dst = int(host[src_c]), int(host[dst_c])
            if src == dst:
                continue
            if rank == src:
                sends.append((dst, slot, algo.take_slot(slot).to("cpu", torch.float32).numpy()))
            elif rank == dst:
                receives[slot] = (src, np.empty(dim, dtype=np.float32))
        exp.comm.route(sends, [(src, slot, buf) for slot, (src, buf) in receives.items()])
        for slot, (_, buf) in receives.items():
            algo.put_slot(slot, torch.from_numpy(buf).to(exp.device))


PROTOCOLS = {REDUCE: ReduceRound, GATHER: GatherRound, ROUTE: RouteRound}
