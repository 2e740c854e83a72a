#!/usr/bin/env python3
"""Secure aggregation's compute cost, measured on this machine (docs/results/performance.md, "Secure aggregation").

    python tools/secagg_costs.py [--dims 7850 1000000] [--cohort 20] [--dropout 0.1] [--repeat 3]

Prints, per model size d, (1) the PRG: nanoseconds per entry of one mask expansion (numpy Philox, the low b
bits of one 64-bit word per entry); (2) a client's masking: seconds for one masked vector (its self mask
and one pairwise mask per neighbour) and nanoseconds per parameter, for SecAgg (the whole cohort) and
SecAgg+ (its default degree); (3) the server's unmasking with `dropout` of the cohort gone after the set-up:
seconds and PRG expansions. The arithmetic is fedmpi.secagg's own (protocol.masked_upload, unmask), on
one CPU core; the best of `repeat` is reported.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from fedmpi.secagg import masks
from fedmpi.secagg.graph import default_neighbours
from fedmpi.secagg.protocol import masked_upload, setup, unmask


def best(fn, repeat):
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - began)
    return min(times), out


def measure(d, cohort, dropout, repeat, bits=32):
    rows = []
    prg_s, _ = best(lambda: masks.expand(123, d, bits, masks.PAIR), repeat)
    rows.append(f"d={d}: PRG expansion {prg_s * 1e9 / d:.2f} ns/entry ({prg_s * 1e3:.2f} ms per mask)")
    clients = list(range(cohort))
    q = masks.to_ring(np.random.default_rng(0).integers(-1000, 1000, d), bits)
    for mode, k in (("secagg", cohort - 1), ("secagg_plus", default_neighbours(cohort))):
        s = setup(mode, clients, k, (k + 1) // 2 + 1, bits, d, 0, 0)
        mask_s, (y, expansions) = best(lambda s=s: masked_upload(s, 0, q), repeat)
        gone = set(np.random.default_rng(1).choice(cohort, int(round(dropout * cohort)), replace=False).tolist())
        survivors = [c for c in clients if c not in gone]
        total = np.zeros(d, dtype=np.uint64)
        for c in survivors:
            total += masked_upload(s, c, q)[0]
        unmask_s, out = best(lambda s=s, total=total, alive=survivors: unmask(s, total, alive), repeat)
        assert not out.failed and np.array_equal(masks.from_ring(out.total, bits),
                                                 len(survivors) * masks.from_ring(q, bits))
        rows.append(f"  {mode:<11} k={k:<3} client: {mask_s:.4f} s/masked vector ({expansions} expansions, "
                    f"{mask_s * 1e9 / d:.1f} ns/parameter); server, {len(gone)} of {cohort} dropped: "
                    f"{unmask_s:.4f} s, {out.expansions} expansions")
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dims", nargs="+", type=int, default=[7850, 1_000_000])
    p.add_argument("--cohort", type=int, default=20)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    for d in args.dims:
        for row in measure(d, args.cohort, args.dropout, args.repeat):
            print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
