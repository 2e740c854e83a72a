"""W2's seconds per round at two commits, paired (to find where a path regressed, e.g. W2's batched one).

    python bench/w2_ab.py d12d34d HEAD                 # 3 pairs, 60 rounds, -n 1
    python bench/w2_ab.py A B --pairs 5 --ranks 2      # at -n 2
    cp bench/w2_ab.py bench/paired.py /tmp/ab/ && git bisect start BAD GOOD && \
        git bisect run python /tmp/ab/w2_ab.py GOOD HEAD --bisect 1.10   # bad: >10% slower than GOOD

Each commit's tree is exported (`git archive`) into a temporary folder and W2 (bench.py's workload: 100
of 1,000 SYNTHETIC(1,1) clients, logistic regression, batched clients) runs there through `python -m
fedmpi run` (every version of fedmpi has it), alternating A B A B. A run's figure is the median of its
per-round wall seconds from run.h5's /metrics/wall_s (rounds 2..); the result is the median of the pairs'
ratios B / A with their min-max (bench/paired.py), which a shared host's load changes far less than the
seconds themselves. With --bisect R the exit status is 1 where that median exceeds R (git bisect: bad).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _load(name):
    spec = importlib.util.spec_from_file_location(f"w2ab_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def export(commit, folder):
    """The tree of `commit` under `folder` (a fresh directory)."""
    folder.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def w2_config(out, rounds):
    """W2 as bench.py defines it, in keys every version of bench.py's W2 reads (no runtime.progress)."""
    return {"seed": 0, "rounds": rounds, "out": str(out),
            "data": {"name": "synthetic", "alpha": 1.0, "beta": 1.0},
            "partition": {"clients": 1000, "scheme": "natural", "samples_per_client": 40},
            "model": {"name": "lr"}, "server": {"clients_per_round": 100},
            "client": {"lr": 0.05, "batch_size": 10, "epochs": 1, "vectorize": "auto"},
            "algorithm": {"name": "fedavg"}, "checkpoint": {"every": 0}, "eval": {"every": rounds},
            "runtime": {"threads": 1}}


def one_run(tree, cfg, ranks, mpiexec):
    import h5py
    import numpy as np

    path = Path(cfg["out"]).with_suffix(".yaml")
    path.write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-m", "fedmpi", "run", str(path), "--overwrite"]
    if ranks > 1:
        cmd = [mpiexec, "-n", str(ranks), *cmd]
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{tree}: fedmpi run exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    with h5py.File(Path(cfg["out"]) / "run.h5", "r", locking=False) as f:
        wall = np.asarray(f["metrics/wall_s"][()], dtype=float)
    return np.diff(np.concatenate([[0.0], wall])).tolist()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", help="the baseline commit")
    p.add_argument("b", help="the commit compared with it")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--ranks", type=int, default=1, help="-n of every run (default 1)")
    p.add_argument("--bisect", type=float, help="exit 1 where the median ratio B / A exceeds this")
    args = p.parse_args(argv)
    paired = _load("paired")
    mpiexec = None
    if args.ranks > 1:
        sys.path.insert(0, str(ROOT))
        from fedmpi.analysis.batch_report import require_mpiexec

        mpiexec = require_mpiexec("w2_ab", "or pass --ranks 1")
    with tempfile.TemporaryDirectory(prefix="fedmpi-w2ab-") as tmp:
        trees = {key: export(commit, Path(tmp) / key) for key, commit in (("a", args.a), ("b", args.b))}
        figures = {"a": [], "b": []}
        for pair in range(args.pairs):
            for key in ("a", "b"):
                cfg = w2_config(Path(tmp) / f"{key}-{pair}", args.rounds)
                figures[key].append(paired.later_rounds(one_run(trees[key], cfg, args.ranks, mpiexec)))
                print(f"pair {pair + 1} {key} ({getattr(args, key)}): {figures[key][-1]:.4f} s/round", flush=True)
    ratio = paired.spread(paired.pair_ratios(figures["a"], figures["b"]))
    print(f"W2 -n {args.ranks}: {args.b} / {args.a} = {ratio[0]:.3f} ({ratio[1]:.3f}-{ratio[2]:.3f}) over "
          f"{args.pairs} pairs; {args.a} {paired.spread(figures['a'])[0]:.4f} s/round, "
          f"{args.b} {paired.spread(figures['b'])[0]:.4f} s/round")
    return 1 if args.bisect is not None and ratio[0] > args.bisect else 0


if __name__ == "__main__":
    sys.exit(main())
