"""A model whose parameters and floating buffers are views into one flat float32 vector.

Loading a client's start point is one `copy_` into `FlatModel.vec`; what travels over MPI is `vec` itself.
Gradients are views into one flat `grad` tensor too: autograd accumulates into an existing `.grad` in place,
so after `backward()` the whole gradient is in `grad` without any gather, for an algorithm that corrects it
(`grad_hook`). Where nothing reads the whole gradient, `stepping_in_backward` lets each parameter take its
step as soon as its gradient is complete, from the tensor autograd made for it: no zeroing and no
accumulation pass over the flat gradient, and the gradient is still in cache when it is used (W1's local
training takes ~5% less time, docs/performance.md).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn


class FlatModel:
    def __init__(self, module: nn.Module, device="cpu"):
        module = module.to(device)
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        params = [p for _, p in named]
        buffers = [b for b in module.buffers() if b.is_floating_point()]
        self.n_params = sum(p.numel() for p in params)
        self.dim = self.n_params + sum(b.numel() for b in buffers)
        self.module = module
        self.device = torch.device(device)
        self.vec = torch.zeros(self.dim, dtype=torch.float32, device=device)
        self.grad = torch.zeros(self.n_params, dtype=torch.float32, device=device)
        self.trainable = params
        self._grad_views = []
        # (name, offset, numel) of every entry block in vector order: the names of named_parameters() and
        # named_buffers(), so that patterns over them (model.personal) find their entries.
        self.entries = []
        offset = 0
        for name, p in named:
            n = p.numel()
            self.entries.append((name, offset, n))
            self.vec[offset:offset + n].copy_(p.data.reshape(-1))
            p.data = self.vec[offset:offset + n].view_as(p)
            self._grad_views.append(self.grad[offset:offset + n].view_as(p))
            offset += n
        self.bind_grads()
        self._bind_buffers(module, offset)

    def _bind_buffers(self, module, offset):
        for prefix, sub in module.named_modules():
            for name, b in list(sub._buffers.items()):
                if b is None or not b.is_floating_point():
                    continue
                n = b.numel()
                self.entries.append((f"{prefix}.{name}" if prefix else name, offset, n))
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

    def bind_grads(self):
        """Every parameter's .grad is its view into `grad` again (autograd accumulates there)."""
        for p, view in zip(self.trainable, self._grad_views):
            p.grad = view

    @contextlib.contextmanager
    def stepping_in_backward(self, step):
        """While open, `backward()` calls `step(i, p, g)` for trainable parameter i as soon as its gradient
        g is complete (a post-accumulate-grad hook; not for one that got no gradient), then drops g; `grad` is
        not written. The hooks exist only inside the block (a module copied outside it carries none), and the
        views are bound again after it."""
        def ready(i, p):
            if p.grad is not None:      # None: a layer that stepped itself (cpu_kernels.fused_sgd)
                step(i, p, p.grad)
            p.grad = None

        for p in self.trainable:
            p.grad = None
        handles = [p.register_post_accumulate_grad_hook(lambda p, i=i: ready(i, p))
                   for i, p in enumerate(self.trainable)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
            self.bind_grads()

    def check_grads_bound(self):
        """True while every parameter's .grad is still a view into `grad` (autograd must not rebind it)."""
        base = self.grad.data_ptr()
        end = base + self.grad.numel() * 4
        return all(p.grad is not None and base <= p.grad.data_ptr() < end
                   for p in self.module.parameters() if p.requires_grad)
