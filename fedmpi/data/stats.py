"""Label statistics of a split: histograms and the earth mover's distance to the whole (Zhao et al.)."""

from __future__ import annotations

import numpy as np


def label_histograms(labels, parts, num_classes) -> np.ndarray:
    """[client, class] counts."""
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts]) if parts else \
        np.zeros((0, num_classes), dtype=np.int64)


def emd(histograms, reference) -> np.ndarray:
    """EMD_i = sum_c |p_i(c) - p(c)| of each row's label distribution to `reference`'s."""
    hist = np.asarray(histograms, dtype=np.float64)
    p = hist / np.maximum(hist.sum(axis=1, keepdims=True), 1)
    ref = np.asarray(reference, dtype=np.float64)
    return np.abs(p - ref / ref.sum()).sum(axis=1)


def weighted_mean_emd(histograms, reference) -> float:
    sizes = np.asarray(histograms).sum(axis=1)
    return float((emd(histograms, reference) * sizes).sum() / max(sizes.sum(), 1))


def partition_stats(labels, parts, num_classes):
    """The `/partition` group's datasets: samples [client], labels [client, class], emd [client]."""
    hist = label_histograms(labels, parts, num_classes)
    whole = np.bincount(labels, minlength=num_classes)
    return {"samples": hist.sum(axis=1), "labels": hist, "emd": emd(hist, whole)}
