"""Evaluation of the global model, split across every rank: each evaluates its share of the test set's
batches with the round's model and one reduction brings (per-batch loss sums, per-class correct counts)
to rank 0.

The figures are exactly those of one rank evaluating everything in order: a batch's loss sum is computed
by the same kernel on whichever rank holds it, the reduction adds it to zeros (exact), and rank 0 adds the
batch sums in batch order as a single evaluator would; correct counts are integers. So test_acc and
test_loss do not depend on -n, and neither does `class_acc` [class] (per-class test accuracy, /metrics).
Batch b goes to rank b mod P, so every rank (the server too) gets an equal share, and a rank holds (on its
device) and reads only its own batches of the test set.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from fedmpi.core import rng


def eval_subset(n_test, max_samples, seed):
    """eval.max_samples: the sorted indices of the fixed subsample of the global test set every evaluation of
    the run uses (drawn from (seed, EVAL_SUBSET): the same on every rank, at every -n, after a resume), or None
    for the whole set (max_samples null)."""
    if max_samples is None:
        return None
    chosen = rng.stream(seed, rng.EVAL_SUBSET).choice(n_test, size=min(max_samples, n_test), replace=False)
    return np.sort(chosen)


class SplitEvaluation:
    def __init__(self, comm, flat, x_test, y_test, batch_size, num_classes, to_device, loss=None):
        """`x_test`, `y_test`: the whole test set as numpy arrays (shared by the node's ranks); `to_device(a)`
        turns a slice of them into a tensor on this rank's device (a view on the CPU)."""
        self.comm, self.flat, self.batch_size, self.loss = comm, flat, batch_size, loss
        self.n = len(y_test)
        self.batches = math.ceil(self.n / batch_size) if self.n else 0
        self.mine = [b for b in range(self.batches) if b % comm.size == comm.rank]
        self.my_batches = [(b, to_device(x_test[b * batch_size:(b + 1) * batch_size]),
                            to_device(y_test[b * batch_size:(b + 1) * batch_size])) for b in self.mine]
        self.labelled = y_test.dtype.kind != "f"
        self.classes = num_classes if self.labelled else 0
        # [batch loss sums | per-class correct counts], float64, reduced to rank 0
        self.buffer = np.zeros(self.batches + self.classes, dtype=np.float64)
        self.class_counts = (np.bincount(y_test, minlength=self.classes) if self.labelled
                             else np.zeros(0, dtype=np.int64))

    @torch.no_grad()
    def _evaluate_share(self):
        module, buf, nb = self.flat.module, self.buffer, self.batches
        module.eval()
        buf[:] = 0.0
        correct = torch.zeros(self.classes, dtype=torch.int64, device=self.flat.device)
        scores = self.labelled
        for b, xb, yb in self.my_batches:
            out = module(xb)
            if self.loss is None:
                buf[b] = float(F.cross_entropy(out, yb, reduction="sum").double())
            else:
                buf[b] = float(self.loss(out, yb).double()) * len(yb)
            scores = scores and out.dim() == 2
            if scores:
                correct += torch.bincount(yb[out.argmax(dim=1) == yb], minlength=self.classes)
        if scores:
            buf[nb:] = correct.cpu().numpy()
        self.scores = scores

    def run(self, vec):
        """Collective: every rank evaluates its batches with `vec` loaded (already the round's model on every
        rank); returns (accuracy, mean loss, class accuracies) on rank 0, None elsewhere."""
        self.flat.load(vec)
        self._evaluate_share()
        self.comm.reduce_sum(self.buffer)
        if not self.comm.is_server:
            return None
        n, nb = max(self.n, 1), self.batches
        total = 0.0
        for b in range(nb):          # in batch order, as one evaluator would add them
            total += self.buffer[b]
        if not (self.labelled and self.scores):
            return float("nan"), total / n, np.full(self.classes, np.nan)
        correct = self.buffer[nb:]
        with np.errstate(invalid="ignore", divide="ignore"):
            class_acc = np.where(self.class_counts > 0, correct / np.maximum(self.class_counts, 1), np.nan)
        return float(correct.sum()) / n, total / n, class_acc
