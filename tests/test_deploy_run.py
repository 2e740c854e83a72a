"""Deployment realism inside the round loop (issue 15): availability, dropout, the simulated clock with
deadlines and over-selection, update compression, FedBuff.

In-process cases run through `fedmpi.simulate` (the same Experiment and loop as `fedmpi run` at -n 1).
The MPI cases, the resume cases included, are tests/test_deploy_mpi.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import (
    VecModel,
    same,
    setup_algo,
    small_config,
)

import fedmpi
from fedmpi import config
from fedmpi.algorithms import build_algorithm
from fedmpi.algorithms.fedbuff import staleness_weight
from fedmpi.core.errors import ConfigError, InputError
from fedmpi.deploy import compress as cp
from fedmpi.deploy.buffered import BufferedParticipation
from fedmpi.deploy.participation import DeployParticipation
from fedmpi.deploy.stage import CompressionStage
from fedmpi.plans.base import Participation
from fedmpi.uploads.base import ClientUpdate, StageSetting, StageView

ROUNDS = 4
# A clock without any effect on who counts: the deployment provider runs, inert (every update counts).
CLOCK_ONLY = {"speed": {"kind": "lognormal", "value": 5.0, "sigma": 0.7},
              "bandwidth": {"kind": "lognormal", "up": 2.0e+5, "down": 1.0e+6, "sigma": 0.7}}
ALGORITHMS = {
    "fedavg": {"name": "fedavg"},
    "scaffold": {"name": "scaffold"},
    "fednova": {"name": "fednova"},
    "fedskip": {"name": "fedskip", "delta": 2},
    "safl_gated": {"name": "safl", "gating": True, "nu": 2.0},
}


def base(**sections):
    cfg = small_config("/nonexistent/in-process", rounds=ROUNDS, **sections)
    cfg["runtime"] = {"threads": 1, "progress": "off"}
    return cfg


def simulate(cfg, **overrides):
    return fedmpi.simulate(cfg, **overrides)


def assert_same_run(got, ref, skip=()):
    """Metrics (every figure the reference has) and the global model bit for bit."""
    for name, values in ref.metrics.items():
        if name != "wall_s" and name not in skip:
            assert same(got.metrics[name], values), name
    for name, values in ref.clients.items():
        assert same(got.clients[name], values), name
    assert np.array_equal(got.model, ref.model)


# -- everything off: today's run --------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_inert_deployment_is_todays_run_bit_for_bit(name):
    cfg = base(algorithm=ALGORITHMS[name])
    today = simulate(cfg)
    assert type(today.experiment.participation) is Participation and not today.experiment.stages
    explicit = simulate({**cfg, "clients": {"availability": "always", "dropout": 0.0},
                         "server": {**cfg["server"], "deadline": None, "over_select": None},
                         "client": {**cfg["client"], "compress": {"name": "none"}}})
    assert type(explicit.experiment.participation) is Participation
    assert_same_run(explicit, today)
    clocked = simulate({**cfg, "clients": CLOCK_ONLY})
    assert isinstance(clocked.experiment.participation, DeployParticipation)
    assert_same_run(clocked, today)
    sim = clocked.metrics["sim_time_s"]
    assert np.all(np.diff(sim) > 0) and sim[0] > 0
    assert np.all(clocked.metrics["returned"] == clocked.clients["selected"].sum(axis=1))
    assert not clocked.clients["dropped"].any() and not clocked.clients["late"].any()


# -- dropped clients keep their state ---------------------------------------------------------------------

def dropped_after_counting(result, t=1):
    """Clients that dropped out in round t after their update counted in round t - 1."""
    selected, dropped = result.clients["selected"], result.clients["dropped"]
    counted = (selected[t - 1] > 0) & (dropped[t - 1] == 0)
    return np.flatnonzero((dropped[t] > 0) & counted)


def test_dropped_scaffold_clients_keep_their_controls_and_c_moves_by_the_kept_ones():
    cfg = base(algorithm={"name": "scaffold"}, server={"clients_per_round": 9}, clients={"dropout": 0.4})
    one, two = simulate(cfg, rounds=1), simulate(cfg, rounds=2)
    victims = dropped_after_counting(two)
    assert len(victims), "the config must drop a client that has a control from round 0"
    before, after = one.experiment.algo.controls, two.experiment.algo.controls
    for cid in victims:
        assert torch.equal(after[cid], before[cid])
    kept = np.flatnonzero((two.clients["selected"][1] > 0) & (two.clients["dropped"][1] == 0))
    assert len(kept) and all(not torch.equal(after[c], before.get(c, torch.zeros_like(after[c]))) for c in kept)
    # c <- c + (1/N) sum over the kept clients of Delta c_i (docs/how-to/deployment.md, section 7)
    n = cfg["partition"]["clients"]
    zero = torch.zeros_like(after[kept[0]])
    moved = sum((after[c] - before.get(c, zero)).double() for c in kept) / n
    c1 = one.experiment.server.algo.server.get("c", "cpu")
    c2 = two.experiment.server.algo.server.get("c", "cpu")
    torch.testing.assert_close((c2 - c1).double(), moved, rtol=1e-5, atol=1e-7)
    assert two.metrics["uploads"][1] == len(kept) and two.metrics["returned"][1] == len(kept)


def test_gated_safl_dropped_clients_keep_z_and_the_clock_charges_gated_out_clients_no_upload():
    cfg = base(algorithm={**ALGORITHMS["safl_gated"], "nu": 5.0}, server={"clients_per_round": 9},
               clients={"dropout": 0.4, **CLOCK_ONLY})
    two, three = simulate(cfg, rounds=2), simulate(cfg, rounds=3)
    victims = dropped_after_counting(three, 2)
    assert len(victims), "the config must drop a client that has a model z_k from round 1"
    for cid in victims:
        assert torch.equal(three.experiment.algo.models[cid], two.experiment.algo.models[cid])
        assert np.isnan(three.clients["gap"][2, cid]) and np.isnan(three.clients["uploaded"][2, cid])
    # The round lasts until the last selected client is done: an uploader when its upload arrives, a
    # gated-out or dropped client when its training ends.
    part = three.experiment.participation
    clock, steps = part.deployment.clock, part.steps
    selected = three.clients["selected"] > 0
    uploaded = np.nan_to_num(three.clients["uploaded"]) > 0
    assert (~uploaded & selected & (three.clients["dropped"] == 0)).any(), "the config must gate a client out"
    durations = [max(clock.client_time(c, steps[c], part.bytes_down, part.bytes_up if uploaded[t, c] else 0)
                     for c in np.flatnonzero(selected[t])) for t in range(3)]
    np.testing.assert_allclose(three.metrics["sim_time_s"], np.cumsum(durations), rtol=1e-12)


def test_deadline_and_over_selection_keep_the_first_arrivals():
    cfg = base(server={"clients_per_round": 4, "deadline": 2.3, "over_select": 2}, clients=CLOCK_ONLY)
    r = simulate(cfg)
    selected, late = r.clients["selected"], r.clients["late"]
    assert np.all(selected.sum(axis=1) == 6)
    counted = (selected > 0) & (late == 0) & (r.clients["dropped"] == 0)
    assert np.all(counted.sum(axis=1) <= 4) and np.array_equal(r.metrics["uploads"], counted.sum(axis=1))
    part = r.experiment.participation
    for t in range(ROUNDS):
        times = {c: part.deployment.clock.client_time(c, part.steps[c], part.bytes_down, part.bytes_up)
                 for c in np.flatnonzero(selected[t])}
        on_time = sorted((s, c) for c, s in times.items() if s <= 2.3)
        assert sorted(np.flatnonzero(counted[t])) == sorted(c for _, c in on_time[:4])


# -- compression ------------------------------------------------------------------------------------------

def payload(name, d, fraction=0.1, levels=16):
    """docs/how-to/deployment.md section 5's payload formulas, written out."""
    k = max(1, math.floor(fraction * d + 0.5))
    width = next(w for w in (1, 2, 4, 8) if d <= 2 ** (8 * w))
    return {"topk": 4 * k + min(k * width, math.ceil(d / 8)), "randk": 4 * k,
            "qsgd": 4 + math.ceil(d * (1 + math.ceil(math.log2(levels + 1))) / 8),
            "sign": 4 + math.ceil(d / 8)}[name]


