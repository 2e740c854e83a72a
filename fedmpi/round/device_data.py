"""A data set's tensors on one rank's device (fedmpi.round.experiment builds one per rank)."""

from __future__ import annotations

import functools
import warnings

import torch


class DeviceData:
    """The data set's tensors on this rank's device, made only when a part first needs them. On the CPU they
    are views of the (node-shared, read-only) arrays: nothing is copied, and a rank's memory holds only the
    pages it reads. On a GPU the training set is copied to each rank's device whole (any client may train
    there); the test set only for the server's shadow model, the evaluation takes its own batches."""

    def __init__(self, dataset, device):
        self.dataset, self.device = dataset, device

    def tensor(self, array):
        """`array` (a numpy array or a slice of one) as a tensor on this rank's device."""
        with warnings.catch_warnings():
            # The node's shared arrays are read-only; fedmpi only ever reads the tensors made from them.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            return torch.from_numpy(array).to(self.device)

    @functools.cached_property
    def train(self):
        return self.tensor(self.dataset.x_train), self.tensor(self.dataset.y_train)

    @functools.cached_property
    def test(self):
        return self.tensor(self.dataset.x_test), self.tensor(self.dataset.y_test)
