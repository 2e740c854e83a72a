"""matplotlib for the analysis commands: files only (the Agg backend, no display needed), and a clear
message instead of an ImportError where matplotlib is not installed."""

from __future__ import annotations

import os

from fedmpi.core.output_paths import replace_with


def pyplot():
    """matplotlib.pyplot on the Agg backend."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("fedmpi: plotting needs matplotlib: pip install 'fedmpi[plot]'") from None
    return plt


def save(plt, fig, path):
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def save_figure(fig, path):
    """`fig` as a file at `path`, written to a temporary file renamed into place (never through a link)."""
    fmt = os.path.splitext(path)[1][1:].lower() or "png"
    replace_with(path, lambda fh: fig.savefig(fh, dpi=120, format=fmt), mode="wb")
