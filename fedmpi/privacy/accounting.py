"""Epsilon from Google's dp-accounting package (optional extra `fedmpi[privacy]`; docs/how-to/privacy.md).

One round of DP-FedAvg is one sampled Gaussian mechanism on the sum of clipped client updates:
- `server.sampling: poisson` (each client in with rate q): PoissonSampledDpEvent(q, GaussianDpEvent(z)),
  add-or-remove-one-client neighbours; RDP and PLD accountants.
- `server.sampling: fixed` (S of N without replacement): SampledWithoutReplacementDpEvent(N, S,
  GaussianDpEvent(z / 2)), replace-one-client neighbours; RDP only, because the PLD accountant of
  dp-accounting 0.6.0 has no event for sampling without replacement. The z / 2: replacing one client
  moves the sum by up to 2C, and the library's RDP bound for this event takes the noise relative to
  that sensitivity, while GaussianDpEvent's multiplier is noise / C (google/differential-privacy#378);
  passing z unchanged would understate epsilon.

With adaptive clipping the accountant is charged the configured z: the update (multiplier z_Delta) and
the count (multiplier 2 sigma_b) together form one Gaussian mechanism of multiplier z on the joint
vector (mechanism.adjusted_noise_multiplier), sampled once per round.
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass

import numpy as np

from fedmpi.core.errors import ConfigError
from fedmpi.privacy.keys import MAX_NOISE, PLD_MIN_NOISE

PIP_COMMAND = "pip install 'fedmpi[privacy]'   (or: pip install dp-accounting==0.6.0)"
# PLD per-round curves are evaluated exactly on rounds 1, ceil(r), ceil(r^2), ... and the last round.
PLD_GRID_RATIO = 1.1


def library():
    """The dp_accounting module, or a ConfigError (exit 2) that says how to install it."""
    try:
        import dp_accounting
    except ImportError:
        raise ConfigError("privacy.mechanism = 'gaussian' needs Google's dp-accounting package for the "
                          f"privacy accounting, and it is not installed: {PIP_COMMAND}") from None
    return dp_accounting


@contextlib.contextmanager
def _quiet():
    """The RDP accountant logs a warning for every fractional order it drops as non-convergent (a
    harmless exclusion: epsilon is a minimum over orders); keep that out of the run's output."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@dataclass(frozen=True)
class Sampling:
    """How a round's cohort is drawn: `poisson` (rate per_round / num_clients) or `fixed` (per_round of
    num_clients without replacement). Either way the expected cohort size is `per_round`."""

    kind: str
    num_clients: int
    per_round: int

    def __post_init__(self):
        if self.kind not in ("poisson", "fixed"):
            raise ConfigError(f"server.sampling = {self.kind!r}: must be fixed or poisson")
        if not 1 <= self.per_round <= self.num_clients:
            raise ConfigError(f"server.clients_per_round = {self.per_round!r}: must be in "
                              f"[1, partition.clients = {self.num_clients}]")

    @property
    def rate(self) -> float:
        return self.per_round / self.num_clients

    @property
    def expected_size(self) -> float:
        return float(self.per_round)


def check_accountant(accountant: str, sampling: Sampling):
    if accountant == "pld" and sampling.kind == "fixed":
        raise ConfigError("privacy.accountant = 'pld' with server.sampling = 'fixed': dp-accounting 0.6.0's "
                          "PLD accountant cannot account sampling without replacement; use "
                          "privacy.accountant: rdp, or server.sampling: poisson")
    if accountant not in ("rdp", "pld"):
        raise ConfigError(f"privacy.accountant = {accountant!r}: must be rdp or pld")


def round_event(sampling: Sampling, noise_multiplier: float):
    """The DpEvent of one round."""
    dpa = library()
    if sampling.kind == "poisson":
        return dpa.PoissonSampledDpEvent(sampling.rate, dpa.GaussianDpEvent(noise_multiplier))
    return dpa.SampledWithoutReplacementDpEvent(sampling.num_clients, sampling.per_round,
                                                dpa.GaussianDpEvent(noise_multiplier / 2))


def make_accountant(accountant: str, sampling: Sampling):
    """A fresh accountant with the neighbouring relation that matches the sampling."""
    check_accountant(accountant, sampling)
    dpa = library()
    relation = (dpa.NeighboringRelation.ADD_OR_REMOVE_ONE if sampling.kind == "poisson"
                else dpa.NeighboringRelation.REPLACE_ONE)
    if accountant == "rdp":
        return dpa.rdp.RdpAccountant(neighboring_relation=relation)
    return dpa.pld.PLDAccountant(neighboring_relation=relation)


def epsilon(rounds: int, delta: float, sampling: Sampling, noise_multiplier: float, accountant="rdp") -> float:
    """Epsilon at `delta` after `rounds` rounds: one call of the library's accountant."""
    if rounds == 0:
        return 0.0
    if noise_multiplier == 0:
        check_accountant(accountant, sampling)
        return math.inf
    with _quiet():
        acc = make_accountant(accountant, sampling)
        acc.compose(round_event(sampling, noise_multiplier), int(rounds))
        return float(acc.get_epsilon(delta))


