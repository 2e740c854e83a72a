"""The baselines' rules (FedProx, SCAFFOLD, FedDyn, FedNova, MOON) in-process, through the algorithm hooks.

Three kinds of check: server/client arithmetic against numbers worked out by hand on 2-element vectors;
whole rounds of local training on a tiny linear regression against a float64 numpy re-implementation of
ALGORITHMS.md; and the equivalences with FedAvg. `run_round` drives the hooks in the order the round
loop (`Experiment.train_clients` / `server_step`) calls them.
"""

import math

import numpy as np
import pytest
import torch
from conftest import VecModel, server_update
from torch import nn

from fedmpi import config
from fedmpi.algorithms import ClientRun, build_algorithm, lookup
from fedmpi.algorithms.fednova import normalizer
from fedmpi.algorithms.moon import contrastive_loss
from fedmpi.errors import ConfigError
from fedmpi.flat import FlatModel
from fedmpi.train import LocalTrainer, Schedule

# --- a tiny deterministic problem -------------------------------------------------------------------

# Client data of a 2-feature linear regression; clients hold 3, 5 and 4 samples.
X = np.array([[1.0, 0.0], [0.5, 2.0], [-1.0, 1.0],
              [2.0, 1.0], [0.0, -1.0], [1.5, 0.5], [-0.5, -2.0], [1.0, 1.0],
              [0.0, 1.0], [-2.0, 0.5], [1.0, -1.0], [0.5, 0.5]])
Y = np.array([1.0, -1.0, 0.5, 2.0, 0.0, 1.0, -1.5, 0.5, 1.0, -0.5, 0.25, 2.0])
PARTS = [np.arange(0, 3), np.arange(3, 8), np.arange(8, 12)]
X0 = np.array([0.2, -0.1, 0.05])        # initial (w1, w2, b)


class Regression(nn.Module):
    """y = w.x + b, with a float buffer so that the flat vector is longer than its trainable part."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 1)
        self.register_buffer("unused", torch.full((1,), 7.0))
        with torch.no_grad():
            self.lin.weight.copy_(torch.tensor(X0[None, :2]))
            self.lin.bias.fill_(X0[2])

    def forward(self, x):
        return self.lin(x).squeeze(-1)


class MseTrainer(LocalTrainer):
    """LocalTrainer with the loss 1/2 mean squared error, whose gradient numpy computes in one line."""

    def loss(self, xb, yb):
        return 0.5 * ((self.flat.module(xb) - yb) ** 2).mean()


def make_cfg(name, momentum=0.0, server_lr=1.0, lr=0.1, **keys):
    return config.from_dict({"algorithm": {"name": name, **keys}, "partition": {"clients": 3},
                             "server": {"clients_per_round": 2, "lr": server_lr},
                             "client": {"lr": lr, "momentum": momentum}})


def regression_setup(cfg):
    flat = FlatModel(Regression())
    trainer = MseTrainer(flat, cfg.client, torch.tensor(X, dtype=torch.float32), torch.tensor(Y, dtype=torch.float32))
    algo = build_algorithm(cfg, flat.dim, flat.n_params)
    return algo, flat, trainer, flat.vec.clone()


def run_round(algo, flat, trainer, x, clients, steps, t=0, parts=PARTS):
    """One round as the round loop runs it at -n 1, each client full-batch for `steps[cid]` steps."""
    down = torch.zeros(algo.down_vectors * algo.dim)
    algo.down_payload(x, down)
    acc = torch.zeros(algo.up_vectors * algo.dim + algo.up_scalars, dtype=torch.float64)
    weight = 0.0
    for cid in clients:
        idx = torch.as_tensor(parts[cid])
        run = ClientRun(cid, t, len(idx), lr=algo.cfg.client.lr)
        sched = Schedule(len(idx), steps[cid])
        algo.client_start(run, down, flat)
        trainer.train(idx, np.random.default_rng([t, cid]), sched, grad_hook=algo.grad_hook, loss_fn=algo.loss_fn)
        run.steps = sched.steps
        weight += algo.accumulate(run, down, flat, acc)
    return server_update(algo, x, acc, weight, t)


# --- numpy reference (float64) ----------------------------------------------------------------------

def mse_grad(theta, cid):
    xs, ys = X[PARTS[cid]], Y[PARTS[cid]]
    r = xs @ theta[:2] + theta[2] - ys
    return np.concatenate([xs.T @ r, [r.sum()]]) / len(ys)


def local_sgd(theta, cid, steps, lr, correction=lambda w: 0.0, momentum=0.0):
    """Full-batch SGD with torch's momentum rule and an extra gradient term `correction(w)`."""
    w, buf = theta.copy(), np.zeros_like(theta)
    for _ in range(steps):
        g = mse_grad(w, cid) + correction(w)
        buf = momentum * buf + g
        w = w - lr * buf
    return w


