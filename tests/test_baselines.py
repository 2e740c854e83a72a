"""The baselines' rules (FedProx, SCAFFOLD, FedDyn, FedNova, MOON) in-process.

Three kinds of check: the hooks alone against numbers worked out by hand on 2-element vectors (`upload`
drives start, a stand-in for training, and accumulate); whole runs through `fedmpi.simulate` on a tiny
linear regression against a float64 numpy re-implementation of the rules in docs/baselines.md that follows the
run's real client selection and batches (tests/regression_problem.py); and the equivalences with FedAvg. The state
of the stateful baselines goes through a real checkpoint file and continues bit-identically.
"""

import math

import numpy as np
import pytest
import regression_problem as rp
import torch
from conftest import VecModel, server_update
from torch import nn

import fedmpi
from fedmpi import config
from fedmpi.algorithms import ClientRun, build_algorithm, lookup
from fedmpi.algorithms.fednova import normalizer
from fedmpi.algorithms.moon import contrastive_loss
from fedmpi.core.errors import ConfigError
from fedmpi.core.flat import FlatModel
from fedmpi.data.dataset import Dataset
from fedmpi.io import checkpoint, resume
from fedmpi.mpi.local import LocalComm
from fedmpi.round.engine import upload_client
from fedmpi.round.experiment import Experiment
from fedmpi.run.api import MemoryLog
from fedmpi.run.launch import _loop

# --- the hooks alone, on hand-computed cases ------------------------------------------------------------


def upload(algo, x, clients, t=0):
    """Clients given as (cid, n_samples, steps, y): start, 'train' to y, the engine's upload into the sums
    (fedmpi.round.engine.upload_client) and server update (Server.apply); returns (the new x, the broadcast)."""
    down = torch.zeros(algo.down_vectors * algo.dim)
    algo.down_payload(x, down)
    acc = torch.zeros(algo.up_vectors * algo.dim + algo.up_scalars, dtype=torch.float64)
    model, weight = VecModel(algo.dim), 0.0
    for cid, n, steps, y in clients:
        run = ClientRun(cid, t, n, lr=algo.context.client.lr, steps=steps)
        algo.client_start(run, down, model)
        assert torch.equal(model.vec, x)
        model.vec.copy_(torch.tensor(y))
        weight += upload_client(algo, (), run, down, model, acc)
    return server_update(algo, x, acc, weight, t), down


def hand_cfg(name, server=None, **keys):
    return config.from_dict({"algorithm": {"name": name, **keys}, "partition": {"clients": 4},
                             "server": {"clients_per_round": 2, **(server or {})}, "client": {"lr": 0.5}})


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
    with pytest.raises(ConfigError, match="server.lr"):
        lookup("feddyn").check(hand_cfg("feddyn", server={"lr": 2.0}), VecModel(2))
    with pytest.raises(ConfigError, match="server.optimizer"):
        lookup("feddyn").check(hand_cfg("feddyn", server={"optimizer": "adam"}), VecModel(2))


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


def test_registry_builds_every_baseline_with_its_vector_counts():
    counts = {"fedprox": (1, 1, 0), "scaffold": (2, 2, 0), "feddyn": (1, 1, 0), "fednova": (1, 1, 1),
              "moon": (1, 1, 0)}
    for name, expected in counts.items():
        algo = build_algorithm(hand_cfg(name), dim=4, n_params=3)
        assert algo.name == name
        assert (algo.down_vectors, algo.up_vectors, algo.up_scalars) == expected


def test_scaffold_server_control_starts_at_zero_and_a_loaded_one_goes_down():
    algo = build_algorithm(hand_cfg("scaffold"), dim=4, n_params=3)
    assert np.array_equal(algo.server_state()["c"], np.zeros(3, dtype=np.float32))
    algo.load_server_state({"c": np.array([1.0, 2.0, 3.0], dtype=np.float32)})
    down = torch.full((8,), 9.0)
    algo.down_payload(torch.ones(4), down)
    # x, then c over the trainable part, then zero where the buffer's control would be
    assert down.tolist() == [1, 1, 1, 1, 1, 2, 3, 0]


