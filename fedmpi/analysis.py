"""Post-hoc analysis over many run files: `fedmpi report` and the scripts in tools/ run this code.

Finding and reading runs (also while their jobs still append to them: every read takes the rounds that
are complete), sweep summaries grouped by any config key with mean and spread over the other keys
(seeds), and curves of any per-round figure against rounds, bytes moved or wall time (PNG, matplotlib's
Agg backend). The per-run figures themselves (final accuracy, rise time, rounds to a target) are in
`fedmpi.report`.
"""

from __future__ import annotations

import glob
import os
import sys

import numpy as np

from fedmpi import report
from fedmpi.errors import EXIT_USAGE

X_AXES = {"round": "round", "bytes": "bytes moved (up + down)", "wall": "wall time (s)"}
SWEEP_FIGURES = ("final_acc", "best_acc", "rise_round", "target_round", "target_bytes", "uploads",
                 "bytes_moved", "wall_s")
_STYLES = ("-", "--", ":")      # after the ten default colours, lines change style
LABELS = {"test_acc": "test accuracy", "test_loss": "test loss", "train_loss": "training loss"}


# --- finding and reading runs ---------------------------------------------------------------------------

def find_run_files(paths):
    """run.h5 files named by `paths`: files, run folders, folders searched recursively (a sweep's parent
    folder) and glob patterns of any of these; in the order given, without duplicates.
    Returns (files, the paths that named none)."""
    found, unmatched = [], []
    for path in paths:
        matches = []
        for item in [path] if os.path.exists(path) else sorted(glob.glob(path, recursive=True)):
            if os.path.isfile(item):
                matches.append(item)
            elif os.path.isfile(os.path.join(item, "run.h5")):
                matches.append(os.path.join(item, "run.h5"))
            elif os.path.isdir(item):
                matches += sorted(glob.glob(os.path.join(item, "**", "run.h5"), recursive=True))
        if not matches:
            unmatched.append(path)
        seen = {os.path.abspath(f) for f in found}
        found += [m for m in matches if os.path.abspath(m) not in seen]
    return found, unmatched


def load_runs(paths, err=None):
    """Reads every run file found in `paths`; one that cannot be read is reported on `err` (default
    stderr) and left out."""
    err = err or sys.stderr
    files, _ = find_run_files(paths)
    runs = []
    for path in files:
        try:
            runs.append(report.read_run(path))
        except (OSError, KeyError, ValueError) as e:
            print(f"fedmpi: skipping {path}: cannot read it ({type(e).__name__}: {e})", file=err)
    return runs


def config_value(run, key):
    """The value of a dotted config key in a run's resolved config (`algorithm` alone gives its name)."""
    node = run.config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node.get("name") if isinstance(node, dict) else node


def run_label(run, keys=()):
    return ", ".join(f"{k}={config_value(run, k)}" for k in keys) if keys else run.name


# --- sweeps ---------------------------------------------------------------------------------------------

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


def group_summary(members, target=None):
    """Figures of a group of runs (e.g. one setting over seeds): the number of runs, their seeds, and the
    mean of each figure of `report.summarize` with its sample standard deviation (FIGURE_std, NaN for a
    single run). A figure a run lacks (a target it never reached) is left out of that figure's mean."""
    summaries = report.summarize(members, target)
    row = {"runs": len(members), "seeds": ",".join(str(config_value(r, "seed")) for r in members)}
    if target is not None:
        row["reached"] = f"{sum(np.isfinite(s['target_round']) for s in summaries)}/{len(members)}"
    for figure in ("emd",) + SWEEP_FIGURES:
        if figure not in summaries[0]:
            continue
        values = np.array([s[figure] for s in summaries], dtype=np.float64)
        values = values[np.isfinite(values)]
        row[figure] = float(values.mean()) if len(values) else np.nan
        if figure != "emd":
            row[figure + "_std"] = float(values.std(ddof=1)) if len(values) > 1 else np.nan
    return row


def sweep_rows(runs, by, target=None):
    """One row per group of runs sharing the values of the dotted config keys `by` (`group_summary`)."""
    return [{**{k: str(v) for k, v in zip(by, key)}, **group_summary(members, target)}
            for key, members in group_runs(runs, by).items()]


# --- curves ---------------------------------------------------------------------------------------------

def curve_x(run, x):
    """The x values of every round: the 1-based round, the cumulative bytes moved, or the wall time."""
    m = run.metrics
    return {"round": lambda: np.asarray(m["round"]) + 1.0, "bytes": lambda: report.bytes_moved(m),
            "wall": lambda: np.asarray(m["wall_s"], dtype=np.float64)}[x]()


