"""`fedmpi report --clients`: how a run's clients fare on their own test splits (personalized FL).

Per run: the last local evaluation's distribution over the evaluated clients (from /metrics: the sample-
weighted mean, the unweighted mean, the worst 10%, the worst, the standard deviation, the share below the
global model on their own splits) beside the global test accuracy, and with --plot the CDF of the clients'
local accuracies (/clients/local_acc) next to the curves of the global and the mean local accuracy.
"""

from __future__ import annotations

import numpy as np

from fedmpi.analysis import report
from fedmpi.analysis.plotting import pyplot, save
from fedmpi.io.store import read_clients

# /metrics figure -> its column in the table (a column ending in acc or _share is printed as a fraction)
FIGURES = {"local_acc_mean": "mean_acc", "local_acc_unweighted": "unweighted_acc", "local_acc_worst10": "worst10_acc",
           "local_acc_worst": "worst_acc", "local_acc_std": "std_acc", "local_below_global": "below_global_share"}


def local_rounds(run):
    """Indices of the /metrics rows that hold a local evaluation (empty when the run has none)."""
    mean = run.metrics.get("local_acc_mean")
    if mean is None:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.isfinite(np.asarray(mean, dtype=np.float64)))


def client_row(run):
    """The --clients row of one run (None when it recorded no local evaluation)."""
    rows = local_rounds(run)
    if not len(rows):
        return None
    last = rows[-1]
    row = {"run": run.name, "round": int(run.metrics["round"][last]) + 1,     # 1-based, as everywhere it is read
           "clients": _evaluated(run, last)}
    for name, column in FIGURES.items():
        values = run.metrics.get(name)
        row[column] = float(values[last]) if values is not None else np.nan
    acc = run.metrics.get("test_acc")
    finite = np.flatnonzero(np.isfinite(acc)) if acc is not None else []
    row["global_acc"] = float(acc[finite[-1]]) if len(finite) else np.nan
    return row


def _evaluated(run, index):
    """How many clients the local evaluation of /metrics row `index` covered (NaN if /clients is unreadable)."""
    acc = _client_acc(run)
    if acc is None or index >= len(acc):
        return np.nan
    return float(np.isfinite(acc[index]).sum())


def _client_acc(run):
    try:
        return read_clients(run.path).get("local_acc")
    except (OSError, KeyError, ValueError):
        return None


def client_section(runs, fmt="text"):
    """The --clients text: one row per run with a local evaluation; the others are named."""
    rows = [r for r in (client_row(run) for run in runs) if r is not None]
    missing = [run.name for run in runs if client_row(run) is None]
    lines = ["local accuracy at the last local evaluation (mean: sample-weighted; worst10: mean of the worst 10% "
             "of the clients; below_global_share: clients below the global model on their own split)"]
    if rows:
        lines.append(report.format_table(rows, fmt, left=2))
    if missing:
        lines.append("no local evaluation (eval.local_every) in: " + ", ".join(missing))
    return "\n".join(lines)


def plot_clients(run, path):
    """PNG at `path`: the global test accuracy and the mean local accuracy over rounds, and beside it the CDF
    of the clients' local accuracies at the last local evaluation. False when the run has none."""
    rows = local_rounds(run)
    acc = _client_acc(run)
    if not len(rows) or acc is None:
        return False
    plt = pyplot()
    fig, (curves, cdf) = plt.subplots(1, 2, figsize=(10, 4))
    rounds = np.asarray(run.metrics["round"]) + 1      # 1-based
    test = np.asarray(run.metrics.get("test_acc", np.full(len(rounds), np.nan)), dtype=np.float64)
    seen = np.isfinite(test)
    curves.plot(rounds[seen], test[seen], label="global model, global test set")
    for name, label in (("local_acc_mean", "local, mean"), ("local_acc_worst10", "local, worst 10%")):
        values = np.asarray(run.metrics[name], dtype=np.float64)
        curves.plot(rounds[rows], values[rows], marker=".", label=label)
    curves.set_xlabel("round")
    curves.set_ylabel("accuracy")
    curves.legend()
    last = acc[rows[-1]]
    last = np.sort(last[np.isfinite(last)])
    cdf.step(last, np.arange(1, len(last) + 1) / len(last), where="post", label="clients' local accuracy")
    if seen.any():
        cdf.axvline(test[seen][-1], color="gray", linestyle="--", label="global test accuracy")
    cdf.set_xlabel(f"local accuracy (round {int(rounds[rows[-1]])})")       # (rounds is 1-based here)
    cdf.set_ylabel("share of clients")
    cdf.legend()
    fig.suptitle(run.name)
    save(plt, fig, path)
    return True