# --- whole runs (fedmpi.simulate) against the numpy reference ---------------------------------------------

ROUNDS = 3


def test_the_reference_follows_the_runs_selection_and_covers_every_pair():
    result = rp.simulate(rp.config("fedavg", rounds=ROUNDS))
    for t in range(ROUNDS):
        assert np.flatnonzero(result.clients["selected"][t]).tolist() == rp.selected(t)
    # The seed is chosen so that three rounds draw three different pairs: every client trains, twice.
    assert len({tuple(rp.selected(t)) for t in range(ROUNDS)}) == ROUNDS
    # With batch 2 and two epochs the clients of 3, 5 and 4 samples run 4, 6 and 4 steps: unequal.
    assert [rp.local_steps(c) for c in range(3)] == [4, 6, 4]


def fedprox_reference(mu, eta_g, rounds=ROUNDS, momentum=0.0, steps=None, lr=0.1):
    """FedProx (FedAvg at mu = 0): x + eta_g sum_i p_i (y_i - x), clients stepping with g + mu (w - x)."""
    x, out = rp.X0.copy(), []
    for t in range(rounds):
        clients = rp.selected(t)
        ys = [rp.local_sgd(x, t, c, rp.local_steps(c, steps=steps), lr, lambda w, a=x: mu * (w - a), momentum)
              for c in clients]
        x = x + eta_g * sum(p * (y - x) for p, y in zip(rp.weights(clients), ys))
        out.append(x)
    return out


def test_fedavg_and_fedprox_runs_match_reference():
    for name, keys, mu in [("fedavg", {}, 0.0), ("fedprox", {"mu": 0.5}, 0.5)]:
        cfg = rp.config(name, server={"lr": 0.8}, **keys)
        got = rp.models_per_round(cfg, ROUNDS)
        for model, want in zip(got, fedprox_reference(mu, 0.8)):
            rp.assert_model(model, want)
    # The proximal term changes training: the comparison above can tell the two apart.
    assert not np.allclose(fedprox_reference(0.5, 0.8)[-1], fedprox_reference(0.0, 0.8)[-1], rtol=1e-3)


def test_logged_test_loss_is_the_reference_models_loss():
    result = rp.simulate(rp.config("fedprox", server={"lr": 0.8}, mu=0.5))
    want = [rp.held_out_loss(x) for x in fedprox_reference(0.5, 0.8)]
    np.testing.assert_allclose(result.metrics["test_loss"], want, rtol=1e-5)
    assert np.all(np.isnan(result.metrics["test_acc"]))     # regression outputs are no class scores


def assert_scaffold_state(result, c, c_i):
    exp = result.experiment
    np.testing.assert_allclose(exp.algo.server_state()["c"], c, rtol=1e-5, atol=1e-6)
    for cid in range(3):
        np.testing.assert_allclose(exp.client_state(cid)["c_i"], c_i[cid], rtol=1e-5, atol=1e-6)


def test_scaffold_run_matches_reference():
    cfg = rp.config("scaffold")
    want, c, c_i = rp.scaffold_reference()
    for model, ref in zip(rp.models_per_round(cfg, ROUNDS), want):
        rp.assert_model(model, ref)
    assert_scaffold_state(rp.simulate(cfg), c, c_i)


