"""The algorithms' rule options that select the papers' reference-code behaviour (issue 13), checked in-process
against hand-computed cases: MOON's `first_round` (and MOON on ResNet with a projection head) and SAFL's `mix`.
Split from tests/test_fidelity.py by topic (that file has the training rules on a tiny regression and
SCAFFOLD's; tests/test_fidelity_data.py has the data rules)."""

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
from fedmpi.algorithms.reinit import fresh_init
from fedmpi.core import rng
from fedmpi.core.errors import ConfigError
from fedmpi.core.flat import FlatModel

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
