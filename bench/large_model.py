"""A large model's memory and a round's cost per byte (docs/results/performance.md "Large models"): each
rank's peak memory during rounds of FedAvg with an MLP of about 100 M parameters (hidden 9970 on SYNTHETIC's 60
features), against the same run with logistic regression (torch, MPI and the data), so that the difference
divided by the parameter count is the bytes per parameter a rank holds; and the part of a round that is not
training, per byte of the model, against the machine's own memory bandwidth measured in the same run (a
STREAM-like triad).

    python bench/large_model.py [--hidden 9970] [--ranks 2 3] [--momentum 0.9] [--json FILE]

Memory (bench/_rank.py samples each rank's RSS, PSS and USS; peaks): `held` is the peak RSS less the other
ranks' slots of the node's round window that this rank reads (rank 0 sums the workers' float64 reduction
slots, a worker copies rank 0's broadcast slot: those pages count in the reader's RSS in full and in its PSS
by half, though their owners hold them). Targets: a worker holds at most 20 bytes per parameter with
plain SGD (its model, one layer's gradient at a time, its float64 reduction slot), rank 0 at most 24.

Cost per byte: from each run's /timing, a round's fixed part (rank 0's round less the longest training of any
rank; bench/w6.py's `round_costs`, rounds 2 to the one before the last), the MLP's less logistic regression's,
over the MLP's extra float32 bytes. The bound is what the round's passes over model-sized vectors move
(`round_bytes`) at the triad's bandwidth; target: within 2x of it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKER_HELD_MAX, SERVER_HELD_MAX, COST_OVER_BOUND_MAX = 20.0, 24.0, 2.0     # the targets above
TRIAD_ENTRIES = 1 << 24         # float64 entries per triad array: 128 MiB each, far beyond any cache


def _sibling(name):
    spec = importlib.util.spec_from_file_location(f"fedmpi_bench_{name}_lm", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def params(hidden, features=60, classes=10):
    return features * hidden + hidden + hidden * hidden + hidden + hidden * classes + classes


def config(out, model, momentum, rounds=6):
    return {"seed": 0, "rounds": rounds, "out": str(out), "data": {"name": "synthetic", "alpha": 1.0, "beta": 1.0},
            "partition": {"clients": 8, "scheme": "natural", "samples_per_client": 20}, "model": model,
            "client": {"lr": 0.01, "batch_size": 1, "steps": 1, "momentum": momentum},
            "server": {"clients_per_round": 4}, "eval": {"every": rounds}, "checkpoint": {"every": 0},
            "runtime": {"threads": 1, "progress": "off"}}


def triad(entries=TRIAD_ENTRIES, repeats=7):
    """GB/s of a = b + s c over float64 vectors (STREAM's triad: 24 bytes moved per entry), one thread, best of
    `repeats`: the bandwidth one core gets from this machine's memory."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        b, c = torch.rand(entries, dtype=torch.float64), torch.rand(entries, dtype=torch.float64)
        a = torch.empty_like(b)
        best = float("inf")
        for _ in range(repeats):
            began = time.perf_counter()
            torch.add(b, c, alpha=3.0, out=a)
            best = min(best, time.perf_counter() - began)
    finally:
        torch.set_num_threads(threads)
    return 24.0 * entries / best / 1e9


def sha256_speed(megabytes=256, repeats=3):
    """GB/s of hashlib's SHA-256 (the per-round model fingerprint, /metrics/model_sha256), best of `repeats`."""
    import hashlib

    import numpy as np

    data = np.ones(megabytes << 18, dtype=np.float32)
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        hashlib.sha256(memoryview(data).cast("B")).digest()
        best = min(best, time.perf_counter() - began)
    return data.nbytes / best / 1e9


def round_bytes(ranks):
    """Bytes per parameter that the passes of a FedAvg round outside training move on its critical path, at
    -n `ranks` with node buffers (docs/results/performance.md, "Large models"): rank 0 reads every rank's float64
    reduction slot and writes the sums (8 (P + 1)); the server step reads the sums and x and writes x (16);
    the round's checks read the sums (the drift figures' dot product) and x (the non-finite check) (12);
    the broadcast copies x into rank 0's slot (8), which the workers then read where it is; and, on the
    workers side by side, a worker clears its reduction slot for the next tally (8)."""
    return 8 * (ranks + 1) + 16 + 12 + 8 + 8


def fixed_seconds(run_h5):
    """Median over the measured rounds of a round's fixed part (bench/w6.py's `round_costs`)."""
    return statistics.median(cost[1] for cost in _sibling("w6").round_costs(run_h5))


def memory_row(small, big, d):
    """{figure: [bytes per parameter, rank by rank]} of the MLP run over the logistic regression's."""
    return {what: [(b - s) * 2**20 / d for b, s in zip(big[f"peak_{what}_mb"], small[f"peak_{what}_mb"])]
            for what in ("rss", "pss", "uss", "held")}


def measure(bench, base, n, hidden, momentum):
    """One -n: the logistic-regression and MLP runs; bytes per parameter per rank and the cost per byte."""
    d, d_small = params(hidden), 60 * 10 + 10       # the MLP's parameters, logistic regression's
    runs = {}
    for name, model in (("lr", {"name": "lr"}), ("mlp", {"name": "mlp", "hidden": hidden})):
        work = base / f"{name}{n}"
        runs[name] = bench.run_fedmpi(config(work / "out", model, momentum), n, work, sample_memory=True)
        runs[name]["fixed_s"] = fixed_seconds(work / "out" / "run.h5")
    per_byte = (runs["mlp"]["fixed_s"] - runs["lr"]["fixed_s"]) / (4.0 * (d - d_small))
    return {"n": n, "params": d, "memory": memory_row(runs["lr"], runs["mlp"], d), "runs": runs,
            "ns_per_byte": 1e9 * per_byte, "server_trains": runs["mlp"]["training_ranks"] == n}


def report(row, bandwidth, sha_speed=None):
    """The printed lines of one -n and its targets' status. Where rank 0 also trains (`server_trains`: -n 2 on
    two cores), the model's fingerprint (SHA-256 of its 4 bytes per parameter, at `sha_speed` GB/s) is on its
    path too and joins the bound; elsewhere rank 0 takes it while the workers train."""
    n, mem = row["n"], row["memory"]
    lines = [f"-n {n}, {row['params'] / 1e6:.1f} M parameters, bytes per parameter held by each rank (rank 0/1/...):"]
    for what in ("rss", "pss", "uss", "held"):
        lines.append(f"  {what.upper():4s} " + "/".join(f"{v:.1f}" for v in mem[what]))
    server, workers = mem["held"][0], max(mem["held"][1:])
    bound = round_bytes(n) / 4.0 / bandwidth       # ns per float32 byte of the model at the triad's GB/s
    fingerprint = 1.0 / sha_speed if sha_speed and row.get("server_trains") else 0.0
    bound += fingerprint
    ratio = row["ns_per_byte"] / bound
    lines += [f"  target: a worker holds <= {WORKER_HELD_MAX:g}: {workers:.1f} "
              f"({'met' if workers <= WORKER_HELD_MAX else 'NOT met'}); rank 0 <= {SERVER_HELD_MAX:g}: {server:.1f} "
              f"({'met' if server <= SERVER_HELD_MAX else 'NOT met'})",
              f"  round outside training: {row['ns_per_byte']:.2f} ns per byte of the model; bound "
              f"{round_bytes(n)} bytes per parameter at the triad's {bandwidth:.1f} GB/s"
              + (f" + the fingerprint at {sha_speed:.2f} GB/s (rank 0 trains)" if fingerprint else "")
              + f" = {bound:.2f} ns per byte; {ratio:.2f}x the bound (target <= {COST_OVER_BOUND_MAX:g}x: "
              f"{'met' if ratio <= COST_OVER_BOUND_MAX else 'NOT met'})"]
    return lines, {"worker_held": workers, "server_held": server, "cost_over_bound": ratio, "bound_ns": bound}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=9970)
    p.add_argument("--ranks", nargs="+", type=int, default=[2, 3])
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--json", help="also write the figures to this JSON file")
    args = p.parse_args(argv)
    bench = _sibling("bench")
    base = Path(tempfile.mkdtemp(prefix="fedmpi-large-"))
    bandwidths, sha = [triad()], sha256_speed()
    print(f"triad: {bandwidths[0]:.1f} GB/s (one thread, float64 a = b + s c, {TRIAD_ENTRIES} entries); SHA-256 "
          f"{sha:.2f} GB/s", flush=True)
    rows = [measure(bench, base, n, args.hidden, args.momentum) for n in args.ranks]
    bandwidths.append(triad())
    bandwidth = max(bandwidths)
    print(f"triad again: {bandwidths[1]:.1f} GB/s; the bound below takes the faster, {bandwidth:.1f} GB/s")
    record = {"triad_gb_s": bandwidths, "sha256_gb_s": sha, "rows": []}
    for row in rows:
        lines, status = report(row, bandwidth, sha)
        print("\n".join(lines), flush=True)
        record["rows"].append({**{k: v for k, v in row.items() if k != "runs"}, **status})
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1, default=float))


if __name__ == "__main__":
    main()
