"""The round plans of a counterfactual run: the original's plan with the declared clients dropped or removed.

`drop`: the provider's plan is taken as it is (the same selection, the same clients trained from the same
starts with the same batches) and the dropped clients' updates are marked as not counting, the path a client
that drops out takes in every transport (its update and its state are lost; the round's average is over the
others). Nothing else in the round reads whom the plan counts, which is what makes the counterfactual exact:
tests/test_counterfactual_mpi.py holds it to the original bit for bit where the dropped client's update counts
for nothing.

`remove`: the standard draw over the clients that remain (`availability.select_available`: the same stream
as `rng.select_clients`, over fewer clients, so any round's selection may differ). Only the standard draw
is redrawn; the other providers' plans (deployment, Poisson sampling, FedBuff's arrivals, plug-ins)
carry their own state and are refused by resolve (fedmpi.counterfactual.checks).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedmpi.deploy.availability import select_available
from fedmpi.plans.base import Participation


class RemovedClients(Participation):
    """The standard draw among the clients not removed."""

    def __init__(self, algo, *, seed, num_clients, clients_per_round, removed, from_round=0):
        super().__init__(algo, seed=seed, num_clients=num_clients, clients_per_round=clients_per_round)
        self.present = ~np.isin(np.arange(num_clients), np.asarray(removed, dtype=np.int64))
        self.from_round = from_round

    def standard(self, t):
        if t < self.from_round:
            return super().standard(t)
        return select_available(self.seed, t, self.present, self.clients_per_round)


class DroppedUploads(Participation):
    """Another provider's plans with the dropped clients' updates not counting (a wrapper: its state, its
    settling and its clock are the provider's own)."""

    def __init__(self, inner, dropped, from_round=0):
        self.inner, self.dropped, self.from_round = inner, np.asarray(dropped, dtype=np.int64), from_round
        self.dropped_ids = frozenset(int(c) for c in dropped)
        self.algo = inner.algo

    def plan(self, t):
        plan = self.inner.plan(t)
        if t < self.from_round:
            return plan
        counted = plan.counts_mask() & ~np.isin(plan.selected, self.dropped)
        return dataclasses.replace(plan, counted=counted)

    def settle(self, plan, comm, uploaders):
        self.inner.settle(plan, comm, uploaders)

    def counted(self, t, cid) -> bool:
        dropped = t >= self.from_round and int(cid) in self.dropped_ids
        return not dropped and self.inner.counted(t, cid)

    def done(self, plan):
        self.inner.done(plan)

    def state(self) -> dict:
        return self.inner.state()

    def load_state(self, state: dict):
        self.inner.load_state(state)

    def __getattr__(self, name):        # a provider's own fields (FedBuff's arrivals) stay reachable
        return getattr(self.inner, name)


def counterfactual_plans(participation, counterfactual, *, seed, num_clients, clients_per_round):
    """The run's provider under `counterfactual` (the section): unchanged at its defaults."""
    if counterfactual.remove:
        participation = RemovedClients(participation.algo, seed=seed, num_clients=num_clients,
                                       clients_per_round=clients_per_round, removed=counterfactual.remove,
                                       from_round=counterfactual.from_round)
    if counterfactual.drop:
        participation = DroppedUploads(participation, counterfactual.drop, counterfactual.from_round)
    return participation