def sizes(clients):
    n = np.array([len(PARTS[c]) for c in clients], dtype=float)
    return n / n.sum()


def close(actual, expected_params, rtol=1e-5, atol=1e-6):
    """Compares a flat vector with the expected trainable part; the buffer must be untouched."""
    np.testing.assert_allclose(actual[:3].double().numpy(), expected_params, rtol=rtol, atol=atol)
    assert actual[3].item() == 7.0


def upload(algo, x, clients, t=0):
    """Clients given as (cid, n_samples, steps, y): start, 'train' to y, accumulate; returns the new x."""
    down = torch.zeros(algo.down_vectors * algo.dim)
    algo.down_payload(x, down)
    acc = torch.zeros(algo.up_vectors * algo.dim + algo.up_scalars, dtype=torch.float64)
    model, weight = VecModel(algo.dim), 0.0
    for cid, n, steps, y in clients:
        run = ClientRun(cid, t, n, lr=algo.cfg.client.lr, steps=steps)
        algo.client_start(run, down, model)
        assert torch.equal(model.vec, x)
        model.vec.copy_(torch.tensor(y))
        weight += algo.accumulate(run, down, model, acc)
    return server_update(algo, x, acc, weight, t), down


def hand_cfg(name, **keys):
    return config.from_dict({"algorithm": {"name": name, **keys}, "partition": {"clients": 4},
                             "server": {"clients_per_round": 2}, "client": {"lr": 0.5}})


# --- hand-computed cases ------------------------------------------------------------------------------

def test_fedprox_adds_mu_times_distance_to_the_global_model():
    algo = build_algorithm(hand_cfg("fedprox", mu=0.1), dim=2, n_params=2)
    down = torch.tensor([1.0, 1.0])
    algo.client_start(ClientRun(0, 0, 1), down, VecModel(2))
    grad = torch.tensor([1.0, 1.0])
    algo.grad_hook(torch.tensor([3.0, 0.0]), grad)
    # grad + 0.1 * ((3, 0) - (1, 1)) = (1.2, 0.9)
    torch.testing.assert_close(grad, torch.tensor([1.2, 0.9]))


def test_scaffold_controls_and_server_update_by_hand():
    algo = build_algorithm(hand_cfg("scaffold"), dim=2, n_params=2)
    assert (algo.down_vectors, algo.up_vectors) == (2, 2)
    x = torch.tensor([1.0, 1.0])
    # eta_l = 0.5. Client 0: 1 sample, 2 steps, y - x = (1, -1): c_0 = 0 - 0 - (1, -1) / (2 * 0.5) = (-1, 1).
    # Client 1: 3 samples, 1 step, y - x = (2, 2): c_1 = -(2, 2) / 0.5 = (-4, -4).
    new, down = upload(algo, x, [(0, 1, 2, [2.0, 0.0]), (1, 3, 1, [3.0, 3.0])])
    assert torch.equal(down, torch.tensor([1.0, 1.0, 0.0, 0.0]))
    # x + (1/4 (1, -1) + 3/4 (2, 2)) = (2.75, 2.25); c = (1/N) sum Delta c_i = ((-1, 1) + (-4, -4)) / 4.
    torch.testing.assert_close(new, torch.tensor([2.75, 2.25]))
    np.testing.assert_allclose(algo.server_state()["c"], [-1.25, -0.75])
    np.testing.assert_allclose(algo.client_state(0)["c_i"], [-1.0, 1.0])
    np.testing.assert_allclose(algo.client_state(1)["c_i"], [-4.0, -4.0])
    assert algo.client_state(2) == {}
    # Next round: x and c go down; client 0 steps with g - c_0 + c = g + (-0.25, -1.75).
    down = torch.zeros(4)
    algo.down_payload(new, down)
    torch.testing.assert_close(down, torch.tensor([2.75, 2.25, -1.25, -0.75]))
    algo.client_start(ClientRun(0, 1, 1), down, VecModel(2))
    grad = torch.zeros(2)
    algo.grad_hook(torch.zeros(2), grad)
    torch.testing.assert_close(grad, torch.tensor([-0.25, -1.75]))


