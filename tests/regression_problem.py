"""A tiny linear regression run through `fedmpi.simulate`, and its float64 numpy reference.

Three clients hold 3, 5 and 4 samples of a 2-feature regression; the model y = w.x + b carries a float
buffer, so the flat vector (w1, w2, b, buffer) is longer than its trainable part and every check can assert
that the buffer is left alone. Training minimises half the mean squared error, whose gradient numpy computes
in one line.

The reference re-implements the rules of docs/explanation/baselines.md in float64 and follows the run's real randomness:
the round's clients come from `rng.select_clients(seed, t, N, S)` and each client's batches from
`train.batch_order(rng.stream(seed, CLIENT, t, cid), n, Schedule(B, steps))`, exactly as the round loop
draws them, so the comparison is step for step.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

import fedmpi
from fedmpi.core import rng
from fedmpi.core.train import Schedule, batch_order
from fedmpi.data.dataset import Dataset

X = np.array([[1.0, 0.0], [0.5, 2.0], [-1.0, 1.0],
              [2.0, 1.0], [0.0, -1.0], [1.5, 0.5], [-0.5, -2.0], [1.0, 1.0],
              [0.0, 1.0], [-2.0, 0.5], [1.0, -1.0], [0.5, 0.5]])
Y = np.array([1.0, -1.0, 0.5, 2.0, 0.0, 1.0, -1.5, 0.5, 1.0, -0.5, 0.25, 2.0])
X_TEST = np.array([[0.5, -0.5], [1.0, 2.0], [-1.5, 0.0], [0.0, 0.5]])
Y_TEST = np.array([0.5, 1.5, -1.0, 0.25])
PARTS = [np.arange(0, 3), np.arange(3, 8), np.arange(8, 12)]
X0 = np.array([0.2, -0.1, 0.05])        # initial (w1, w2, b)
BUFFER = 7.0                            # the model's float buffer: no gradient, never changes
N_CLIENTS, PER_ROUND, BATCH = 3, 2, 2
# With this seed rounds 0, 1, 2 draw the clients [0, 1], [0, 2], [1, 2] (asserted by the tests that rely on it).
SEED = 3


class Regression(nn.Module):
    """y = w.x + b, with a float buffer so that the flat vector is longer than its trainable part."""

    def __init__(self, start=X0):
        super().__init__()
        self.lin = nn.Linear(2, 1)
        self.register_buffer("unused", torch.full((1,), BUFFER))
        with torch.no_grad():
            self.lin.weight.copy_(torch.tensor(np.asarray(start)[None, :2]))
            self.lin.bias.fill_(float(start[2]))

    def forward(self, x):
        return self.lin(x).squeeze(-1)


def half_mse(out, y):
    """The training criterion: 1/2 mean squared error (its gradient is X^T r / n)."""
    return 0.5 * ((out - y) ** 2).mean()


def dataset():
    f32 = np.float32
    return Dataset("regression", X.astype(f32), Y.astype(f32), X_TEST.astype(f32), Y_TEST.astype(f32), num_classes=1)


def config(algorithm="fedavg", rounds=3, lr=0.1, momentum=0.0, epochs=2, steps=None, server=None, client=None,
           **keys):
    """A config mapping for the regression problem: batch 2, `epochs` local epochs (4, 6 and 4 steps for
    epochs 2) unless `steps` is given; `server`/`client` add keys to those sections."""
    return {
        "seed": SEED, "rounds": rounds, "out": "unused",
        "partition": {"clients": N_CLIENTS},
        "client": {"lr": lr, "batch_size": BATCH, "epochs": epochs, "steps": steps, "momentum": momentum,
                   **(client or {})},
        "server": {"clients_per_round": PER_ROUND, **(server or {})},
        "algorithm": {"name": algorithm, **keys},
        "runtime": {"threads": 1, "progress": "off"},
    }


def simulate(cfg, model=None, **kwargs):
    """`fedmpi.simulate` of `cfg` on the regression data, its clients being PARTS."""
    return fedmpi.simulate(cfg, dataset=dataset(), model=model or Regression(), parts=PARTS, loss=half_mse,
                           **kwargs)


def models_per_round(cfg, rounds):
    """The global model after each of rounds 1..`rounds` (one simulation each: a run of k rounds is the
    first k rounds of a longer one)."""
    return [simulate(cfg, rounds=k).model for k in range(1, rounds + 1)]


# --- the numpy reference (float64) --------------------------------------------------------------------

def selected(t, seed=SEED):
    return [int(c) for c in rng.select_clients(seed, t, N_CLIENTS, PER_ROUND)]


def local_steps(cid, epochs=2, steps=None):
    return steps or epochs * math.ceil(len(PARTS[cid]) / BATCH)


def batches(t, cid, steps, seed=SEED):
    """Client `cid`'s batches in round t, as indices into X (the round loop's draw)."""
    order = batch_order(rng.stream(seed, rng.CLIENT, t, cid), len(PARTS[cid]), Schedule(BATCH, steps))
    return [PARTS[cid][positions] for positions in order]


def mse_grad(theta, idx):
    xs, ys = X[idx], Y[idx]
    r = xs @ theta[:2] + theta[2] - ys
    return np.concatenate([xs.T @ r, [r.sum()]]) / len(ys)


def local_sgd(theta, t, cid, steps, lr, correction=lambda w: 0.0, momentum=0.0, seed=SEED):
    """Client `cid`'s local training in round t: minibatch SGD with torch's momentum rule and an extra
    gradient term `correction(w)`, over the round loop's batches."""
    w, buf = theta.copy(), np.zeros_like(theta)
    for idx in batches(t, cid, steps, seed):
        g = mse_grad(w, idx) + correction(w)
        buf = momentum * buf + g
        w = w - lr * buf
    return w


