"""The research algorithms' update rules on tiny cases worked out by hand (docs/explanation/algorithms.md,
docs/explanation/baselines.md)."""

import dataclasses
import math

import numpy as np
import pytest
import torch
from conftest import VecModel, server_update, setup_algo, small_config

import fedmpi
from fedmpi import config
from fedmpi.algorithms import ClientRun, build_algorithm
from fedmpi.core import rng
from fedmpi.privacy.mechanism import poisson_select


def make(algorithm, **sections):
    cfg = config.from_dict({"algorithm": algorithm, **sections})
    return cfg, build_algorithm(cfg, dim=2, n_params=2)


class ShiftTrainer:
    """Stands in for ServerTrainer: each step adds lr to every coordinate; records its calls."""

    def __init__(self, n):
        self.n, self.calls = n, []

    def steps_for(self, epochs, batch):
        return epochs * math.ceil(self.n / batch)

    def train(self, start, round_, steps, batch, lr):
        self.calls.append((round_, steps, batch, lr))
        return start + lr * steps, 0.25


# -- FSL --------------------------------------------------------------------------------------------

def fsl(**keys):
    cfg, algo = make({"name": "fsl", **keys}, client={"lr": 0.1, "batch_size": 10, "epochs": 1},
                     partition={"clients": 2}, server={"clients_per_round": 2, "lr": 1.0},
                     server_data={"size": 10})
    setup_algo(algo, np.array([20, 40]), np.arange(10), torch.zeros(2))
    return algo


def test_fsl_default_rules_for_server_epochs_and_learning_rate():
    # E_s = ceil(n / (N n0) * E_c) = ceil(60 / 20) = 3 epochs of ceil(10 / 10) = 1 step: K0 = 3.
    # K = E_c * ceil(mean n_i / B) = 3; eta0 = sqrt(S) eta_l K / K0 = sqrt(2) * 0.1; lr = gamma * eta0.
    batch, steps, lr = fsl(gamma=2.0).server_schedule(np.array([20, 40]))
    assert (batch, steps) == (10, 3)
    assert lr == pytest.approx(2.0 * math.sqrt(2) * 0.1)
    assert fsl(gamma=2.0, server_epochs=5, server_batch_size=5, server_lr=0.3).server_schedule(
        np.array([20, 40])) == (5, 10, pytest.approx(0.6))
    assert fsl(mode="parallel").server_schedule(np.array([20, 40]))[2] == pytest.approx(0.1)


def test_fsl_incremental_learns_on_the_server_after_averaging():
    algo = fsl(gamma=1.0)
    trainer = ShiftTrainer(10)
    x0 = algo.initial_model(torch.zeros(2), trainer)
    assert torch.equal(x0, torch.zeros(2)) and trainer.calls == []     # no pretraining by default
    x = torch.tensor([1.0, 2.0])
    up = torch.tensor([4.0, -8.0], dtype=torch.float64)                # sum n_i Delta_i over weight 4
    new = server_update(algo, x, up, 4.0, 7)
    lr = math.sqrt(2) * 0.1
    # xbar = x + (1, -2) = (2, 0); then 3 server steps of +lr each.
    torch.testing.assert_close(new, torch.tensor([2.0 + 3 * lr, 3 * lr]))
    assert trainer.calls == [(7, 3, 10, pytest.approx(lr))] and algo.round_metrics()["server_loss"] == 0.25


def test_fsl_parallel_averages_the_server_as_a_weighted_client():
    algo = fsl(gamma=3.0, mode="parallel")
    algo.initial_model(torch.zeros(2), ShiftTrainer(10))
    x = torch.tensor([1.0, 2.0])
    new = server_update(algo, x, torch.tensor([4.0, -8.0], dtype=torch.float64), 4.0, 0)
    # Delta_0 = 3 steps * 0.1 = 0.3 each; x + ((1, -2) + 3 * (0.3, 0.3)) / 4.
    torch.testing.assert_close(new, torch.tensor([1.0 + 1.9 / 4, 2.0 - 1.1 / 4]))


def test_fsl_pretraining_runs_its_epochs_with_its_learning_rate():
    algo = fsl(pretrain_epochs=4, pretrain_lr=0.01)
    trainer = ShiftTrainer(10)
    x0 = algo.initial_model(torch.zeros(2), trainer)
    torch.testing.assert_close(x0, torch.full((2,), 0.04))
    assert trainer.calls[0][1:] == (4, 10, 0.01)


def test_fsl_without_a_server_set_is_a_config_error():
    cfg, algo = make({"name": "fsl"})
    with pytest.raises(config.ConfigError, match="server_data.size"):
        type(algo).check(cfg, VecModel(2))


# -- FedSkip ----------------------------------------------------------------------------------------

def fedskip(delta):
    return make({"name": "fedskip", "delta": delta}, partition={"clients": 6}, server={"clients_per_round": 3})


