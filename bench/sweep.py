#!/usr/bin/env python3
"""`fedmpi sweep`'s benchmark: a grid of small experiments as ONE `fedmpi sweep` against one `fedmpi run` launch per
experiment and against tools/run_batch.py (the experiments one after another in one launch), all three at the
same number of ranks, interleaved: each repeat runs the three arms, in the reverse order every other repeat.

    python bench/sweep.py [--np 3] [--rounds 30] [--repeats 2] --out runs/bench-sweep [--json FILE]
    python bench/sweep.py --quick          # 2 tiny experiments, 1 repeat: a smoke test of the whole benchmark

The grid is jobs/sweeps/quickstart_grid.yaml's (the quickstart: mnist5k, cnn_mnist, 30 clients, 10 per round;
8 settings x 3 seeds = 24 experiments), at --rounds rounds; the sweep gives each experiment --sweep-ranks
ranks (default 1: NP - 1 experiments at a time), the other arms run every experiment on all NP ranks.

Printed per arm: the wall time of the whole grid (median over the repeats, min-max), the wall time per
experiment, the round-loop seconds (the sum over the experiments of run.h5's final wall_s: the time inside
the rounds), and the ratio of the sweep's wall time to the arm's, paired within each repeat (median, min-max).
Overhead per experiment: (wall - round-loop seconds / experiments running at once) / experiments, i.e. what an
experiment costs beyond its rounds: the launch, the imports, the data, set-up. Target: the sweep at
most half the wall time of the separate launches. Timings on a shared machine are noisy: compare the ratios of
one run of this script, not figures across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys

import h5py
import yaml

from fedmpi.core.tool_outputs import output_or_default

# bench/timed_launch.py, beside this script (its folder appended, not first: nothing of the path is shadowed)
sys.path.append(os.path.dirname(os.path.abspath(__file__)))
from timed_launch import timed_launch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRID = os.path.join(ROOT, "jobs", "sweeps", "quickstart_grid.yaml")
QUICK = {"grid": {"algorithm.name": ["fedavg", "fedprox"]}, "seeds": [0],
         "overrides": {"partition.clients": 6, "server.clients_per_round": 2, "model.name": "lr"}}
ARMS = ("sweep", "separate", "run_batch")


def parse(argv):
    p = argparse.ArgumentParser(prog="bench/sweep.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--np", type=int, default=3, help="ranks of every launch (default 3)")
    p.add_argument("--rounds", type=int, default=None, help="rounds per experiment (default: the grid's, 30)")
    p.add_argument("--repeats", type=int, default=2, help="repeats of the three arms (default 2)")
    p.add_argument("--sweep-ranks", type=int, default=1, help="ranks per experiment in the sweep (default 1)")
    p.add_argument("--out", help="work folder, replaced (default ./runs/bench-sweep, refused inside the checkout)")
    p.add_argument("--json", help="also write the figures as JSON")
    p.add_argument("--quick", action="store_true", help="2 tiny experiments, 1 round, 1 repeat")
    args = p.parse_args(argv)
    # Absolute: the launches run with the checkout as their working folder (fedmpi.core.tool_outputs).
    args.out = output_or_default(args.out, "bench/sweep.py", os.path.join("runs", "bench-sweep"), "--out", ROOT)
    if args.quick:
        args.rounds, args.repeats = 1, 1
    return args


def grid_spec(args):
    """The benchmark's spec (a mapping): the quickstart grid, its base made absolute, at --rounds."""
    with open(GRID) as fh:
        spec = yaml.safe_load(fh)
    spec["base"] = os.path.normpath(os.path.join(os.path.dirname(GRID), spec["base"]))
    if args.quick:
        spec.update(QUICK)
    if args.rounds is not None:
        spec.setdefault("overrides", {})["rounds"] = args.rounds
    spec["ranks"] = args.sweep_ranks
    return spec


def _expanded(spec, seeds=True):
    """The grid's experiments (fedmpi.sweep.spec.Experiment), as `fedmpi sweep` expands and names them."""
    from fedmpi.sweep.spec import expand

    grid = {k: list(v) for k, v in spec.get("grid", {}).items()}
    return expand(spec["base"], spec.get("overrides", {}), grid, [], spec.get("seeds") if seeds else None)


def _text(value):
    return yaml.safe_dump(value, default_flow_style=True, width=float("inf")).strip().removesuffix("...").strip()


def _launch(args, command, log):
    return timed_launch("bench/sweep.py", args.np, command, log, ROOT)


def run_sweep(args, spec, folder):
    path = os.path.join(folder, "spec.yaml")
    with open(path, "w") as fh:
        yaml.safe_dump({**spec, "out": os.path.join(folder, "runs")}, fh, sort_keys=False)
    wall = _launch(args, [sys.executable, "-m", "fedmpi", "sweep", path], os.path.join(folder, "log.txt"))
    return wall, os.path.join(folder, "runs")


