"""Issue 39, failures while a run writes: a full disk or an I/O error at any write of a run (run.h5 rows, the
final model, a checkpoint's datasets or its commit, a tracker) ends the run with one line naming the file and
the system's reason, exit 1, run.h5 `failed` with every round before the failure, no traceback, no HDF5 error
stack, no segfault. The failures are injected with the FEDMPI_TEST_WRITE_FAIL test aid (fedmpi.io.write_errors)
at every kind of write it knows, and made real on a small tmpfs where one can be mounted (there HDF5 itself
meets the full disk once fedmpi's reservation is switched off, as on a file system that cannot reserve)."""

from __future__ import annotations

import errno
import os
import re
import subprocess

import h5py
import pytest
from conftest import MPI_TIMEOUT_S, ROOT, fedmpi_cmd, small_config, write_config

from fedmpi.core.errors import EXIT_FAILED
from fedmpi.io import checkpoint, write_errors

NOISE = ("Traceback", "HDF5-DIAG", "Exception ignored", "Segmentation fault", "BAD TERMINATION", "signal")
ROUNDS = 3
# kind -> (the write of that kind that fails, the rounds run.h5 keeps): rows 2 is round 1's row; a
# checkpoint's first dataset is the one after round 1; commit 2 the checkpoint after round 2; the tracker's
# writes are its file's first event, the config, then one per round (4: round 1, after its row is in run.h5).
INJECTED = {"rows": (2, 1), "model": (1, ROUNDS), "checkpoint": (1, 1), "commit": (2, 2), "tracker": (4, 2)}
ERRNOS = ("ENOSPC", "EIO")
# A wrapper that runs fedmpi with the room reservation off, so that HDF5 itself meets the full disk.
NO_RESERVATION = ("import sys; from mpi4py import MPI; from fedmpi.io import disk_room; "
                  "disk_room.Room.ensure = lambda *a, **k: None; "
                  "from fedmpi.cli import main; sys.exit(main(['run', {cfg!r}]))")


def fedmpi_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("fedmpi:")]


