"""FedPer (Arivazhagan et al., "Federated Learning with Personalization Layers", 2019).

The model is a shared body and a personal head: FedAvg on the body, each client keeps its own head. Here the
head is the model's last linear layer by default (`head: null`), or the entries matching `head`'s patterns;
the round loop does the rest (fedmpi.core.personal: a client starts from the broadcast body and its own head,
uploads only the body's update, and keeps its trained head at home). `head: []`, which would keep nothing
personal (FedAvg recorded as FedPer), is refused at set-up (fedmpi.algorithms.personal_split).
"""

from __future__ import annotations

from dataclasses import dataclass

from fedmpi.algorithms.base import AlgorithmKeys
from fedmpi.algorithms.catalog import register
from fedmpi.algorithms.fedavg import FedAvg
from fedmpi.algorithms.layers import head_patterns


@dataclass(frozen=True)
class FedPerKeys(AlgorithmKeys):
    name: str = "fedper"
    head: tuple[str, ...] | None = None
    """Patterns of the personal layers' parameter names; null: the model's last linear layer."""


@register
class FedPer(FedAvg):
    name = "fedper"
    Keys = FedPerKeys

    @classmethod
    def personal_patterns(cls, keys, model):
        if keys.head is not None:
            return tuple(keys.head)
        return head_patterns(model, f"algorithm.name = {cls.name!r}")
