"""The hierarchical round against the flat one: the round's broadcast and reduction seconds
(/timing/bcast + /timing/reduce) of W1 (bench/bench.py: cnn_mnist, 1.66 M parameters, 10 clients a round)
at 2 nodes x 2 ranks in MPI's own view (MPICH's Hydra, two host names, the fork launcher, UCX over TCP
between the nodes: docs/how-to/multi-node.md, "Several nodes on one machine") and on one node of 4 ranks, each
with node buffers (FEDMPI_NODE_BUFFERS=1: shared memory in the node, the leaders' MPI collective between
nodes) and without (FEDMPI_NODE_BUFFERS=0: MPI's Bcast and Reduce among all ranks).

    python bench/hierarchy.py [--rounds 10] --out runs/bench-hierarchy

One launch per layout runs both settings (the torch import is paid once). Reported per setting, as medians
over rounds 2.. : rank 0's bcast + reduce seconds a round, and the sum over all ranks; the models of the
runs are checked equal (the fingerprints of every round).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import ROOT, workload_config  # noqa: E402

DRIVER = r"""
import json, os, sys
from fedmpi.cli import main
for env, args in json.loads(sys.argv[1]):
    os.environ.update(env)
    code = main(["run", *args])
    if code:
        sys.exit(code)
"""


def launchers(mpiexec):
    """{layout: argv prefix}: two MPI nodes of two ranks (Hydra) and one node of four."""
    hosts = "fedmpi-node0:2,fedmpi-node1:2"
    return {"2 nodes x 2": [mpiexec, "-launcher", "fork", "-hosts", hosts, "-genv", "UCX_TLS", "tcp,self", "-n", "4"],
            "1 node x 4": [mpiexec, "-n", "4"]}


def transfer_seconds(run):
    """Per round (from round 2): (rank 0's bcast + reduce seconds, the sum over ranks); the fingerprints."""
    with h5py.File(Path(run) / "run.h5", "r", locking=False) as f:
        both = np.asarray(f["timing/bcast"][()]) + np.asarray(f["timing/reduce"][()])      # [round, rank]
        sha = [bytes(s) if not isinstance(s, str) else s for s in f["metrics/model_sha256"][()]]
    return both[1:, 0], both[1:].sum(axis=1), sha


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--out", help="folder of the runs (default ./runs/bench-hierarchy, refused inside the checkout)")
    p.add_argument("--mpiexec", help="the launcher (default: the one beside this Python, else on PATH)")
    args = p.parse_args(argv)
    from fedmpi.core.tool_outputs import output_or_default

    args.out = output_or_default(args.out, "bench/hierarchy.py", "runs/bench-hierarchy", "--out", str(ROOT))
    if args.mpiexec is None:
        from fedmpi.analysis.batch_report import require_mpiexec

        args.mpiexec = require_mpiexec("bench/hierarchy.py")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, shas = [], []
    for layout, prefix in launchers(args.mpiexec).items():
        steps, runs = [], {}
        for setting in ("1", "0"):
            name = f"{layout.replace(' ', '')}-buffers{setting}"
            cfg = workload_config("W1", out / name, rounds=args.rounds)
            path = out / f"{name}.yaml"
            path.write_text(yaml.safe_dump(cfg, sort_keys=False))
            steps.append([{"FEDMPI_NODE_BUFFERS": setting}, [str(path), "--overwrite"]])
            runs[setting] = out / name
        proc = subprocess.run([*prefix, sys.executable, "-c", DRIVER, json.dumps(steps)], cwd=ROOT,
                              capture_output=True, text=True, timeout=1800)
        if proc.returncode:
            sys.exit(f"{layout}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
        for setting, run in runs.items():
            rank0, total, sha = transfer_seconds(run)
            shas.append(sha)
            rows.append((layout, "node buffers" + (" + leaders" if layout.startswith("2") else "")
                         if setting == "1" else "flat MPI", statistics.median(rank0), statistics.median(total)))
    if any(sha != shas[0] for sha in shas):
        sys.exit("the layouts' or settings' models differ")
    print(f"W1, {args.rounds} rounds, medians over rounds 2..; every run's models equal, round by round")
    print("| layout | path | rank 0 bcast+reduce ms/round | all ranks' bcast+reduce ms/round |")
    print("| --- | --- | ---: | ---: |")
    for layout, path, rank0, total in rows:
        print(f"| {layout} | {path} | {1e3 * rank0:.1f} | {1e3 * total:.1f} |")


if __name__ == "__main__":
    main()