@pytest.mark.parametrize("name, algorithm", [("topk", "fedavg"), ("randk", "fedprox"), ("qsgd", "fedavg"),
                                             ("sign", "fednova"), ("topk", "scaffold")])
def test_bytes_up_counts_the_compressed_payloads(name, algorithm):
    r = simulate(base(algorithm={"name": algorithm}, clients={"dropout": 0.2},
                      client={"lr": 0.05, "batch_size": 20,
                              # fraction only where the compressor reads it (payload's 0.1)
                              "compress": {"name": name, **({"fraction": 0.1} if name in ("topk", "randk") else {})}}))
    d = r.experiment.flat.dim
    per_upload = payload(name, d) + (4 * d if algorithm == "scaffold" else 0)     # Delta c_i travels dense
    assert np.all(r.metrics["uploads"] > 0)
    np.testing.assert_array_equal(r.metrics["bytes_up"], r.metrics["uploads"] * per_upload)
    assert np.all(np.isfinite(r.model))


def test_topk_of_everything_is_the_uncompressed_run():
    cfg = base(client={"lr": 0.05, "batch_size": 20, "compress": {"name": "topk", "fraction": 1.0}})
    full, plain = simulate(cfg), simulate(base())
    np.testing.assert_allclose(full.model, plain.model, rtol=0, atol=1e-6)
    d = full.experiment.flat.dim
    assert np.all(full.metrics["bytes_up"] == full.metrics["uploads"] * (4 * d + math.ceil(d / 8)))


