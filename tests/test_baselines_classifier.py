"""The baselines (issue 13) on a tiny classifier with a projection head: MOON's rules (the contrastive loss by
hand, the global and previous models it uses, the previous model each client keeps, mu = 0 as FedAvg, the
head it needs), and the stateful baselines' state through a real checkpoint file, continuing bit-identically.
Split from tests/test_baselines.py by topic (the hooks by hand, the runs against the numpy reference and the
equivalences with FedAvg there)."""

import math

import numpy as np
import pytest
import regression_problem as rp
import torch
from test_baselines import ROUNDS
from torch import nn

import fedmpi
from fedmpi import config
from fedmpi.algorithms import ClientRun, build_algorithm, lookup
from fedmpi.algorithms.moon import contrastive_loss
from fedmpi.core.errors import ConfigError
from fedmpi.core.flat import FlatModel
from fedmpi.data.dataset import Dataset
from fedmpi.io import checkpoint, resume
from fedmpi.mpi.local import LocalComm
from fedmpi.run.api import MemoryLog
from fedmpi.run.launch import _loop
from fedmpi.run.setup import experiment

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
    exp = experiment(cfg, LocalComm(), dataset=classes(), model=model, parts=rp.PARTS)
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
