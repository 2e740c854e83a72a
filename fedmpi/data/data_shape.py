"""What the checks need to know of a loaded data set, as a value: its name, input shape, classes, sizes and
whether its targets are labels. fedmpi.run.resolve judges a config against it, so no check needs the arrays."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DataShape:
    name: str
    input_shape: tuple
    num_classes: int
    n_train: int
    n_test: int
    real_targets: bool = False      # float targets (a regression plug-in): no class labels to poison
    natural_users: int = 0          # clients of the source's own split (LEAF writers, SYNTHETIC users); 0: none

    @classmethod
    def of(cls, dataset) -> DataShape:
        """The shape of a fedmpi.data.Dataset."""
        return cls(name=dataset.name, input_shape=tuple(dataset.input_shape), num_classes=int(dataset.num_classes),
                   n_train=len(dataset.y_train), n_test=len(dataset.y_test),
                   real_targets=np.asarray(dataset.y_train).dtype.kind == "f",
                   natural_users=len(dataset.users) if dataset.users is not None else 0)
