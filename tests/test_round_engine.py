"""The round engine alone: each protocol family driven through `fedmpi.round.engine.run_round`, in one process
(LocalComm), on the tiny linear regression of tests/regression_problem.py (three clients of 3, 5 and 4
hand-made samples; its float64 numpy reference `local_sgd` follows the round's real batches).

What is checked is what the round does, against numbers worked out from the reference: REDUCE's FedAvg
average; GATHER fusing only the gated-in uploads; ROUTE carrying slots from client to client and aggregating
only at aggregation rounds; BUFFER releasing held updates in the round they arrive; and the control that
goes in and out as arguments and results (a stop at the broadcast, the deferred row, a non-finite model).
"""

from __future__ import annotations

import numpy as np
import pytest
import regression_problem as rp
import torch

from fedmpi import config
from fedmpi.algorithms.fedbuff import staleness_weight
from fedmpi.core.errors import StopRequested
from fedmpi.mpi.local import LocalComm
from fedmpi.round.engine import RoundOutcome, run_round
from fedmpi.round.protocols import Buffer, Gather, Reduce
from fedmpi.round.route import Route
from fedmpi.run.setup import experiment as set_up_experiment

THETA0 = rp.X0.astype(np.float32).astype(np.float64)   # the initial (w1, w2, b) as the float32 model holds them
LR = 0.1


def experiment(algorithm="fedavg", steps=2, server=None, clients=None, **keys):
    mapping = rp.config(algorithm, rounds=4, lr=LR, steps=steps, server=server, **keys)
    if clients:
        mapping["clients"] = clients
    return set_up_experiment(config.from_dict(mapping), LocalComm(), dataset=rp.dataset(), model=rp.Regression(),
                              parts=rp.PARTS, loss=rp.half_mse)


def trained(theta, t, cid, steps=2):
    """Client `cid`'s model after round t's local training from `theta` (the float64 reference)."""
    return rp.local_sgd(theta, t, cid, steps, LR)


def weighted_step(theta, ends, weights):
    """theta + sum_i w_i (end_i - theta) / sum_i w_i: FedAvg's server step at server lr 1."""
    weights = np.asarray(weights, dtype=float)
    return theta + sum(w * (end - theta) for w, end in zip(weights, ends)) / weights.sum()


def params(x):
    return np.asarray(x, dtype=np.float64)[:3]


# -- the protocol families, each alone ------------------------------------------------------------------

def test_reduce_gives_the_fedavg_average_of_the_selected_clients():
    exp = experiment("fedavg")
    parts = exp.round_parts
    assert type(parts.transport) is Reduce
    outcome = run_round(parts, 0)
    selected = rp.selected(0)
    expected = weighted_step(THETA0, [trained(THETA0, 0, c) for c in selected], rp.weights(selected))
    rp.assert_model(outcome.record.model, expected)
    assert isinstance(outcome, RoundOutcome) and outcome.stop_votes == 0 and outcome.nonfinite == ""
    metrics = outcome.record.metrics
    assert metrics["uploads"] == len(selected) and metrics["round"] == 0
    assert "gradient_diversity" in metrics       # the reduced sums are the clients' updates: drift figures
    np.testing.assert_array_equal(outcome.record.clients["selected"], np.isin(range(3), selected))


def test_gather_fuses_only_the_gated_in_uploads_in_client_id_order(monkeypatch):
    # All three clients train; the gate (replaced here: a fixed decision) lets clients 0 and 2 upload.
    exp = experiment("safl", server={"clients_per_round": 3}, gating=True, eps=1.0)
    parts = exp.round_parts
    assert type(parts.transport) is Gather
    gated_in = {0, 2}
    seen = []

    def gate(run, down, model):
        seen.append(run.cid)
        return run.cid in gated_in

    monkeypatch.setattr(exp.algo, "gate", gate)
    outcome = run_round(parts, 0)
    assert sorted(seen) == [0, 1, 2]
    ends = [trained(THETA0, 0, c) for c in sorted(gated_in)]
    expected = weighted_step(THETA0, ends, [len(rp.PARTS[c]) for c in sorted(gated_in)])
    rp.assert_model(outcome.record.model, expected)
    assert outcome.record.metrics["uploads"] == 2
    assert "gradient_diversity" not in outcome.record.metrics      # the reduction carried no update sums


def test_route_moves_slots_between_clients_and_aggregates_only_at_aggregation_rounds():
    exp = experiment("fedskip", delta=2)
    parts, algo = exp.round_parts, exp.algo
    assert type(parts.transport) is Route
    first = run_round(parts, 0)
    # Inside the period: no server step, no evaluation; each slot holds its round-0 client's model.
    rp.assert_model(first.record.model, THETA0)
    assert "test_loss" not in first.record.metrics
    order0, order1 = (list(algo.order(t, rp.selected(t))) for t in (0, 1))
    slots = [trained(THETA0, 0, c) for c in order0]
    for slot, end in enumerate(slots):
        rp.assert_model(algo.slots[slot], end)
    assert parts.transport.previous.round == 0          # the previous plan, kept for the next round's moves
    second = run_round(parts, 1)
    # Round 1 ends the period: slot j continued from its round-0 model on the j-th client of round 1's order,
    # and the slots are averaged with their accumulated sample counts.
    ends = [trained(slots[j], 1, c) for j, c in enumerate(order1)]
    weights = [len(rp.PARTS[a]) + len(rp.PARTS[b]) for a, b in zip(order0, order1)]
    rp.assert_model(second.record.model, weighted_step(THETA0, ends, weights))
    assert "test_loss" in second.record.metrics and not algo.slots


