"""How one round's uploads travel (the `protocol` an algorithm declares), on every rank.

- "reduce" (FedAvg and most algorithms): broadcast x, train the hosted selected clients, add their
  weighted uploads into one accumulator, one Reduce to the server.
- "gather" (SAFL with upload gating): clients decide after training whether to upload; the server first
  gathers the mask of who uploads, then only the uploaders' vectors (`masked_gather`, Gatherv).
- "route" (FedSkip): model slots persist between aggregations; inside a period they move between the
  ranks hosting consecutive clients with point-to-point transfers, and only the round's statistics are
  reduced; at aggregation rounds the slots are reduced like FedAvg's uploads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class RoundTally:
    """One rank's running totals for a round."""

    loss: torch.Tensor
    columns: dict
    weight: float = 0.0
    seen: int = 0
    uploads: int = 0

    def record(self, run):
        for name, value in run.figures.items():
            self.columns[name][run.cid] = value


def hosted(exp, clients):
    return [int(c) for c in clients if int(c) in exp.mine]


def reduce_round(exp, t):
    standard, selected = exp.selection(t)
    exp.broadcast(t)
    exp.begin_tally()
    if exp.trains:
        down = exp.down_vector()
        start = lambda run: exp.algo.client_start(run, down, exp.flat)  # noqa: E731
        # Batched groups where `client.vectorize` allows (fedmpi.vectorized), else one client at a time.
        for run in exp.train_hosted(t, exp.round_clients(selected), standard, down, start):
            exp.tally.weight += exp.algo.accumulate(run, down, exp.flat, exp.acc)
            exp.tally.uploads += 1
            exp.tally.record(run)
    exp.end_tally()
    exp.reduce_up()
    return exp.finish_round(t, selected) if exp.comm.is_server else None


def gather_round(exp, t):
    algo = exp.algo
    standard, selected = exp.selection(t)
    exp.broadcast(t)
    exp.begin_tally()
    mask, vectors = [], []
    if exp.mine:
        down = exp.down_vector()
        start = lambda run: algo.client_start(run, down, exp.flat)  # noqa: E731
        for cid in hosted(exp, selected):
            run = exp.train_client(t, cid, standard, start)
            uploaded = algo.gate(run, down, exp.flat)
            mask.append(uploaded)
            if uploaded:
                vectors.append(exp.flat.vec.detach().to("cpu", torch.float32).numpy().copy())
                exp.tally.uploads += 1
            exp.tally.record(run)
    exp.end_tally()
    exp.reduce_up(sums=False)     # statistics and per-client figures: the vectors travel by masked_gather
    hosted_selected = {r: [int(c) for c in selected if exp.host[c] == r] for r in exp.comm.workers}
    gathered = exp.comm.masked_gather(np.array(mask, dtype=np.int8), vectors, hosted_selected, exp.flat.dim)
    if not exp.comm.is_server:
        return None
    _fuse_gathered(exp, gathered)
    return exp.finish_round(t, selected)


def _fuse_gathered(exp, gathered):
    """Server: the uploaders' vectors, in client-id order (so the sum does not depend on -n), into the
    accumulator that the ordinary server update reads."""
    x64 = exp.x.double()
    acc = torch.zeros(exp.up_len, dtype=torch.float64, device=exp.device)
    weight = 0.0
    for cid, vec in sorted(gathered.items()):
        z = torch.from_numpy(vec).to(exp.device)
        w = exp.algo.fusion_weight_of(len(exp.parts[cid]), z, exp.x)
        acc[: exp.flat.dim].add_(z.double() - x64, alpha=w)
        weight += w
    exp.up_host[: exp.up_len].copy_(acc)
    exp.set_weight(weight)


def route_round(exp, t):
    algo, comm = exp.algo, exp.comm
    standard, selected = exp.selection(t)
    full = algo.is_period_start(t) or t == exp.first_round
    exp.broadcast(t, full=full)
    if full and exp.mine:
        exp.period_start = exp.down_vector()[: exp.flat.dim].clone()
    order = algo.order(t, selected)
    if not algo.is_period_start(t):
        _move_slots(exp, algo.order(t - 1, exp.selection(t - 1)[1]), order)
    exp.begin_tally()
    for slot, cid in enumerate(int(c) for c in order):
        if cid not in exp.mine:
            continue
        run = exp.train_client(t, cid, standard, lambda run, j=slot: algo.start_slot(j, exp.period_start, exp.flat))
        algo.finish_slot(slot, exp.flat)
        exp.tally.uploads += 1
        exp.tally.record(run)
    aggregate = algo.is_aggregation(t)
    if aggregate and exp.mine:
        weights = algo.slot_weights(t, lambda c: len(exp.parts[c]))
        exp.tally.weight += algo.accumulate_slots(exp.period_start, weights, exp.acc)
    algo.holders = algo.held_slots(t, selected, exp.mine)
    exp.end_tally()
    # Inside a period only the statistics travel; the model moves with the slots.
    exp.reduce_up(sums=aggregate)
    if not comm.is_server:
        return None
    # Evaluated at aggregation rounds only: x does not change in between, and a run's length must not
    # change its log (a resumed run would otherwise carry an extra evaluation at the first run's end).
    return exp.finish_round(t, selected, update=aggregate, evaluate=aggregate)


def _move_slots(exp, previous, order):
    """Sends each slot from the rank of its previous client to the rank of its next one."""
    algo, rank = exp.algo, exp.comm.rank
    sends, receives = [], {}
    for slot, (src_c, dst_c) in enumerate(zip(previous, order)):
        src, dst = int(exp.host[src_c]), int(exp.host[dst_c])
        if src == dst:
            continue
        if rank == src:
            sends.append((dst, slot, algo.slots.pop(slot).to("cpu", torch.float32).numpy()))
        elif rank == dst:
            receives[slot] = (src, np.empty(exp.flat.dim, dtype=np.float32))
    exp.comm.route(sends, [(src, slot, buf) for slot, (src, buf) in receives.items()])
    for slot, (_, buf) in receives.items():
        algo.slots[slot] = torch.from_numpy(buf).to(exp.device)


ROUNDS = {"reduce": reduce_round, "gather": gather_round, "route": route_round}