def test_feddyn_run_matches_reference():
    alpha = 0.3
    x, h, g, want = rp.X0.copy(), np.zeros(3), {k: np.zeros(3) for k in range(3)}, []
    for t in range(ROUNDS):
        clients, ys = rp.selected(t), {}
        for cid in clients:
            ys[cid] = rp.local_sgd(x, t, cid, rp.local_steps(cid), 0.1,
                                   lambda w, cid=cid, start=x: -g[cid] + alpha * (w - start))
            g[cid] = g[cid] - alpha * (ys[cid] - x)
        h = h - alpha / rp.N_CLIENTS * sum(ys[c] - x for c in clients)
        x = np.mean([ys[c] for c in clients], axis=0) - h / alpha
        want.append(x)
    cfg = rp.config("feddyn", alpha=alpha)
    for model, ref in zip(rp.models_per_round(cfg, ROUNDS), want):
        rp.assert_model(model, ref, rtol=1e-4, atol=1e-5)   # h / alpha amplifies float32 rounding a little
    result = rp.simulate(cfg)
    np.testing.assert_allclose(result.experiment.algo.server_state()["h"], h, rtol=1e-5, atol=1e-6)
    for cid in range(3):
        np.testing.assert_allclose(result.experiment.client_state(cid)["g_i"], g[cid], rtol=1e-5, atol=1e-6)


def fednova_reference(momentum, eta_g, rounds=ROUNDS, steps=None):
    x, out = rp.X0.copy(), []
    for t in range(rounds):
        clients = rp.selected(t)
        p = rp.weights(clients)
        k = [rp.local_steps(c, steps=steps) for c in clients]
        a = [normalizer(k_i, momentum) for k_i in k]
        d = [(x - rp.local_sgd(x, t, c, k_i, 0.1, momentum=momentum)) / a_i for c, k_i, a_i in zip(clients, k, a)]
        x = x - eta_g * np.dot(p, a) * sum(p_i * d_i for p_i, d_i in zip(p, d))
        out.append(x)
    return out


@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_fednova_run_matches_reference(momentum):
    cfg = rp.config("fednova", momentum=momentum, server={"lr": 0.9})
    for model, want in zip(rp.models_per_round(cfg, ROUNDS), fednova_reference(momentum, 0.9)):
        rp.assert_model(model, want)


class SlopeModel(rp.Regression):
    """Outputs <slope, (w1, w2, b)> for every sample: with the loss `mean(outputs)` every step sees the same
    gradient `slope`, so local SGD's total move is lr * a_i * slope whatever the data and the batches."""

    slope = torch.tensor([1.0, -2.0, 0.5])

    def forward(self, x):
        params = torch.cat([self.lin.weight.reshape(-1), self.lin.bias])
        return (params @ self.slope).expand(len(x))


def test_fednova_with_momentum_undoes_the_extra_steps():
    cfg = rp.config("fednova", rounds=1, momentum=0.9, lr=0.1)
    result = fedmpi.simulate(cfg, dataset=rp.dataset(), model=SlopeModel(), parts=rp.PARTS,
                                loss=lambda out, y: out.mean())
    # y_i - x = -lr a_i slope, so d_i = lr slope whatever tau_i: x + (sum_i p_i a_i) * (-lr slope).
    clients = rp.selected(0)
    tau_eff = np.dot(rp.weights(clients), [normalizer(rp.local_steps(c), 0.9) for c in clients])
    assert len({rp.local_steps(c) for c in clients}) == 2       # unequal steps, else FedAvg would pass too
    rp.assert_model(result.model, rp.X0 - tau_eff * 0.1 * SlopeModel.slope.double().numpy())


# --- equivalences with FedAvg ---------------------------------------------------------------------------

def test_fedprox_with_mu_zero_is_fedavg():
    got = rp.models_per_round(rp.config("fedprox", mu=0.0, server={"lr": 0.7}), ROUNDS)
    want = rp.models_per_round(rp.config("fedavg", server={"lr": 0.7}), ROUNDS)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_fednova_with_equal_steps_is_fedavg(momentum):
    equal = {"momentum": momentum, "steps": 4, "server": {"lr": 0.7}}
    got = rp.models_per_round(rp.config("fednova", **equal), ROUNDS)
    for g, w in zip(got, rp.models_per_round(rp.config("fedavg", **equal), ROUNDS)):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)
    # With unequal steps (two epochs: 4, 6, 4) the two differ in round 0: the comparison above can fail.
    unequal = {"server": {"lr": 0.7}}
    assert not np.allclose(rp.simulate(rp.config("fednova", **unequal), rounds=1).model,
                           rp.simulate(rp.config("fedavg", **unequal), rounds=1).model, rtol=1e-4)


