"""`fedmpi report --attack`: how each run fared under its attack.

Per run: the attack (from the config) and the malicious clients recorded under /attack/malicious, then the
main-task accuracy (test_acc), the backdoor's success rate (backdoor_acc: triggered non-target test samples
classified as the target) and, where the run's aggregator recorded them, the detection precision and recall
of the malicious clients and the share of honest clients excluded (detect_precision, detect_recall,
honest_excluded), each at the last evaluation (`_last`) and as the mean over the last 10% of rounds
(`_tail`; at least one round, NaN rounds without an evaluation left out).
"""

from __future__ import annotations

import numpy as np

from fedmpi.analysis import figures, report
from fedmpi.io.store import open_run

FIGURES = ("test_acc", "backdoor_acc", "detect_precision", "detect_recall", "honest_excluded")
TAIL = 0.1      # the share of the last rounds whose mean is reported


def last_and_tail(values, tail=TAIL):
    """(the last measured value, the mean of the measured values of the last ceil(tail * rounds) rounds), as
    fedmpi.analysis.figures defines them; NaN for a figure never measured."""
    values = np.asarray(values, dtype=np.float64).ravel()
    if not np.isfinite(values).any():
        return np.nan, np.nan
    return figures.last(values), figures.tail_mean(values, tail)


def malicious_ids(path):
    """The run's recorded malicious ids (an empty array when it recorded none)."""
    with open_run(path) as f:
        return f["attack/malicious"][()] if "attack/malicious" in f else np.zeros(0, dtype=np.int64)


def attack_rows(runs, tail=TAIL):
    rows = []
    for run in runs:
        attack = run.config.get("attack") or {}
        row = {"run": run.name, "attack": str(attack.get("name", "none")) if isinstance(attack, dict) else "none",
               "malicious": float(len(malicious_ids(run.path)))}
        for name in FIGURES:
            if name in run.metrics:
                row[f"{name}_last"], row[f"{name}_tail"] = last_and_tail(run.metrics[name], tail)
            else:
                row[f"{name}_last"] = row[f"{name}_tail"] = np.nan
        rows.append(row)
    present = [k for k in rows[0] if k in ("run", "attack", "malicious")
               or any(np.isfinite(r[k]) for r in rows)] if rows else []
    return [{k: r[k] for k in present} for r in rows]


def attack_section(runs, fmt="text", tail=TAIL):
    """The --attack text: a heading and one row per run (figures no run recorded are left out)."""
    rows = [{k: _text(k, v) for k, v in row.items()} for row in attack_rows(runs, tail)]
    heading = (f"attacks: figures at the last evaluation (_last) and their mean over the last "
               f"{100 * tail:.0f}% of rounds (_tail)")
    return "\n".join([heading, report.format_table(rows, fmt, left=2)])


def _text(key, value):
    if isinstance(value, str):
        return value
    if not np.isfinite(value):
        return "-"
    return f"{value:.0f}" if key == "malicious" else f"{value:.4f}"
