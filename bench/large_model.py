"""Memory of a large model (issue 28 part 3, docs/performance.md "Large models"): each rank's peak resident
and proportional memory during rounds of FedAvg with an MLP of about 100 M parameters (hidden 9970 on
SYNTHETIC's 60 features), against the same run with logistic regression (torch, MPI and the data), so that
the difference divided by the parameter count is the bytes per parameter a rank holds.

    python bench/large_model.py [--hidden 9970] [--ranks 2 3] [--momentum 0.9]

Runs through bench/bench.py's `run_fedmpi` (bench/_rank.py samples RSS, PSS and USS per rank).
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _bench():
    spec = importlib.util.spec_from_file_location("fedmpi_bench", HERE / "bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def params(hidden, features=60, classes=10):
    return features * hidden + hidden + hidden * hidden + hidden + hidden * classes + classes


def config(out, model, momentum, rounds=3):
    return {"seed": 0, "rounds": rounds, "out": str(out), "data": {"name": "synthetic", "alpha": 1.0, "beta": 1.0},
            "partition": {"clients": 8, "scheme": "natural", "samples_per_client": 20}, "model": model,
            "client": {"lr": 0.01, "batch_size": 1, "steps": 1, "momentum": momentum},
            "server": {"clients_per_round": 4}, "eval": {"every": rounds}, "checkpoint": {"every": 0},
            "runtime": {"threads": 1, "progress": "off"}}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=9970)
    p.add_argument("--ranks", nargs="+", type=int, default=[2, 3])
    p.add_argument("--momentum", type=float, default=0.0)
    args = p.parse_args(argv)
    bench = _bench()
    base = Path(tempfile.mkdtemp(prefix="fedmpi-large-"))
    d = params(args.hidden)
    for n in args.ranks:
        small = bench.run_fedmpi(config(base / f"lr{n}" / "out", {"name": "lr"}, args.momentum), n, base / f"lr{n}",
                                 sample_memory=True)
        big = bench.run_fedmpi(config(base / f"mlp{n}" / "out", {"name": "mlp", "hidden": args.hidden},
                                      args.momentum), n, base / f"mlp{n}", sample_memory=True)
        for what in ("peak_rss_mb", "peak_pss_mb", "peak_uss_mb"):
            per_param = [(b - s) * 2**20 / d for b, s in zip(big[what], small[what])]
            print(f"-n {n} {what[5:8].upper()}: lr " + "/".join(f"{v:.0f}" for v in small[what])
                  + " MiB, mlp " + "/".join(f"{v:.0f}" for v in big[what]) + f" MiB ({d / 1e6:.1f} M params): "
                  + "/".join(f"{v:.1f}" for v in per_param) + " bytes per parameter (rank 0/1/...)", flush=True)


if __name__ == "__main__":
    main()
