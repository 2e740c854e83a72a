"""The four protocol families an algorithm subclasses instead of `Algorithm` itself (fedmpi.algorithms.base
describes the contract): `Reduce` (one Reduce of weighted uploads), `SlotRouting` (model slots moved between
ranks), `GatedUploads` (a masked Gatherv of the uploaders' vectors) and `BufferedUploads` (updates held until
their simulated arrival), each setting `protocol` and declaring the hooks its round needs; and FedAvg's
weighted mean, which most REDUCE algorithms aggregate with."""

from __future__ import annotations

import abc

import numpy as np

from fedmpi.algorithms.hooks import BUFFER, GATHER, REDUCE, ROUTE, Algorithm, ClientRun
from fedmpi.core.lazy import torch


def weighted_mean_update(up_sum, weight_sum, dim, out=None):
    """FedAvg's aggregate: (sum_i w_i Delta_i) / (sum_i w_i), or None when nobody uploaded. `out`, a float64
    vector of `dim` entries on up_sum's device, is reused instead of allocating a model-sized vector (a new
    one is returned when it does not fit)."""
    if weight_sum <= 0:
        return None
    if out is None or out.shape != (dim,) or out.device != up_sum.device or out.dtype != up_sum.dtype:
        out = torch.empty(dim, dtype=up_sum.dtype, device=up_sum.device)
    return torch.div(up_sum[:dim], weight_sum, out=out)


class Reduce(Algorithm):
    """Family: every selected client adds its weighted upload into one accumulator; one Reduce."""

    protocol = REDUCE

    @abc.abstractmethod
    def accumulate(self, run: ClientRun, down: torch.Tensor, model, acc: torch.Tensor) -> float:
        """Adds this client's upload to `acc` (float64); returns its weight."""


class SlotRouting(Algorithm):
    """Family: model slots persist between aggregations and move between the ranks hosting consecutive
    clients (FedSkip). Every rank derives the plan (`order`, periods, weights) from the seed itself."""

    protocol = ROUTE
    keeps_client_state = True
    fixed_cohort_only = "its model slots are laid out for exactly server.clients_per_round clients per round"

    @abc.abstractmethod
    def order(self, round_, selected):
        """The round's clients in slot order: slot j trains on order[j]."""

    @abc.abstractmethod
    def is_period_start(self, round_) -> bool:
        """Slots start from the broadcast global model this round."""

    @abc.abstractmethod
    def is_aggregation(self, round_) -> bool:
        """The slots are averaged into x at the end of this round."""

    @abc.abstractmethod
    def start_slot(self, run: ClientRun, slot, start, model):
        """Loads slot `slot` (or `start`, the period's global model, if it has none here) into `model`."""

    @abc.abstractmethod
    def finish_slot(self, run: ClientRun, slot, model):
        """Keeps the trained `model` as slot `slot`, now held by client `run.cid`."""

    @abc.abstractmethod
    def take_slot(self, slot) -> torch.Tensor:
        """Removes slot `slot` from this rank (it moves to another); returns its vector."""

    @abc.abstractmethod
    def put_slot(self, slot, vec: torch.Tensor):
        """Receives slot `slot` from another rank."""

    @abc.abstractmethod
    def slot_weights(self, round_, weight_of) -> np.ndarray:
        """Accumulated weight of every slot from the period's first round up to `round_`; `weight_of(s, cid)`
        is client cid's weight in round s (its sample count, 0 where its update did not count)."""

    @abc.abstractmethod
    def accumulate_slots(self, start, weights, acc) -> float:
        """Aggregation round: adds the slots held here into `acc`, drops them; returns their weight."""


class GatedUploads(Algorithm):
    """Family: clients decide after training whether to upload (SAFL's gating); the server gathers the
    mask, then only the uploaders' vectors (masked Gatherv), and fuses them in client-id order."""

    protocol = GATHER
    keeps_client_state = True

    @abc.abstractmethod
    def gate(self, run: ClientRun, down: torch.Tensor, model) -> bool:
        """Whether this client, whose trained vector is in `model`, uploads it."""

    @abc.abstractmethod
    def fusion_weight(self, n_samples, z: torch.Tensor, x: torch.Tensor) -> float:
        """The server's weight of an uploaded vector `z` given the current global `x`."""


class BufferedUploads(Algorithm):
    """Family: asynchronous clients on the simulated clock (FedBuff). A client trains in the round of the
    model version it starts from and holds its update until the round in which its upload arrives; the
    participation provider (fedmpi.deploy.buffered) plans who starts and who arrives, the same on every rank.
    The arrivals are added into one accumulator and reduced like REDUCE uploads."""

    protocol = BUFFER
    keeps_client_state = True

    @abc.abstractmethod
    def hold(self, run: ClientRun, down: torch.Tensor, model):
        """Keeps the update of client `run.cid`, trained from version `run.round` (the broadcast `down`)."""

    @abc.abstractmethod
    def release(self, cid, version, round_, acc: torch.Tensor) -> float:
        """Adds the held update of `cid` trained from `version`, arriving in round `round_`, to `acc`;
        returns its weight."""
