"""run.h5 files written by the tests with h5py in the layout the run log writes (docs/explanation/design.md §3 and the
instruments' contract of issue 12), so that the readers (verify, export, report --classes/--timing/--plot,
tools/) are tested without training anything.

`write_run` makes a run of `rounds` rounds whose global model moves by a fixed step per round; the
per-round fingerprint is the SHA-256 of the float32 bytes of that model, and `/model/global` is the last
one. `perturb_from=R, scale=s` multiplies the models and every reproducible metric from round R on by
(1 + s), the way a run that parts from another at round R looks. All values come from a seeded numpy
generator, so two calls with the same arguments write the same figures.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import h5py
import numpy as np
import yaml

CLASSES = 4
CLIENTS = 5
DIM = 50
PHASES = ("train", "eval", "bcast", "reduce", "wait", "server")
LAYERS = ("fc.weight", "fc.bias")
MAX_ROUNDS = 100
VERSIONS = {"python": "3.11.9", "torch": "2.14.1", "numpy": "2.4.6", "h5py": "3.16.0", "mpi4py": "4.1.1"}


def base_config(out, seed=0, **changes):
    cfg = {"seed": seed, "rounds": 6, "out": str(out), "data": {"name": "mnist5k"},
           "partition": {"clients": CLIENTS, "scheme": "dirichlet", "beta": 0.5}, "model": {"name": "lr"},
           "client": {"lr": 0.05, "batch_size": 10}, "algorithm": {"name": "fedavg"},
           "runtime": {"threads": 1}}
    cfg.update(changes)
    return cfg


def sha(vec):
    return hashlib.sha256(np.ascontiguousarray(vec, dtype="<f4").tobytes()).hexdigest()


def models(rounds, perturb_from=None, scale=0.0):
    start = np.linspace(-1.0, 1.0, DIM).astype(np.float32)
    step = np.linspace(0.01, 0.02, DIM).astype(np.float32)
    out = []
    for t in range(rounds):
        vec = (start + np.float32(t + 1) * step).astype(np.float32)
        if perturb_from is not None and t >= perturb_from:
            vec = (vec * np.float32(1 + scale)).astype(np.float32)
        out.append(vec)
    return out


def figures(rounds, perturb_from=None, scale=0.0, eval_every=1):
    """The reproducible per-round figures (seeded, the first `rounds` of MAX_ROUNDS, so a shorter run has
    the same figures as the first rounds of a longer one), with their perturbation."""
    f, counts = _figures(MAX_ROUNDS, perturb_from, scale, eval_every)
    return {k: v[:rounds] for k, v in f.items()}, counts


def _figures(rounds, perturb_from, scale, eval_every):
    g = np.random.default_rng(7)
    counts = np.array([30, 20, 40, 10])
    class_acc = g.uniform(0.05, 0.95, size=(rounds, CLASSES))
    evaluated = np.arange(rounds) % eval_every == eval_every - 1
    class_acc[~evaluated] = np.nan
    f = {
        "class_acc": class_acc,
        "train_loss": g.uniform(0.5, 2.0, rounds),
        "test_loss": np.where(evaluated, g.uniform(0.5, 2.0, rounds), np.nan),
        "bytes_up": np.full(rounds, 800.0), "bytes_down": np.full(rounds, 1000.0), "uploads": np.full(rounds, 3.0),
        "weight_divergence": np.cumsum(g.uniform(0.01, 0.1, rounds)),
        "weight_divergence_layers": np.cumsum(g.uniform(0.01, 0.1, (rounds, len(LAYERS))), axis=0),
        "shadow_acc": np.where(evaluated, g.uniform(0.5, 0.9, rounds), np.nan),
        "update_sq_norm": g.uniform(1.0, 2.0, rounds), "aggregate_sq_norm": g.uniform(0.2, 0.9, rounds),
        "client_lr": np.full(rounds, 0.05), "server_lr": np.ones(rounds),
        "sim_time_s": np.cumsum(g.uniform(1.0, 3.0, rounds)),
    }
    f["gradient_diversity"] = f["update_sq_norm"] / f["aggregate_sq_norm"]
    f["test_acc"] = (class_acc * counts).sum(axis=1) / counts.sum()      # NaN where not evaluated
    if perturb_from is not None:
        for name, v in f.items():
            if name not in ("bytes_up", "bytes_down", "uploads", "client_lr", "server_lr"):
                v[perturb_from:] = v[perturb_from:] * (1 + scale)
    return f, counts


def write_run(path, rounds=6, *, world_size=1, status="finished", config=None, perturb_from=None, scale=0.0,
              fingerprints=True, instruments=True, timing=True, ranks=3, eval_every=1, model=True, attrs=None):
    """Writes PATH (a run.h5; its folder is created) and returns it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    g = np.random.default_rng(11)
    f_values, counts = figures(rounds, perturb_from, scale, eval_every)
    vecs = models(rounds, perturb_from, scale)
    with h5py.File(path, "w") as f:
        f.attrs["config"] = yaml.safe_dump(config or base_config(path.parent), sort_keys=False)
        f.attrs["config_hash"] = "0123456789abcdef"
        f.attrs["fedmpi_version"] = "0.1.0"
        f.attrs["world_size"] = world_size
        f.attrs["status"] = status
        f.attrs["error"] = ""
        f.attrs["started"] = "2025-01-01T00:00:00+00:00"
        f.attrs["algorithm"] = "fedavg"
        for k, v in VERSIONS.items():
            f.attrs[f"version_{k}"] = v
        for k, v in (attrs or {}).items():
            f.attrs[k] = v
        m = f.create_group("metrics")
        m["round"] = np.arange(rounds, dtype=np.float64)
        m["wall_s"] = np.cumsum(g.uniform(0.1, 0.2, rounds))        # measured: differs on every run
        core = ("test_acc", "test_loss", "train_loss", "bytes_up", "bytes_down", "uploads")
        for name in core:
            m[name] = f_values[name]
        if fingerprints:
            m.create_dataset("model_sha256", data=np.array([sha(v) for v in vecs], dtype="S64"))
        if instruments:
            for name, v in f_values.items():
                if name not in core:
                    m[name] = v
            m["class_acc"].attrs["class_counts"] = counts
            m["weight_divergence_layers"].attrs["layers"] = np.array(LAYERS, dtype="S")
            c = f.create_group("clients")
            norms = g.uniform(0.5, 1.5, (rounds, CLIENTS))
            cosines = g.uniform(-0.2, 0.9, (rounds, CLIENTS))
            unselected = g.random((rounds, CLIENTS)) < 0.4
            unselected[:, 0] = False                                   # at least one client every round
            c["update_norm"] = np.where(unselected, np.nan, norms).astype(np.float32)
            c["update_cosine"] = np.where(unselected, np.nan, cosines).astype(np.float32)
        if timing:
            t = f.create_group("timing")
            for j, phase in enumerate(PHASES):
                t[phase] = g.uniform(0.01, 0.1, (rounds, ranks)) * (j + 1)
        p = f.create_group("partition")
        g = np.random.default_rng(13)           # the split does not depend on the rounds run
        labels = g.integers(0, 30, (CLIENTS, CLASSES))
        labels[1, 3] = 0
        p["labels"] = labels
        p["samples"] = labels.sum(axis=1)
        p["emd"] = g.uniform(0.1, 0.9, CLIENTS)
        if model:
            f.create_dataset("model/global", data=vecs[-1])
    return path


def read(path):
    with h5py.File(path, "r", locking=False) as f:
        return {k: ds[()] for k, ds in f["metrics"].items()}, dict(f.attrs)
