"""The `privacy:` config section (client-level differential privacy; docs/how-to/privacy.md).

How clients are sampled is not here: it lives in the server section as `server.sampling: fixed | poisson`,
because it decides the cohort with or without privacy. With `poisson` every client joins a round
independently with rate q = server.clients_per_round / partition.clients.

The annotations use only names that fedmpi.config's loader can resolve (`Literal`, builtins), so this
dataclass can sit in `Config` beside the other sections and be built by the same `_build`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from fedmpi.core.config_checks import Checks, Range, factor

# Sane ranges (docs/how-to/privacy.md). z = 1e300 overflowed the accountant and z = 1e-300 divided by zero in it;
# z = 1e4 already gives epsilon ~0.1 after 100 rounds, z = 0.01 an epsilon in the millions. The PLD
# accountant's privacy-loss grid grows as 1/z^2: at z = 0.1 it took 37 s and 3.5 GB for 100 rounds, below
# 0.03 it runs out of memory; it takes z >= 0.3.
MIN_NOISE, MAX_NOISE, PLD_MIN_NOISE = 0.01, 1e4, 0.3
MIN_EPSILON, MAX_EPSILON = 0.01, 1000.0
MAX_CLIP_LR = 10.0      # C changes by at most exp(clip_lr) per round; 1e300 overflowed math.exp


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def noise_ok(z, accountant="rdp"):
    """Whether `z` is 0 (clipping without noise) or in the accountant's sane range."""
    low = PLD_MIN_NOISE if accountant == "pld" else MIN_NOISE
    return _number(z) and (z == 0 or low <= z <= MAX_NOISE)


def noise_range(accountant="rdp"):
    low = PLD_MIN_NOISE if accountant == "pld" else MIN_NOISE
    return f"0 (clipping without noise) or a number in [{low:g}, {MAX_NOISE:g}]"


@dataclass(frozen=True)
class PrivacyConfig:
    mechanism: Literal["none", "gaussian"] = "none"
    """`none`: no clipping, no noise, nothing changes. `gaussian`: DP-FedAvg (McMahan et al. 2018): every
    client's update is clipped on its own rank, rank 0 adds Gaussian noise once to the sum."""

    clip: float = 1.0
    """L2 bound C on one client's update Delta_i = y_i - x_t; with `adaptive_clip` the initial C."""

    noise_multiplier: float = 1.0
    """z: the noise added to the sum of clipped updates has standard deviation z * C. 0 clips without
    noise (epsilon is infinite). Ignored when `target_epsilon` is set."""

    delta: float = 1e-5
    """The delta of the (epsilon, delta) guarantee; choose it below 1 / partition.clients."""

    target_epsilon: float | None = None
    """null, or the epsilon the run must reach after `rounds` rounds: picks `noise_multiplier` before the
    run starts (the smallest z the accountant allows)."""

    accountant: Literal["rdp", "pld"] = "rdp"
    """Privacy accountant of Google's dp-accounting: `rdp` (Renyi DP) or `pld` (privacy loss
    distributions, tighter and slower; Poisson sampling only)."""

    adaptive_clip: bool = False
    """Quantile-based adaptive clipping (Andrew et al. 2021): C follows the `target_quantile` of the
    update norms, estimated from a noisy count in the same reduction."""

    target_quantile: float = 0.5
    """gamma: the fraction of updates that should fall below C."""

    clip_lr: float = 0.2
    """eta_C of the geometric update C <- C * exp(-eta_C * (b_hat - gamma))."""

    clip_count_stddev: float | None = None
    """sigma_b, the noise on the count of unclipped updates; null = the paper's expected cohort / 20."""

    # noise_multiplier: 0 or within its accountant's range, which a Range cannot say (noise_ok, below).
    RANGES: ClassVar[dict] = {"clip": factor(low_open=True), "clip_count_stddev": factor(),
                              "delta": Range(0, 1, low_open=True, high_open=True),
                              "target_epsilon": Range(MIN_EPSILON, MAX_EPSILON),
                              "target_quantile": Range(0, 1, low_open=True, high_open=True),
                              "clip_lr": Range(0, MAX_CLIP_LR, low_open=True)}
    """The declared bounds of the numeric keys above (fedmpi.core.config_checks.Range), beside their checks."""

    def __post_init__(self):
        c = Checks("privacy")
        c.require(self.mechanism in ("none", "gaussian"), "mechanism", self.mechanism, "must be none or gaussian")
        c.require(self.accountant in ("rdp", "pld"), "accountant", self.accountant, "must be rdp or pld")
        c.require(isinstance(self.adaptive_clip, bool), "adaptive_clip", self.adaptive_clip,
                  "must be true or false")
        c.require(_number(self.clip) and self.clip > 0, "clip", self.clip, "must be a number > 0")
        c.require(noise_ok(self.noise_multiplier, self.accountant), "noise_multiplier", self.noise_multiplier,
                  f"must be {noise_range(self.accountant)}" + (" with accountant pld (its grid grows as 1/z^2)"
                                                               if self.accountant == "pld" else ""))
        c.require(_number(self.delta) and 0 < self.delta < 1, "delta", self.delta, "must be in (0, 1)")
        c.require(self.target_epsilon is None
                  or (_number(self.target_epsilon) and MIN_EPSILON <= self.target_epsilon <= MAX_EPSILON),
                  "target_epsilon", self.target_epsilon,
                  f"must be a number in [{MIN_EPSILON:g}, {MAX_EPSILON:g}] or null")
        c.require(_number(self.target_quantile) and 0 < self.target_quantile < 1, "target_quantile",
                  self.target_quantile, "must be in (0, 1)")
        c.require(_number(self.clip_lr) and 0 < self.clip_lr <= MAX_CLIP_LR, "clip_lr", self.clip_lr,
                  f"must be a number in (0, {MAX_CLIP_LR:g}]")
        c.require(self.clip_count_stddev is None
                  or (_number(self.clip_count_stddev) and self.clip_count_stddev > 0),
                  "clip_count_stddev", self.clip_count_stddev, "must be a number > 0 or null")
        c.done()

    @property
    def enabled(self):
        return self.mechanism == "gaussian"

    @property
    def inert(self):
        """With mechanism none the other keys change nothing; Config.hash then leaves the section out."""
        return not self.enabled
