"""The federated LoRA rules that average adapters as FedAvg averages a model: FedIT, FFA-LoRA and FedSA-LoRA.
Each needs a model with LoRA adapters (a frozen base; `*lora_A*` / `*lora_B*` in the flat vector) and refuses
one without (exit 2). fedmpi.algorithms.lora has what they share.

fedit (Zhang et al., "Towards Building the Federated GPT: Federated Instruction Tuning", ICASSP 2024;
  reference JayZhang42/FederatedGPT-Shepherd, fed_utils/model_aggregation.py: the weighted mean of the
  clients' adapter state dicts). A and B are averaged separately, FedAvg on the adapter vector, so the server
  holds (sum p_k B_k)(sum p_k A_k), not sum p_k B_k A_k. `product_gap: true` measures that difference every
  round (/metrics/lora_product_gap, fedmpi.algorithms.lora): the model then carries a zero buffer per LoRA
  layer (outside its forward) on which each client uploads its product s B_k A_k, which the server reads and
  never applies; it costs d_out x d_in floats per layer on the wire both ways, so leave it off to time FedIT.
ffa_lora (Sun et al., "Improving LoRA in Privacy-preserving Federated Learning", ICLR 2024). A stays at its
  seeded initialisation: `prepare_model` freezes every `*lora_A*`, so A is neither trained nor in the vector
  (it never travels; every rank builds the same A from the seed). Only B is trained and averaged, and since
  every client shares A, sum p_k s B_k A = s (sum p_k B_k) A: the average of the products is exact.
fedsa_lora (Guo et al., "Selective Aggregation for Low-Rank Adaptation in Federated Learning", ICLR 2025;
  reference Pengxin-Guo/FedSA-LoRA, federatedscope/llm/yamls/fedsa-lora.yaml: personalization.local_param
  ['lora_B'], so A is shared and B stays with each client). Here `*lora_B*` are the personal entries: the
  round loop's personal machinery keeps each client's B at home and averages the A matrices.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from fedmpi.algorithms import lora
from fedmpi.algorithms.base import AlgorithmKeys
from fedmpi.algorithms.catalog import register
from fedmpi.algorithms.fedavg import FedAvg


@dataclass(frozen=True)
class FedItKeys(AlgorithmKeys):
    name: str = "fedit"
    product_gap: bool = False
    """Record /metrics/lora_product_gap, ||mean of the clients' s B A - s (mean B)(mean A)||_F, every round; the
    clients then also upload their products (d_out x d_in floats per LoRA layer, each way)."""


@register
class FedIt(FedAvg):
    name = "fedit"
    Keys = FedItKeys

    @classmethod
    def form(cls, keys):
        return FedItWithGap if keys.product_gap else cls

    @classmethod
    def check(cls, cfg, model):
        lora.require_adapters(cfg, model)
        super().check(cfg, model)


class FedItWithGap(FedIt):
    """FedIT whose clients also upload their adapters' products, for the gap figure (`product_gap: true`)."""

    vectorizable = False            # its accumulate writes the products into the trained vector
    robust_aggregation = False      # the products ride in the upload: a robust rule would mix them in

    @classmethod
    def prepare_model(cls, keys, module):
        lora.add_delta_buffers(module, in_forward=False)

    def __init__(self, keys, context):
        super().__init__(keys, context)
        self.layout, self.gap = None, float("nan")

    def setup(self, ctx):
        super().setup(ctx)
        self.layout = lora.adapter_layout(ctx.model)

    def accumulate(self, run, down, model, acc):
        lora.write_products(model.vec.detach(), down[: self.dim], self.layout)
        return super().accumulate(run, down, model, acc)

    def aggregate(self, x, up_sum, weight_sum, round_):
        mean = super().aggregate(x, up_sum, weight_sum, round_)
        self.gap = lora.product_gap(mean, x.double(), self.layout)
        for pair in self.layout:        # measured, never applied: the buffers stay zero
            pair.D(mean).zero_()
        return mean

    def round_metrics(self):
        return {"lora_product_gap": self.gap}


@dataclass(frozen=True)
class FfaLoraKeys(AlgorithmKeys):
    name: str = "ffa_lora"


@register
class FfaLora(FedAvg):
    name = "ffa_lora"
    Keys = FfaLoraKeys

    @classmethod
    def prepare_model(cls, keys, module):
        for name, param in module.named_parameters():
            if fnmatch.fnmatchcase(name, lora.ADAPTER_A):
                param.requires_grad_(False)

    @classmethod
    def check(cls, cfg, model):
        lora.require_adapters(cfg, model, (lora.ADAPTER_B,))
        super().check(cfg, model)


@dataclass(frozen=True)
class FedSaLoraKeys(AlgorithmKeys):
    name: str = "fedsa_lora"


@register
class FedSaLora(FedAvg):
    name = "fedsa_lora"
    Keys = FedSaLoraKeys
    personal = (lora.ADAPTER_B,)
    nothing_personal_hint = "it needs a model with LoRA adapters (B is each client's own)"

    @classmethod
    def check(cls, cfg, model):
        lora.require_adapters(cfg, model)
        super().check(cfg, model)
