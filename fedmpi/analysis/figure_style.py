"""How the analysis figures look: one colour per method and one line style per setting, the band around a group's
mean and the words that name it, byte axes in SI units with ticks that do not run together, and sizes legible at
a paper's column width (`width` in inches: 3.5 for one column, 7 for a page).

The band is the 95% confidence interval of the mean over a group's runs (Student's t, the interval the summary
tables print as FIG_ci95) unless another statistic is asked for; a group of one run has no band.
"""

from __future__ import annotations

import contextlib
import math
import re

import numpy as np

from fedmpi.core.errors import InputError

BANDS = {"ci95": "95% CI of the mean over seeds (t)", "std": "± 1 std over seeds",
         "sem": "± 1 s.e.m. over seeds", "none": None}
DEFAULT_BAND = "ci95"
LINE_STYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))
MARKERS = (None, "o", "s", "^", "v", "D")        # after ten colours, the colours repeat with a marker
COLOURS = 10                                     # matplotlib's default cycle C0..C9
# Font sizes (points) of a figure drawn at a given width: a paper's caption text is 8-10 pt, so 7-8 pt labels
# stay legible when the figure is placed at that width unscaled.
PAPER_RC = {"font.size": 8, "axes.titlesize": 8, "axes.labelsize": 8, "xtick.labelsize": 7, "ytick.labelsize": 7,
            "legend.fontsize": 7, "legend.title_fontsize": 7, "figure.titlesize": 9, "lines.linewidth": 1.2,
            "lines.markersize": 4, "axes.linewidth": 0.6}
PAPER_DPI = 300
SCREEN_DPI = 120
MIN_PANEL_WIDTH = 1.7                            # inches: a narrower panel cannot hold its tick labels
MAX_WIDTH = 40.0                                 # inches: wider than any page or poster column


def check_band(band):
    """`band` if it names a statistic of BANDS, else an InputError naming the choices."""
    if band not in BANDS:
        raise InputError(f"band: {band!r} is not one of {', '.join(BANDS)}")
    return band


def band_note(band, groups):
    """The words the legend carries about the band: its statistic, or that no group has one."""
    if band == "none" or all(len(members) < 2 for members in groups.values()):
        return "mean over seeds; no band (one run per group)" if band != "none" else "mean over seeds"
    return f"line: mean over seeds; band: {BANDS[band]}"


def band_half_width(ys, band):
    """The band's half-width at each point of `ys` (runs x points), or None for a single run or no band."""
    from fedmpi.analysis.frames import half_width

    n = ys.shape[0]
    if n < 2 or band == "none":
        return None
    return half_width(ys.std(axis=0, ddof=1), n, band)