def test_fedskip_aggregates_every_delta_rounds_with_accumulated_weights():
    cfg, algo = fedskip(2)
    assert [algo.is_aggregation(t) for t in range(4)] == [False, True, False, True]
    assert [algo.is_period_start(t) for t in range(4)] == [True, False, True, False]
    orders = [algo.order(t, rng.select_clients(cfg.seed, t, 6, 3)) for t in range(2)]
    assert sorted(orders[0]) == sorted(rng.select_clients(cfg.seed, 0, 6, 3))
    weights = algo.slot_weights(1, lambda s, c: c + 1)
    np.testing.assert_array_equal(weights, orders[0] + 1 + orders[1] + 1)
    # a client whose update did not count (weight 0 in its round) adds nothing to its slot
    dropped = algo.slot_weights(1, lambda s, c: 0 if (s, c) == (1, orders[1][0]) else c + 1)
    np.testing.assert_array_equal(dropped, weights - np.eye(3)[0] * (orders[1][0] + 1))


class Recorded:
    """A participation history that answers from a table and records what it was asked."""

    def __init__(self, table):
        self.table, self.asked = table, []

    def selected(self, t):
        self.asked.append(t)
        return np.asarray(self.table[t])


def test_fedskip_slot_weights_ask_the_participation_history_for_the_periods_rounds():
    cfg = config.from_dict({"algorithm": {"name": "fedskip", "delta": 3}, "partition": {"clients": 6},
                            "server": {"clients_per_round": 3}})
    history = Recorded({3: [5, 0, 2], 4: [1, 4, 3]})     # not the standard draw of rounds 3 and 4
    algo = build_algorithm(cfg, dim=2, n_params=2, history=history)
    weights = algo.slot_weights(4, lambda s, c: 10 * s + c)
    assert history.asked == [3, 4]        # the period started at round 3
    want = sum(np.array([10 * s + c for c in algo.order(s, np.array(history.table[s]))]) for s in (3, 4))
    np.testing.assert_array_equal(weights, want)
    # Without a run's provider the history is the standard draw, which the default provider plans.
    plain = build_algorithm(cfg, dim=2, n_params=2)
    for t in range(4):
        assert np.array_equal(plain.context.history.selected(t), rng.select_clients(cfg.seed, t, 6, 3))


def test_a_runs_history_is_its_participation_providers_plan(tmp_path):
    """Under Poisson sampling the cohorts are not the standard draw: the context's history answers with the
    provider's plan (Experiment.plan), on every rank alike."""
    cfg = small_config(tmp_path / "out", rounds=2, server={"clients_per_round": 5, "sampling": "poisson"})
    exp = fedmpi.simulate(cfg).experiment
    for t in range(2):
        chosen = exp.algo.context.history.selected(t)
        assert np.array_equal(chosen, exp.participation.plan(t).selected)
        assert np.array_equal(chosen, poisson_select(1, t, 12, 5 / 12))


