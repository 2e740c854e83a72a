"""Command line: `fedmpi run CONFIG [key=value ...]` and `fedmpi report RUN.h5 ...` (DESIGN §1)."""

from __future__ import annotations

import argparse
import os
import sys

from fedmpi.errors import EXIT_USAGE, ConfigError, FedmpiError


def _parser():
    p = argparse.ArgumentParser(prog="fedmpi", description="MPI-based federated learning simulator")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one experiment (under mpiexec -n P for P ranks)")
    run.add_argument("config", help="YAML config file")
    run.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. rounds=50")
    run.add_argument("--resume", action="store_true", help="continue from the newest valid checkpoint in out")
    run.add_argument("--dry-run", action="store_true", help="validate, print config and partition; train nothing")
    run.add_argument("--overwrite", action="store_true", help="replace an existing run in out")
    rep = sub.add_parser("report", help="table of runs from their run.h5 files")
    rep.add_argument("runs", nargs="+", help="run.h5 files (or run folders)")
    rep.add_argument("--plot", metavar="FILE.png", help="also draw accuracy curves into this PNG")
    rep.add_argument("--csv", metavar="FILE.csv", help="also write the table as CSV")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            return _run(args)
        return _report(args)
    except FedmpiError as e:
        # Raised before any MPI traffic, identically on every rank: a plain exit is safe.
        for line in str(e).splitlines():
            print(f"fedmpi: {'config error' if isinstance(e, ConfigError) else 'error'}: {line}", file=sys.stderr)
        return e.exit_code


def _run(args):
    from fedmpi import config

    cfg = config.load(args.config, args.overrides)
    if args.dry_run:
        return _dry_run(cfg)
    _check_out(cfg, args)
    from fedmpi.comm import make_comm
    from fedmpi.launch import run_experiment

    return run_experiment(cfg, make_comm(), overwrite=args.overwrite)


def _check_out(cfg, args):
    path = os.path.join(cfg.out, "run.h5")
    if os.path.exists(path) and not (args.overwrite or args.resume):
        raise ConfigError(f"out = {cfg.out!r} already holds a run ({path}); continue it with --resume, "
                          f"replace it with --overwrite, or choose another out=...")


def _dry_run(cfg):
    from fedmpi.data import load_dataset
    from fedmpi.experiment import build_partition
    from fedmpi.report import partition_summary

    print(cfg.to_yaml())
    dataset = load_dataset(cfg)
    _, stats = build_partition(cfg, dataset)
    print(dataset.summary())
    print(partition_summary(stats))
    return 0


def _report(args):
    from fedmpi import report

    paths = [os.path.join(p, "run.h5") if os.path.isdir(p) else p for p in args.runs]
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        print(f"fedmpi: error: no run file at {', '.join(missing)}", file=sys.stderr)
        return EXIT_USAGE
    runs = [report.read_run(p) for p in paths]
    print(report.format_table(report.summarize(runs)))
    if args.csv:
        report.write_csv(report.summarize(runs), args.csv)
    if args.plot:
        report.plot_curves(runs, args.plot)
        print(f"curves written to {args.plot}")
    return 0
