"""`fedmpi report --classes`: which classes a run loses.

Per class: the accuracy at the last evaluation (`final_acc`, as the run's), the mean of the last 20 evaluations
(`acc_last20_mean`, as the run's; the classes are sorted by it), the best, the test samples behind it, and
beside them what the clients held of that class (from the label histograms
under /partition/labels): training samples, how many clients hold any, and the server's set. Worst
classes first. Reads `/metrics/class_acc` [round, class] with its attribute `class_counts`.
"""

from __future__ import annotations

import warnings

import numpy as np

from fedmpi.analysis import report


def class_accuracy(run):
    """(rounds, [evaluated round, class] accuracies) of the rounds where the model was evaluated, or None
    when the run did not record per-class accuracy."""
    acc = run.metrics.get("class_acc")
    if acc is None or np.ndim(acc) != 2 or acc.shape[1] == 0:
        return None
    acc = np.asarray(acc, dtype=np.float64)
    evaluated = np.isfinite(acc).any(axis=1)
    return np.asarray(run.metrics["round"])[evaluated], acc[evaluated]


def class_rows(run, window=report.WINDOW):
    """One row per class, worst acc_last20_mean first (None when not recorded)."""
    found = class_accuracy(run)
    if found is None:
        return None
    _, acc = found
    classes = acc.shape[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)     # a class never measured stays NaN, on purpose
        smooth = np.nanmean(acc[-window:], axis=0) if len(acc) else np.full(classes, np.nan)
        best = np.nanmax(acc, axis=0) if len(acc) else np.full(classes, np.nan)
    test_n = _per_class(run.metric_attrs.get("class_acc", {}).get("class_counts"), classes)
    labels = _histogram(run.partition.get("labels"), classes)
    server = _histogram(run.server_partition.get("labels"), classes)
    rows = []
    for c in range(classes):
        measured = acc[np.isfinite(acc[:, c]), c]
        row = {"class": c, "final_acc": float(measured[-1]) if len(measured) else np.nan,
               "acc_last20_mean": float(smooth[c]), "best_acc": float(best[c]), "test_n": test_n[c]}
        if labels is not None:
            row["train_n"] = float(labels[:, c].sum())
            row["clients"] = float((labels[:, c] > 0).sum())
        if server is not None and server.sum() > 0:
            row["server_n"] = float(server[:, c].sum())
        rows.append(row)
    return sorted(rows, key=lambda r: (np.isnan(r["acc_last20_mean"]), r["acc_last20_mean"], r["class"]))


def _per_class(values, classes):
    values = np.asarray(values if values is not None else [], dtype=np.float64).ravel()
    return [float(v) for v in values] if len(values) == classes else [np.nan] * classes


def _histogram(labels, classes):
    """The [client, class] histogram if it matches the classes of class_acc (None otherwise)."""
    if labels is None:
        return None
    labels = np.asarray(labels)
    return labels if labels.ndim == 2 and labels.shape[1] == classes else None


def lost_classes(rows):
    """The classes whose acc_last20_mean is below half its mean over classes: the ones the run lost."""
    finals = np.array([r["acc_last20_mean"] for r in rows])
    if not np.isfinite(finals).any():
        return []
    bar = 0.5 * np.nanmean(finals)
    return [r["class"] for r in rows if np.isfinite(r["acc_last20_mean"]) and r["acc_last20_mean"] < bar]


def class_section(run, fmt="text", window=report.WINDOW):
    """The --classes text of one run: a heading, the classes it lost, the table worst first."""
    rows = class_rows(run, window)
    if rows is None:
        return f"{run.name}: per-class accuracy not recorded (/metrics/class_acc)"
    evaluations = len(class_accuracy(run)[1])
    lost = lost_classes(rows)
    lines = [f"{run.name}: per-class accuracy, worst first (final_acc: at the last evaluation; acc_last20_mean: "
             f"mean of the last {min(window, evaluations)} of {evaluations} evaluations)",
             "lost (acc_last20_mean below half its mean over classes): "
             + (", ".join(map(str, lost)) if lost else "none"),
             report.format_table(rows, fmt, left=1)]
    return "\n".join(lines)
