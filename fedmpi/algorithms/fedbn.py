"""FedBN (Li et al., "FedBN: Federated Learning on Non-IID Features via Local Batch Normalization", ICLR 2021).

FedAvg on everything but the normalization layers: each client keeps its own normalization parameters and
running statistics (every BatchNorm, GroupNorm, LayerNorm and InstanceNorm module's entries). A model without
normalization layers would keep nothing personal (FedAvg recorded as FedBN) and is refused at set-up.
`model.mlp_norm: batch` gives the small `mlp` batch normalization after each hidden layer; resnet18 has
`model.norm: batch` or `group`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedmpi.algorithms.base import AlgorithmKeys
from fedmpi.algorithms.catalog import register
from fedmpi.algorithms.fedavg import FedAvg
from fedmpi.algorithms.layers import norm_patterns


@dataclass(frozen=True)
class FedBNKeys(AlgorithmKeys):
    name: str = "fedbn"


@register
class FedBN(FedAvg):
    name = "fedbn"
    Keys = FedBNKeys
    nothing_personal_hint: ClassVar[str] = ("give the model normalization layers (model.mlp_norm = batch for mlp, "
                                            "model.norm = batch or group for resnet18)")

    @classmethod
    def personal_patterns(cls, keys, model):
        return norm_patterns(model)
