"""A model whose parameters and floating buffers are views into one flat float32 vector.

Loading a client's start point is one `copy_` into `FlatModel.vec`; what travels over MPI is `vec` itself.
Gradients are views into one flat `grad` tensor too: autograd accumulates into an existing `.grad` in place,
so after `backward()` the whole gradient is in `grad` without any gather, for an algorithm that corrects it
(`grad_hook`). Where nothing reads the whole gradient, `stepping_in_backward` lets each parameter take its
step as soon as its gradient is complete, from the tensor autograd made for it: no zeroing and no
accumulation pass over the flat gradient, and the gradient is still in cache when it is used (W1's local
training takes ~5% less time, docs/results/performance.md).
"""

from __future__ import annotations

import contextlib

import numpy as np

from fedmpi.core.lazy import nn, torch
from fedmpi.core.model_shape import ModelShape

# Entries per block of the blocked passes (`add_update`, round.server_opt.mean_sgd_step): their float32 and
# float64 scratch (768 kB) stays in a core's cache.
UPDATE_BLOCK = 1 << 16


def in_blocks(n, block, *dtypes):
    """Yields (start, stop, scratch) for consecutive blocks of at most `block` of `n` entries, `scratch` one CPU
    vector per dtype in `dtypes`, cut to the block's length (the same memory every block): for passes over
    model-sized vectors whose temporaries should stay in cache instead of becoming model-sized themselves."""
    width = min(block, n)
    buffers = [torch.empty(width, dtype=dtype) for dtype in dtypes]
    for start in range(0, n, block):
        stop = min(start + block, n)
        yield start, stop, [b[: stop - start] for b in buffers]


def add_update(acc, vec, start, weight, block=UPDATE_BLOCK):
    """acc += weight * (vec - start) in place: a client's float32 update (its trained vector less its start),
    weighted, into a float64 accumulator. The same two roundings as `acc.add_(vec - start, alpha=weight)`
    (the float32 difference, then the float64 multiply-add), so the same bits; on the CPU a block at a time,
    through a float64 copy of the block. The one-line form makes the float32 difference and then, as torch
    promotes a float32 operand of a float64 sum on the CPU, a float64 copy of all of it: 12 bytes per parameter
    for a moment and two more passes over memory (W5's 1.6 M entries: 3-4 ms a client)."""
    if acc.device.type != "cpu" or acc.numel() <= block:
        # one block: the one-line form's temporaries are cache-sized anyway, and the blocked loop's set-up (two
        # scratch vectors and a generator per client) cost W2's 610-entry clients about 30 us each (+20% a round)
        return acc.add_(vec - start, alpha=weight)
    for i, j, (diff, wide) in in_blocks(acc.numel(), block, torch.float32, torch.float64):
        torch.sub(vec[i:j], start[i:j], out=diff)
        acc[i:j].add_(wide.copy_(diff), alpha=weight)
    return acc


def sq_distance(vec, start, block=UPDATE_BLOCK):
    """||vec - start||^2 of two float32 vectors, as a Python float: the float32 difference (the update's own
    rounding, as `vec - start`), its squares summed in float64. On the CPU a block at a time through a
    cache-sized difference, so that no model-sized difference is made just to be measured (a W5 client's
    1.6 M entries: the difference and a float32 dot took ~2.5 ms of its ~150)."""
    if vec.device.type != "cpu" or vec.numel() <= block:
        diff = (vec - start).double()
        return float(diff.dot(diff))
    total = 0.0
    for i, j, (diff, wide) in in_blocks(vec.numel(), block, torch.float32, torch.float64):
        torch.sub(vec[i:j], start[i:j], out=diff)
        wide.copy_(diff)
        total += float(wide.dot(wide))
    return total


def frozen_buffer_names(module) -> set:
    """The full names of the buffers that belong to a frozen base (each submodule's `fedmpi_frozen_buffers`,
    fedmpi.core.causal_lm.LastTokenLM): like the frozen parameters, they stay out of the flat vector."""
    return {f"{prefix}.{name}" if prefix else name for prefix, sub in module.named_modules()
            for name in getattr(sub, "fedmpi_frozen_buffers", ())}


