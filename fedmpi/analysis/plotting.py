"""matplotlib for the analysis commands: files only (the Agg backend, no display needed), and a clear
message instead of an ImportError where matplotlib is not installed."""

from __future__ import annotations

import os
import textwrap

from fedmpi.core.output_paths import replace_with

LABEL_WIDTH = 34        # characters per line of an axis label: a longer one wraps instead of being cut off


def pyplot():
    """matplotlib.pyplot on the Agg backend."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("fedmpi: plotting needs matplotlib: pip install 'fedmpi[plot]'") from None
    return plt


def wrap(label, width=LABEL_WIDTH):
    """An axis label on as many lines as it needs."""
    return textwrap.fill(str(label), width)


def legend_below(fig, axes, title=None, columns=None, order=None):
    """One legend for the whole figure, below its panels (never over the curves, never cut off: the figure is
    saved with its bounding box around everything), with each label once; `title` says what the lines and
    bands are, `order` (labels) and `columns` lay the entries out (figure_style.legend_columns)."""
    seen = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    if order:
        seen = {label: seen[label] for label in [*order, *seen] if label in seen}
    if seen:
        columns = columns or max(1, min(len(seen), 4 if max(len(label) for label in seen) < 30 else 2))
        fig.legend(list(seen.values()), list(seen), loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=columns,
                   frameon=False, title=title, fontsize=8, title_fontsize=8)
    elif title:
        fig.text(0.5, 0.0, title, ha="center", va="top")


def save(plt, fig, path):
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def save_figure(fig, path):
    """`fig` as a file at `path` in the format its suffix names (.png, .pdf, .svg, ...), written to a temporary
    file renamed into place (never through a link); the bounding box is fitted around every label and legend, so
    none is cut off. A raster is written at the figure's own dpi (300 for a figure drawn at a paper's width)."""
    fmt = os.path.splitext(path)[1][1:].lower() or "png"
    replace_with(path, lambda fh: fig.savefig(fh, dpi=max(fig.dpi, 120), format=fmt, bbox_inches="tight"),
                 mode="wb")
