"""What the federated LoRA rules (fedit, ffa_lora, fedsa_lora, hetlora, flora) share: finding a model's LoRA
adapters in the flat vector, per-client rank masks, the products s B A of adapters, and FLoRA's merged delta.

A LoRA layer (peft's `LoraLayer`, in any model: fedmpi's causal LM or a plug-in) adds s B A x to its frozen
base layer's output, with A [r, d_in], B [d_out, r] and s = alpha / r (peft's `scaling`). Its parameters are
named `<layer>.lora_A.<adapter>.weight` and `<layer>.lora_B.<adapter>.weight`, so the rules find them by the
fnmatch patterns `*lora_A*` and `*lora_B*` (the pure checks, on a ModelShape) and by walking the module for
peft's layers (`adapter_layout`, on a FlatModel: shapes and scalings, which the entries alone do not carry).

The product gap. Averaging A and B separately (FedIT) gives the server (sum p_k B_k)(sum p_k A_k), not the
mean of the clients' products sum p_k B_k A_k that exact aggregation would give; the gap
||sum p_k s B_k A_k - s B_bar A_bar||_F (summed over layers as a root of the sum of squares) is recorded as
/metrics/lora_product_gap where a rule uploads the products (flora always, fedit with `product_gap: true`).
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass

from fedmpi.core import rng
from fedmpi.core.config_checks import Checks
from fedmpi.core.lazy import torch

ADAPTER_A, ADAPTER_B = "*lora_A*", "*lora_B*"
DELTA = "lora_delta"        # the float buffer (d_out x d_in) of a merged or measured product, on the base layer
REINIT_KEY = 54             # (seed, INIT, REINIT_KEY, round): FLoRA's fresh A of each round
RANK_KEY = 55               # (seed, INIT, RANK_KEY, cid): a client's rank under `rank_assignment: draw`


def entries_matching(model, pattern) -> int:
    """Entries of the flat vector (`model`: a FlatModel or its ModelShape) whose name matches `pattern`."""
    return sum(numel for name, _, numel in model.entries if fnmatch.fnmatchcase(name, pattern))


def require_adapters(cfg, model, patterns=(ADAPTER_A, ADAPTER_B)):
    """ConfigError (exit 2) naming algorithm.name unless the flat vector has trainable entries matching every
    pattern: a LoRA rule on a model without adapters would be FedAvg (or nothing) under another name."""
    missing = [p for p in patterns if not entries_matching(model, p)]
    c = Checks("algorithm")
    c.require(not missing, "name", cfg.algorithm.name,
              f"trains LoRA adapters, but model.name = {cfg.model.name!r} has no trainable parameter matching "
              f"{' or '.join(missing)}; use a model with peft LoRA adapters (model.name = causal_lm with "
              f"lora.rank set, or a plug-in returning peft.get_peft_model(...))")
    c.done()


@dataclass(frozen=True)
class AdapterPair:
    """One LoRA layer's place in the flat vector: A's offset (None when A is frozen, outside the vector), B's,
    the rank r, d_in, d_out, the scaling s = alpha / r, and the offset of its `DELTA` buffer (None: none)."""

    name: str
    a: int | None
    b: int
    rank: int
    d_in: int
    d_out: int
    scaling: float
    delta: int | None = None

    def A(self, vec):
        return vec[self.a:self.a + self.rank * self.d_in].view(self.rank, self.d_in)

    def B(self, vec):
        return vec[self.b:self.b + self.d_out * self.rank].view(self.d_out, self.rank)

    def D(self, vec):
        return vec[self.delta:self.delta + self.d_out * self.d_in].view(self.d_out, self.d_in)

    def product(self, vec):
        """s B A of `vec`'s adapters."""
        return self.scaling * (self.B(vec) @ self.A(vec))


def lora_layers(module):
    """(name, layer, adapter) of every peft LoRA layer of `module` with one adapter, in named_modules order."""
    out = []
    for name, layer in module.named_modules():
        loras = getattr(layer, "lora_A", None)
        if isinstance(loras, torch.nn.ModuleDict) and len(loras):
            out.append((name, layer, next(iter(loras))))
    return out


