"""LG-FedAvg (Liang et al., "Think Locally, Act Globally: Federated Learning with Local and Global
Representations", 2020).

FedPer's mirror image: each client keeps its own body (the local representation) and FedAvg runs on the head,
the model's last linear layer by default (`head: null`, or the patterns of `head`). Everything outside the
head is personal; a model that is its head alone (`lr`), or `head` patterns that match every entry (`["*"]`:
nothing personal, FedAvg recorded as LG-FedAvg), is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedmpi.algorithms.base import AlgorithmKeys
from fedmpi.algorithms.catalog import register
from fedmpi.algorithms.fedavg import FedAvg
from fedmpi.algorithms.layers import body_patterns
from fedmpi.core.errors import ConfigError
from fedmpi.core.personal import matching


@dataclass(frozen=True)
class LGFedAvgKeys(AlgorithmKeys):
    name: str = "lgfedavg"
    head: tuple[str, ...] | None = None
    """Patterns of the shared (global) layers; null: the model's last linear layer. The rest is personal."""


@register
class LGFedAvg(FedAvg):
    name = "lgfedavg"
    Keys = LGFedAvgKeys

    @classmethod
    def personal_patterns(cls, keys, model):
        key = f"algorithm.name = {cls.name!r}"
        if keys.head is None:
            return body_patterns(model, key)
        shared = {e[0] for pattern in keys.head for e in matching(model.entries, pattern)}
        if not shared:
            raise ConfigError(f"algorithm.head = {list(keys.head)}: ({key}) matches none of the model's parameters")
        return tuple(name for name, _, _ in model.entries if name not in shared)
