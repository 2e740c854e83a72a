"""--resume, stop requests and killed workers, end to end under mpiexec (docs/explanation/design.md §1, §3; issue 4).

Launches are the cost here (each pays the torch import on every rank), so runs are shared:
- one -n 3 job runs, per algorithm, in sequence inside the same MPI job (as `fedmpi run` would, through
  `fedmpi.cli.main`): the whole run (the reference, every checkpoint kept), the first half, and the
  second half with --resume; fedavg's job also resumes a copy of the reference whose newest checkpoint
  was truncated. One -n 1 job then resumes a copy of the first half (another -n, a fresh process).
- SIGTERM and kill -9 hit real, separately launched fedavg jobs, compared with the fedavg reference.

Every algorithm's jobs share those two launches. To cover another algorithm with client state, add it to
ALGORITHMS (its runs join the two launches).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import session_runs
from conftest import ROOT, fedmpi_cmd, read_global, read_metrics, run_fedmpi, small_config, write_config

from fedmpi import config
from fedmpi.io import checkpoint, resume

pytestmark = pytest.mark.mpi

# name -> algorithm section; every one runs the resume tests below.
ALGORITHMS = {
    "fedavg": {"name": "fedavg"},
    "scaffold": {"name": "scaffold"},        # server control and per-client controls
    # Slots persist between aggregations: with delta 4 the checkpoint after round HALF - 1 lands
    # mid-period, so slot vectors must travel through the checkpoint (and to other ranks at -n 1).
    "fedskip": {"name": "fedskip", "delta": 4},
    "safl": {"name": "safl", "gating": True, "nu": 2.0},   # every client's local model z_k
}
R = 12                  # rounds; checkpoints every 2
HALF = R // 2
LAUNCH_TIMEOUT_S = 300
KILL_DEADLINE_S = 120     # a killed worker ends the job (MPI's process manager): seconds, generous under load
# Jobs that get signalled or killed sleep this long per round (experiment.py's test aid), so that the
# signal lands mid-run however fast or loaded the machine is; results are unchanged.
SLOW = {"FEDMPI_ROUND_DELAY_S": "0.3"}


def algo_config(base, name):
    cfg = small_config(base / name / "ref", rounds=R, algorithm=ALGORITHMS[name], checkpoint={"every": 2, "keep": 2})
    return write_config(base / f"{name}.yaml", cfg)


_RUNS = {}


def shared_runs(name, tmp_path_factory):
    """The jobs described in the module docstring, every algorithm's at once, run once per test session."""
    if not _RUNS:
        _RUNS.update(_launch_runs(tmp_path_factory))
    return _RUNS[name]


