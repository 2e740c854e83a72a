#!/usr/bin/env python3
"""Curves of per-round figures of one or many runs into a PNG, one panel per figure, one line per run.

    python tools/curves.py RUNS... --out curves.png [--x round|bytes|wall|sim_time] [--metric test_acc ...]
                           [--smooth 20] [--label-by algorithm.name ...] [--title TEXT]

RUNS are run.h5 files, run folders, folders of runs (searched) or glob patterns; runs still being written
are drawn up to their last complete round. --x bytes draws against the cumulative bytes moved (up +
down), the communication a real deployment would pay; --x sim_time against the simulated clock
(/metrics/sim_time_s). Figures: any per-round name under /metrics (test_acc, test_loss, train_loss,
server_loss, drift, p_t, uploads, ...), and from the research instruments weight_divergence and
shadow_acc (centralized SGD), gradient_diversity with update_sq_norm and aggregate_sq_norm (client
drift), client_lr, server_lr, the local evaluation's local_acc_mean, local_acc_worst10, local_acc_std,
local_acc_worst, local_below_global (eval.local_every; drawn at the rounds it ran), and under an attack
backdoor_acc (the backdoor's success rate) with the robust aggregators' detect_precision, detect_recall and
honest_excluded; default test_acc and test_loss. A run that did not record a figure (or the x axis) is named
on stderr and left out of that panel; a malformed run file is skipped with a warning. Diverged and failed
runs are left out (a note says so) unless --include names them.
"""

import argparse
import sys

from fedmpi import analysis
from fedmpi.core.errors import InputError
from fedmpi.core.output_paths import check_file


def main(argv=None):
    p = argparse.ArgumentParser(prog="curves.py", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="run.h5 files, run folders, folders of runs or globs")
    p.add_argument("--out", required=True, metavar="FILE.png", help="where to write the PNG")
    p.add_argument("--x", choices=sorted(analysis.X_AXES), default="round", help="x axis (default round)")
    p.add_argument("--metric", action="append", dest="metrics", metavar="NAME",
                   help="figure to draw (repeatable; default test_acc and test_loss)")
    p.add_argument("--smooth", type=int, default=1, metavar="N", help="rolling mean over N points (default 1)")
    p.add_argument("--label-by", action="append", default=[], metavar="KEY",
                   help="label lines by these dotted config keys instead of the run folder's name")
    p.add_argument("--title", help="figure title")
    p.add_argument("--include", default="running", metavar="STATUSES",
                   help="runs of these statuses are drawn beside the finished ones (comma-separated: running, "
                        "diverged, failed; or all; default running)")
    args = p.parse_args(argv)
    try:
        check_file(args.out, "--out")
    except InputError as e:
        print(f"curves.py: error: {e}", file=sys.stderr)
        return 2
    files, unmatched = analysis.find_run_files(args.runs)
    if unmatched:
        print(f"curves.py: no run file at {', '.join(unmatched)}", file=sys.stderr)
        return 2
    runs = analysis.load_runs(files)
    if not runs:
        print("curves.py: error: none of the run files could be read", file=sys.stderr)
        return 2
    labels = [analysis.run_label(r, args.label_by) for r in runs]
    metrics = tuple(args.metrics or ("test_acc", "test_loss"))
    for line in analysis.missing_curves(runs, metrics, args.x):
        print(f"curves.py: note: {line}", file=sys.stderr)
    try:
        left_out = analysis.plot_curves(runs, args.out, x=args.x, metrics=metrics, labels=labels,
                                        smooth=args.smooth, title=args.title, include=args.include)
    except InputError as e:
        print(f"curves.py: error: {e}", file=sys.stderr)
        return 2
    if left_out:
        print(f"curves.py: note: left out {left_out} run(s) (--include draws them)", file=sys.stderr)
    print(f"curves of {len(runs)} run(s) written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