def adapter_layout(flat) -> tuple:
    """The AdapterPairs of a FlatModel's LoRA layers (every rank computes the same from its own model)."""
    offsets = {name: offset for name, offset, _ in flat.entries}
    pairs = []
    for name, layer, key in lora_layers(flat.module):
        a_name, b_name = f"{name}.lora_A.{key}.weight", f"{name}.lora_B.{key}.weight"
        rank, d_in = layer.lora_A[key].weight.shape
        d_out = layer.lora_B[key].weight.shape[0]
        pairs.append(AdapterPair(name, offsets.get(a_name), offsets[b_name], int(rank), int(d_in), int(d_out),
                                 float(layer.scaling[key]), offsets.get(f"{name}.base_layer.{DELTA}")))
    return tuple(pairs)


# -- ranks ------------------------------------------------------------------------------------------------------
def client_rank(cid, ranks, assignment, seed) -> int:
    """Client `cid`'s LoRA rank: ranks[cid mod len] (`cycle`) or a seeded draw from `ranks` (`draw`), the
    same on every rank and in every round."""
    if assignment == "cycle":
        return int(ranks[cid % len(ranks)])
    return int(ranks[int(rng.stream(seed, rng.INIT, RANK_KEY, cid).integers(len(ranks)))])


def rank_mask(layout, rank, n_params, device) -> torch.Tensor:
    """A float32 mask over the trainable entries: 0 on A's rows and B's columns at or past `rank`, else 1."""
    mask = torch.ones(n_params, dtype=torch.float32, device=device)
    for pair in layout:
        if rank < pair.rank:
            if pair.a is not None:
                pair.A(mask)[rank:, :] = 0
            pair.B(mask)[:, rank:] = 0
    return mask


# -- products and FLoRA's delta ---------------------------------------------------------------------------------
def product_gap(mean_vec, base_vec, layout) -> float:
    """||mean of products - product of means||_F over every layer: `mean_vec` carries the weighted mean of the
    uploads (the products on the DELTA entries, the adapters' changes on theirs), `base_vec` the broadcast the
    changes are from (the adapters' mean is base + mean change)."""
    total = 0.0
    for pair in layout:
        if pair.delta is None or pair.a is None:
            continue
        a = (pair.A(base_vec).double() + pair.A(mean_vec).double())
        b = (pair.B(base_vec).double() + pair.B(mean_vec).double())
        total += float(((pair.D(mean_vec).double() - pair.scaling * (b @ a)) ** 2).sum())
    return math.sqrt(total)


def _add_delta(layer, inputs, output):
    """Forward hook of a base layer with a DELTA buffer: its output plus x delta^T ((W + delta) x)."""
    return output + torch.nn.functional.linear(inputs[0], getattr(layer, DELTA).to(output.dtype))


def add_delta_buffers(module, in_forward):
    """Adds to every LoRA layer's base layer a zero float buffer DELTA (d_out x d_in), in the flat vector as
    every float buffer is; `in_forward`: the base layer's forward adds it (FLoRA's merge), else it only
    carries the uploaded products for the gap figure. Idempotent."""
    for _, layer, key in lora_layers(module):
        base = layer.get_base_layer()
        if hasattr(base, DELTA):
            continue
        d_in = layer.lora_A[key].weight.shape[1]
        d_out = layer.lora_B[key].weight.shape[0]
        base.register_buffer(DELTA, torch.zeros(d_out, d_in, dtype=torch.float32,
                                                device=layer.lora_B[key].weight.device))
        if in_forward:
            base.register_forward_hook(_add_delta)


def write_products(vec, base_vec, layout):
    """Puts base + s B A of `vec`'s adapters on `vec`'s DELTA entries, so that vec - base uploads the product."""
    for pair in layout:
        pair.D(vec).copy_(pair.D(base_vec) + pair.product(vec))


def fresh_adapters(vec, layout, seed, round_):
    """Re-initialises `vec`'s adapters in place: A from the seeded draw of `round_` (peft's default, Kaiming
    uniform with a = sqrt(5): U(-1/sqrt(d_in), 1/sqrt(d_in))), B = 0. The same on every rank."""
    gen = torch.Generator().manual_seed(rng.torch_seed(seed, rng.INIT, REINIT_KEY, round_))
    for pair in layout:
        bound = 1.0 / math.sqrt(pair.d_in)
        a = (torch.rand(pair.rank, pair.d_in, generator=gen, dtype=torch.float64) * 2 - 1) * bound
        pair.A(vec).copy_(a.to(vec.dtype))
        pair.B(vec).zero_()
