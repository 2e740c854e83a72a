"""Who takes part in a round: the plan every rank derives for round t before anything trains.

The default (`Everyone`) is fedmpi's standard draw: `clients_per_round` clients without replacement from
(seed, SELECT, round), passed through the algorithm's `select` (central SGD trains its one pseudo-client).
Other providers (client availability and dropout, deadlines, Poisson sampling for differential privacy)
return a different plan with the same fields; every one is a pure function of the config, the seed and the
round (plus state restored from checkpoints), so every rank computes the same plan without a message.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedmpi.core import rng


@dataclass
class RoundPlan:
    round: int
    standard: np.ndarray                 # the standard draw: the algorithms' `select` and `schedule` see it
    selected: np.ndarray                 # the clients that train this round
    counted: np.ndarray | None = None  # bool per `selected`: the update counts (None: every one does)
    metrics: dict = field(default_factory=dict)   # extra /metrics figures of the round (server)
    columns: dict = field(default_factory=dict)   # extra /clients rows: name -> [num_clients] float32

    def counts(self, cid) -> bool:
        if self.counted is None:
            return True
        return bool(self.counted[np.flatnonzero(self.selected == cid)[0]])

    def counts_mask(self) -> np.ndarray:
        """Bool per `selected`: whose update counts."""
        return np.ones(len(self.selected), dtype=bool) if self.counted is None else np.asarray(self.counted, bool)


@dataclass(frozen=True)
class ProviderSetting:
    """What the build of a provider knows beside its config sections: the algorithm (its declarations and
    `select`) and the sample counts of the clients it trains."""

    algo: object
    part_sizes: tuple


class Participation:
    """Provider of round plans. `state`/`load_state` carry what a resumed run needs (e.g. simulated time).
    Built from the run's `seed`, `num_clients` (partition.clients) and `clients_per_round`
    (server.clients_per_round), which the standard draw reads.

    A provider class declares `reads` (the config's sections and top-level values its `build` takes by name)
    and `build(setting, **sections)`: the provider those sections ask for, or None. The round's assembler
    asks the providers in turn (fedmpi.round.providers) and takes the first one built."""

    reads: tuple = ("seed", "partition", "server")
    # A plug-in's declarations (fedmpi.plans.catalog): the participation.keys it reads, the algorithm families
    # it plans for, whether privacy's accountant may count its cohorts.
    uses: tuple = ()
    protocols: tuple = ("reduce",)
    works_with_dp = False

    @classmethod
    def build(cls, setting: ProviderSetting, *, seed, partition, server):
        """The standard draw: always."""
        return cls(setting.algo, seed=seed, num_clients=partition.clients, clients_per_round=server.clients_per_round)

    def __init__(self, algo, *, seed, num_clients, clients_per_round):
        self.algo = algo
        self.seed, self.partition_clients, self.clients_per_round = seed, num_clients, clients_per_round

    def standard(self, t):
        return rng.select_clients(self.seed, t, self.partition_clients, self.clients_per_round)

    def plan(self, t) -> RoundPlan:
        standard = self.standard(t)
        return RoundPlan(t, standard, np.asarray(self.algo.select(t, standard, self.algo.sizes)))

    def settle(self, plan, comm, uploaders):
        """GATHER rounds, on every rank after the gather (collective): `uploaders` are the client ids whose
        vectors the server received (None on the other ranks), for a provider whose plan depends on them."""

    def counted(self, t, cid) -> bool:
        """Whether client `cid`'s update counted in round `t` (a past round too; FedSkip's slot weights)."""
        return True

    def done(self, plan):
        """Called on every rank after round `plan.round`'s reduction (e.g. to advance a simulated clock)."""

    def state(self) -> dict:
        return {}

    def load_state(self, state: dict):
        pass


Everyone = Participation
