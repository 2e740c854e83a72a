"""HetLoRA (Cho, Manoel, Joshi, Sim, Dimitriadis, "Heterogeneous LoRA for Federated Fine-tuning of On-Device
Foundation Models", EMNLP 2024): clients train LoRA adapters of different ranks.

Each client has a rank r_k from `ranks` (client cid gets ranks[cid mod len] under `rank_assignment: cycle`,
a seeded draw from (seed, INIT, 55, cid) under `draw`; the same on every rank and in every round), the
largest of which must be the model's LoRA rank r (the global adapters' size). At client_start the global
adapters are truncated to the client's rank: A's rows and B's columns at or past r_k are set to zero, and
their gradients are masked to zero at every local step, so the client trains an r_k-rank adapter (with the
model's scaling alpha / r: the first r_k ranks of the global adapter, not a new rank-r_k LoRA). The upload
is the change of that zero-padded adapter from the broadcast, so the server's mean is the zero-padded
aggregation of the paper: every client's adapter padded with zeros to rank r, averaged entry by entry.
`aggregation` picks the weights: `sparsity` (the paper's sparsity-weighted aggregation, p_k proportional to
||Delta W_k||_F = ||s B_k A_k||_F, here the Frobenius norm over every LoRA layer together) or `mean`
(FedAvg's n_k weights).

Rank self-pruning (the paper's local training with rank self-pruning; on with `prune_lambda` > 0): a
client of rank r_k adds to its loss lambda ||s B_tail A_tail||_F, the product of its last ranks
floor(gamma r_k)..r_k (gamma = `prune_decay`; the Frobenius norm over every LoRA layer together), which drives
those ranks towards zero; after training, when that norm is below the one its previous round ended with, the
client prunes: its rank becomes floor(gamma r_k) (at least 1) for the rest of the run, and its upload already
leaves the pruned ranks out (zero, as a lower-rank client's). Each client's current rank and last tail norm
are client state (/clients/<cid>/lora_rank, tail_norm: checkpointed), and every trained client's rank is
recorded per round (/clients/lora_rank). No authors' code is public: the rule is checked against
hand-computed cases (tests/test_lora_rules.py); the regulariser and the pruning condition are written from
the paper's description, not ported from code.

The rank masks are shared with FLoRA (`RankedClients`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

from fedmpi.algorithms import lora
from fedmpi.algorithms.base import AlgorithmKeys
from fedmpi.algorithms.catalog import register
from fedmpi.algorithms.fedavg import FedAvg
from fedmpi.algorithms.state import ClientVectors
from fedmpi.core.config_checks import Checks, Range, factor
from fedmpi.core.errors import ConfigError
from fedmpi.core.lazy import torch


class RankedClients:
    """Per-client LoRA ranks for an algorithm with `keys.ranks` and `keys.rank_assignment`: the truncation at
    client_start and the gradient mask. `ranks: []` leaves every client at the model's rank. A mixin before the
    algorithm's base class (its setup and client_start call on to it)."""

    @classmethod
    def check_rank_keys(cls, cfg):
        c = Checks("algorithm")
        values = list(cfg.algorithm.ranks)
        c.require(all(isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in values), "ranks", values,
                  "every rank must be an integer >= 1 (and the largest the model's LoRA rank)")
        c.require(cfg.algorithm.rank_assignment in ("cycle", "draw"), "rank_assignment",
                  cfg.algorithm.rank_assignment, "must be 'cycle' or 'draw'")
        c.done()

    @classmethod
    def check_ranks_fit(cls, keys, module):
        """ConfigError naming algorithm.ranks unless its largest rank is the model's LoRA rank (known once the
        model is built: asked from `prepare_model`, on every rank alike, before any file, --dry-run included)."""
        layers = lora.lora_layers(module)
        ranks = list(keys.ranks)
        if not layers or not ranks:
            return          # no adapters: check() refuses the model; no ranks: every client at the full rank
        full = max(int(layer.lora_A[key].weight.shape[0]) for _, layer, key in layers)
        if max(ranks) != full or min(ranks) < 1:
            raise ConfigError(f"algorithm.ranks = {ranks}: every rank must be in 1..{full} and the largest "
                              f"{full}, the model's LoRA rank (the global adapters' size)")

    def setup(self, ctx):
        super().setup(ctx)
        self.setup_ranks(ctx.model)

    def client_start(self, run, down, model):
        super().client_start(run, down, model)
        self.truncate(run, model)

    def setup_ranks(self, flat):
        """The adapters' layout on this rank's model and the full rank (the global adapters')."""
        self.layout = lora.adapter_layout(flat)
        self._masks, self._mask = {}, None
        self.full_rank = max(p.rank for p in self.layout)

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
    prune_lambda: float = 0.0
    """Rank self-pruning's regularisation weight lambda on the last ranks' product norm; 0: no pruning."""
    prune_decay: float = 0.9
    """Rank self-pruning's gamma in (0, 1): the last ranks are those from floor(gamma r_k) on, the rank after a
    prune floor(gamma r_k) (at least 1)."""

    RANGES: ClassVar[dict] = {"prune_lambda": factor(), "prune_decay": Range(0, 1, low_open=True, high_open=True)}


