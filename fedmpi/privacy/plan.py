"""From the `privacy:` section and the cohort to the numbers a DP run needs, checked before anything
starts: the noise multipliers, the count noise, the epsilon the run will reach (docs/how-to/privacy.md)."""

from __future__ import annotations

from dataclasses import dataclass

from fedmpi.algorithms.base import REDUCE
from fedmpi.algorithms.registry import lookup
from fedmpi.core.errors import ConfigError
from fedmpi.privacy import accounting
from fedmpi.privacy.accounting import Sampling
from fedmpi.privacy.keys import noise_ok, noise_range
from fedmpi.privacy.mechanism import AdaptiveClip, adjusted_noise_multiplier, default_count_stddev


def algorithm_problems(algorithm, client_steps, algo_cls=None) -> list:
    """Why `algorithm` (its keys dataclass) cannot run under privacy.mechanism = gaussian, if it cannot: what
    its class declares (`Algorithm.privacy_problems`: uploads that are not one clipped update per client, or
    data-dependent weights or participation; docs/how-to/privacy.md, "Limits"). `algo_cls` is the class the keys'
    name looks up to (looked up here when not given)."""
    if algo_cls is None:
        algo_cls = lookup(algorithm.name)
    return [f"algorithm.name = {algorithm.name!r} with privacy.mechanism = 'gaussian': not differentially private "
            f"as implemented: {why} (docs/how-to/privacy.md, Limits)" for why in algo_cls.privacy_problems(algorithm,
                                                                                                  client_steps)]


def check(privacy, *, algorithm, sampling: Sampling, client_steps, algo_cls=None) -> list:
    """Every cross-section problem of a DP config, one line each (empty when the mechanism is off)."""
    if not privacy.enabled:
        return []
    problems = algorithm_problems(algorithm, client_steps, algo_cls)
    try:
        accounting.check_accountant(privacy.accountant, sampling)
    except ConfigError as e:
        problems += e.messages
    if privacy.delta >= 1 / sampling.num_clients:
        problems.append(f"privacy.delta = {privacy.delta!r}: must be < 1 / partition.clients "
                        f"({1 / sampling.num_clients:g}); otherwise the guarantee allows releasing a client outright")
    if privacy.adaptive_clip and privacy.target_epsilon is None:
        try:
            adjusted_noise_multiplier(privacy.noise_multiplier, count_stddev(privacy, sampling))
        except ConfigError as e:
            problems += e.messages
    return problems


def count_stddev(privacy, sampling: Sampling) -> float:
    if privacy.clip_count_stddev is not None:
        return privacy.clip_count_stddev
    return default_count_stddev(sampling.expected_size)


@dataclass(frozen=True)
class PrivacyPlan:
    noise_multiplier: float           # z, what the accountant is charged each round
    update_noise_multiplier: float    # z_Delta: the update's noise std is z_Delta * C (= z without adaptive clip)
    count_stddev: float | None        # sigma_b of the adaptive-clip count, None without adaptive clipping
    sampling: Sampling
    rounds: int
    delta: float
    accountant: str
    epsilon: float                    # after `rounds` rounds

    def epsilon_curve(self):
        return accounting.epsilon_curve(self.rounds, self.delta, self.sampling, self.noise_multiplier,
                                        self.accountant)

    def describe(self) -> str:
        """The --dry-run line."""
        noise = f"noise multiplier {self.noise_multiplier:.4g}"
        if self.count_stddev is not None:
            noise += (f" (update {self.update_noise_multiplier:.4g}, adaptive-clip count stddev "
                      f"{self.count_stddev:.4g})")
        cohort = (f"Poisson sampling q = {self.sampling.rate:.4g}" if self.sampling.kind == "poisson"
                  else f"fixed-size sampling {self.sampling.per_round} of {self.sampling.num_clients}")
        return (f"privacy: Gaussian, {noise}, {cohort}; epsilon after {self.rounds} rounds = "
                f"{self.epsilon:.4g} at delta = {self.delta:g} ({self.accountant})")


def resolve(privacy, sampling: Sampling, rounds: int, noise_multiplier=None) -> PrivacyPlan:
    """The run's plan. `noise_multiplier`, when given, is the z a checkpoint recorded: a resumed run keeps
    its noise even when `rounds` (and with it target_epsilon's calibration) changed."""
    if not privacy.enabled:
        raise ValueError("resolve() plans a run with privacy.mechanism = 'gaussian'")
    accounting.check_accountant(privacy.accountant, sampling)
    z = noise_multiplier
    if z is None:
        z = privacy.noise_multiplier
        if privacy.target_epsilon is not None:
            z = accounting.noise_for_epsilon(privacy.target_epsilon, rounds, privacy.delta, sampling,
                                             privacy.accountant)
            _check_calibrated(privacy, z)
    sigma_b = count_stddev(privacy, sampling) if privacy.adaptive_clip else None
    z_update = z if sigma_b is None else adjusted_noise_multiplier(z, sigma_b)
    eps = accounting.epsilon(rounds, privacy.delta, sampling, z, privacy.accountant)
    return PrivacyPlan(z, z_update, sigma_b, sampling, int(rounds), privacy.delta, privacy.accountant, eps)


def _check_calibrated(privacy, z):
    """The z that target_epsilon picked must lie in noise_multiplier's range too (docs/how-to/privacy.md)."""
    if not noise_ok(z, privacy.accountant):
        raise ConfigError(f"privacy.target_epsilon = {privacy.target_epsilon:g}: needs noise multiplier {z:.4g} "
                          f"here, outside the range noise_multiplier allows "
                          f"({noise_range(privacy.accountant)}); choose another target_epsilon")


def make_adaptive_clip(privacy, plan: PrivacyPlan):
    """The adaptive clip of this run, or None when `privacy.adaptive_clip` is off."""
    if not privacy.adaptive_clip:
        return None
    return AdaptiveClip(privacy.clip, privacy.target_quantile, privacy.clip_lr, plan.count_stddev,
                        plan.sampling.expected_size)


def sampling_of(cfg) -> Sampling:
    return Sampling(cfg.server.sampling, cfg.partition.clients, cfg.server.clients_per_round)


def stage_problems(cfg, algo_cls) -> list:
    """Why this config cannot run under privacy.mechanism = gaussian, one line each (empty when it can)."""
    found = check(cfg.privacy, algorithm=cfg.algorithm, sampling=sampling_of(cfg),
                       client_steps=cfg.client.steps, algo_cls=algo_cls)
    if algorithm_problems(cfg.algorithm, cfg.client.steps, algo_cls):
        return found
    # Algorithms that declare no problem: the stage serves one clipped vector per client, summed by the
    # round's reduction.
    name = cfg.algorithm.name
    if algo_cls.protocol != REDUCE:
        found.append(f"algorithm.name = {name!r} with privacy.mechanism = 'gaussian': its uploads travel by "
                     f"the {algo_cls.protocol!r} protocol, not by one reduction of per-client updates, so they "
                     f"cannot be clipped where the client trains and noised once on the sum")
    elif algo_cls.up_vectors != 1:
        found.append(f"algorithm.name = {name!r} with privacy.mechanism = 'gaussian': each client uploads "
                     f"{algo_cls.up_vectors} vectors, and only the model update is clipped and noised")
    return found
