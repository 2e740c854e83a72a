#!/usr/bin/env python3
"""Runs several configs (and seeds) one after another inside ONE MPI launch.

    mpiexec -n 3 python tools/run_batch.py CONFIG.yaml [CONFIG.yaml ...] [--seeds 0 1 2]
            [--out-root runs/batch] [--overwrite | --skip-finished] [key=value ...]

Each rank imports torch once for the whole batch instead of once per run, which is most of a small
run's cost on a laptop. Every run is exactly what `fedmpi run CONFIG key=value ... seed=S out=...` would
do. With --out-root, run i goes to OUT_ROOT/<config name>[-seed<S>]; without it, to the config's own
`out` (plus -seed<S> when --seeds is given). All configs are validated before the first run starts;
an existing run.h5 stops the batch before it starts unless --overwrite (replace it) or --skip-finished
(keep finished runs of the same length, replace the others) is given. Each run holds the lock on its
out while it runs (fedmpi.io.outdir): another job on that out stops the batch with exit 2. SIGTERM/SIGUSR1
stop the current run with a checkpoint (exit 75), as for `fedmpi run`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from fedmpi import config
from fedmpi.core.errors import EXIT_USAGE, FedmpiError
from fedmpi.mpi import signals


def parse(argv):
    p = argparse.ArgumentParser(prog="run_batch.py", description=__doc__.split("\n\n")[0])
    p.add_argument("items", nargs="+", metavar="CONFIG.yaml | key=value", help="configs, then overrides for all")
    p.add_argument("--seeds", nargs="+", type=int, help="run every config once per seed")
    p.add_argument("--out-root", help="put run i into OUT_ROOT/<config name>[-seed<S>]")
    p.add_argument("--overwrite", action="store_true", help="replace existing runs")
    p.add_argument("--skip-finished", action="store_true", help="keep finished runs that have all their rounds")
    args = p.parse_intermixed_args(argv)     # overrides may also follow the options
    args.configs = [x for x in args.items if "=" not in x]
    args.overrides = [x for x in args.items if "=" in x]
    return args


def plan(args):
    """[(name, Config)] of every run of the batch, all validated first (ConfigError on a bad one)."""
    runs = []
    for path in args.configs:
        stem = os.path.splitext(os.path.basename(path))[0]
        for seed in args.seeds if args.seeds is not None else [None]:
            name = stem if seed is None else f"{stem}-seed{seed}"
            cfg = config.load(path, args.overrides + ([] if seed is None else [f"seed={seed}"]))
            if args.out_root:
                cfg = dataclasses.replace(cfg, out=os.path.join(args.out_root, name))
            elif seed is not None:
                cfg = dataclasses.replace(cfg, out=f"{cfg.out}-seed{seed}")
            runs.append((name, cfg))
    return runs


def finished(cfg):
    from fedmpi.analysis.report import read_run

    path = os.path.join(cfg.out, "run.h5")
    try:
        run = read_run(path, retries=1)
    except (OSError, KeyError, ValueError):
        return False
    return run.attrs.get("status") == "finished" and len(run.metrics.get("round", [])) == cfg.rounds


def main(argv=None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        runs = plan(args)
    except FedmpiError as e:
        print(f"run_batch: {e}", file=sys.stderr)
        return e.exit_code
    # Every rank decides from the same files before any run starts, so all ranks agree on the list.
    if args.skip_finished:
        runs = [(name, cfg) for name, cfg in runs if not finished(cfg)]
    existing = [cfg.out for _, cfg in runs if os.path.exists(os.path.join(cfg.out, "run.h5"))]
    if existing and not (args.overwrite or args.skip_finished):
        print(f"run_batch: these runs exist already: {', '.join(existing)}; pass --overwrite or "
              f"--skip-finished", file=sys.stderr)
        return EXIT_USAGE
    signals.install()
    from fedmpi.io.outdir import claim
    from fedmpi.mpi.comm import make_comm
    from fedmpi.run.launch import run_experiment

    # Each run ignores signals once it has ended (signals.ignore_all): kept for the whole batch instead, so that a
    # SIGTERM during the second run still checkpoints it.
    with signals.keep_handlers():
        for i, (name, cfg) in enumerate(runs, 1):
            comm = make_comm()
            try:
                held = claim(cfg, comm, overwrite=True)     # another job on this out: exit 2 before anything
            except FedmpiError as e:
                if str(e):                                  # rank 0 says why; the other ranks are told to stop
                    print(f"run_batch: {e}", file=sys.stderr)
                return e.exit_code
            if comm.is_server:
                print(f"run_batch: {i}/{len(runs)} {name} -> {cfg.out}", flush=True)
            code = run_experiment(cfg, comm, overwrite=True)
            if held:
                held.release()
            if code:
                return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
