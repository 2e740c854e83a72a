"""The in-memory form every source produces (`fedmpi.data.load` turns a config into one), and its flat form
(`to_arrays` / `from_arrays`: the arrays a node shares, fedmpi.data.shared)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedmpi.core.errors import ConfigError


@dataclass
class Dataset:
    """Whole train and test sets as arrays; clients later become index arrays into `x_train`.

    `x_*` are float32 (images as N x C x H x W, normalised) or int64 token ids; `y_*` are int64 labels.
    `users` is the natural split into clients where the source has one (SYNTHETIC users, LEAF writers);
    `test_users` each such user's own test samples where the source has them (LEAF: the user's test file rows).
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    users: list | None = field(default=None, repr=False)
    # Each natural user's own test samples (indices into x_test, aligned with `users`; LEAF), or None
    test_users: list | None = field(default=None, repr=False)

    @property
    def input_shape(self):
        return tuple(self.x_train.shape[1:])

    def summary(self):
        return (f"{self.name}: {len(self.y_train)} train / {len(self.y_test)} test samples, "
                f"input {self.input_shape}, {self.num_classes} classes")


def keep_first_classes(ds: Dataset, k: int) -> Dataset:
    """Only the samples of classes 0..k-1 (the FSL paper trains on 45 of EMNIST's 47 balanced classes).

    Natural users keep their remaining samples, with indices renumbered into the smaller training set.
    """
    if ds.name == "shakespeare":
        raise ConfigError("data.classes: not available for shakespeare, whose inputs use the same 80-character "
                          "vocabulary as its labels; leave data.classes null")
    if k > ds.num_classes:
        raise ConfigError(f"data.classes = {k}: data.name = {ds.name!r} has only {ds.num_classes} classes")
    keep_tr, keep_te = np.flatnonzero(ds.y_train < k), np.flatnonzero(ds.y_test < k)
    users = _renumbered(ds.users, keep_tr, len(ds.y_train))
    test_users = _renumbered(ds.test_users, keep_te, len(ds.y_test))
    return Dataset(ds.name, ds.x_train[keep_tr], ds.y_train[keep_tr], ds.x_test[keep_te], ds.y_test[keep_te],
                   k, users=users, test_users=test_users)


def _renumbered(users, keep, n):
    """Each user's remaining samples, renumbered into the set of the samples `keep` (None stays None)."""
    if users is None:
        return None
    new_index = np.full(n, -1, dtype=np.int64)
    new_index[keep] = np.arange(len(keep))
    return [new_index[u][new_index[u] >= 0] for u in users]


def from_arrays(name, arrays) -> Dataset:
    """A Dataset over `arrays` (no copy): x/y train and test, the natural users as `users_index` cut at
    `users_offsets` (absent or empty offsets: no users), `num_classes` as a one-element array."""
    return Dataset(name, arrays["x_train"], arrays["y_train"], arrays["x_test"], arrays["y_test"],
                   int(arrays["num_classes"][0]), users=_cut(arrays, "users"), test_users=_cut(arrays, "test_users"))


def _cut(arrays, key):
    """The index arrays stored as `{key}_index` cut at `{key}_offsets` (None when absent or empty)."""
    offsets = arrays.get(f"{key}_offsets")
    if offsets is None or not len(offsets):
        return None
    index = arrays[f"{key}_index"]
    return [index[offsets[k]:offsets[k + 1]] for k in range(len(offsets) - 1)]


def to_arrays(ds) -> dict:
    """`from_arrays`' arrays for a Dataset (users concatenated, with their offsets)."""
    arrays = {"x_train": ds.x_train, "y_train": ds.y_train, "x_test": ds.x_test, "y_test": ds.y_test,
              **_joined("users", ds.users), "num_classes": np.array([ds.num_classes], dtype=np.int64)}
    if ds.test_users is not None:
        arrays.update(_joined("test_users", ds.test_users))
    return arrays


def _joined(key, users):
    """`{key}_index` (the users' index arrays concatenated) and `{key}_offsets` (empty when there are none)."""
    users = users or []
    offsets = np.concatenate([[0], np.cumsum([len(u) for u in users], dtype=np.int64)]).astype(np.int64)
    return {f"{key}_index": (np.concatenate(users).astype(np.int64) if users else np.zeros(0, np.int64)),
            f"{key}_offsets": offsets if users else np.zeros(0, np.int64)}
