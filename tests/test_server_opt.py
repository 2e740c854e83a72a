"""Server optimizers (`server.optimizer`, fedmpi/round/server_opt.py): hand-computed steps of sgd, avgm, adam,
yogi and adagrad over three rounds on a 3-entry vector (two trainable entries and a buffer, which takes the
plain average); whole runs through `fedmpi.simulate` against a float64 numpy reference; `adam` with fedavg,
fedprox, scaffold and fsl; and the moments through a checkpoint under mpiexec -n 3 (the shared launch of
tests/extension_runs.py).
"""

from __future__ import annotations

import extension_runs as ext
import h5py
import numpy as np
import pytest
import regression_problem as rp
import torch
from conftest import read_global, read_metrics, small_config

import fedmpi
from fedmpi.algorithms.base import weighted_mean_update
from fedmpi.config import ServerConfig
from fedmpi.round.server_opt import OPTIMIZERS, build_optimizer, mean_sgd_step

# --- hand-computed steps ----------------------------------------------------------------------------------

# x = (x1, x2 | buffer); three rounds' updates (float64, as the reduction delivers them).
X_START = np.array([1.0, 2.0, 3.0], dtype=np.float32)
UPDATES = [np.array([1.0, -1.0, 0.5]), np.array([3.0, 1.0, -1.0]), np.array([0.5, 2.0, 0.25])]
LR, MOMENTUM, BETAS, TAU = 0.5, 0.5, (0.5, 0.75), 1.0


def server_config(name):
    """ServerConfig with LR and the keys `name` reads set to this file's values (others are refused)."""
    uses = OPTIMIZERS[name].uses
    keys = {"momentum": MOMENTUM, "tau": TAU}
    kwargs = {k: v for k, v in keys.items() if k in uses}
    if "betas[0]" in uses:
        kwargs["betas"] = (BETAS[0], BETAS[1] if "betas[1]" in uses else ServerConfig.betas[1])
    return ServerConfig(optimizer=name, lr=LR, **kwargs)


def run_steps(name):
    """[(x after the step, optimizer state)] for the three UPDATES."""
    opt = build_optimizer(server_config(name), 3, 2)
    x, out = torch.tensor(X_START), []
    for u in UPDATES:
        x = opt.step(x, torch.tensor(u), LR)
        assert x.dtype == torch.float32
        out.append((x.numpy().copy(), opt.state()))
    return out


def test_every_registered_optimizer_is_tested_here():
    assert set(OPTIMIZERS) == {"sgd", "avgm", "adam", "yogi", "adagrad"}


def test_sgd_by_hand():
    # x + 0.5 u over the whole vector (buffer included, as fedmpi always has): no state.
    expected = [[1.5, 1.5, 3.25], [3.0, 2.0, 2.75], [3.25, 3.0, 2.875]]
    for (x, state), want in zip(run_steps("sgd"), expected):
        np.testing.assert_allclose(x, want, rtol=1e-7)
        assert state == {}


def test_sgd_with_lr_one_is_x_plus_the_update():
    opt = build_optimizer(ServerConfig(optimizer="sgd", lr=1.0), 3, 2)
    x, u = torch.tensor(X_START), torch.tensor(UPDATES[1])
    expected = x + u.float()
    assert torch.equal(opt.step(x, u, 1.0), expected)


