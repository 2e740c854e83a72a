"""The `secagg:` config section (read when `server.secure_aggregation` is secagg or secagg_plus;
docs/how-to/secure-aggregation.md). Cross-section checks (the field against the clipped sum of a
cohort, the threshold against clients_per_round, refused stages and algorithms) are in fedmpi.secagg.checks.

The annotations use only names that fedmpi.config's loader can resolve (`Literal`, builtins), so this
dataclass can sit in `Config` beside the other sections and be built by the same `_build`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from fedmpi.core.config_checks import Checks, Range, count, refuse_unused

MODES = ("none", "secagg", "secagg_plus")
NOISES = ("none", "discrete_gaussian", "skellam")
MIN_BITS, MAX_BITS = 8, 64      # 2^64 is the widest field the uint64 reduction carries exactly
# The keys each secagg.noise reads (fedmpi.secagg.costs, the accountant of the distributed noise)
NOISE_USES = {"none": (), "discrete_gaussian": ("noise_multiplier", "delta"), "skellam": ("noise_multiplier", "delta")}


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _int(value):
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class SecAggConfig:
    bits: int = 32
    """b: masked vectors are summed in the ring Z_{2^b}; a client uploads b bits per entry."""

    clip: float = 1.0
    """L2 bound C on a client's update Delta_i = y_i - x_t before it becomes integers (it also bounds every
    entry, which is what the field must hold)."""

    scale: float = 65536.0
    """gamma: the clipped update is multiplied by gamma and stochastically rounded to integers (the
    client's own stream (seed, SECAGG, round, client)); the server divides the decoded sum by gamma."""

    threshold: int | None = None
    """t of the t-out-of-n Shamir sharing of each client's secrets: the server reconstructs a seed from any
    t shares and no fewer. null: secagg floor(S/2) + 1 of the cohort S, secagg_plus floor(k/2) + 1 of the
    k neighbours. Security needs t above half of those who hold shares."""

    neighbours: int | None = None
    """secagg_plus only: k, the degree of the k-regular communication graph (a Harary graph on a random
    ring); a client masks with and shares to its k neighbours only. null: the smallest even number
    >= log2(S), at most S - 1."""

    noise: Literal["none", "discrete_gaussian", "skellam"] = "none"
    """Distributed DP: each client adds integer noise before masking so that the sum carries noise of
    variance (noise_multiplier * clip * scale)^2 (Kairouz et al. 2021; Agarwal et al. 2021)."""

    noise_multiplier: float = 1.0
    """z of the distributed noise (read only with noise other than none)."""

    delta: float = 1e-5
    """delta of the (epsilon, delta) the accountant reports for the distributed noise."""

    weighting: Literal["uniform", "samples"] = "uniform"
    """How the server averages the survivors' updates. `uniform`: every update counts 1 (DP-FedAvg's choice).
    `samples`: client i's clipped update is multiplied by w_i = n_i / n_max before it becomes integers (n_i its
    sample count, n_max the largest client's: weights the server knows, each at most 1, so the field and a
    client's sensitivity stay those of the uniform case) and the server divides the decoded sum by the
    survivors' sum of w_i: the sample-weighted average of FedAvg, of the clipped updates."""

    RANGES: ClassVar[dict] = {"threshold": count(0), "neighbours": count(0),    # the low ends: its own checks
                              "bits": Range(MIN_BITS, MAX_BITS), "clip": Range(0, 1e6, low_open=True, high_open=True),
                              "scale": Range(1, 2.0 ** 52), "noise_multiplier": Range(0.01, 1e4),
                              "delta": Range(0, 1, low_open=True, high_open=True)}

    def __post_init__(self):
        c = Checks("secagg")
        c.require(_int(self.bits) and MIN_BITS <= self.bits <= MAX_BITS, "bits", self.bits,
                  f"must be an integer in [{MIN_BITS}, {MAX_BITS}]")
        c.require(_number(self.clip) and 0 < self.clip < 1e6, "clip", self.clip, "must be a number in (0, 1e6)")
        c.require(_number(self.scale) and 1 <= self.scale <= 2.0 ** 52, "scale", self.scale,
                  "must be a number in [1, 2^52]")
        c.require(self.threshold is None or _int(self.threshold), "threshold", self.threshold,
                  "must be an integer or null")
        c.require(self.neighbours is None or (_int(self.neighbours) and self.neighbours >= 1), "neighbours",
                  self.neighbours, "must be an integer >= 1 or null")
        c.require(self.noise in NOISES, "noise", self.noise, f"must be one of {', '.join(NOISES)}")
        c.require(_number(self.noise_multiplier) and 0.01 <= self.noise_multiplier <= 1e4, "noise_multiplier",
                  self.noise_multiplier, "must be a number in [0.01, 1e4]")
        c.require(_number(self.delta) and 0 < self.delta < 1, "delta", self.delta, "must be in (0, 1)")
        c.require(self.weighting in ("uniform", "samples"), "weighting", self.weighting,
                  "must be uniform (every update 1) or samples (n_i / n_max, multiplied in before masking)")
        if not c.errors:
            refuse_unused(c, self, "noise", NOISE_USES, "noise")
        c.done()

    @property
    def inert(self):
        """The section is read only under server.secure_aggregation; Config.hash leaves it out while it is
        at its defaults (fedmpi.config.HASH_OPTIONAL)."""
        return self == SecAggConfig()
