"""Faster CPU kernels for the zoo's CNNs (`runtime.kernels: auto`), the same arithmetic to float rounding.

Two things a plain PyTorch loop leaves on the table on the CPU at federated batch sizes (one thread, batches
of 10; docs/results/performance.md has the measurements, bench/kernels.py measures them again):
- **Channels-last activations.** oneDNN's convolutions and PyTorch's max pooling are much faster on NHWC
  than on NCHW tensors: a cnn_mnist step took ~20% less time.
- **Big dense layers' SGD step inside their own backward** (`fused_sgd`), so their weight gradient is never
  made.

None changes an operation, only the order of elements in memory and of the terms in a sum, so results agree
with PyTorch's defaults to float rounding; every rank takes the same paths, so `-n` invariance and resume
still hold bit for bit.

What it takes, for an `nn.Sequential`-style model whose layers are its own leaf modules:
- the model's input is made channels-last (a copy, for images of more than one channel);
- a 4-D weight whose two layouts are the same memory (one input channel, or a 1x1 kernel) is given
  channels-last strides over its view into the flat vector, at no cost: its convolution then writes NHWC
  even where the input's layout is ambiguous (one-channel images);
- every `nn.Linear` of at least FUSED_MIN_WEIGHTS weights becomes a `FusedSgdLinear` (the class swapped,
  the parameters kept), which computes what nn.Linear computes and can step itself (`fused_sgd`): a rule on
  shapes, never on timings, so every rank decides alike;
- every other leaf module outside `KEEPS_LAYOUT` (dropout, flatten, small linear layers, ...) gets its
  inputs back in the default contiguous layout first, so that what it does, and which elements its random
  draws hit, is what it does under PyTorch's defaults: pfl_cnn's dropouts drop the same elements.

A model's own `forward` that reshapes with `.view` or draws from tensors itself would not be covered by these
hooks, so `auto` applies them only to the zoo models that declare it (`models.FAST_CPU_KERNELS`), built by
fedmpi, and only on the CPU, where they were measured."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

CHANNELS_LAST = torch.channels_last
FUSED_MIN_WEIGHTS = 1 << 16    # the size rule of the withdrawn (W xᵀ)ᵀ path, kept: a smaller layer's gradient is
                               # at most 256 KB, not measured worth fusing (cnn_mnist's fc2: 20 KB)

# Leaf modules that take and give activations in either layout with the same result (to float rounding).
KEEPS_LAYOUT = (nn.Conv2d, nn.MaxPool2d, nn.AvgPool2d, nn.ReLU)


def wanted(setting, model_name, device) -> bool:
    """Whether `runtime.kernels` = `setting` gives this run's model the fast paths (`model_name` None: the
    model was passed in, not built from the zoo)."""
    from fedmpi.core.models import FAST_CPU_KERNELS

    return setting == "auto" and model_name in FAST_CPU_KERNELS and torch.device(device).type == "cpu"


class FusedSgdLinear(nn.Linear):
    """nn.Linear that, inside `fused_sgd`, takes its own plain SGD step in the backward pass (`_FusedSGD`).

    It computes `x Wᵀ` as nn.Linear does. An earlier version computed small batches as `(W xᵀ)ᵀ`, measured
    2x faster on an earlier host; on the host of 2026-12-04 (AMD EPYC, Zen 4, MKL 2024.2, one thread) `x Wᵀ`
    is the faster at every batch size from 1 to 32 rows (10 x 3136 -> 512: 0.54 against 1.08 ms), and a whole
    cnn_mnist step 0.92 of the swapped one's (docs/results/performance.md, "Faster CPU kernels")."""

    fused_lr = None         # set by `fused_sgd` for the duration of a client's local steps

    def forward(self, x):
        if self.fused_lr is not None and x.dim() == 2 and torch.is_grad_enabled():
            return _FusedSGD.apply(x, self.weight, self.bias, self.fused_lr)
        return super().forward(x)


