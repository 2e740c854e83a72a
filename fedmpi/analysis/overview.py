"""One figure for a folder of runs (`fedmpi report RUNS --plot FILE`, `fedmpi.analysis.plot_overview`): the runs
grouped by method (or by the `--by` keys), each group drawn as the mean over its finished runs (seeds; `include`
adds other statuses, fedmpi.analysis.selection; the label says what was left out) with a band of +- one sample
standard deviation, one legend for the figure below its panels.

Panels: test accuracy against rounds (1-based; or the --x axis), test loss, test accuracy against bytes moved,
and one comparison panel per family some run recorded:
  personalization  the CDF of the clients' local accuracy at the last local evaluation (the group's clients
                   pooled over its runs); its spread and worst clients are the fairness figures too
  robustness       the attack's success (backdoor_acc) against rounds
  privacy          final test accuracy against epsilon, one point per group with its spread over seeds
  secure aggr.     the share of updates clipped before masking, against rounds
  deployment       test accuracy against simulated time
"""

from __future__ import annotations

import math

import numpy as np

from fedmpi.analysis import figures, selection
from fedmpi.analysis.curves import X_AXES, draw_groups, has_x
from fedmpi.analysis.plotting import legend_below, pyplot, save_figure, wrap
from fedmpi.analysis.report import human_bytes
from fedmpi.analysis.sweeps import group_runs

COLUMNS = 3         # panels per row


def setting_labels(runs):
    """A label per run that runs share only when they differ in nothing but the seed (and run-time keys): the
    method, and where runs of one method differ in other config keys, those keys' values (`fedavg,
    clients.dropout=0.3`)."""
    from fedmpi.analysis.frames import RUN_ONLY_KEYS, flatten

    flat = [flatten(run.config) for run in runs]
    peers = {}
    for run, config in zip(runs, flat):
        peers.setdefault(run.method, []).append(config)
    labels = []
    for run, config in zip(runs, flat):
        same = peers[run.method]
        keys = sorted({k for c in same for k in c})
        differing = [k for k in keys if k != "seed" and not k.startswith(RUN_ONLY_KEYS)
                     and len({repr(c.get(k)) for c in same}) > 1]
        labels.append(run.method + "".join(f", {k}={config.get(k)}" for k in differing))
    return labels


def groups_of(runs, by=(), include=None):
    """{label (n=N runs, what was left out): [runs used]}: the runs that differ only by seed (`setting_labels`),
    or by the values of the dotted config keys `by`; the finished ones unless `include` names others
    (fedmpi.analysis.selection)."""
    if by:
        groups = {", ".join(str(v) if k == "method" else f"{k}={v}" for k, v in zip(by, key)): members
                  for key, members in group_runs(runs, list(by)).items()}
    else:
        groups = {}
        for run, label in zip(runs, setting_labels(runs)):
            groups.setdefault(label, []).append(run)
    out = {}
    for label, members in groups.items():
        used, left_out = selection.split_runs(members, include)
        out[selection.group_label(label, len(used), left_out)] = used
    return out


def _has(runs, metric):
    return any(np.isfinite(figures.series(r, metric)).any() for r in runs)


def family_panels(runs):
    """The family panels the runs call for, in the module docstring's order."""
    panels = []
    if any(r.client_figure("local_acc") is not None for r in runs if "local_acc_mean" in r.metrics):
        panels.append(_personalization)
    if _has(runs, "backdoor_acc"):
        panels.append(_robustness)
    if _has(runs, "epsilon"):
        panels.append(_privacy)
    if _has(runs, "secagg_clipped_fraction"):
        panels.append(_secure_aggregation)
    if _has(runs, "sim_time_s"):
        panels.append(_deployment)
    return panels


