"""Post-hoc analysis over many run files: `fedmpi report` and the scripts in tools/ run this code.

Finding and reading runs (also while their jobs still append to them: every read takes the rounds that
are complete), sweep summaries grouped by any config key with mean and spread over the other keys
(seeds), and curves of any per-round figure against rounds, bytes moved or wall time (PNG, matplotlib's
Agg backend). The per-run figures themselves (final accuracy, rise time, rounds to a target) are in
`fedmpi.analysis.report`; the instruments' views (`--classes`, `--timing`, the per-run figure) in
`fedmpi.analysis.class_report`, `fedmpi.analysis.timing_report` and `fedmpi.analysis.run_figure`.
"""

from __future__ import annotations

import glob
import os
import sys

import numpy as np

from fedmpi.analysis import report
from fedmpi.analysis.attack_report import attack_section
from fedmpi.analysis.class_report import class_section
from fedmpi.analysis.client_report import client_section, plot_clients
from fedmpi.analysis.plotting import pyplot, save_figure
from fedmpi.analysis.run_figure import has_instruments, plot_run
from fedmpi.analysis.timing_report import plot_timing, timing_section
from fedmpi.core.errors import EXIT_FAILED, EXIT_USAGE, InputError
from fedmpi.core.output_paths import check_figure, check_file, sibling

X_AXES = {"round": "round", "bytes": "bytes moved (up + down)", "wall": "wall time (s)",
          "sim_time": "simulated time (s)"}
X_METRICS = {"wall": "wall_s", "sim_time": "sim_time_s"}     # the x axes that are a logged figure
SWEEP_FIGURES = ("final_acc", "best_acc", "rise_round", "target_round", "target_bytes", "uploads",
                 "bytes_moved", "wall_s")
_STYLES = ("-", "--", ":")      # after the ten default colours, lines change style
LABELS = {"test_acc": "test accuracy", "test_loss": "test loss", "train_loss": "training loss",
          "weight_divergence": "weight divergence ||w_FL - w_SGD|| / ||w_SGD||",
          "shadow_acc": "test accuracy of centralized SGD (shadow)",
          "gradient_diversity": "gradient diversity sum p_i ||D_i||^2 / ||sum p_i D_i||^2",
          "update_sq_norm": "sum_i p_i ||D_i||^2", "aggregate_sq_norm": "||sum_i p_i D_i||^2",
          "client_lr": "client learning rate", "server_lr": "server learning rate",
          "local_acc_mean": "local accuracy (sample-weighted mean over clients)",
          "local_acc_unweighted": "local accuracy (mean over clients)",
          "local_acc_worst10": "local accuracy, worst 10% of clients",
          "local_acc_worst": "worst client's local accuracy",
          "local_acc_std": "std of the clients' local accuracy",
          "local_below_global": "share of clients below the global model",
          "backdoor_acc": "backdoor success rate (triggered non-target test samples -> target)",
          "detect_precision": "detection precision (malicious among excluded)",
          "detect_recall": "detection recall (malicious excluded)",
          "honest_excluded": "share of honest clients excluded"}


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
        except report.MalformedRun as e:
            print(f"fedmpi: warning: skipping {path}: not a valid run file: {report.one_line(e)}", file=err)
        except Exception as e:  # noqa: BLE001 - one foreign file must not end a table over many runs
            print(f"fedmpi: warning: skipping {path}: cannot read it ({type(e).__name__}: {report.one_line(e)})",
                  file=err)
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

def has_x(run, x):
    return x not in X_METRICS or X_METRICS[x] in run.metrics


def curve_x(run, x):
    """The x values of every round: the 1-based round, the cumulative bytes moved, the wall time or the
    simulated time (a KeyError where the run did not log the figure: `has_x`)."""
    m = run.metrics
    if x in X_METRICS:
        return np.asarray(m[X_METRICS[x]], dtype=np.float64)
    return {"round": lambda: np.asarray(m["round"]) + 1.0, "bytes": lambda: report.bytes_moved(m)}[x]()


def curve(run, metric, x="round"):
    """(x, y) of a per-round figure (`curve_x` for x), the rounds where it was not measured left out;
    empty where the run did not record the figure or the x axis, or the figure is not one value per round."""
    m = run.metrics
    if metric not in m or np.ndim(m[metric]) != 1 or not has_x(run, x):
        return np.zeros(0), np.zeros(0)
    y = np.asarray(m[metric], dtype=np.float64)
    xs = curve_x(run, x)
    keep = np.isfinite(y) & np.isfinite(xs)
    return xs[keep], y[keep]