@pytest.mark.parametrize("lr", [1.0, 0.7, 1 / 3])
@pytest.mark.parametrize("n, block", [(1, 4), (1000, 64), (1000, 999), (70_001, 1 << 16)])
def test_the_fused_mean_step_is_the_mean_then_sgd_bit_for_bit(n, block, lr):
    """mean_sgd_step (FedAvg's mean and server SGD in one blocked pass) against weighted_mean_update and
    Sgd.step, on sums of every sign and scale and weights that round (3 and 7 sixths do not divide evenly)."""
    g = torch.Generator().manual_seed(n)
    x0 = torch.randn(n, generator=g) * 10.0 ** torch.randint(-6, 6, (n,), generator=g)
    sums = torch.randn(n, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(-8, 4, (n,), generator=g)
    for weight in (3.0, 7 / 6, 50.0):
        want = build_optimizer(ServerConfig(optimizer="sgd", lr=lr), n, n).step(
            x0.clone(), weighted_mean_update(sums, weight, n), lr)
        got = mean_sgd_step(x0.clone(), sums, weight, lr, block=block)
        assert torch.equal(got, want)


@pytest.mark.parametrize("algorithm, server, fused", [
    ({"name": "fedavg"}, {"lr": 0.7}, True), ({"name": "fedprox", "mu": 0.01}, {}, True),
    ({"name": "scaffold"}, {}, False), ({"name": "fedavg"}, {"optimizer": "avgm", "momentum": 0.5}, True),
    ({"name": "fedper"}, {}, False)])
def test_fedavgs_server_step_takes_the_mean_in_the_optimizer_with_the_same_result(algorithm, server, fused, tmp_path,
                                                                                    monkeypatch):
    """ServerOptimizer.step_on_mean where the algorithm keeps FedAvg's aggregate and server step (not SCAFFOLD,
    which aggregates its own; not FedPer, whose personal entries stay); the model is the one that aggregate
    then step give, bit for bit, under SGD's fused pass and under another rule's default."""
    from fedmpi.algorithms.fedavg import FedAvg

    cfg = small_config(tmp_path, rounds=3, algorithm=algorithm, server={"clients_per_round": 5, **server},
                       runtime={"threads": 1, "progress": "off"}, model={"name": "mlp"})
    run = fedmpi.simulate(cfg)
    assert run.experiment.algo.update_is_the_mean == fused
    if fused:
        assert run.experiment.algo._mean is None    # aggregate was never called: the optimizer took the mean
        monkeypatch.setattr(FedAvg, "update_is_the_mean", False)     # aggregate, then the optimizer's step
        unfused = fedmpi.simulate(cfg)
        assert unfused.experiment.algo._mean is not None
        assert np.array_equal(run.model, unfused.model)


def test_avgm_by_hand():
    # beta 0.5: m1 = (1, -1); m2 = 0.5 m1 + (3, 1) = (3.5, 0.5); m3 = 0.5 m2 + (0.5, 2) = (2.25, 2.25).
    # x += 0.5 m on (x1, x2); the buffer takes the plain average: 3 + 0.5 - 1 + 0.25.
    expected_m = [[1.0, -1.0], [3.5, 0.5], [2.25, 2.25]]
    expected_x = [[1.5, 1.5, 3.5], [3.25, 1.75, 2.5], [4.375, 2.875, 2.75]]
    for (x, state), m, want in zip(run_steps("avgm"), expected_m, expected_x):
        assert state["m"].dtype == np.float64
        np.testing.assert_array_equal(state["m"], m)
        np.testing.assert_allclose(x, want, rtol=1e-7)


# b1 = 0.5: m1 = 0.5 (1, -1) = (0.5, -0.5); m2 = 0.5 m1 + 0.5 (3, 1) = (1.75, 0.25);
# m3 = 0.5 m2 + 0.5 (0.5, 2) = (1.125, 1.125). v starts at tau^2 = 1; b2 = 0.75; u^2: (1, 1), (9, 1), (0.25, 4).
M = [[0.5, -0.5], [1.75, 0.25], [1.125, 1.125]]
V = {
    # v = 0.75 v + 0.25 u^2: (1, 1); (0.75 + 2.25, 0.75 + 0.25) = (3, 1); (2.25 + 0.0625, 0.75 + 1) = (2.3125, 1.75)
    "adam": [[1.0, 1.0], [3.0, 1.0], [2.3125, 1.75]],
    # v = v - 0.25 u^2 sign(v - u^2): sign 0 keeps (1, 1); signs (-1, 0): (1 + 2.25, 1) = (3.25, 1);
    # signs (+1, -1): (3.25 - 0.0625, 1 + 1) = (3.1875, 2)
    "yogi": [[1.0, 1.0], [3.25, 1.0], [3.1875, 2.0]],
    # v = v + u^2: (2, 2), (11, 3), (11.25, 7)
    "adagrad": [[2.0, 2.0], [11.0, 3.0], [11.25, 7.0]],
}


@pytest.mark.parametrize("name", list(V))
def test_adaptive_optimizers_by_hand(name):
    x = X_START.astype(np.float64)
    for (got, state), m, v, u in zip(run_steps(name), M, V[name], UPDATES):
        assert state["m"].dtype == state["v"].dtype == np.float64
        np.testing.assert_array_equal(state["m"], m)
        np.testing.assert_array_equal(state["v"], v)
        # x + eta m / (sqrt(v) + tau) on (x1, x2); the buffer takes the plain average x + u.
        x = np.concatenate([x[:2] + LR * np.array(m) / (np.sqrt(v) + TAU), [x[2] + u[2]]])
        np.testing.assert_allclose(got, x, rtol=1e-6)


def test_moments_round_trip_and_start_fresh():
    opt = build_optimizer(ServerConfig(optimizer="adam", lr=LR, betas=BETAS, tau=TAU), 3, 2)
    np.testing.assert_array_equal(opt.state()["v"], [TAU ** 2] * 2)      # declared initial values before use
    np.testing.assert_array_equal(opt.state()["m"], [0.0, 0.0])
    x = opt.step(torch.tensor(X_START), torch.tensor(UPDATES[0]), LR)
    saved = {k: np.array(v) for k, v in opt.state().items()}
    again = build_optimizer(ServerConfig(optimizer="adam", lr=LR, betas=BETAS, tau=TAU), 3, 2)
    again.load_state(saved)
    u = torch.tensor(UPDATES[1])
    assert torch.equal(again.step(x.clone(), u, LR), opt.step(x.clone(), u, LR))


# --- whole runs (fedmpi.simulate) against a numpy reference --------------------------------------------------

def fedavg_with(optimizer, rounds=3, lr=1.0, beta=0.9, betas=(0.9, 0.99), tau=1e-3):
    """FedAvg's update u = sum_i p_i (y_i - x) applied by `optimizer` (Reddi et al., "Adaptive Federated
    Optimization")."""
    x, m, v = rp.X0.copy(), np.zeros(3), np.full(3, tau ** 2)
    for t in range(rounds):
        clients = rp.selected(t)
        ys = [rp.local_sgd(x, t, c, rp.local_steps(c), 0.1) for c in clients]
        u = sum(p * (y - x) for p, y in zip(rp.weights(clients), ys))
        if optimizer == "sgd":
            x = x + lr * u
            continue
        if optimizer == "avgm":
            m = beta * m + u
            x = x + lr * m
            continue
        m = betas[0] * m + (1 - betas[0]) * u
        if optimizer == "adam":
            v = betas[1] * v + (1 - betas[1]) * u * u
        elif optimizer == "yogi":
            v = v - (1 - betas[1]) * u * u * np.sign(v - u * u)
        else:
            v = v + u * u
        x = x + lr * m / (np.sqrt(v) + tau)
    return x


@pytest.mark.parametrize("name,lr", [("sgd", 1.0), ("sgd", 0.7), ("avgm", 0.5), ("adam", 0.05), ("yogi", 0.05),
                                     ("adagrad", 0.05)])
def test_fedavg_with_each_optimizer_matches_reference(name, lr):
    server = {"optimizer": name, "lr": lr, "momentum": 0.9, "betas": [0.9, 0.99], "tau": 1e-3}
    result = rp.simulate(rp.config("fedavg", server=server))
    rp.assert_model(result.model, fedavg_with(name, lr=lr), rtol=1e-4, atol=1e-5)
    assert np.all(result.metrics["server_lr"] == lr)


def test_sgd_with_lr_one_is_fedavgs_rule_and_the_default():
    default = rp.simulate(rp.config("fedavg"))
    explicit = rp.simulate(rp.config("fedavg", server={"optimizer": "sgd", "lr": 1.0}))
    assert np.array_equal(default.model, explicit.model)
    rp.assert_model(explicit.model, fedavg_with("sgd"))
    # adam's steps are not FedAvg's: the reference can tell the two apart
    assert not np.allclose(fedavg_with("adam", lr=0.05), fedavg_with("sgd"), rtol=1e-3)


# --- adam composes with the reduce-based algorithms ------------------------------------------------------------

COMPOSED = {
    "fedavg": {"name": "fedavg"},
    "fedprox": {"name": "fedprox", "mu": 0.01},
    "scaffold": {"name": "scaffold"},
    "fsl": {"name": "fsl", "gamma": 1.0},
}


@pytest.mark.parametrize("name", list(COMPOSED))
def test_adam_runs_with(name, tmp_path):
    cfg = small_config(tmp_path, rounds=4, algorithm=COMPOSED[name], server_data={"size": 50},
                       server={"clients_per_round": 5, "optimizer": "adam", "lr": 0.01},
                       runtime={"threads": 1, "progress": "off"})
    adam = fedmpi.simulate(cfg)
    sgd = fedmpi.simulate(cfg, **{"server.optimizer": "sgd", "server.lr": 1.0})
    assert np.all(np.isfinite(adam.metrics["test_loss"])) and np.all(np.isfinite(adam.model))
    acc = adam.metrics["test_acc"]
    assert acc[-1] > 0.5 and acc[-1] > acc[0]              # learning (chance is 0.1)
    assert not np.allclose(adam.model, sgd.model, rtol=1e-3)   # the optimizer did apply the update
    moments = adam.experiment.state_dict()["optimizer"]
    assert set(moments) == {"m", "v"} and np.any(moments["m"] != 0)


# --- moments through a checkpoint under mpiexec -n 3 -------------------------------------------------------------

@pytest.fixture(scope="module")
def runs(request):
    return ext.shared(request)


@pytest.mark.mpi
def test_adam_resumed_mid_way_is_bit_identical(runs):
    whole, attrs = read_metrics(runs["adam"])
    resumed, resumed_attrs = read_metrics(runs["adam-resumed"])
    assert attrs["status"] == resumed_attrs["status"] == "finished" and attrs["world_size"] == 3
    assert len(resumed["round"]) == ext.R
    for metric in ("test_acc", "test_loss", "train_loss", "server_lr"):
        assert np.array_equal(resumed[metric], whole[metric]), metric
    assert np.array_equal(read_global(runs["adam-resumed"]), read_global(runs["adam"]))
    assert whole["test_acc"][-1] > 0.5


@pytest.mark.mpi
def test_checkpoint_holds_the_moments(runs):
    with h5py.File(runs["adam-resumed"] / "ckpt" / f"ckpt-{ext.HALF}.h5", "r", locking=False) as f:
        n = f["global"].shape[0]          # the lr model has no buffers: every entry is trainable
        for name in ("m", "v"):
            moment = f["optimizer"][name][()]
            assert moment.dtype == np.float64 and moment.shape == (n,)
        assert np.any(f["optimizer/m"][()] != 0) and np.all(f["optimizer/v"][()] > 0)


@pytest.mark.mpi
def test_adam_at_three_ranks_equals_one(runs):
    result = fedmpi.simulate(runs["configs"]["adam"])
    np.testing.assert_allclose(result.model, read_global(runs["adam"]), rtol=1e-5, atol=1e-7)
