"""One figure for a folder of runs (`fedmpi report RUNS --plot FILE`, `fedmpi.analysis.plot_overview`): the runs
grouped by method (or by the `--by` keys), each group drawn as the mean over its finished runs (seeds; `include`
adds other statuses, fedmpi.analysis.selection; the label says what was left out) with a band (the 95% confidence
interval of the mean unless `band` names another statistic; figure_style.BANDS), each method in one colour and
each setting of it in one line style, one legend for the figure below its panels that names the band. `width`
(inches) draws it at a paper's column or page width; the file's suffix picks PNG, PDF or SVG.

Panels: test accuracy against rounds (1-based; or the --x axis; the token accuracy of a next-token task), test
loss, test perplexity where some run recorded it (a next-token task: fedmpi.core.perplexity), test accuracy
against bytes moved, and one comparison panel per family some run recorded:
  personalization  the CDF of the clients' local accuracy at the last local evaluation (the group's clients
                   pooled over its runs); its spread and worst clients are the fairness figures too
  robustness       the attack's success (backdoor_acc) against rounds
  privacy          final test accuracy against the model's epsilon, one point per group with its band over
                   seeds; a group whose epsilon is infinite (clipping without noise) is named in the panel,
                   not drawn; no panel where no run has a finite epsilon
  secure aggr.     the share of updates clipped before masking, against rounds
  deployment       test accuracy against simulated time
"""

from __future__ import annotations

import numpy as np

from fedmpi.analysis import figure_style, figures, selection
from fedmpi.analysis.curves import LABELS, X_AXES, draw_groups, has_x
from fedmpi.analysis.plotting import legend_below, pyplot, save_figure, wrap
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
    if any(np.isfinite(figures.model_epsilon(r)) for r in runs if "epsilon" in r.metrics):
        panels.append(_privacy)
    if _has(runs, "secagg_clipped_fraction"):
        panels.append(_secure_aggregation)
    if _has(runs, "sim_time_s"):
        panels.append(_deployment)
    return panels


def plot_overview(runs, path, by=(), x="round", title=None, include=None, band=figure_style.DEFAULT_BAND,
                  width=None):
    """Writes the figure of the module's docstring for `runs` to `path` (the finished runs unless `include`
    names others: `groups_of`); returns the panels' titles."""
    figure_style.check_band(band)
    plt = pyplot()
    groups = groups_of(runs, by, include)
    runs = [run for members in groups.values() for run in members]
    colour_first = not by or "method" in by[:1] or "method" not in by
    parts = {label: figure_style.label_parts(label, colour_first) for label in groups}
    looks = figure_style.encodings(parts)
    base = [_curve("test_acc", x), _curve("test_loss", x)]
    if _has(runs, "test_perplexity"):
        base.append(_curve("test_perplexity", x))
    if x != "bytes":
        base.append(_curve("test_acc", "bytes"))
    panels = base + family_panels(runs)
    with figure_style.style(width):
        rows, cols, size, dpi = figure_style.layout(len(panels), width, COLUMNS)
        fig, axes = plt.subplots(rows, cols, figsize=size, dpi=dpi, squeeze=False)
        titles = []
        for ax, panel in zip(axes.flat, panels):
            titles.append(panel(ax, groups, looks, band))
            ax.set_title(wrap(titles[-1], 48 if width is None else int(size[0] / cols * 72 / 5)),
                         fontsize=10 if width is None else 8)           # 8 pt: about 5 pt a character
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(panels):]:
            ax.set_visible(False)
        if title:
            fig.suptitle(title)
        fig.tight_layout()
        if width is None:
            legend_below(fig, list(axes.flat), title=figure_style.band_note(band, groups),
                         columns=figure_style.legend_columns(parts), order=figure_style.ordered_for_legend(parts))
        else:
            figure_style.paper_legend(fig, parts, looks, figure_style.band_note(band, groups), width)
        save_figure(fig, path)
    plt.close(fig)
    return titles


