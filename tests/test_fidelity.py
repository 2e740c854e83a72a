"""The rule options that select the papers' reference-code behaviour (issue 13), checked in-process against
hand-computed cases: `client.drop_last`, the `step_hook`, SCAFFOLD's `correction` and `initial_controls`,
MOON's `first_round`, SAFL's `mix`, data sharing's `warmup_target_acc`, Zhao et al.'s split
(`server_data.fraction`, `server_data.holdout`) and the `groups` partition.

Whole runs go through `fedmpi.simulate` (the same round loop as `fedmpi run` at -n 1) on a tiny linear
regression whose float64 numpy reference is written out here; single hooks are driven directly.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import VecModel, setup_algo
from torch import nn

import fedmpi
from fedmpi import config
from fedmpi.algorithms import ClientRun, build_algorithm
from fedmpi.algorithms import moon as moon_mod
from fedmpi.algorithms import safl as safl_mod
from fedmpi.algorithms import scaffold as scaffold_mod
from fedmpi.algorithms.reinit import fresh_init
from fedmpi.core import rng
from fedmpi.core.errors import ConfigError
from fedmpi.core.flat import FlatModel
from fedmpi.core.train import LocalTrainer, Schedule, batch_order, schedule, steps_per_epoch
from fedmpi.data.dataset import Dataset
from fedmpi.data.partition import partition
from fedmpi.data.server_set import resolved_size, split_dataset

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


# --- MOON ------------------------------------------------------------------------------------------------

class TinyRep(nn.Module):
    """A model with MOON's forward_rep: z = tanh(A x), logits = B z."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 4), nn.Linear(4, 2)

    def forward_rep(self, x):
        z = torch.tanh(self.a(x))
        return z, self.b(z)

    def forward(self, x):
        return self.forward_rep(x)[1]


def moon(first_round, seed=7):
    torch.manual_seed(0)
    flat = FlatModel(TinyRep())
    cfg = config.from_dict({"algorithm": {"name": "moon", "first_round": first_round, "mu": 1.0},
                            "seed": seed, "partition": {"clients": 3}, "server": {"clients_per_round": 1}})
    algo = build_algorithm(cfg, flat.dim, flat.n_params)
    x0 = flat.vec.clone()
    setup_algo(algo, [4, 4, 4], x0=x0)
    return algo, flat, x0


def moon_loss_grad(algo, flat, xb, yb):
    flat.grad.zero_()
    algo.loss_fn(xb, yb).backward()
    return flat.grad.clone()


@pytest.mark.parametrize("first_round", ["zero_gradient", "x0", "model_init"])
def test_moon_first_participation_uses_the_configured_previous_model(first_round):
    algo, flat, x0 = moon(first_round)
    xb, yb = torch.randn(5, 3, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1, 0, 1, 1])
    x_t = x0 + 0.3          # the round's global model, not x0
    # Round 0: no client has a previous model and no reference has a negative pair yet, except x0 mode
    # where prev = x0 = x_t there (round 0's global model is x0), also the zero-gradient case.
    algo.client_start(ClientRun(1, 0, 4), x0.clone(), flat)
    ce_only = torch.nn.functional.cross_entropy(flat.module(xb), yb)
    flat.grad.zero_()
    ce_only.backward()
    torch.testing.assert_close(moon_loss_grad(algo, flat, xb, yb), flat.grad.clone(), rtol=1e-5, atol=1e-7)
    # Round 2, client 2 has never trained.
    algo.client_start(ClientRun(2, 2, 4), x_t.clone(), flat)
    if first_round == "zero_gradient":
        assert not algo._has_prev
        return
    assert algo._has_prev
    expected = x0 if first_round == "x0" else fresh_init(flat, 7, moon_mod.INIT_KEY, 2)
    torch.testing.assert_close(algo._prev_net.vec, expected)
    if first_round == "model_init":
        assert not torch.equal(expected, fresh_init(flat, 7, moon_mod.INIT_KEY, 1))     # each client its own
        assert not torch.equal(expected, x0)
    # The contrastive term now has a gradient: CE + mu l_con with z_prev from that model.
    z, logits = flat.module.forward_rep(xb)
    with torch.no_grad():
        z_glob = algo._global_net.module.forward_rep(xb)[0]
        z_prev = algo._prev_net.module.forward_rep(xb)[0]
    sims = torch.stack([torch.cosine_similarity(z, z_glob, -1), torch.cosine_similarity(z, z_prev, -1)], 1) / 0.5
    by_hand = torch.nn.functional.cross_entropy(logits, yb) + (-(sims[:, 0] - torch.logsumexp(sims, 1))).mean()
    torch.testing.assert_close(algo.loss_fn(xb, yb), by_hand)
    # Once the client has trained, its own last model is the previous one, whatever first_round says.
    acc = torch.zeros(flat.dim, dtype=torch.float64)
    flat.vec.add_(0.01)
    trained = flat.vec.clone()
    algo.accumulate(ClientRun(2, 2, 4), x_t.clone(), flat, acc)
    algo.client_start(ClientRun(2, 3, 4), x_t.clone(), flat)
    torch.testing.assert_close(algo._prev_net.vec, trained)