class FlatModel:
    """A module whose trainable parameters (requires_grad) and floating buffers are views into one flat
    float32 vector `vec`. Frozen parameters and a frozen base's buffers (`frozen_buffer_names`) are not in it:
    they never travel, are never aggregated or checkpointed."""

    def __init__(self, module: nn.Module, device="cpu"):
        module = module.to(device)
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        params = [p for _, p in named]
        frozen = frozen_buffer_names(module)
        buffers = [b for n, b in module.named_buffers() if b.is_floating_point() and n not in frozen]
        self.n_params = sum(p.numel() for p in params)
        self.dim = self.n_params + sum(b.numel() for b in buffers)
        self.module = module
        self.device = torch.device(device)
        self.vec = torch.zeros(self.dim, dtype=torch.float32, device=device)
        self._grad = None       # the flat gradient, made on first use (`grad`)
        self.trainable = params
        # (name, offset, numel) of every entry block in vector order: the names of named_parameters() and
        # named_buffers(), so that patterns over them (model.personal) find their entries.
        self.entries = []
        offset = 0
        for name, p in named:
            n = p.numel()
            self.entries.append((name, offset, n))
            self.vec[offset:offset + n].copy_(p.data.reshape(-1))
            p.data = self.vec[offset:offset + n].view_as(p)
            p.grad = None
            offset += n
        self._bind_buffers(module, offset, frozen)

    def _bind_buffers(self, module, offset, frozen):
        for prefix, sub in module.named_modules():
            for name, b in list(sub._buffers.items()):
                full = f"{prefix}.{name}" if prefix else name
                if b is None or not b.is_floating_point() or full in frozen:
                    continue
                n = b.numel()
                self.entries.append((full, offset, n))
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

    @property
    def grad(self):
        """The flat gradient (float32, `n_params` entries): every parameter's .grad is a view into it, so that
        backward accumulates the whole gradient there (for a `grad_hook`). Made on first use: where every step
        is taken inside the backward pass (`stepping_in_backward`, plain FedAvg clients) or a rank never
        trains (rank 0 of -n 3), no model-sized gradient is ever held (4 bytes per parameter; a gradient
        autograd already made is kept, as accumulating it into zeros would)."""
        if self._grad is None:
            self._grad = torch.zeros(self.n_params, dtype=torch.float32, device=self.device)
            for p, view in zip(self.trainable, self._grad_views()):
                if p.grad is not None:
                    view.add_(p.grad)
                p.grad = view
        return self._grad

    def _grad_views(self):
        views, offset = [], 0
        for p in self.trainable:
            views.append(self._grad[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        return views

    def zero_grad(self):
        self.grad.zero_()

    def bind_grads(self):
        """Every parameter's .grad is its view into `grad` again (autograd accumulates there); before the flat
        gradient is made, none has a gradient (autograd makes its own, kept when `grad` is first used)."""
        if self._grad is None:
            for p in self.trainable:
                p.grad = None
            return
        for p, view in zip(self.trainable, self._grad_views()):
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

    @property
    def linear_layers(self) -> tuple:
        """The module names of the nn.Linear layers, in named_modules order (ModelShape's field)."""
        return tuple(name for name, m in self.module.named_modules() if isinstance(m, nn.Linear))

    @property
    def norm_layers(self) -> tuple:
        """The module names of the normalization layers, whose entries FedBN keeps local."""
        kinds = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)
        return tuple(name for name, m in self.module.named_modules() if isinstance(m, kinds))

    @property
    def forward_rep(self) -> bool:
        return callable(getattr(self.module, "forward_rep", None))

    def describe(self, probe=None) -> ModelShape:
        """The model as the resolve step sees it, with `probe`'s outcome (`forward_probe`; None: not probed)."""
        from fedmpi.core.vectorized import unsupported  # here: fedmpi.core.vectorized builds on this module

        output, error, sample = probe if probe is not None else (None, "", "")
        return ModelShape(dim=self.dim, n_params=self.n_params, entries=tuple(self.entries),
                          linear_layers=self.linear_layers, norm_layers=self.norm_layers,
                          forward_rep=self.forward_rep, output=output, forward_error=error, sample=sample,
                          unbatchable=unsupported(self) or "")


def forward_probe(module, x_train) -> tuple:
    """(output shape, error line, sample description) of one forward pass of `module` on the first sample of
    `x_train` ((None, "", "") without samples), for ModelShape. Run on the CPU model before it becomes a
    FlatModel, as every rank builds it. In eval mode and without gradients, so nothing of the model
    (BatchNorm's running statistics) and no random stream moves."""
    if x_train is None or not len(x_train):
        return None, "", ""
    x = torch.from_numpy(np.array(x_train[:1]))
    sample = f"shape {tuple(x.shape[1:])}, dtype {x.dtype}"
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            out = module(x)
        return tuple(getattr(out, "shape", ())), "", sample
    except Exception as e:  # noqa: BLE001 - whatever the forward raises, the pair is what is wrong
        return None, (str(e).splitlines() or [type(e).__name__])[0][:200], sample
    finally:
        module.train(was_training)