def launch(n, cfg, env=None, reserve=True):
    argv = fedmpi_cmd(n, "run", cfg) if reserve else [*fedmpi_cmd(n)[:-2], "-c", NO_RESERVATION.format(cfg=str(cfg))]
    return subprocess.run(argv, capture_output=True, text=True, timeout=MPI_TIMEOUT_S, cwd=ROOT,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


def run_config(tmp_path, out, **sections):
    base = {"rounds": ROUNDS, "checkpoint": {"every": 1, "keep": 5},
            "runtime": {"threads": 1, "progress": "lines", "log_flush_s": 0, "trackers": ["tensorboard"]}}
    return write_config(tmp_path / "c.yaml", small_config(out, **{**base, **sections}))


def assert_failed_write(proc, out, file_pattern, reason, rows):
    """Exit 1, one `fedmpi:` line naming the file and the reason, nothing else on stderr that looks like a
    crash; run.h5 `failed` with that line and rounds 0..rows-1 complete; no temporary file left behind, and
    every checkpoint left a valid one."""
    assert proc.returncode == EXIT_FAILED, proc.stderr[-3000:]
    lines = fedmpi_lines(proc.stderr)
    assert len(lines) == 1, lines
    assert re.fullmatch(rf"fedmpi: cannot write {file_pattern}: {re.escape(reason)}", lines[0]), lines
    assert not [word for word in NOISE if word in proc.stderr], proc.stderr[-3000:]
    with h5py.File(out / "run.h5", "r", locking=False) as f:
        assert f.attrs["status"] == "failed" and f.attrs["error"] == lines[0].removeprefix("fedmpi: ")
        assert f["metrics/round"][()].tolist() == list(range(rows))
        for group in ("metrics", "clients", "timing"):
            assert all(ds.shape[0] == rows and ds[()].shape[0] == rows for ds in f.get(group, {}).values())
    names = os.listdir(out / "ckpt") if (out / "ckpt").exists() else []
    assert all(checkpoint.NAME.match(name) for name in names), names
    for _, path in checkpoint.list_checkpoints(str(out)):
        checkpoint.verify(path)


def expected_file(kind, out, rows):
    if kind in ("rows", "model"):
        return re.escape(str(out / "run.h5"))
    if kind in ("checkpoint", "commit"):
        return re.escape(checkpoint.ckpt_path(str(out), rows))
    return re.escape(str(out / "tensorboard")) + r"/run-[0-9T-]+/events\.out\.tfevents\.\S+"


def test_every_kind_of_write_is_covered():
    assert set(INJECTED) == set(write_errors.KINDS)


@pytest.mark.parametrize("kind", sorted(INJECTED))
def test_a_failed_write_ends_the_run_with_one_line(tmp_path, kind):
    # ENOSPC and EIO take turns over the kinds (one launch each).
    code = ERRNOS[sorted(INJECTED).index(kind) % len(ERRNOS)]
    nth, rows = INJECTED[kind]
    out = tmp_path / "run"
    proc = launch(1, run_config(tmp_path, out), {write_errors.FAIL_ENV: f"{kind}:{nth}:{code}"})
    assert_failed_write(proc, out, expected_file(kind, out, rows), os.strerror(getattr(errno, code)), rows)
    if kind == "model":
        with h5py.File(out / "run.h5", "r", locking=False) as f:
            assert "model" not in f


def test_a_run_whose_checkpoint_failed_resumes_from_the_one_before(tmp_path):
    out = tmp_path / "run"
    cfg = run_config(tmp_path, out)
    proc = launch(1, cfg, {write_errors.FAIL_ENV: "commit:2:ENOSPC"})
    assert_failed_write(proc, out, expected_file("commit", out, 2), os.strerror(errno.ENOSPC), 2)
    resumed = subprocess.run(fedmpi_cmd(1, "run", cfg, "--resume"), capture_output=True, text=True,
                             timeout=MPI_TIMEOUT_S, cwd=ROOT)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    with h5py.File(out / "run.h5", "r", locking=False) as f:
        assert f.attrs["status"] == "finished" and f["metrics/round"][()].tolist() == list(range(ROUNDS))


# -- a real full disk ----------------------------------------------------------------------------------

@pytest.mark.parametrize("reserve", [True, False], ids=["reserved", "hdf5-meets-it"])
def test_full_disk_at_a_checkpoint_ends_the_run_with_one_line(tmp_path, small_disk, reserve):
    # An mlp of 795k parameters: a checkpoint of 7 MB (the model and FedAvg's copy of it). 10.5 MB free
    # hold run.h5 and the first checkpoint, not the second (main: 70 tracebacks and a segfault where HDF5
    # met the full disk, a two-line h5py message otherwise).
    disk = small_disk(16384, 10500)
    out = disk / "run"
    cfg = run_config(tmp_path, out, model={"name": "mlp", "hidden": 1000},
                     runtime={"threads": 1, "progress": "lines", "log_flush_s": 0})
    proc = launch(1, cfg, reserve=reserve)
    assert_failed_write(proc, out, expected_file("checkpoint", out, 2), os.strerror(errno.ENOSPC), 2)


# -- under mpiexec -n 3 ----------------------------------------------------------------------------------

def scaffold_config(tmp_path, out, **sections):
    """SCAFFOLD keeps a control variate per client on the rank that trains it: a checkpoint streams 100s of
    client states from the workers to rank 0."""
    return run_config(tmp_path, out, model={"name": "mlp", "hidden": 20}, algorithm={"name": "scaffold"},
                      partition={"clients": 400, "scheme": "iid"}, server={"clients_per_round": 100},
                      **sections)


@pytest.mark.mpi
@pytest.mark.parametrize("kind, nth, code, rows", [("checkpoint", 40, "ENOSPC", 1), ("tracker", 4, "EIO", 2)])
def test_a_failed_write_under_mpi_ends_the_job_with_one_line(tmp_path, kind, nth, code, rows):
    # checkpoint 40: a client state streamed from a worker, in the first checkpoint.
    out = tmp_path / "run"
    proc = launch(3, scaffold_config(tmp_path, out), {write_errors.FAIL_ENV: f"{kind}:{nth}:{code}"})
    assert_failed_write(proc, out, expected_file(kind, out, rows), os.strerror(getattr(errno, code)), rows)


@pytest.mark.mpi
def test_full_disk_met_by_hdf5_under_mpi_ends_the_job_with_one_line(tmp_path, small_disk):
    # 2.5 MB free: the first checkpoint's client states do not fit (main: 166 tracebacks).
    disk = small_disk(16384, 2500)
    out = disk / "run"
    cfg = scaffold_config(tmp_path, out, runtime={"threads": 1, "progress": "lines", "log_flush_s": 0})
    proc = launch(3, cfg, reserve=False)
    assert_failed_write(proc, out, expected_file("checkpoint", out, 1), os.strerror(errno.ENOSPC), 1)
