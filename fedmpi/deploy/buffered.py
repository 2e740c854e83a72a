"""Buffered asynchronous aggregation (FedBuff) on the simulated clock: who starts training when, from
which model version, and whose update arrives in which round (docs/how-to/deployment.md, section 8).

The server keeps `concurrency` clients in flight. A client that starts at simulated time s downloads the
current model (version v = the number of server updates so far), trains and uploads; its upload arrives at
s + bytes_down / down_i + steps_i / speed_i + bytes_up / up_i, or it fails at its failure time (dropout,
decided when it starts from (seed, DROPOUT, event, client)). Each arrival or failure frees a place, which
the server fills at once with a client drawn uniformly from those not in flight that have not already
started from the current version (and, under a trace, are available then). Every `buffer_size` arrivals
the server updates the model: that is one round, t = v. Arrivals are taken in time order, ties by
client id.

One round t of the round loop is therefore one server update: its starters (the clients that start from
version t, known before anything trains) train from the broadcast x_t and hold their updates; its
arrivals, which started from versions v <= t, release theirs with staleness t - v. The whole schedule
depends only on the config and the seed (never on training results), so every rank plans it alike for
any -n. The state between rounds (who is in flight, from which version, until when; the clock; the
count of start events, which keys the streams) is the provider's checkpoint state, loaded on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedmpi.algorithms.base import BUFFER
from fedmpi.core import rng
from fedmpi.core.train import schedule
from fedmpi.deploy import availability as av
from fedmpi.deploy.clock import Clock
from fedmpi.deploy.digests import check_digests, trace_digests
from fedmpi.deploy.traces import AvailabilityTrace
from fedmpi.plans.base import Participation, RoundPlan

START_KEY = 2       # (seed, SELECT, event, START_KEY): the client drawn at start event `event`
FIELDS = ("cid", "version", "start", "finish", "returns")


@dataclass
class InFlight:
    """The clients training now: parallel arrays (client id, model version, start and finish times, whether
    the upload arrives), in start order."""

    cid: list = field(default_factory=list)
    version: list = field(default_factory=list)
    start: list = field(default_factory=list)
    finish: list = field(default_factory=list)
    returns: list = field(default_factory=list)

    def __len__(self):
        return len(self.cid)

    def add(self, *values):
        for name, value in zip(FIELDS, values):
            getattr(self, name).append(value)

    def pop_first(self):
        """Removes and returns the earliest event (finish time, then client id)."""
        i = min(range(len(self.cid)), key=lambda j: (self.finish[j], self.cid[j]))
        return tuple(getattr(self, name).pop(i) for name in FIELDS)

    def copy(self):
        return InFlight(*(list(getattr(self, name)) for name in FIELDS))


@dataclass
class BufferedPlan(RoundPlan):
    arrivals: list = field(default_factory=list)    # [(cid, start version)] in arrival order
    end: float = 0.0                                # simulated time of the round's server update
    state: tuple = ()                               # (in flight, events) after the round, for `done`


class BufferedParticipation(Participation):
    reads = ("seed", "partition", "server", "clients", "client")

    @classmethod
    def build(cls, setting, *, seed, partition, server, clients, client):
        """FedBuff's provider for an algorithm of the BUFFER family (its keys: buffer_size, concurrency); None
        for any other."""
        algo = setting.algo
        if algo.protocol != BUFFER:
            return None
        return cls(algo, setting.part_sizes, seed=seed, partition=partition, server=server, clients=clients,
                   client=client, keys=algo.keys)

    def __init__(self, algo, part_sizes, *, seed, partition, server, clients, client, keys):
        """From the run's `seed`, the `partition`, `server`, `clients` and `client` sections and FedBuff's
        algorithm `keys` (buffer_size, concurrency)."""
        super().__init__(algo, seed=seed, num_clients=partition.clients, clients_per_round=server.clients_per_round)
        self.clients = clients
        self.buffer, self.concurrency = keys.buffer_size, keys.concurrency
        self.num_clients = len(part_sizes)
        self.clock = Clock.from_config(clients, seed, self.num_clients)
        self.trace = (AvailabilityTrace.load(clients.trace, clients.trace_period, self.num_clients)
                      if clients.availability == "trace" else None)
        self.steps = [schedule(client, n).steps for n in part_sizes]
        self.bytes_down = algo.down_vectors * algo.dim * 4
        self.bytes_up = algo.up_vectors * algo.dim * 4
        self.digests = trace_digests(clients)
        self.sim_time, self.events, self.in_flight = 0.0, 0, InFlight()

    # -- the event simulation ----------------------------------------------------------------------------
    def _available(self, time):
        if self.trace is None:
            return np.ones(self.num_clients, dtype=bool)
        return self.trace.mask(time, self.num_clients)

    def _top_up(self, flight, events, time, version, started):
        """Starts clients at `time` from `version` until `concurrency` are in flight or none can start."""
        seed, dropout = self.seed, self.clients.dropout
        while len(flight) < self.concurrency:
            free = self._available(time)
            free[flight.cid] = False
            free[list(started)] = False
            pool = np.flatnonzero(free)
            if not len(pool):
                break
            cid = int(pool[rng.stream(seed, rng.SELECT, events, START_KEY).integers(len(pool))])
            returns = not av.dropped(seed, events, cid, dropout)
            took = (self.clock.client_time(cid, self.steps[cid], self.bytes_down, self.bytes_up) if returns
                    else self.clock.failure_time(cid, self.steps[cid], self.bytes_down))
            flight.add(cid, version, time, time + took, returns)
            started.add(cid)
            events += 1
        return events

    def plan(self, t) -> BufferedPlan:
        flight, events, time = self.in_flight.copy(), self.events, self.sim_time
        started = set()
        events = self._top_up(flight, events, time, t, started)
        arrivals = []
        while len(arrivals) < self.buffer:
            if not len(flight):
                wake = av.next_available_time(self.clients, time, self.num_clients, self.trace)
                if not np.isfinite(wake) or wake == time:
                    break       # nobody can start from this version: the round ends with what arrived
                time = wake
                events = self._top_up(flight, events, time, t, started)
                continue
            cid, version, _, finish, returns = flight.pop_first()
            time = finish
            if returns:
                arrivals.append((cid, version))
            if len(arrivals) < self.buffer:         # the buffer's last arrival frees a place for version t+1
                events = self._top_up(flight, events, time, t, started)
        return self._round_plan(t, sorted(started), flight, events, time, arrivals)

    def _round_plan(self, t, starters, flight, events, time, arrivals):
        returns = {c: r for c, v, r in zip(flight.cid, flight.version, flight.returns) if v == t}
        # A starter that already arrived this round returned; one no longer in flight without arriving failed.
        arrived_now = {c for c, v in arrivals if v == t}
        counted = np.array([returns.get(c, c in arrived_now) for c in starters], dtype=bool)
        n = self.num_clients
        staleness = np.full(n, np.nan, dtype=np.float32)
        arrived = np.zeros(n, dtype=np.float32)
        for cid, version in arrivals:
            staleness[cid], arrived[cid] = t - version, 1.0
        dropped = np.zeros(n, dtype=np.float32)
        dropped[[c for c, ok in zip(starters, counted) if not ok]] = 1.0
        taus = [t - v for _, v in arrivals]
        metrics = {"sim_time_s": time, "in_flight": len(flight),
                   "staleness_mean": float(np.mean(taus)) if taus else np.nan,
                   "staleness_max": float(max(taus)) if taus else np.nan}
        selected = np.array(starters, dtype=np.int64)
        return BufferedPlan(t, selected, selected, counted=counted, metrics=metrics,
                            columns={"arrived": arrived, "staleness": staleness, "dropped": dropped},
                            arrivals=arrivals, end=time, state=(flight, events))

    def done(self, plan):
        self.in_flight, self.events = plan.state
        self.sim_time = plan.end

    # -- checkpoints -------------------------------------------------------------------------------------
    def state(self) -> dict:
        f = self.in_flight
        return {"sim_time_s": np.array([self.sim_time], dtype=np.float64),
                "events": np.array([self.events], dtype=np.int64),
                "in_flight_cid": np.array(f.cid, dtype=np.int64),
                "in_flight_version": np.array(f.version, dtype=np.int64),
                "in_flight_start": np.array(f.start, dtype=np.float64),
                "in_flight_finish": np.array(f.finish, dtype=np.float64),
                "in_flight_returns": np.array(f.returns, dtype=np.int8), **self.digests}

    def load_state(self, state: dict):
        if "sim_time_s" in state:
            self.sim_time = float(np.asarray(state["sim_time_s"]).reshape(-1)[0])
            self.events = int(np.asarray(state["events"]).reshape(-1)[0])
            cast = {"cid": int, "version": int, "start": float, "finish": float, "returns": bool}
            self.in_flight = InFlight(*([cast[name](v) for v in np.asarray(state[f"in_flight_{name}"]).reshape(-1)]
                                        for name in FIELDS))
        check_digests(self.clients, state)
