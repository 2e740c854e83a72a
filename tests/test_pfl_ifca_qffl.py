"""The personalized algorithms that change the server's side (issue 24): IFCA (k cluster models, each client
training the one of lowest loss) and q-FFL (uploads weighted by the loss), each rule on a hand-computed case
with tests/test_pfl_algos.py's stand-in for fedmpi.round.local_passes.LocalPasses; and the bad keys of every
personalized algorithm. Split from tests/test_pfl_algos.py by topic (Ditto, APFL, Per-FedAvg and FedRep there)."""

from __future__ import annotations

import pytest
import torch
from conftest import VecModel, server_update
from test_pfl_algos import LR, QuadraticPasses, make, run_of, vec

from fedmpi import config
from fedmpi.algorithms import build_algorithm
from fedmpi.algorithms.ifca import choose_cluster, cluster_means
from fedmpi.algorithms.qffl import qffl_upload
from fedmpi.core.errors import ConfigError

# -- IFCA -------------------------------------------------------------------------------------------------

def test_ifca_choice_and_cluster_means_by_hand():
    assert choose_cluster([0.5, 0.2, 0.2]) == 1
    dim, k = 2, 3
    up = torch.tensor([2.0, 4.0, 0.0, 0.0, 9.0, 3.0, 2.0, 0.0, 3.0], dtype=torch.float64)
    means = cluster_means(up, dim, k)
    assert [j for j, _ in means] == [0, 2]
    assert torch.equal(means[0][1], torch.tensor([1.0, 2.0], dtype=torch.float64))
    assert torch.equal(means[1][1], torch.tensor([3.0, 1.0], dtype=torch.float64))


def ifca(k, dim=2):
    algo = make("ifca", dim=dim, k=k)
    assert algo.down_vectors == algo.up_vectors == algo.up_scalars == k
    return algo


def test_ifca_client_trains_its_lowest_loss_cluster_and_uploads_into_its_slot():
    algo = ifca(2)
    down = torch.cat([vec(0.0, 0.0), vec(10.0, 10.0)])         # cluster 0 at 0, cluster 1 at (10, 10)
    target = vec(9.0, 9.0)
    model = VecModel(2)
    algo.client_start(run_of(3), down, model)
    local = QuadraticPasses(model, {0: target}, steps=1,
                            losses=lambda p: float(((p - target) ** 2).sum()))
    algo.local_training(run_of(3), down, model, local)
    assert torch.allclose(model.vec, vec(10.0, 10.0) - LR * vec(1.0, 1.0))
    acc = torch.zeros(2 * 2 + 2, dtype=torch.float64)
    run = run_of(3)
    assert algo._slot[3] == 1
    weight = algo.accumulate(run, down, model, acc)
    assert weight == 10.0 and acc[4] == 0.0 and acc[5] == 10.0
    assert torch.allclose(acc[2:4], torch.tensor([-1.0, -1.0], dtype=torch.float64) * LR * 10)
    assert int(algo.chosen[3][0]) == 1


def test_ifca_server_moves_each_cluster_to_its_mean_and_keeps_unchosen_ones():
    algo = ifca(3)
    algo.server.get("clusters", "cpu").copy_(torch.tensor([5.0, 5.0, 7.0, 7.0]))
    x = vec(1.0, 1.0)
    # cluster 0: weight 2, summed weighted update (2, -2); cluster 1: weight 4, (4, 8); cluster 2: nobody
    up = torch.tensor([2.0, -2.0, 4.0, 8.0, 0.0, 0.0, 2.0, 4.0, 0.0], dtype=torch.float64)
    new_x = server_update(algo, x, up, 6.0)
    assert torch.equal(new_x, vec(2.0, 0.0))
    assert torch.equal(algo.server.get("clusters", "cpu"), torch.tensor([6.0, 7.0, 7.0, 7.0]))
    out = torch.zeros(6)
    algo.down_payload(new_x, out)
    assert torch.equal(out, torch.tensor([2.0, 0.0, 6.0, 7.0, 7.0, 7.0]))
    assert algo.round_metrics()["cluster_share"].tolist() == pytest.approx([1 / 3, 2 / 3, 0.0])


def test_ifca_k1_evaluates_no_loss():
    algo = ifca(1)
    model = VecModel(2)
    down = vec(1.0, 2.0)
    algo.client_start(run_of(), down, model)
    algo.local_training(run_of(), down, model, QuadraticPasses(model, {0: vec(0.0, 0.0)}, losses=None))
    assert algo.round_start is None