def encodings(parts):
    """{label: plot keyword arguments} for {label: (colour key, style key)}: one colour per colour key (the
    method), one line style per style key (the setting), in the order the keys first appear."""
    colour_keys = list(dict.fromkeys(c for c, _ in parts.values()))
    style_keys = list(dict.fromkeys(s for _, s in parts.values()))
    out = {}
    for label, (colour, style) in parts.items():
        i, j = colour_keys.index(colour), style_keys.index(style)
        out[label] = {"color": f"C{i % COLOURS}", "linestyle": LINE_STYLES[j % len(LINE_STYLES)],
                      "marker": MARKERS[i // COLOURS % len(MARKERS)]}
    return out


def label_parts(label, colour_first=True):
    """(colour key, style key) of a group label "method, key=value, ...": the method, and the rest (the setting);
    a trailing run count " (n)" is not part of either."""
    base = label.rsplit(" (", 1)[0] if label.endswith(")") else label
    head, _, rest = base.partition(", ")
    return (head, rest) if colour_first else (rest, head)


def legend_columns(parts):
    """Legend columns such that each column is one setting and each row one method where that fits (the legend
    is then read as a methods x settings grid); None lets the legend choose."""
    settings = len({s for _, s in parts.values()})
    return settings if 1 < settings <= 4 and len(parts) % settings == 0 else None


def ordered_for_legend(parts):
    """The labels in the order that fills a `legend_columns` grid (matplotlib fills a column before the next):
    setting by setting, methods in the same order in each."""
    styles = list(dict.fromkeys(s for _, s in parts.values()))
    return sorted(parts, key=lambda label: styles.index(parts[label][1]))


def byte_axis(axis):
    """SI byte ticks ("20 MB", "1.5 GB") on a matplotlib Axis, few enough that their labels never touch."""
    from matplotlib.ticker import EngFormatter, MaxNLocator

    axis.set_major_formatter(EngFormatter(unit="B", sep=" "))
    # As many ticks as labels like "100 MB" fit along the axis (about 6.5 characters of 0.6 em, and a gap),
    # at most 5: a panel at a paper's column width holds two or three.
    ax = axis.axes
    box = ax.get_position()
    inches = (box.width if axis.axis_name == "x" else box.height) * ax.figure.get_size_inches()[
        0 if axis.axis_name == "x" else 1]
    points = axis.get_ticklabels()[0].get_fontsize() if axis.get_ticklabels() else 10
    bins = max(2, min(5, int(inches / (6.5 * 0.6 * points / 72 + 0.2))))
    axis.set_major_locator(MaxNLocator(nbins=bins, steps=[1, 2, 2.5, 5, 10], min_n_ticks=min(3, bins)))


def finite_points(xs, ys):
    """(xs, ys) without the points where either is NaN or infinite, so that no axis range is set by one."""
    xs, ys = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    keep = np.isfinite(xs) & np.isfinite(ys)
    return xs[keep], ys[keep]


def check_width(width, name="width"):
    """`width` if it is None or a figure width in inches that a page can hold, else an InputError."""
    if width is not None and not (isinstance(width, (int, float)) and MIN_PANEL_WIDTH <= width <= MAX_WIDTH):
        raise InputError(f"{name}: {width!r} is not a figure width in inches (a number from {MIN_PANEL_WIDTH} to "
                         f"{MAX_WIDTH}: 3.5 for a paper's column, 7 for a page)")
    return width


def layout(panels, width=None, columns=3, panel_size=(5.2, 4.0)):
    """(rows, columns, figsize, dpi) of a figure of `panels` panels: at `width` inches, as many columns as fit
    (each panel at least MIN_PANEL_WIDTH), else `panel_size` per panel."""
    if width is None:
        cols = min(panels, columns)
        rows = math.ceil(panels / cols)
        return rows, cols, (panel_size[0] * cols, panel_size[1] * rows), SCREEN_DPI
    check_width(width)
    cols = max(1, min(panels, columns, int(width // MIN_PANEL_WIDTH)))
    rows = math.ceil(panels / cols)
    return rows, cols, (width, rows * 0.8 * width / cols), PAPER_DPI


def style(width=None):
    """The matplotlib rc context to draw a figure in: PAPER_RC's sizes at a given width, else matplotlib's."""
    import matplotlib

    return matplotlib.rc_context(PAPER_RC) if width is not None else contextlib.nullcontext()


def paper_legend(fig, parts, looks, title, width):
    """At a paper's width, one legend below the panels that fits it: an entry per method (its colour) and one
    per setting (its line style, in grey) instead of one per line, the runs per line in the title."""
    import textwrap

    from matplotlib.lines import Line2D

    tails = [re.search(r" \((?:n=)?(\d+)(, [^()]*)?\)$", label) for label in parts]   # " (3)", " (n=2, +1 diverged)"
    counts = sorted({int(m.group(1)) for m in tails if m})
    if counts:
        title += f"; n = {counts[0]}" + (f"-{counts[-1]}" if len(counts) > 1 else "") + " runs per line"
    left_out = [f"{label[:m.start()]}: {m.group(2)[2:]}" for label, m in zip(parts, tails) if m and m.group(2)]
    if left_out:        # what a group left out is said here, where its own label is not drawn
        title += "; left out: " + "; ".join(left_out)
    handles, labels = {}, {}
    for label, (colour, _) in parts.items():
        look = looks[label]
        handles.setdefault(colour, Line2D([], [], color=look["color"], marker=look["marker"], linestyle="-"))
    settings = list(dict.fromkeys(s for _, s in parts.values()))
    if len(settings) > 1:
        for label, (_, setting) in parts.items():
            labels.setdefault(setting, Line2D([], [], color="0.35", linestyle=looks[label]["linestyle"]))
    entries = {**handles, **labels}
    chars = width * 72 / (PAPER_RC["legend.fontsize"] * 0.6)      # characters of a 7 pt font across the width
    columns = max(1, min(len(entries), int(chars // (max(len(e) for e in entries) + 6))))
    fig.legend(list(entries.values()), list(entries), loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=columns,
               frameon=False, title=textwrap.fill(title, int(chars * 0.9)), fontsize=PAPER_RC["legend.fontsize"],
               title_fontsize=PAPER_RC["legend.fontsize"])
