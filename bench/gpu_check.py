"""The GPU check (bench/gpu_check.sh runs it): W1 and W3 on the GPU, in deterministic mode
(`runtime.deterministic: true`), checked four ways, one table at the end:

  reference      fedmpi at -n 2 against the benchmark's plain PyTorch loop on the same device: the same
                 accuracy, the same model to float tolerance
  -n 2 = -n 3    the model of every round (/metrics/model_sha256) identical at -n 2 and -n 3
  resume         half the rounds, then --resume to the end (at -n 3): identical to the uninterrupted run
  cuda-aware     runtime.cuda_aware_mpi: true (device buffers handed to MPI) at -n 2: identical to -n 2; an
                 MPI that is not CUDA-aware crashes there, which the table reports as such

    bench/gpu_check.sh                 # on a GPU machine: 20 rounds each, well under 8 minutes on one GPU
    bench/gpu_check.sh --dry-run       # the same checks on the CPU with 2 rounds (what CI runs)

Without a visible GPU it runs as --dry-run does (and says so). Exit 0 when every check passed. Every launch
is a real `mpiexec -n P fedmpi run`; the runs of one -n share one launch (one torch import per rank).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ("W1", "W3")
GPU_ROUNDS, DRY_ROUNDS = 20, 2
# The dry run's clients per round (as tests/test_bench.py's short workloads): minutes on a shared CPU.
DRY_OVERRIDES = {"W1": {"server": {"clients_per_round": 3}}, "W3": {"server": {"clients_per_round": 6}}}
# Per launch (three launches, two in the dry run): on one GPU the whole check stays under 8 minutes; a
# shared CPU gets longer.
LAUNCH_TIMEOUT_S = {"cuda": 140, "cpu": 420}
STEPS = r"""
import json, sys
from fedmpi.cli import main
for args in json.loads(sys.argv[1]):
    code = main(["run", *args])
    if code:
        sys.exit(code)
