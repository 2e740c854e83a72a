"""FedSkip (papers/001; ALGORITHMS.md "FedSkip"; follows the authors' public code).

S model slots persist between aggregations. Each round a fresh draw picks S clients and a random order
(stream (seed, SELECT, round, 1)); slot j trains on the j-th client of that order, starting from its own
parameters, and its weight accumulates that client's n_i. In rounds with (t + 1) mod delta == 0 the slots
are averaged with their accumulated weights into x (x += eta_g * (average - x)), the slots reset to x and
the global model is evaluated; otherwise the slots keep their parameters and the next draw scatters them
to new clients ("skip aggregation"). With delta = 1 FedSkip is FedAvg.

A slot lives on the rank hosting its current client; the round loop moves it to the next client's rank
with point-to-point transfers planned from the draw that every rank computes itself. Slot weights are
derived from the draws too, so only the slot vectors are state (checkpointed under the client that holds
each slot at the end of a round). Client drift variance, the weighted mean squared distance of the slots
from their weighted average, is logged at aggregation rounds (`drift`).
"""

import numpy as np
import torch

from fedmpi import rng
from fedmpi.algorithms.base import Algorithm

ORDER_KEY = 1


class FedSkip(Algorithm):
    name = "fedskip"
    protocol = "route"
    up_scalars = 1            # sum_j w_j ||slot_j - x||^2, for the drift variance

    def __init__(self, cfg, dim, n_params):
        super().__init__(cfg, dim, n_params)
        self.delta = self.keys.delta
        self.slots = {}           # slot index -> vector, on the rank hosting the slot's current client
        self.drift = np.nan

    # -- the plan every rank derives from the seed ------------------------------------------------
    def order(self, round_, selected):
        """The round's clients in slot order: slot j trains on order[j]."""
        return rng.stream(self.cfg.seed, rng.SELECT, round_, ORDER_KEY).permutation(np.asarray(selected))

    def is_period_start(self, round_):
        return round_ % self.delta == 0

    def is_aggregation(self, round_):
        return (round_ + 1) % self.delta == 0

    def previous_round(self, round_):
        return None if self.is_period_start(round_) else round_ - 1

    def slot_weights(self, round_, sizes_fn):
        """Accumulated weight of every slot from the period's first round up to `round_`."""
        first = round_ - round_ % self.delta
        total = np.zeros(self.cfg.server.clients_per_round)
        for s in range(first, round_ + 1):
            total += [sizes_fn(c) for c in self.order(s, rng.select_clients(
                self.cfg.seed, s, self.cfg.partition.clients, self.cfg.server.clients_per_round))]
        return total

    # -- slot training (worker side) --------------------------------------------------------------
    def start_slot(self, slot, start, model):
        model.load(self.slots[slot] if slot in self.slots else start)

    def finish_slot(self, slot, model):
        self.slots[slot] = model.vec.clone()

    def accumulate_slots(self, start, weights, acc):
        """Aggregation round: adds w_j (slot_j - x) and w_j ||slot_j - x||^2 for the slots held here."""
        for slot in sorted(self.slots):
            d = self.slots[slot] - start
            acc[: self.dim].add_(d, alpha=float(weights[slot]))
            acc[self.dim] += float(weights[slot]) * float(torch.dot(d.double(), d.double()))
        held = float(sum(weights[j] for j in self.slots))
        self.slots.clear()
        return held

    def server_update(self, x, up_sum, weight_sum, round_):
        if weight_sum > 0:
            mean = up_sum[: self.dim] / weight_sum
            self.drift = float(up_sum[self.dim]) / weight_sum - float(torch.dot(mean, mean))
        return super().server_update(x, up_sum, weight_sum, round_)

    def round_metrics(self):
        out, self.drift = {"drift": self.drift}, np.nan
        return out

    # -- state for checkpoints: a slot is stored under the client that holds it after the round ----
    def held_slots(self, round_, selected, hosted):
        """{client id: slot} for the slots held on this rank after `round_` (none after an aggregation)."""
        if self.is_aggregation(round_):
            return {}
        return {int(c): j for j, c in enumerate(self.order(round_, selected)) if int(c) in hosted}

    def client_state(self, cid):
        holder = getattr(self, "holders", {}).get(cid)
        if holder is None or holder not in self.slots:
            return {}
        return {"slot": self.slots[holder].detach().cpu().numpy(), "slot_index": np.array(holder)}

    def load_client_state(self, cid, state):
        if "slot" in state:
            self.slots[int(state["slot_index"])] = torch.as_tensor(np.asarray(state["slot"]))