def test_scaffold_first_round_with_zero_controls_is_fedavg():
    got = rp.models_per_round(rp.config("scaffold", server={"lr": 0.7}), 2)
    want = rp.models_per_round(rp.config("fedavg", server={"lr": 0.7}), 2)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-7)
    assert not np.allclose(got[1], want[1], rtol=1e-4)     # the controls act from round 1 on


# --- MOON on a tiny classifier with a projection head ---------------------------------------------------------

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


def classes():
    """rp.X with three classes: the classifier's data set (its own test set)."""
    x = rp.X.astype(np.float32)
    return Dataset("tiny-classes", x, LABELS, x, LABELS, num_classes=3)


def classifier_cfg(name, rounds=ROUNDS, momentum=0.0, **keys):
    cfg = rp.config(name, rounds=rounds, momentum=momentum, client={"vectorize": "off"}, **keys)
    return config.from_dict(cfg)


def simulate_classifier(cfg, seed=0, **kwargs):
    return fedmpi.simulate(cfg, dataset=classes(), model=TinyRepNet(seed), parts=rp.PARTS, **kwargs)


def classifier_hooks(cfg, seed=0):
    flat = FlatModel(TinyRepNet(seed))
    return build_algorithm(cfg, flat.dim, flat.n_params), flat, flat.vec.clone()


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


def test_moon_contrastive_loss_by_hand():
    z = torch.tensor([[1.0, 0.0]])
    z_glob, z_prev = torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0, 3.0]])
    # sims 1 and 0, tau 0.5: -log(e^2 / (e^2 + e^0)) = log(1 + e^-2)
    assert contrastive_loss(z, z_glob, z_prev, 0.5).item() == pytest.approx(math.log1p(math.exp(-2.0)), rel=1e-6)


def test_moon_loss_uses_global_and_previous_models():
    mu, tau = 0.7, 0.5
    algo, flat, x = classifier_hooks(classifier_cfg("moon", mu=mu, tau=tau))
    prev = FlatModel(TinyRepNet(seed=1)).vec.clone()
    algo.load_client_state(0, {"prev": prev.numpy()})
    local = FlatModel(TinyRepNet(seed=2)).vec.clone()
    down = x.clone()
    algo.client_start(ClientRun(0, 0, 3), down, flat)
    assert torch.equal(flat.vec, x)
    flat.load(local)                    # as if part-way through local training
    xb = rp.X[:5]
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
    algo, flat, x = classifier_hooks(classifier_cfg("moon", mu=mu))
    algo.client_start(ClientRun(1, 0, 5), x.clone(), flat)
    xb, yb = torch.tensor(rp.X[:4], dtype=torch.float32), torch.tensor(LABELS[:4])
    ce = nn.functional.cross_entropy(flat.module(xb), yb)
    assert algo.loss_fn(xb, yb).item() == pytest.approx(ce.item() + mu * math.log(2), rel=1e-6)


def test_moon_keeps_each_clients_trained_model_as_its_previous_and_builds_its_frozen_models_once():
    algo, flat, x = classifier_hooks(classifier_cfg("moon"))
    assert algo.client_state(0) == {}
    down = x.clone()
    algo.client_start(ClientRun(0, 0, 3), down, flat)
    nets = (algo._global_net, algo._prev_net)
    trained = FlatModel(TinyRepNet(seed=3)).vec.clone()
    flat.load(trained)                  # the client's trained model
    algo.accumulate(ClientRun(0, 0, 3), down, flat, torch.zeros(algo.dim, dtype=torch.float64))
    np.testing.assert_array_equal(algo.client_state(0)["prev"], trained.numpy())
    # The next round's previous model is that vector, the global model the new broadcast; the frozen
    # copies are the same objects (built once per rank, loaded in place).
    new_x = FlatModel(TinyRepNet(seed=4)).vec.clone()
    algo.client_start(ClientRun(0, 1, 3), new_x, flat)
    assert torch.equal(algo._prev_net.vec, trained) and torch.equal(algo._global_net.vec, new_x)
    assert (algo._global_net, algo._prev_net) == nets


