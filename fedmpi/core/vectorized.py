"""Many small clients trained at once (`client.vectorize`; docs/explanation/design.md §4 `train`).

A group of selected clients that start from the same vector and share the batch pattern (the same batch
size at every step: same sample count and schedule) trains as one batched computation. Their parameters
are rows of one [G, n_params] matrix; `torch.func.vmap(grad(functional_call(module, ...)))` computes every
client's gradient in one pass, and the SGD step updates all rows with a few fused `_foreach` operations.
Each client still draws its batches from its own stream (seed, CLIENT, round, client), so the clients see
exactly the samples of the per-client loop (`fedmpi.core.train.LocalTrainer`); the loss of a batch is its mean
over the batch's actual size (last partial batches included), and weight decay and momentum follow
`LocalTrainer._step`. Results equal the loop's to float tolerance (batched kernels add in another order).

What may vectorize: the algorithm (`Algorithm.vectorize_blocker`: client start = load the broadcast vector,
no gradient hook, no loss of its own, uploads added after training) and the model (`unsupported`: layers
that are pure functions of parameters and input, no float buffers such as batch-norm statistics, no
dropout, whose per-client randomness vmap cannot reproduce bit for bit).

Batched and per-client training add in different orders (a few 1e-8 apart after a round), so `auto` decides
once for the whole job, from the config alone, never from how many clients land on a rank (that follows
-n): it batches every client where the model wins from it on its device (`worthwhile`: on a GPU always, on a
CPU for dense models only) and the partition gives a round of `server.clients_per_round` clients at least
MIN_GROUP clients of one batch pattern on average (`alike_enough`), else the loop trains every client.
Convolutions under vmap become grouped convolutions, which on a CPU run no faster than the loop's
per-client convolutions (measured: 0.7x for cnn2, cnn_mnist), because there the arithmetic, not the
per-client overhead, bounds a step. A client's result does not depend on the group it trains in (`_pair`).
"""

from __future__ import annotations

import copy
from collections import Counter

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedmpi.core.train import batch_order, schedule

# Layers that are pure functions of (parameters, input), which vmap batches over clients.
PURE_LAYERS = (nn.Linear, nn.Bilinear, nn.Conv1d, nn.Conv2d, nn.ReLU, nn.LeakyReLU, nn.ELU, nn.GELU, nn.Tanh,
               nn.Sigmoid, nn.Softplus, nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d, nn.Flatten,
               nn.Identity)
# Layers whose batched form is a batched matrix product: the per-client loop pays overhead, not arithmetic.
DENSE_LAYERS = (nn.Linear, nn.Bilinear, nn.ReLU, nn.LeakyReLU, nn.ELU, nn.GELU, nn.Tanh, nn.Sigmoid,
                nn.Softplus, nn.Flatten, nn.Identity)
MIN_GROUP = 8              # auto: rounds with fewer clients of one batch pattern on average train in the loop
MAX_STACK_FLOATS = 1 << 26  # at most this many stacked parameters (256 MB of float32) per batched group


def _leaves(module):
    return [m for m in module.modules() if not list(m.children())]


def unsupported(flat):
    """Why this FlatModel cannot train as a batched group, or None when it can."""
    if flat.dim != flat.n_params:
        return ("the model has float buffers (e.g. batch-norm statistics) that training updates in place; "
                "only models whose flat vector is all parameters vectorize")
    for m in _leaves(flat.module):
        if isinstance(m, nn.modules.dropout._DropoutNd):
            return ("the model has dropout, whose per-client randomness under vmap would not match the "
                    "per-client loop bit for bit")
        if not isinstance(m, PURE_LAYERS):
            return f"layer {type(m).__name__} is not one that vmap batches over clients here"
    return None


def worthwhile(flat):
    """`auto`: does batching clients beat the loop for this model on its device?"""
    if flat.device.type == "cuda":
        return True
    return all(isinstance(m, DENSE_LAYERS) for m in _leaves(flat.module))


def alike_enough(sizes, client_cfg, per_round) -> bool:
    """`auto`'s count (the module docstring), from the config alone: does a round of `per_round` clients drawn
    from clients of `sizes` samples hold on average at least MIN_GROUP of one batch pattern (`group_key`)?"""
    if len(sizes) == 0:
        return False
    counts = Counter(group_key(int(n), schedule(client_cfg, int(n))) for n in sizes)
    return min(per_round, len(sizes)) * max(counts.values()) >= MIN_GROUP * len(sizes)


