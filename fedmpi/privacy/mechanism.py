"""DP-FedAvg's mechanism as pure functions on flat torch vectors (docs/how-to/privacy.md).

One round, with the parts the round loop calls:

    C = adaptive.clip if adaptive else cfg.clip                    # same on every rank
    on each client's rank:  norm = clip_update_(delta, C)          # uniform weight 1, no n_i
                            sum += delta;  count += adaptive.indicator(norm)
    reduce (sum, count) to rank 0, then on rank 0 only:
                            add_noise_(sum, z_update * C, seed, round)
                            average = dp_fedavg_average(sum, expected_size)
                            adaptive.step(count, seed, round)      # C for the next round

Every random number comes from a stream keyed by (seed, round) and is drawn on rank 0 alone, so the
result does not depend on `-n`, on where a client lives, or on the device.
"""

from __future__ import annotations

import math

import numpy as np

from fedmpi.core import rng
from fedmpi.core.errors import ConfigError, InputError
from fedmpi.core.lazy import torch

# Extra key of the Poisson draw under (seed, SELECT, round): keeps it apart from the fixed-size draw
# (seed, SELECT, round) and from FedSkip's slot order (seed, SELECT, round, 1).
POISSON_KEY = 2
# Extra key of the adaptive-clipping count noise under (seed, PRIVACY, round); the update's own noise
# uses (seed, PRIVACY, round) with no extra key.
COUNT_KEY = 1


def clip_update_(delta: torch.Tensor, clip: float) -> float:
    """Scales `delta` in place so that its L2 norm is at most `clip`; returns the norm before clipping.

    An update whose norm is not finite (a diverged client) is zeroed rather than scaled: NaN times a
    factor is still NaN, and the noise is calibrated for updates of norm <= clip. After scaling, the
    float32 norm equals `clip` up to rounding (a relative 1e-7)."""
    norm = float(torch.linalg.vector_norm(delta))
    if not math.isfinite(norm):
        delta.zero_()
    elif norm > clip:
        delta.mul_(clip / norm)
    return norm


def gaussian_noise(dim: int, std: float, seed: int, round_: int, device="cpu", dtype=None) -> torch.Tensor:
    """N(0, std^2) noise of length `dim` for round `round_`, the same numbers on every device and `-n`.

    Drawn on the CPU in float64 from a torch.Generator seeded with rng.torch_seed(seed, PRIVACY, round_)
    (float64 because torch's CPU float32 normal sampler has a vectorized path whose numbers depend on
    the CPU's instruction set), then rounded to `dtype` (None: float32) and moved to `device`."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(rng.torch_seed(seed, rng.PRIVACY, round_))
    noise = torch.randn(int(dim), generator=generator, dtype=torch.float64)
    noise.mul_(float(std))
    return noise.to(device=device, dtype=dtype or torch.float32)     # None: float32


def add_noise_(summed: torch.Tensor, std: float, seed: int, round_: int) -> torch.Tensor:
    """Adds the round's noise to the reduced sum in place (rank 0, once per round)."""
    if std > 0:
        summed.add_(gaussian_noise(summed.numel(), std, seed, round_, summed.device, summed.dtype))
    return summed


def dp_fedavg_average(noised_sum: torch.Tensor, expected_size: float) -> torch.Tensor:
    """DP-FedAvg's average (McMahan et al. 2018): the noised sum of clipped updates, each weighted 1,
    divided by the EXPECTED cohort size (q N for Poisson sampling, S for fixed-size sampling).

    Why the expected size: the noise is calibrated to the sum, whose sensitivity is C (one client adds
    at most C). Dividing by a public constant keeps the average a post-processing of that one noised
    sum, so the guarantee carries over unchanged. Dividing by the realized count instead would make
    the denominator depend on who took part (under Poisson sampling the count itself reveals
    participation and would need its own noise), and a client could then move the average by more
    than C / size. The estimate stays unbiased: E[sum] / (q N) is the mean update. Uniform weights for
    the same reason: weighting by n_i would let a client with many samples exceed the bound."""
    if not expected_size > 0:
        raise ValueError(f"expected cohort size must be > 0, got {expected_size!r}")
    return noised_sum / float(expected_size)


def poisson_rate(clients_per_round: int, num_clients: int) -> float:
    """q for `server.sampling: poisson`: the expected cohort is `server.clients_per_round`."""
    return clients_per_round / num_clients


