"""The rule options that select the papers' reference-code behaviour (issue 13), checked in-process against
hand-computed cases: `client.drop_last`, the `step_hook`, SCAFFOLD's `correction` and `initial_controls`.
MOON's `first_round` and SAFL's `mix` are tests/test_fidelity_algorithms.py; data sharing's
`warmup_target_acc`, Zhao et al.'s split and the `groups` partition tests/test_fidelity_data.py.

Whole runs go through `fedmpi.simulate` (the same round loop as `fedmpi run` at -n 1) on a tiny linear
regression whose float64 numpy reference is written out here; single hooks are driven directly.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import VecModel
from torch import nn

import fedmpi
from fedmpi import config
from fedmpi.algorithms import ClientRun, build_algorithm
from fedmpi.algorithms import scaffold as scaffold_mod
from fedmpi.algorithms.reinit import fresh_init
from fedmpi.core import rng
from fedmpi.core.errors import ConfigError
from fedmpi.core.flat import FlatModel
from fedmpi.core.train import LocalTrainer, Schedule, batch_order, schedule, steps_per_epoch
from fedmpi.data.dataset import Dataset

# --- a tiny regression, its data set and a float64 reference --------------------------------------------

X = np.array([[1.0, 0.0], [0.5, 2.0], [-1.0, 1.0],
              [2.0, 1.0], [0.0, -1.0], [1.5, 0.5], [-0.5, -2.0], [1.0, 1.0]])
Y = np.array([1.0, -1.0, 0.5, 2.0, 0.0, 1.0, -1.5, 0.5])
PARTS = [np.arange(0, 3), np.arange(3, 8)]
W0 = np.array([0.2, -0.1, 0.05])          # (w1, w2, b)


class Regression(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 1)
        with torch.no_grad():
            self.lin.weight.copy_(torch.tensor(W0[None, :2]))
            self.lin.bias.fill_(W0[2])

    def forward(self, x):
        return self.lin(x).squeeze(-1)


def half_mse(out, y):
    return 0.5 * ((out - y) ** 2).mean()


def regression_data():
    x, y = X.astype(np.float32), Y.astype(np.float32)
    return Dataset("regression", x, y, x, y, 1)


def grad(theta, cid):
    xs, ys = X[PARTS[cid]], Y[PARTS[cid]]
    r = xs @ theta[:2] + theta[2] - ys
    return np.concatenate([xs.T @ r, [r.sum()]]) / len(ys)


def simulate_regression(rounds, **overrides):
    """Both clients every round, full batch (B = 8 >= n_i), `client.steps` steps each."""
    base = {"seed": 3, "rounds": rounds, "partition": {"clients": 2}, "server": {"clients_per_round": 2},
            "client": {"lr": 0.1, "batch_size": 8, "steps": 3}, "runtime": {"threads": 1, "progress": "off"}}
    return fedmpi.simulate(base, dataset=regression_data(), model=Regression(), parts=PARTS, loss=half_mse,
                           **overrides)


def scaffold_reference(rounds, lr, steps, momentum, correction, c0=None, per_round=2, seed=3, wd=0.0):
    """SCAFFOLD option II in float64 over the rounds' draws of `per_round` of the 2 clients, with controls
    starting at c0 (zero if None)."""
    c0 = np.zeros(3) if c0 is None else c0
    x, c = W0.copy(), c0.copy()
    c_i = [c0.copy(), c0.copy()]
    for t in range(rounds):
        chosen = rng.select_clients(seed, t, 2, per_round)
        n = np.array([len(PARTS[cid]) for cid in chosen], dtype=float)
        ys, dcs = [], []
        for cid in chosen:
            corr = c - c_i[cid]
            w, buf = x.copy(), np.zeros(3)
            for _ in range(steps):
                g = grad(w, cid) + (corr if correction == "gradient" else 0.0) + wd * w
                buf = momentum * buf + g
                w = w - lr * buf
                if correction == "after_step":
                    w = w - lr * corr
            new = c_i[cid] - c + (x - w) / (steps * lr)
            dcs.append(new - c_i[cid])
            c_i[cid] = new
            ys.append(w)
        x = x + sum(ni * (y - x) for ni, y in zip(n, ys)) / n.sum()
        c = c + sum(dcs) / 2
    return x, c, c_i


# --- client.drop_last -----------------------------------------------------------------------------------

def test_drop_last_steps_per_epoch_by_hand():
    assert [steps_per_epoch(n, 10) for n in (25, 30, 7)] == [3, 3, 1]
    assert [steps_per_epoch(n, 10, drop_last=True) for n in (25, 30, 7)] == [2, 3, 1]   # n < B keeps one batch
    cfg = config.from_dict({"client": {"batch_size": 10, "epochs": 3, "drop_last": True}})
    assert schedule(cfg.client, 25) == Schedule(10, 6, True)
    assert schedule(cfg.client, 7) == Schedule(10, 3, True)
    assert schedule(config.from_dict({"client": {"batch_size": 10, "epochs": 3}}).client, 25) == Schedule(10, 9)


def test_drop_last_batches_drop_the_short_batch_of_each_epoch():
    keep = batch_order(np.random.default_rng(5), 25, Schedule(10, 6))
    drop = batch_order(np.random.default_rng(5), 25, Schedule(10, 4, True))
    assert [len(b) for b in keep] == [10, 10, 5, 10, 10, 5]
    assert [len(b) for b in drop] == [10, 10, 10, 10]
    # The same permutations: the full batches are those of the keeping order, the short ones are gone.
    for d, k in zip(drop, [keep[0], keep[1], keep[3], keep[4]]):
        np.testing.assert_array_equal(d, k)
    # Every epoch is a fresh permutation: no position twice within an epoch.
    assert len(set(np.concatenate(drop[:2]).tolist())) == 20
    # Fewer samples than a batch: one short batch per epoch.
    small = batch_order(np.random.default_rng(5), 7, Schedule(10, 2, True))
    assert [sorted(b.tolist()) for b in small] == [list(range(7))] * 2


def test_drop_last_trains_on_exactly_the_full_batches():
    # Client 1 of the regression has 5 samples; B = 2 with drop_last gives 2 steps per epoch of 2 samples.
    cfg = config.from_dict({"client": {"lr": 0.1, "batch_size": 2, "epochs": 1, "drop_last": True}})
    flat = FlatModel(Regression())
    trainer = LocalTrainer(flat, cfg.client, torch.tensor(X, dtype=torch.float32),
                           torch.tensor(Y, dtype=torch.float32), loss=half_mse)
    sched = schedule(cfg.client, 5)
    assert sched == Schedule(2, 2, True)
    idx = torch.as_tensor(PARTS[1])
    _, seen = trainer.train(idx, np.random.default_rng(9), sched)
    assert seen == 4
    w = W0.copy()
    for batch in batch_order(np.random.default_rng(9), 5, sched):
        rows = PARTS[1][batch]
        r = X[rows] @ w[:2] + w[2] - Y[rows]
        w = w - 0.1 * np.concatenate([X[rows].T @ r, [r.sum()]]) / len(rows)
    np.testing.assert_allclose(flat.vec.double().numpy(), w, rtol=1e-6)


def test_drop_last_vectorized_groups_follow_the_loop():
    base = {"seed": 2, "rounds": 2, "data": {"name": "mnist5k"},
            "partition": {"clients": 10, "scheme": "iid"}, "model": {"name": "lr"},
            "client": {"lr": 0.05, "batch_size": 32, "epochs": 1, "drop_last": True},
            "server": {"clients_per_round": 8}, "runtime": {"threads": 1, "progress": "off"}}
    loop = fedmpi.simulate(base, **{"client.vectorize": "off"})
    batched = fedmpi.simulate(base, **{"client.vectorize": "on"})
    kept = fedmpi.simulate(base, **{"client.vectorize": "off", "client.drop_last": False})
    np.testing.assert_allclose(batched.model, loop.model, rtol=1e-5, atol=1e-6)
    assert not np.allclose(kept.model, loop.model)       # 400 samples, B 32: 12 full batches instead of 13


# --- step_hook -------------------------------------------------------------------------------------------

def test_step_hook_runs_after_each_optimizer_step():
    cfg = config.from_dict({"client": {"lr": 0.1, "momentum": 0.5}})
    flat = FlatModel(Regression())
    trainer = LocalTrainer(flat, cfg.client, torch.tensor(X, dtype=torch.float32),
                           torch.tensor(Y, dtype=torch.float32), loss=half_mse)
    seen = []

    def hook(params):
        seen.append(params.double().numpy().copy())
        params.add_(1.0)        # a change the next step must start from

    trainer.train(torch.as_tensor(PARTS[0]), np.random.default_rng(0), Schedule(3, 2), step_hook=hook)
    # Step 1 from W0 (momentum buffer = g), hook adds 1; step 2 from there with buf = 0.5 buf + g.
    g1 = grad(W0, 0)
    w1 = W0 - 0.1 * g1
    w2 = (w1 + 1.0) - 0.1 * (0.5 * g1 + grad(w1 + 1.0, 0))
    np.testing.assert_allclose(seen[0], w1, rtol=1e-6)
    np.testing.assert_allclose(seen[1], w2, rtol=1e-6)
    np.testing.assert_allclose(flat.vec.double().numpy(), w2 + 1.0, rtol=1e-6)


def test_a_vectorizable_algorithm_with_a_step_hook_is_refused():
    from fedmpi.algorithms.fedavg import FedAvg
    from fedmpi.algorithms.registry import check_declarations

    class Stepper(FedAvg):
        name = "stepper"

        def step_hook(self, params):
            pass

    with pytest.raises(TypeError, match="step hook"):
        check_declarations(Stepper)


# --- SCAFFOLD --------------------------------------------------------------------------------------------

def scaffold(**keys):
    cfg = config.from_dict({"algorithm": {"name": "scaffold", **keys}, "partition": {"clients": 4},
                            "server": {"clients_per_round": 2}, "client": {"lr": 0.5}})
    return build_algorithm(cfg, dim=2, n_params=2)


def test_scaffold_after_step_subtracts_lr_times_correction_from_the_parameters():
    algo = scaffold(correction="after_step")
    assert algo.grad_hook is None and algo.step_hook is not None
    down = torch.tensor([1.0, 1.0, 0.3, -0.2])        # x, then c; client 0 has c_i = 0
    algo.client_start(ClientRun(0, 0, 1, lr=0.5), down, VecModel(2))
    params = torch.tensor([2.0, 3.0])
    algo.step_hook(params)
    # w - eta_l (c - c_i) = (2, 3) - 0.5 (0.3, -0.2)
    torch.testing.assert_close(params, torch.tensor([1.85, 3.1]))
    assert scaffold().step_hook is None and scaffold().grad_hook is not None


@pytest.mark.parametrize("correction", ["gradient", "after_step"])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_scaffold_correction_placements_against_the_reference(correction, momentum):
    result = simulate_regression(3, **{"algorithm.name": "scaffold", "algorithm.correction": correction,
                                       "client.momentum": momentum})
    x, c, c_i = scaffold_reference(3, 0.1, 3, momentum, correction)
    np.testing.assert_allclose(result.model, x, rtol=1e-5, atol=1e-6)
    algo = result.experiment.algo
    np.testing.assert_allclose(algo.server_state()["c"], c, rtol=1e-4, atol=1e-6)
    for cid in (0, 1):
        np.testing.assert_allclose(algo.client_state(cid)["c_i"], c_i[cid], rtol=1e-4, atol=1e-6)


def test_scaffold_placements_agree_without_momentum_and_differ_with_it():
    runs = {(m, p): simulate_regression(3, **{"algorithm.name": "scaffold", "algorithm.correction": p,
                                               "client.momentum": m, "client.weight_decay": 0.05}).model
            for m in (0.0, 0.9) for p in ("gradient", "after_step")}
    np.testing.assert_allclose(runs[0.0, "gradient"], runs[0.0, "after_step"], rtol=1e-5, atol=1e-7)
    assert np.abs(runs[0.9, "gradient"] - runs[0.9, "after_step"]).max() > 1e-3
    for (m, p), model in runs.items():       # weight decay as torch's SGD: g + wd w, before momentum
        np.testing.assert_allclose(model, scaffold_reference(3, 0.1, 3, m, p, wd=0.05)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("per_round", [1, 2])
def test_scaffold_model_init_controls_follow_the_reference_started_at_c0(per_round):
    keys = {"algorithm.name": "scaffold", "client.momentum": 0.9, "algorithm.correction": "after_step",
            "server.clients_per_round": per_round}
    result = simulate_regression(4, **keys, **{"algorithm.initial_controls": "model_init"})
    c0 = fresh_init(FlatModel(Regression()), 3, scaffold_mod.INIT_KEY).double().numpy()
    assert np.abs(c0 - W0).max() > 1e-3          # a fresh draw, not the model's own start
    x, c, c_i = scaffold_reference(4, 0.1, 3, 0.9, "after_step", c0=c0, per_round=per_round)
    np.testing.assert_allclose(result.model, x, rtol=1e-5, atol=1e-6)
    # Stored relative to c0.
    algo = result.experiment.algo
    np.testing.assert_allclose(algo.server_state()["c"], c - c0, rtol=1e-4, atol=1e-5)
    for cid in (0, 1):
        if algo.client_state(cid):
            np.testing.assert_allclose(algo.client_state(cid)["c_i"], c_i[cid] - c0, rtol=1e-4, atol=1e-5)
    zero = simulate_regression(4, **keys)
    if per_round == 2:
        # Full participation: after round 0, c = mean_i c_i+ and c_i+ - c no longer hold c0.
        np.testing.assert_allclose(zero.model, result.model, rtol=1e-5, atol=1e-7)
    else:
        # Partial: c keeps (1 - S/N) c0 and untrained clients c_i = c0, so the runs differ.
        assert np.abs(zero.model - result.model).max() > 1e-4


def test_scaffold_model_init_by_hand_under_partial_participation():
    cfg = config.from_dict({"algorithm": {"name": "scaffold", "initial_controls": "model_init"}, "seed": 4,
                            "partition": {"clients": 4}, "server": {"clients_per_round": 1},
                            "client": {"lr": 0.5}})
    flat = FlatModel(Regression())
    algo = build_algorithm(cfg, flat.dim, flat.n_params)
    c0 = fresh_init(flat, 4, scaffold_mod.INIT_KEY)
    np.testing.assert_array_equal(c0.numpy(), fresh_init(FlatModel(Regression()), 4, scaffold_mod.INIT_KEY).numpy())
    x = torch.tensor(W0, dtype=torch.float32)
    down = torch.zeros(2 * flat.dim)
    algo.down_payload(x, down)
    acc = torch.zeros(2 * flat.dim, dtype=torch.float64)
    run = ClientRun(2, 0, 3, lr=0.5, steps=2)
    algo.client_start(run, down, flat)
    flat.vec.copy_(x + torch.tensor([1.0, -1.0, 0.5]))       # "trained": y - x = (1, -1, 0.5)
    algo.accumulate(run, down, flat, acc)
    # Real controls: c_2+ = c_2 - c + (x - y) / (K eta_l) = c0 - c0 - (1, -1, 0.5) / 1; stored minus c0.
    expected_c2 = -np.array([1.0, -1.0, 0.5])
    np.testing.assert_allclose(algo.client_state(2)["c_i"], expected_c2 - c0.numpy(), rtol=1e-6)
    new_x = x + algo.aggregate(x, acc, 3.0, 0).float()
    # c = c0 + (1/N) (c_2+ - c0): stored c - c0 = (expected_c2 - c0) / 4.
    np.testing.assert_allclose(algo.server_state()["c"], (expected_c2 - c0.numpy()) / 4, rtol=1e-6)
    # Round 1, client 3 never trained (c_3 = c0): its correction is the real c - c0.
    algo.down_payload(new_x, down)
    algo.client_start(ClientRun(3, 1, 3, lr=0.5), down, flat)
    g = torch.zeros(3)
    algo.grad_hook(flat.params, g)
    np.testing.assert_allclose(g.numpy(), (expected_c2 - c0.numpy()) / 4, rtol=1e-6)


def test_fresh_init_is_seeded_and_leaves_the_global_generator_alone():
    flat = FlatModel(Regression())
    before = torch.random.get_rng_state()
    a, b = fresh_init(flat, 1, 5), fresh_init(flat, 1, 5)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert torch.equal(a, b) and not torch.equal(a, fresh_init(flat, 1, 6)) and not torch.equal(a, flat.vec)
    np.testing.assert_array_equal(flat.vec.double().numpy(), W0.astype(np.float32))   # the model is untouched
    bound = 1 / math.sqrt(2)      # nn.Linear(2, 1)'s default init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    assert np.all(np.abs(a.numpy()) <= bound)


def test_scaffold_keys_are_validated():
    with pytest.raises(ConfigError, match="algorithm.correction"):
        config.from_dict({"algorithm": {"name": "scaffold", "correction": "before"}})
    with pytest.raises(ConfigError, match="algorithm.initial_controls"):
        config.from_dict({"algorithm": {"name": "scaffold", "initial_controls": "random"}})

