"""Who can be selected in a round, who fails to return, and the round's selection among the available.

Every draw comes from a stream keyed by (seed, purpose, round, client) or (seed, SELECT, round), so every
rank computes the same answer for any `-n`; with everyone available the selection is bit-identical to
`fedmpi.core.rng.select_clients`.
"""

import functools
import os

import numpy as np

from fedmpi.core import rng
from fedmpi.deploy.traces import AvailabilityTrace


@functools.lru_cache(maxsize=8)
def _cached_trace(path, period, clients, _mtime_ns, _size):
    return AvailabilityTrace.load(path, period, clients)


def load_trace(cfg, num_clients=None):
    """The availability trace named by `cfg` (a ClientsConfig), read once per file version; `num_clients`
    bounds its device ids (traces.device_bound)."""
    st = os.stat(cfg.trace) if os.path.exists(cfg.trace) else None
    return _cached_trace(cfg.trace, cfg.trace_period, num_clients, st and st.st_mtime_ns, st and st.st_size)


def available(cfg, seed, round_, sim_time, num_clients, trace=None) -> np.ndarray:
    """Bool mask [num_clients]: which clients can be selected in round `round_` starting at `sim_time`.

    `cfg` is the ClientsConfig; `trace` an already loaded AvailabilityTrace (else read from cfg.trace)."""
    if cfg.availability == "always":
        return np.ones(num_clients, dtype=bool)
    if cfg.availability == "bernoulli":
        p = cfg.availability_p
        return np.fromiter((rng.stream(seed, rng.AVAILABILITY, round_, c).random() < p for c in range(num_clients)),
                           dtype=bool, count=num_clients)
    return (trace or load_trace(cfg, num_clients)).mask(sim_time, num_clients)


def next_available_time(cfg, sim_time, num_clients, trace=None) -> float:
    """When the server, finding nobody available at `sim_time`, can next hope to: the next trace
    interval to open (inf if none ever does). Bernoulli and always draw afresh each round: `sim_time`."""
    if cfg.availability != "trace":
        return sim_time
    return (trace or load_trace(cfg, num_clients)).next_on(sim_time, num_clients)


def dropped(seed, round_, cid, p) -> bool:
    """Whether selected client `cid` fails to return in round `round_` (decided after its training)."""
    return p > 0 and bool(rng.stream(seed, rng.DROPOUT, round_, cid).random() < p)


def select_available(seed, round_, mask, count) -> np.ndarray:
    """The round's `count` clients drawn without replacement among those `mask` marks available, sorted.

    The draw is the one `rng.select_clients` makes, over the available clients' positions: with everyone
    available it is that selection bit for bit. With `count` or fewer available, all of them are taken."""
    pool = np.flatnonzero(np.asarray(mask, dtype=bool))
    if len(pool) <= count:
        return pool
    chosen = rng.stream(seed, rng.SELECT, round_).choice(len(pool), size=count, replace=False)
    return np.sort(pool[chosen])
