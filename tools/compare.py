#!/usr/bin/env python3
"""Comparison table of runs: `fedmpi report` under another name (the same options, the same code).

    python tools/compare.py runs/repro/*/run.h5 [--target 0.8] [--csv table.csv] [--format markdown]
                            [--plot curves.png --x round|bytes|wall] [--by KEY ...]

Columns: final_acc (the last evaluated test accuracy), acc_last20_mean (the mean of the last 20 evaluations),
best accuracy, rise round (first round whose 20-evaluation rolling mean reaches 90% of acc_last20_mean), with
--target the round and the bytes moved until the test accuracy first reaches it, uploads, bytes moved and wall
time, then a section per family recorded (`fedmpi report --help` defines every figure). Runs still being
written are read up to their last complete round (their status shows `running`).
"""

import sys

from fedmpi.cli import main

if __name__ == "__main__":
    sys.exit(main(["report", *sys.argv[1:]]))