def _compression(**compress):
    """The stage as a run builds it, from the `client`, `server` sections and the seed alone."""
    sections = config.from_dict({"client": {"compress": compress}})
    algo = type("A", (), {"up_vectors": 1, "dim": 4})
    return CompressionStage.build(StageSetting(algo, 4), client=sections.client, server=sections.server, seed=3)


def test_compression_stage_uploads_x_plus_the_decoded_update_and_keeps_the_residual():
    assert _compression(name="none") is None
    stage = _compression(name="topk", fraction=0.5, error_feedback=True)
    assert stage.keeps_client_state
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    down, model = torch.cat([x, torch.zeros(4)]), VecModel(4)
    model.vec.copy_(x + torch.tensor([0.5, -3.0, 0.25, 2.0]))
    update = stage.client(ClientUpdate(7, 0, model.vec, down[:4], 10.0), StageView(None))
    # top 2 of |delta|: -3 and 2; residual (0.5, 0, 0.25, 0); payload 2 values + min(2 indices, 1 mask byte)
    assert torch.equal(model.vec - x, torch.tensor([0.0, -3.0, 0.0, 2.0])) and update.bytes == 8 + 1
    assert update.weight == 10.0 and update.vector is model.vec
    assert stage.client_state(7)["compress_residual"].tolist() == [0.5, 0.0, 0.25, 0.0]
    model.vec.copy_(x + torch.tensor([0.5, 0.0, 0.0, 0.0]))
    stage.client(ClientUpdate(7, 1, model.vec, down[:4], 10.0), StageView(None))
    # round 2: delta + e = (1, 0, 0.25, 0): top 2 are 1 and 0.25
    assert torch.equal(model.vec - x, torch.tensor([1.0, 0.0, 0.25, 0.0]))
    assert stage.client_state(7)["compress_residual"].tolist() == [0.0, 0.0, 0.0, 0.0]
    other = _compression(name="topk", fraction=0.5, error_feedback=True)
    other.load_client_state(7, {"compress_residual": np.array([1.0, 0, 0, 0], dtype=np.float32)})
    assert other.client_state(7)["compress_residual"].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert cp.kept_count(0.5, 4) == 2


def test_error_feedback_residuals_of_dropped_clients_stay():
    cfg = base(server={"clients_per_round": 9}, clients={"dropout": 0.4},
               client={"lr": 0.05, "batch_size": 20, "compress": {"name": "topk", "fraction": 0.05,
                                                                   "error_feedback": True}})
    one, two = simulate(cfg, rounds=1), simulate(cfg, rounds=2)
    victims = dropped_after_counting(two)
    assert len(victims)
    for cid in victims:
        a, b = (r.experiment.stages[0].client_state(cid)["compress_residual"] for r in (one, two))
        assert np.array_equal(a, b) and np.abs(a).sum() > 0


# -- refusals and the config hash -------------------------------------------------------------------------

