"""Attacks under mpiexec (issue 25): the same runs at -n 1 and -n 3, and a run stopped half-way and resumed,
give the same figures (backdoor_acc included), the same global model and the same recorded malicious set.

In the launches shared with other files (tests/session_runs.py: one mpiexec per -n): at each -n every case's
whole run, then its first HALF rounds and a --resume to R. `sign_flip_median` runs the model attack's upload
stage inside robust's chunked gather (server.aggregator: median)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import session_runs
from conftest import read_global, read_metrics, same, small_config, write_config

from fedmpi.attacks import malicious_clients
from fedmpi.attacks.keys import AttackConfig

R, HALF = 4, 2
CASES = {
    "label_flip": {"name": "label_flip", "fraction": 0.25},
    "backdoor": {"name": "backdoor", "fraction": 0.25, "target": 3, "poison_fraction": 0.5, "scale": 2.0},
    "gaussian": {"name": "gaussian", "fraction": 0.25, "sigma": 0.01},
    "sign_flip_median": {"name": "sign_flip", "fraction": 0.25, "scale": 4.0},   # through the chunked gather
}
SERVER = {"sign_flip_median": {"aggregator": "median"}}


def case_config(d, name):
    cfg = small_config(str(d / name), rounds=R, attack=dict(CASES[name]),
                       server={"clients_per_round": 6, **SERVER.get(name, {})},
                       checkpoint={"every": HALF, "keep": 2})
    return write_config(d / f"{name}.yaml", cfg)


@session_runs.per_n
def attack_runs(base, n):
    whole, half = base / "whole", base / "resumed"
    whole.mkdir()
    half.mkdir()
    steps = []
    for name in CASES:
        steps.append([case_config(whole, name)])
        resumed = case_config(half, name)
        steps += [[resumed, f"rounds={HALF}"], [resumed, "--resume"]]
    return steps, (whole, half)


@pytest.fixture(scope="module")
def mpi_runs(request):
    launched = session_runs.result(request, attack_runs)    # tests/session_runs.py: shared launches
    runs = {}
    for n, (whole, half) in launched.items():
        runs[n], runs[f"{n}-resumed"] = whole, half
    return runs


def same_metrics(a, b):
    """Every figure equal (wall_s aside), across -n too: train_loss is summed in float64, whose sums of the
    clients' float32 loss sums do not depend on their order or grouping."""
    assert sorted(a) == sorted(b)
    for name in a:
        if name != "wall_s":
            assert same(a[name], b[name]), name


def malicious_of(run_dir):
    with h5py.File(run_dir / "run.h5", "r") as f:
        return f["attack/malicious"][()], f["attack"].attrs["name"]


@pytest.mark.mpi
@pytest.mark.parametrize("name", list(CASES))
def test_mpi_attacked_runs_do_not_depend_on_n(mpi_runs, name):
    (m1, _), (m3, _) = read_metrics(mpi_runs[1] / name), read_metrics(mpi_runs[3] / name)
    same_metrics(m1, m3)
    assert np.array_equal(read_global(mpi_runs[1] / name), read_global(mpi_runs[3] / name))
    (ids1, attack1), (ids3, attack3) = malicious_of(mpi_runs[1] / name), malicious_of(mpi_runs[3] / name)
    assert np.array_equal(ids1, ids3) and attack1 == attack3 == CASES[name]["name"]
    assert np.array_equal(ids1, malicious_clients(AttackConfig(**CASES[name]), 12, seed=1)) and len(ids1) == 3
    if name == "backdoor":
        assert m1["backdoor_acc"].shape == (R,) and np.all(np.isfinite(m1["backdoor_acc"]))
    else:
        assert "backdoor_acc" not in m1


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("name", list(CASES))
def test_mpi_attacked_resume_is_bit_identical(mpi_runs, name, n):
    (m_ref, _), (m_res, attrs) = read_metrics(mpi_runs[n] / name), read_metrics(mpi_runs[f"{n}-resumed"] / name)
    assert f"from round {HALF} at world_size {n}" in attrs["resumes"]
    same_metrics(m_ref, m_res)
    assert np.array_equal(read_global(mpi_runs[n] / name), read_global(mpi_runs[f"{n}-resumed"] / name))
    assert np.array_equal(malicious_of(mpi_runs[n] / name)[0], malicious_of(mpi_runs[f"{n}-resumed"] / name)[0])