@pytest.fixture(scope="module", params=list(ALGORITHMS))
def runs(request, tmp_path_factory):
    return shared_runs(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def fedavg(tmp_path_factory):
    _, cfg, d = shared_runs("fedavg", tmp_path_factory)
    return cfg, d


def _launch_runs(tmp_path_factory):
    """Two launches for all of ALGORITHMS (a launch costs more than these runs): every algorithm's -n 3
    steps in one job, then every -n 1 resume in another. Each run has its own out; the stderr of a job
    holds every run's lines, and each assertion on it names its run's own paths."""
    base = tmp_path_factory.mktemp("resume")
    steps_n3, steps_n1, out = [], [], {}
    for name in ALGORITHMS:
        cfg = algo_config(base, name)
        d = {k: base / name / k for k in ("ref", "half", "half_n1", "truncated")}
        steps_n3 += [["run", cfg, "checkpoint.keep=100"],
                     ["run", cfg, f"out={d['half']}", f"rounds={HALF}"],
                     ["copy", d["half"], d["half_n1"]],
                     ["run", cfg, f"out={d['half']}", "--resume"]]
        if name == "fedavg":
            steps_n3 += [["copy", d["ref"], d["truncated"]],
                         ["truncate", d["truncated"] / "ckpt" / f"ckpt-{R}.h5"],
                         ["run", cfg, f"out={d['truncated']}", "--resume"]]
        steps_n1.append(["run", cfg, f"out={d['half_n1']}", "--resume"])
        out[name] = (name, cfg, d)
    stderr_n3 = session_runs.launch(3, steps_n3, timeout=len(ALGORITHMS) * LAUNCH_TIMEOUT_S).stderr
    stderr_n1 = session_runs.launch(1, steps_n1, timeout=len(ALGORITHMS) * LAUNCH_TIMEOUT_S).stderr
    for _, _, d in out.values():
        d["stderr_n3"], d["stderr_n1"] = stderr_n3, stderr_n1
    return out


def ckpt_global(run_dir, k):
    with h5py.File(Path(run_dir) / "ckpt" / f"ckpt-{k}.h5", "r", locking=False) as f:
        return f["global"][()]


def ckpt_layout(path):
    with h5py.File(path, "r", locking=False) as f:
        items = []
        f.visititems(lambda name, obj: items.append((name, getattr(obj, "shape", None))))
        return sorted(items), sorted(f.attrs)


def assert_same_metrics(got, ref, rtol=0.0):
    assert sorted(got) == sorted(ref)
    for key in ref:
        if key == "wall_s":
            continue
        assert got[key].shape == ref[key].shape, key
        if rtol and key == "model_sha256":     # across -n the models agree to float tolerance, not bits
            continue
        if rtol:
            np.testing.assert_allclose(got[key], ref[key], rtol=rtol, atol=1e-7, err_msg=key)
        else:
            np.testing.assert_array_equal(got[key], ref[key], err_msg=key)


def test_resume_at_same_n_is_bit_identical(runs):
    _, _, d = runs
    ref, ref_attrs = read_metrics(d["ref"])
    got, attrs = read_metrics(d["half"])
    assert ref_attrs["status"] == attrs["status"] == "finished" and len(got["round"]) == R
    assert f"from round {HALF} at world_size 3" in attrs["resumes"]
    assert_same_metrics(got, ref)
    assert np.array_equal(read_global(d["half"]), read_global(d["ref"]))
    assert np.array_equal(ckpt_global(d["half"], R), ckpt_global(d["ref"], R))
    # wall_s counts training seconds since the run began, across the resume.
    assert np.all(np.diff(got["wall_s"]) > 0) and got["wall_s"][HALF] > got["wall_s"][HALF - 1]


def test_resume_at_another_n_matches(runs):
    _, _, d = runs
    ref, _ = read_metrics(d["ref"])
    got, attrs = read_metrics(d["half_n1"])
    assert attrs["status"] == "finished" and attrs["world_size"] == 1
    assert_same_metrics(got, ref, rtol=1e-5)
    np.testing.assert_allclose(read_global(d["half_n1"]), read_global(d["ref"]), rtol=1e-5, atol=1e-7)
    assert f"resuming from {d['half_n1'] / 'ckpt' / f'ckpt-{HALF}.h5'}" in d["stderr_n1"]


def test_checkpoint_layout_does_not_depend_on_n(runs):
    name, _, d = runs
    at_n3, at_n1 = ckpt_layout(d["ref"] / "ckpt" / f"ckpt-{R}.h5"), ckpt_layout(d["half_n1"] / "ckpt" / f"ckpt-{R}.h5")
    assert at_n3 == at_n1
    datasets = dict(at_n3[0])
    assert datasets["global"] is not None and "round" in at_n3[1] and "checksum" in at_n3[1]
    if name == "scaffold":      # every client has trained by round R: one control each
        assert sum(1 for k in datasets if k.startswith("clients/") and k.endswith("/c_i")) == 12


def test_truncated_newest_checkpoint_falls_back_to_previous(fedavg):
    _, d = fedavg
    newest = d["truncated"] / "ckpt" / f"ckpt-{R}.h5"
    assert f"checkpoint {newest} is damaged" in d["stderr_n3"]
    assert f"resuming from {d['truncated'] / 'ckpt' / f'ckpt-{R - 2}.h5'}" in d["stderr_n3"]
    assert (newest.parent / f"ckpt-{R}.h5.damaged").exists()
    ref, _ = read_metrics(d["ref"])
    got, attrs = read_metrics(d["truncated"])        # rows R-1, R dropped and recomputed
    assert attrs["status"] == "finished" and f"from round {R - 2}" in attrs["resumes"]
    assert_same_metrics(got, ref)
    assert np.array_equal(ckpt_global(d["truncated"], R), ckpt_global(d["ref"], R))


def test_resume_with_another_config_exits_2_naming_the_key(fedavg, tmp_path):
    cfg, d = fedavg
    def run_files():    # not the lock file, which names the job that held out last
        return {p: p.read_bytes() for p in sorted(d["half"].rglob("*")) if p.is_file() and p.name != ".fedmpi.lock"}

    before = run_files()
    proc = run_fedmpi(1, "run", cfg, f"out={d['half']}", "--resume", "client.lr=0.1", "runtime.threads=2",
                      check=False, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "differs" in proc.stderr and "client.lr" in proc.stderr and "runtime.threads" not in proc.stderr
    assert run_files() == before
    empty = run_fedmpi(1, "run", cfg, f"out={tmp_path / 'none'}", "--resume", check=False, timeout=120)
    assert empty.returncode == 2 and "no checkpoint" in empty.stderr and not (tmp_path / "none").exists()


# -- signals and killed workers ----------------------------------------------------------------------

def rows(run_dir):
    try:
        with h5py.File(Path(run_dir) / "run.h5", "r", locking=False) as f:
            return f["metrics/round"].shape[0]
    except (OSError, KeyError):
        return 0        # not created yet, or mid-append


def rank_pid(proc, rank):
    """The pid of MPI rank `rank` among the descendants of `proc` (the launcher)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    todo = [proc.pid]
    while todo:
        for child in children.get(todo.pop(), []):
            todo.append(child)
            try:
                env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
                is_rank = b"fedmpi" in Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            if is_rank and any(var + str(rank).encode() in env
                               for var in (b"PMI_RANK=", b"OMPI_COMM_WORLD_RANK=", b"PMIX_RANK=")):
                return child
    return None


class Launched:
    """A fedmpi job in the background (its own session, so that cleanup can end all of it)."""

    def __init__(self, n, *args):
        self.proc = subprocess.Popen(fedmpi_cmd(n, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, cwd=ROOT, start_new_session=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **SLOW})

    def wait_rows(self, run_dir, k, timeout=LAUNCH_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        while rows(run_dir) < k:
            assert self.proc.poll() is None, f"job ended (rc {self.proc.returncode}) before round {k}"
            assert time.monotonic() < deadline, f"no round {k} within {timeout} s"
            time.sleep(0.05)

    def signal_rank(self, rank, sig):
        deadline = time.monotonic() + 10
        while (pid := rank_pid(self.proc, rank)) is None:
            assert time.monotonic() < deadline, f"rank {rank} not found"
            time.sleep(0.1)
        os.kill(pid, sig)

    def finish(self, timeout=LAUNCH_TIMEOUT_S):
        try:
            out, err = self.proc.communicate(timeout=timeout)
        finally:
            self.kill()
        return self.proc.returncode, out, err

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def test_sigterm_to_one_worker_stops_with_checkpoint_then_resumes(fedavg, tmp_path):
    cfg, d = fedavg
    out = tmp_path / "sigterm"
    job = Launched(3, "run", cfg, f"out={out}")
    try:
        job.wait_rows(out, 2)
        job.signal_rank(1, signal.SIGTERM)
        code, _, err = job.finish()
    finally:
        job.kill()
    assert code == 75, err
    metrics, attrs = read_metrics(out)
    k = len(metrics["round"])
    assert 2 <= k < R, "the stop did not land mid-run"
    assert attrs["status"] == "preempted" and f"after round {k}" in attrs["error"]
    newest_round, newest = checkpoint.list_checkpoints(out)[0]
    assert newest_round == k and checkpoint.verify(newest)["round"] == k
    run_fedmpi(3, "run", cfg, f"out={out}", "--resume", timeout=LAUNCH_TIMEOUT_S)
    ref, _ = read_metrics(d["ref"])
    got, attrs = read_metrics(out)
    assert attrs["status"] == "finished" and "previous status preempted" in attrs["resumes"]
    assert_same_metrics(got, ref)
    assert np.array_equal(read_global(out), read_global(d["ref"]))


def test_kill9_of_a_worker_ends_the_job_and_the_newest_checkpoint_resumes(fedavg, tmp_path):
    cfg, d = fedavg
    out = tmp_path / "kill9"
    job = Launched(3, "run", cfg, f"out={out}")
    try:
        job.wait_rows(out, 3)           # ckpt-2 is written before round 3 starts
        job.signal_rank(2, signal.SIGKILL)
        killed = time.monotonic()
        code, _, err = job.finish(timeout=KILL_DEADLINE_S)
        ended_after = time.monotonic() - killed
    finally:
        job.kill()
    assert code != 0 and ended_after < KILL_DEADLINE_S, (code, ended_after, err[-2000:])
    point = resume.choose(config.load(str(cfg), [f"out={out}"]), say=lambda s: None)
    assert point.round >= 2 and not point.damaged
    run_fedmpi(3, "run", cfg, f"out={out}", "--resume", timeout=LAUNCH_TIMEOUT_S)
    ref, _ = read_metrics(d["ref"])
    got, attrs = read_metrics(out)
    # The killed job could not record anything; the resume notes that it found the status still running.
    assert attrs["status"] == "finished" and "previous status running" in attrs["resumes"]
    assert_same_metrics(got, ref)
    assert np.array_equal(read_global(out), read_global(d["ref"]))
