#!/usr/bin/env python3
"""The accuracy cost of secure aggregation's field size b (docs/how-to/secure-aggregation.md).

    python tools/secagg_bits.py --out runs/secagg_bits [--seeds 0 1 2] [--rounds 20] [-n 1]

mnist5k, the lr model, 20 clients (Dirichlet beta 0.5), 10 per round, 20 rounds, client lr 0.05, batch 20,
one epoch; FedAvg in clear text (server.secure_aggregation none: weights n_i, no clipping), the same with
uniform weights and the clip C (b = 64, the finest scale: what secure aggregation computes before
quantization error), and SecAgg with b = 32, 20, 16, 12 and 8. For each b the scale is the largest that cannot
overflow: S (ceil(C scale) + 1) < 2^(b-1). All runs go through tools/run_batch.py in one launch; the table
(markdown) gives the final and best test accuracy, mean +- std over the seeds, and the fraction of
updates the clip shortened.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

from fedmpi import analysis
from fedmpi.analysis.batch_report import require_mpiexec
from fedmpi.core.tool_outputs import output_or_default

ROOT = Path(__file__).resolve().parents[1]
COHORT, CLIP = 10, 1.0
BASE = {
    "rounds": 20, "data": {"name": "mnist5k"},
    "partition": {"clients": 20, "scheme": "dirichlet", "beta": 0.5},
    "model": {"name": "lr"}, "client": {"lr": 0.05, "batch_size": 20, "epochs": 1},
    "server": {"clients_per_round": COHORT}, "eval": {"every": 5}, "checkpoint": {"every": 1000},
    "runtime": {"threads": 1, "progress": "lines"},
}


def largest_scale(bits, cohort=COHORT, clip=CLIP):
    """The largest power of two `scale` with cohort * (ceil(clip * scale) + 1) < 2^(bits - 1)."""
    limit = (2 ** (bits - 1) - 1) // cohort - 1
    return float(2 ** math.floor(math.log2(limit / clip)))


def settings():
    out = {"clear": {}}
    for bits in (64, 32, 20, 16, 12, 8):
        scale = min(largest_scale(bits), 2.0 ** 40)
        out[f"b{bits}"] = {"server": {"clients_per_round": COHORT, "secure_aggregation": "secagg"},
                           "secagg": {"bits": bits, "clip": CLIP, "scale": scale}}
    return out


def parse(argv=None):
    """The options; --out an absolute path (left out: ./runs/secagg_bits, refused inside the checkout), since
    tools/run_batch.py runs with the checkout as its working folder."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="folder of the configs and runs (default ./runs/secagg_bits)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("-n", type=int, default=1, help="MPI ranks (1: one process, no mpiexec)")
    args = p.parse_args(argv)
    args.out = output_or_default(args.out, "secagg_bits.py", "runs/secagg_bits", "--out", str(ROOT))
    return args


def main(argv=None):
    args = parse(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    configs = []
    for name, extra in settings().items():
        cfg = {**BASE, **extra, "rounds": args.rounds, "out": str(out / name)}
        path = out / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        configs.append(path)
    cmd = [sys.executable, str(ROOT / "tools" / "run_batch.py"), *map(str, configs), "--seeds",
           *map(str, args.seeds), "--out-root", str(out), "--skip-finished"]
    if args.n > 1:
        cmd = [require_mpiexec("secagg_bits", "or pass -n 1"), "-n", str(args.n), *cmd]
    subprocess.run(cmd, check=True, cwd=ROOT)
    print("| setting | b | scale | final acc | best acc | clipped | masked bytes / client |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, extra in settings().items():
        runs = analysis.load_runs([str(out / f"{name}-seed{seed}") for seed in args.seeds])
        df = analysis.runs(runs)        # the figures of fedmpi.analysis.figures, one row per seed
        final, best = df["final_acc"].to_numpy(), df["best_acc"].to_numpy()
        clipped = df["secagg_clipped_fraction"].to_numpy()
        masked = [r.metrics["secagg_masked_bytes"][0] if "secagg_masked_bytes" in r.metrics else 4 * 7850
                  for r in runs]
        sec = extra.get("secagg", {})
        print(f"| {name} | {sec.get('bits', '-')} | {sec.get('scale', '-'):g} | "
              f"{np.mean(final):.4f} +- {np.std(final):.4f} | {np.mean(best):.4f} +- {np.std(best):.4f} | "
              f"{np.mean(clipped):.2f} | {int(np.mean(masked))} |" if sec else
              f"| {name} | - | - | {np.mean(final):.4f} +- {np.std(final):.4f} | "
              f"{np.mean(best):.4f} +- {np.std(best):.4f} | - | {int(np.mean(masked))} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