def curve(run, metric, x="round"):
    """(x, y) of a per-round figure (`curve_x` for x), the rounds where it was not measured left out."""
    m = run.metrics
    if metric not in m:
        return np.zeros(0), np.zeros(0)
    y = np.asarray(m[metric], dtype=np.float64)
    xs = curve_x(run, x)
    keep = np.isfinite(y)
    return xs[keep], y[keep]


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display needed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("fedmpi: plotting needs matplotlib: pip install 'fedmpi[plot]'") from None
    return plt


def _axes(plt, metrics, x, title):
    fig, axes = plt.subplots(1, len(metrics), figsize=(6 * len(metrics), 4.2), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        ax.set_xlabel(X_AXES[x])
        ax.set_ylabel(LABELS.get(metric, metric.replace("_", " ")))
        ax.grid(alpha=0.3)
        if x == "bytes":
            ax.xaxis.set_major_formatter(lambda v, _: report.human_bytes(v))
    if title:
        fig.suptitle(title)
    return fig, axes[0]


def _save(plt, fig, axes, path):
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_curves(runs, path, x="round", metrics=("test_acc", "test_loss"), labels=None, smooth=1, title=None):
    """One panel per metric, one line per run; `smooth` > 1 draws the rolling mean over that many points."""
    plt = pyplot()
    fig, axes = _axes(plt, metrics, x, title)
    labels = labels or [run.name for run in runs]
    for ax, metric in zip(axes, metrics):
        for i, (run, label) in enumerate(zip(runs, labels)):
            xs, ys = curve(run, metric, x)
            if len(xs):
                ax.plot(xs, report.rolling_mean(ys, smooth) if smooth > 1 else ys, label=label,
                        linestyle=_STYLES[i // 10 % 3])
    _save(plt, fig, axes, path)


def draw_groups(ax, groups, metric="test_acc", x="round", colors=None):
    """On `ax`, one line per group ({label: [runs]}): the mean over its runs with a band of +- one sample
    standard deviation, over the rounds that all of them have and where the figure was measured.
    `colors` may fix a group's colour ({label: colour}), e.g. to match it across panels."""
    for i, (label, members) in enumerate(groups.items()):
        n = min(len(r.metrics.get("round", [])) for r in members)
        if n == 0 or any(metric not in r.metrics for r in members):
            continue
        xs = np.mean([curve_x(r, x)[:n] for r in members], axis=0)
        ys = np.array([np.asarray(r.metrics[metric][:n], dtype=np.float64) for r in members])
        keep = np.isfinite(ys).all(axis=0)
        mean = ys[:, keep].mean(axis=0)
        line, = ax.plot(xs[keep], mean, label=f"{label} ({len(members)})", linestyle=_STYLES[i // 10 % 3],
                        color=(colors or {}).get(label), marker="o" if keep.sum() < 3 else None)
        if len(members) > 1:
            std = ys[:, keep].std(axis=0, ddof=1)
            ax.fill_between(xs[keep], mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)


def plot_sweep(runs, by, path, x="round", metrics=("test_acc",), title=None):
    """One line per group of the keys `by` (mean +- std over its runs, e.g. seeds), one panel per metric."""
    plt = pyplot()
    fig, axes = _axes(plt, metrics, x, title)
    groups = {", ".join(f"{k}={v}" for k, v in zip(by, key)): members
              for key, members in group_runs(runs, by).items()}
    for ax, metric in zip(axes, metrics):
        draw_groups(ax, groups, metric, x)
    _save(plt, fig, axes, path)


# --- the command behind `fedmpi report` and tools/compare.py, tools/sweep.py -----------------------------

def report_command(paths, target=None, by=(), csv_path=None, plot=None, x="round", fmt="text", out=None,
                   err=None) -> int:
    """Prints the table of the runs in `paths` to `out` (grouped by the keys `by` when given), optionally
    writes it as CSV and draws the curves; returns the exit status."""
    out, err = out or sys.stdout, err or sys.stderr
    files, unmatched = find_run_files(paths)
    if unmatched:
        print(f"fedmpi: error: no run file at {', '.join(unmatched)}", file=err)
        return EXIT_USAGE
    runs = load_runs(files, err=err)
    if not runs:
        print("fedmpi: error: none of the run files could be read", file=err)
        return EXIT_USAGE
    rows = sweep_rows(runs, by, target) if by else report.summarize(runs, target)
    print(report.format_table(rows, fmt, left=len(by) if by else 3), file=out)
    if csv_path:
        report.write_csv(rows, csv_path)
    if plot:
        if by:
            plot_sweep(runs, by, plot, x=x)
        else:
            plot_curves(runs, plot, x=x)
        print(f"curves written to {plot}", file=out)
    return 0
