"""The in-memory form every source produces, and the dispatch from `data.name` to a source."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from fedmpi.errors import ConfigError


@dataclass
class Dataset:
    """Whole train and test sets as arrays; clients later become index arrays into `x_train`.

    `x_*` are float32 (images as N x C x H x W, normalised) or int64 token ids; `y_*` are int64 labels.
    `users` is the natural split into clients where the source has one (SYNTHETIC users, LEAF writers).
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    users: Optional[list] = field(default=None, repr=False)

    @property
    def input_shape(self):
        return tuple(self.x_train.shape[1:])

    def summary(self):
        return (f"{self.name}: {len(self.y_train)} train / {len(self.y_test)} test samples, "
                f"input {self.input_shape}, {self.num_classes} classes")


def load_dataset(cfg) -> Dataset:
    """Loads `cfg.data.name`; a missing or malformed file raises InputError naming it."""
    from fedmpi.data import sources

    loader = sources.LOADERS.get(cfg.data.name)
    if loader is None:
        raise ConfigError(f"data.name = {cfg.data.name!r}: not available in this version; "
                          f"available: {', '.join(sources.LOADERS)}")
    return loader(cfg)


def class_histogram(labels: np.ndarray, num_classes: int) -> np.ndarray:
    return np.bincount(labels, minlength=num_classes)