def test_feddyn_state_and_server_update_by_hand():
    algo = build_algorithm(hand_cfg("feddyn", alpha=0.5), dim=2, n_params=2)
    x = torch.tensor([1.0, 1.0])
    # Deltas (1, 2) and (3, 0); weights are ignored: FedDyn averages participants unweighted.
    new, _ = upload(algo, x, [(0, 1, 1, [2.0, 3.0]), (1, 3, 1, [4.0, 1.0])])
    # h = 0 - 0.5/4 * (4, 2) = (-0.5, -0.25); x = mean y - h / alpha = (3, 2) + (1, 0.5).
    np.testing.assert_allclose(algo.server_state()["h"], [-0.5, -0.25])
    torch.testing.assert_close(new, torch.tensor([4.0, 2.5]))
    # g_0 = 0 - 0.5 (1, 2); g_1 = 0 - 0.5 (3, 0).
    np.testing.assert_allclose(algo.client_state(0)["g_i"], [-0.5, -1.0])
    np.testing.assert_allclose(algo.client_state(1)["g_i"], [-1.5, 0.0])
    # Next round, client 0 at w = (5, 5): gradient term -g_0 + 0.5 (w - (4, 2.5)) = (0.5, 1) + (0.5, 1.25).
    algo.client_start(ClientRun(0, 1, 1), new.clone(), VecModel(2))
    grad = torch.zeros(2)
    algo.grad_hook(torch.tensor([5.0, 5.0]), grad)
    torch.testing.assert_close(grad, torch.tensor([1.0, 2.25]))


def test_feddyn_refuses_a_server_step_size():
    cfg = make_cfg("feddyn", server_lr=2.0)
    with pytest.raises(ConfigError, match="server.lr"):
        lookup("feddyn").check(cfg, VecModel(2))
    with pytest.raises(ConfigError, match="server.optimizer"):
        lookup("feddyn").check(config.from_dict({"algorithm": "feddyn", "server": {"optimizer": "adam"}}), VecModel(2))


def test_fednova_normalizes_by_local_steps_by_hand():
    algo = build_algorithm(hand_cfg("fednova"), dim=2, n_params=2)
    assert algo.up_scalars == 1
    x = torch.tensor([0.0, 0.0])
    # Client 0: 1 sample, 2 steps, y = (2, 4) -> d_0 = -(1, 2); client 1: 3 samples, 4 steps, y = (4, 0)
    # -> d_1 = -(1, 0). p = (1/4, 3/4): tau_eff = 2/4 + 12/4 = 3.5, sum p d = -(1, 0.5).
    new, _ = upload(algo, x, [(0, 1, 2, [2.0, 4.0]), (1, 3, 4, [4.0, 0.0])])
    torch.testing.assert_close(new, torch.tensor([3.5, 1.75]))   # FedAvg would give (3.5, 1.0)


def test_fednova_momentum_normalizer():
    assert normalizer(5) == 5.0
    # tau = 3, rho = 0.5: gradient k moves w by (1 - rho^(3-k)) / (1 - rho): 1.75 + 1.5 + 1 = 4.25.
    assert normalizer(3, 0.5) == pytest.approx(4.25)
    assert normalizer(1, 0.9) == pytest.approx(1.0)


class ConstantGradientTrainer(LocalTrainer):
    """loss = <slope, w>: every step sees the same gradient, so local SGD's total move is lr * a_i * slope."""

    slope = torch.tensor([1.0, -2.0, 0.5])

    def loss(self, xb, yb):
        return torch.cat([p.reshape(-1) for p in self.flat.module.parameters()]) @ self.slope


