"""Config sections of the deployment model (docs/how-to/deployment.md): `clients:` (availability, dropout,
speeds, bandwidths), `client.compress` and the server's deadline / over-selection keys.

Frozen dataclasses like the sections of fedmpi/config/__init__.py: one docstring per field, range checks in
`__post_init__` that report every problem of the section at once. Annotations are evaluated objects (no
`from __future__ import annotations`), so config.py's builder can read them from another module. The
optional numbers also check their own type: a string where a number belongs is a ConfigError, not a
TypeError from a comparison.
"""

import math
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from fedmpi.core.config_checks import Checks, Range, refuse_unused

RATE_KINDS = ("fixed", "lognormal", "trace")
AVAILABILITY = ("always", "bernoulli", "trace")
COMPRESSORS = ("none", "topk", "randk", "qsgd", "sign")
# Sane ranges of the simulated clock's parameters (docs/how-to/deployment.md): inside them every client's time for a
# round stays finite. A lognormal rate is value * exp(sigma * z) with |z| < 9 for any realistic number of
# clients, so sigma <= 10 keeps it within a factor 1e39 of `value`; sigma = 1000 overflowed rates to inf and
# 0, and simulated times to inf, in a run that still said `finished`. Traced rates take the same range.
MAX_SIGMA = 10.0
# The keys each form reads; a key only other forms read, set to a value other than its default, is refused
# (a `trace` of another kind already is, by _check_rate_form).
SPEED_USES = {"fixed": ("value",), "lognormal": ("value", "sigma"), "trace": ()}
BANDWIDTH_USES = {"fixed": ("up", "down"), "lognormal": ("up", "down", "sigma"), "trace": ()}
COMPRESS_USES = {"none": (), "topk": ("fraction",), "randk": ("fraction",), "qsgd": ("levels",), "sign": ()}
MIN_RATE, MAX_RATE = 1e-6, 1e15


def _rate_ok(v):
    return _number(v) and MIN_RATE <= v <= MAX_RATE


def _sigma_ok(v):
    return _number(v) and 0 <= v <= MAX_SIGMA


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _path(v):
    return v is None or (isinstance(v, str) and bool(v))


def _check_rate_form(c, kind, trace, trace_columns):
    c.require(kind in RATE_KINDS, "kind", kind, f"must be one of {', '.join(RATE_KINDS)}")
    c.require(_path(trace), "trace", trace, "must be a file path or null")
    c.require(kind != "trace" or bool(trace), "trace", trace,
              f"kind 'trace' needs the path of a CSV file with the header {trace_columns}")
    c.require(kind == "trace" or trace is None, "trace", trace, "is only read with kind: trace")


@dataclass(frozen=True)
class SpeedConfig:
    """How fast each client trains, in local SGD steps per simulated second."""

    kind: Literal[RATE_KINDS] = "fixed"
    """`fixed`: every client runs `value` steps/s; `lognormal`: client i runs value * exp(sigma * z_i),
    z_i ~ N(0, 1) from the stream (seed, CLOCK, i), drawn once per run; `trace`: read from `trace`."""
    value: float = 10.0
    """Steps per second (`fixed`), or the median over clients (`lognormal`), in [1e-6, 1e15]."""
    sigma: float = 0.5
    """`lognormal`: standard deviation of log(speed), in [0, 10]; 0 makes every client run at `value`."""
    trace: str | None = None
    """`trace`: CSV file with the header `client,steps_per_s`, one row per device (docs/how-to/deployment.md)."""

    RANGES: ClassVar[dict] = {"value": Range(MIN_RATE, MAX_RATE), "sigma": Range(0, MAX_SIGMA)}

    def __post_init__(self):
        c = Checks("clients.speed")
        _check_rate_form(c, self.kind, self.trace, "client,steps_per_s")
        c.require(_rate_ok(self.value), "value", self.value,
                  f"must be a number in [{MIN_RATE:g}, {MAX_RATE:g}] (steps per second)")
        c.require(_sigma_ok(self.sigma), "sigma", self.sigma, f"must be a number in [0, {MAX_SIGMA:g}]")
        if not c.errors:
            refuse_unused(c, self, "kind", SPEED_USES, "kind")
        c.done()


