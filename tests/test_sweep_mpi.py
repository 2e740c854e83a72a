"""`fedmpi sweep` under MPI (issue 41).

In the -n 3 launch shared with other files (tests/session_runs.py), two sweeps, one after the other in the
same processes:
  - GROUPS, `ranks: {clients_per_rank: 2}`: every experiment on a group of two ranks (a sub-communicator),
    one of them failing on its worker rank in round 1 (a plug-in algorithm; `server.trains_clients: false`):
    the sweep exits 1, its index lists the failed one with its message and the others finished, and a finished
    one is bit-identical to `mpiexec -n 2 fedmpi run` of its config (the -n 2 launch);
  - PAIRS, `ranks: 1`: two groups of one rank at a time, 4 experiments with checkpoints; every one finished,
    one bit-identical to `fedmpi run` at -n 1 (the -n 1 launch).
In launches of their own: PAIRS's spec into another folder, stopped by SIGTERM while both groups train (exit
75, the index saying preempted), then the same spec again (exit 0): every experiment equals PAIRS's, model
and every figure, to the bit.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import time

import h5py
import numpy as np
import pytest
import session_runs
import yaml
from conftest import MPI_TIMEOUT_S, ROOT, fedmpi_cmd, write_config

ROUNDS, EVERY = 6, 2
FAULTY = '''\
from dataclasses import dataclass
from fedmpi.algorithms.base import AlgorithmKeys, Reduce


@dataclass(frozen=True)
class FaultyKeys(AlgorithmKeys):
    name: str = "faulty"


class Faulty(Reduce):
    """FedAvg's upload, but a client raises from round 1 on (on whichever rank hosts it)."""
    name = "faulty"
    Keys = FaultyKeys

    def accumulate(self, run, down, model, acc):
        if run.round >= 1:
            raise RuntimeError("injected: a faulty client")
        acc[: self.dim].add_(model.vec - down[: self.dim], alpha=run.weight)
        return run.weight

    def aggregate(self, x, up_sum, weight_sum, round_):
        return up_sum[: self.dim] / weight_sum if weight_sum > 0 else None
