"""matplotlib for the analysis commands: files only (the Agg backend, no display needed), and a clear
message instead of an ImportError where matplotlib is not installed."""

from __future__ import annotations


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
    fig.savefig(path, dpi=120)
    plt.close(fig)
