"""Forkable runs (`fedmpi run --fork-from OLD_OUT@ROUND`): a fork that changes nothing reproduces its parent
exactly and `fedmpi verify` says so; a fork that changes a key parts from the parent at the fork round; the
new run records its parent and starts with the parent's rows; what would break the clients or the model is
refused with exit 2 before anything is written."""

import subprocess
import sys

import h5py
import numpy as np
import pytest
from conftest import ROOT, read_metrics, run_steps, small_config, write_config

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fork")
    parent = tmp / "parent"
    cfg = write_config(tmp / "parent.yaml", small_config(parent, rounds=6, checkpoint={"every": 2, "keep": 5},
                                                         algorithm={"name": "scaffold"}))
    outs = {"parent": parent, "same": tmp / "same", "lr": tmp / "lr", "fedavg": tmp / "fedavg"}
    run_steps(3, [[cfg],
                  [cfg, f"out={outs['same']}", "--fork-from", f"{parent}@2"],
                  [cfg, f"out={outs['lr']}", "client.lr=0.1", "--fork-from", f"{parent}@4"],
                  [cfg, f"out={outs['fedavg']}", "algorithm.name=fedavg", "--fork-from", f"{parent}@2"]])
    return cfg, outs


def verify(a, b):
    return subprocess.run([sys.executable, "-m", "fedmpi", "verify", str(a), str(b)], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)


def test_a_fork_without_changes_reproduces_its_parent(runs):
    _, outs = runs
    proc = verify(outs["parent"], outs["same"])
    assert proc.returncode == 0 and "identical through round 6" in proc.stdout, proc.stdout + proc.stderr
    parent, _ = read_metrics(outs["parent"])
    fork, attrs = read_metrics(outs["same"])
    np.testing.assert_array_equal(fork["model_sha256"], parent["model_sha256"])
    assert attrs["parent_round"] == 2 and attrs["parent_out"].endswith("parent")
    assert attrs["parent_fingerprint"] == parent["model_sha256"][1].decode()
    assert attrs["parent_config_hash"] == read_metrics(outs["parent"])[1]["config_hash"]


def test_a_fork_with_a_change_parts_at_the_fork_round(runs):
    _, outs = runs
    parent, _ = read_metrics(outs["parent"])
    fork, attrs = read_metrics(outs["lr"])
    assert len(fork["round"]) == 6 and np.array_equal(fork["round"], parent["round"])
    np.testing.assert_array_equal(fork["model_sha256"][:4], parent["model_sha256"][:4])   # copied rows
    assert not np.any(fork["model_sha256"][4:] == parent["model_sha256"][4:])
    assert fork["client_lr"][5] == 0.1 and parent["client_lr"][5] == 0.05
    proc = verify(outs["parent"], outs["lr"])
    assert proc.returncode == 1 and "round 4" in proc.stdout, proc.stdout


def test_an_algorithm_switch_starts_from_the_parents_model(runs):
    _, outs = runs
    with h5py.File(outs["fedavg"] / "run.h5", "r") as f:
        assert f.attrs["algorithm"] == "fedavg" and f.attrs["status"] == "finished"
        bytes_up = f["metrics/bytes_up"][()]
    # SCAFFOLD uploads two vectors per client, FedAvg one: the copied rows keep the parent's figures.
    assert bytes_up[0] == 2 * bytes_up[2]


def test_forks_that_would_break_the_clients_or_the_model_are_refused(runs, tmp_path):
    cfg, outs = runs
    for extra, message in [(["model.name=mlp"], "model.name"), (["partition.clients=10"], "partition.clients"),
                           ([], "no checkpoint after round 3")]:
        out = tmp_path / f"refused{len(extra)}{message[:3]}"
        point = f"{outs['parent']}@{3 if not extra else 2}"
        proc = subprocess.run([sys.executable, "-m", "fedmpi", "run", str(cfg), f"out={out}", *extra,
                               "--fork-from", point], capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert not (out / "run.h5").exists()