'''


def base_config(out):
    return {"seed": 0, "rounds": ROUNDS, "out": str(out), "data": {"name": "synthetic"},
            "partition": {"clients": 12}, "model": {"name": "lr"},
            "client": {"lr": 0.05, "batch_size": 10, "epochs": 1}, "server": {"clients_per_round": 4},
            "checkpoint": {"every": EVERY, "keep": 10}, "runtime": {"threads": 1, "progress": "lines"}}


def write_spec(path, mapping):
    path.write_text(yaml.safe_dump(mapping, sort_keys=False))
    return path


def pairs_spec(folder, out):
    return write_spec(folder / f"{out}.yaml", {"base": "base.yaml", "out": str(folder / out),
                                               "grid": {"algorithm.name": ["fedavg", "fedprox"]},
                                               "seeds": [0, 1], "ranks": 1})


@session_runs.plan
def _launch(base):
    site = base / "site"
    site.mkdir()
    (site / "faulty_alg.py").write_text(FAULTY)
    write_config(base / "base.yaml", base_config(base / "unused"))
    groups = write_spec(base / "groups.yaml", {
        "base": "base.yaml", "out": str(base / "groups"), "overrides": {"server.trains_clients": False},
        "sets": [{"name": "fedavg", "algorithm.name": "fedavg"},
                 {"name": "faulty", "algorithm.name": "faulty_alg:Faulty"},
                 {"name": "fedprox", "algorithm.name": "fedprox"}],
        "ranks": {"clients_per_rank": 2}})
    pairs = pairs_spec(base, "pairs")
    env = {"PYTHONPATH": str(site)}
    alone = {n: base / f"alone-n{n}" for n in (1, 2)}
    steps = {3: [[env, "sweep", 1, groups], ["sweep", 0, pairs]],
             2: [["run", base / "base.yaml", "algorithm.name=fedavg", "server.trains_clients=false",
                  f"out={alone[2]}"]],
             1: [["run", base / "base.yaml", "algorithm.name=fedprox", "seed=1", f"out={alone[1]}"]]}
    return steps, {"base": base, "groups": base / "groups", "pairs": base / "pairs", "alone": alone}


@pytest.fixture(scope="module")
def runs(request):
    return session_runs.result(request, _launch)


def index(folder):
    with open(folder / "index.csv", newline="") as fh:
        return {row["name"]: row for row in csv.DictReader(fh)}


def read(run_dir):
    with h5py.File(run_dir / "run.h5", "r", locking=False) as f:
        metrics = {k: ds[()] for k, ds in f["metrics"].items() if k != "wall_s"}
        return metrics, f["model/global"][()], dict(f.attrs)


def assert_identical(a, b):
    ma, xa, _ = read(a)
    mb, xb, _ = read(b)
    assert np.array_equal(xa, xb), (a, b)
    assert sorted(ma) == sorted(mb)
    for name in ma:
        assert np.array_equal(ma[name], mb[name], equal_nan=ma[name].dtype.kind == "f"), (a, b, name)


@pytest.mark.mpi
def test_groups_of_two_ranks_finish_around_a_failing_experiment(runs):
    rows = index(runs["groups"])
    assert list(rows) == ["fedavg", "faulty", "fedprox"]
    assert [rows[n]["status"] for n in rows] == ["finished", "failed", "finished"]
    assert all(rows[n]["ranks"] == "2" for n in rows)
    assert rows["faulty"]["exit_code"] == "1" and "injected: a faulty client" in rows["faulty"]["message"]
    assert "rank 1 failed" in rows["faulty"]["message"]         # the worker, not rank 0: the group's scoped abort
    with h5py.File(runs["groups"] / "faulty" / "run.h5", "r", locking=False) as f:
        assert f.attrs["status"] == "failed" and len(f["metrics/round"]) == 1     # round 0 kept, as fedmpi run
    for name in ("fedavg", "fedprox"):
        _, _, attrs = read(runs["groups"] / name)
        assert attrs["status"] == "finished" and attrs["world_size"] == 2


@pytest.mark.mpi
def test_an_experiment_of_a_group_equals_fedmpi_run_at_its_ranks(runs):
    assert_identical(runs["groups"] / "fedavg", runs["alone"][2])
    assert_identical(runs["pairs"] / "algorithm.name-fedprox_seed-1", runs["alone"][1])


@pytest.mark.mpi
def test_groups_of_one_rank_finish_every_experiment(runs):
    rows = index(runs["pairs"])
    assert sorted(rows) == sorted(f"algorithm.name-{a}_seed-{s}" for a in ("fedavg", "fedprox") for s in (0, 1))
    assert {r["status"] for r in rows.values()} == {"finished"}
    assert {r["attempts"] for r in rows.values()} == {"1"}
    for name in rows:
        metrics, _, attrs = read(runs["pairs"] / name)
        assert attrs["world_size"] == 1 and len(metrics["round"]) == ROUNDS


def _launch_sweep(spec, log, env=None):
    cmd = fedmpi_cmd(3, "sweep", spec)
    with open(log, "w") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


@pytest.mark.mpi
def test_a_sweep_stopped_by_sigterm_and_started_again_equals_the_uninterrupted_one(runs, tmp_path):
    spec = pairs_spec(runs["base"], "stopped")
    log = tmp_path / "first.log"
    proc = _launch_sweep(spec, log, {"FEDMPI_ROUND_DELAY_S": "0.4"})
    deadline = time.monotonic() + MPI_TIMEOUT_S      # a guard against a hang only
    while proc.poll() is None and time.monotonic() < deadline:
        text = log.read_text()
        if text.count("fedmpi sweep: started ") >= 2 and "round 1/" in text:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)                 # mpiexec forwards it to every rank
    assert proc.wait(timeout=MPI_TIMEOUT_S) == 75, log.read_text()[-3000:]
    rows = index(runs["base"] / "stopped")
    assert "preempted" in {r["status"] for r in rows.values()}
    assert {r["status"] for r in rows.values()} <= {"preempted", "pending", "finished"}
    proc = _launch_sweep(spec, tmp_path / "again.log")
    assert proc.wait(timeout=MPI_TIMEOUT_S) == 0, (tmp_path / "again.log").read_text()[-3000:]
    rows = index(runs["base"] / "stopped")
    assert {r["status"] for r in rows.values()} == {"finished"}
    assert any(r["attempts"] == "2" for r in rows.values())
    for name in rows:
        assert_identical(runs["base"] / "stopped" / name, runs["pairs"] / name)
