"""How one round's uploads travel (the `protocol` an algorithm's family declares), on every rank.

- REDUCE (FedAvg and most algorithms): broadcast x, train the selected clients, add their weighted uploads
  into one accumulator, one Reduce to the server.
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

Each protocol is a small class over the experiment's parts (`exp.clients`, `exp.wire`, `exp.algo`); the
experiment opens and closes the round (broadcast, reduction, server update) for all of them alike.
"""

from __future__ import annotations

import numpy as np
import torch

from fedmpi.algorithms.base import BUFFER, GATHER, REDUCE, ROUTE
from fedmpi.round.drift import ClientDrift


def start_from_broadcast(exp, t):
    """(the round's broadcast payload on this rank, the client start that loads it: `algo.client_start`);
    the algorithm's `round_start` hook sees the payload first."""
    down = exp.wire.down()
    if exp.algo.round_start is not None:
        exp.algo.round_start(t, down)

    def start(run):
        exp.algo.client_start(run, down, exp.clients.flat)

    return down, start


class ReduceRound:
    def __init__(self, exp):
        self.exp = exp
        self.drift = ClientDrift(exp.num_clients, exp.cfg.eval.client_drift)

    def __call__(self, t):
        exp, algo, clients = self.exp, self.exp.algo, self.exp.clients
        plan = exp.plan(t)
        exp.open_round(t)
        tally = exp.wire.new_tally()
        if clients.trains:
            down, start = start_from_broadcast(exp, t)

            with exp.timer.phase("train"):
                for run in clients.train(t, clients.round_clients(plan.selected), plan.standard, down, start):
                    tally.record(run)
                    if not plan.counts(run.cid):    # dropped or too late: its update and its state are lost
                        continue
                    for stage in exp.stages:
                        stage.client(run, down, clients.flat)
                    weight = algo.accumulate(run, down, clients.flat, tally.acc)
                    exp.stage_scalars(run, tally.acc)
                    self.drift.measure(run, clients.flat.vec - down[: clients.flat.dim], weight, tally)
                    tally.weight += weight
                    tally.upload(run)
        exp.reduce(tally)
        return exp.close_round(plan, drift=self.drift if exp.cfg.eval.client_drift else None)


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
            down, start = start_from_broadcast(exp, t)

            for cid in clients.hosted(selected):
                with exp.timer.phase("train"):
                    run = clients.train_one(t, cid, plan.standard, start)
                    # A client whose update does not count (dropped, too late) neither gates nor keeps its model.
                    uploaded = plan.counts(cid) and algo.gate(run, down, clients.flat)
                if not plan.counts(cid):
                    run.figures.update(dict.fromkeys(algo.client_columns, np.nan))
                mask.append(uploaded)
                if uploaded:
                    vectors.append(clients.flat.vec.detach().to("cpu", torch.float32).numpy().copy())
                    tally.upload(run)
                tally.record(run)
        exp.reduce(tally, sums=False)     # statistics and figures: the vectors travel by masked_gather
        by_rank = {r: [int(c) for c in selected if clients.host[c] == r] for r in clients.workers}
        gathered = exp.comm.masked_gather(np.array(mask, dtype=np.int8), vectors, by_rank, clients.flat.dim)
        exp.participation.settle(plan, exp.comm, gathered)     # e.g. gated-out clients finish earlier
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

            with exp.timer.phase("train"):
                run = clients.train_one(t, cid, plan.standard, start)
            if plan.counts(cid):
                tally.upload(run)
            else:       # dropped or too late: the slot keeps its parameters from before the round
                start(run)
            algo.finish_slot(run, slot, clients.flat)
            tally.record(run)
        aggregate = algo.is_aggregation(t)
        if aggregate and clients.mine:
            counted = exp.participation.counted
            weights = algo.slot_weights(t, lambda s, c: len(clients.parts[c]) if counted(s, c) else 0)
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


class BufferRound:
    """FedBuff's round: one server update. The round's starters train from the broadcast x_t (their model
    version t) and hold their updates; then the round's arrivals (`plan.arrivals`, planned on the simulated
    clock by fedmpi.deploy.buffered) release theirs into the accumulator, and one Reduce sums them."""

    def __init__(self, exp):
        self.exp = exp

    def __call__(self, t):
        exp, algo, clients = self.exp, self.exp.algo, self.exp.clients
        plan = exp.plan(t)
        exp.open_round(t)
        tally = exp.wire.new_tally()
        if clients.mine:
            down, start = start_from_broadcast(exp, t)

            for cid in clients.hosted(plan.selected):
                with exp.timer.phase("train"):
                    run = clients.train_one(t, cid, plan.standard, start)
                tally.record(run)
                if plan.counts(cid):        # a client that drops out never delivers its update
                    algo.hold(run, down, clients.flat)
            for cid, version in plan.arrivals:      # after training: a fast starter may arrive this round
                if cid in clients.mine:
                    tally.weight += algo.release(cid, version, t, tally.acc)
                    tally.upload(clients.new_run(t, cid))
        exp.reduce(tally)
        return exp.close_round(plan)


PROTOCOLS = {REDUCE: ReduceRound, GATHER: GatherRound, ROUTE: RouteRound, BUFFER: BufferRound}
