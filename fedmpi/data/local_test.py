"""Each client's own test split: what personalized FL evaluates a client's model on.

Two sources:
  held out   `partition.local_test = f` (0 < f < 1): each client's samples are split once, before training,
             into its training split and its test split of round(f * n_i) samples (at least one), stratified
             by label (each label gives its share, largest remainders first, so a client of several labels
             keeps their proportions in both), drawn from the stream (seed, LOCAL_TEST, client): the same on
             every rank and for any -n. Indices into the training set; the client then trains on the rest.
  the user's own  LEAF sources (femnist, shakespeare) under `partition.scheme: natural`: each user's samples of
             the LEAF test files are its split (indices into the test set, which stays the merged global
             test set too); `partition.local_test` must then stay 0.
`partition.local_test = 0` and no LEAF users: no split, and nothing changes (the partition is today's, bit
for bit).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedmpi.core import rng
from fedmpi.core.errors import ConfigError


@dataclass(frozen=True)
class LocalTest:
    """The clients' test splits: `parts[i]` indexes `source` ("train": the training set, "test": the test
    set) for client i."""

    source: str
    parts: list

    @property
    def sizes(self) -> np.ndarray:
        return np.array([len(p) for p in self.parts], dtype=np.int64)


def stratified_counts(labels, k) -> dict:
    """{label: samples to hold out} adding up to `k` for a client with these `labels`: each label's share
    k * n_c / n rounded down, the rest to the largest remainders (ties: the smaller label)."""
    present, counts = np.unique(labels, return_counts=True)
    exact = counts * k / counts.sum()
    base = np.floor(exact).astype(np.int64)
    rest = int(k - base.sum())
    order = sorted(range(len(present)), key=lambda i: (-(exact[i] - base[i]), present[i]))
    for i in order[:rest]:
        base[i] += 1
    return {int(c): int(n) for c, n in zip(present, base)}


def hold_out(seed, cid, idx, labels, fraction):
    """(training split, test split) of client `cid`'s sorted sample indices `idx` (labels: the training set's)."""
    n = len(idx)
    k = max(1, int(round(fraction * n)))
    if k >= n:
        raise ConfigError(f"partition.local_test = {fraction}: client {cid} has {n} sample(s) and would keep none "
                          f"to train on; lower partition.local_test or give clients more samples "
                          f"(partition.min_samples)")
    g = rng.stream(seed, rng.LOCAL_TEST, cid)
    own = labels[idx]
    chosen = [g.choice(idx[own == c], size=m, replace=False)
              for c, m in stratified_counts(own, k).items() if m > 0]
    test = np.sort(np.concatenate(chosen)).astype(np.int64)
    return np.setdiff1d(idx, test).astype(np.int64), test


def local_test_split(p, seed, dataset, parts):
    """(the clients' training parts, their LocalTest or None) for the partition section `p`."""
    fraction = p.local_test
    own = dataset.test_users if p.scheme == "natural" else None
    if own is not None:
        if fraction:
            raise ConfigError(f"partition.local_test = {fraction}: data.name = {dataset.name!r} under "
                              f"partition.scheme = 'natural' keeps each user's own LEAF test samples as its test "
                              f"split; leave partition.local_test at 0")
        return parts, LocalTest("test", [np.asarray(p, dtype=np.int64) for p in own])
    if not fraction:
        return parts, None
    split = [hold_out(seed, cid, np.asarray(p, dtype=np.int64), dataset.y_train, fraction)
             for cid, p in enumerate(parts)]
    return [train for train, _ in split], LocalTest("train", [test for _, test in split])