def test_ifca_eval_uses_the_clients_latest_cluster():
    algo = ifca(2)
    broadcast = torch.cat([vec(0.0, 0.0), vec(10.0, 10.0)])
    algo.round_start(0, broadcast)
    algo.chosen[4] = vec(1.0)
    model = VecModel(2)
    algo.eval_start(run_of(4), vec(3.0, 3.0), model)
    assert torch.equal(model.vec, vec(10.0, 10.0))
    algo.eval_start(run_of(5), vec(3.0, 3.0), model)      # never trained: cluster 0, the updated global
    assert torch.equal(model.vec, vec(3.0, 3.0))


def test_ifca_clusters_start_from_distinct_seeded_draws():
    from fedmpi.algorithms import SetupContext
    from fedmpi.core.flat import FlatModel

    flat = FlatModel(torch.nn.Linear(3, 2))
    cfg = config.from_dict({"algorithm": {"name": "ifca", "k": 3}, "seed": 5})
    draws = []
    for _ in range(2):
        algo = build_algorithm(cfg, flat.dim, flat.n_params)
        algo.setup(SetupContext(torch.ones(2).numpy(), torch.zeros(0, dtype=torch.int64).numpy(), flat.vec.clone(),
                                model=flat))
        draws.append(algo.server.get("clusters", "cpu").clone())
    assert torch.equal(draws[0], draws[1])                       # reproducible from the seed
    c1, c2 = draws[0][: flat.dim], draws[0][flat.dim:]
    assert not torch.equal(c1, c2) and not torch.equal(c1, flat.vec)


def test_ifca_refuses_a_server_step_size():
    from fedmpi.algorithms.ifca import Ifca

    with pytest.raises(ConfigError, match="server.lr"):
        Ifca.check(config.from_dict({"algorithm": {"name": "ifca"}, "server": {"lr": 0.5}}), None)


# -- q-FFL ------------------------------------------------------------------------------------------------

def test_qffl_upload_by_hand():
    delta, h = qffl_upload(vec(3.0, 4.0), loss=2.0, q=1.0, lipschitz=10.0)
    assert torch.allclose(delta, torch.tensor([6.0, 8.0], dtype=torch.float64))
    assert h == pytest.approx(1.0 * 25.0 + 10.0 * 2.0)           # q F^(q-1) ||dw||^2 + L F^q
    delta, h = qffl_upload(vec(3.0, 4.0), loss=2.0, q=2.0, lipschitz=10.0)
    assert h == pytest.approx(2.0 * 2.0 * 25.0 + 10.0 * 4.0) and torch.allclose(delta, 4 * vec(3.0, 4.0).double())


def qffl_server(q, clients, losses):
    """The server's new model from w = 0 after clients that trained to `clients` with losses `losses`."""
    algo = make("qffl", dim=1, q=q)
    w = vec(0.0)
    acc = torch.zeros(2, dtype=torch.float64)
    total = 0.0
    for cid, (trained, loss) in enumerate(zip(clients, losses)):
        algo._loss[cid] = loss
        model = VecModel(1)
        model.load(vec(trained))
        total += algo.accumulate(run_of(cid), w, model, acc)
    return server_update(algo, w, acc, total)


def test_qffl_q0_is_the_uniform_average_and_q_weights_by_loss():
    assert torch.allclose(qffl_server(0.0, [1.0, 3.0], [0.5, 2.0]), vec(2.0))
    # q = 1, L = 10: Delta w = -10, -30; Delta = -5, -60; h = 100 * 1 + 5 = 105 and 900 + 20 = 920
    assert torch.allclose(qffl_server(1.0, [1.0, 3.0], [0.5, 2.0]), vec(65.0 / 1025.0))


def test_qffl_uses_the_loss_at_the_broadcast_model():
    algo = make("qffl", dim=1, q=1.0)
    model = VecModel(1)
    down = vec(2.0)
    algo.client_start(run_of(), down, model)
    run = run_of()
    algo.local_training(run, down, model, QuadraticPasses(model, {0: vec(0.0)}, losses=lambda p: float(p[0]) ** 2))
    assert algo._loss[0] == 4.0 and run.figures["start_loss"] == 4.0


@pytest.mark.parametrize("name,key,value", [("ditto", "lam", -1.0), ("apfl", "alpha", 1.5), ("ifca", "k", 0),
                                            ("qffl", "q", -0.5), ("qffl", "L", 0.0), ("fedrep", "head_epochs", 0),
                                            ("perfedavg", "beta", 0.0), ("ditto", "personal_steps", 0)])
def test_bad_keys_are_config_errors_naming_the_key(name, key, value):
    with pytest.raises(ConfigError, match=f"algorithm.{key}"):
        config.from_dict({"algorithm": {"name": name, key: value}})
