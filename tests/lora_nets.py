"""A small model with peft LoRA adapters for the federated LoRA rules' tests (`model.name:
lora_nets:TinyLora`, with tests/ on PYTHONPATH): a two-layer perceptron whose fc1 and fc2 carry rank-4 adapters
(peft's LoraConfig(r=4, alpha=8, target_modules fc1, fc2)), its base frozen as peft leaves it. peft is imported
here, when the model is built, never by fedmpi itself."""

from __future__ import annotations

import math

from torch import nn

RANK, ALPHA = 4, 8


class TinyNet(nn.Module):
    def __init__(self, d_in, num_classes, width):
        super().__init__()
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(d_in, width)
        self.fc2 = nn.Linear(width, num_classes)

    def forward(self, x):
        return self.fc2(self.fc1(self.flatten(x).float()).relu())


def TinyLora(input_shape, num_classes, width=16, rank=RANK):
    """TinyNet wrapped by peft.get_peft_model; A from peft's seeded (torch global) initialisation, B = 0."""
    from peft import LoraConfig, get_peft_model

    net = TinyNet(math.prod(input_shape), num_classes, width)
    return get_peft_model(net, LoraConfig(r=rank, lora_alpha=ALPHA, target_modules=["fc1", "fc2"]))


def Plain(input_shape, num_classes, width=16):
    """The same network without adapters (the rules refuse it)."""
    return TinyNet(math.prod(input_shape), num_classes, width)
