"""Issue 17 under mpiexec -n 3: two jobs on one out, input errors printed once, a malicious CIFAR batch on
every rank. (The single-process cases are in test_hardening.py.)"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time

import pytest
from conftest import MPI_TIMEOUT_S, ROOT, fedmpi_cmd, read_metrics, run_fedmpi, small_config, write_config
from test_hardening import malicious_cifar_run

from fedmpi.core.errors import EXIT_USAGE

pytestmark = pytest.mark.mpi


def fedmpi_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("fedmpi:")]


def test_second_job_on_the_same_out_exits_2_naming_the_first(tmp_path):
    out = tmp_path / "run"
    rounds = 4
    cfg = write_config(tmp_path / "c.yaml", small_config(out, rounds=rounds, checkpoint={"every": 1, "keep": 2}))
    # The first job holds at the end of its set-up (every rank paused before the first round's broadcast, its
    # claim on `out` taken) until the second job has ended and the test writes `go`: no guess of how long the
    # second job's start takes (three ranks importing torch, ~20 s under a load of 8 on 2 cores). The pause's
    # seconds are a guard against a hang only.
    go, log = tmp_path / "go", tmp_path / "first.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "FEDMPI_TEST_SLEEP_AT": "broadcast",
           "FEDMPI_TEST_SLEEP_S": str(MPI_TIMEOUT_S), "FEDMPI_TEST_SLEEP_UNTIL": str(go)}
    with open(log, "w") as fh:
        first = subprocess.Popen(fedmpi_cmd(3, "run", cfg), stdout=subprocess.DEVNULL, stderr=fh, text=True,
                                 env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + MPI_TIMEOUT_S
        while log.read_text().count("fedmpi-test: paused at broadcast") < 3:     # every rank is running
            assert first.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        second = run_fedmpi(3, "run", cfg, "--overwrite", check=False)
        named = re.search(r"in use by another fedmpi job \(host (\S+) pid (\d+) ", second.stderr)
        # The pid named is the first job's rank 0, alive and running this config.
        alive = named and cmdline_of(int(named.group(2)))
    finally:
        go.write_text("")
        first.wait(timeout=MPI_TIMEOUT_S)
    first_err = log.read_text()
    assert second.returncode == EXIT_USAGE, second.stderr
    assert named and named.group(1) == socket.gethostname(), second.stderr
    assert alive and str(cfg) in alive and "fedmpi" in alive
    assert len(fedmpi_lines(second.stderr)) == 1, second.stderr          # rank 0 alone says it
    assert first.returncode == 0, first_err
    metrics, attrs = read_metrics(out)
    assert attrs["status"] == "finished" and metrics["round"].tolist() == list(range(rounds))
    assert sorted(os.listdir(out / "ckpt")) == [f"ckpt-{rounds - 1}.h5", f"ckpt-{rounds}.h5"]


def cmdline_of(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_input_errors_are_printed_once_under_mpi(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", small_config(tmp_path / "out"))
    # Found before MPI starts, identically on every rank: the launcher's rank 0 prints.
    proc = run_fedmpi(3, "run", cfg, "partition.clients=0", "server.lr=-1", check=False)
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert fedmpi_lines(proc.stderr) == [
        "fedmpi: config error: partition.clients = 0: must be an integer in [1, 1e+08]",
        "fedmpi: config error: server.lr = -1.0: must be a number in (0, 1e+06]"], proc.stderr
    # Found by rank 0 after MPI started (out names a file): the other ranks leave silently with the same code.
    taken = tmp_path / "taken"
    taken.write_text("x")
    proc = run_fedmpi(3, "run", cfg, f"out={taken}", check=False)
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert fedmpi_lines(proc.stderr) == [f"fedmpi: config error: out = '{taken}' is a file, not a folder; choose "
                                         f"another out=..."], proc.stderr


def test_malicious_cifar_batch_runs_no_code_on_any_rank(tmp_path):
    cfg, marker, batch = malicious_cifar_run(tmp_path, "data_batch_2", n_train=60)
    proc = run_fedmpi(3, "run", cfg, check=False)
    assert not marker.exists()
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert str(batch) in proc.stderr
    assert not (tmp_path / "out" / "run.h5").exists()