def test_fednova_with_momentum_undoes_the_extra_steps():
    cfg = make_cfg("fednova", momentum=0.9, lr=0.1)
    algo, flat, _, x = regression_setup(cfg)
    trainer = ConstantGradientTrainer(flat, cfg.client, torch.tensor(X, dtype=torch.float32), torch.tensor(Y))
    new = run_round(algo, flat, trainer, x, [0, 1], steps={0: 2, 1: 7})
    # y_i - x = -lr a_i slope, so d_i = lr slope whatever tau_i: x + (p_0 a_0 + p_1 a_1) * (-lr slope).
    p = sizes([0, 1])
    tau_eff = p[0] * normalizer(2, 0.9) + p[1] * normalizer(7, 0.9)
    close(new, X0 - tau_eff * 0.1 * ConstantGradientTrainer.slope.double().numpy())


def test_moon_contrastive_loss_by_hand():
    z = torch.tensor([[1.0, 0.0]])
    z_glob, z_prev = torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0, 3.0]])
    # sims 1 and 0, tau 0.5: -log(e^2 / (e^2 + e^0)) = log(1 + e^-2)
    assert contrastive_loss(z, z_glob, z_prev, 0.5).item() == pytest.approx(math.log1p(math.exp(-2.0)), rel=1e-6)


# --- whole rounds of local training against the numpy reference --------------------------------------

def test_fedprox_rounds_match_reference():
    cfg = make_cfg("fedprox", mu=0.5, server_lr=0.8)
    algo, flat, trainer, x = regression_setup(cfg)
    ref = X0.copy()
    for t, clients in enumerate([[0, 1], [1, 2]]):
        x = run_round(algo, flat, trainer, x, clients, steps={0: 3, 1: 4, 2: 2}, t=t)
        anchor = ref.copy()
        ys = [local_sgd(anchor, c, {0: 3, 1: 4, 2: 2}[c], 0.1, lambda w, anchor=anchor: 0.5 * (w - anchor))
              for c in clients]
        ref = anchor + 0.8 * sum(p * (y - anchor) for p, y in zip(sizes(clients), ys))
        close(x, ref)


def test_scaffold_rounds_match_reference():
    cfg = make_cfg("scaffold", server_lr=1.0, lr=0.1)
    algo, flat, trainer, x = regression_setup(cfg)
    steps = {0: 3, 1: 5, 2: 2}
    ref, c, c_i = X0.copy(), np.zeros(3), {k: np.zeros(3) for k in range(3)}
    for t, clients in enumerate([[0, 1], [1, 2], [0, 2]]):
        x = run_round(algo, flat, trainer, x, clients, steps, t=t)
        start, deltas, dc = ref.copy(), [], []
        for cid in clients:
            y = local_sgd(start, cid, steps[cid], 0.1, lambda w, cid=cid, c=c: c - c_i[cid])
            new_ci = c_i[cid] - c + (start - y) / (steps[cid] * 0.1)
            deltas.append(y - start)
            dc.append(new_ci - c_i[cid])
            c_i[cid] = new_ci
        ref = start + sum(p * d for p, d in zip(sizes(clients), deltas))
        c = c + sum(dc) / 3
        close(x, ref)
        np.testing.assert_allclose(algo.server_state()["c"], c, rtol=1e-5, atol=1e-6)
    for cid in range(3):
        np.testing.assert_allclose(algo.client_state(cid)["c_i"], c_i[cid], rtol=1e-5, atol=1e-6)


