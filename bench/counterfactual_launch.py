#!/usr/bin/env python3
"""Leave-one-out of a 30-client run: every counterfactual in ONE `fedmpi counterfactual --drop-each` launch against
one `fedmpi run ... counterfactual.drop=[k]` launch per client, at the same number of ranks, interleaved (each
repeat runs both arms, in the reverse order every other repeat).

    python bench/counterfactual_launch.py [--np 3] [--clients 30] [--rounds 10] [--repeats 2] --out DIR [--json F]
    python bench/counterfactual_launch.py --quick       # 2 clients, 1 round, 1 repeat: a smoke test

The original is the quickstart's set-up (mnist5k, Dirichlet(0.5), 10 clients a round) with the mlp, run once at
the start. The packed launch gives each counterfactual one rank (NP - 1 at a time); a separate launch runs one
counterfactual on all NP ranks. Printed: each arm's wall time (median, min-max over the repeats), per
counterfactual, and the ratio packed / separate paired within each repeat. Both arms must give every
counterfactual the same per-round models (/metrics/model_sha256): the benchmark fails otherwise, since a
faster arm with other results would measure nothing.
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
ARMS = ("packed", "separate")


def parse(argv):
    p = argparse.ArgumentParser(prog="bench/counterfactual_launch.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--np", type=int, default=3, help="ranks of every launch (default 3)")
    p.add_argument("--clients", type=int, default=30, help="clients of the original, one counterfactual each")
    p.add_argument("--rounds", type=int, default=10, help="rounds of every run (default 10)")
    p.add_argument("--repeats", type=int, default=2, help="repeats of the two arms (default 2)")
    p.add_argument("--out", help="work folder, replaced (default ./runs/bench-counterfactual, refused inside the "
                                 "checkout)")
    p.add_argument("--json", help="also write the figures as JSON")
    p.add_argument("--quick", action="store_true", help="2 clients, 1 round, 1 repeat")
    args = p.parse_args(argv)
    args.out = output_or_default(args.out, "bench/counterfactual_launch.py",
                                 os.path.join("runs", "bench-counterfactual"), "--out", ROOT)
    if args.quick:
        args.clients, args.rounds, args.repeats = 2, 1, 1
    return args


def original_config(args, out):
    return {"seed": 0, "rounds": args.rounds, "out": out, "data": {"name": "mnist5k"},
            "partition": {"clients": args.clients, "scheme": "dirichlet", "beta": 0.5}, "model": {"name": "mlp"},
            "client": {"lr": 0.05, "batch_size": 10, "epochs": 1},
            "server": {"clients_per_round": min(10, args.clients)}, "eval": {"every": 1},
            "runtime": {"threads": 1, "progress": "off"}}


def _launch(args, command, log):
    return timed_launch("bench/counterfactual_launch.py", args.np, [sys.executable, "-m", "fedmpi", *command], log,
                        ROOT)


def run_packed(args, original, folder):
    return _launch(args, ["counterfactual", original, "--out", os.path.join(folder, "runs"), "--drop-each"],
                   os.path.join(folder, "log.txt"))


def run_separate(args, config, original, folder):
    wall = 0.0
    for k in range(args.clients):
        out = os.path.join(folder, "runs", f"drop-{k}")
        wall += _launch(args, ["run", config, f"out={out}", f"counterfactual.drop=[{k}]",
                               f"counterfactual.of={original}"], os.path.join(folder, "log.txt"))
    return wall


def fingerprints(runs, clients):
    out = {}
    for k in range(clients):
        with h5py.File(os.path.join(runs, f"drop-{k}", "run.h5"), "r", locking=False) as f:
            out[k] = [s.decode() if isinstance(s, bytes) else str(s) for s in f["metrics/model_sha256"][()]]
    return out


def main(argv=None):
    args = parse(argv)
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out)
    original = os.path.join(args.out, "original")
    config = os.path.join(args.out, "original.yaml")
    with open(config, "w") as fh:
        yaml.safe_dump(original_config(args, original), fh, sort_keys=False)
    _launch(args, ["run", config], os.path.join(args.out, "original.log"))
    records = {arm: [] for arm in ARMS}
    for rep in range(args.repeats):
        order = ARMS if rep % 2 == 0 else ARMS[::-1]
        for arm in order:
            folder = os.path.join(args.out, f"{arm}-{rep}")
            os.makedirs(folder)
            wall = (run_packed(args, original, folder) if arm == "packed"
                    else run_separate(args, config, original, folder))
            records[arm].append({"wall_s": wall, "fingerprints": fingerprints(os.path.join(folder, "runs"),
                                                                              args.clients)})
            print(f"repeat {rep + 1}: {arm}: {wall:.1f} s", flush=True)
    reference = records["packed"][0]["fingerprints"]
    for arm in ARMS:
        for r in records[arm]:
            if r["fingerprints"] != reference:
                raise SystemExit(f"bench/counterfactual_launch.py: the {arm} arm's models differ from the packed "
                                 f"launch's: the comparison would measure nothing")
    ratios = [p["wall_s"] / s["wall_s"] for p, s in zip(records["packed"], records["separate"])]
    print(f"\nleave-one-out of {args.clients} clients, {args.rounds} rounds, -n {args.np}, {args.repeats} repeat(s); "
          f"every counterfactual's models identical in both arms")
    print("| arm | wall s (median) | min-max | per counterfactual s |\n|---|---|---|---|")
    for arm in ARMS:
        walls = [r["wall_s"] for r in records[arm]]
        print(f"| {arm} | {statistics.median(walls):.1f} | {min(walls):.1f}-{max(walls):.1f} | "
              f"{statistics.median(walls) / args.clients:.2f} |")
    print(f"\npacked / separate (paired): median {statistics.median(ratios):.3f}, "
          f"min-max {min(ratios):.3f}-{max(ratios):.3f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"clients": args.clients, "rounds": args.rounds, "np": args.np, "ratios": ratios,
                       "walls": {arm: [r["wall_s"] for r in records[arm]] for arm in ARMS}}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
