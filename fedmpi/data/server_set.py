"""The server's own data set (`server_data`) and the split of the training set into it and the clients.

One set serves three algorithms: D0 for FSL, the shared set G for data sharing, the probe set for SAFL.
It is drawn from the training set with `(seed, SERVER, SERVER_SET_KEY)`: IID, from `classes` random classes in equal
shares, or with class proportions ~ Dir(beta). `source: overlap` draws it from the whole training set and
the clients still partition everything (FSL paper); `source: holdout` removes it from the clients' pool
first. Everything here is deterministic, so every rank computes the same split.

Zhao et al.'s split: the training set is cut into the clients' part D and a holdout H (CIFAR-10: 40,000 and
10,000), and every shared set G is drawn from H with |G| = beta * |D|. `server_data.holdout: |H|` reserves H
(drawn evenly over the classes from `(seed, SERVER, HOLDOUT_KEY)`, independent of G's size, so that D keeps
the class balance) and draws G from it;
`server_data.fraction: beta` sizes G relative to D. A sweep over `fraction` then keeps D, and so every
client's data, fixed. H is not an evaluation set (the paper evaluates on the test set, as fedmpi does);
the part of H outside G is unused.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedmpi.core import rng
from fedmpi.core.errors import ConfigError
from fedmpi.data.local_test import LocalTest, local_test_split
from fedmpi.data.partition import partition
from fedmpi.data.stats import partition_stats

MAX_DIRICHLET_ROUNDS = 100
# Key of the server set's stream (seed, SERVER, SERVER_SET_KEY). Not (seed, SERVER) alone: SeedSequence pads
# its entropy with zeros, so that would be the very stream (seed, SERVER, 0) of round 0's server batches.
SERVER_SET_KEY = 2**32 - 1
HOLDOUT_KEY = 2**32 - 2     # (seed, SERVER, HOLDOUT_KEY): the holdout H that the server set is drawn from


@dataclass
class Split:
    """Clients' index arrays and the server's set (both into x_train), with their label statistics.

    `groups` maps run.h5 group paths (`partition`, `partition/server`) to their datasets (docs/explanation/design.md
    §3).
    """

    parts: list
    server_idx: np.ndarray
    groups: dict
    local_test: LocalTest | None = None     # the clients' own test splits (personalized FL), or None


def resolved_size(s, n_train) -> int:
    """The server set's size: `size`, or with `fraction` (beta) round(beta * |D|), D the clients' data: the
    whole training set (`overlap`), the training set less the holdout H (`holdout` > 0), or the training
    set less the set itself (`source: holdout` without H: |G| = round(n beta / (1 + beta)))."""
    if s.fraction is None:
        return int(s.size)
    if s.source == "overlap":
        clients = n_train
    elif s.holdout:
        clients = n_train - s.holdout
    else:
        return int(round(n_train * s.fraction / (1 + s.fraction)))
    return int(round(s.fraction * clients))


def draw_holdout(labels, s, seed) -> np.ndarray:
    """Sorted indices of the holdout H (`server_data.holdout` samples), or None without one. H is drawn evenly
    over the classes (each class gives holdout / K samples, the first classes one more for the remainder),
    so that the clients' part D keeps the training set's class balance: Zhao et al. split a balanced D into
    1-class clients, each holding exactly one class. `s`: the server_data section."""
    if not s.holdout:
        return None
    if s.holdout >= len(labels):
        raise ConfigError(f"server_data.holdout = {s.holdout}: the training set has only {len(labels)} samples "
                          f"and the clients need some")
    g = rng.stream(seed, rng.SERVER, HOLDOUT_KEY)
    present, counts = np.unique(labels, return_counts=True)
    per_class = np.array([len(a) for a in np.array_split(np.arange(s.holdout), len(present))])
    short = np.flatnonzero(per_class >= counts)
    if len(short):
        c = short[0]
        raise ConfigError(f"server_data.holdout = {s.holdout}: class {present[c]} would give {per_class[c]} of its "
                          f"{counts[c]} samples to the holdout and keep none for the clients; lower holdout")
    chosen = [g.choice(np.flatnonzero(labels == c), size=n, replace=False) for c, n in zip(present, per_class)]
    return np.sort(np.concatenate(chosen)).astype(np.int64)


def draw_server_set(labels, s, seed, candidates=None) -> np.ndarray:
    """Sorted int64 indices of the server's set (`s`: the server_data section), drawn from `candidates`
    (indices into `labels`; None: the whole training set); empty when its size is 0."""
    size = resolved_size(s, len(labels))
    if size == 0:
        return np.zeros(0, dtype=np.int64)
    where = "the training set" if candidates is None else f"server_data.holdout ({len(candidates)} samples)"
    candidates = np.arange(len(labels), dtype=np.int64) if candidates is None else np.asarray(candidates)
    labels = labels[candidates]
    what = (f"server_data.size = {size}" if s.fraction is None
            else f"server_data.fraction = {s.fraction} (a set of {size} samples)")
    if size > len(labels):
        raise ConfigError(f"{what}: {where} has only {len(labels)} samples")
    g = rng.stream(seed, rng.SERVER, SERVER_SET_KEY)
    if s.scheme == "iid":
        chosen = g.choice(len(labels), size=size, replace=False)
    else:
        present, counts = np.unique(labels, return_counts=True)
        if s.scheme == "classes":
            per_class = _class_subset_counts(s, size, present, counts, g, what, where)
        else:
            per_class = _dirichlet_counts(s, size, counts, g, what)
        chosen = np.concatenate([g.choice(np.flatnonzero(labels == c), size=n, replace=False)
                                 for c, n in zip(present, per_class) if n > 0])
    return np.sort(candidates[chosen]).astype(np.int64)


def _class_subset_counts(s, size, present, counts, g, what, where):
    """`s.classes` random classes sharing `size` samples as evenly as possible."""
    if s.classes > len(present):
        raise ConfigError(f"server_data.classes = {s.classes}: {where} has only {len(present)} classes")
    chosen = np.sort(g.choice(len(present), size=s.classes, replace=False))
    per_class = np.zeros(len(present), dtype=np.int64)
    per_class[chosen] = [len(a) for a in np.array_split(np.arange(size), s.classes)]
    short = np.flatnonzero(per_class > counts)
    if len(short):
        c = short[0]
        raise ConfigError(f"{what}: class {present[c]} would need {per_class[c]} samples for the server's set "
                          f"but {where} has {counts[c]}; lower the set's size, raise server_data.classes"
                          + (" or server_data.holdout" if s.holdout else ""))
    return per_class


def _dirichlet_counts(s, size, counts, g, what):
    """Class proportions ~ Dir(beta); a class that runs out passes its excess on to the others (by p)."""
    p = g.dirichlet(np.full(len(counts), s.beta))
    per_class = np.zeros(len(counts), dtype=np.int64)
    for _ in range(MAX_DIRICHLET_ROUNDS):
        missing = size - per_class.sum()
        room = counts - per_class
        if missing == 0:
            return per_class
        weights = p * (room > 0)
        if weights.sum() == 0:
            weights = (room > 0).astype(float)
        per_class += np.minimum(g.multinomial(missing, weights / weights.sum()), room)
    raise ConfigError(f"server_data.beta = {s.beta}: could not fill {size} samples ({what}); lower the set's size")


def split_dataset(dataset, partition_keys, server_data, seed, local_every=None, parts=None) -> Split:
    """The server's set, then the clients' partition of the remaining pool, with both sets' statistics.
    `partition_keys` and `server_data` are those config sections; `local_every` is `eval.local_every` (a
    local evaluation needs local test splits). `parts` (index arrays into the training set) replaces the
    configured partition (`fedmpi.simulate`)."""
    labels = dataset.y_train
    if labels.dtype.kind not in "iu":     # regression targets (a custom data set): no label statistics
        parts = list(parts) if parts is not None else partition(dataset, partition_keys, seed)
        return Split(parts, np.zeros(0, np.int64), {})
    holdout = draw_holdout(labels, server_data, seed)
    server_idx = draw_server_set(labels, server_data, seed, holdout)
    if parts is None:
        pool = np.arange(len(labels), dtype=np.int64)
        removed = holdout if holdout is not None else server_idx
        if server_data.source == "holdout" and len(removed):
            pool = np.setdiff1d(pool, removed)
        parts = partition(dataset, partition_keys, seed, pool)
    parts = [np.asarray(p, dtype=np.int64) for p in parts]
    parts, local = local_test_split(partition_keys, seed, dataset, parts)
    if local_every is not None and local is None:
        raise ConfigError(f"eval.local_every = {local_every}: the clients have no local test splits; set "
                          f"partition.local_test to a fraction > 0 (or use a LEAF source under "
                          f"partition.scheme: natural), or leave eval.local_every null")
    server_stats = partition_stats(labels, [server_idx], dataset.num_classes)
    if len(server_idx) == 0:
        server_stats["emd"] = np.full(1, np.nan)    # an empty set has no label distribution
    groups = {"partition": partition_stats(labels, parts, dataset.num_classes), "partition/server": server_stats}
    if local is not None:
        test_labels = dataset.y_train if local.source == "train" else dataset.y_test
        groups["partition/local_test"] = partition_stats(test_labels, local.parts, dataset.num_classes)
    return Split(parts, server_idx, groups, local)