def test_moon_with_mu_zero_is_fedavg_and_with_mu_differs():
    fedavg = simulate_classifier(classifier_cfg("fedavg")).model
    np.testing.assert_allclose(simulate_classifier(classifier_cfg("moon", mu=0.0)).model, fedavg,
                               rtol=1e-6, atol=1e-7)
    assert not np.array_equal(fedavg, FlatModel(TinyRepNet(0)).vec.numpy())     # it trained
    assert not np.allclose(simulate_classifier(classifier_cfg("moon", mu=5.0)).model, fedavg, rtol=1e-4)


def test_moon_needs_a_projection_head():
    cfg = config.from_dict(rp.config("moon"))
    with pytest.raises(ConfigError, match="model.projection"):
        lookup("moon").check(cfg, FlatModel(rp.Regression()))
    with pytest.raises(ConfigError, match="model.projection"):
        rp.simulate(cfg)


# --- state through a checkpoint file: the continuation is bit-identical ----------------------------------------

def continue_from_checkpoint(cfg, path, round_, model):
    """A fresh Experiment (another initial model) loads the checkpoint and runs the remaining rounds, as
    `fedmpi run --resume` does at -n 1; returns (experiment, rows of /metrics)."""
    exp = Experiment(cfg, LocalComm(), dataset=classes(), model=model, parts=rp.PARTS)
    first_round = resume.load_into(exp, resume.ResumePoint(round_, str(path)))
    log = MemoryLog()
    _loop(cfg, exp.comm, exp, log, checkpoints=False, first_round=first_round)
    return exp, log.metrics()


@pytest.mark.parametrize("name,keys", [("fedprox", {"mu": 0.1}), ("scaffold", {}), ("feddyn", {"alpha": 0.1}),
                                       ("fednova", {}), ("moon", {"mu": 1.0})])
def test_state_through_a_checkpoint_continues_bit_identically(tmp_path, name, keys):
    cfg = classifier_cfg(name, momentum=0.5, **keys)
    cfg = config.from_dict({**cfg.to_dict(), "out": str(tmp_path)})
    whole = simulate_classifier(cfg)
    first = simulate_classifier(cfg, rounds=1)
    path = checkpoint.save(first.experiment, 1, wall_s=0.0)
    exp, metrics = continue_from_checkpoint(cfg, path, 1, TinyRepNet(seed=5))

    assert np.array_equal(exp.global_model(), whole.model)
    for metric in ("train_loss", "test_loss", "test_acc"):
        assert np.array_equal(metrics[metric], whole.metrics[metric][1:]), metric
    a, b = whole.experiment, exp
    for cid in range(rp.N_CLIENTS):
        sa, sb = a.client_state(cid), b.client_state(cid)
        assert sa.keys() == sb.keys() and all(np.array_equal(sa[k], sb[k]) for k in sa)
    server_a, server_b = a.algo.server_state(), b.algo.server_state()
    assert server_a.keys() == server_b.keys() and all(np.array_equal(server_a[k], server_b[k]) for k in server_a)


@pytest.mark.parametrize("name,key", [("scaffold", "c_i"), ("feddyn", "g_i"), ("moon", "prev")])
def test_stateful_baselines_keep_per_client_state_and_forget_it_on_empty_load(name, key):
    exp = simulate_classifier(classifier_cfg(name), rounds=1).experiment
    trained, untouched = rp.selected(0), ({0, 1, 2} - set(rp.selected(0))).pop()
    for cid in trained:
        state = exp.algo.client_state(cid)
        assert set(state) == {key} and state[key].dtype == np.float32
    assert exp.algo.client_state(untouched) == {}
    exp.algo.load_client_state(trained[0], {})
    assert exp.algo.client_state(trained[0]) == {}
