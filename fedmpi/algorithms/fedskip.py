"""FedSkip ("FedSkip: Combatting Statistical Heterogeneity with Federated Skip Aggregation";
docs/explanation/algorithms.md "FedSkip"; follows the authors' public code).

S model slots persist between aggregations. Each round a fresh draw picks S clients and a random order
(stream (seed, SELECT, round, 1)); slot j trains on the j-th client of that order, starting from its own
parameters, and its weight accumulates that client's n_i. In rounds with (t + 1) mod delta == 0 the slots
are averaged with their accumulated weights into the update (x += eta_g * (average - x) under `sgd`), the
slots reset to x and the global model is evaluated; otherwise the slots keep their parameters and the next
draw scatters them to new clients ("skip aggregation"). With delta = 1 FedSkip is FedAvg.

A slot lives on the rank hosting its current client; the round loop moves it to the next client's rank
with point-to-point transfers planned from the draw that every rank computes itself. Slot weights are
derived from the period's draws too, which the participation history answers (`context.history.selected(s)`,
the provider's plan of round s, the same on every rank), so only the slot vectors are state (checkpointed
under the client that holds each slot at the end of a round). Client drift variance, the weighted mean
squared distance of the slots from their weighted average, is logged at aggregation rounds (`drift`).
"""

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fedmpi.algorithms.base import AlgorithmKeys, SlotRouting, weighted_mean_update
from fedmpi.algorithms.catalog import register
from fedmpi.core import rng
from fedmpi.core.config_checks import count
from fedmpi.core.lazy import torch

ORDER_KEY = 1


@dataclass(frozen=True)
class FedSkipKeys(AlgorithmKeys):
    name: str = "fedskip"
    delta: int = 3
    """Rounds per aggregation period (slots skip aggregation delta - 1 times); 1 = FedAvg."""

    RANGES: ClassVar[dict] = {"delta": count()}


@register
class FedSkip(SlotRouting):
    name = "fedskip"
    Keys = FedSkipKeys
    up_scalars = 1            # sum_j w_j ||slot_j - x||^2, for the drift variance

    @classmethod
    def privacy_problems(cls, keys, client_steps):
        return ["slots carry one client's trained model to the next client without clipping or noise, and "
                "the slots are averaged with weights n_i"]

    def __init__(self, keys, context):
        super().__init__(keys, context)
        self.delta = self.keys.delta
        self.slots = {}           # slot index -> vector, on the rank hosting the slot's current client
        self.holders = {}         # client id -> slot index it holds after the latest round trained here
        self._holders_round = None
        self.drift = np.nan

    # -- the plan every rank derives from the seed ------------------------------------------------
    def order(self, round_, selected):
        return rng.stream(self.context.seed, rng.SELECT, round_, ORDER_KEY).permutation(np.asarray(selected))

    def is_period_start(self, round_):
        return round_ % self.delta == 0

    def is_aggregation(self, round_):
        return (round_ + 1) % self.delta == 0

    def slot_weights(self, round_, weight_of):
        first = round_ - round_ % self.delta
        total = np.zeros(self.context.clients_per_round)
        for s in range(first, round_ + 1):     # the period's rounds: who trained is the participation's answer
            total += [weight_of(s, c) for c in self.order(s, self.context.history.selected(s))]
        return total

    # -- slot training (worker side) --------------------------------------------------------------
    def start_slot(self, run, slot, start, model):
        model.load(self.slots[slot] if slot in self.slots else start)

    def finish_slot(self, run, slot, model):
        if self._holders_round != run.round:       # a new round: last round's holders moved on
            self.holders, self._holders_round = {}, run.round
        self.slots[slot] = model.vec.clone()
        self.holders[run.cid] = slot

    def take_slot(self, slot):
        self.holders = {cid: held for cid, held in self.holders.items() if held != slot}
        return self.slots.pop(slot)

    def put_slot(self, slot, vec):
        self.slots[slot] = vec

    def accumulate_slots(self, start, weights, acc):
        """Adds w_j (slot_j - x) and w_j ||slot_j - x||^2 for the slots held here."""
        for slot in sorted(self.slots):
            d = self.slots[slot] - start
            acc[: self.dim].add_(d, alpha=float(weights[slot]))
            acc[self.dim] += float(weights[slot]) * float(torch.dot(d.double(), d.double()))
        held = float(sum(weights[j] for j in self.slots))
        self.slots.clear()
        self.holders.clear()
        return held

    # -- server ---------------------------------------------------------------------------------
    def aggregate(self, x, up_sum, weight_sum, round_):
        mean = weighted_mean_update(up_sum, weight_sum, self.dim)
        if mean is not None:
            self.drift = float(up_sum[self.dim]) / weight_sum - float(torch.dot(mean, mean))
        return mean

    def round_metrics(self):
        out, self.drift = {"drift": self.drift}, np.nan
        return out

    # -- state for checkpoints: a slot is stored under the client that holds it after the round ----
    def client_state(self, cid):
        slot = self.holders.get(cid)
        if slot is None or slot not in self.slots:
            return {}
        return {"slot": self.slots[slot].detach().cpu().numpy(), "slot_index": np.array(slot)}

    def load_client_state(self, cid, state):
        if "slot" in state:
            slot = int(state["slot_index"])
            self.slots[slot] = torch.as_tensor(np.asarray(state["slot"]))
            self.holders[cid] = slot
