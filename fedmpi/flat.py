"""A model whose parameters and floating buffers are views into one flat float32 vector.

Loading a client's start point is one `copy_` into `FlatModel.vec`; the SGD step is a handful of fused
operations on `vec[:n_params]` and `grad`; what travels over MPI is `vec` itself. Gradients are views into
one flat `grad` tensor too: autograd accumulates into an existing `.grad` in place, so after `backward()`
the whole gradient is in `grad` without any gather.
"""

from __future__ import annotations

import torch
from torch import nn


class FlatModel:
    def __init__(self, module: nn.Module, device="cpu"):
        module = module.to(device)
        params = [p for p in module.parameters() if p.requires_grad]
        buffers = [b for b in module.buffers() if b.is_floating_point()]
        self.n_params = sum(p.numel() for p in params)
        self.dim = self.n_params + sum(b.numel() for b in buffers)
        self.module = module
        self.device = torch.device(device)
        self.vec = torch.zeros(self.dim, dtype=torch.float32, device=device)
        self.grad = torch.zeros(self.n_params, dtype=torch.float32, device=device)
        offset = 0
        for p in params:
            n = p.numel()
            self.vec[offset:offset + n].copy_(p.data.reshape(-1))
            p.data = self.vec[offset:offset + n].view_as(p)
            p.grad = self.grad[offset:offset + n].view_as(p)
            offset += n
        self._bind_buffers(module, offset)

    def _bind_buffers(self, module, offset):
        for sub in module.modules():
            for name, b in list(sub._buffers.items()):
                if b is None or not b.is_floating_point():
                    continue
                n = b.numel()
                view = self.vec[offset:offset + n].view_as(b)
                view.copy_(b)
                sub._buffers[name] = view
                offset += n
        assert offset == self.dim

    @property
    def params(self):
        """The trainable part of the vector (buffers follow it)."""
        return self.vec[: self.n_params]

    def load(self, vec):
        self.vec.copy_(vec, non_blocking=True)

    def zero_grad(self):
        self.grad.zero_()

    def check_grads_bound(self):
        """True while every parameter's .grad is still a view into `grad` (autograd must not rebind it)."""
        base = self.grad.data_ptr()
        end = base + self.grad.numel() * 4
        return all(p.grad is not None and base <= p.grad.data_ptr() < end
                   for p in self.module.parameters() if p.requires_grad)