"""


def _bench():
    spec = importlib.util.spec_from_file_location("fedmpi_bench", ROOT / "bench" / "bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def configs(bench, work, device, rounds, dry):
    """{(workload, run): (config path, out folder)} for every run of the check."""
    out = {}
    for wl in WORKLOADS:
        extra = {"runtime": {"device": device, "deterministic": True}}
        extra = bench._merge(extra, DRY_OVERRIDES[wl]) if dry else extra
        half = max(1, rounds // 2)
        every = {"checkpoint": {"every": half}}
        runs = {"n2": {}, "n3": every, "half": {"rounds": half, **every},
                "cuda_aware": {"runtime": {"cuda_aware_mpi": True}}}
        for run, more in runs.items():
            folder = work / wl / run
            cfg = bench.workload_config(wl, folder / "out", rounds, "auto", bench._merge(extra, more))
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / "config.yaml"
            path.write_text(json.dumps(cfg))         # JSON is YAML
            out[(wl, run)] = (path, folder / "out", cfg)
    return out


def launch(n, steps, device, env=None):
    """One mpiexec running `fedmpi run` for each argument list of `steps` in turn; (exit code, seconds, stderr)."""
    bench = _bench()
    cmd = [bench.mpiexec(), "-n", str(n), sys.executable, "-c", STEPS, json.dumps([[str(a) for a in s] for s in steps])]
    began = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S[device], cwd=ROOT,
                              env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})})
    except subprocess.TimeoutExpired:
        return 124, time.monotonic() - began, f"timed out after {LAUNCH_TIMEOUT_S[device]} s"
    return proc.returncode, time.monotonic() - began, proc.stderr


def read_run(out):
    import h5py

    with h5py.File(Path(out) / "run.h5", "r", locking=False) as f:
        m = {k: ds[()] for k, ds in f["metrics"].items()}
        return {"sha": [s.decode() if isinstance(s, bytes) else str(s) for s in m["model_sha256"]],
                "acc": m["test_acc"], "wall": m["wall_s"], "model": f["model/global"][()],
                "device": str(f.attrs.get("device", "?")), "status": str(f.attrs.get("status", "?"))}


def per_round(run):
    wall = np.asarray(run["wall"], dtype=float)
    steps = np.diff(np.concatenate([[0.0], wall]))
    return float(np.median(steps[1:])) if len(steps) > 1 else float(steps[0])


def check(dry=False, work=None):
    """Runs every check; returns (rows of the table, all passed)."""
    import torch

    bench = _bench()
    gpu = torch.cuda.is_available() and not dry
    device, rounds = ("cuda", GPU_ROUNDS) if gpu else ("cpu", DRY_ROUNDS)
    work = Path(work or tempfile.mkdtemp(prefix="fedmpi-gpu-check-")).resolve()    # launches run in ROOT
    runs = configs(bench, work, device, rounds, not gpu)
    rows = []
    n2_steps = [[runs[(wl, "n2")][0], "--overwrite"] for wl in WORKLOADS]
    aware_steps = [[runs[(wl, "cuda_aware")][0], "--overwrite"] for wl in WORKLOADS]
    if gpu:
        code2, s2, err2 = launch(2, n2_steps, device)
    else:
        # On the CPU the device-buffer runs join the -n 2 launch (one launch fewer): the test aid only acts
        # on runs with runtime.cuda_aware_mpi set, so the plain -n 2 runs are untouched by it. On a GPU they
        # stay apart, so that an MPI that is not CUDA-aware, crashing there, cannot take the -n 2 runs along.
        code2, s2, err2 = launch(2, n2_steps + aware_steps, device, env={"FEDMPI_TEST_DEVICE_MPI": "1"})
    code3, s3, err3 = launch(3, [step for wl in WORKLOADS for step in (
        [runs[(wl, "n3")][0], "--overwrite"], [runs[(wl, "half")][0], "--overwrite"],
        [runs[(wl, "half")][0], "--resume", f"rounds={rounds}"])], device)
    # The device-buffer path on a CPU needs the test aid (fedmpi.round.wire.DEVICE_MPI_TEST); on a GPU it is real.
    code_c, s_c, err_c = launch(2, aware_steps, device) if gpu else (code2, s2, err2)
    for wl in WORKLOADS:
        n2 = _maybe(read_run, runs[(wl, "n2")][1]) if code2 == 0 else None
        n3 = _maybe(read_run, runs[(wl, "n3")][1]) if code3 == 0 else None
        resumed = _maybe(read_run, runs[(wl, "half")][1]) if code3 == 0 else None
        aware = _maybe(read_run, runs[(wl, "cuda_aware")][1]) if code_c == 0 else None
        ref = bench.reference(runs[(wl, "n2")][2], device=device) if n2 else None
        if n2 and ref:
            same_acc = float(n2["acc"][-1]) == float(ref["acc"])
            gap = float(np.max(np.abs(n2["model"] - ref["global"])))
            ok = same_acc and np.allclose(n2["model"], ref["global"], rtol=1e-4, atol=1e-5)
            rows.append(("reference", wl, "-n 2", n2["device"], ok,
                         f"acc {n2['acc'][-1]:.4f} vs ref {ref['acc']:.4f}, max |dx| {gap:.1e}, "
                         f"{per_round(n2):.3f} s/round"))
        else:
            rows.append(("reference", wl, "-n 2", device, False, _failed(code2, err2)))
        if n2 and n3:
            rows.append(("-n 2 = -n 3", wl, "-n 3", n3["device"], n2["sha"] == n3["sha"],
                         f"{sum(a == b for a, b in zip(n2['sha'], n3['sha']))}/{len(n3['sha'])} rounds' models "
                         f"identical, {per_round(n3):.3f} s/round"))
        else:
            rows.append(("-n 2 = -n 3", wl, "-n 3", device, False, _failed(code3, err3)))
        if n3 and resumed:
            same = resumed["sha"] == n3["sha"] and np.array_equal(resumed["model"], n3["model"])
            rows.append(("resume", wl, "-n 3", resumed["device"], same,
                         f"{max(1, rounds // 2)} of {rounds} rounds, then --resume: "
                         f"{'identical to' if same else 'differs from'} the uninterrupted run"))
        else:
            rows.append(("resume", wl, "-n 3", device, False, _failed(code3, err3)))
        if n2 and aware:
            same = aware["sha"] == n2["sha"]
            rows.append(("cuda-aware", wl, "-n 2", aware["device"], same,
                         f"device buffers to MPI: {'identical to' if same else 'differs from'} -n 2"))
        else:
            why = _failed(code_c, err_c)
            if code_c < 0 or code_c in (139, 134) or "Segmentation" in err_c:
                why = f"crashed (exit {code_c}): is this MPI CUDA-aware? {why}"
            rows.append(("cuda-aware", wl, "-n 2", device, False, why))
    launches = (f"-n 2 {s2:.0f} s, -n 3 {s3:.0f} s, cuda-aware -n 2 {s_c:.0f} s" if gpu
                else f"-n 2 with cuda-aware {s2:.0f} s, -n 3 {s3:.0f} s")
    rows.append(("launches", "-", "-", device, True, launches
                 + ("" if gpu else "; dry run on the CPU (no GPU visible, or --dry-run): 2 rounds")))
    return rows, all(r[4] for r in rows), work


def _maybe(fn, *args):
    try:
        return fn(*args)
    except (OSError, KeyError):
        return None


def _failed(code, err):
    tail = [line for line in err.strip().splitlines() if line.strip()][-1:] or ["no output"]
    return f"launch exited {code}: {tail[0][:160]}"


def print_table(rows, file=sys.stdout):
    header = ("check", "workload", "-n", "device", "result", "detail")
    table = [header] + [(c, w, n, d, "ok" if ok else "FAIL", detail) for c, w, n, d, ok, detail in rows]
    widths = [max(len(str(r[i])) for r in table) for i in range(len(header) - 1)]
    for i, r in enumerate(table):
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)) + "  " + r[-1], file=file)
        if i == 0:
            print("  ".join("-" * w for w in widths) + "  " + "-" * 6, file=file)
    file.flush()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="run the checks on the CPU with 2 rounds (CI)")
    p.add_argument("--out", help="keep the runs in this folder (default: a temporary folder, removed)")
    args = p.parse_args(argv)
    began = time.monotonic()
    rows, passed, work = check(dry=args.dry_run, work=args.out)
    print_table(rows)
    print(f"gpu_check: {'every check passed' if passed else 'FAILED'} in {time.monotonic() - began:.0f} s")
    if not args.out:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
