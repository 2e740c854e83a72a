"""The server's own data set (`server_data`) and the split of the training set into it and the clients.

One set serves three algorithms: D0 for FSL, the shared set G for data sharing, the probe set for SAFL.
It is drawn from the training set with `(seed, SERVER, SERVER_SET_KEY)`: IID, from `classes` random classes in equal
shares, or with class proportions ~ Dir(beta). `source: overlap` draws it from the whole training set and
the clients still partition everything (FSL paper); `source: holdout` removes it from the clients' pool
first (Zhao et al.). Everything here is deterministic, so every rank computes the same split.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedmpi import rng
from fedmpi.data.partition import partition
from fedmpi.data.stats import partition_stats
from fedmpi.errors import ConfigError

MAX_DIRICHLET_ROUNDS = 100
# Key of the server set's stream (seed, SERVER, SERVER_SET_KEY). Not (seed, SERVER) alone: SeedSequence pads
# its entropy with zeros, so that would be the very stream (seed, SERVER, 0) of round 0's server batches.
SERVER_SET_KEY = 2**32 - 1


@dataclass
class Split:
    """Clients' index arrays and the server's set (both into x_train), with their label statistics.

    `groups` maps run.h5 group paths (`partition`, `partition/server`) to their datasets (DESIGN §3).
    """

    parts: list
    server_idx: np.ndarray
    groups: dict


def draw_server_set(labels, cfg) -> np.ndarray:
    """Sorted int64 indices of the server's set; empty when server_data.size is 0."""
    s = cfg.server_data
    if s.size == 0:
        return np.zeros(0, dtype=np.int64)
    if s.size > len(labels):
        raise ConfigError(f"server_data.size = {s.size}: the training set has only {len(labels)} samples")
    g = rng.stream(cfg.seed, rng.SERVER, SERVER_SET_KEY)
    if s.scheme == "iid":
        chosen = g.choice(len(labels), size=s.size, replace=False)
    else:
        present, counts = np.unique(labels, return_counts=True)
        if s.scheme == "classes":
            per_class = _class_subset_counts(s, present, counts, g)
        else:
            per_class = _dirichlet_counts(s, counts, g)
        chosen = np.concatenate([g.choice(np.flatnonzero(labels == c), size=n, replace=False)
                                 for c, n in zip(present, per_class) if n > 0])
    return np.sort(chosen).astype(np.int64)


def _class_subset_counts(s, present, counts, g):
    """`s.classes` random classes sharing `s.size` samples as evenly as possible."""
    if s.classes > len(present):
        raise ConfigError(f"server_data.classes = {s.classes}: the training set has only {len(present)} classes")
    chosen = np.sort(g.choice(len(present), size=s.classes, replace=False))
    per_class = np.zeros(len(present), dtype=np.int64)
    per_class[chosen] = [len(a) for a in np.array_split(np.arange(s.size), s.classes)]
    short = np.flatnonzero(per_class > counts)
    if len(short):
        c = short[0]
        raise ConfigError(f"server_data.size = {s.size}: class {present[c]} would need {per_class[c]} samples "
                          f"for the server's set but has {counts[c]}; lower size or raise server_data.classes")
    return per_class


def _dirichlet_counts(s, counts, g):
    """Class proportions ~ Dir(beta); a class that runs out passes its excess on to the others (by p)."""
    p = g.dirichlet(np.full(len(counts), s.beta))
    per_class = np.zeros(len(counts), dtype=np.int64)
    for _ in range(MAX_DIRICHLET_ROUNDS):
        missing = s.size - per_class.sum()
        room = counts - per_class
        if missing == 0:
            return per_class
        weights = p * (room > 0)
        if weights.sum() == 0:
            weights = (room > 0).astype(float)
        per_class += np.minimum(g.multinomial(missing, weights / weights.sum()), room)
    raise ConfigError(f"server_data.beta = {s.beta}: could not fill {s.size} samples; lower server_data.size")


def split_dataset(cfg, dataset, parts=None) -> Split:
    """The server's set, then the clients' partition of the remaining pool, with both sets' statistics.
    `parts` (index arrays into the training set) replaces the configured partition (`fedmpi.simulate`)."""
    labels = dataset.y_train
    if labels.dtype.kind not in "iu":     # regression targets (a custom data set): no label statistics
        return Split(list(parts) if parts is not None else partition(dataset, cfg), np.zeros(0, np.int64), {})
    server_idx = draw_server_set(labels, cfg)
    if parts is None:
        pool = np.arange(len(labels), dtype=np.int64)
        if cfg.server_data.source == "holdout" and len(server_idx):
            pool = np.setdiff1d(pool, server_idx)
        parts = partition(dataset, cfg, pool)
    parts = [np.asarray(p, dtype=np.int64) for p in parts]
    server_stats = partition_stats(labels, [server_idx], dataset.num_classes)
    if len(server_idx) == 0:
        server_stats["emd"] = np.full(1, np.nan)    # an empty set has no label distribution
    groups = {"partition": partition_stats(labels, parts, dataset.num_classes), "partition/server": server_stats}
    return Split(parts, server_idx, groups)
