#!/usr/bin/env python3
"""Seconds a local evaluation (eval.local_every) costs per evaluated client, measured in one process.

    python tools/local_eval_cost.py [--model mlp] [--clients 50] [--rounds 6] [--finetune 0]

Runs the same mnist5k experiment (partition.local_test 0.2) twice in this process, without local evaluation
and with `eval.local_every: 1, eval.local_clients: all`, and prints the /timing eval phase per round of both,
their difference divided by the clients evaluated per round (each client: its evaluation model, optional
fine-tuning, accuracy and loss on its split, and the global model on the same split), and the same per
test sample. Figures for docs/results/performance.md; nothing is written to disk.
"""

import argparse

import numpy as np

from fedmpi.core.timing import PHASES
from fedmpi.run.api import simulate


def eval_seconds(local, args):
    cfg = {"seed": 0, "rounds": args.rounds, "data": {"name": "mnist5k"},
           "partition": {"clients": args.clients, "local_test": 0.2, "scheme": "dirichlet", "beta": 0.5},
           "server": {"clients_per_round": min(10, args.clients)}, "model": {"name": args.model},
           "client": {"steps": 5, "batch_size": 20}, "runtime": {"progress": "off", "threads": 1}}
    if local:
        cfg["eval"] = {"local_every": 1, "local_clients": "all", "finetune_steps": args.finetune}
    res = simulate(cfg)
    per_round = res.timing[:, :, PHASES.index("eval")].sum(axis=1)
    samples = int(res.experiment.split.local_test.sizes.sum()) if local else 0
    return float(np.median(per_round[1:])), samples


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="mlp")
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--finetune", type=int, default=0)
    args = p.parse_args()
    base, _ = eval_seconds(False, args)
    local, samples = eval_seconds(True, args)
    per_client = (local - base) / args.clients
    print(f"model {args.model}, {args.clients} clients, {samples} local test samples, finetune {args.finetune}")
    print(f"eval phase per round (median): {base * 1e3:.1f} ms global only, {local * 1e3:.1f} ms with local")
    print(f"local evaluation: {per_client * 1e3:.2f} ms per evaluated client, "
          f"{(local - base) / max(samples, 1) * 1e6:.1f} us per local test sample")


if __name__ == "__main__":
    main()