# --- SAFL mixing time ---------------------------------------------------------------------------------------

SAFL_BASE = {"seed": 5, "rounds": 5, "data": {"name": "mnist5k"},
             "partition": {"clients": 6, "scheme": "dirichlet", "beta": 0.5}, "model": {"name": "lr"},
             "client": {"lr": 0.05, "batch_size": 50, "epochs": 1}, "server": {"clients_per_round": 6},
             "algorithm": {"name": "safl", "L": 3.0, "eps": 0.5}, "runtime": {"threads": 1, "progress": "off"}}


@pytest.mark.parametrize("gating", [False, True])
def test_safl_mixing_times_agree_at_full_participation(gating):
    on_sel = fedmpi.simulate(SAFL_BASE, **{"algorithm.gating": gating})
    end = fedmpi.simulate(SAFL_BASE, **{"algorithm.gating": gating, "algorithm.mix": "end_of_round"})
    np.testing.assert_array_equal(end.model, on_sel.model)
    np.testing.assert_array_equal(end.metrics["test_acc"], on_sel.metrics["test_acc"])
    partial = fedmpi.simulate(SAFL_BASE, **{"algorithm.gating": gating, "algorithm.mix": "end_of_round",
                                            "server.clients_per_round": 3})
    partial_sel = fedmpi.simulate(SAFL_BASE, **{"algorithm.gating": gating, "server.clients_per_round": 3})
    assert not np.array_equal(partial.model, partial_sel.model)


def safl(mix, eps=0.5):
    cfg = config.from_dict({"algorithm": {"name": "safl", "L": 2.0, "eps": eps, "mix": mix}, "seed": 9,
                            "partition": {"clients": 4}, "server": {"clients_per_round": 2}})
    algo = build_algorithm(cfg, dim=3, n_params=3)
    return setup_algo(algo, [5, 5, 5, 5], x0=torch.tensor([0.5, 0.5, 0.5]))


def safl_u(round_, cid, p):
    g = torch.Generator().manual_seed(rng.torch_seed(9, rng.CLIENT, round_, cid, safl_mod.MASK_KEY))
    return torch.rand(3, generator=g) < p


def test_safl_end_of_round_mixes_with_that_rounds_average_and_restarts_from_it():
    algo, model = safl("end_of_round"), VecModel(3)
    x1 = torch.tensor([1.0, 2.0, 3.0])
    # Round 1: client 1 (never trained) starts from x_1 itself; it trains to z.
    algo.round_start(1, x1.clone())
    algo.client_start(ClientRun(1, 1, 5), x1.clone(), model)
    torch.testing.assert_close(model.vec, x1)
    z = torch.tensor([4.0, -4.0, 0.0])
    model.vec.copy_(z)
    algo.accumulate(ClientRun(1, 1, 5), x1.clone(), model, torch.zeros(3, dtype=torch.float64))
    # Start of round 2: x_2 arrives; client 1 mixes z with it, p_2 = exp(-2 / L) = e^-1, u from (9, CLIENT, 2, 1).
    x2 = torch.tensor([2.0, 2.0, 2.0])
    algo.round_start(2, x2.clone())
    u = safl_u(2, 1, math.exp(-1.0))
    w = torch.where(u, 0.5 * x2 + 0.5 * z, x2)
    assert 1 not in algo.models
    # Rounds later (x_4 is something else) the client restarts from that w, not from x_4.
    algo.round_start(3, torch.full((3,), 9.0))
    algo.round_start(4, torch.full((3,), 7.0))
    algo.client_start(ClientRun(1, 4, 5), torch.full((3,), 7.0), model)
    torch.testing.assert_close(model.vec, w)