def test_buffer_releases_held_updates_in_the_round_they_arrive(tmp_path):
    trace = tmp_path / "speed.csv"
    trace.write_text("client,steps_per_s\n0,1.0\n1,0.3\n2,0.1\n")
    exp = experiment("fedbuff", server={"clients_per_round": 2}, buffer_size=1, concurrency=2,
                     clients={"speed": {"kind": "trace", "trace": str(trace)}})
    parts, algo = exp.round_parts, exp.algo
    assert type(parts.transport) is Buffer
    models = [THETA0]               # the global model of each version
    late = 0
    for t in range(4):
        outcome = run_round(parts, t)
        clients = outcome.record.clients
        started = np.flatnonzero(clients["selected"])
        arrived = np.flatnonzero(clients["arrived"])
        staleness = clients["staleness"][arrived].astype(int)
        versions = t - staleness
        # Held: exactly what started and has not arrived yet; released: exactly this round's arrivals.
        for cid, version in zip(arrived, versions):
            assert (cid, version) not in algo.pending
        for cid in started:
            assert ((cid, t) in algo.pending) == (cid not in arrived or t not in versions[arrived == cid])
        deltas = [trained(models[v], v, c) - models[v] for c, v in zip(arrived, versions)]
        step = sum(staleness_weight(s, 0.5) * d for s, d in zip(staleness, deltas)) / len(arrived)
        models.append(models[-1] + step)
        rp.assert_model(outcome.record.model, models[-1], rtol=1e-4, atol=1e-5)
        late += int((staleness > 0).sum())
    assert late > 0, "the trace must make some update arrive rounds after it was trained"


# -- control in and out ------------------------------------------------------------------------------

def test_a_stop_request_ends_the_round_at_its_broadcast():
    exp = experiment("fedavg")
    parts = exp.round_parts
    x0 = exp.server.x.clone()
    with pytest.raises(StopRequested, match="on 1 rank") as stop:
        run_round(parts, 0, stopping=True, after_broadcast=lambda: pytest.fail("no row after a stop"))
    assert stop.value.round == 0
    assert torch.equal(exp.server.x, x0)            # nothing trained, no server step


def test_after_broadcast_runs_once_between_the_broadcast_and_the_training(monkeypatch):
    exp = experiment("fedavg")
    events = []
    start = exp.algo.client_start
    monkeypatch.setattr(exp.algo, "client_start", lambda *a: (events.append("train"), start(*a)))
    run_round(exp.round_parts, 0, after_broadcast=lambda: events.append("row"))
    assert events == ["row", "train", "train"]


def test_a_non_finite_model_is_reported_in_the_outcome():
    exp = experiment("fedavg")
    exp.server.x[0] = float("nan")          # the broadcast carries it to every client
    outcome = run_round(exp.round_parts, 0)
    assert "train_loss nan" in outcome.nonfinite
    assert "non-finite entries in the global model" in outcome.nonfinite
    assert run_round(experiment("fedavg").round_parts, 0).nonfinite == ""


def test_route_sends_each_slot_from_its_previous_clients_rank_to_its_next_ones():
    """ROUTE's slot moves as rank 1 of three sees them: clients 0 and 2 live on rank 1, client 1 on rank 2.
    Slot 0 goes from client 0 to client 1 (sent to rank 2), slot 1 from client 1 to client 2 (received)."""
    from types import SimpleNamespace

    held = {0: torch.tensor([1.0, 2.0])}
    routed = []

    def route(sends, receives):
        routed.append(([(dst, slot, list(vec)) for dst, slot, vec in sends],
                       [(src, slot) for src, slot, _ in receives]))
        for _, _, buf in receives:
            buf[:] = [5.0, 6.0]

    algo = SimpleNamespace(take_slot=held.pop, put_slot=held.__setitem__)
    clients = SimpleNamespace(host=np.array([1, 2, 1]), flat=SimpleNamespace(dim=2, device=torch.device("cpu")))
    transport = Route(algo, clients, wire=None, path=None, participation=None,
                      comm=SimpleNamespace(rank=1, route=route))
    transport.move_slots(previous=[0, 1], order=[1, 2])
    assert routed == [([(2, 0, [1.0, 2.0])], [(2, 1)])]
    assert list(held) == [1] and torch.equal(held[1], torch.tensor([5.0, 6.0]))
