"""A fresh draw of a model's own initialisation, reproducible from the seed.

Reference codes sometimes start state from a freshly constructed network rather than from zero or from the
global model: NIID-Bench's SCAFFOLD initialises its controls c = c_i with a new network's weights, MOON's
code contrasts a client that has never trained with that client's own never-trained network. fedmpi
reproduces such draws deterministically (the same on every rank, for any -n): a copy of the rank's model
whose layers re-run `reset_parameters()` under the torch seed (seed, INIT, *keys).

For fedmpi's models that is the constructor's own initialisation (Linear, Conv, LSTM, Embedding and the
normalisation layers initialise through `reset_parameters`), except torchvision's ResNet, whose constructor
re-initialises its convolutions with Kaiming-normal (fan-out) afterwards: there the draw follows PyTorch's
layer defaults. Parameters of modules without `reset_parameters` keep the model's current values.
"""

from __future__ import annotations

import copy

from fedmpi.core import rng
from fedmpi.core.flat import FlatModel
from fedmpi.core.lazy import torch


def fresh_init(model, seed, *keys) -> torch.Tensor:
    """The flat vector (`model.dim` entries, on `model.device`) of a fresh initialisation of `model`'s
    module, drawn from (seed, INIT, *keys) on the CPU without touching the global torch generator."""
    module = copy.deepcopy(model.module).to("cpu")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(rng.torch_seed(seed, rng.INIT, *keys))
        with torch.no_grad():
            for layer in module.modules():
                reset = getattr(layer, "reset_parameters", None)
                if callable(reset):
                    reset()
    return FlatModel(module).vec.to(model.device)