def test_feddyn_rounds_match_reference():
    cfg = make_cfg("feddyn", alpha=0.3)
    algo, flat, trainer, x = regression_setup(cfg)
    steps = {0: 3, 1: 5, 2: 2}
    ref, h, g = X0.copy(), np.zeros(3), {k: np.zeros(3) for k in range(3)}
    for t, clients in enumerate([[0, 1], [1, 2], [0, 2]]):
        x = run_round(algo, flat, trainer, x, clients, steps, t=t)
        start = ref.copy()
        ys = {}
        for cid in clients:
            ys[cid] = local_sgd(start, cid, steps[cid], 0.1,
                                lambda w, cid=cid, start=start: -g[cid] + 0.3 * (w - start))
            g[cid] = g[cid] - 0.3 * (ys[cid] - start)
        h = h - 0.3 / 3 * sum(ys[c] - start for c in clients)
        ref = np.mean([ys[c] for c in clients], axis=0) - h / 0.3
        close(x, ref, rtol=1e-4, atol=1e-5)   # h / alpha amplifies float32 rounding a little
        np.testing.assert_allclose(algo.server_state()["h"], h, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_fednova_rounds_match_reference(momentum):
    cfg = make_cfg("fednova", momentum=momentum, server_lr=0.9)
    algo, flat, trainer, x = regression_setup(cfg)
    steps = {0: 2, 1: 6, 2: 3}
    ref = X0.copy()
    for t, clients in enumerate([[0, 1], [1, 2]]):
        x = run_round(algo, flat, trainer, x, clients, steps, t=t)
        start, p = ref.copy(), sizes(clients)
        a = [normalizer(steps[c], momentum) for c in clients]
        d = [(start - local_sgd(start, c, steps[c], 0.1, momentum=momentum)) / a_i for c, a_i in zip(clients, a)]
        ref = start - 0.9 * np.dot(p, a) * sum(p_i * d_i for p_i, d_i in zip(p, d))
        close(x, ref)


# --- equivalences with FedAvg -------------------------------------------------------------------------

def fedavg_rounds(rounds, steps, momentum=0.0):
    algo, flat, trainer, x = regression_setup(make_cfg("fedavg", momentum=momentum, server_lr=0.7))
    out = []
    for t, clients in enumerate(rounds):
        x = run_round(algo, flat, trainer, x, clients, steps, t=t)
        out.append(x.clone())
    return out


def baseline_rounds(cfg, rounds, steps):
    algo, flat, trainer, x = regression_setup(cfg)
    out = []
    for t, clients in enumerate(rounds):
        x = run_round(algo, flat, trainer, x, clients, steps, t=t)
        out.append(x.clone())
    return out


ROUNDS = [[0, 1], [1, 2], [0, 2]]
UNEQUAL = {0: 3, 1: 5, 2: 2}


def test_fedprox_with_mu_zero_is_fedavg():
    for got, want in zip(baseline_rounds(make_cfg("fedprox", mu=0.0, server_lr=0.7), ROUNDS, UNEQUAL),
                         fedavg_rounds(ROUNDS, UNEQUAL)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_fednova_with_equal_steps_is_fedavg(momentum):
    equal = {0: 4, 1: 4, 2: 4}
    got = baseline_rounds(make_cfg("fednova", momentum=momentum, server_lr=0.7), ROUNDS, equal)
    for g, w in zip(got, fedavg_rounds(ROUNDS, equal, momentum)):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-7)
    # With unequal steps the two differ: the comparison above can fail.
    assert not torch.allclose(baseline_rounds(make_cfg("fednova", server_lr=0.7), ROUNDS, UNEQUAL)[0],
                              fedavg_rounds(ROUNDS, UNEQUAL)[0], rtol=1e-4)


def test_scaffold_first_round_with_zero_controls_is_fedavg():
    got = baseline_rounds(make_cfg("scaffold", server_lr=0.7), ROUNDS, UNEQUAL)
    want = fedavg_rounds(ROUNDS, UNEQUAL)
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-7)
    assert not torch.allclose(got[1], want[1], rtol=1e-4)     # the controls act from round 1 on


# --- MOON -----------------------------------------------------------------------------------------------

class TinyRepNet(nn.Module):
    """A classifier with a projection head following the forward_rep convention: (z, logits)."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.body, self.proj, self.head = nn.Linear(2, 4), nn.Linear(4, 3), nn.Linear(3, 3)

    def forward_rep(self, x):
        z = self.proj(torch.relu(self.body(x)))
        return z, self.head(z)

    def forward(self, x):
        return self.forward_rep(x)[1]


LABELS = np.array([0, 1, 2, 1, 0, 2, 2, 1, 0, 0, 1, 2])


def classifier_setup(cfg, seed=0):
    flat = FlatModel(TinyRepNet(seed))
    trainer = LocalTrainer(flat, cfg.client, torch.tensor(X, dtype=torch.float32), torch.tensor(LABELS))
    algo = build_algorithm(cfg, flat.dim, flat.n_params)
    return algo, flat, trainer, flat.vec.clone()


def numpy_rep(vec, xb):
    """TinyRepNet's (z, logits) computed in numpy from a flat vector."""
    v = vec.double().numpy()
    shapes = [(4, 2), (4,), (3, 4), (3,), (3, 3), (3,)]
    parts, offset = [], 0
    for s in shapes:
        parts.append(v[offset:offset + math.prod(s)].reshape(s))
        offset += math.prod(s)
    w1, b1, w2, b2, w3, b3 = parts
    z = np.maximum(xb @ w1.T + b1, 0) @ w2.T + b2
    return z, z @ w3.T + b3


