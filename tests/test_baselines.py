"""The baselines' rules (FedProx, SCAFFOLD, FedDyn, FedNova, MOON) in-process.

Three kinds of check: the hooks alone against numbers worked out by hand on 2-element vectors (`upload`
drives start, a stand-in for training, and accumulate); whole runs through `fedmpi.simulate` on a tiny
linear regression against a float64 numpy re-implementation of the rules in docs/explanation/baselines.md that follows
the run's real client selection and batches (tests/regression_problem.py); and the equivalences with FedAvg. MOON
on a tiny classifier, and the stateful baselines' state through a real checkpoint file, are
tests/test_baselines_classifier.py.
"""


import numpy as np
import pytest
import regression_problem as rp
import torch
import transport_support as ts
from conftest import VecModel, server_update

import fedmpi
from fedmpi import config
from fedmpi.algorithms import ClientRun, build_algorithm, lookup
from fedmpi.algorithms.fednova import normalizer
from fedmpi.core.errors import ConfigError
from fedmpi.round.observers import ClientDrift
from fedmpi.round.protocols import Reduce

# --- the hooks alone, on hand-computed cases ------------------------------------------------------------


def upload(algo, x, clients, t=0):
    """Clients given as (cid, n_samples, steps, y): start, 'train' to y, the REDUCE transport's local part and
    combination (fedmpi.round.protocols.Reduce, on LocalComm) and server update (Server.apply); returns (the new
    x, the broadcast)."""
    down = torch.zeros(algo.down_vectors * algo.dim)
    algo.down_payload(x, down)
    model = VecModel(algo.dim)
    sizes = [0] * (max(c for c, *_ in clients) + 1)
    for cid, n, *_ in clients:
        sizes[cid] = n
    wire = ts.buffers(algo, len(sizes))
    transport = Reduce(algo, ts.host(model, sizes), wire, ts.path(algo=algo), ClientDrift(len(sizes), False))
    round_ = ts.round_input(t, [c for c, *_ in clients], down)
    wire.start_round(round_.plan.selected)

    def start(run):
        algo.client_start(run, down, model)
        assert torch.equal(model.vec, x)

    local = transport.local(round_, ts.trained(model, down, t, clients, lr=algo.context.client.lr, start=start))
    combined = transport.combine(wire.comm, round_, local)
    return server_update(algo, x, combined.sums, combined.weight, t), down


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


@pytest.mark.parametrize("name, momentum", [("fednova", 0.0), ("fednova", 0.5), ("fedavg", 0.0)])
def test_fednova_aggregate_is_the_same_bits_in_every_grouping_and_order_of_clients(name, momentum):
    # H16, the -n promise at its smallest: each rank sums its clients' uploads in float64, the reduction sums
    # the ranks'; the aggregate must not depend on which rank held which client, nor in which order. Steps and
    # sample counts make n_i / a_i no short binary fraction (e.g. 55 samples, 6 steps), as an iid mnist split
    # into 20 clients of 55 gave, where -n 1 and -n 3 differed. FedAvg is the rule the sums are held to.
    rng = np.random.default_rng(16)
    dim, n_params, clients = 400, 390, 12          # 10 buffer entries, averaged as FedAvg does
    algo = build_algorithm(config.from_dict({"algorithm": {"name": name}, "client": {"momentum": momentum}}),
                           dim=dim, n_params=n_params)
    x = torch.from_numpy(rng.standard_normal(dim, dtype=np.float32))
    down = torch.zeros(algo.down_vectors * dim)
    algo.down_payload(x, down)
    trained = [x + torch.from_numpy(rng.standard_normal(dim, dtype=np.float32))
               * np.float32(10.0 ** rng.integers(-3, 1)) for _ in range(clients)]
    runs = [ClientRun(c, 0, n_samples=int(n), steps=int(k))
            for c, (n, k) in enumerate(zip(rng.integers(20, 3000, clients), rng.integers(1, 40, clients)))]
    model = VecModel(dim)

    def aggregate(groups):
        total = torch.zeros(dim + algo.up_scalars, dtype=torch.float64)
        weight = 0.0
        for group in groups:            # one rank's sum, then the reduction's
            acc, rank_weight = torch.zeros_like(total), 0.0
            for c in group:
                model.load(trained[c])
                rank_weight += algo.accumulate(runs[c], down, model, acc)
            total += acc
            weight += rank_weight
        return algo.aggregate(x, total, weight, 0).clone()

    one = aggregate([range(clients)])
    for seed in range(8):
        order = np.random.default_rng(seed).permutation(clients)
        got = aggregate(np.array_split(order, 1 + seed % 4))
        assert torch.equal(got, one), f"{name}: {(got - one).abs().max().item():.3g} apart in grouping {seed}"


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

