"""Reading run files and summarising them: the table of `fedmpi report` (and of tools/)."""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field

import numpy as np
import yaml

from fedmpi.data.stats import weighted_mean_emd
from fedmpi.store import open_run

WINDOW = 20          # evaluations in the rolling mean that defines "final accuracy" (FSL paper)
RISE_FRACTION = 0.9  # rise time: first round whose rolling accuracy reaches 90% of the final value


@dataclass
class Run:
    path: str
    attrs: dict
    metrics: dict
    partition: dict = field(default_factory=dict)

    @property
    def name(self):
        return os.path.basename(os.path.dirname(os.path.abspath(self.path))) or self.path

    @property
    def config(self):
        return yaml.safe_load(self.attrs.get("config", "")) or {}


def read_run(path) -> Run:
    with open_run(path) as f:
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        metrics = {k: ds[()] for k, ds in f["metrics"].items()}
        n = min(len(v) for v in metrics.values()) if metrics else 0
        metrics = {k: v[:n] for k, v in metrics.items()}   # a row may be mid-append
        part = {k: ds[()] for k, ds in f["partition"].items() if hasattr(ds, "shape")} if "partition" in f else {}
    return Run(path, attrs, metrics, part)


def rolling_mean(values, window=WINDOW):
    values = np.asarray(values, dtype=np.float64)
    csum = np.concatenate([[0.0], np.cumsum(values)])
    idx = np.arange(1, len(values) + 1)
    lo = np.maximum(0, idx - window)
    return (csum[idx] - csum[lo]) / (idx - lo)


def accuracy_figures(rounds, acc, window=WINDOW):
    """(final, best, rise round): final = mean of the last `window` evaluations; rise = first round whose
    rolling mean reaches RISE_FRACTION of final."""
    mask = ~np.isnan(acc)
    r, a = np.asarray(rounds)[mask], np.asarray(acc)[mask]
    if len(a) == 0:
        return np.nan, np.nan, np.nan
    final = float(a[-window:].mean())
    rolling = rolling_mean(a, window)
    reached = np.flatnonzero(rolling >= RISE_FRACTION * final)
    rise = float(r[reached[0]] + 1) if len(reached) else np.nan
    return final, float(a.max()), rise


def summarize(runs):
    rows = []
    for run in runs:
        m = run.metrics
        final, best, rise = accuracy_figures(m.get("round", []), m.get("test_acc", []))
        rows.append({
            "run": run.name,
            "algorithm": run.attrs.get("algorithm", run.config.get("algorithm", {}).get("name", "?")),
            "status": run.attrs.get("status", "?"),
            "rounds": int(len(m.get("round", []))),
            "final_acc": final,
            "best_acc": best,
            "rise_round": rise,
            "uploads": float(np.nansum(m.get("uploads", []))),
            "bytes_moved": float(np.nansum(m.get("bytes_up", [])) + np.nansum(m.get("bytes_down", []))),
            "wall_s": float(m["wall_s"][-1]) if len(m.get("wall_s", [])) else np.nan,
        })
    return rows


def _fmt(key, v):
    if isinstance(v, str):
        return v
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "-"
    if key.endswith("acc"):
        return f"{v:.4f}"
    if key == "bytes_moved":
        return _human_bytes(v)
    if key == "wall_s":
        return f"{v:.1f}"
    return f"{v:.0f}"


def _human_bytes(n):
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1000


def format_table(rows):
    if not rows:
        return "(no runs)"
    keys = list(rows[0])
    cells = [[_fmt(k, r[k]) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    line = lambda vals: "  ".join(v.ljust(w) if i < 3 else v.rjust(w)  # noqa: E731
                                  for i, (v, w) in enumerate(zip(vals, widths)))
    return "\n".join([line(keys), line(["-" * w for w in widths])] + [line(c) for c in cells])


def write_csv(rows, path):
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def plot_curves(runs, path, x_key="round"):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("fedmpi: --plot needs matplotlib: pip install 'fedmpi[plot]'") from None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        m = run.metrics
        mask = ~np.isnan(m["test_acc"])
        x = m[x_key][mask] + (1 if x_key == "round" else 0)
        ax.plot(x, m["test_acc"][mask], label=run.name)
    ax.set_xlabel(x_key.replace("_", " "))
    ax.set_ylabel("test accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def partition_summary(stats, title="clients"):
    samples = np.asarray(stats["samples"])
    labels = np.asarray(stats["labels"])
    classes_held = (labels > 0).sum(axis=1)
    whole = labels.sum(axis=0)
    return (f"{title}: {len(samples)}, samples per client min {samples.min()} / median "
            f"{int(np.median(samples))} / max {samples.max()}, classes per client min {classes_held.min()} / "
            f"max {classes_held.max()}, EMD mean {np.mean(stats['emd']):.3f} "
            f"(sample-weighted {weighted_mean_emd(labels, whole):.3f})")
