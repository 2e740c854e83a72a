"""How bench/bench.py launches and measures its jobs: one `mpiexec -n P fedmpi run` of a generated config
(`start_fedmpi`, through bench/_rank.py, its figures read back from run.h5 and each rank's stats file), the
reference loop in a process of its own (`start_reference`, which runs `bench.py --reference-worker`, whose
body is `_reference_worker`), the two-process floor (`FloorJob`), and what fedmpi's collectives move per
round. Kept apart from bench.py, which defines the workloads, pairs the jobs and prints the table, so that
neither outgrows a module; bench.py re-exports these names (bench/gpu_check.py, bench/large_model.py and
the tests call them there).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RANK_SCRIPT = Path(__file__).resolve().parent / "_rank.py"
BENCH_SCRIPT = Path(__file__).resolve().parent / "bench.py"    # its --reference-worker runs the reference loop


def _sibling(name):
    """bench/NAME.py as a module, as bench.py loads it (the same sys.modules key: one copy of each module)."""
    key = f"fedmpi_bench_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, Path(__file__).resolve().parent / f"{name}.py")
        sys.modules[key] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[key]


pacing = _sibling("pacing")      # round-by-round pairing: a paced job's ranks wait for their turn
reference = _sibling("reference_loop").reference     # the plain PyTorch loop, the floor


# --- fedmpi runs -------------------------------------------------------------------------------------

def mpiexec():
    from fedmpi.analysis.batch_report import require_mpiexec

    return require_mpiexec("bench")


class Job:
    """One launched benchmark process (fedmpi's `mpiexec`, or the reference loop); `wait()` returns its
    figures (`collect(whole seconds)`). Output goes to files in its folder, so that a job that talks a lot
    cannot block on a full pipe while another job has the turn."""

    def __init__(self, name, cmd, env, workdir, collect, timeout):
        self.name, self.workdir, self.collect, self.timeout = name, Path(workdir), collect, timeout
        self.stdout, self.stderr = self.workdir / "stdout.txt", self.workdir / "stderr.txt"
        self.began = time.monotonic()
        with open(self.stdout, "w") as out, open(self.stderr, "w") as err:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=ROOT)

    def wait(self):
        try:
            code = self.proc.wait(timeout=max(1.0, self.timeout - (time.monotonic() - self.began)))
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"{self.name} ran over {self.timeout} s") from None
        whole = time.monotonic() - self.began
        if code != 0:
            raise RuntimeError(f"{self.name} exited {code}:\n{self.stderr.read_text()[-3000:]}")
        return self.collect(whole)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def start_fedmpi(cfg_map, n, workdir, timeout=3600, sample_memory=False, env_extra=None):
    """Launches one `mpiexec -n n fedmpi run` of `cfg_map` (a Job). `env_extra`: e.g. bench/pacing's
    $FEDMPI_BENCH_PACE, which makes every rank wait for its turn before each round."""
    workdir = Path(workdir)
    stats_dir = workdir / "stats"
    shutil.rmtree(stats_dir, ignore_errors=True)
    stats_dir.mkdir(parents=True)
    cfg_path = workdir / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg_map, sort_keys=False))
    env = {**os.environ, "FEDMPI_BENCH_STATS": str(stats_dir), "PYTHONUNBUFFERED": "1",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **(env_extra or {})}
    if sample_memory:
        env["FEDMPI_BENCH_SAMPLE_MEMORY"] = "1"
    cmd = [mpiexec(), "-n", str(n), sys.executable, str(RANK_SCRIPT), "run", str(cfg_path), "--overwrite"]
    paced = bool(env_extra and pacing.ENV in env_extra)
    return Job(f"fedmpi -n {n}", cmd, env, workdir,
               lambda whole: _fedmpi_figures(cfg_map, n, stats_dir, whole, paced), timeout)


def run_fedmpi(cfg_map, n, workdir, timeout=3600, sample_memory=False):
    """One `mpiexec -n n fedmpi run` of `cfg_map`, alone; returns the measured figures. `sample_memory` adds
    each rank's peak PSS and USS (sampled from /proc, at a CPU cost the speed workloads should not pay)."""
    return start_fedmpi(cfg_map, n, workdir, timeout, sample_memory).wait()


def _fedmpi_figures(cfg_map, n, stats_dir, whole, paced):
    """A finished fedmpi job's figures from run.h5 and each rank's stats file. Paced (round-by-round
    pairing), a round's seconds are rank 0's `run_round` (its clock starts after the turn's wait) and the
    whole-process time leaves out the waits; otherwise the rounds are the differences of run.h5's wall_s."""
    import h5py
    import numpy as np

    with h5py.File(Path(cfg_map["out"]) / "run.h5", "r", locking=False) as f:
        m = {k: ds[()] for k, ds in f["metrics"].items()}
        device, dim = str(f.attrs.get("device", "?")), int(f.attrs.get("dim", 0))
        training = int(f.attrs.get("training_ranks", max(n - 1, 1)))
    wall = np.asarray(m["wall_s"], dtype=float)
    ranks = sorted((json.loads(p.read_text()) for p in stats_dir.glob("rank-*.json")), key=lambda s: s["rank"])
    # A round is as long as its busiest rank: CPU seconds, which other processes on the machine inflate far
    # less than wall time.
    busy = [max(r["round_cpu_s"][i] for r in ranks) for i in range(min(len(r["round_cpu_s"]) for r in ranks))]
    acc = m["test_acc"][~np.isnan(m["test_acc"])]
    rounds = ranks[0]["round_wall_s"] if paced else np.diff(np.concatenate([[0.0], wall])).tolist()
    return {
        "rounds": rounds,
        "busy_rounds": busy,
        "whole_s": whole - (ranks[0].get("pace_wait_s", 0.0) if paced else 0.0),
        "loop_s": float(sum(rounds)),
        "acc": float(acc[-1]) if len(acc) else float("nan"),
        "device": device,
        "training_ranks": training,
        "peak_rss_mb": [s["peak_rss_mb"] for s in ranks],
        "peak_pss_mb": [s.get("peak_pss_mb", float("nan")) for s in ranks],
        "peak_uss_mb": [s.get("peak_uss_mb", float("nan")) for s in ranks],
        # the peak RSS less the other ranks' round-window slots this rank read (bench/_rank.py): what it holds
        "peak_held_mb": [s["peak_rss_mb"] - s.get("others_slots_mb", float("nan")) for s in ranks],
        "cpu_s": sum(s["cpu_s"] for s in ranks),
        "server_cpu_s": ranks[0]["cpu_s"] if ranks and n > 1 else float("nan"),
        "fl_bytes": float(np.nansum(m["bytes_up"]) + np.nansum(m["bytes_down"])),
        "mpi_bytes_per_round": mpi_bytes_per_round(n, dim, cfg_map),
    }


def mpi_bytes_per_round(n, dim, cfg_map):
    """What fedmpi's collectives move per round for a FedAvg-shaped algorithm: the float32 broadcast of
    the model (+ 2 header values) to every other rank and the float64 reduction of (sums, 7 statistics, one
    figure per client, 6 timing figures per rank) from every other rank, plus in evaluated rounds the model's
    broadcast and the evaluation's reduction (a loss per test batch, a count per class; not counted here).
    Nothing moves at -n 1."""
    if n == 1:
        return 0.0
    others, clients = n - 1, cfg_map["partition"]["clients"]
    return others * (4.0 * (dim + 2) + 8.0 * (dim + 7 + clients + 6 * n))


# --- the reference loop -----------------------------------------------------------------------------

def start_reference(cfg_map, workdir, timeout=3600, env_extra=None, share=None):
    """Launches the reference loop in its own process (a Job; its whole-process time counts its imports too);
    `share` (k, K): only its k-th share of each round's clients (the two-process floor)."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    cfg_path, out_path = workdir / "config.yaml", workdir / "reference.json"
    cfg_path.write_text(yaml.safe_dump(cfg_map, sort_keys=False))
    cmd = [sys.executable, str(BENCH_SCRIPT), "--reference-worker", str(cfg_path), str(out_path)]
    cmd += ["--share", str(share[0]), str(share[1])] if share else []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **(env_extra or {})}

    def collect(whole):
        out = json.loads(out_path.read_text())
        out.update(whole_s=whole - out.pop("pace_wait_s"), server_cpu_s=float("nan"), device="cpu",
                   fl_bytes=float("nan"), mpi_bytes_per_round=0.0)
        return out

    return Job("reference loop", cmd, env, workdir, collect, timeout)


class FloorJob:
    """The two-process floor ("ref x2"): K reference processes side by side, each training its share of
    every round's clients as fedmpi's K training ranks would (one launch, one pace: each reports its rounds
    done). A round lasts as long as its slower process: what two plain PyTorch processes on this machine
    achieve, with no communication, server or log at all."""

    def __init__(self, cfg_map, workdir, env_extra=None, processes=2):
        paced = bool(env_extra and pacing.ENV in env_extra)     # then each process reads a `go` pipe of its own
        self.jobs = [start_reference(cfg_map, Path(workdir) / f"share{k}", share=(k, processes),
                                     env_extra=pacing.part_env(env_extra, k) if paced else env_extra)
                     for k in range(processes)]
        self.proc = self      # take_turns polls the group

    def poll(self):
        """A failed process's exit code, or 0 once all have ended; None while any runs. (One that finished its
        last round may end while the other still runs that round: the turn is not over then.)"""
        codes = [job.proc.poll() for job in self.jobs]
        failed = [code for code in codes if code not in (None, 0)]
        return failed[0] if failed else (0 if all(code == 0 for code in codes) else None)

    def wait(self):
        samples = [job.wait() for job in self.jobs]
        per_round = lambda key: [max(values) for values in zip(*(s[key] for s in samples))]  # noqa: E731
        return {**samples[0], "rounds": per_round("rounds"), "busy_rounds": per_round("busy_rounds"),
                "whole_s": max(s["whole_s"] for s in samples), "cpu_s": sum(s["cpu_s"] for s in samples),
                "peak_rss_mb": [r for s in samples for r in s["peak_rss_mb"]], "training_ranks": len(samples),
                "acc": float("nan")}

    def kill(self):
        for job in self.jobs:
            job.kill()


def run_reference(cfg_map, workdir, timeout=3600):
    """The reference loop alone; returns its figures."""
    return start_reference(cfg_map, workdir, timeout).wait()


def _reference_worker(cfg_path, out_path, share=None):
    import resource

    with open(cfg_path) as fh:
        cfg_map = yaml.safe_load(fh)
    baton = pacing.Baton.from_env()
    out = reference(cfg_map, pace=baton, share=share)
    out.pop("global")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out["peak_rss_mb"] = [usage.ru_maxrss / 1024.0]
    out["cpu_s"] = usage.ru_utime + usage.ru_stime
    out["pace_wait_s"] = baton.waited if baton else 0.0
    out["loop_s"] = sum(out["rounds"])
    Path(out_path).write_text(json.dumps(out))