def test_safl_end_of_round_with_eps_1_restarts_from_the_model_after_its_round():
    # eps = 1: the mixed start is x_{t+1} itself: under partial participation a stale model, not FedAvg's x_t.
    algo, model = safl("end_of_round", eps=1.0), VecModel(3)
    algo.client_start(ClientRun(0, 0, 5), torch.zeros(3), model)
    model.vec.copy_(torch.tensor([1.0, 1.0, 1.0]))
    algo.accumulate(ClientRun(0, 0, 5), torch.zeros(3), model, torch.zeros(3, dtype=torch.float64))
    algo.round_start(1, torch.tensor([3.0, 3.0, 3.0]))
    algo.round_start(2, torch.tensor([5.0, 5.0, 5.0]))
    algo.client_start(ClientRun(0, 2, 5), torch.tensor([5.0, 5.0, 5.0]), model)
    torch.testing.assert_close(model.vec, torch.tensor([3.0, 3.0, 3.0]))
    on_sel = safl("on_selection", eps=1.0)
    on_sel.client_start(ClientRun(0, 2, 5), torch.tensor([5.0, 5.0, 5.0]), model)
    torch.testing.assert_close(model.vec, torch.tensor([5.0, 5.0, 5.0]))


def test_safl_end_of_round_state_round_trips_through_client_state():
    algo, model = safl("end_of_round"), VecModel(3)
    model.vec.copy_(torch.tensor([1.0, 0.0, -1.0]))
    algo.accumulate(ClientRun(3, 0, 5), torch.zeros(3), model, torch.zeros(3, dtype=torch.float64))
    pending = algo.client_state(3)
    assert set(pending) == {"z"}
    other = safl("end_of_round")
    other.load_client_state(3, pending)
    for a in (algo, other):
        a.round_start(1, torch.tensor([2.0, 2.0, 2.0]))
    assert set(algo.client_state(3)) == {"w"}
    np.testing.assert_array_equal(other.client_state(3)["w"], algo.client_state(3)["w"])


# --- data sharing: warm-up to a target accuracy -------------------------------------------------------------

SHARE = {"seed": 1, "rounds": 2, "data": {"name": "mnist5k"}, "partition": {"clients": 10, "scheme": "shards",
         "shards_per_client": 1}, "model": {"name": "lr"}, "client": {"lr": 0.05, "batch_size": 20, "epochs": 1},
         "server": {"clients_per_round": 5},
         "server_data": {"size": 200, "scheme": "classes", "source": "holdout"},
         "algorithm": {"name": "datashare", "alpha": 0.5, "warmup_lr": 0.01},
         "runtime": {"threads": 1, "progress": "off"}}


def test_warmup_stops_at_the_first_epoch_reaching_the_target():
    target = 0.7
    run = fedmpi.simulate(SHARE, **{"algorithm.warmup_epochs": 40, "algorithm.warmup_target_acc": target})
    epochs, acc = int(run.metrics["warmup_epochs"][0]), run.metrics["warmup_acc"][0]
    assert 1 < epochs < 40 and acc >= target
    assert np.isnan(run.metrics["warmup_epochs"][1])          # logged once, at round 0
    # The epoch before fell short: capped at epochs - 1 the warm-up ends below the target.
    short = fedmpi.simulate(SHARE, **{"algorithm.warmup_epochs": epochs - 1, "algorithm.warmup_target_acc": target})
    assert short.metrics["warmup_epochs"][0] == epochs - 1 and short.metrics["warmup_acc"][0] < target
    # The same x_0 as a fixed warm-up of that many epochs: the runs agree.
    fixed = fedmpi.simulate(SHARE, **{"algorithm.warmup_epochs": epochs})
    np.testing.assert_array_equal(fixed.model, run.model)
    # An unreachable target runs every epoch: identical to the fixed warm-up.
    capped = fedmpi.simulate(SHARE, **{"algorithm.warmup_epochs": 3, "algorithm.warmup_target_acc": 1.0})
    np.testing.assert_array_equal(capped.model, fedmpi.simulate(SHARE, **{"algorithm.warmup_epochs": 3}).model)
    assert capped.metrics["warmup_epochs"][0] == 3