@pytest.mark.parametrize("sections, key", [
    ({"algorithm": {"name": "fedskip"}, "client": {"compress": {"name": "topk"}}}, "client.compress.name"),
    ({"algorithm": {"name": "safl", "gating": True}, "client": {"compress": {"name": "qsgd"}}},
     "client.compress.name"),
    ({"algorithm": {"name": "fedbuff", "concurrency": 4}, "client": {"compress": {"name": "sign"}}},
     "client.compress.name"),
    ({"algorithm": {"name": "fedskip"}, "server": {"clients_per_round": 5, "over_select": 2}}, "server.over_select"),
    ({"algorithm": {"name": "fedskip"}, "clients": {"availability": "bernoulli", "availability_p": 0.5}},
     "clients.availability"),
    ({"algorithm": {"name": "fedbuff", "concurrency": 4}, "server": {"clients_per_round": 5, "deadline": 3}},
     "server.deadline"),
    ({"algorithm": {"name": "fedbuff", "concurrency": 4}, "clients": {"availability": "bernoulli",
                                                                      "availability_p": 0.5}},
     "clients.availability"),
    ({"algorithm": {"name": "central"}, "clients": {"dropout": 0.1}}, "clients.dropout"),
    ({"algorithm": {"name": "central"}, "server": {"clients_per_round": 5, "deadline": 3}}, "server.deadline"),
    ({"algorithm": {"name": "fedbuff", "concurrency": 13}}, "algorithm.concurrency"),
])
def test_unsupported_combinations_are_refused_naming_the_key(sections, key):
    with pytest.raises(ConfigError) as info:
        simulate(base(**sections))
    assert f"{key} = " in str(info.value)


def test_deployment_keys_change_the_hash_only_when_set():
    plain = config.from_dict(base())
    cfg = base()
    explicit = config.from_dict({**cfg, "clients": {"dropout": 0.0}, "server": {"clients_per_round": 5,
                                 "deadline": None}, "client": {**cfg["client"], "compress": {"name": "none"}}})
    assert explicit.hash() == plain.hash()
    changed = [{"clients": {"dropout": 0.1}}, {"server": {"clients_per_round": 5, "deadline": 4.0}},
               {"server": {"clients_per_round": 5, "over_select": 0.5}},
               {"client": {"compress": {"name": "topk"}}}, {"clients": {"speed": {"value": 3.0}}}]
    hashes = {config.from_dict({**base(), **c}).hash() for c in changed}
    assert len(hashes) == len(changed) and plain.hash() not in hashes


def test_a_changed_trace_file_is_refused_on_resume(tmp_path):
    trace = tmp_path / "on.csv"
    trace.write_text("client,start,end\n0,0,inf\n")
    r = simulate(base(clients={"availability": "trace", "trace": str(trace)}), rounds=1)
    state = r.experiment.participation.state()
    trace.write_text("client,start,end\n0,0,100\n")
    with pytest.raises(InputError, match="availability trace .*on.csv' changed since the checkpoint"):
        r.experiment.participation.load_state(state)


# -- FedBuff ----------------------------------------------------------------------------------------------

def test_fedbuff_server_update_by_hand():
    cfg = config.from_dict(base(algorithm={"name": "fedbuff", "buffer_size": 3, "concurrency": 4}))
    algo = setup_algo(build_algorithm(cfg, 2, 2), [10] * 12)
    x = torch.tensor([1.0, -1.0])
    deltas = {(4, 5): [2.0, 0.0], (1, 3): [0.0, 4.0], (9, 6): [-1.0, 1.0]}     # (client, version) -> Delta
    for (cid, version), delta in deltas.items():
        model = VecModel(2)
        model.vec.copy_(x + torch.tensor(delta))
        algo.hold(fedmpi.algorithms.ClientRun(cid, version, 10), x, model)
    assert sorted(algo.client_state(4)) == ["pending_v5"]
    acc, weight = torch.zeros(2, dtype=torch.float64), 0.0
    for cid, version in [(4, 5), (1, 3), (9, 6)]:          # arriving in round 6: staleness 1, 3, 0
        weight += algo.release(cid, version, 6, acc)
    assert weight == 3.0 and algo.pending == {}
    update = algo.aggregate(x, acc, weight, 6)
    want = torch.tensor([2.0 / math.sqrt(2) - 1.0, 4.0 / math.sqrt(4) + 1.0], dtype=torch.float64) / 3
    torch.testing.assert_close(update, want)
    assert staleness_weight(3, 0.0) == 1.0 and staleness_weight(8) == pytest.approx(1 / 3)