def plot_overview(runs, path, by=(), x="round", title=None, include=None):
    """Writes the figure of the module's docstring for `runs` to `path` (the finished runs unless `include`
    names others: `groups_of`); returns the panels' titles."""
    plt = pyplot()
    groups = groups_of(runs, by, include)
    runs = [run for members in groups.values() for run in members]
    colors = {label: f"C{i % 10}" for i, label in enumerate(groups)}
    base = [_curve("test_acc", x), _curve("test_loss", x)]
    if x != "bytes":
        base.append(_curve("test_acc", "bytes"))
    panels = base + family_panels(runs)
    rows = math.ceil(len(panels) / COLUMNS)
    fig, axes = plt.subplots(rows, min(len(panels), COLUMNS), figsize=(5.2 * min(len(panels), COLUMNS), 4 * rows),
                             squeeze=False)
    titles = []
    for ax, panel in zip(axes.flat, panels):
        titles.append(panel(ax, groups, colors))
        ax.set_title(wrap(titles[-1], 48), fontsize=10)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    legend_below(fig, list(axes.flat))
    save_figure(fig, path)
    plt.close(fig)
    return titles


def _curve(metric, x):
    def panel(ax, groups, colors):
        draw_groups(ax, {k: v for k, v in groups.items() if all(has_x(r, x) for r in v)}, metric, x, colors,
                    counted=False)
        if x == "round":
            _integer_rounds(ax)
        ax.set_xlabel(X_AXES[x])
        ax.set_ylabel(wrap(metric.replace("_", " ")))
        if x == "bytes":
            ax.xaxis.set_major_formatter(lambda v, _: human_bytes(v))
        return f"{metric.replace('_', ' ')} against {X_AXES[x]}"
    return panel


def _integer_rounds(ax):
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _personalization(ax, groups, colors):
    for label, members in groups.items():
        pooled = []
        for run in members:
            share = figures.series(run, "local_acc_mean")
            rows = np.flatnonzero(np.isfinite(share))
            table = run.client_figure("local_acc")
            if len(rows) and table is not None and rows[-1] < len(table):
                values = table[rows[-1]]
                pooled += list(values[np.isfinite(values)])
        if pooled:
            values = np.sort(pooled)
            ax.step(values, np.arange(1, len(values) + 1) / len(values), where="post", label=label,
                    color=colors[label])
    ax.set_xlabel("client's accuracy on its own test split")
    ax.set_ylabel("share of clients")
    return "personalization: clients' local accuracy (CDF, last local evaluation)"


def _against_rounds(ax, groups, colors, metric, ylabel):
    draw_groups(ax, groups, metric, "round", colors, counted=False)
    _integer_rounds(ax)
    ax.set_xlabel(X_AXES["round"])
    ax.set_ylabel(wrap(ylabel))


def _robustness(ax, groups, colors):
    _against_rounds(ax, groups, colors, "backdoor_acc", "backdoor success rate")
    return "robustness: attack success (backdoor_acc)"


def _privacy(ax, groups, colors):
    for label, members in groups.items():
        if not all("epsilon" in r.metrics for r in members):
            continue            # no privacy accountant in this group: no epsilon to put it at
        eps = np.array([figures.model_epsilon(r) for r in members])
        acc = np.array([figures.last(figures.series(r, "test_acc")) for r in members])
        keep = np.isfinite(acc)
        if not keep.any():
            continue
        e = eps[keep & np.isfinite(eps)]
        xs = float(e.mean()) if len(e) else np.inf
        ax.errorbar([min(xs, 1e3)], [acc[keep].mean()], yerr=[acc[keep].std(ddof=1) if keep.sum() > 1 else 0],
                    fmt="o", capsize=3, label=label, color=colors[label])
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlabel("epsilon (infinite, e.g. clip without noise: drawn at 1000)")
    ax.set_ylabel("final test accuracy")
    return "privacy: final accuracy against epsilon"


def _secure_aggregation(ax, groups, colors):
    _against_rounds(ax, groups, colors, "secagg_clipped_fraction", "share of updates clipped before masking")
    ax.axhline(figures.HALF, color="gray", linestyle="--", linewidth=0.8)
    return "secure aggregation: updates clipped (secagg.clip)"


def _deployment(ax, groups, colors):
    draw_groups(ax, {k: v for k, v in groups.items() if all(has_x(r, "sim_time") for r in v)}, "test_acc",
                "sim_time", colors, counted=False)
    ax.set_xlabel(X_AXES["sim_time"])
    ax.set_ylabel("test accuracy")
    return "deployment: accuracy against simulated time"