def epsilon_curve(rounds: int, delta: float, sampling: Sampling, noise_multiplier: float,
                  accountant="rdp") -> np.ndarray:
    """Epsilon after each of rounds 1..rounds (float64, length `rounds`), for /metrics/epsilon.

    RDP composes by addition (t rounds = t times one round's RDP curve), so every entry is exact and
    equals `epsilon(t, ...)` bit for bit, at the cost of one RDP-to-epsilon conversion per round.
    PLD composition is a convolution that costs about as much per round as composing all rounds at
    once, so PLD is evaluated exactly on a geometric grid (every round up to 12, then steps of 10%,
    and the last round) and each other round reports the next grid round's epsilon: an upper bound,
    since epsilon never decreases with more rounds, at most about 5% above the exact value."""
    rounds = int(rounds)
    if rounds == 0:
        return np.zeros(0)
    if noise_multiplier == 0:
        check_accountant(accountant, sampling)
        return np.full(rounds, math.inf)
    if accountant == "rdp":
        return _rdp_curve(rounds, delta, sampling, noise_multiplier)
    return _pld_curve(rounds, delta, sampling, noise_multiplier)


def _rdp_curve(rounds, delta, sampling, noise_multiplier):
    dpa = library()
    with _quiet():
        one = make_accountant("rdp", sampling).compose(round_event(sampling, noise_multiplier), 1)
        orders, per_round = one.orders, one.rdp
        convert = dpa.rdp.rdp_privacy_accountant.compute_epsilon
        return np.array([convert(orders, t * per_round, delta)[0] for t in range(1, rounds + 1)])


def pld_grid(rounds: int, ratio: float = PLD_GRID_RATIO) -> np.ndarray:
    """Rounds where the PLD curve is exact; the same for any `rounds` up to the last one."""
    points, g = {rounds}, 1.0
    while g < rounds:
        points.add(math.ceil(g))
        g *= ratio
    return np.array(sorted(points))


def _pld_curve(rounds, delta, sampling, noise_multiplier):
    check_accountant("pld", sampling)
    dpa = library()
    # The one-round PLD built once, then self-composed per grid round: what PLDAccountant.compose does
    # for a PoissonSampledDpEvent, without rebuilding the one-round distribution each time.
    one = dpa.pld.privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=noise_multiplier, sampling_prob=sampling.rate,
        value_discretization_interval=1e-4,
        neighboring_relation=dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
    grid = pld_grid(rounds)
    at_grid = np.array([one.self_compose(int(t)).get_epsilon_for_delta(delta) for t in grid])
    return at_grid[np.searchsorted(grid, np.arange(1, rounds + 1))]


def noise_for_epsilon(target_epsilon: float, rounds: int, delta: float, sampling: Sampling,
                      accountant="rdp", tol=1e-4) -> float:
    """The smallest noise multiplier z (within `tol`) whose epsilon after `rounds` rounds is at most
    `target_epsilon`: the library's calibrate_dp_mechanism (Brent's method, then a check that the
    returned z does not exceed the budget)."""
    if not target_epsilon > 0:
        raise ConfigError(f"privacy.target_epsilon = {target_epsilon!r}: must be > 0")
    if rounds < 1:
        raise ConfigError(f"rounds = {rounds!r}: target_epsilon needs at least one round")
    check_accountant(accountant, sampling)
    dpa = library()

    def event(z):
        if z <= 0:      # the search starts at z = 0, where the sampled-without-replacement bound divides by z
            return dpa.NonPrivateDpEvent()
        return dpa.SelfComposedDpEvent(round_event(sampling, z), int(rounds))

    if accountant == "rdp" and epsilon(rounds, delta, sampling, MAX_NOISE, "rdp") > target_epsilon:
        # Not even the largest noise multiplier allowed reaches it: say so after one evaluation, instead of a
        # search of a minute that ends far above the range (keys.MAX_NOISE).
        raise ConfigError(f"privacy.target_epsilon = {target_epsilon:g}: not reached after {rounds} rounds even "
                          f"with the largest noise multiplier allowed, {MAX_NOISE:g}; choose a larger "
                          f"target_epsilon (or more clients, fewer per round, fewer rounds)")
    bracket = None
    if accountant == "pld":
        # Each PLD evaluation costs a full composition; the RDP answer (cheaper, looser, so it needs
        # more noise) is the first guess. Starting at 0 costs nothing (no noise: epsilon is infinite at
        # once) and measured 3x faster than a bracket around the RDP answer.
        upper = noise_for_epsilon(target_epsilon, rounds, delta, sampling, "rdp", tol)
        if upper < PLD_MIN_NOISE:
            # PLD's answer is below RDP's; searching there would build grids of gigabytes (keys.PLD_MIN_NOISE).
            raise ConfigError(f"privacy.target_epsilon = {target_epsilon:g}: needs a noise multiplier below "
                              f"{upper:.3g}, under the {PLD_MIN_NOISE:g} the pld accountant takes; use accountant "
                              f"rdp or a smaller target_epsilon")
        bracket = dpa.LowerEndpointAndGuess(0.0, upper)
    with _quiet():
        return float(dpa.calibrate_dp_mechanism(lambda: make_accountant(accountant, sampling), event,
                                                 target_epsilon, delta, bracket_interval=bracket, tol=tol))
