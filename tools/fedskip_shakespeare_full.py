#!/usr/bin/env python3
"""FedSkip against FedAvg on the full Shakespeare build, in the paper's setting as far as two cores allow
(jobs/configs/fedskip/shakespeare_full.yaml): both over the same rounds, then their test figures as
a CSV and a PNG for docs/results/reproduction.md, and the seconds per round with the rounds an hour holds.

    python tools/fedskip_shakespeare_full.py [--rounds 30] [--steps K] [--ranks 3] [--eval-samples 10000]
           --data runs/data/shakespeare_full --out runs/fedskip_full
           --csv docs/results/reproduction_fedskip_shakespeare_full.csv
           --png docs/results/reproduction_fedskip_shakespeare_full.png

Every output left out goes into the working folder (refused inside the checkout, where the published CSV and
PNG are named as above).

The full build is made in --data where missing (`fedmpi data shakespeare`, the extra `shakespeare`). The
evaluation reads a fixed subsample of its test windows: `eval.max_samples` (--eval-samples) drawn once from
the run's seed, the same for both methods (recorded in run.h5 as /eval/test_indices). `--steps K` caps each
client's local work at K steps (`client.steps`) instead of the paper's 10 epochs, which take about half an
hour a round on two cores.
Each method is one `mpiexec -n RANKS fedmpi run` of the config; the table printed at the end gives each
method's median seconds per round (rounds 2 onwards, from run.h5's wall clock) and the rounds that fit in
an hour at that pace, with the evaluation's share.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from fedmpi.core.tool_outputs import place

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "jobs" / "configs" / "fedskip" / "shakespeare_full.yaml"
# The outputs' defaults, in the working folder (the published CSV and PNG are named: --csv docs/...).
DATA, OUT = "runs/data/shakespeare_full", "runs/fedskip_full"
CSV, PNG = "reproduction_fedskip_shakespeare_full.csv", "reproduction_fedskip_shakespeare_full.png"
METHODS = {"fedskip": [], "fedavg": ["algorithm={name: fedavg}"]}


def full_build(data):
    if not (Path(data) / "build.json").is_file():
        subprocess.run([sys.executable, "-m", "fedmpi", "data", "shakespeare", "--out", str(data)], check=True)
    return Path(data)


def mpiexec():
    """The launcher beside this Python (a venv's, as `make` installs it with MPICH), else the one on PATH."""
    from fedmpi.analysis.batch_report import require_mpiexec

    return require_mpiexec("fedskip_shakespeare_full", "or pass --ranks 1")


def run(method, rounds, steps, ranks, data, eval_samples, out):
    overrides = [f"rounds={rounds}", f"data.root={data}", f"eval.max_samples={eval_samples}", f"out={out}",
                 *METHODS[method]]
    if steps:
        overrides += [f"client.steps={steps}"]
    cmd = [sys.executable, "-m", "fedmpi", "run", str(CONFIG), *overrides, "--overwrite"]
    if ranks > 1:
        cmd = [mpiexec(), "-n", str(ranks), *cmd]
    start = time.monotonic()
    subprocess.run(cmd, check=True)
    return time.monotonic() - start


def figures(out):
    from fedmpi.analysis import report

    m = report.read_run(str(Path(out) / "run.h5")).metrics
    return {k: np.asarray(m[k], dtype=np.float64) for k in ("round", "test_acc", "test_loss", "wall_s") if k in m}


def per_round(m):
    """(median seconds of a round from round 2 on, seconds of the rounds with an evaluation beyond that)."""
    steps = np.diff(np.concatenate([[0.0], m["wall_s"]]))
    evaluated = np.isfinite(m["test_acc"])
    later = steps[1:] if len(steps) > 1 else steps
    plain = [s for s, e in zip(later, evaluated[1:]) if not e] or list(later)
    with_eval = [s for s, e in zip(later, evaluated[1:]) if e]
    median = statistics.median(plain)
    return median, (statistics.median(with_eval) - median if with_eval else 0.0)


def write_csv(path, rows):
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["method", "round", "test_acc", "test_loss", "wall_s"])
        for method, m in rows.items():
            for r, acc, loss, wall in zip(m["round"], m["test_acc"], m["test_loss"], m["wall_s"]):
                if np.isfinite(acc):
                    w.writerow([method, int(r) + 1, f"{acc:.6f}", f"{loss:.6f}", f"{wall:.1f}"])


def write_png(path, rows, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for method, m in rows.items():
        seen = np.isfinite(m["test_acc"])
        for ax, key in zip(axes, ("test_acc", "test_loss")):
            ax.plot(m["round"][seen] + 1, m[key][seen], marker="o", label=method)
    for ax, key in zip(axes, ("test accuracy", "test loss")):
        ax.set_xlabel("round")
        ax.set_ylabel(key)
        ax.legend()
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse(argv=None):
    """The options, every output (--data where it is built, --out, --csv, --png) an absolute path: left out,
    in the working folder, refused inside the checkout (fedmpi.core.tool_outputs)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--steps", type=int, help="local steps per client instead of the paper's 10 epochs")
    p.add_argument("--ranks", type=int, default=3)
    p.add_argument("--eval-samples", type=int, default=10_000)
    p.add_argument("--data", help=f"the full build, made here where missing (default ./{DATA})")
    p.add_argument("--out", help=f"folder of the two runs (default ./{OUT})")
    p.add_argument("--csv", help=f"the table (default ./{CSV}; the published one: --csv docs/results/{CSV})")
    p.add_argument("--png", help=f"the figure (default ./{PNG}; the published one: --png docs/results/{PNG})")
    args = p.parse_args(argv)
    args.data, args.out, args.csv, args.png = place(
        "fedskip_shakespeare_full.py", str(ROOT), (args.data, DATA, "--data"), (args.out, OUT, "--out"),
        (args.csv, CSV, "--csv", f"docs/results/{CSV}"), (args.png, PNG, "--png", f"docs/results/{PNG}"))
    return args


def main(argv=None):
    args = parse(argv)
    data = full_build(args.data)
    rows, took = {}, {}
    for method in METHODS:
        out = Path(args.out) / method
        took[method] = run(method, args.rounds, args.steps, args.ranks, data, args.eval_samples, out)
        rows[method] = figures(out)
    write_csv(args.csv, rows)
    local = f"{args.steps} local steps" if args.steps else "10 local epochs"
    write_png(args.png, rows, f"FedSkip (delta 3) vs FedAvg, full Shakespeare build (851 roles), 10 per round, "
                              f"{local}, {args.eval_samples:,} test windows, -n {args.ranks}")
    print(f"{'method':8} {'rounds':>6} {'s/round':>8} {'+eval s':>8} {'rounds/hour':>11} {'whole s':>8} "
          f"{'last acc':>8}")
    for method, m in rows.items():
        s, e = per_round(m)
        acc = m["test_acc"][np.isfinite(m["test_acc"])]
        print(f"{method:8} {len(m['round']):>6} {s:>8.1f} {e:>8.1f} {3600 / (s + e / 3):>11.1f} "
              f"{took[method]:>8.0f} {acc[-1] if len(acc) else float('nan'):>8.4f}")
    print(f"rounds/hour: 3600 / (s/round + the evaluation's extra seconds / 3, one evaluation every 3 rounds); "
          f"CSV {args.csv}, PNG {args.png}")


if __name__ == "__main__":
    main()
