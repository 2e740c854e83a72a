"""Convolutions in the channels-last layout (`runtime.memory_format`).

On the CPU, oneDNN's convolutions and PyTorch's max pooling are much faster on NHWC activations than on
NCHW ones: a step of McMahan's MNIST CNN (batch 10, one thread) took ~20% less time with its activations
channels-last (docs/performance.md). The layout changes no operation, only the order of the elements in
memory, so results agree with PyTorch's default layout to float rounding (the convolutions sum in another
order); every rank uses the same layout, so `-n` invariance and resume still hold bit for bit.

What it takes, for an `nn.Sequential`-style model whose 4-D layers are its own leaf modules:
- the model's input is made channels-last (a copy, for images of more than one channel);
- a 4-D weight whose two layouts are the same memory (one input channel, or a 1x1 kernel) is given
  channels-last strides over its view into the flat vector, at no cost: its convolution then writes NHWC
  even where the input's layout is ambiguous (one-channel images);
- every leaf module outside `KEEPS_LAYOUT` (dropout, flatten, linear, ...) gets its 4-D input back in the
  default layout first, so that what it does, and which elements its random draws hit, is what it does in
  PyTorch's default layout: the first dropout after a convolution drops the same elements as a plain loop.

A model's own `forward` that reshapes with `.view` or draws from 4-D tensors itself would not be covered by
these hooks, so `auto` turns the layout on only for the zoo models that declare it (`models.CHANNELS_LAST`),
and only on the CPU, where it was measured."""

from __future__ import annotations

import torch
from torch import nn

CHANNELS_LAST = torch.channels_last

# Leaf modules that take and give 4-D activations in either layout with the same result (to float rounding).
KEEPS_LAYOUT = (nn.Conv2d, nn.MaxPool2d, nn.AvgPool2d, nn.ReLU)


def wanted(setting, model_name, device) -> bool:
    """Whether `runtime.memory_format` = `setting` makes this run's model channels-last."""
    from fedmpi.core.models import CHANNELS_LAST as DECLARED

    if setting == "auto":
        return model_name in DECLARED and torch.device(device).type == "cpu"
    return setting == "channels_last"


def use_channels_last(flat):
    """Makes the FlatModel `flat`'s 4-D activations channels-last (see the module docstring). The parameters
    stay views into `flat.vec`, in the same element order; only hooks and strides change."""
    module = flat.module
    for p in flat.trainable:
        if p.dim() == 4 and p.data.is_contiguous(memory_format=CHANNELS_LAST):    # the same memory either way
            p.data = p.data.as_strided(p.shape, _channels_last_strides(p.shape))
    module.register_forward_pre_hook(_to_channels_last)
    for leaf in module.modules():
        if leaf is not module and not list(leaf.children()) and not isinstance(leaf, KEEPS_LAYOUT):
            leaf.register_forward_pre_hook(_to_default_layout)
    return flat


def _channels_last_strides(shape):
    n, c, h, w = shape
    return (h * w * c, 1, w * c, c)


def _to_channels_last(module, args):
    x = args[0] if args else None
    if isinstance(x, torch.Tensor) and x.dim() == 4 and not x.is_contiguous(memory_format=CHANNELS_LAST):
        return (x.contiguous(memory_format=CHANNELS_LAST), *args[1:])
    return None


def _to_default_layout(module, args):
    if any(isinstance(a, torch.Tensor) and a.dim() == 4 and not a.is_contiguous() for a in args):
        return tuple(a.contiguous() if isinstance(a, torch.Tensor) and a.dim() == 4 else a for a in args)
    return None
