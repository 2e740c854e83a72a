"""Curves of any per-round figure against rounds (1-based), bytes moved, wall time or simulated time, one line per
run or one mean line per group of runs with a band around it (the 95% confidence interval of the mean by default;
figure_style.BANDS), in PNG, PDF, SVG or any matplotlib format (the file's suffix; the Agg backend). A grouping by
method and a setting draws each method in one colour and each setting in one line style (figure_style)."""

from __future__ import annotations

import numpy as np

from fedmpi.analysis import figure_style, figures, selection
from fedmpi.analysis.plotting import legend_below, pyplot, save_figure, wrap
from fedmpi.analysis.sweeps import group_runs

X_AXES = {"round": "round", "bytes": "bytes moved (up + down)", "wall": "wall time (s)",
          "sim_time": "simulated time (s)"}
X_METRICS = {"wall": "wall_s", "sim_time": "sim_time_s"}     # the x axes that are a logged figure
PER_RUN = ("running",)       # a figure of single runs draws those still being written (not diverged, failed)
_STYLES = ("-", "--", ":")      # after the ten default colours, lines change style
LABELS = {"test_acc": "test accuracy", "test_loss": "test loss", "train_loss": "training loss",
          "test_perplexity": "test perplexity exp(mean cross-entropy), lower is better",
          "local_perplexity_mean": "local perplexity (exp of the clients' mean loss)",
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


def has_x(run, x):
    return x not in X_METRICS or X_METRICS[x] in run.metrics


def curve_x(run, x):
    """The x values of every round: the 1-based round, the cumulative bytes moved, the wall time or the
    simulated time (a KeyError where the run did not log the figure: `has_x`)."""
    m = run.metrics
    if x in X_METRICS:
        return np.asarray(m[X_METRICS[x]], dtype=np.float64)
    return {"round": lambda: np.asarray(m["round"]) + 1.0, "bytes": lambda: figures.bytes_moved(m)}[x]()


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


def _axes(plt, metrics, x, title, width=None):
    rows, cols, size, dpi = figure_style.layout(len(metrics), width, columns=len(metrics), panel_size=(6, 4.2))
    fig, axes = plt.subplots(rows, cols, figsize=size, dpi=dpi, squeeze=False)
    for ax, metric in zip(axes.flat, metrics):
        ax.set_xlabel(X_AXES[x])
        ax.set_ylabel(wrap(LABELS.get(metric, metric.replace("_", " ")), 34 if width is None else 40))
        ax.grid(alpha=0.3)
        if x == "bytes":
            figure_style.byte_axis(ax.xaxis)
    if title:
        fig.suptitle(title)
    return fig, list(axes.flat)


def _save(plt, fig, axes, path, **legend):
    fig.tight_layout()
    legend_below(fig, axes, **legend)
    save_figure(fig, path)
    plt.close(fig)


def plot_curves(runs, path, x="round", metrics=("test_acc", "test_loss"), labels=None, smooth=1, title=None,
                include=PER_RUN, width=None):
    """One panel per metric, one line per run; `smooth` > 1 draws the rolling mean over that many points;
    `width` (inches) draws the figure at a paper's column or page width (figure_style). Diverged and failed
    runs are left out unless `include` names them (fedmpi.analysis.selection; runs still being written are
    drawn up to their last complete round): returns what was left out ("" for nothing)."""
    plt = pyplot()
    labels = labels or [run.name for run in runs]
    pairs, left_out = selection.split_runs(list(zip(runs, labels)), include)
    runs, labels = [run for run, _ in pairs], [label for _, label in pairs]
    with figure_style.style(width):
        fig, axes = _axes(plt, metrics, x, title, width)
        for ax, metric in zip(axes, metrics):
            for i, (run, label) in enumerate(zip(runs, labels)):
                xs, ys = curve(run, metric, x)
                if len(xs):
                    ax.plot(*figure_style.finite_points(xs, figures.rolling_mean(ys, smooth) if smooth > 1 else ys),
                            label=label, linestyle=_STYLES[i // 10 % 3])
        _save(plt, fig, axes, path)
    return left_out


def draw_groups(ax, groups, metric="test_acc", x="round", colors=None, counted=True, styles=None,
                band=figure_style.DEFAULT_BAND):
    """On `ax`, one line per group ({label: [runs]}): at each round, the mean over the group's runs that measured
    the figure there (finite values only), with a band (`band`: the 95% CI of the mean, "std", "sem" or "none";
    figure_style.BANDS) where two or more did. A run evaluated on its own cadence (FedSkip's aggregation rounds,
    eval.every) adds its points at its own rounds and never removes the others' points. `colors` may fix a
    group's colour ({label: colour}), e.g. to match it across panels, `styles` its line ({label: plot
    keywords}, figure_style.encodings); `counted` adds the group's number of runs to its label."""
    figure_style.check_band(band)
    for i, (label, members) in enumerate(groups.items()):
        if not members or any(metric not in r.metrics or np.ndim(r.metrics[metric]) != 1 or not has_x(r, x)
                              for r in members):
            continue
        xs, mean, half = group_curve(members, metric, x, band)
        if not len(xs):
            continue
        look = {"linestyle": _STYLES[i // 10 % 3], "color": (colors or {}).get(label),
                **(styles or {}).get(label, {})}
        if len(xs) < 3:
            look["marker"] = look.get("marker") or "o"
        line, = ax.plot(xs, mean, label=f"{label} ({len(members)})" if counted else label, **look)
        shown = np.isfinite(half)
        if shown.any():
            ax.fill_between(xs[shown], (mean - half)[shown], (mean + half)[shown], color=line.get_color(),
                            alpha=0.15, linewidth=0)


def group_curve(members, metric, x="round", band=figure_style.DEFAULT_BAND):
    """(x, mean, band half-width) of a group's curve: one point per round at which some run of the group
    measured `metric` (a finite value at a finite x), the mean over the runs that did (x too, for bytes or time
    axes); the half-width of `band` over those runs (figure_style.band_half_width), NaN where fewer than two did."""
    points = {}
    for run in members:
        ys = np.asarray(run.metrics[metric], dtype=np.float64)
        rounds = np.asarray(run.metrics["round"], dtype=np.float64)[:len(ys)]
        xs = curve_x(run, x)[:len(rounds)]
        keep = np.isfinite(ys[:len(xs)]) & np.isfinite(xs)
        for r, xv, yv in zip(rounds[keep], xs[keep], ys[:len(xs)][keep]):
            points.setdefault(float(r), []).append((xv, yv))
    order = sorted(points)
    xs = np.array([np.mean([p[0] for p in points[r]]) for r in order])
    mean = np.array([np.mean([p[1] for p in points[r]]) for r in order])
    half = [figure_style.band_half_width(np.array([[p[1]] for p in points[r]]), band) for r in order]
    return xs, mean, np.array([np.nan if h is None else float(h[0]) for h in half])


def plot_sweep(runs, by, path, x="round", metrics=("test_acc",), title=None, include=None,
               band=figure_style.DEFAULT_BAND, width=None):
    """One line per group of the keys `by` (the mean over its runs, e.g. seeds, with a `band`), one panel per
    metric; the finished runs unless `include` names others, each label saying what its group left out
    (fedmpi.analysis.selection). Grouped by "method" and settings, each method has one colour and each setting
    one line style (by several keys without "method", the first key's values the colour); the legend reads as
    methods x settings."""
    figure_style.check_band(band)
    plt = pyplot()
    colour_at = list(by).index("method") if "method" in by else 0
    groups, parts = {}, {}
    for key, members in group_runs(runs, by).items():
        used, left_out = selection.split_runs(members, include)
        label = selection.group_label(", ".join(str(v) if k == "method" else f"{k}={v}" for k, v in zip(by, key)),
                                      len(used), left_out)
        groups[label] = used
        parts[label] = (str(key[colour_at]), ", ".join(
            f"{k}={v}" for j, (k, v) in enumerate(zip(by, key)) if j != colour_at))
    looks = figure_style.encodings(parts)
    with figure_style.style(width):
        fig, axes = _axes(plt, metrics, x, title, width)
        for ax, metric in zip(axes, metrics):
            draw_groups(ax, groups, metric, x, counted=False, band=band, styles=looks)
        if width is None:
            _save(plt, fig, axes, path, title=figure_style.band_note(band, groups),
                  columns=figure_style.legend_columns(parts), order=figure_style.ordered_for_legend(parts))
        else:
            fig.tight_layout()
            figure_style.paper_legend(fig, parts, looks, figure_style.band_note(band, groups), width)
            save_figure(fig, path)
            plt.close(fig)
