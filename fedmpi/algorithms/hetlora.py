"""HetLoRA (Cho, Manoel, Joshi, Sim, Dimitriadis, "Heterogeneous LoRA for Federated Fine-tuning of On-Device
Foundation Models", EMNLP 2024): clients train LoRA adapters of different ranks.

Each client has a rank r_k from `ranks` (client cid gets ranks[cid mod len] under `rank_assignment: cycle`,
a seeded draw from (seed, INIT, 55, cid) under `draw`; the same on every rank and in every round), the
largest of which must be the model's LoRA rank r (the global adapters' size). At client_start the global
adapters are truncated to the client's rank: A's rows and B's columns at or past r_k are set to zero, and
their gradients are masked to zero at every local step, so the client trains an r_k-rank adapter. The upload
is the change of that zero-padded adapter from the broadcast, so the server's mean is the zero-padded
aggregation of the paper: every client's adapter padded with zeros to rank r, averaged entry by entry.
`aggregation` picks the weights: `sparsity` (the paper's sparsity-weighted aggregation, p_k proportional to
||Delta W_k||_F = ||s B_k A_k||_F, here the Frobenius norm over every LoRA layer together) or `mean`
(FedAvg's n_k weights).

What is not here: the paper's rank self-pruning (a client's regularised last ranks pruned when their norm
falls) is not implemented; clients keep their assigned rank. No authors' code is public: the rule is checked
against hand-computed cases (tests/test_lora_rules.py).

The rank masks are shared with FLoRA (`RankedClients`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from fedmpi.algorithms import lora
from fedmpi.algorithms.base import AlgorithmKeys
from fedmpi.algorithms.catalog import register
from fedmpi.algorithms.fedavg import FedAvg
from fedmpi.core.config_checks import Checks
from fedmpi.core.errors import ConfigError


class RankedClients:
    """Per-client LoRA ranks for an algorithm with `keys.ranks` and `keys.rank_assignment`: the truncation at
    client_start and the gradient mask. `ranks: []` leaves every client at the model's rank."""

    @classmethod
    def check_rank_keys(cls, cfg):
        c = Checks("algorithm")
        values = list(cfg.algorithm.ranks)
        c.require(all(isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in values), "ranks", values,
                  "every rank must be an integer >= 1 (and the largest the model's LoRA rank)")
        c.require(cfg.algorithm.rank_assignment in ("cycle", "draw"), "rank_assignment",
                  cfg.algorithm.rank_assignment, "must be 'cycle' or 'draw'")
        c.done()

    def setup_ranks(self, flat):
        """The adapters' layout on this rank's model; ConfigError naming algorithm.ranks unless its largest
        rank is the model's (known only once the model is built, on every rank alike, before any file)."""
        self.layout = lora.adapter_layout(flat)
        self._masks, self._mask = {}, None
        full = max(p.rank for p in self.layout)
        ranks = list(self.keys.ranks)
        if ranks and (max(ranks) != full or min(ranks) < 1):
            raise ConfigError(f"algorithm.ranks = {ranks}: every rank must be in 1..{full} and the largest "
                              f"{full}, the model's LoRA rank (the global adapters' size)")
        self.full_rank = full

    def rank_of(self, cid) -> int:
        if not self.keys.ranks:
            return self.full_rank
        return lora.client_rank(cid, self.keys.ranks, self.keys.rank_assignment, self.context.seed)

    def truncate(self, run, model):
        """Zeroes the model's adapter entries past client run.cid's rank and keeps the mask for the gradient
        (None when the client trains at the full rank)."""
        rank = self.rank_of(run.cid)
        if rank >= self.full_rank:
            self._mask = None
            return
        key = (rank, str(model.device))
        if key not in self._masks:
            self._masks[key] = lora.rank_mask(self.layout, rank, self.n_params, model.device)
        self._mask = self._masks[key]
        model.vec.detach()[: self.n_params].mul_(self._mask)

    def mask_gradient(self, params, grad):
        if self._mask is not None:
            grad.mul_(self._mask)


@dataclass(frozen=True)
class HetLoraKeys(AlgorithmKeys):
    name: str = "hetlora"
    ranks: tuple[int, ...] = ()
    """The clients' LoRA ranks, each in 1..r with the largest r, the model's rank (e.g. [2, 4, 8] for r = 8)."""
    rank_assignment: Literal["cycle", "draw"] = "cycle"
    """Which rank a client gets: ranks[cid mod len(ranks)] (cycle) or a seeded draw from `ranks` (draw)."""
    aggregation: Literal["sparsity", "mean"] = "sparsity"
    """Weights of the zero-padded mean: ||s B_k A_k||_F (sparsity, the paper's) or the sample counts (mean)."""


@register
class HetLora(RankedClients, FedAvg):
    name = "hetlora"
    Keys = HetLoraKeys
    vectorizable = False        # the gradient mask is a per-client grad_hook

    @classmethod
    def check(cls, cfg, model):
        lora.require_adapters(cfg, model)
        c = Checks("algorithm")
        c.require(bool(cfg.algorithm.ranks), "ranks", list(cfg.algorithm.ranks),
                  "set the clients' ranks (e.g. [2, 4, 8] for a model of LoRA rank 8): with none, every client "
                  "trains the full rank, which is algorithm.name = 'fedit'")
        c.require(cfg.algorithm.aggregation in ("sparsity", "mean"), "aggregation", cfg.algorithm.aggregation,
                  "must be 'sparsity' or 'mean'")
        c.done()
        cls.check_rank_keys(cfg)
        super().check(cfg, model)

    @classmethod
    def privacy_problems(cls, keys, client_steps):
        if keys.aggregation == "sparsity":
            return ["its sparsity weights ||B_k A_k||_F come from each client's training and are neither clipped "
                    "nor bounded (use algorithm.aggregation = 'mean')"]
        return []

    def setup(self, ctx):
        super().setup(ctx)
        self.setup_ranks(ctx.model)

    def client_start(self, run, down, model):
        super().client_start(run, down, model)
        self.truncate(run, model)

    def grad_hook(self, params, grad):
        self.mask_gradient(params, grad)

    def accumulate(self, run, down, model, acc):
        if self.keys.aggregation == "sparsity":
            vec = model.vec.detach()
            run.weight = math.sqrt(sum(float((p.product(vec).double() ** 2).sum()) for p in self.layout))
        return super().accumulate(run, down, model, acc)

    def aggregate(self, x, up_sum, weight_sum, round_):
        if weight_sum <= 0:         # every product zero (sparsity weights): nothing to average
            return None
        return super().aggregate(x, up_sum, weight_sum, round_)
