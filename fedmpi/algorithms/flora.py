"""FLoRA (Wang, Shen, Xu, Cheng, Wang, Xu, "FLoRA: Federated Fine-Tuning Large Language Models with
Heterogeneous Low-Rank Adaptations", NeurIPS 2024; reference ATP-1010/FederatedLLM).

The reference stacks the clients' adapters (fed_utils/model_aggregation.py at 0912cd3, lines 58-91):
A_stack = [p_1 A_1; ...; p_K A_K] along the rank axis, B_stack = [B_1, ..., B_K] along it too, so
B_stack A_stack = sum_k p_k B_k A_k, the exact weighted sum of the clients' products; the server merges it
into its copy of the base model and every client starts the next round from new adapters.

Here: `prepare_model` adds to every LoRA layer's base layer a float buffer `lora_delta` (d_out x d_in, zeros)
that the base layer's forward adds, (W_base + delta) x; the buffer is in the flat vector, so it is the merged
part of the global model. A client trains A and B from the broadcast and uploads s B_k A_k on the delta
entries (and its adapters' change on theirs); the weighted mean of the uploads is then sum p_k s B_k A_k on
the delta entries, the stacking's product up to float64 summation, which the server adds to delta. The
server step must be x + update (server.optimizer sgd, server.lr 1, constant schedule: refused otherwise).
`after_step` then re-initialises the adapters for the next round: A from the seeded draw (seed, INIT, 54,
t + 1) with peft's default distribution, B = 0, identical on every rank. The adapters' mean is used for
/metrics/lora_product_gap only (what FedIT's separate averaging would have held) and never applied.

Heterogeneous ranks (`ranks`, `rank_assignment`): as HetLoRA's, a client trains only its first r_k ranks
(fedmpi.algorithms.hetlora.RankedClients); its product is then that of its r_k-rank adapters, as the
reference's stacking of adapters of different ranks gives.

Differences from the reference. The wire: FLoRA moves each client's adapters up (r_k (d_in + d_out) floats
per layer) and the stacked adapters down; fedmpi moves the flat vector, the delta buffers (d_out x d_in per
layer) included, so bytes_up and bytes_down count those instead. The scaling: the reference merges B_stack
A_stack with the scaling of its new LoRA config; here each client's product carries the scaling its adapter
trained with, so the merged delta is exactly the weighted sum of what the clients' adapters added to their
models' outputs. That scaling is the model's s = alpha / r for every client: a client of rank r_k trains the
first r_k ranks of the rank-r adapter (where the reference builds a rank-r_k LoRA config, alpha / r_k).
Robust aggregators are refused (a coordinate rule over products and adapters is no longer FLoRA's sum).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fedmpi.algorithms import lora
from fedmpi.algorithms.base import AlgorithmKeys
from fedmpi.algorithms.catalog import register
from fedmpi.algorithms.fedavg import FedAvg
from fedmpi.algorithms.hetlora import RankedClients
from fedmpi.core.config_checks import Checks


@dataclass(frozen=True)
class FloraKeys(AlgorithmKeys):
    name: str = "flora"
    ranks: tuple[int, ...] = ()
    """The clients' LoRA ranks (as hetlora's: each in 1..r, the largest r); []: every client at the model's rank."""
    rank_assignment: Literal["cycle", "draw"] = "cycle"
    """Which rank a client gets: ranks[cid mod len(ranks)] (cycle) or a seeded draw from `ranks` (draw)."""


@register
class Flora(RankedClients, FedAvg):
    name = "flora"
    Keys = FloraKeys
    vectorizable = False        # its accumulate writes the products into the trained vector
    robust_aggregation = False

    @classmethod
    def prepare_model(cls, keys, module):
        cls.check_ranks_fit(keys, module)
        lora.add_delta_buffers(module, in_forward=True)

    @classmethod
    def check(cls, cfg, model):
        lora.require_adapters(cfg, model)
        cls.check_rank_keys(cfg)
        c = Checks("server")
        why = (f"algorithm.name = {cfg.algorithm.name!r} adds the clients' summed products to the merged base as "
               f"they are (x + update)")
        c.require(cfg.server.optimizer == "sgd", "optimizer", cfg.server.optimizer, f"{why}; use sgd")
        c.require(cfg.server.lr == 1.0, "lr", cfg.server.lr, f"{why}; use 1")
        c.require(cfg.server.lr_schedule.name == "constant", "lr_schedule", cfg.server.lr_schedule.name,
                  f"{why}; use constant")
        c.done()
        super().check(cfg, model)

    def __init__(self, keys, context):
        super().__init__(keys, context)
        self.gap = float("nan")
        if keys.ranks:
            self.grad_hook = self.mask_gradient

    def accumulate(self, run, down, model, acc):
        lora.write_products(model.vec.detach(), down[: self.dim], self.layout)
        return super().accumulate(run, down, model, acc)

    def aggregate(self, x, up_sum, weight_sum, round_):
        if weight_sum <= 0:
            return None
        mean = super().aggregate(x, up_sum, weight_sum, round_)
        self.gap = lora.product_gap(mean, x.double(), self.layout)
        for pair in self.layout:        # the adapters restart next round: only the products are merged
            pair.A(mean).zero_()
            pair.B(mean).zero_()
        return mean

    def after_step(self, x, round_):
        lora.fresh_adapters(x, self.layout, self.context.seed, round_ + 1)
        return x

    def round_metrics(self):
        return {"lora_product_gap": self.gap}