def weights(clients):
    """p_i = n_i / sum_j n_j over `clients`."""
    n = np.array([len(PARTS[c]) for c in clients], dtype=float)
    return n / n.sum()


def held_out_loss(theta):
    """The half-MSE on the test set, as /metrics/test_loss."""
    r = X_TEST @ theta[:2] + theta[2] - Y_TEST
    return 0.5 * float(np.mean(r ** 2))


def assert_model(actual, expected_params, rtol=1e-5, atol=1e-6):
    """Compares a flat vector with the expected trainable part; the buffer must be untouched."""
    actual = np.asarray(actual)
    np.testing.assert_allclose(actual[:3].astype(np.float64), expected_params, rtol=rtol, atol=atol)
    assert actual[3] == BUFFER


def scaffold_reference(lr_of=lambda t: 0.1, rounds=3, control_lr_of=None):
    """SCAFFOLD option II with FedAvg's weights (server lr 1): `lr_of(t)` is round t's client learning rate,
    used in the local steps and (unless `control_lr_of` says otherwise) in the control update
    c_i+ = c_i - c + (x - y_i) / (K eta_l). Returns the models per round, the server control c and the
    clients' controls."""
    control_lr_of = control_lr_of or lr_of
    x, c, c_i, out = X0.copy(), np.zeros(3), {k: np.zeros(3) for k in range(N_CLIENTS)}, []
    for t in range(rounds):
        clients = selected(t)
        deltas, dc = [], []
        for cid in clients:
            k = local_steps(cid)
            y = local_sgd(x, t, cid, k, lr_of(t), lambda w, cid=cid, c=c: c - c_i[cid])
            new_ci = c_i[cid] - c + (x - y) / (k * control_lr_of(t))
            deltas.append(y - x)
            dc.append(new_ci - c_i[cid])
            c_i[cid] = new_ci
        x = x + sum(p * d for p, d in zip(weights(clients), deltas))
        c = c + sum(dc) / N_CLIENTS
        out.append(x)
    return out, c, c_i