class _FusedSGD(torch.autograd.Function):
    """x Wᵀ + b whose backward, after the input's gradient (from W as it was), steps W -= lr gᵀ x and
    b -= lr Σ g in place, as one GEMM with beta 1: the weight's gradient is never made. For 3136 x 512 that
    saves allocating, writing and reading back 6.4 MB a step (a fresh tensor each time: the kernel's page
    faults included). Returns no gradient for W and b (the flat path's hooks then have nothing to step)."""

    @staticmethod
    def forward(ctx, x, weight, bias, lr):
        ctx.save_for_backward(x, weight)
        ctx.lr, ctx.bias = lr, bias
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = grad @ weight if ctx.needs_input_grad[0] else None
        with torch.no_grad():
            weight.addmm_(grad.t(), x, alpha=-ctx.lr)
            if ctx.bias is not None:
                ctx.bias.add_(grad.sum(0), alpha=-ctx.lr)
        return grad_x, None, None, None


@contextlib.contextmanager
def fused_sgd(module, lr):
    """While open, `module`'s FusedSgdLinear layers whose parameters all train step themselves in the
    backward pass with plain SGD at `lr` (no momentum, no weight decay: the caller's to check), the step
    `LocalTrainer` would take; every other parameter steps as before. Only for a loss that runs `module`
    once per step (a second forward would find its weight changed under it)."""
    layers = [m for m in module.modules() if isinstance(m, FusedSgdLinear)
              and all(p.requires_grad for p in m.parameters())]
    for layer in layers:
        layer.fused_lr = lr
    try:
        yield
    finally:
        for layer in layers:
            layer.fused_lr = None


def use_fast_kernels(flat):
    """Gives the FlatModel `flat` the fast paths of the module docstring. The parameters stay views into
    `flat.vec`, in the same element order; only classes, hooks and strides change."""
    module = flat.module
    for p in flat.trainable:
        if p.dim() == 4 and p.data.is_contiguous(memory_format=CHANNELS_LAST):    # the same memory either way
            p.data = p.data.as_strided(p.shape, _channels_last_strides(p.shape))
    module.register_forward_pre_hook(_to_channels_last)
    _relu_in_place_after_convolutions(module)
    for leaf in module.modules():
        if type(leaf) is nn.Linear and leaf.weight.numel() >= FUSED_MIN_WEIGHTS:
            leaf.__class__ = FusedSgdLinear
        if leaf is not module and not list(leaf.children()) and not isinstance(leaf, KEEPS_LAYOUT):
            leaf.register_forward_pre_hook(_to_default_layout)
    return flat


def _relu_in_place_after_convolutions(module):
    """A ReLU that directly follows a convolution in a Sequential overwrites the convolution's output (nobody
    else reads it; the convolution's backward needs its input and weight only), instead of allocating and
    writing a second activation as large: the same values forward, and ReLU's backward reads its output in
    either case."""
    for seq in module.modules():
        if isinstance(seq, nn.Sequential):
            layers = list(seq)
            for before, layer in zip(layers, layers[1:]):
                if type(layer) is nn.ReLU and isinstance(before, nn.Conv2d):
                    layer.inplace = True


def _channels_last_strides(shape):
    n, c, h, w = shape
    return (h * w * c, 1, w * c, c)


def _to_channels_last(module, args):
    x = args[0] if args else None
    if isinstance(x, torch.Tensor) and x.dim() == 4 and not x.is_contiguous(memory_format=CHANNELS_LAST):
        return (x.contiguous(memory_format=CHANNELS_LAST), *args[1:])
    return None


def _to_default_layout(module, args):
    if any(isinstance(a, torch.Tensor) and not a.is_contiguous() for a in args):
        return tuple(_default_layout(a) if isinstance(a, torch.Tensor) else a for a in args)
    return None


def _default_layout(x):
    """`x` in the default contiguous layout; a channels-last activation's gradient goes back channels-last."""
    if x.dim() == 4 and x.requires_grad and x.is_contiguous(memory_format=CHANNELS_LAST):
        return _ToDefaultLayout.apply(x)
    return x.contiguous()


class _ToDefaultLayout(torch.autograd.Function):
    """`x.contiguous()` for a channels-last activation whose backward hands the gradient back channels-last.
    With `contiguous()` alone the gradient went back in the default layout, and max pooling's backward, whose
    input is channels-last, then computed its gradient in the default layout and copied it over (a transposing
    copy of its whole input-sized gradient, 4x the pooled one converted here: ~2 MB a pfl_cnn step). The
    values are the same either way; only where they lie in memory changes."""

    @staticmethod
    def forward(ctx, x):
        return x.contiguous()

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous(memory_format=CHANNELS_LAST)
