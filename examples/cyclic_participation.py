"""Walk-through 7 of docs/how-to/own-algorithm.md: a participation provider in one file, run by
`participation: {name: examples.cyclic_participation:Cyclic, keys: {groups: 2}}`.

Cyclic participation (Cho et al., "On the Convergence of Federated Averaging with Cyclic Client
Participation", ICML 2023): the clients form `groups` fixed groups by id (client i in group i mod groups),
and round t draws its server.clients_per_round clients from group t mod groups only, uniformly without
replacement from its own stream (seed, SELECT, round, CYCLIC). Every rank draws the same cohort.
"""

import numpy as np

from fedmpi.core import rng
from fedmpi.core.config_checks import Range
from fedmpi.plans.base import Participation

CYCLIC = 7      # the key after (seed, SELECT, round) of this provider's stream


class Cyclic(Participation):
    reads = ("seed", "partition", "server", "participation")   # the sections build() takes
    uses = ("groups",)                                         # the participation.keys it reads
    RANGES = {"groups": Range(1, 10 ** 8)}                     # checked at set-up: 0 groups divides by zero
    INTEGERS = ("groups",)
    protocols = ("reduce", "gather")                           # the algorithm families it plans for

    @classmethod
    def build(cls, setting, *, seed, partition, server, participation):
        return cls(setting.algo, seed=seed, num_clients=partition.clients,
                   clients_per_round=server.clients_per_round, groups=participation.keys.get("groups", 2))

    def __init__(self, algo, *, seed, num_clients, clients_per_round, groups):
        super().__init__(algo, seed=seed, num_clients=num_clients, clients_per_round=clients_per_round)
        self.groups = groups

    def standard(self, t):
        # the round's draw, before the algorithm's `select` (Participation.plan): a pure function of the
        # seed and the round, so every rank plans the same round and a resumed run continues it
        group = np.arange(t % self.groups, self.partition_clients, self.groups)
        size = min(self.clients_per_round, len(group))
        return np.sort(rng.stream(self.seed, rng.SELECT, t, CYCLIC).choice(group, size=size, replace=False))