@dataclass(frozen=True)
class BandwidthConfig:
    """Each client's link, in bytes per simulated second, upload and download."""

    kind: Literal[RATE_KINDS] = "fixed"
    """`fixed`: `up` and `down` for every client; `lognormal`: up * exp(sigma * z_up,i) and
    down * exp(sigma * z_down,i) from the stream (seed, CLOCK, i); `trace`: read from `trace`."""
    up: float = 1.0e+6
    """Upload bytes per second (`fixed`), or the median over clients (`lognormal`), in [1e-6, 1e15]."""
    down: float = 1.0e+6
    """Download bytes per second (`fixed`), or the median over clients (`lognormal`), in [1e-6, 1e15]."""
    sigma: float = 0.5
    """`lognormal`: standard deviation of log(bandwidth), the same for both directions, in [0, 10]."""
    trace: str | None = None
    """`trace`: CSV file with the header `client,up_bytes_per_s,down_bytes_per_s`, one row per device."""

    RANGES: ClassVar[dict] = {"up": Range(MIN_RATE, MAX_RATE), "down": Range(MIN_RATE, MAX_RATE),
                              "sigma": Range(0, MAX_SIGMA)}

    def __post_init__(self):
        c = Checks("clients.bandwidth")
        _check_rate_form(c, self.kind, self.trace, "client,up_bytes_per_s,down_bytes_per_s")
        for key in ("up", "down"):
            value = getattr(self, key)
            c.require(_rate_ok(value), key, value,
                      f"must be a number in [{MIN_RATE:g}, {MAX_RATE:g}] (bytes per second)")
        c.require(_sigma_ok(self.sigma), "sigma", self.sigma, f"must be a number in [0, {MAX_SIGMA:g}]")
        if not c.errors:
            refuse_unused(c, self, "kind", BANDWIDTH_USES, "kind")
        c.done()


@dataclass(frozen=True)
class ClientsConfig:
    """The top-level `clients:` section: who can be selected, who fails to return, how fast each one is.
    The defaults (everyone available, no dropout) select exactly the clients fedmpi selected before."""

    availability: Literal[AVAILABILITY] = "always"
    """`always`; `bernoulli`: client i is available in round t with probability `availability_p`, drawn
    from (seed, AVAILABILITY, t, i); `trace`: on during the intervals listed in `trace`."""
    availability_p: float = 1.0
    """`bernoulli`: probability that a client is available in a round, in (0, 1]."""
    trace: str | None = None
    """`trace`: CSV file with the header `client,start,end`, one on-interval [start, end) in simulated
    seconds per row; client i follows device i mod M of the M devices listed (docs/how-to/deployment.md)."""
    trace_period: float | None = None
    """`trace`: when set, the trace repeats with this period (availability at sim_time mod period);
    null: it does not repeat, and a device is off after its last interval."""
    dropout: float = 0.0
    """Probability in [0, 1) that a selected client fails to return its update, drawn after training
    from (seed, DROPOUT, round, client): its compute is spent, its update and state change are lost."""
    speed: SpeedConfig = field(default_factory=SpeedConfig)
    """Local SGD steps per simulated second."""
    bandwidth: BandwidthConfig = field(default_factory=BandwidthConfig)
    """Link bytes per simulated second, up and down."""

    RANGES: ClassVar[dict] = {"availability_p": Range(0, 1, low_open=True), "dropout": Range(0, 1, high_open=True),
                              "trace_period": Range(0, 1e12, "simulated seconds: 30,000 years", low_open=True)}

    def __post_init__(self):
        c = Checks("clients")
        c.require(self.availability in AVAILABILITY, "availability", self.availability,
                  f"must be one of {', '.join(AVAILABILITY)}")
        p = self.availability_p
        c.require(_number(p) and 0 < p <= 1, "availability_p", p, "must be a number in (0, 1]")
        c.require(self.availability == "bernoulli" or p == 1.0, "availability_p", p,
                  "only applies with availability: bernoulli (set that, or remove availability_p)")
        c.require(_path(self.trace), "trace", self.trace, "must be a file path or null")
        c.require(self.availability != "trace" or bool(self.trace), "trace", self.trace,
                  "availability: trace needs the path of a CSV file with the header client,start,end")
        c.require(self.availability == "trace" or self.trace is None, "trace", self.trace,
                  "is only read with availability: trace")
        period = self.trace_period
        c.require(period is None or (_number(period) and period > 0), "trace_period", period,
                  "must be a number of seconds > 0 or null")
        c.require(period is None or self.availability == "trace", "trace_period", period,
                  "only applies with availability: trace")
        c.require(_number(self.dropout) and 0 <= self.dropout < 1, "dropout", self.dropout,
                  "must be a number in [0, 1)")
        c.done()


