"""The simulated clock: each client's compute speed and link bandwidths, its time for a round, and the
round's outcome under a deadline or over-selection (which updates count, how long the round took).

Client i's round time is   t_i = bytes_down / down_i + steps / speed_i + bytes_up / up_i.
A client that drops out fails after training; the server learns of it at  bytes_down / down_i + steps /
speed_i  (its failure time) and it uploads nothing. Everything here is a pure function of the config, the
seed and the inputs: per-client rates come from the stream (seed, CLOCK, client), drawn once per run.
"""

from dataclasses import dataclass

import numpy as np

from fedmpi.core import rng
from fedmpi.core.errors import ConfigError
from fedmpi.deploy.traces import BANDWIDTH_COLUMNS, SPEED_COLUMNS, load_rates


def _normals(seed, num_clients):
    """[num_clients, 3] standard normals (speed, up, down) per client: always drawn, so that changing one
    rate's form never changes another's draws."""
    return np.array([rng.stream(seed, rng.CLOCK, c).standard_normal(3) for c in range(num_clients)]
                    ).reshape(num_clients, 3)


def _traced(table, num_clients):
    """Per-client rows of a per-device table: client i follows device i mod M."""
    return table[np.arange(num_clients) % len(table)]


def client_rates(cfg, seed, num_clients):
    """(speed, up, down): float64 arrays [num_clients] of steps/s and bytes/s for a ClientsConfig."""
    z = _normals(seed, num_clients) if "lognormal" in (cfg.speed.kind, cfg.bandwidth.kind) else None
    s = cfg.speed
    if s.kind == "fixed":
        speed = np.full(num_clients, s.value)
    elif s.kind == "lognormal":
        speed = s.value * np.exp(s.sigma * z[:, 0])
    else:
        speed = _traced(load_rates(s.trace, SPEED_COLUMNS, num_clients), num_clients)[:, 0]
    b = cfg.bandwidth
    if b.kind == "fixed":
        up, down = np.full(num_clients, b.up), np.full(num_clients, b.down)
    elif b.kind == "lognormal":
        up, down = b.up * np.exp(b.sigma * z[:, 1]), b.down * np.exp(b.sigma * z[:, 2])
    else:
        table = _traced(load_rates(b.trace, BANDWIDTH_COLUMNS, num_clients), num_clients)
        up, down = table[:, 0], table[:, 1]
    for key, rates in (("speed", speed), ("bandwidth", up), ("bandwidth", down)):
        if len(rates) and not (np.all(np.isfinite(rates)) and rates.min() > 0):     # guarded by the key ranges
            raise ConfigError(f"clients.{key}: the drawn rates reach {rates.min():g}..{rates.max():g} per second, "
                              f"where simulated times are no longer finite; lower sigma")
    return speed, up, down


class Clock:
    """Per-client rates of one run, and the times they imply."""

    def __init__(self, speed, up, down):
        self.speed, self.up, self.down = (np.asarray(a, dtype=np.float64) for a in (speed, up, down))

    @classmethod
    def from_config(cls, cfg, seed, num_clients):
        return cls(*client_rates(cfg, seed, num_clients))

    def failure_time(self, cid, steps, bytes_down):
        """Download plus local training: when a dropped client's failure is known, and when a client
        that uploads nothing (SAFL gated out) is done."""
        return bytes_down / self.down[cid] + steps / self.speed[cid]

    def client_time(self, cid, steps, bytes_down, bytes_up):
        """Download + steps / speed + upload, in simulated seconds."""
        return self.failure_time(cid, steps, bytes_down) + bytes_up / self.up[cid]

    def finish_times(self, cids, steps, bytes_down, bytes_up, returned):
        """Per selected client: its upload's arrival if it returned, else its failure time. `steps` and
        `bytes_up` are per client (sequences) or one number for all."""
        steps, up = (np.broadcast_to(np.asarray(v, dtype=np.float64), (len(cids),)) for v in (steps, bytes_up))
        return np.array([self.client_time(c, k, bytes_down, u) if r else self.failure_time(c, k, bytes_down)
                         for c, k, u, r in zip(cids, steps, up, returned)], dtype=np.float64)


@dataclass(frozen=True)
class RoundOutcome:
    kept: np.ndarray        # cids whose updates count, sorted
    late: np.ndarray        # cids that returned but do not count (past the deadline or past the first S)
    failed: np.ndarray      # cids that dropped out
    duration: float         # simulated seconds from the round's start until the server moves on


def round_outcome(cids, finish_s, returned, keep, deadline=None) -> RoundOutcome:
    """Which updates count and how long the round took.

    cids: the selected clients; finish_s: per client, its arrival time if it returned, else its failure
    time (`Clock.finish_times`); returned: per client, False if it dropped out; keep: how many updates
    the server waits for (S under over-selection, else len(cids)); deadline: seconds or None.

    The server takes arrivals in time order (ties by client id) up to the deadline. When `keep` of them
    arrive it stops at the keep-th arrival; otherwise it stops when every selected client has arrived or
    failed, or at the deadline, whichever is first."""
    cids = np.asarray(cids, dtype=np.int64)
    finish = np.asarray(finish_s, dtype=np.float64)
    returned = np.asarray(returned, dtype=bool)
    limit = np.inf if deadline is None else float(deadline)
    on_time = np.flatnonzero(returned & (finish <= limit))
    order = on_time[np.lexsort((cids[on_time], finish[on_time]))]
    if len(order) >= keep:
        kept = order[:keep]
        duration = float(finish[kept[-1]]) if keep > 0 else 0.0
    else:
        kept = order
        duration = min(limit, float(finish.max())) if len(cids) else 0.0
    counted = np.zeros(len(cids), dtype=bool)
    counted[kept] = True
    return RoundOutcome(kept=np.sort(cids[counted]), late=cids[returned & ~counted], failed=cids[~returned],
                        duration=duration)
