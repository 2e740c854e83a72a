"""The omniscient model attacks: malicious updates crafted from the round's benign updates.

In simulation these attacks are GIVEN the round's benign updates: rank 0 crafts the malicious clients'
uploads inside the chunked gather (fedmpi.round.robust_gather), after the benign rows of a chunk have arrived
and before the aggregator sees it, replacing the malicious clients' own rows (what they trained is
discarded). This is the standard threat model of these papers (the attacker knows, or estimates well, the
benign updates); it needs a protocol that sees every update, so with server.aggregator: mean the run goes
through the gather too (docs/how-to/robustness.md). Every malicious client of the round uploads the same vector.

  alie     mu - z sigma (Baruch et al. 2019, "A Little Is Enough"): coordinate-wise mean and standard
           deviation of the benign updates; z from attack.z, or z_max = Phi^-1((n - s) / n) with
           s = floor(n / 2 + 1) - f for n counted clients of which f are malicious.
  ipm      -epsilon mu (Xie et al. 2020, inner-product manipulation).
  min_max  mu - gamma p with the largest gamma such that the malicious update is no farther from any
           benign update than the two farthest benign updates are from each other (Shejwalkar and
           Houmansadr 2021, AGR-agnostic).
  min_sum  the same, with the sum of squared distances to the benign updates bounded by the smallest such
           sum of a benign update (attack.sum_bound: min, the authors' code; max: the largest).
p is attack.perturbation: `std` (sigma), `unit` (mu / ||mu||) or `sign` (sign(mu)). min_max and min_sum
need one pass over the chunks first: ||mu - gamma p - b_i||^2 = A_i - 2 gamma B_i + gamma^2 C with A_i =
||mu - b_i||^2, B_i = <mu - b_i, p>, C = ||p||^2, all sums over coordinates accumulated chunk by chunk with
the benign Gram matrix; gamma is then the exact root of these quadratics (the paper searches for it by
halving steps from gamma = 10; docs/explanation/baselines.md).

A round with no benign counted update leaves the malicious rows as trained; sigma is 0 with one benign row.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from fedmpi.robust import aggregators as agg
from fedmpi.robust.chunks import BLOCK, blocks

NEEDS_PASS = ("min_max", "min_sum")


def z_max(n, f) -> float:
    """ALIE's z for n clients of which f are malicious: Phi^-1((n - s) / n), s = floor(n / 2 + 1) - f
    (Baruch et al. 2019, Section 3); 0 where that share is at most one half."""
    s = math.floor(n / 2 + 1) - f
    share = (n - s) / n
    return NormalDist().inv_cdf(share) if 0.5 < share < 1 else 0.0


def largest_gamma(kind, a, b, c, pairwise, sum_bound="min") -> float:
    """The largest gamma >= 0 with the malicious update within the bound: `a`, `b` are A_i and B_i over the
    benign rows, `c` is C, `pairwise` their squared pairwise distances (module docstring); `sum_bound`
    (min_sum): whether the smallest or the largest benign sum of squared distances is the bound."""
    if c <= 0 or len(a) == 0:
        return 0.0
    if kind == "min_max":
        limit = float(pairwise.max())
        disc = np.maximum(b * b - c * (a - limit), 0.0)
        return max(float(((b + np.sqrt(disc)) / c).min()), 0.0)
    sums = pairwise.sum(axis=1)
    # sum_i ||mu - b_i||^2 is at most every benign row's sum (its excess is n ||b_j - mu||^2), so gamma = 0
    # always meets either bound and the quadratic has a real root.
    limit = float(sums.min() if sum_bound == "min" else sums.max())
    qa, qb, qc = len(a) * c, float(b.sum()), float(a.sum()) - limit
    return max((qb + math.sqrt(max(qb * qb - qa * qc, 0.0))) / qa, 0.0)


class OmniscientAttack:
    """One round's attack: `malicious` marks the rows (client-id order) of the round's malicious clients."""

    def __init__(self, keys, malicious, block=BLOCK):
        self.keys, self.block = keys, block
        self.malicious = np.asarray(malicious, dtype=bool)
        self.benign = ~self.malicious
        self.passes = 1 if keys.name in NEEDS_PASS else 0
        self.gamma = 0.0
        self.mu_norm = 1.0
        n, f = len(self.malicious), int(self.malicious.sum())
        self.z = keys.z if keys.z is not None else z_max(n, f)
        self.active = f > 0 and self.benign.any()

    def _stats(self, rows):
        b = agg.as64(rows[self.benign])
        mu = b.mean(axis=0)
        sigma = b.std(axis=0, ddof=1) if len(b) > 1 else np.zeros_like(mu)
        return b, mu, sigma

    def _direction(self, mu, sigma):
        kind = self.keys.perturbation
        if kind == "std":
            return sigma
        if kind == "unit":
            return mu / self.mu_norm if self.mu_norm > 0 else np.zeros_like(mu)
        return np.sign(mu)

    def prepare(self, sweep):
        """min_max, min_sum: the pass over the true rows that finds gamma."""
        if not self.passes:
            return
        nb = int(self.benign.sum())
        g, a, b_mu, b_p = np.zeros((nb, nb)), np.zeros(nb), np.zeros(nb), np.zeros(nb)
        sums = {"c": 0.0, "mu2": 0.0}

        def visit(lo, hi, rows):
            if not self.active:
                return
            for s, e in blocks(lo, hi, self.block):
                b, mu, sigma = self._stats(rows[:, s:e])
                diff = mu[None, :] - b
                g[:] += b @ b.T
                a[:] += (diff * diff).sum(axis=1)
                b_mu[:] += agg.row_dots(diff, mu)
                sums["mu2"] += float((mu * mu).sum())
                if self.keys.perturbation != "unit":
                    p = self._direction(mu, sigma)
                    b_p[:] += agg.row_dots(diff, p)
                    sums["c"] += float((p * p).sum())

        sweep(visit)
        if not self.active:
            return
        self.mu_norm = math.sqrt(sums["mu2"])
        if self.keys.perturbation == "unit":
            b_p, sums["c"] = (b_mu / self.mu_norm if self.mu_norm > 0 else b_mu * 0), float(self.mu_norm > 0)
        self.gamma = largest_gamma(self.keys.name, a, b_p, sums["c"], agg.sq_distances(g), self.keys.sum_bound)

    def crafted(self, rows):
        """The malicious update for these coordinates (float64)."""
        _, mu, sigma = self._stats(rows)
        name = self.keys.name
        if name == "alie":
            return mu - self.z * sigma
        if name == "ipm":
            return -self.keys.epsilon * mu
        return mu - self.gamma * self._direction(mu, sigma)

    def craft(self, lo, hi, rows):
        """Replaces the malicious rows of the chunk [lo, hi) in place."""
        if self.active:
            rows[self.malicious] = self.crafted(rows).astype(np.float32)[None, :]
