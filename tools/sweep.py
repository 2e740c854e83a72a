#!/usr/bin/env python3
"""Summary of a sweep: runs grouped by config keys, each figure as mean +- sample std over the group.

    python tools/sweep.py runs/sweep-123 [--by algorithm.gamma] [--by partition.beta] [--target 0.8]
                          [--csv sweep.csv] [--format markdown] [--plot sweep.png --x round|bytes|wall]

Groups are the distinct values of the --by keys (dotted, as in the config: algorithm.gamma, seed,
partition.beta, algorithm for the algorithm's name, method for the method label: the default); within a
group the runs usually differ only by seed, and a group whose runs differ in other config keys is named in a
note (FedAvg and FedAvg+FT under --by algorithm). The table has the group's keys, the number of runs and their
seeds, then the figures of `fedmpi report` (final_acc, acc_last20_mean, best accuracy, rise round, with
--target the rounds and bytes until the target and how many runs reached it, uploads, bytes moved, wall time,
and every family's figures where recorded), as mean +- sample std; CSV keeps means and standard deviations in
separate columns. --plot draws the groups' mean curves with 95% CI bands (fedmpi.analysis.overview). Groups
use the finished runs and say what they left out (diverged, failed, still running at round R); --include adds
those statuses. Every group is taken at the same round, the last one every run evaluated (--at-round names
another). `fedmpi.analysis.summary` gives the same groups as a DataFrame with a 95% confidence interval.
"""

import argparse
import sys

from fedmpi import analysis


def main(argv=None):
    p = argparse.ArgumentParser(prog="sweep.py", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="run.h5 files, run folders, folders of runs or globs")
    p.add_argument("--by", action="append", metavar="KEY",
                   help="dotted config key, or method (repeatable; default: method)")
    p.add_argument("--target", type=float, metavar="ACC", help="also the rounds and bytes until this accuracy")
    p.add_argument("--csv", metavar="FILE.csv", help="also write the table as CSV")
    p.add_argument("--format", choices=("text", "markdown"), default="text", help="table format")
    p.add_argument("--plot", metavar="FILE.png", help="also draw mean accuracy curves per group, with 95%% CI bands")
    p.add_argument("--x", choices=sorted(analysis.X_AXES), default="round", help="x axis of --plot")
    p.add_argument("--force", action="store_true", help="replace existing --csv and --plot files")
    p.add_argument("--include", metavar="STATUSES",
                   help="also use runs of these statuses (comma-separated: diverged, running, failed; or all)")
    p.add_argument("--at-round", type=int, metavar="R", help="compare every group at round R")
    args = p.parse_args(argv)
    return analysis.report_command(args.runs, target=args.target, by=args.by or ["method"], csv_path=args.csv,
                                   plot=args.plot, x=args.x, fmt=args.format, force=args.force,
                                   include=args.include, at_round=args.at_round)


if __name__ == "__main__":
    sys.exit(main())
