"""pFedMe (issue 38: a personalization baseline researchers compare against), held to PFLlib's rule: the client
loop of clientpFedMe with pFedMeOptimizer, written out below in PFLlib's own order of operations on a torch
model, against fedmpi's pass (LocalTrainer with K steps per batch and pfedme.MoreauSteps) on the same batches;
the server's beta as server.lr; the limits; and a whole run in this process."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedmpi import config
from fedmpi.algorithms.pfedme import MoreauSteps
from fedmpi.core.errors import ConfigError
from fedmpi.core.flat import FlatModel
from fedmpi.core.train import LocalTrainer, Schedule, batch_order
from fedmpi.run.api import simulate

SEED = 7


def tiny():
    torch.manual_seed(SEED)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))


def data(n=23):
    g = torch.Generator().manual_seed(SEED)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def pfllib_client(model, x, y, batches, lam, k, lr_p, eta, mu):
    """PFLlib's clientpFedMe.train on the given batches, as its code orders it: theta (the model) and w
    (local_params) start at the global model; per batch K personal steps
    p = p - lr_p (grad + lam (p - w) + mu p), then w = w - lam eta (w - theta). Returns (w, theta)."""
    local = copy.deepcopy(list(model.parameters()))
    for positions in batches:
        xb, yb = x[positions], y[positions]
        for _ in range(k):
            model.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            for p, w in zip(model.parameters(), local):
                p.data = p.data - lr_p * (p.grad.data + lam * (p.data - w.data) + mu * p.data)
        for w, theta in zip(local, model.parameters()):
            w.data.add_(-lam * eta * (w.data - theta.data))
    flat = lambda params: torch.cat([p.detach().reshape(-1) for p in params])   # noqa: E731
    return flat(local), flat(model.parameters())


@pytest.mark.parametrize("lam, k, mu", [(15.0, 5, 0.001), (1.0, 3, 0.0), (0.5, 1, 0.01)])
def test_the_client_step_is_pfllibs(lam, k, mu):
    x, y = data()
    lr_p, eta = 0.01, 0.05
    cfg = config.from_dict({"client": {"lr": eta, "batch_size": 5, "steps": 7}}).client
    sched = Schedule(5, 7)
    flat = FlatModel(tiny())
    start = flat.vec.clone()
    order = batch_order(np.random.default_rng(SEED), len(y), sched)
    w_ref, theta_ref = pfllib_client(tiny(), x, y, [torch.from_numpy(b) for b in order], lam, k, lr_p, eta, mu)
    moreau = MoreauSteps(start.clone(), lam, mu, eta, k)
    trainer = LocalTrainer(flat, cfg, x, y)
    trainer.train(torch.arange(len(y)), np.random.default_rng(SEED), sched, lr=lr_p, repeat=k,
                  grad_hook=moreau.grad, step_hook=moreau.step)
    assert moreau.steps == 7 * k
    # the same arithmetic in another order (g + (lam + mu) theta - lam w): equal to float32 rounding
    torch.testing.assert_close(flat.vec, theta_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(moreau.w, w_ref, rtol=1e-5, atol=1e-6)
    assert not torch.equal(moreau.w, start) and not torch.equal(moreau.w, flat.vec)


def _run(algorithm, rounds=3, **server):
    return simulate({"seed": 2, "rounds": rounds, "data": {"name": "synthetic"}, "partition": {"clients": 6},
                     "server": {"clients_per_round": 3, **server}, "model": {"name": "mlp", "hidden": 8},
                     "client": {"steps": 3}, "algorithm": algorithm, "runtime": {"progress": "off", "threads": 1}})


def test_without_the_envelope_the_global_model_never_moves_and_beta_scales_the_step():
    # lam = mu = 0: w never leaves x, so the model after 3 rounds is the model after 1 (the initial one)
    still = _run({"name": "pfedme", "lam": 0.0, "mu": 0.0})
    assert np.array_equal(still.model, _run({"name": "pfedme", "lam": 0.0, "mu": 0.0}, rounds=1).model)
    # beta = server.lr: x1 = x0 + beta (mean w - x0), so beta = 2 takes twice beta = 1's step
    once, twice = _run({"name": "pfedme"}, rounds=1), _run({"name": "pfedme"}, rounds=1, lr=2.0)
    x0 = still.model.astype(np.float64)
    assert not np.array_equal(once.model, still.model)
    np.testing.assert_allclose(twice.model - x0, 2 * (once.model - x0), rtol=1e-5, atol=1e-7)
    assert np.isfinite(once.metrics["test_acc"]).all()


def test_pfedme_refuses_momentum_weight_decay_and_out_of_range_keys():
    for client in ({"momentum": 0.9}, {"weight_decay": 1e-4}):
        with pytest.raises(ConfigError):
            simulate({"rounds": 1, "data": {"name": "synthetic"}, "partition": {"clients": 4},
                      "server": {"clients_per_round": 2}, "client": client, "algorithm": {"name": "pfedme"},
                      "runtime": {"progress": "off"}})
    for keys in ({"lam": -1.0}, {"inner_steps": 0}, {"personal_lr": 0.0}, {"mu": float("inf")}):
        with pytest.raises(ConfigError):
            config.from_dict({"algorithm": {"name": "pfedme", **keys}})
