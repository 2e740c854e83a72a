"""A data set and a model from a package outside fedmpi under MPI (issue 27): in the launches at -n 3 and -n 1
shared with other files (tests/session_runs.py), the tiny package of tests/plugin_package.py on PYTHONPATH
runs with natural clients from its client ids, each client's own test samples (local evaluation on), and
checkpoints. The tests assert
  - the run named through the entry points (`blobs`, `twolayer`) is identical at -n 1 and -n 3;
  - the run named by path (`myfl.data:blobs`, `myfl.nets:TwoLayer`), stopped after HALF rounds and resumed,
    equals the uninterrupted one, at each -n;
  - the partition is the package's: 4 clients of 30 samples, each with its 10 own test samples.
"""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import session_runs
from conftest import same, write_config
from plugin_package import pythonpath, write_plugin_package

R, HALF, EVERY = 4, 3, 2
CLIENTS, PER_CLIENT = 4, 30


def _config(out, data, model):
    return {"seed": 2, "rounds": R, "out": str(out),
            "data": {"name": data, "kwargs": {"n_clients": CLIENTS, "per_client": PER_CLIENT}},
            "partition": {"clients": CLIENTS, "scheme": "natural"},
            "model": {"name": model, "kwargs": {"width": 12}},
            "client": {"lr": 0.1, "batch_size": 10, "steps": 2}, "server": {"clients_per_round": 3},
            "eval": {"every": 1, "local_every": 2, "local_clients": "all"},
            "checkpoint": {"every": EVERY, "keep": 10}, "runtime": {"threads": 1, "progress": "lines"}}


@session_runs.plan
def _launch(base):
    env = {"PYTHONPATH": pythonpath(write_plugin_package(base / "site"))}
    steps, out = {}, {}
    for n in (3, 1):
        folder = base / f"n{n}"
        folder.mkdir()
        named = write_config(folder / "named.yaml", _config(folder / "named", "blobs", "twolayer"))
        path = write_config(folder / "path.yaml", _config(folder / "path", "myfl.data:blobs", "myfl.nets:TwoLayer"))
        half = folder / "resumed"
        steps[n] = [[env, "run", named], [env, "run", path],
                    [env, "run", path, f"out={half}", f"rounds={HALF}"],
                    [env, "run", path, f"out={half}", "--resume", f"rounds={R}"]]
        out[n] = {"named": folder / "named", "path": folder / "path", "resumed": half}
    return steps, out


@pytest.fixture(scope="module")
def runs(request):
    return session_runs.result(request, _launch)     # tests/session_runs.py: in the launches shared with other files


def _read(folder):
    with h5py.File(folder / "run.h5", "r", locking=False) as f:
        return ({k: ds[()] for k, ds in f["metrics"].items()}, f["model/global"][()],
                f["partition/samples"][()], f["partition/local_test/samples"][()], f["clients/local_acc"][()])


@pytest.mark.mpi
def test_a_plugin_data_set_and_model_are_the_same_at_one_and_three_ranks(runs):
    m1, x1, s1, l1, c1 = _read(runs[1]["named"])
    m3, x3, s3, l3, c3 = _read(runs[3]["named"])
    assert np.array_equal(x1, x3) and same(m1["model_sha256"], m3["model_sha256"])
    for key in ("test_acc", "test_loss", "local_acc_mean"):
        assert same(m1[key], m3[key]), key
    assert same(c1, c3)
    assert np.isfinite(m1["local_acc_mean"][[1, 3]]).all()       # local evaluation on the clients' own tests
    for samples, local in ((s1, l1), (s3, l3)):
        assert samples.tolist() == [PER_CLIENT] * CLIENTS and local.tolist() == [PER_CLIENT // 3] * CLIENTS


@pytest.mark.mpi
def test_a_plugin_run_resumed_equals_the_uninterrupted_one_whatever_it_is_named_by(runs):
    for n in (1, 3):
        whole, resumed, named = _read(runs[n]["path"]), _read(runs[n]["resumed"]), _read(runs[n]["named"])
        assert np.array_equal(whole[1], resumed[1]) and same(whole[0]["model_sha256"], resumed[0]["model_sha256"])
        assert same(whole[0]["test_acc"], resumed[0]["test_acc"]) and same(whole[4], resumed[4])
        assert np.array_equal(whole[1], named[1])        # entry point and path name the same functions