def missing_curves(runs, metrics, x):
    """One line per (run, figure) that `plot_curves` cannot draw, saying why."""
    lines = []
    for run in runs:
        if not has_x(run, x):
            lines.append(f"{run.name}: {X_METRICS[x]} not recorded, so it has no --x {x} curve")
            continue
        for metric in metrics:
            if metric not in run.metrics:
                lines.append(f"{run.name}: {metric} not recorded")
            elif np.ndim(run.metrics[metric]) != 1:
                lines.append(f"{run.name}: {metric} is not one value per round (it is drawn by fedmpi report "
                             f"--plot or exported with fedmpi export)")
    return lines


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
    save_figure(fig, path)
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
        if n == 0 or any(metric not in r.metrics or np.ndim(r.metrics[metric]) != 1 or not has_x(r, x)
                         for r in members):
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
                   err=None, classes=False, timing=False, clients=False, attack=False, force=False) -> int:
    """Prints the table of the runs in `paths` to `out` (grouped by the keys `by` when given), optionally
    the per-class and per-phase views, writes the table as CSV and draws the figures; returns the exit
    status. A path that names no run, or a file that cannot be read, is skipped with a warning (exit 2 only
    where no run is left); a place that cannot be written, or an existing file there without `force`, is
    exit 2 before anything is read or written."""
    out, err = out or sys.stdout, err or sys.stderr
    files, unmatched = find_run_files(paths)        # names only: nothing is read before the places are checked
    try:
        # `report RUN/run.h5 --csv RUN/run.h5` keeps the run, --force or not
        if csv_path is not None:
            check_file(csv_path, "--csv", inputs=files, replace=force)
        if plot is not None:
            check_figure(plot, "--plot", inputs=files, replace=force)
    except InputError as e:
        print(f"fedmpi: error: {e}", file=err)
        return EXIT_USAGE
    for path in unmatched:
        print(f"fedmpi: warning: skipping {path}: no run file there (a run.h5, a run folder or a folder of runs)",
              file=err)
    runs = load_runs(files, err=err)
    if not runs:
        print("fedmpi: error: none of the run files could be read", file=err)
        return EXIT_USAGE
    if plot is not None:
        try:
            for path in figure_paths(runs, by, plot, timing, clients)[1:]:
                check_file(path, "--plot", inputs=files, replace=force)     # the figures beside PLOT too
        except InputError as e:
            print(f"fedmpi: error: {e} (a figure --plot writes beside {plot})", file=err)
            return EXIT_USAGE
    rows = sweep_rows(runs, by, target) if by else report.summarize(runs, target)
    print(report.format_table(rows, fmt, left=len(by) if by else 3), file=out)
    for wanted, section in ((classes, class_section), (timing, timing_section)):
        for run in runs if wanted else ():
            print("\n" + section(run, fmt), file=out)
    if clients:
        print("\n" + client_section(runs, fmt), file=out)
    if attack:
        print("\n" + attack_section(runs, fmt), file=out)
    try:
        if csv_path is not None:
            report.write_csv(rows, csv_path)
        if plot is not None:
            _draw(runs, by, plot, x, timing, out, err, clients)
    except OSError as e:
        # The places were checked: this is the disk failing while writing (full, I/O error).
        print(f"fedmpi: error: cannot write {e.filename or csv_path or plot}: {e.strerror or e}", file=err)
        return EXIT_FAILED
    return 0


def figure_paths(runs, by, plot, timing, clients):
    """Every file `--plot PLOT` may write, PLOT first (`_figures_beside`), so that each can be checked before
    the first is drawn."""
    return [plot] + [path for _, _, path in _figures_beside(runs, by, plot, timing, clients)]


def _figures_beside(runs, by, plot, timing, clients):
    """(kind, run, path) of each figure beside PLOT, in drawing order: the per-run figures (PLOT-RUN.png, not
    for sweeps), the local-accuracy CDFs (PLOT-RUN-clients.png) and the phase bars (PLOT-timing.png). The one
    place that names them: `_draw` draws these, `figure_paths` checks these."""
    names = {"timing"} if timing else set()
    out = [("run", run, sibling(plot, _unique(run.name, names)))
           for run in (runs if not by else ()) if has_instruments(run)]
    out += [("clients", run, sibling(plot, _unique(f"{run.name}-clients", names))) for run in (runs if clients else ())]
    if timing:
        out.append(("timing", None, sibling(plot, "timing")))
    return out


def _draw(runs, by, plot, x, timing, out, err, clients=False):
    """The figures of --plot: the curves into PLOT; beside it one figure per run that recorded instruments
    (PLOT-RUN.png, not for sweeps), with --timing the phase bars (PLOT-timing.png) and with --clients each
    locally evaluated run's local accuracy CDF beside its global curve (PLOT-RUN-clients.png)."""
    if by:
        plot_sweep(runs, by, plot, x=x)
    else:
        for line in missing_curves(runs, ("test_acc", "test_loss"), x):
            print(f"fedmpi: note: {line}", file=err)
        plot_curves(runs, plot, x=x)
    print(f"curves written to {plot}", file=out)
    for kind, run, path in _figures_beside(runs, by, plot, timing, clients):
        if kind == "run":
            plot_run(run, path)
            print(f"figure of {run.name} written to {path}", file=out)
        elif kind == "clients":
            if plot_clients(run, path):
                print(f"local accuracy of {run.name} written to {path}", file=out)
        elif plot_timing(runs, path):
            print(f"phase timing written to {path}", file=out)
        else:
            print("fedmpi: note: no run recorded phase timing (/timing): no timing figure", file=err)


def _unique(name, taken):
    candidate, i = name, 1
    while candidate in taken:
        i += 1
        candidate = f"{name}-{i}"
    taken.add(candidate)
    return candidate
