"""Personalized FL under MPI (issue 24): the launches at -n 1 and -n 3 shared with other files
(tests/session_runs.py) run a few tiny mnist5k runs with local test splits and local evaluation, and the
tests assert
  - the local figures (/metrics local_*, /clients/local_acc and local_loss) and the models are identical at
    -n 1 and -n 3, for FedPer (pathological 2-shard split, fine-tuning on), FedBN with batch norm on
    Dirichlet(0.1), local training and FedAvg with model.personal;
  - a FedPer run stopped after HALF rounds and resumed equals the uninterrupted run (personal state and local
    evaluation on), at each -n;
  - the personal runs are not FedAvg (a split that keeps nothing personal is refused at set-up, issue 38:
    tests/test_personal_algorithms.py);
  - the bytes counted shrink by exactly the personal part's size, the server's copy of the personal entries
    never leaves x_0, and the checkpoint holds each trained client's personal entries.
"""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import session_runs
from conftest import same, write_config

from fedmpi.io.store import read_clients

R, HALF, EVERY = 4, 3, 2
HEAD = ["5.*"]          # mlp's output layer (Flatten, Linear, ReLU, Linear, ReLU, Linear)
HIDDEN, CLASSES, PIXELS = 16, 10, 28 * 28
HEAD_DIM = HIDDEN * CLASSES + CLASSES
PER_ROUND = 4           # server.clients_per_round


def _config(out, **sections):
    cfg = {"seed": 5, "rounds": R, "out": str(out), "data": {"name": "mnist5k"},
           "partition": {"clients": 10, "scheme": "shards", "shards_per_client": 2, "local_test": 0.2},
           "model": {"name": "mlp", "hidden": HIDDEN}, "client": {"lr": 0.05, "batch_size": 20, "steps": 3},
           "server": {"clients_per_round": PER_ROUND}, "algorithm": {"name": "fedavg"},
           "eval": {"every": 1, "local_every": 2, "local_clients": "all"},
           "checkpoint": {"every": EVERY, "keep": 10}, "runtime": {"threads": 1, "progress": "lines"}}
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    return cfg


RUNS = {
    "fedavg": {},
    "fedper": {"algorithm": {"name": "fedper"}, "eval": {"finetune_steps": 2}},
    "personal": {"model": {"personal": HEAD}},
    "fedbn_dirichlet": {"algorithm": {"name": "fedbn"}, "model": {"mlp_norm": "batch"},
                        "partition": {"scheme": "dirichlet", "beta": 0.1, "min_samples": 20}},
    "local": {"algorithm": {"name": "local"}},
}
RESUMED = ("fedper",)


@session_runs.per_n
def _launch(base, n):
    steps, out = [], {}
    for name, sections in RUNS.items():
        out[name] = base / name
        path = write_config(base / f"{name}.yaml", _config(out[name], **sections))
        steps.append([path])
        if name in RESUMED:
            out[f"{name}-resumed"] = half = base / f"{name}-resumed"
            steps += [[path, f"out={half}", f"rounds={HALF}"], [path, f"out={half}", "--resume", f"rounds={R}"]]
    return steps, out


@pytest.fixture(scope="module")
def runs(request):
    return session_runs.result(request, _launch)     # tests/session_runs.py: in the launches shared with other files


def _read(folder):
    with h5py.File(folder / "run.h5", "r", locking=False) as f:
        metrics = {k: ds[()] for k, ds in f["metrics"].items()}
        model = f["model/global"][()]
        local = {k: ds[()] for k, ds in f["partition/local_test"].items()} if "partition/local_test" in f else {}
    return metrics, read_clients(folder / "run.h5"), model, local


LOCAL = ("local_acc_mean", "local_acc_unweighted", "local_acc_std", "local_acc_worst10", "local_acc_worst",
         "local_below_global", "local_loss_mean")


@pytest.mark.mpi
def test_local_figures_and_models_are_the_same_at_one_and_three_ranks(runs):
    for name in RUNS:
        m1, c1, x1, p1 = _read(runs[1][name])
        m3, c3, x3, p3 = _read(runs[3][name])
        assert np.array_equal(x1, x3), name
        assert same(m1["model_sha256"], m3["model_sha256"]), name
        for key in LOCAL + ("test_acc", "bytes_up", "bytes_down"):
            assert same(m1[key], m3[key]), (name, key)
        for key in ("local_acc", "local_loss"):
            assert same(c1[key], c3[key]), (name, key)
        assert np.array_equal(p1["samples"], p3["samples"]), name
        # local evaluations at rounds 1 and 3 (the last), of all 10 clients, nothing elsewhere
        assert np.isfinite(m1["local_acc_mean"][[1, 3]]).all() and np.isnan(m1["local_acc_mean"][[0, 2]]).all()
        assert np.isfinite(c1["local_acc"][[1, 3]]).all(), name


@pytest.mark.mpi
def test_fedper_resumed_equals_uninterrupted(runs):
    for n in (1, 3):
        whole, resumed = _read(runs[n]["fedper"]), _read(runs[n]["fedper-resumed"])
        assert np.array_equal(whole[2], resumed[2])
        assert same(whole[0]["model_sha256"], resumed[0]["model_sha256"])
        for key in LOCAL:
            assert same(whole[0][key], resumed[0][key]), key
        assert same(whole[1]["local_acc"], resumed[1]["local_acc"])


@pytest.mark.mpi
def test_the_personal_runs_are_not_fedavg(runs):
    assert not np.array_equal(_read(runs[1]["fedper"])[2], _read(runs[1]["fedavg"])[2])
    assert not np.array_equal(_read(runs[1]["personal"])[2], _read(runs[1]["fedavg"])[2])


def _x0():
    from fedmpi import config
    from fedmpi.core import rng
    from fedmpi.core.flat import FlatModel
    from fedmpi.core.models import build_model

    cfg = config.from_dict(_config("unused", model={"personal": HEAD}))
    rng.seed_torch(cfg.seed, rng.INIT)
    return FlatModel(build_model(cfg.model, (1, 28, 28), CLASSES)).vec.numpy()


@pytest.mark.mpi
def test_personal_entries_are_never_sent_and_not_counted(runs):
    head = slice(HIDDEN * PIXELS + HIDDEN + HIDDEN * HIDDEN + HIDDEN, None)      # 5.weight, 5.bias: the tail
    x0 = _x0()
    assert x0[head].size == HEAD_DIM
    for n in (1, 3):
        fedavg, personal = _read(runs[n]["fedavg"]), _read(runs[n]["personal"])
        shrink = np.full(R, PER_ROUND * 4 * HEAD_DIM, dtype=np.float64)
        assert np.array_equal(fedavg[0]["bytes_up"] - personal[0]["bytes_up"], shrink)
        assert np.array_equal(fedavg[0]["bytes_down"] - personal[0]["bytes_down"], shrink)
        assert np.array_equal(personal[2][head], x0[head])          # the server's copy never moved
        assert not np.array_equal(personal[2][:head.start], x0[:head.start])
        with h5py.File(runs[n]["personal"] / "ckpt" / f"ckpt-{R}.h5", "r", locking=False) as f:
            kept = {cid: f["clients"][cid]["personal"][()] for cid in f["clients"] if "personal" in f["clients"][cid]}
        assert kept and all(v.shape == (HEAD_DIM,) for v in kept.values())
        assert any(not np.array_equal(v, x0[head]) for v in kept.values())
    # local training sends nothing at all
    assert not _read(runs[1]["local"])[0]["bytes_up"].any() and not _read(runs[1]["local"])[0]["bytes_down"].any()