@dataclass(frozen=True)
class CompressConfig:
    """`client.compress`: how a client encodes its update before upload (docs/how-to/deployment.md)."""

    name: Literal[COMPRESSORS] = "none"
    """`none` (dense float32), `topk` (largest |values|), `randk` (random entries, scaled to be unbiased),
    `qsgd` (stochastic quantization to `levels` levels, unbiased), `sign` (mean |x| times sign(x))."""
    fraction: float = 0.01
    """`topk`, `randk`: fraction of the entries sent, in (0, 1]; k = max(1, round(fraction * d))."""
    levels: int = 16
    """`qsgd`: number s of quantization levels of |x_j| / ||x||, an integer in [1, 2^30]."""
    error_feedback: bool = False
    """Keep each client's compression residual e_i and add it to the next update:
    e_i <- (delta + e_i) - C(delta + e_i). Saved in checkpoints as the client's `compress_residual`."""

    # levels: an entry takes 1 + ceil(log2(levels + 1)) bits; beyond 2^30 more than its float32.
    RANGES: ClassVar[dict] = {"fraction": Range(0, 1, low_open=True),
                              "levels": Range(1, 2 ** 30, "beyond, an entry takes more bits than its float32")}

    def __post_init__(self):
        c = Checks("client.compress")
        c.require(self.name in COMPRESSORS, "name", self.name, f"must be one of {', '.join(COMPRESSORS)}")
        f = self.fraction
        c.require(_number(f) and 0 < f <= 1, "fraction", f, "must be a number in (0, 1]")
        c.require(isinstance(self.levels, int) and not isinstance(self.levels, bool) and self.levels >= 1,
                  "levels", self.levels, "must be a positive integer")
        c.require(not self.error_feedback or self.name != "none", "error_feedback", self.error_feedback,
                  "needs a compressor (name is none, so there is no residual to feed back)")
        if not c.errors:
            refuse_unused(c, self, "name", COMPRESS_USES, "compressor")
        c.done()


@dataclass(frozen=True)
class DeadlineConfig:
    """The server's straggler policy: `server.deadline` and `server.over_select`."""

    deadline: float | None = None
    """Simulated seconds after the round starts; updates arriving later do not count. null: no deadline."""
    over_select: float | None = None
    """Select more clients than `server.clients_per_round` and keep the first S updates to arrive: a
    fraction in (0, 1) of S (rounded up) or a whole count >= 1 of extra clients. null or 0: off."""

    def __post_init__(self):
        c = Checks("server")
        d, o = self.deadline, self.over_select
        c.require(d is None or (_number(d) and d > 0), "deadline", d, "must be a number of seconds > 0 or null")
        c.require(o is None or (_number(o) and o >= 0 and (o < 1 or float(o).is_integer())), "over_select", o,
                  "must be a fraction in (0, 1) of clients_per_round, a whole count >= 1 of extra clients, "
                  "or null")
        c.done()

    def extra(self, per_round):
        """How many clients beyond `per_round` are selected."""
        o = self.over_select
        if not o:
            return 0
        return math.ceil(o * per_round - 1e-9) if o < 1 else int(o)

    def selected(self, per_round, num_clients):
        """How many clients a round selects: S plus the extra ones, at most every client."""
        return min(num_clients, per_round + self.extra(per_round))
