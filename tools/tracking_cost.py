#!/usr/bin/env python3
"""What live tracking costs rank 0 (docs/how-to/tracking.md), measured on this machine.

    python tools/tracking_cost.py [--rounds 20] [--trackers tensorboard mlflow wandb] [--out DIR]

Runs the small mnist5k config (12 clients, 5 per round, logistic regression, one thread) once per tracker
in this process and prints, per tracker, the seconds its start took (Tracking.open: importing the package
included) and the milliseconds per round rank 0 spent handing the row to it (Tracking.log_row: the
tracker's whole cost inside the round loop), median and maximum, beside the run's median round time. A
tracker whose package is missing is reported dropped by the run itself and shows no rounds. Set
WANDB_MODE=offline to keep W&B off the network.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import yaml

from fedmpi.analysis.report import read_run
from fedmpi.cli import main
from fedmpi.run import tracking


def config(out, rounds, trackers):
    return {"seed": 1, "rounds": rounds, "out": out, "data": {"name": "mnist5k"},
            "partition": {"clients": 12, "scheme": "dirichlet", "beta": 0.5}, "model": {"name": "lr"},
            "client": {"lr": 0.05, "batch_size": 20, "epochs": 1}, "server": {"clients_per_round": 5},
            "algorithm": {"name": "fedavg"}, "runtime": {"threads": 1, "progress": "off", "trackers": trackers}}


def timed(calls, fn):
    def wrapper(*args, **kwargs):
        began = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            calls.append(time.perf_counter() - began)
    return wrapper


def measure(name, rounds, root):
    starts, rows = [], []
    open_, log_row = tracking.Tracking.open, tracking.Tracking.log_row
    tracking.Tracking.open = classmethod(timed(starts, open_.__func__))
    tracking.Tracking.log_row = timed(rows, log_row)
    try:
        path = os.path.join(root, f"{name}.yaml")
        with open(path, "w") as fh:
            yaml.safe_dump(config(os.path.join(root, name), rounds, [name]), fh)
        code = main(["run", path, "--overwrite"])
    finally:
        tracking.Tracking.open, tracking.Tracking.log_row = open_, log_row
    round_s = float(np.median(np.diff(read_run(os.path.join(root, name, "run.h5")).metrics["wall_s"])))
    rows.sort()
    median = rows[len(rows) // 2] * 1e3 if rows else float("nan")
    print(f"{name:12s} exit {code}  start {starts[0] if starts else float('nan'):.2f} s  per round: median "
          f"{median:.1f} ms, max {max(rows, default=float('nan')) * 1e3:.1f} ms ({len(rows)} rounds; a round "
          f"takes {round_s * 1e3:.0f} ms)")


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--trackers", nargs="+", default=["tensorboard", "mlflow", "wandb"],
                   choices=sorted(tracking.TRACKERS))
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "tracking_cost"),
                   help="folder for the runs (replaced each time; default: TMPDIR/tracking_cost)")
    return p.parse_args()


if __name__ == "__main__":
    args = parse()
    os.makedirs(args.out, exist_ok=True)
    for name in args.trackers:
        measure(name, args.rounds, args.out)