def group_key(n_samples, sched):
    """Clients with equal keys have the same batch size at every step."""
    return n_samples, sched.batch_size, sched.steps


def chunks(items, size):
    return [items[i:i + size] for i in range(0, len(items), size)]


class GroupTrainer:
    """Trains groups of clients from one start vector, on the rank's device-resident training data."""

    def __init__(self, flat, client_cfg, x, y, transform=None):
        self.flat, self.cfg, self.x, self.y, self.transform = flat, client_cfg, x, y, transform
        module = flat.module
        names, self.shapes, self.spans = [], [], []
        offset = 0
        for name, p in module.named_parameters():
            if not p.requires_grad:
                continue
            names.append(name)
            self.shapes.append(tuple(p.shape))
            self.spans.append((offset, offset + p.numel()))
            offset += p.numel()
        assert offset == flat.n_params
        self.max_group = max(1, MAX_STACK_FLOATS // max(flat.n_params, 1))

        def loss(params, xb, yb):
            out = torch.func.functional_call(module, dict(zip(names, params)), (xb,))
            value = F.cross_entropy(out, yb)
            return value, value.detach()

        # A chain of dense layers takes the batched-matrix-product path (`DenseChain`); any other model vmap's.
        self.chain = DenseChain.of(module, x.shape[1:])
        self._grads = self.chain.grads if self.chain is not None else torch.func.vmap(
            torch.func.grad(loss, has_aux=True))

    def _views(self, matrix):
        g = matrix.shape[0]
        return [matrix[:, a:b].view(g, *shape) for (a, b), shape in zip(self.spans, self.shapes)]

    def train(self, start, clients, sched, lr=None, poisons=None):
        """`sched.steps` SGD steps for every client of `clients` ([(sample indices as numpy, generator)], all
        with the same sample count) from `start` (the flat vector). Returns (parameters [G, n_params],
        per-client sums of sample losses [G] float32, samples seen per client). `poisons`: per client, None
        or its data attack's batch function, applied after augmentation as in LocalTrainer."""
        if len(clients) == 1:       # alone: trained as a pair with a copy of itself (`_pair`), the copy dropped
            weights, loss_sums, seen = self._train(start, _pair(clients[0]), sched, lr, poisons and [poisons[0], None])
            return weights[:1], loss_sums[:1], seen
        return self._train(start, clients, sched, lr, poisons)

    def _train(self, start, clients, sched, lr, poisons):
        cfg, module = self.cfg, self.flat.module
        lr = cfg.lr if lr is None else lr
        g_count, n = len(clients), self.flat.n_params
        weights = start[:n].unsqueeze(0).repeat(g_count, 1)
        params = self._views(weights)
        momentum = torch.zeros_like(weights) if cfg.momentum > 0 else None
        bufs = self._views(momentum) if momentum is not None else None
        orders = [batch_order(g, len(part), sched) for part, g in clients]
        sizes = [len(b) for b in orders[0]]
        rows = np.stack([part[np.concatenate(order)] for (part, _), order in zip(clients, orders)])
        index = torch.from_numpy(rows).to(self.x.device, non_blocking=True)
        loss_sums = torch.zeros(g_count, device=weights.device)
        module.train()
        col = 0
        for b in sizes:
            idx = index[:, col:col + b]
            col += b
            xb, yb = self.x[idx], self.y[idx]
            if self.transform is not None:
                xb = torch.stack([self.transform(xb[i], g) for i, (_, g) in enumerate(clients)])
            if poisons is not None:
                xb, yb = _poisoned(xb, yb, poisons)
            grads, losses = self._grads(tuple(params), xb, yb)
            self._step(params, list(grads), bufs, lr)
            loss_sums += losses * b
        return weights, loss_sums, col

    @torch.no_grad()
    def _step(self, params, grads, bufs, lr):
        # LocalTrainer._step (torch.optim.SGD's rule) on every client's row: g += wd * w; buf = m * buf + g;
        # w -= lr * buf.
        if self.cfg.weight_decay:
            torch._foreach_add_(grads, params, alpha=self.cfg.weight_decay)
        if bufs is not None:
            torch._foreach_mul_(bufs, self.cfg.momentum)
            torch._foreach_add_(bufs, grads)
            grads = bufs
        torch._foreach_add_(params, grads, alpha=-lr)


class DenseChain:
    """Every client's gradient of a chain of dense layers (nn.Sequential of Linear, Flatten and element-wise
    activations) by batched matrix products: the group's weights are [G, out, in] tensors, a Linear is one
    `baddbmm` over the group's [G, B, in] batch, and one ordinary backward pass of the sum of the clients'
    mean losses gives each client the gradient of its own loss (the clients' losses share no parameter).
    The same arithmetic as vmap's batched rule for the same layers (bit-identical on the W2 benchmark's
    model; tests/test_vectorized.py checks it against vmap and the per-client loop), without vmap's
    per-call dispatch: ~0.3 ms against ~1.2 ms a step for 50 clients of a 610-parameter model on one CPU
    thread, most of a round of many tiny clients."""

    def __init__(self, layers):
        self.layers = layers        # the chain's leaf modules, in order

    @classmethod
    def of(cls, module, sample_shape):
        """The chain of `module` for inputs of `sample_shape`, or None where it is not one (then vmap)."""
        layers = _chain(module)
        if layers is None or not layers:
            return None
        chain = cls(layers)
        try:        # the shapes must work out: a Linear sees [G, B, features] (a Flatten before it, or 1-D samples)
            with torch.no_grad():
                params = [p.detach().unsqueeze(0) for p in module.parameters()]
                chain.forward(params, torch.zeros((1, 1, *sample_shape)))
        except (RuntimeError, ValueError):
            return None
        return chain

    def forward(self, params, xb):
        """The group's outputs [G, B, ...] for batched parameters `params` (in named_parameters order) and
        inputs `xb` [G, B, ...]."""
        it = iter(params)
        out = xb
        for layer in self.layers:
            if isinstance(layer, nn.Linear):
                weight = next(it)
                if out.dim() != 3:
                    raise ValueError("a Linear layer of the chain sees more than [batch, features] per client")
                out = (torch.baddbmm(next(it).unsqueeze(1), out, weight.transpose(1, 2)) if layer.bias is not None
                       else torch.bmm(out, weight.transpose(1, 2)))
            elif isinstance(layer, nn.Flatten):
                end = layer.end_dim if layer.end_dim < 0 else layer.end_dim + 1
                out = out.flatten(layer.start_dim + 1, end)
            else:
                out = layer(out)        # element-wise: the same on [G, B, ...] as on [B, ...]
        return out

    def grads(self, params, xb, yb):
        """(per-client gradients, per-client mean losses [G]) as vmap(grad(loss, has_aux=True)) returns them."""
        leaves = [p.detach().requires_grad_(True) for p in params]
        out = self.forward(leaves, xb)
        groups, batch = yb.shape
        losses = F.cross_entropy(out.reshape(groups * batch, -1), yb.reshape(-1), reduction="none").view(groups, batch)
        losses = losses.mean(1)
        grads = torch.autograd.grad(losses.sum(), leaves)
        return grads, losses.detach()


# DENSE_LAYERS but Bilinear (two inputs, no place in a chain)
_CHAIN_LAYERS = tuple(t for t in DENSE_LAYERS if t is not nn.Bilinear)


def _chain(module):
    """The leaf modules of `module` in the order its forward applies them, where it is an nn.Sequential (nested
    ones flattened) of `_CHAIN_LAYERS` whose parameters all train; else None."""
    if not isinstance(module, nn.Sequential):
        return None
    out = []
    for child in module:
        if isinstance(child, nn.Sequential):
            inner = _chain(child)
            if inner is None:
                return None
            out.extend(inner)
        elif type(child) in _CHAIN_LAYERS and all(p.requires_grad for p in child.parameters()):
            out.append(child)
        else:
            return None
    return out


def _pair(client):
    """A lone client and a copy of it for a group of two. Which clients share a group follows which rank hosts
    them, so a client's bits must not depend on its group: in groups of two or more they do not (each client's
    products are their own matrices of one batched call; tests/test_vectorized.py), but a group of one takes
    other kernels (vmap's unbatched ones; MKL's multi-threaded GEMM for a batch of one), 1e-8 apart. The copy
    draws from its own copy of the client's generator, so the client's own draws stay the loop's."""
    part, g = client
    return [client, (part, copy.deepcopy(g))]


def _poisoned(xb, yb, poisons):
    """The group's batch [G, B, ...] with each malicious client's rows replaced by its poisoned batch."""
    xb, yb = xb.clone(), yb.clone()
    for i, poison in enumerate(poisons):
        if poison is not None:
            xb[i], yb[i] = poison(xb[i], yb[i])
    return xb, yb
