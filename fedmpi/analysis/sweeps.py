"""Runs grouped by config keys, each figure as the mean and sample standard deviation over a group (`fedmpi
report --by`, tools/sweep.py and the reproduction scripts). The DataFrame form with confidence intervals is
fedmpi.analysis.summary."""

from __future__ import annotations

import math

import numpy as np

from fedmpi.analysis import figures, report, selection
from fedmpi.analysis.selection import ALL
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


def group_summary(members, target=None, names=None, include=None, at_round=None):
    """Figures of a group of runs (e.g. one setting over seeds), from fedmpi.analysis.summary: `n` (the runs
    used: the finished ones unless `include` names others, fedmpi.analysis.selection), `left_out` (what was
    left out by status, "" for nothing), `round` (every run taken at that round: `at_round`, or the last round
    all the runs used evaluated), their seeds, with `target` how many reached it, the mean client EMD, and
    the mean of each figure in `names` (default `present_figures`) with its sample standard deviation
    (FIGURE_std, NaN for a single run). A figure a run lacks (a target it never reached) is left out of that
    figure's mean."""
    from fedmpi.analysis import frames

    names = names or present_figures(members, target)
    used, left_out = selection.split_runs(members, include)
    round_ = selection.runs_round(used, at_round)[0] if used else 0
    row = {"n": len(used), "left_out": left_out, "round": round_, "seeds": ""}
    if target is not None:
        row["reached"] = f"0/{len(used)}"
    row["emd"] = math.nan
    for name in names:
        row[name], row[name + "_std"] = math.nan, math.nan
    if not used:
        return row
    df = frames.runs([selection.at_round_of(run, round_) for run in used], target)
    summary = frames.summary(df, by=(), over="seed", figures=["emd", *names], warn=False, include="all",
                             at_round=round_).iloc[0]
    row["seeds"] = summary["seed"]
    if target is not None:
        row["reached"] = f"{int(summary['target_round_n'])}/{len(used)}"
    row["emd"] = summary["emd_mean"]
    for name in names:
        row[name], row[name + "_std"] = summary[name + "_mean"], summary[name + "_std"]
    return row


def mixed_keys(members, by, over="seed"):
    """Config keys (dotted) other than `by`, `over` and the run-time keys whose values differ among `members`."""
    from fedmpi.analysis import frames

    df = frames.runs(members)
    return frames.differing(df, [c for c in frames.config_columns(df) if c not in by], over)


def sweep_rows(runs, by, target=None, notes=None, include=None, at_round=None):
    """One row per group of runs sharing the values of the dotted config keys `by` (`group_summary`), every
    group taken at the same round (`at_round`, or the last round that every run used evaluated), using the
    finished runs unless `include` names others. With `notes` (a list): a line saying the round, and one per
    group whose runs differ in other config keys (FedAvg and FedAvg+FT under `--by algorithm`) naming them."""
    names = present_figures(runs, target)
    groups = {key: selection.split_runs(members, include) for key, members in group_runs(runs, by).items()}
    round_, how = selection.runs_round([run for used, _ in groups.values() for run in used], at_round)
    rows = []
    for key, (used, left_out) in groups.items():
        row = group_summary(used, target, names, include=ALL, at_round=round_)
        rows.append({**{k: str(v) for k, v in zip(by, key)}, **row, "left_out": left_out})
        mixed = mixed_keys(used, by) if notes is not None and used else []
        if mixed:
            notes.append(f"the group {', '.join(f'{k}={v}' for k, v in zip(by, key))} mixes runs that differ in "
                         f"{', '.join(mixed)}: add --by for them" + ("" if "method" in by else ", or --by method"))
    if notes is not None:
        notes.insert(0, selection.note(round_, how))
    return rows
