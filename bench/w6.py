"""W6 of the benchmark: a round's fixed cost against the number of ranks, and a fitted
scaling law. Run by bench/bench.py (`--workloads W6`) or alone: `python bench/w6.py [--quick]`.

A round's fixed cost is everything but training: the broadcast, the reduction (or the routes, or the
gathers), the headers, the server update and logging. From /timing (fedmpi.core.timing: each rank's rows add
up to its wall time) a round's cost on rank 0 is the sum of its phases, and its fixed part that minus the
longest training of any rank (the critical path's training); evaluation runs only after the last round,
which is left out with the first. Training is made negligible: one local step of batch 1 per client.

Rows: protocols reduce (FedAvg), route (FedSkip, delta 3: routed rounds and aggregations), gather (SAFL with
gating: mask, then the uploaders' vectors by Gatherv) and gather-rows (FedAvg with server.aggregator: median,
the update matrix by Gatherv), at -n 2, 3, 5, 9 and 17, with logistic regression on SYNTHETIC (610
parameters) and a 10 M-parameter MLP (hidden 3130) where the machine's free memory holds P copies of a
rank's footprint (MEMORY_PER_RANK_10M).

Fit (least squares, `fit`): t = a + b log2(P) + c bytes, bytes = the model's float32 bytes; then with an
oversubscription term d * max(0, P - cores), since on a machine with fewer cores than ranks every
collective waits for the scheduler to run each rank in turn (the ranks sleep while waiting, so a waiting
rank costs little CPU, but a collective's log2(P) steps each need a rank that may not be on a core).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

W6_RANKS = (2, 3, 5, 9, 17)
ROUNDS = 7                  # rounds 2..6 measured (the first warms up, the last evaluates)
CLIENTS = 16                # one client per worker at -n 17; FedSkip trains all of them each round
HIDDEN_10M = 3130           # mlp on 60 features: 60h + h^2 + 10h + 2h + 10 = 10.02 M parameters
MEMORY_PER_RANK_10M = 0.7e9     # bytes: torch, the model and its gradients, flat, down (f32), up (f64) buffers
PROTOCOLS = {
    "reduce": {"algorithm": {"name": "fedavg"}},
    "route": {"algorithm": {"name": "fedskip", "delta": 3}},
    "gather": {"algorithm": {"name": "safl", "L": 4.0, "eps": 0.5, "mix": "end_of_round", "gating": True,
                             "nu": 2.0}},
    "gather-rows": {"algorithm": {"name": "fedavg"}, "server": {"aggregator": "median"}},
}
MODELS = {"lr": ({"name": "lr"}, 60 * 10 + 10),
          "mlp10M": ({"name": "mlp", "hidden": HIDDEN_10M}, 60 * HIDDEN_10M + HIDDEN_10M ** 2 + 10 * HIDDEN_10M
                     + 2 * HIDDEN_10M + 10)}
HEADER = ("protocol", "model", "params", "-n", "round s", "fixed s", "bcast s", "reduce s", "server s",
          "wait s (rank 0)")


def config(protocol, model, out, rounds=ROUNDS):
    model_cfg, _ = MODELS[model]
    cfg = {"seed": 0, "rounds": rounds, "out": str(out),
           "data": {"name": "synthetic", "alpha": 1.0, "beta": 1.0},
           "partition": {"clients": CLIENTS, "scheme": "natural", "samples_per_client": 20},
           "model": model_cfg, "client": {"lr": 0.01, "batch_size": 1, "steps": 1},
           "server": {"clients_per_round": CLIENTS}, "eval": {"every": rounds},
           "checkpoint": {"every": 0}, "runtime": {"threads": 1, "progress": "off"}}
    for key, value in PROTOCOLS[protocol].items():
        cfg[key] = {**cfg.get(key, {}), **value}
    return cfg


def plan(ranks=W6_RANKS, models=tuple(MODELS), protocols=tuple(PROTOCOLS), free_bytes=None):
    """[(protocol, model, -n)] of the W6 table; 10 M rows only where `free_bytes` hold -n ranks of it."""
    free = _available() if free_bytes is None else free_bytes
    return [(p, m, n) for m in models for p in protocols for n in ranks
            if m != "mlp10M" or n * MEMORY_PER_RANK_10M < 0.8 * free]


def _available():
    with open("/proc/meminfo") as fh:
        info = dict(line.split(":", 1) for line in fh)
    return int(info["MemAvailable"].split()[0]) * 1024


def round_costs(run_h5):
    """Per measured round (the second to the one before last): (round s, fixed s, bcast, reduce, server,
    wait) on rank 0 (fixed: the round minus the longest training of any rank)."""
    import h5py

    with h5py.File(run_h5, "r", locking=False) as f:
        t = {name: f["timing"][name][()] for name in f["timing"]}       # [round, rank]
    total = sum(t[name][:, 0] for name in t)
    fixed = total - t["train"].max(axis=1) - t["eval"][:, 0]
    keep = slice(1, len(total) - 1) if len(total) > 2 else slice(0, len(total))
    return [(total[i], fixed[i], t["bcast"][i, 0], t["reduce"][i, 0], t["server"][i, 0], t["wait"][i, 0])
            for i in range(len(total))[keep]]


def measure(protocol, model, n, work, mpiexec, rounds=ROUNDS, timeout=1800):
    import yaml

    work.mkdir(parents=True, exist_ok=True)
    cfg_path = work / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(config(protocol, model, work / "out", rounds)))
    cmd = [mpiexec, "-n", str(n), sys.executable, "-m", "fedmpi", "run", str(cfg_path), "--overwrite"]
    began = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "FEDMPI_NODE_BUFFERS": os.environ.get("FEDMPI_NODE_BUFFERS", "1")})
    if proc.returncode:
        raise RuntimeError(f"W6 {protocol} {model} -n {n} exited {proc.returncode}: {proc.stderr[-2000:]}")
    costs = round_costs(work / "out" / "run.h5")
    med = [statistics.median(c[k] for c in costs) for k in range(6)]
    return {"protocol": protocol, "model": model, "params": MODELS[model][1], "n": n, "round_s": med[0],
            "fixed_s": med[1], "bcast_s": med[2], "reduce_s": med[3], "server_s": med[4], "wait_s": med[5],
            "whole_s": time.monotonic() - began}


def fit(rows, cores=None, with_bytes=True):
    """Least squares of fixed_s on [1, log2 P, bytes] (and max(0, P - cores) where `cores` is given; without
    the bytes column where `with_bytes` is false, e.g. rows of one model size, where it is the intercept's
    twin): (names, coefficients, residuals in row order)."""
    names = ["a (s)", "b (s per log2 P)"] + (["c (s per byte)"] if with_bytes else [])
    columns = [[1.0, math.log2(r["n"])] + ([4.0 * r["params"]] if with_bytes else []) for r in rows]
    if cores is not None:
        names.append("d (s per rank beyond the cores)")
        columns = [c + [max(0.0, r["n"] - cores)] for c, r in zip(columns, rows)]
    a = np.array(columns, dtype=np.float64)
    y = np.array([r["fixed_s"] for r in rows], dtype=np.float64)
    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1.0
    coef, *_ = np.linalg.lstsq(a / scale, y, rcond=None)
    coef = coef / scale
    return names, coef, y - a @ coef


def run(base, rounds=ROUNDS, ranks=W6_RANKS, models=tuple(MODELS), protocols=tuple(PROTOCOLS), mpiexec=None):
    """Every W6 row and the fits per protocol; returns (table rows, records)."""
    from fedmpi.analysis.batch_report import require_mpiexec

    mpiexec = mpiexec or require_mpiexec("bench/w6.py")
    records = []
    for protocol, model, n in plan(ranks, models, protocols):
        r = measure(protocol, model, n, base / protocol / model / f"n{n}", mpiexec, rounds)
        records.append(r)
        print(f"  W6 {protocol} {model} -n {n}: round {r['round_s']:.4f} s, fixed {r['fixed_s']:.4f} s "
              f"(whole {r['whole_s']:.0f} s)", flush=True)
    rows = [(r["protocol"], r["model"], str(r["params"]), f"-n {r['n']}", f"{r['round_s']:.4f}",
             f"{r['fixed_s']:.4f}", f"{r['bcast_s']:.4f}", f"{r['reduce_s']:.4f}", f"{r['server_s']:.4f}",
             f"{r['wait_s']:.4f}") for r in records]
    return rows, records


def print_fits(records, cores=None, file=sys.stdout):
    cores = cores or os.cpu_count()
    for protocol in dict.fromkeys(r["protocol"] for r in records):
        mine = [r for r in records if r["protocol"] == protocol]
        sizes = len({r["params"] for r in mine}) > 1
        for with_cores in (None, cores):
            if len(mine) < 2 + sizes + (with_cores is not None):
                continue
            names, coef, resid = fit(mine, with_cores, with_bytes=sizes)
            terms = ", ".join(f"{n} = {c:.3g}" for n, c in zip(names, coef))
            res = " ".join(f"{x:+.4f}" for x in resid)
            print(f"W6 fit {protocol}{' +oversubscription' if with_cores else ''}: {terms}; residuals (s) {res}",
                  file=file, flush=True)


def _status(run_h5):
    import h5py

    with h5py.File(run_h5, "r", locking=False) as f:
        return str(f.attrs.get("status", ""))


def records_from(base):
    """The records of an earlier W6 run's folders (BASE/protocol/model/nN/out/run.h5), for a refit."""
    records = []
    for h5 in sorted(Path(base).glob("*/*/n*/out/run.h5"), key=lambda p: (p.parts[-5], p.parts[-4],
                                                                            int(p.parts[-3][1:]))):
        protocol, model, n = h5.parts[-5], h5.parts[-4], int(h5.parts[-3][1:])
        if _status(h5) != "finished":      # (a run still going, or one that failed)
            continue
        costs = round_costs(h5)
        med = [statistics.median(c[k] for c in costs) for k in range(6)]
        records.append({"protocol": protocol, "model": model, "params": MODELS[model][1], "n": n,
                        "round_s": med[0], "fixed_s": med[1], "bcast_s": med[2], "reduce_s": med[3],
                        "server_s": med[4], "wait_s": med[5]})
    return records


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", nargs="+", type=int, default=list(W6_RANKS))
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=list(PROTOCOLS))
    p.add_argument("--rounds", type=int, default=ROUNDS)
    p.add_argument("--quick", action="store_true", help="plumbing: -n 2 and 3, the small model, 3 rounds")
    p.add_argument("--out", default=None)
    p.add_argument("--refit", nargs="+", metavar="DIR", help="fit the runs already in these --out folders")
    args = p.parse_args(argv)
    if args.refit:
        records = [r for d in args.refit for r in records_from(d)]
        for r in records:
            print(f"  W6 {r['protocol']} {r['model']} -n {r['n']}: round {r['round_s']:.4f} s, fixed "
                  f"{r['fixed_s']:.4f} s, server {r['server_s']:.4f} s, wait {r['wait_s']:.4f} s")
        print_fits(records)
        return records
    if args.quick:
        args.ranks, args.models, args.rounds = [2, 3], ["lr"], 3
    base = Path(args.out).resolve() if args.out else Path(tempfile.mkdtemp(prefix="fedmpi-w6-"))
    rows, records = run(base, args.rounds, tuple(args.ranks), tuple(args.models), tuple(args.protocols))
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADER)] if rows else []
    for line in [HEADER, *rows]:
        print("  ".join(c.rjust(w) for c, w in zip(line, widths)))
    print_fits(records)
    if not args.out:
        shutil.rmtree(base, ignore_errors=True)
    return records


if __name__ == "__main__":
    main()
