"""The integer side of secure aggregation, as pure functions on numpy arrays: float updates to integers
(clip, scale, stochastic rounding), the ring Z_{2^b} and back, the masks expanded from seeds, and the
distributed-DP noise added in integers before masking.

Masks are expanded by Philox (numpy's counter-based generator, Salmon et al. 2011) keyed by a seed through
SeedSequence: one 64-bit word per entry, its low b bits taken (uniform on Z_{2^b} because 2^b divides 2^64).
Arithmetic is uint64 with wraparound, i.e. exact modulo 2^64 and hence modulo 2^b.
"""

from __future__ import annotations

import math

import numpy as np

PAIR, SELF = 0, 1           # the two kinds of mask: domain separation in the PRG's key


def ring_mask(bits: int) -> np.uint64:
    return np.uint64((1 << bits) - 1) if bits < 64 else np.uint64(2 ** 64 - 1)


def expand(seed: int, length: int, bits: int, kind: int) -> np.ndarray:
    """PRG(seed): `length` uniform elements of Z_{2^bits} as uint64."""
    words = np.random.Philox(np.random.SeedSequence([int(seed) % 2 ** 128, kind])).random_raw(length)
    words = np.asarray(words, dtype=np.uint64)
    if bits < 64:
        np.bitwise_and(words, ring_mask(bits), out=words)
    return words


def clip_l2(x: np.ndarray, clip: float) -> tuple:
    """(x scaled into the L2 ball of radius `clip`, its norm before); a non-finite update becomes zeros."""
    norm = float(np.linalg.norm(x))
    if not math.isfinite(norm):
        return np.zeros_like(x), norm
    return (x * (clip / norm) if norm > clip else x), norm


def stochastic_round(x: np.ndarray, rng) -> np.ndarray:
    """Unbiased rounding to int64: floor(x) + 1 with probability x - floor(x) (E[round(x)] = x)."""
    low = np.floor(x)
    return (low + (rng.random(x.shape) < (x - low))).astype(np.int64)


def quantize(delta: np.ndarray, clip: float, scale: float, rng) -> tuple:
    """(integer update, its norm before clipping): round(scale * clip_C(delta)) for a float64 `delta`."""
    clipped, norm = clip_l2(np.asarray(delta, dtype=np.float64), clip)
    return stochastic_round(clipped * scale, rng), norm


def to_ring(q: np.ndarray, bits: int) -> np.ndarray:
    """Signed integers into Z_{2^bits} (two's complement, low bits)."""
    out = q.astype(np.int64).view(np.uint64).copy()
    if bits < 64:
        np.bitwise_and(out, ring_mask(bits), out=out)
    return out


def from_ring(v: np.ndarray, bits: int) -> np.ndarray:
    """Elements of Z_{2^bits} back to signed integers in [-2^(bits-1), 2^(bits-1))."""
    s = v.astype(np.uint64).view(np.int64).copy()
    if bits < 64:
        half = 1 << (bits - 1)
        s[s >= half] -= 1 << bits
    return s


def skellam(sigma: float, size: int, rng) -> np.ndarray:
    """Symmetric Skellam noise of variance sigma^2: Poisson(mu) - Poisson(mu), mu = sigma^2 / 2. Sums of
    independent Skellams are Skellam, so the survivors' sum is Skellam with their variances added."""
    mu = sigma * sigma / 2
    return rng.poisson(mu, size).astype(np.int64) - rng.poisson(mu, size).astype(np.int64)


def discrete_gaussian(sigma: float, size: int, rng) -> np.ndarray:
    """Discrete Gaussian N_Z(0, sigma^2) by Canonne, Kamath and Steinke's (2020) rejection from a discrete
    Laplace of scale t = floor(sigma) + 1, vectorized in float64 (their exact sampler uses rationals; the
    acceptance probabilities here are exact to float64 rounding)."""
    t = math.floor(sigma) + 1
    out = np.empty(size, dtype=np.int64)
    todo = np.arange(size)
    p = 1 - math.exp(-1 / t)
    while len(todo):
        n = len(todo)
        y = rng.geometric(p, n).astype(np.int64) - rng.geometric(p, n).astype(np.int64)
        accept = rng.random(n) < np.exp(-((np.abs(y) - sigma * sigma / t) ** 2) / (2 * sigma * sigma))
        out[todo[accept]] = y[accept]
        todo = todo[~accept]
    return out


NOISE_SAMPLERS = {"skellam": skellam, "discrete_gaussian": discrete_gaussian}