def test_warmup_target_keys_are_validated():
    with pytest.raises(ConfigError, match="warmup_target_acc.*warmup_epochs > 0"):
        config.from_dict({"algorithm": {"name": "datashare", "warmup_target_acc": 0.6}})
    with pytest.raises(ConfigError, match="warmup_target_acc"):
        config.from_dict({"algorithm": {"name": "datashare", "warmup_epochs": 5, "warmup_target_acc": 1.5}})


# --- Zhao et al.'s split: holdout H, G sized relative to the clients' data ----------------------------------

class Labels:
    """A data set of labels only (the split reads nothing else): 100 samples of each of 10 classes."""

    def __init__(self):
        self.y_train = np.repeat(np.arange(10), 100)
        self.num_classes = 10
        self.users = None


def zhao_cfg(fraction, holdout=400, scheme="classes", **more):
    return config.from_dict({"seed": 2, "partition": {"clients": 10, "scheme": "shards", "shards_per_client": 1},
                             "server_data": {"fraction": fraction, "holdout": holdout, "scheme": scheme,
                                             "source": "holdout", **more}})


def test_resolved_size_by_hand():
    sd = config.ServerDataConfig
    assert resolved_size(sd(fraction=0.1, holdout=1000, source="holdout"), 4000) == 300      # 0.1 * 3000
    assert resolved_size(sd(fraction=0.25, source="holdout"), 4000) == 800       # 800 / (4000 - 800) = 0.25
    assert resolved_size(sd(fraction=0.1), 4000) == 400                          # overlap: D is everything
    assert resolved_size(sd(size=123), 4000) == 123


def test_a_beta_sweep_keeps_the_clients_data_fixed():
    ds = Labels()
    splits = {f: split_dataset(zhao_cfg(f), ds) for f in (0.05, 0.1, 0.2)}
    holdout = np.setdiff1d(np.arange(1000), np.concatenate(splits[0.05].parts))
    assert len(holdout) == 400 and np.all(np.bincount(ds.y_train[holdout]) == 40)     # even over the classes
    first = splits[0.05].parts
    for f, split in splits.items():
        assert len(split.server_idx) == round(f * 600)           # |D| = 1000 - 400
        assert np.isin(split.server_idx, holdout).all()         # G is drawn from H
        clients = np.concatenate(split.parts)
        assert len(clients) == 600 and not np.intersect1d(clients, holdout).size
        for a, b in zip(split.parts, first):
            np.testing.assert_array_equal(a, b)
            assert len(set(ds.y_train[a].tolist())) == 1          # D stays balanced: 1-class clients hold one class
        counts = np.bincount(ds.y_train[split.server_idx], minlength=10)
        assert counts.max() - counts.min() <= 1                  # uniform over the 10 classes
    assert len(splits[0.2].groups["partition/server"]["samples"]) == 1


def test_fraction_with_holdout_zero_removes_only_the_set():
    split = split_dataset(config.from_dict({"seed": 2, "partition": {"clients": 10, "scheme": "iid"},
                                            "server_data": {"fraction": 0.25, "source": "holdout"}}), Labels())
    assert len(split.server_idx) == 200 and sum(len(p) for p in split.parts) == 800


def test_zhao_split_errors_name_the_keys():
    with pytest.raises(ConfigError, match="server_data.fraction.*either server_data.size"):
        config.from_dict({"server_data": {"size": 10, "fraction": 0.1}})
    with pytest.raises(ConfigError, match="server_data.holdout.*source = 'holdout'"):
        config.from_dict({"server_data": {"holdout": 100}})
    with pytest.raises(ConfigError, match="server_data.size.*<= server_data.holdout"):
        config.from_dict({"server_data": {"size": 200, "holdout": 100, "source": "holdout"}})
    with pytest.raises(ConfigError, match=r"server_data.fraction = 1.0 \(a set of 600 samples\).*holdout"):
        split_dataset(zhao_cfg(1.0, scheme="iid"), Labels())
    with pytest.raises(ConfigError, match="server_data.holdout = 1000"):
        split_dataset(zhao_cfg(0.1, holdout=1000), Labels())