def test_moon_loss_uses_global_and_previous_models():
    mu, tau = 0.7, 0.5
    algo, flat, _, x = classifier_setup(make_cfg("moon", mu=mu, tau=tau))
    prev = FlatModel(TinyRepNet(seed=1)).vec.clone()
    algo.load_client_state(0, {"prev": prev.numpy()})
    local = FlatModel(TinyRepNet(seed=2)).vec.clone()
    down = x.clone()
    algo.client_start(ClientRun(0, 0, 3), down, flat)
    assert torch.equal(flat.vec, x)
    flat.load(local)                    # as if part-way through local training
    xb = X[:5]
    loss = algo.loss_fn(torch.tensor(xb, dtype=torch.float32), torch.tensor(LABELS[:5]))

    z, logits = numpy_rep(local, xb)
    z_glob, z_prev = numpy_rep(x, xb)[0], numpy_rep(prev, xb)[0]
    cos = lambda a, b: (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)  # noqa: E731
    e_glob, e_prev = np.exp(cos(z, z_glob) / tau), np.exp(cos(z, z_prev) / tau)
    l_con = np.mean(-np.log(e_glob / (e_glob + e_prev)))
    ce = np.mean(np.log(np.exp(logits).sum(1)) - logits[np.arange(5), LABELS[:5]])
    assert loss.item() == pytest.approx(ce + mu * l_con, rel=1e-5)
    loss.backward()                     # gradients reach the trained model only
    assert flat.check_grads_bound() and flat.grad.abs().sum() > 0
    assert all(p.grad is None or not p.grad.any() for p in algo._global_net.module.parameters())


def test_moon_client_without_previous_model_has_constant_contrastive_term():
    mu = 2.0
    algo, flat, _, x = classifier_setup(make_cfg("moon", mu=mu))
    algo.client_start(ClientRun(1, 0, 5), x.clone(), flat)
    xb, yb = torch.tensor(X[:4], dtype=torch.float32), torch.tensor(LABELS[:4])
    ce = nn.functional.cross_entropy(flat.module(xb), yb)
    assert algo.loss_fn(xb, yb).item() == pytest.approx(ce.item() + mu * math.log(2), rel=1e-6)


def test_moon_keeps_each_clients_trained_model_as_its_previous():
    cfg = make_cfg("moon")
    algo, flat, trainer, x = classifier_setup(cfg)
    assert algo.client_state(0) == {}
    run_round(algo, flat, trainer, x, [0], steps={0: 2})
    trained = flat.vec.clone()
    np.testing.assert_array_equal(algo.client_state(0)["prev"], trained.numpy())
    # The next round's previous model is that vector, the global model is the new x.
    algo.client_start(ClientRun(0, 1, 3), x.clone(), flat)
    assert torch.equal(algo._prev_net.vec, trained) and torch.equal(algo._global_net.vec, x)


def test_moon_frozen_models_are_built_once_per_rank():
    algo, flat, trainer, x = classifier_setup(make_cfg("moon"))
    run_round(algo, flat, trainer, x, [0, 1, 2], steps={0: 1, 1: 1, 2: 1})
    nets = (algo._global_net, algo._prev_net)
    run_round(algo, flat, trainer, x, [0, 1, 2], steps={0: 1, 1: 1, 2: 1}, t=1)
    assert (algo._global_net, algo._prev_net) == nets


def test_moon_with_mu_zero_is_fedavg():
    steps = {0: 3, 1: 2, 2: 4}
    results = {}
    for name, keys in [("fedavg", {}), ("moon", {"mu": 0.0})]:
        algo, flat, trainer, x = classifier_setup(make_cfg(name, **keys))
        for t, clients in enumerate(ROUNDS):
            x = run_round(algo, flat, trainer, x, clients, steps, t=t)
        results[name] = x
    torch.testing.assert_close(results["moon"], results["fedavg"], rtol=1e-6, atol=1e-7)
    assert not torch.equal(results["fedavg"], classifier_setup(make_cfg("fedavg"))[3])