def test_fedbuff_held_updates_survive_a_checkpoint_round_trip():
    cfg = config.from_dict(base(algorithm={"name": "fedbuff", "buffer_size": 2, "concurrency": 4}))
    algo = build_algorithm(cfg, 3, 3)
    algo.pending = {(2, 0): torch.tensor([1.0, 2.0, 3.0]), (2, 4): torch.tensor([0.5, 0.0, 1.0]),
                    (5, 1): torch.tensor([9.0, 9.0, 9.0])}
    other = build_algorithm(cfg, 3, 3)
    other.pending = {(2, 7): torch.ones(3)}
    other.load_client_state(2, algo.client_state(2))
    assert sorted(other.pending) == [(2, 0), (2, 4)]
    assert torch.equal(other.pending[(2, 4)], algo.pending[(2, 4)])


def speed_trace(tmp_path, speeds):
    path = tmp_path / "speed.csv"
    path.write_text("client,steps_per_s\n" + "".join(f"{i},{s}\n" for i, s in enumerate(speeds)))
    return str(path)


def test_fedbuff_schedule_by_hand(tmp_path):
    """Two clients, both in flight, one arrival per update. Client 0 trains 2 steps at 1 step/s, client 1
    at 0.4 steps/s; every download and upload takes `a` seconds at 1e6 B/s."""
    cfg = base(partition={"clients": 2, "scheme": "iid"}, server={"clients_per_round": 1},
               algorithm={"name": "fedbuff", "buffer_size": 1, "concurrency": 2},
               client={"lr": 0.05, "batch_size": 20, "steps": 2},
               clients={"speed": {"kind": "trace", "trace": speed_trace(tmp_path, [1.0, 0.4])}})
    r = simulate(cfg, rounds=3)
    a = 4 * r.experiment.flat.dim / 1.0e+6
    # round 0: both start from version 0; client 0 arrives at 2a + 2 (staleness 0) and restarts from
    # version 1 (the only client not in flight); it arrives again at 2 (2a + 2) before client 1 (2a + 5):
    # round 1. Round 2: client 0 restarts from version 2; client 1 arrives at 2a + 5 with staleness 2.
    np.testing.assert_allclose(r.metrics["sim_time_s"], [2 * a + 2, 4 * a + 4, 2 * a + 5], rtol=1e-12)
    np.testing.assert_array_equal(r.clients["selected"], [[1, 1], [1, 0], [1, 0]])
    np.testing.assert_array_equal(r.clients["arrived"], [[1, 0], [1, 0], [0, 1]])
    np.testing.assert_array_equal(r.clients["staleness"], [[0, np.nan], [0, np.nan], [np.nan, 2]])
    np.testing.assert_array_equal(r.metrics["uploads"], [1, 1, 1])
    assert isinstance(r.experiment.participation, BufferedParticipation)
    dim = r.experiment.flat.dim
    np.testing.assert_array_equal(r.metrics["bytes_down"], np.array([2, 1, 1]) * 4 * dim)


def test_fedbuff_keeps_concurrency_clients_in_flight_and_updates_every_k_arrivals():
    cfg = base(algorithm={"name": "fedbuff", "buffer_size": 3, "concurrency": 5},
               clients={"dropout": 0.2, **CLOCK_ONLY})
    r = simulate(cfg, rounds=6)
    # at each update: the buffer's last arrival has left, its replacement starts from the next version
    assert np.all(r.metrics["uploads"] == 3) and np.all(r.metrics["in_flight"] == 4)
    assert np.all(np.diff(r.metrics["sim_time_s"]) >= 0)
    assert r.clients["selected"][0].sum() >= 5          # round 0 starts the first five
    assert np.nanmax(r.clients["staleness"]) >= 1
    # a client that drops out never arrives: arrivals are never more than the starts so far
    starts = np.cumsum(r.clients["selected"].sum(axis=1) - r.clients["dropped"].sum(axis=1))
    assert np.all(np.cumsum(r.metrics["uploads"]) <= starts)