def test_the_context_carries_the_runs_numbers_not_the_config():
    cfg = config.from_dict({"seed": 7, "rounds": 40, "partition": {"clients": 9}, "privacy": {"mechanism": "gaussian"},
                            "server": {"clients_per_round": 4},
                            "client": {"lr": 0.2, "batch_size": 8, "steps": 3, "momentum": 0.5, "drop_last": True,
                                       "lr_schedule": {"name": "cosine", "min_lr": 0.0}}})
    algo = build_algorithm(cfg, dim=5, n_params=3)
    ctx = algo.context
    assert (ctx.seed, ctx.num_clients, ctx.clients_per_round, ctx.rounds, ctx.dim, ctx.n_params) == (7, 9, 4, 40, 5, 3)
    assert (algo.dim, algo.n_params, algo.keys) == (5, 3, cfg.algorithm) and not hasattr(algo, "cfg")
    c = ctx.client
    assert (c.lr, c.batch_size, c.epochs, c.steps, c.momentum, c.drop_last) == (0.2, 8, 1, 3, 0.5, True)
    assert ctx.privacy_enabled and build_algorithm(config.from_dict({}), 1, 1).context.privacy_enabled is False
    # the cosine schedule over the run's 40 rounds: half-way it is half of eta_l
    assert ctx.client_lr(0) == 0.2 and ctx.client_lr(20) == pytest.approx(0.1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.seed = 8


def test_fedskip_average_and_drift_of_the_slots():
    cfg, algo = fedskip(1)
    x = torch.tensor([1.0, 1.0])
    algo.slots = {0: x + torch.tensor([1.0, 0.0]), 1: x + torch.tensor([-1.0, 2.0])}
    acc = torch.zeros(3, dtype=torch.float64)
    weight = algo.accumulate_slots(x, np.array([1.0, 3.0]), acc)
    assert weight == 4.0 and algo.slots == {}
    new = server_update(algo, x, acc, weight, 0)
    # Weighted mean offset (-0.5, 1.5); drift = (1 * 4.5 + 3 * 0.5) / 4 = 1.5.
    torch.testing.assert_close(new, torch.tensor([0.5, 2.5]))
    assert algo.round_metrics()["drift"] == pytest.approx(1.5)


def test_fedskip_slot_state_is_stored_under_the_client_holding_it():
    cfg, algo = fedskip(3)
    selected = rng.select_clients(cfg.seed, 0, 6, 3)
    order = algo.order(0, selected)
    model = VecModel(2)
    for j, cid in enumerate(order):
        model.vec.fill_(float(j))
        algo.finish_slot(ClientRun(int(cid), 0, 5), j, model)
    state = algo.client_state(int(order[2]))
    assert int(state["slot_index"]) == 2 and np.array_equal(state["slot"], [2.0, 2.0])
    assert algo.client_state(int(next(c for c in range(6) if c not in order))) == {}
    fresh = fedskip(3)[1]
    fresh.load_client_state(int(order[2]), state)
    assert torch.equal(fresh.slots[2], torch.full((2,), 2.0))
    assert fresh.client_state(int(order[2]))["slot_index"] == 2
    algo.accumulate_slots(torch.zeros(2), np.ones(3), torch.zeros(3, dtype=torch.float64))
    assert all(algo.client_state(int(c)) == {} for c in order)    # aggregated: nothing held


# -- SAFL -------------------------------------------------------------------------------------------

def safl(**keys):
    cfg, algo = make({"name": "safl", **keys})
    setup_algo(algo, np.array([5, 5]), np.array([], dtype=np.int64), torch.zeros(2))
    return cfg, algo


def test_safl_temperature_schedule():
    _, algo = safl(L=10.0, q=2)
    assert [algo.temperature(t) for t in (0, 1, 2, 5)] == pytest.approx(
        [1.0, 1.0, math.exp(-0.1), math.exp(-0.2)])


def test_safl_start_point_mixes_own_and_global_elementwise():
    cfg, algo = make({"name": "safl", "eps": 0.25, "L": 2.0})
    dim = 1000
    algo = build_algorithm(cfg, dim=dim, n_params=dim)
    setup_algo(algo, np.array([5]), np.array([], dtype=np.int64), torch.zeros(dim))
    z, zbar = torch.full((dim,), 4.0), torch.full((dim,), 8.0)
    algo.models[3] = z.clone()
    model = VecModel(dim)
    algo.client_start(ClientRun(3, 1, 5), zbar, model)
    g = torch.Generator().manual_seed(rng.torch_seed(cfg.seed, rng.CLIENT, 1, 3, 12))
    u = torch.rand(dim, generator=g) < math.exp(-0.5)
    expected = torch.where(u, 0.25 * zbar + 0.75 * z, zbar)        # 5.0 where u, 8.0 elsewhere
    assert torch.equal(model.vec, expected)
    assert 0.5 < (model.vec == 5.0).float().mean() < 0.7           # about p_1 = e^-0.5 of the elements


def test_safl_eps_one_starts_from_the_global_model():
    _, algo = safl(eps=1.0)
    algo.models[0] = torch.tensor([5.0, -5.0])
    model = VecModel(2)
    algo.client_start(ClientRun(0, 0, 5), torch.tensor([1.0, 2.0]), model)
    assert torch.equal(model.vec, torch.tensor([1.0, 2.0]))


def test_safl_fusion_weights_samples_or_inverse_distance():
    _, algo = safl(fusion="ida")
    assert algo.fusion_weight(9, torch.tensor([3.0, 4.0]), torch.zeros(2)) == pytest.approx(0.2)
    _, algo = safl()
    assert algo.fusion_weight(9, torch.tensor([3.0, 4.0]), torch.zeros(2)) == 9.0


def test_safl_gate_uploads_with_probability_exp_minus_nu_gap():
    cfg, algo = make({"name": "safl", "gating": True, "nu": 2.0})
    zbar = torch.tensor([1.0, 1.0])
    setup_algo(algo, np.array([5, 5]), probe=lambda vec, idx: 0.8 if torch.equal(vec, zbar) else 0.5)
    model = VecModel(2)
    model.vec.copy_(torch.tensor([0.0, 3.0]))
    decisions = []
    for round_ in range(40):
        run = ClientRun(1, round_, 5)
        decisions.append(algo.gate(run, zbar, model))
        gap = (0.8 - 0.5) / (0.5 + 1e-6)
        assert run.figures["gap"] == pytest.approx(gap)
        draw = rng.stream(cfg.seed, rng.CLIENT, round_, 1, 13).random()
        assert decisions[-1] == (draw < math.exp(-2.0 * gap)) and run.figures["uploaded"] == decisions[-1]
    assert 0 < sum(decisions) < 40
    assert torch.equal(algo.models[1], torch.tensor([0.0, 3.0]))


# -- data sharing -----------------------------------------------------------------------------------

def test_datashare_gives_each_client_its_own_alpha_fraction_of_g():
    cfg, algo = make({"name": "datashare", "alpha": 0.25}, server_data={"size": 40})
    g = np.arange(100, 140)
    parts = algo.clients([np.array([0, 1, 2]), np.array([5, 6])], g)
    assert [len(p) for p in parts] == [13, 12]
    shares = [set(p.tolist()) - {0, 1, 2, 5, 6} for p in parts]
    assert all(s <= set(g.tolist()) and len(s) == 10 for s in shares) and shares[0] != shares[1]
    again = algo.clients([np.array([0, 1, 2]), np.array([5, 6])], g)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
