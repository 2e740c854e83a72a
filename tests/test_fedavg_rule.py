"""FedAvg's and central SGD's rules through the algorithm hooks, against hand-computed numbers."""

import numpy as np
import torch
from conftest import VecModel, server_update

from fedmpi import config
from fedmpi.algorithms import ClientRun, build_algorithm


def test_fedavg_weights_updates_by_samples_and_server_lr():
    cfg = config.from_dict({"server": {"lr": 0.5, "clients_per_round": 2}})
    algo = build_algorithm(cfg, dim=2, n_params=2)
    x = torch.tensor([1.0, 1.0])
    down = torch.empty(2)
    algo.down_payload(x, down)
    acc = torch.zeros(2, dtype=torch.float64)
    model = VecModel(2)
    weights = 0.0
    for cid, n, y in [(0, 1, [2.0, 3.0]), (1, 3, [4.0, 1.0])]:
        algo.client_start(ClientRun(cid, 0, n), down, model)
        assert torch.equal(model.vec, x)
        model.vec.copy_(torch.tensor(y))
        weights += algo.accumulate(ClientRun(cid, 0, n), down, model, acc)
    # Deltas (1, 2) and (3, 0) weighted 1:3 -> (2.5, 0.5); half a step from x -> (2.25, 1.25).
    new = server_update(algo, x, acc, weights, 0, server_lr=cfg.server.lr)
    assert weights == 4 and new.dtype == torch.float32
    torch.testing.assert_close(new, torch.tensor([2.25, 1.25]))


def test_server_keeps_the_model_when_nobody_uploaded():
    algo = build_algorithm(config.from_dict({}), dim=3, n_params=3)
    x = torch.ones(3)
    assert torch.equal(server_update(algo, x, torch.zeros(3, dtype=torch.float64), 0.0, 0), x)


def test_central_trains_the_union_with_batch_b_times_s_and_the_rounds_samples():
    cfg = config.from_dict({"algorithm": {"name": "central"}, "partition": {"clients": 4},
                            "server": {"clients_per_round": 2}, "client": {"batch_size": 5, "epochs": 2}})
    algo = build_algorithm(cfg, dim=1, n_params=1)
    parts = [np.array([0, 1]), np.array([5, 6, 7]), np.array([2]), np.array([3, 4])]
    (union,) = algo.clients(parts, np.zeros(0, np.int64))
    assert union.tolist() == list(range(8))
    sizes = np.array([2, 3, 1, 2])
    assert algo.select(0, np.array([1, 3]), sizes).tolist() == [0]
    # Selected clients hold 3 + 2 samples, 2 epochs -> 10 samples in batches of 5 * 2 -> 1 step.
    assert algo.schedule(0, sizes, np.array([1, 3])) == (10, 1)
    x = torch.zeros(1)
    assert server_update(algo, x, torch.tensor([6.0], dtype=torch.float64), 2.0, 0).item() == 3.0
