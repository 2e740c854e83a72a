"""One round's deployment plan in one call: who is available, who is selected, who drops out, whose
update counts, and the round's simulated start and duration.

Everything in a plan is a pure function of the config, the seed, the round and the simulated time at
which the round starts, so every rank computes the same plan without a message, before any training:
a worker knows up front which of its clients' updates will count (and whose state it must leave alone).
The one input that is not known up front is SAFL's upload gate: a gated-out client uploads nothing, so
its time shrinks; the round loop then recomputes the outcome with `Deployment.outcome` once the gate
mask is known.
"""

from dataclasses import dataclass

import numpy as np

from fedmpi.deploy import availability as av
from fedmpi.deploy.clock import Clock, RoundOutcome, round_outcome
from fedmpi.deploy.traces import AvailabilityTrace


@dataclass(frozen=True)
class DeploymentRound:
    round: int
    start: float                # simulated seconds at which the round starts (after waiting for clients)
    selected: np.ndarray        # cids drawn among the available, sorted
    returned: np.ndarray        # bool per selected client: False if it drops out
    outcome: RoundOutcome

    @property
    def end(self):
        """Simulated time at the end of the round: the next round's `sim_time`, and /metrics/sim_time_s."""
        return self.start + self.outcome.duration

    def counts(self, cid):
        """Whether `cid`'s update counts this round (a client not selected has none)."""
        return bool(np.isin(cid, self.outcome.kept))


class Deployment:
    """The run's deployment model, built once per rank before anything is written: it reads the trace
    files, so a bad one stops the run with exit 2 (InputError) before training."""

    def __init__(self, clients, deadline, seed, num_clients, per_round):
        self.clients, self.deadline = clients, deadline
        self.seed, self.num_clients, self.per_round = seed, num_clients, per_round
        self.trace = (AvailabilityTrace.load(clients.trace, clients.trace_period, num_clients)
                      if clients.availability == "trace" else None)
        self.clock = Clock.from_config(clients, seed, num_clients)

    @property
    def inert(self):
        """True when nothing here changes which updates count: everyone available, no dropout, no deadline,
        no over-selection. The selection is then today's `rng.select_clients`."""
        return (self.clients.availability == "always" and self.clients.dropout == 0
                and self.deadline.deadline is None and not self.deadline.extra(self.per_round))

    def _keep(self, selected):
        return self.per_round if self.deadline.extra(self.per_round) else len(selected)

    def outcome(self, selected, returned, steps, bytes_down, bytes_up) -> RoundOutcome:
        """The round's outcome for given per-client steps and upload bytes (one number or one per client)."""
        times = self.clock.finish_times(selected, steps, bytes_down, bytes_up, returned)
        return round_outcome(selected, times, returned, self._keep(selected), self.deadline.deadline)

    def plan(self, round_, sim_time, steps, bytes_down, bytes_up) -> DeploymentRound:
        """The plan of round `round_` starting at `sim_time`. `steps`: local steps of each client, an array
        [num_clients]; `bytes_down`: the download per client; `bytes_up`: the upload per client (the
        compressed payload times the vectors uploaded).

        When nobody is available the server waits for the trace's next interval to open; if none ever
        does (a non-repeating trace that has ended), or a Bernoulli draw leaves nobody, the round is empty
        and takes no time."""
        c, n = self.clients, self.num_clients
        mask = av.available(c, self.seed, round_, sim_time, n, self.trace)
        if not mask.any() and c.availability == "trace":
            wake = av.next_available_time(c, sim_time, n, self.trace)
            if np.isfinite(wake):
                sim_time, mask = wake, av.available(c, self.seed, round_, wake, n, self.trace)
        selected = av.select_available(self.seed, round_, mask, self.deadline.selected(self.per_round, n))
        returned = np.array([not av.dropped(self.seed, round_, cid, c.dropout) for cid in selected], dtype=bool)
        steps_sel = np.asarray(steps, dtype=np.float64)[selected]
        outcome = self.outcome(selected, returned, steps_sel, bytes_down, bytes_up)
        return DeploymentRound(round_, float(sim_time), selected, returned, outcome)