def _curve(metric, x):
    def panel(ax, groups, looks, band):
        draw_groups(ax, {k: v for k, v in groups.items() if all(has_x(r, x) for r in v)}, metric, x,
                    counted=False, styles=looks, band=band)
        if x == "round":
            _integer_rounds(ax)
        ax.set_xlabel(X_AXES[x])
        ax.set_ylabel(wrap(LABELS.get(metric, metric.replace("_", " "))))
        if x == "bytes":
            figure_style.byte_axis(ax.xaxis)
        return f"{metric.replace('_', ' ')} against {X_AXES[x]}"
    return panel


def _integer_rounds(ax):
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _personalization(ax, groups, looks, band):
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
                    **looks[label])
    ax.set_xlabel("client's accuracy on its own test split")
    ax.set_ylabel("share of clients")
    return "personalization: clients' local accuracy (CDF, last local evaluation)"


def _against_rounds(ax, groups, looks, band, metric, ylabel):
    draw_groups(ax, groups, metric, "round", counted=False, styles=looks, band=band)
    _integer_rounds(ax)
    ax.set_xlabel(X_AXES["round"])
    ax.set_ylabel(wrap(ylabel))


def _robustness(ax, groups, looks, band):
    _against_rounds(ax, groups, looks, band, "backdoor_acc", "backdoor success rate")
    return "robustness: attack success (backdoor_acc)"


def _privacy(ax, groups, looks, band):
    unbounded, finite = [], []
    for label, members in groups.items():
        if not all("epsilon" in r.metrics for r in members):
            continue            # no privacy accountant in this group: no epsilon to put it at
        eps = np.array([figures.model_epsilon(r) for r in members])
        acc = np.array([figures.last(figures.series(r, "test_acc")) for r in members])
        keep = np.isfinite(acc) & np.isfinite(eps)
        if np.isinf(eps).any():
            unbounded.append(label)     # an infinite epsilon has no place on the axis: named, not drawn
        if not keep.any():
            continue
        half = figure_style.band_half_width(acc[keep][:, None], band)
        ax.errorbar([eps[keep].mean()], [acc[keep].mean()], yerr=None if half is None else [half[0]], fmt="o",
                    capsize=3, label=label, color=looks[label]["color"], mfc="none" if looks[label]["linestyle"]
                    not in ("-", "solid") else None)
        finite.append(eps[keep].mean())
    _epsilon_axis(ax, finite)
    # below the axis, where it cannot hide a point
    ax.set_xlabel("epsilon of the released model" + ("\n" + wrap("not drawn, epsilon infinite (no noise): "
                                                                   + "; ".join(unbounded), 44) if unbounded else ""))
    ax.set_ylabel("final test accuracy")
    return "privacy: final accuracy against epsilon"


def _epsilon_axis(ax, values):
    """Linear from 0 where the epsilons are within a factor of 20 of each other (a single one included, so that
    it has ticks around it), else logarithmic."""
    from matplotlib.ticker import MaxNLocator

    if not values:
        return
    low, high = min(values), max(values)
    if low > 0 and high / low > 20:
        ax.set_xscale("log")
        ax.set_xlim(low / 2, high * 2)
    else:
        ax.set_xlim(0, high * 1.15 if high > 0 else 1.0)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5))


def _secure_aggregation(ax, groups, looks, band):
    _against_rounds(ax, groups, looks, band, "secagg_clipped_fraction", "share of updates clipped before masking")
    ax.axhline(figures.HALF, color="gray", linestyle="--", linewidth=0.8)
    return "secure aggregation: updates clipped (secagg.clip)"


def _deployment(ax, groups, looks, band):
    draw_groups(ax, {k: v for k, v in groups.items() if all(has_x(r, "sim_time") for r in v)}, "test_acc",
                "sim_time", counted=False, styles=looks, band=band)
    ax.set_xlabel(X_AXES["sim_time"])
    ax.set_ylabel("test accuracy")
    return "deployment: accuracy against simulated time"
