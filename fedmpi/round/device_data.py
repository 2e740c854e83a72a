"""A data set's tensors on one rank's device (fedmpi.round.experiment builds one per rank)."""

from __future__ import annotations

import functools
import warnings

import torch

# The node's shared arrays (and a memory-mapped data file) are read-only; fedmpi only ever reads the tensors
# DeviceData makes from them. One filter for this module's calls, not a catch_warnings per tensor: set-up makes
# one per test batch (7,865 on the full Shakespeare build, 1.6 s of warnings bookkeeping).
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning,
                        module=__name__)


class DeviceData:
    """The data set's tensors on this rank's device, made only when a part first needs them. On the CPU they
    are views of the (node-shared, read-only) arrays: nothing is copied, and a rank's memory holds only the
    pages it reads. On a GPU the training set is copied to each rank's device whole (any client may train
    there); the test set only for the server's shadow model, the evaluation takes its own batches."""

    def __init__(self, dataset, device):
        self.dataset, self.device = dataset, device

    def tensor(self, array):
        """`array` (a numpy array or a slice of one) as a tensor on this rank's device."""
        return torch.from_numpy(array).to(self.device)

    @functools.cached_property
    def train(self):
        return self.tensor(self.dataset.x_train), self.tensor(self.dataset.y_train)

    @functools.cached_property
    def test(self):
        return self.tensor(self.dataset.x_test), self.tensor(self.dataset.y_test)
