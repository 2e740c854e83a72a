"""The per-run figure of `fedmpi report --plot FILE --per-run`: test accuracy (with the centralized shadow model's
where it was trained), the backdoor's success rate under a backdoor attack, weight divergence ||w_FL - w_SGD|| /
||w_SGD|| (with its layers), and a heat map of the per-class accuracy over rounds. A panel is drawn only for what
the run recorded. Rounds are 1-based."""

from __future__ import annotations

import numpy as np

from fedmpi.analysis.class_report import class_accuracy
from fedmpi.analysis.plotting import pyplot, save, wrap

MAX_LAYER_LINES = 12        # more layers than this would hide the total; they stay in the CSV/TensorBoard export


def _series(run, name):
    """(1-based rounds, values) where the figure was measured."""
    y = np.asarray(run.metrics.get(name, []), dtype=np.float64)
    if y.ndim != 1:
        return np.zeros(0), np.zeros(0)
    x = np.asarray(run.metrics["round"], dtype=np.float64)[:len(y)] + 1
    keep = np.isfinite(y)
    return x[keep], y[keep]


def plot_run(run, path):
    """Writes the figure of one run to `path`."""
    panels = [_accuracy]
    if len(_series(run, "backdoor_acc")[0]):
        panels.append(_backdoor)
    if "weight_divergence" in run.metrics:
        panels.append(_divergence)
    if class_accuracy(run) is not None:
        panels.append(_class_heat_map)
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        panel(fig, ax, run)
    fig.suptitle(run.name)
    save(plt, fig, path)


def _accuracy(fig, ax, run):
    for name, label in (("test_acc", "federated model"), ("shadow_acc", "centralized SGD (shadow)")):
        x, y = _series(run, name)
        if len(x):
            ax.plot(x, y, label=label, marker="o" if len(x) < 3 else None)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def _backdoor(fig, ax, run):
    x, y = _series(run, "backdoor_acc")
    ax.plot(x, y, color="C3", marker="o" if len(x) < 3 else None)
    ax.set_xlabel("round")
    ax.set_ylabel(wrap("backdoor success rate (triggered non-target test samples classified as the target)"))
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)


def _divergence(fig, ax, run):
    x, y = _series(run, "weight_divergence")
    ax.plot(x, y, color="k", linewidth=2, label="whole model", marker="o" if len(x) < 3 else None)
    layers = np.asarray(run.metrics.get("weight_divergence_layers", np.zeros((0, 0))), dtype=np.float64)
    names = [n.decode() if isinstance(n, bytes) else str(n)
             for n in run.metric_attrs.get("weight_divergence_layers", {}).get("layers", [])]
    if layers.ndim == 2 and 0 < layers.shape[1] <= MAX_LAYER_LINES:
        rounds = np.asarray(run.metrics["round"], dtype=np.float64)[:len(layers)] + 1
        for j in range(layers.shape[1]):
            keep = np.isfinite(layers[:, j])
            ax.plot(rounds[keep], layers[keep, j], linewidth=0.8, alpha=0.7,
                    label=names[j] if j < len(names) else f"layer {j}")
    ax.set_xlabel("round")
    ax.set_ylabel(wrap("weight divergence ||w_FL - w_SGD|| / ||w_SGD||"))
    ax.set_title("||w_FL - w_SGD|| / ||w_SGD||", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _class_heat_map(fig, ax, run):
    rounds, acc = class_accuracy(run)
    if len(rounds) == 0:
        ax.set_title("per-class accuracy: no evaluated round yet")
        return
    # Columns at the evaluated rounds (1-based); eval.every spaces them evenly.
    first, last = rounds[0] + 1, rounds[-1] + 1
    half = 0.5 * (last - first) / max(len(rounds) - 1, 1) if len(rounds) > 1 else 0.5
    image = ax.imshow(acc.T, aspect="auto", origin="lower", vmin=0.0, vmax=1.0, cmap="viridis",
                      extent=(first - half, last + half, -0.5, acc.shape[1] - 0.5), interpolation="nearest")
    fig.colorbar(image, ax=ax, label="test accuracy of the class")
    ax.set_title("per-class test accuracy", fontsize=10)
    ax.set_xlabel("round")
    ax.set_ylabel("class")
    if acc.shape[1] <= 20:
        ax.set_yticks(range(acc.shape[1]))