@register
class HetLora(RankedClients, FedAvg):
    name = "hetlora"
    Keys = HetLoraKeys
    vectorizable = False        # the gradient mask is a per-client grad_hook

    @classmethod
    def form(cls, keys):
        return FORMS[(keys.aggregation == "sparsity", keys.prune_lambda > 0)]

    @classmethod
    def prepare_model(cls, keys, module):
        cls.check_ranks_fit(keys, module)

    @classmethod
    def check(cls, cfg, model):
        lora.require_adapters(cfg, model)
        c = Checks("algorithm")
        c.require(bool(cfg.algorithm.ranks), "ranks", list(cfg.algorithm.ranks),
                  "set the clients' ranks (e.g. [2, 4, 8] for a model of LoRA rank 8): with none, every client "
                  "trains the full rank, which is algorithm.name = 'fedit'")
        c.require(cfg.algorithm.aggregation in ("sparsity", "mean"), "aggregation", cfg.algorithm.aggregation,
                  "must be 'sparsity' or 'mean'")
        c.require(cfg.algorithm.aggregation != "sparsity" or cfg.server.aggregator == "mean", "aggregation",
                  cfg.algorithm.aggregation, f"server.aggregator = {cfg.server.aggregator!r} weighs the uploads by "
                  f"their sample counts, not by the sparsity weights; use algorithm.aggregation = 'mean'")
        c.done()
        cls.check_rank_keys(cfg)
        super().check(cfg, model)

    @classmethod
    def privacy_problems(cls, keys, client_steps):
        if keys.aggregation == "sparsity":
            return ["its sparsity weights ||B_k A_k||_F come from each client's training and are neither clipped "
                    "nor bounded (use algorithm.aggregation = 'mean')"]
        return []

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


class HetLoraPruning(HetLora):
    """HetLoRA with rank self-pruning (`prune_lambda` > 0): each client's rank and last tail norm are its state."""

    keeps_client_state = True
    client_columns = ("lora_rank",)

    def __init__(self, keys, context):
        super().__init__(keys, context)
        self.ranks_now = ClientVectors("lora_rank", length=1, whole=True)     # a client's rank once it pruned
        self.tail_norms = ClientVectors("tail_norm", length=1)                # its tail norm after its last round
        self._flat, self._rank = None, 0

    def rank_of(self, cid) -> int:
        mine = self.ranks_now.on(cid, "cpu")
        return int(mine[0]) if mine is not None else super().rank_of(cid)

    def tail(self, rank) -> int:
        """The first of a client's last ranks (those it regularises and would prune): floor(gamma r), >= 1."""
        return max(1, math.floor(self.keys.prune_decay * rank))

    def client_start(self, run, down, model):
        super().client_start(run, down, model)
        self._flat, self._rank = model, self.rank_of(run.cid)

    def tail_norm(self, rank):
        """||s B_tail A_tail||_F over every LoRA layer, from the module's parameters (autograd reaches them)."""
        low = self.tail(rank)
        if low >= rank:
            return torch.zeros(())
        parts = [(layer.scaling[key] * (layer.lora_B[key].weight[:, low:rank] @ layer.lora_A[key].weight[low:rank]))
                 .reshape(-1) for _, layer, key in lora.lora_layers(self._flat.module)]
        # vector_norm's gradient at a zero norm is zero (B starts at zero), where sqrt(sum of squares) gives NaN
        return torch.linalg.vector_norm(torch.cat(parts))

    def loss_fn(self, xb, yb):
        logits = self._flat.module(xb)
        loss = torch.nn.functional.cross_entropy(logits, yb)
        if self.tail(self._rank) < self._rank:
            loss = loss + self.keys.prune_lambda * self.tail_norm(self._rank)
        return loss

    def accumulate(self, run, down, model, acc):
        rank = self._rank
        with torch.no_grad():
            now = self.tail_norm(rank).to(torch.float32).reshape(1).cpu()
        before = self.tail_norms.on(run.cid, "cpu")
        if before is not None and self.tail(rank) < rank and float(now[0]) < float(before[0]):
            rank = self.tail(rank)          # prune: the last ranks leave this upload and every later round
            model.vec.detach()[: self.n_params].mul_(lora.rank_mask(self.layout, rank, self.n_params, model.device))
            self.ranks_now[run.cid] = torch.tensor([float(rank)])
        self.tail_norms[run.cid] = now
        run.figures["lora_rank"] = float(rank)
        return super().accumulate(run, down, model, acc)


class HetLoraSparsity(HetLora):
    """HetLoRA with the paper's sparsity weights: a robust aggregator weighs uploads by sample counts, so none
    may replace its mean (refused at set-up, exit 2)."""

    robust_aggregation = False


class HetLoraPruningSparsity(HetLoraPruning):
    """Rank self-pruning with the sparsity weights (see HetLoraSparsity)."""

    robust_aggregation = False


# (sparsity weights, rank self-pruning) -> the class that runs them
FORMS = {(False, False): HetLora, (True, False): HetLoraSparsity, (False, True): HetLoraPruning,
         (True, True): HetLoraPruningSparsity}
