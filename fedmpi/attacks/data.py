"""Data poisoning: what a malicious client's training batches become.

A `DataPoison` is made once per rank from the config and the data set; `for_client(t, cid)` gives the
per-batch function `poison(xb, yb) -> (xb, yb)` of a malicious client in round t (None for an honest one, so
an honest client's batches, and therefore its training, are exactly those of a run without attack). It is
applied after the batch is gathered (and after augmentation, so that the trigger stays at its corner) in
both the per-client loop (fedmpi.core.train.LocalTrainer) and the batched groups (fedmpi.core.vectorized).

  label_flip  every label l becomes mapping[l] (default L-1-l), on every batch sample
  backdoor    round(poison_fraction * B) samples of each batch of B, drawn from the client's own attack
              stream (seed, ATTACK, round, client), get the trigger stamped and the label `target`

The trigger: images (C x H x W floats) get a trigger_size x trigger_size patch in the bottom-right corner of
every channel set to the training set's largest value (the brightest pixel after normalisation); 1-D float
inputs get their last trigger_size features set to it; token sequences (int64 ids, e.g. Shakespeare) end in
the fixed sequence `trigger_tokens(trigger_size, vocab)`. A triggered batch sample is a new tensor: the
gathered batch is already a copy of the training data (advanced indexing), so nothing shared is changed.

The stream (seed, ATTACK, round, client) belongs to the client alone, so the poisoned samples are the same at
every -n, on whichever rank trains the client, and after a resume; key 0 of that stream is the backdoor's
sample draw (fedmpi.attacks.model uses key 1 for its gaussian noise).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fedmpi.core import rng

BACKDOOR_DRAW = 0      # the key after (seed, ATTACK, round, client) of the backdoor's sample positions


def flip_mapping(mapping, num_classes) -> np.ndarray:
    """label_flip's table: `mapping` (the new label of each label) or l -> L-1-l."""
    if mapping:
        return np.asarray(mapping, dtype=np.int64)
    return np.arange(num_classes - 1, -1, -1, dtype=np.int64)


def poisoned_count(batch, poison_fraction) -> int:
    """How many of a batch of `batch` samples a backdoor stamps: poison_fraction * batch, halves rounded up."""
    return min(batch, int(math.floor(poison_fraction * batch + 0.5)))


def trigger_tokens(size, vocab) -> np.ndarray:
    """The backdoor's token sequence for text: the `size` highest ids of the vocabulary, highest first (in
    LEAF's Shakespeare vocabulary the rarest characters: '}', 'z', 'y', ...)."""
    return np.arange(vocab - 1, vocab - 1 - size, -1, dtype=np.int64) % vocab


def stamp(x, size, value):
    """x ([N, *input_shape], a tensor or numpy array) with the trigger, in place; returns x. Float images
    (N, C, H, W): the bottom-right size x size patch of every channel; other float inputs: the last `size`
    entries of the flattened input; integer tokens: the last `size` positions get `value` (a sequence)."""
    if x.ndim == 4:
        x[:, :, -size:, -size:] = value
    elif x.ndim == 2:
        x[:, -size:] = value if np.ndim(value) == 0 else _like(x, value)
    else:
        flat = x.reshape(len(x), -1)
        flat[:, -size:] = value
        x[...] = flat.reshape(x.shape)
    return x


def _like(x, values):
    return torch.as_tensor(values, device=x.device) if isinstance(x, torch.Tensor) else np.asarray(values)


class DataPoison:
    """The rank's data attack: `for_client(t, cid)` is the batch function of a malicious client, or None."""

    def __init__(self, attack, malicious, seed, num_classes, x_train):
        """`malicious`: the run's malicious ids (fedmpi.attacks.malicious_clients); `x_train`: the training
        inputs (numpy), for the trigger's value (the largest input, or the token sequence)."""
        self.attack, self.seed = attack, seed
        self.malicious = frozenset(int(c) for c in malicious)
        self.name = attack.name
        self.mapping = torch.from_numpy(flip_mapping(attack.mapping, num_classes)) if self.name == "label_flip" \
            else None
        self.trigger = None
        if self.name == "backdoor":
            self.trigger = trigger_value(x_train, attack.trigger_size, num_classes)

    @property
    def active(self):
        return bool(self.malicious) and self.name in ("label_flip", "backdoor")

    def for_client(self, t, cid):
        if not self.active or int(cid) not in self.malicious:
            return None
        if self.name == "label_flip":
            return self._flip
        g = rng.stream(self.seed, rng.ATTACK, t, int(cid), BACKDOOR_DRAW)
        return lambda xb, yb: self._backdoor(xb, yb, g)

    def _flip(self, xb, yb):
        return xb, self.mapping.to(yb.device)[yb]

    def _backdoor(self, xb, yb, g):
        k = poisoned_count(len(yb), self.attack.poison_fraction)
        if k == 0:
            return xb, yb
        pos = torch.from_numpy(np.sort(g.choice(len(yb), size=k, replace=False))).to(yb.device)
        xb, yb = xb.clone(), yb.clone()
        xb[pos] = stamp(xb[pos], self.attack.trigger_size, self._trigger_on(xb))
        yb[pos] = self.attack.target
        return xb, yb

    def _trigger_on(self, xb):
        value = self.trigger
        if np.ndim(value) == 0:
            return float(value)
        return torch.as_tensor(value, device=xb.device)


def trigger_value(x_train, size, num_classes):
    """The trigger's fill: the largest training input for float data (the brightest pixel), else the token
    sequence (the vocabulary is the label range for next-character data such as Shakespeare)."""
    if np.issubdtype(np.asarray(x_train).dtype, np.floating):
        return np.float32(np.max(x_train))
    vocab = max(int(np.max(x_train)) + 1, num_classes)
    return trigger_tokens(size, vocab)


def backdoor_test_set(x_test, y_test, attack, trigger):
    """The triggered test set the attack success rate is measured on: every test sample whose label is not
    the target, stamped, with the label `target` (numpy arrays, new)."""
    keep = np.flatnonzero(np.asarray(y_test) != attack.target)
    x = np.array(x_test[keep], copy=True)
    stamp(x, attack.trigger_size, trigger)
    return x, np.full(len(keep), attack.target, dtype=np.asarray(y_test).dtype)