def test_moon_with_mu_changes_training():
    steps = {0: 3, 1: 2, 2: 4}
    results = {}
    for mu in (0.0, 5.0):
        algo, flat, trainer, x = classifier_setup(make_cfg("moon", mu=mu))
        for t, clients in enumerate(ROUNDS):
            x = run_round(algo, flat, trainer, x, clients, steps, t=t)
        results[mu] = x
    assert not torch.allclose(results[0.0], results[5.0], rtol=1e-4)


def test_moon_needs_a_projection_head():
    cfg = make_cfg("moon")
    _, flat, _, _ = regression_setup(cfg)
    with pytest.raises(ConfigError, match="model.projection"):
        lookup("moon").check(cfg, flat)


# --- checkpoint state: numpy round trip gives bit-identical continuation --------------------------------

@pytest.mark.parametrize("name,keys", [("fedprox", {"mu": 0.1}), ("scaffold", {}), ("feddyn", {"alpha": 0.1}),
                                       ("fednova", {}), ("moon", {"mu": 1.0})])
def test_state_round_trip_continues_bit_identically(name, keys):
    cfg = make_cfg(name, momentum=0.5, **keys)
    steps = {0: 3, 1: 2, 2: 4}
    algo, flat, trainer, x = classifier_setup(cfg)
    x = run_round(algo, flat, trainer, x, [0, 1], steps, t=0)

    # What a checkpoint holds: numpy arrays only (copied, as a file would give them back).
    server = {k: np.array(v) for k, v in algo.server_state().items()}
    clients = {cid: {k: np.array(v) for k, v in algo.client_state(cid).items()} for cid in range(3)}
    for state in [server, *clients.values()]:
        assert all(isinstance(v, np.ndarray) for v in state.values())
    resumed, flat2, trainer2, _ = classifier_setup(cfg, seed=5)   # a new process, other initial weights
    resumed.load_server_state(server)
    for cid, state in clients.items():
        resumed.load_client_state(cid, state)
    x2 = torch.from_numpy(x.numpy().copy())

    for t, clients_t in [(1, [1, 2]), (2, [0, 2])]:
        x = run_round(algo, flat, trainer, x, clients_t, steps, t=t)
        x2 = run_round(resumed, flat2, trainer2, x2, clients_t, steps, t=t)
        assert torch.equal(x, x2)
    for cid in range(3):
        a, b = algo.client_state(cid), resumed.client_state(cid)
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert all(np.array_equal(v, resumed.server_state()[k]) for k, v in algo.server_state().items())


@pytest.mark.parametrize("name,key", [("scaffold", "c_i"), ("feddyn", "g_i"), ("moon", "prev")])
def test_stateful_baselines_keep_per_client_state_and_forget_it_on_empty_load(name, key):
    algo, flat, trainer, x = classifier_setup(make_cfg(name))
    run_round(algo, flat, trainer, x, [0, 1], {0: 2, 1: 2})
    state = algo.client_state(1)
    assert set(state) == {key} and state[key].dtype == np.float32 and algo.client_state(2) == {}
    algo.load_client_state(1, {})
    assert algo.client_state(1) == {}


def test_registry_builds_every_baseline_with_its_vector_counts():
    counts = {"fedprox": (1, 1, 0), "scaffold": (2, 2, 0), "feddyn": (1, 1, 0), "fednova": (1, 1, 1),
              "moon": (1, 1, 0)}
    for name, expected in counts.items():
        algo = build_algorithm(make_cfg(name), dim=4, n_params=3)
        assert algo.name == name
        assert (algo.down_vectors, algo.up_vectors, algo.up_scalars) == expected


def test_scaffold_server_control_starts_at_zero_and_a_loaded_one_goes_down():
    algo = build_algorithm(make_cfg("scaffold"), dim=4, n_params=3)
    assert np.array_equal(algo.server_state()["c"], np.zeros(3, dtype=np.float32))
    algo.load_server_state({"c": np.array([1.0, 2.0, 3.0], dtype=np.float32)})
    down = torch.full((8,), 9.0)
    algo.down_payload(torch.ones(4), down)
    # x, then c over the trainable part, then zero where the buffer's control would be
    assert down.tolist() == [1, 1, 1, 1, 1, 2, 3, 0]
