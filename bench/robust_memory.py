"""Rank 0's peak memory in robust aggregation with and without the chunk bound (docs/results/performance.md).

One configuration per mpiexec launch (ru_maxrss is a high-water mark per process), at -n 2: rank 1 holds the
S counted clients' updates as the workers would for the round (float32 rows of the model's d entries,
random: the memory does not depend on the values) and rank 0 runs the chunked gather's server side,
`Comm.gather_rows`, the reordering into client-id order and the rule (fedmpi.robust.driver), exactly as
fedmpi.round.robust_gather does. Reported: rank 0's peak resident memory above its resident memory just
before the aggregation (imports, the model-sized result vectors excluded), and the seconds it took.

    python bench/robust_memory.py                 # the table: median and krum, S = 100, cnn2 on 3x32x32
    mpiexec -n 2 python bench/robust_memory.py --one median 256MB    # one configuration, one JSON line
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
S = 100
CASES = [("median", "256MB"), ("median", "1TB"), ("krum", "256MB"), ("krum", "1TB"), ("geomed", "256MB")]


def model_dim():
    from fedmpi.config import ModelConfig
    from fedmpi.core.models import build_model

    model = build_model(ModelConfig(name="cnn2"), (3, 32, 32), 10)
    return sum(p.numel() for p in model.parameters())


def rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize()


def one(rule_name, memory):
    import numpy as np

    from fedmpi.mpi.comm import MpiComm
    from fedmpi.mpi.runtime import parse_bytes
    from fedmpi.robust.chunks import chunk_bounds, chunk_width
    from fedmpi.robust.driver import aggregate_chunks, total_passes
    from fedmpi.robust.keys import RobustConfig
    from fedmpi.robust.rules import build_rule

    comm = MpiComm()
    dim = model_dim()
    rule = build_rule(rule_name, RobustConfig(f=1) if rule_name == "krum" else RobustConfig(iterations=2))
    rows_by_rank = [0, S]
    width = chunk_width(parse_bytes(memory), S, dim)
    if comm.rank == 1:
        rows = np.random.default_rng(0).normal(size=(S, dim)).astype(np.float32)
        for _ in range(total_passes(rule)):
            for lo, hi in chunk_bounds(dim, width):
                comm.gather_rows(np.ascontiguousarray(rows[:, lo:hi]), rows_by_rank, hi - lo)
        comm.close()
        return
    order = np.arange(S)
    before = current_rss()
    began = time.perf_counter()
    out = aggregate_chunks(rule, lambda lo, hi: comm.gather_rows(np.empty((0, hi - lo), np.float32), rows_by_rank,
                                                                 hi - lo)[order], np.ones(S), dim, width)
    seconds = time.perf_counter() - began
    peak = rss_bytes()
    print(json.dumps({"rule": rule_name, "gather_memory": memory, "clients": S, "dim": dim, "width": width,
                      "chunks": len(chunk_bounds(dim, width)), "peak_above_start_MB": (peak - before) / 1e6,
                      "matrix_MB": S * dim * 4 / 1e6, "seconds": seconds,
                      "finite": bool(np.isfinite(out.update).all())}),
          flush=True)
    comm.close()


def table():
    from fedmpi.analysis.batch_report import require_mpiexec

    print("| rule | runtime.gather_memory | chunks | rank 0 peak above start (MB) | S x d float32 (MB) | seconds |")
    print("| --- | --- | --- | --- | --- | --- |")
    launcher = require_mpiexec("bench/robust_memory.py")
    for rule, memory in CASES:
        proc = subprocess.run([launcher, "-n", "2", sys.executable, __file__, "--one", rule, memory],
                              capture_output=True, text=True, cwd=ROOT, timeout=1800, check=True)
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"| {r['rule']} | {r['gather_memory']} | {r['chunks']} | {r['peak_above_start_MB']:.0f} | "
              f"{r['matrix_MB']:.0f} | {r['seconds']:.1f} |", flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--one":
        one(sys.argv[2], sys.argv[3])
    else:
        table()
