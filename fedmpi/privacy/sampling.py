"""`server.sampling: poisson`: the round plan of Poisson sampling (docs/how-to/privacy.md, "One round").

Every client joins round t independently with rate q = server.clients_per_round / partition.clients, drawn
from (seed, SELECT, t, POISSON_KEY) by every rank alike, so the cohort does not depend on `-n`. The draw is
the round's standard draw and, through the algorithm's `select`, its cohort. It may be empty: the round
still runs (under privacy, rank 0 still adds the round's noise, which the accountant counts).
"""

from __future__ import annotations

from fedmpi.core.errors import ConfigError
from fedmpi.plans.base import Participation
from fedmpi.privacy.mechanism import poisson_rate, poisson_select


class PoissonSampling(Participation):
    @classmethod
    def check(cls, cfg, algo_cls):
        """Refuses an algorithm that declares its rounds need the fixed-size draw (`fixed_cohort_only`:
        central SGD, the SlotRouting family)."""
        name = cfg.algorithm.name
        why = algo_cls.fixed_cohort_only
        if why:
            raise ConfigError(f"server.sampling = 'poisson' with algorithm.name = {name!r}: {why}; use "
                              f"server.sampling: fixed")

    reads = ("seed", "partition", "server")

    @classmethod
    def build(cls, setting, *, seed, partition, server):
        """The provider under `server.sampling: poisson`; None otherwise."""
        if server.sampling != "poisson":
            return None
        return cls(setting.algo, seed=seed, num_clients=partition.clients, clients_per_round=server.clients_per_round)

    def __init__(self, algo, *, seed, num_clients, clients_per_round):
        super().__init__(algo, seed=seed, num_clients=num_clients, clients_per_round=clients_per_round)
        self.rate = poisson_rate(clients_per_round, num_clients)

    def standard(self, t):
        return poisson_select(self.seed, t, self.partition_clients, self.rate)
