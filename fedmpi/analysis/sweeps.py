"""Runs grouped by config keys, each figure as the mean and sample standard deviation over a group (`fedmpi
report --by`, tools/sweep.py and the reproduction scripts). The DataFrame form with confidence intervals is
fedmpi.analysis.summary."""

from __future__ import annotations

import numpy as np

from fedmpi.analysis import figures, report
from fedmpi.analysis.sources import config_value

SWEEP_FIGURES = ("final_acc", "acc_last20_mean", "best_acc", "rise_round", "target_round", "target_bytes",
                 "uploads", "bytes_moved", "wall_s")


def group_runs(runs, by):
    """{(value of each key in `by`): [runs]}, in a stable order (numbers by value, then text)."""
    groups = {}
    for run in runs:
        key = tuple(_hashable(config_value(run, k)) for k in by)
        groups.setdefault(key, []).append(run)
    order = sorted(groups, key=lambda key: [(0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool)
                                            else (1, 0, str(v)) for v in key])
    return {key: groups[key] for key in order}


def _hashable(value):
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


def present_figures(runs, target=None):
    """The figures a sweep table shows: the core ones (SWEEP_FIGURES; the target's with `target`), then every
    other family's figures that at least one of `runs` measured."""
    rows = report.summarize(runs, target)
    core = [f for f in SWEEP_FIGURES if target is not None or not f.startswith("target_")]
    others = [f.name for f in figures.FIGURES if f.name not in core and f.name not in ("rounds_done", "emd")
              and any(not np.isnan(r[f.name]) for r in rows)]
    return core + others


def group_summary(members, target=None, names=None):
    """Figures of a group of runs (e.g. one setting over seeds), from fedmpi.analysis.summary: the number of runs,
    their seeds, with `target` how many reached it, the mean client EMD, and the mean of each figure in `names`
    (default `present_figures`) with its sample standard deviation (FIGURE_std, NaN for a single run). A figure
    a run lacks (a target it never reached) is left out of that figure's mean."""
    from fedmpi.analysis import frames

    names = names or present_figures(members, target)
    df = frames.runs(members, target)
    summary = frames.summary(df, by=(), over="seed", figures=["emd", *names], warn=False).iloc[0]
    row = {"runs": int(summary["n"]), "seeds": summary["seed"]}
    if target is not None:
        row["reached"] = f"{int(summary['target_round_n'])}/{len(members)}"
    row["emd"] = summary["emd_mean"]
    for name in names:
        row[name], row[name + "_std"] = summary[name + "_mean"], summary[name + "_std"]
    return row


def mixed_keys(members, by, over="seed"):
    """Config keys (dotted) other than `by`, `over` and the run-time keys whose values differ among `members`."""
    from fedmpi.analysis import frames

    df = frames.runs(members)
    return frames.differing(df, [c for c in frames.config_columns(df) if c not in by], over)


def sweep_rows(runs, by, target=None, notes=None):
    """One row per group of runs sharing the values of the dotted config keys `by` (`group_summary`). A group
    whose runs differ in other config keys (FedAvg and FedAvg+FT under `--by algorithm`) gets a line in
    `notes` (a list) naming them."""
    names = present_figures(runs, target)
    rows = []
    for key, members in group_runs(runs, by).items():
        rows.append({**{k: str(v) for k, v in zip(by, key)}, **group_summary(members, target, names)})
        mixed = mixed_keys(members, by) if notes is not None else []
        if mixed:
            notes.append(f"the group {', '.join(f'{k}={v}' for k, v in zip(by, key))} mixes runs that differ in "
                         f"{', '.join(mixed)}: add --by for them" + ("" if "method" in by else ", or --by method"))
    return rows
