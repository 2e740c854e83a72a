"""Shamir's t-out-of-n secret sharing over the prime field GF(2^127 - 1) (Shamir 1979), as SecAgg shares each
client's two secrets (its key-agreement secret and its self-mask seed, both < 2^64).

A secret s is the constant term of a random polynomial f of degree t - 1 over GF(P); holder x (x = 1..n,
never 0) receives f(x). Any t shares give s back by Lagrange interpolation at 0; t - 1 shares are
independent of s (each value of s is equally likely given them). Python integers keep the arithmetic exact.
The coefficients come from the sharing client's stream, so the shares do not depend on -n.
"""

from __future__ import annotations

P = 2 ** 127 - 1            # a Mersenne prime: every secret < 2^64 and every holder index is a field element
SHARE_BYTES = 16            # one field element on the wire


class NotEnoughShares(ValueError):
    """Fewer than t shares: the secret cannot be reconstructed (the protocol aborts the round)."""


def share(secret: int, threshold: int, holders, rng) -> dict:
    """{holder x: f(x)} for the holders' indices (distinct integers >= 1), f(0) = `secret`, degree
    `threshold` - 1, coefficients uniform in GF(P) from the numpy Generator `rng`."""
    if not 0 <= secret < P:
        raise ValueError(f"secret {secret} is not an element of GF(2^127 - 1)")
    if threshold < 1:
        raise ValueError(f"threshold {threshold} must be >= 1")
    coefficients = [int(secret)] + [_element(rng) for _ in range(threshold - 1)]
    out = {}
    for x in holders:
        if not 0 < int(x) < P:
            raise ValueError(f"holder index {x} must be in 1..P-1")
        value = 0
        for a in reversed(coefficients):        # Horner
            value = (value * int(x) + a) % P
        out[int(x)] = value
    return out


def reconstruct(shares: dict, threshold: int) -> int:
    """The secret from any `threshold` of `shares` ({x: f(x)}); NotEnoughShares when there are fewer."""
    if len(shares) < threshold:
        raise NotEnoughShares(f"{len(shares)} shares, the threshold is {threshold}")
    points = sorted(shares.items())[:threshold]
    secret = 0
    for i, (xi, yi) in enumerate(points):
        num = den = 1
        for j, (xj, _) in enumerate(points):
            if i != j:
                num = num * (-xj) % P
                den = den * (xi - xj) % P
        secret = (secret + yi * num * pow(den, P - 2, P)) % P
    return secret


def _element(rng) -> int:
    """A uniform element of GF(P) (127 random bits, rejecting the one value P itself)."""
    while True:
        hi = int(rng.integers(0, 2 ** 63, dtype="uint64"))
        lo = int(rng.integers(0, 2 ** 64, dtype="uint64"))
        value = (hi << 64) | lo
        if value < P:
            return value