def poisson_select(seed: int, round_: int, num_clients: int, q: float) -> np.ndarray:
    """The round's cohort under Poisson sampling: sorted ids, each client in independently with
    probability q, drawn from rng.stream(seed, SELECT, round_, POISSON_KEY); the same on every rank.

    The cohort may be empty; the round then still releases noise (the accountant counts every round)."""
    if not 0 <= q <= 1:
        raise ValueError(f"Poisson sampling rate must be in [0, 1], got {q!r}")
    draws = rng.stream(seed, rng.SELECT, round_, POISSON_KEY).random(int(num_clients))
    return np.flatnonzero(draws < q)


# --- adaptive clipping (Andrew et al. 2021) ------------------------------------------------------


def default_count_stddev(expected_size: float) -> float:
    """The paper's sigma_b = expected cohort / 20."""
    return expected_size / 20.0


def adjusted_noise_multiplier(noise_multiplier: float, count_stddev: float) -> float:
    """z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2): the update's noise multiplier when the count query
    shares the budget, so that the pair costs exactly one Gaussian mechanism of multiplier z.

    Each client reports b_i - 1/2 (sensitivity 1/2), so the count's multiplier is 2 sigma_b, and
    Gaussian mechanisms compose as 1/z^2 = 1/z_Delta^2 + 1/(2 sigma_b)^2."""
    z, sigma_b = float(noise_multiplier), float(count_stddev)
    if z == 0:
        return 0.0
    if 2 * sigma_b <= z:
        raise ConfigError(
            f"privacy.clip_count_stddev = {sigma_b:g}: with adaptive_clip the count noise must exceed half "
            f"the noise multiplier (2 * clip_count_stddev > {z:g}); raise clip_count_stddev or "
            f"server.clients_per_round, or lower privacy.noise_multiplier")
    return (z ** -2 - (2 * sigma_b) ** -2) ** -0.5


class AdaptiveClip:
    """Quantile-based clip C (Andrew et al. 2021, geometric update); its state is the current C.

    Clients report b_i - 1/2 with b_i = 1[||Delta_i|| <= C] (centred so one client moves the sum by at
    most 1/2); rank 0 adds N(0, sigma_b^2) to the reduced sum, estimates the unclipped fraction
    b_hat = clamp(noised sum / expected size + 1/2, 0, 1) and sets C <- C exp(-eta_C (b_hat - gamma)).
    The clamp (as in TF Privacy's QuantileEstimatorQuery) keeps one very noisy round from moving C by
    more than exp(eta_C max(gamma, 1 - gamma))."""

    def __init__(self, clip, target_quantile, lr, count_stddev, expected_size):
        if not expected_size > 0:
            raise ValueError(f"expected cohort size must be > 0, got {expected_size!r}")
        self.clip = float(clip)
        self.target_quantile = float(target_quantile)
        self.lr = float(lr)
        self.count_stddev = float(count_stddev)
        self.expected_size = float(expected_size)

    def indicator(self, norm: float) -> float:
        """A client's report for the count: +1/2 if its pre-clip norm is within C, else -1/2."""
        return 0.5 if norm <= self.clip else -0.5

    def count_noise(self, seed: int, round_: int) -> float:
        return self.count_stddev * float(rng.stream(seed, rng.PRIVACY, round_, COUNT_KEY).standard_normal())

    def update(self, noised_sum: float) -> float:
        """Moves C from the noised sum of indicators; returns b_hat."""
        b_hat = min(1.0, max(0.0, float(noised_sum) / self.expected_size + 0.5))
        self.clip *= math.exp(-self.lr * (b_hat - self.target_quantile))
        return b_hat

    def step(self, indicator_sum: float, seed: int, round_: int) -> float:
        """Rank 0, once per round: noise the reduced sum of indicators, then update C."""
        return self.update(float(indicator_sum) + self.count_noise(seed, round_))

    def state(self) -> dict:
        return {"clip": np.array([self.clip], dtype=np.float64)}

    def load_state(self, state: dict):
        value = np.asarray(state.get("clip", ()), dtype=np.float64)
        if value.shape != (1,) or not (np.isfinite(value[0]) and value[0] > 0):
            raise InputError(f"adaptive clipping state 'clip' = {value!r}: expected one finite number > 0")
        self.clip = float(value[0])
