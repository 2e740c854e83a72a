"""`fedmpi report --timing`: where a round's time goes, per rank and phase.

Reads `/timing/<phase>` [round, rank] (seconds); the table gives each rank's mean seconds per round in
each phase and their total, and `--plot` draws the same as stacked bars (one panel per run, one bar per
rank). Rank 0 is the server.
"""

from __future__ import annotations

import warnings

import numpy as np

from fedmpi.analysis import report
from fedmpi.analysis.plotting import pyplot, save

# The phases the round loop records, in the order of a round; any other phase follows, by name.
PHASES = ("bcast", "train", "reduce", "wait", "server", "eval")


def phase_means(run):
    """(phases, [rank, phase] mean seconds per round, rounds timed) or None when nothing was timed."""
    timing = {k: np.asarray(v, dtype=np.float64) for k, v in run.timing.items() if np.ndim(v) == 2}
    if not timing:
        return None
    phases = [p for p in PHASES if p in timing] + sorted(set(timing) - set(PHASES))
    ranks = max(v.shape[1] for v in timing.values())
    means = np.full((ranks, len(phases)), np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)     # a rank that never ran a phase stays NaN
        for j, phase in enumerate(phases):
            values = timing[phase]
            means[:values.shape[1], j] = np.nanmean(values, axis=0) if len(values) else np.nan
    rounds = max(len(v) for v in timing.values())
    return phases, means, rounds


def timing_rows(run):
    found = phase_means(run)
    if found is None:
        return None
    phases, means, _ = found
    rows = []
    for rank, values in enumerate(means):
        row = {"rank": str(rank), "role": "server" if rank == 0 else "worker"}
        row.update({p: _seconds(v) for p, v in zip(phases, values)})
        row["total"] = _seconds(np.nansum(values) if np.isfinite(values).any() else np.nan)
        rows.append(row)
    return rows


def _seconds(v):
    return "-" if not np.isfinite(v) else f"{v:.4f}"


def timing_section(run, fmt="text"):
    rows = timing_rows(run)
    if rows is None:
        return f"{run.name}: phase timing not recorded (/timing)"
    _, _, rounds = phase_means(run)
    return (f"{run.name}: mean seconds per round over {rounds} rounds, by rank and phase\n"
            + report.format_table(rows, fmt, left=2))


def plot_timing(runs, path):
    """Stacked bars of mean seconds per round, one panel per run that recorded timing; False if none did."""
    timed = [(run, phase_means(run)) for run in runs]
    timed = [(run, found) for run, found in timed if found is not None]
    if not timed:
        return False
    plt = pyplot()
    ranks = max(len(means) for _, (_, means, _) in timed)
    fig, axes = plt.subplots(1, len(timed), figsize=(max(4.5, 0.6 * ranks + 2.5) * len(timed), 4.2), squeeze=False)
    colours = {}
    for ax, (run, (phases, means, rounds)) in zip(axes[0], timed):
        bottom = np.zeros(len(means))
        for j, phase in enumerate(phases):
            height = np.nan_to_num(means[:, j])
            colour = colours.setdefault(phase, f"C{len(colours) % 10}")
            ax.bar(np.arange(len(means)), height, bottom=bottom, label=phase, color=colour)
            bottom += height
        ax.set_xticks(np.arange(len(means)), ["0\nserver"] + [str(r) for r in range(1, len(means))])
        ax.set_xlabel("rank")
        ax.set_ylabel("seconds per round (mean)")
        ax.set_title(f"{run.name} ({rounds} rounds)")
        ax.grid(alpha=0.3, axis="y")
    handles, labels = axes[0][-1].get_legend_handles_labels()
    # Beside the last panel, top to bottom in the order the bars stack from the top down.
    axes[0][-1].legend(handles[::-1], labels[::-1], fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    save(plt, fig, path)
    return True