def test_datashare_accepts_a_set_given_by_fraction():
    cfg = config.from_dict({"algorithm": {"name": "datashare"},
                            "server_data": {"fraction": 0.1, "holdout": 400, "source": "holdout"}})
    from fedmpi.algorithms import lookup

    lookup("datashare").check(cfg, VecModel(2))
    with pytest.raises(ConfigError, match="server_data.size"):
        lookup("datashare").check(config.from_dict({"algorithm": {"name": "datashare"}}), VecModel(2))


# --- partition scheme `groups` -------------------------------------------------------------------------------

def test_groups_partition_by_hand():
    cfg = config.from_dict({"seed": 1, "partition": {"clients": 5, "scheme": "groups", "groups": [
        {"clients": 3, "labels": [1, 2, 5]}, {"clients": 2, "labels": [2]}]}, "server": {"clients_per_round": 5}})
    ds = Labels()
    parts = partition(ds, cfg)
    held = [set(ds.y_train[p].tolist()) for p in parts]
    assert held == [{1, 2, 5}] * 3 + [{2}] * 2
    # Label 2 (100 samples) is split among all 5 clients, labels 1 and 5 among the first 3.
    assert [int((ds.y_train[p] == 2).sum()) for p in parts] == [20] * 5
    assert [int((ds.y_train[p] == 1).sum()) for p in parts[:3]] == [34, 33, 33]
    everything = np.concatenate(parts)
    assert len(everything) == len(set(everything.tolist())) == 300


def test_groups_partition_with_samples_per_client_by_hand():
    cfg = config.from_dict({"seed": 1, "partition": {"clients": 4, "scheme": "groups", "samples_per_client": 30,
                                                     "groups": [[2, [0, 1, 2, 3]], [2, [2]]]},
                            "server": {"clients_per_round": 4}})
    ds = Labels()
    parts = partition(ds, cfg)
    assert [len(p) for p in parts] == [30] * 4
    # 30 over 4 labels: 8, 8, 7, 7 (the first labels take the remainder); the second group 30 of label 2.
    assert [np.bincount(ds.y_train[p], minlength=4).tolist() for p in parts] == [[8, 8, 7, 7]] * 2 + [[0, 0, 30, 0]] * 2
    assert len(set(np.concatenate(parts).tolist())) == 120
    short = config.from_dict({"partition": {"clients": 4, "scheme": "groups", "samples_per_client": 60,
                                            "groups": [[2, [0, 1, 2, 3]], [2, [2]]]},
                              "server": {"clients_per_round": 4}})
    with pytest.raises(ConfigError, match="need 150 samples of label 2"):
        partition(ds, short)


def test_groups_partition_is_validated():
    with pytest.raises(ConfigError, match="add up to partition.clients"):
        config.PartitionConfig(clients=4, scheme="groups", groups=[{"clients": 3, "labels": [1]}])
    with pytest.raises(ConfigError, match="partition.groups"):
        config.PartitionConfig(clients=4, scheme="groups", groups=[{"clients": 4, "labels": []}])
    with pytest.raises(ConfigError, match="label 12 is not in the training pool"):
        partition(Labels(), config.from_dict({"partition": {"clients": 2, "scheme": "groups",
                                                            "groups": [[2, [12]]]},
                                              "server": {"clients_per_round": 2}}))


# --- MOON on ResNet (FedSkip's CIFAR-100 comparison on one model family) ------------------------------------

def test_resnet18_with_a_projection_head_serves_moon():
    from fedmpi.algorithms import lookup
    from fedmpi.core.models import build_model

    cfg = config.from_dict({"algorithm": {"name": "moon"}, "model": {"name": "resnet18", "projection": 16}})
    torch.manual_seed(0)
    module = build_model(cfg.model, (3, 8, 8), 5)
    module.eval()
    x = torch.randn(2, 3, 8, 8)
    z, logits = module.forward_rep(x)
    assert z.shape == (2, 16) and logits.shape == (2, 5)
    torch.testing.assert_close(module(x), logits)
    torch.testing.assert_close(module.out(z), logits)
    lookup("moon").check(cfg, FlatModel(module))
    plain = build_model(config.ModelConfig(name="resnet18"), (3, 8, 8), 5)
    assert not hasattr(plain, "forward_rep")
    with pytest.raises(ConfigError, match="model.name = 'resnet18'"):
        lookup("moon").check(config.from_dict({"algorithm": {"name": "moon"}, "model": {"name": "resnet18"}}),
                             FlatModel(plain))
