"""FedRep (Collins, Hassani, Mokhtari, Shakkottai, "Exploiting Shared Representations for Personalized Federated
Learning", ICML 2021).

The model is a shared body (the representation) and a personal head: the model's last linear layer (its
`weight` and `bias`, FedPer's head: fedmpi.algorithms.layers), plus whatever `model.personal` adds. Each
round a selected client first trains its own head for `head_epochs` epochs with the body frozen (a pass
drawn from (seed, PERSONAL, round, client, 1)), then the body for `body_epochs` epochs (None: the client's
schedule, client.epochs or client.steps) with the new head frozen (the client's own stream). Only the body
is uploaded and averaged: the round loop keeps the head in the client's personal entries and sends none of
it (Algorithm.personal, docs/how-to/own-algorithm.md); a client's local evaluation uses the global body with its own
head.

Frozen means exactly unchanged: after each step the frozen entries are put back (a step hook), so momentum
and weight decay cannot move them. PFLlib sets requires_grad = False instead and keeps one optimizer per
part; with plain SGD the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedmpi.algorithms.base import AlgorithmKeys
from fedmpi.algorithms.catalog import register
from fedmpi.algorithms.fedavg import FedAvg
from fedmpi.algorithms.layers import head_patterns
from fedmpi.core.config_checks import count
from fedmpi.core.errors import ConfigError

HEAD_PASS = 1     # the head's stream key: (seed, PERSONAL, round, client, 1)


@dataclass(frozen=True)
class FedRepKeys(AlgorithmKeys):
    name: str = "fedrep"
    head_epochs: int = 1
    """Epochs over the client's data training the head with the body frozen (>= 1; PFLlib's plocal_epochs,
    1 by default; the paper uses 10 local updates)."""
    body_epochs: int | None = None
    """Epochs training the body with the head frozen (>= 1; None: the client's schedule)."""

    RANGES: ClassVar[dict] = {"head_epochs": count(), "body_epochs": count()}


class Freeze:
    """A step hook that puts `frozen` entries of the flat parameters back to their values at creation."""

    def __init__(self, params, idx):
        self.idx, self.values = idx, params[idx].clone()

    def __call__(self, params):
        params.index_copy_(0, self.idx, self.values)


@register
class FedRep(FedAvg):
    name = "fedrep"
    Keys = FedRepKeys
    vectorizable = False

    @classmethod
    def personal_patterns(cls, keys, model):
        return head_patterns(model, f"algorithm.name = {cls.name!r}")     # FedPer's head: the last nn.Linear

    def __init__(self, keys, context):
        super().__init__(keys, context)
        if self.split is None:
            raise ConfigError(f"algorithm.name = {keys.name!r}: needs a personal head (context.split)")
        n = self.n_params
        personal, shared = self.split.personal_idx, self.split.shared_idx
        self._head = personal[personal < n]      # trainable entries of the head
        self._body = shared[shared < n]          # trainable entries of the body

    def local_training(self, run, down, model, local):
        params = model.vec[: self.n_params]
        body, head = self._body.to(model.device), self._head.to(model.device)
        local.train(steps=self.keys.head_epochs * local.epoch_steps, stream=HEAD_PASS,
                    step_hook=Freeze(params, body))
        steps = None if self.keys.body_epochs is None else self.keys.body_epochs * local.epoch_steps
        return local.train(steps=steps, step_hook=Freeze(params, head))