def run_separate(args, spec, folder):
    runs, wall = os.path.join(folder, "runs"), 0.0
    for e in _expanded(spec):
        overrides = [f"{k}={_text(v)}" for k, v in e.overrides.items()]
        wall += _launch(args, [sys.executable, "-m", "fedmpi", "run", spec["base"], *overrides,
                               f"out={os.path.join(runs, e.name)}"], os.path.join(folder, "log.txt"))
    return wall, runs


def run_batch(args, spec, folder):
    """tools/run_batch.py over one config per setting (the grid without the seeds) and --seeds."""
    from fedmpi.run.api import as_config

    runs, configs = os.path.join(folder, "runs"), os.path.join(folder, "configs")
    os.makedirs(configs)
    paths = []
    for e in _expanded(spec, seeds=False):
        path = os.path.join(configs, f"{e.name}.yaml")
        with open(path, "w") as fh:
            fh.write(as_config(spec["base"], e.overrides).to_yaml())
        paths.append(path)
    seeds = [str(s) for s in spec.get("seeds") or [0]]
    wall = _launch(args, [sys.executable, os.path.join(ROOT, "tools", "run_batch.py"), *paths, "--seeds", *seeds,
                          "--out-root", runs], os.path.join(folder, "log.txt"))
    return wall, runs


def loop_seconds(runs):
    """The sum over the runs under `runs` of run.h5's final wall_s (seconds inside the round loop)."""
    total, count = 0.0, 0
    for name in sorted(os.listdir(runs)):
        path = os.path.join(runs, name, "run.h5")
        if os.path.exists(path):
            with h5py.File(path, "r", locking=False) as f:
                total += float(f["metrics/wall_s"][-1])
                count += 1
    return total, count


def measure(args):
    spec = grid_spec(args)
    n = len(_expanded(spec))
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out)
    arms = {"sweep": run_sweep, "separate": run_separate, "run_batch": run_batch}
    at_once = {"sweep": max(1, (args.np - 1) // args.sweep_ranks) if args.np > 1 else 1, "separate": 1,
               "run_batch": 1}
    records = {arm: [] for arm in ARMS}
    for rep in range(args.repeats):
        for arm in (ARMS if rep % 2 == 0 else tuple(reversed(ARMS))):
            folder = os.path.join(args.out, f"{arm}-{rep}")
            os.makedirs(folder)
            wall, runs = arms[arm](args, spec, folder)
            loop, done = loop_seconds(runs)
            if done != n:
                raise SystemExit(f"bench/sweep.py: {arm} finished {done} of {n} experiments; see {folder}")
            records[arm].append({"wall_s": wall, "loop_s": loop,
                                 "overhead_s": (wall - loop / at_once[arm]) / n})
            print(f"repeat {rep}: {arm:9s} {wall:8.1f} s wall, {loop:8.1f} s in the rounds", flush=True)
    return {"experiments": n, "np": args.np, "rounds": spec.get("overrides", {}).get("rounds"),
            "repeats": args.repeats, "sweep_ranks": args.sweep_ranks, "arms": records,
            "ratios": {arm: [s["wall_s"] / a["wall_s"] for s, a in zip(records["sweep"], records[arm])]
                       for arm in ARMS if arm != "sweep"}}


def spread(values):
    return statistics.median(values), min(values), max(values)


def table(result):
    n = result["experiments"]
    rounds = result["rounds"] or "the grid's"
    lines = [f"{n} experiments at -n {result['np']} ({rounds} rounds, sweep groups of "
             f"{result['sweep_ranks']} rank(s)), {result['repeats']} repeat(s), arms interleaved",
             f"{'arm':10s} {'wall s (min-max)':>24s} {'s/experiment':>13s} {'rounds s':>9s} {'overhead s/exp':>15s} "
             f"{'sweep / arm (min-max)':>24s}"]
    for arm in ARMS:
        rec = result["arms"][arm]
        med, lo, hi = spread([r["wall_s"] for r in rec])
        loop = statistics.median(r["loop_s"] for r in rec)
        over = statistics.median(r["overhead_s"] for r in rec)
        ratio = "" if arm == "sweep" else "{:.2f} ({:.2f}-{:.2f})".format(*spread(result["ratios"][arm]))
        lines.append(f"{arm:10s} {med:9.1f} ({lo:6.1f}-{hi:6.1f}) {med / n:13.2f} {loop:9.1f} {over:15.2f} "
                     f"{ratio:>24s}")
    target = statistics.median(result["ratios"]["separate"])
    lines.append(f"target: sweep at most 0.5 of the separate launches' wall time: {target:.2f} "
                 f"({'met' if target <= 0.5 else 'not met'} in this run)")
    return "\n".join(lines)


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    result = measure(args)
    print(table(result), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
