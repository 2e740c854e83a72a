"""The robust aggregators (`server.aggregator`), each a rule over the round's update matrix seen in chunks.

A rule declares how many passes over the chunks it needs (`passes`: every rank iterates the same schedule,
so the count is known before the first chunk moves) and, in `aggregate`, runs exactly that many sweeps:
`sweep(visit)` calls `visit(lo, hi, rows)` for every chunk of coordinates [lo, hi) with the [n, hi - lo]
float32 rows of the round's n counted clients in client-id order. The arithmetic is the pure functions of
fedmpi.robust.aggregators; what a rule keeps between passes is at most a few d-vectors and an n x n matrix.

`aggregate(sweep, w, dim, block, server_update)` returns an `Outcome`: the update (float64 [d], the rule's
replacement for the weighted mean of the updates, which the server optimizer then applies) and each client's
weight in it (`robust_weight`: its share, summing to one, except norm_bound's clip factors; see
docs/how-to/robustness.md). A rule with `excludes = True` gives excluded clients a share of zero, and the round then
reports detection figures.

Passes: mean, median, trimmed_mean 1; krum, multi_krum, bulyan, norm_bound, fltrust 2 (statistics, then the
aggregate); geomed and centered_clip iterations + 1 (each pass computes a new centre and the distances to it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedmpi.robust import aggregators as agg
from fedmpi.robust.chunks import blocks


@dataclass
class Outcome:
    update: np.ndarray          # float64 [dim]
    weights: np.ndarray         # float64 [n]: each client's share of the aggregate (robust_weight)


def shares(w, weighted=True) -> np.ndarray:
    """The clients' weights p_i summing to one: w_i / sum_j w_j, or 1/n each when not `weighted`."""
    w = np.asarray(w, dtype=np.float64)
    if not weighted or w.sum() <= 0:
        w = np.ones_like(w)
    return w / w.sum()


def krum_f(f, n) -> int:
    """The f a round of n counted clients can use with Krum (n > 2f + 2): f, or the largest that fits."""
    return min(f, max((n - 3) // 2, 0))


def bulyan_f(f, n) -> int:
    """The f a round of n counted clients can use with Bulyan (n >= 4f + 3): f, or the largest that fits."""
    return min(f, max((n - 3) // 4, 0))


class Rule:
    name = ""
    excludes = False        # a share of zero means the client was left out (detection figures apply)
    needs_server_update = False
    uses: tuple = ()        # a plug-in's server.robust keys (fedmpi.robust.catalog; fedmpi's own: keys.USES)

    def __init__(self, keys):
        self.keys = keys

    def passes(self) -> int:
        return 1

    def aggregate(self, sweep, w, dim, block, server_update=None) -> Outcome:
        raise NotImplementedError


class Mean(Rule):
    """The weighted mean, chunk by chunk: FedAvg's aggregate through the gather (for omniscient attacks)."""

    name = "mean"

    def aggregate(self, sweep, w, dim, block, server_update=None):
        p, out = shares(w, self.keys.weighted), np.empty(dim)

        def visit(lo, hi, rows):
            out[lo:hi] = agg.weighted_mean(rows, p)

        sweep(visit)
        return Outcome(out, p)


class _CoordinateWise(Rule):
    def trim(self, n) -> int:
        raise NotImplementedError

    def aggregate(self, sweep, w, dim, block, server_update=None):
        n = len(w)
        k = self.trim(n)
        out, used = np.empty(dim), np.zeros(n)

        def visit(lo, hi, rows):
            out[lo:hi], counts = agg.trimmed_mean(rows, k)
            used[:] += counts

        sweep(visit)
        return Outcome(out, used / used.sum())


class Median(_CoordinateWise):
    name = "median"

    def trim(self, n):
        return (n - 1) // 2


class TrimmedMean(_CoordinateWise):
    """k = floor(beta * n) values trimmed at each end; a round too small for that trims (n - 1) // 2."""

    name = "trimmed_mean"

    def trim(self, n):
        return min(int(np.floor(self.keys.beta * n)), (n - 1) // 2)


def _gram_pass(sweep, n, block):
    g = np.zeros((n, n))

    def visit(lo, hi, rows):
        for a, b in blocks(lo, hi, block):
            g[:] += agg.gram(rows[:, a:b])

    sweep(visit)
    return agg.sq_distances(g)


class MultiKrum(Rule):
    """Pass 1 accumulates the Gram matrix (hence all pairwise distances); pass 2 averages the m clients of
    lowest score, weighted by p_i among them (weighted: false, alike)."""

    name = "multi_krum"
    excludes = True

    def passes(self):
        return 2

    def chosen(self, n):
        f = krum_f(self.keys.f, n)
        return min(self.keys.m or n - f, n - f)

    def aggregate(self, sweep, w, dim, block, server_update=None):
        n = len(w)
        dist = _gram_pass(sweep, n, block)
        keep = agg.multi_krum_select(dist, krum_f(self.keys.f, n), self.chosen(n))
        p = np.zeros(n)
        p[keep] = shares(np.asarray(w)[keep], self.keys.weighted)
        out = np.empty(dim)

        def visit(lo, hi, rows):
            out[lo:hi] = agg.weighted_mean(rows[keep], p[keep])

        sweep(visit)
        return Outcome(out, p)


class Krum(MultiKrum):
    name = "krum"

    def chosen(self, n):
        return 1


class Bulyan(Rule):
    """Pass 1: the Gram matrix, then theta = n - 2f clients chosen by iterated Krum (scores over at least
    `min_neighbours` others); pass 2: per coordinate, the mean of the beta = theta - 2f selected values closest
    to their median (unweighted)."""

    name = "bulyan"
    excludes = True

    def passes(self):
        return 2

    def aggregate(self, sweep, w, dim, block, server_update=None):
        n = len(w)
        f = bulyan_f(self.keys.f, n)
        dist = _gram_pass(sweep, n, block)
        keep = agg.bulyan_select(dist, f, n - 2 * f, self.keys.min_neighbours)
        out, used = np.empty(dim), np.zeros(n)

        def visit(lo, hi, rows):
            out[lo:hi], counts = agg.bulyan_coordinates(rows[keep], f)
            used[keep] += counts

        sweep(visit)
        return Outcome(out, used / used.sum())


class _Centred(Rule):
    """Rules that iterate a centre: pass 0 computes the start and the distances to it, each later pass the
    next centre from the previous pass's distances and the distances to the new one."""

    def passes(self):
        return self.keys.iterations + 1

    def aggregate(self, sweep, w, dim, block, server_update=None):
        n = len(w)
        p = shares(w, self.keys.weighted)
        centre, sq = np.zeros(dim), np.zeros(n)
        coef = None
        for step in range(self.passes()):
            coef = self.coefficients(step, p, np.sqrt(sq))
            sq = np.zeros(n)

            def visit(lo, hi, rows, coef=coef, sq=sq):
                centre[lo:hi] = self.next_centre(centre[lo:hi], rows, coef)
                for a, b in blocks(lo, hi, block):
                    diff = agg.as64(rows[:, a:b]) - centre[lo + a: lo + b][None, :]
                    sq[:] += (diff * diff).sum(axis=1)

            sweep(visit)
        return Outcome(centre, coef / coef.sum() if coef.sum() > 0 else coef)


class GeoMed(_Centred):
    """RFA's smoothed Weiszfeld iterations (Pillutla et al. 2022) from the weighted mean: z_{l+1} =
    sum_i beta_i u_i, beta_i proportional to p_i / max(nu, ||z_l - u_i||); `iterations` updates, no early
    stop (the pass count is fixed in advance)."""

    name = "geomed"

    def coefficients(self, step, p, distances):
        return p if step == 0 else agg.weiszfeld_weights(p, distances, self.keys.nu)

    def next_centre(self, centre, rows, coef):
        return agg.weighted_mean(rows, coef)


class CenteredClip(_Centred):
    """Centered clipping (Karimireddy et al. 2021): v_{l+1} = v_l + sum_i p_i (u_i - v_l) min(1, tau / ||u_i
    - v_l||), from v_0 = 0 (the unchanged model; the paper starts from the previous round's momentum, which
    fedmpi's server optimizer keeps instead)."""

    name = "centered_clip"

    def coefficients(self, step, p, distances):
        return None if step == 0 else p * agg.clip_factors(distances, self.keys.tau)

    def next_centre(self, centre, rows, coef):
        if coef is None:        # pass 0: the start v_0 = 0, only its distances are measured
            return centre
        return (1.0 - coef.sum()) * centre + agg.weighted_mean(rows, coef)


class NormBound(Rule):
    """Each update clipped at `bound`, then the weighted mean: sum_i p_i min(1, bound / ||u_i||) u_i. Under the
    plain reduction the same clip runs on the clients' uploads (fedmpi.round.robust_stage) and no gather is
    needed; through the gather (with an omniscient attack) pass 1 measures the norms, pass 2 averages."""

    name = "norm_bound"

    def passes(self):
        return 2

    def aggregate(self, sweep, w, dim, block, server_update=None):
        n = len(w)
        sq = _sq_norms(sweep, n, block)
        coef = shares(w, self.keys.weighted) * agg.clip_factors(np.sqrt(sq), self.keys.bound)
        out = np.empty(dim)

        def visit(lo, hi, rows):
            out[lo:hi] = agg.weighted_mean(rows, coef)

        sweep(visit)
        return Outcome(out, agg.clip_factors(np.sqrt(sq), self.keys.bound))


def _sq_norms(sweep, n, block, v=None):
    """||u_i||^2 (and <u_i, v> where `v` is given) accumulated block by block in one pass."""
    sq, dots = np.zeros(n), np.zeros(n)

    def visit(lo, hi, rows):
        for a, b in blocks(lo, hi, block):
            r = agg.as64(rows[:, a:b])
            sq[:] += (r * r).sum(axis=1)
            if v is not None:
                dots[:] += agg.row_dots(r, v[lo + a: lo + b])

    sweep(visit)
    return sq if v is None else (sq, dots)


class FLTrust(Rule):
    """FLTrust (Cao et al. 2021): the server's own update g0 (one round of the clients' local training on
    its set, from x); pass 1 the cosines with g0 and the norms, pass 2 sum_i c_i u_i (see
    aggregators.fltrust_coefficients). Sample counts play no part, as in the paper."""

    name = "fltrust"
    excludes = True
    needs_server_update = True

    def passes(self):
        return 2

    def aggregate(self, sweep, w, dim, block, server_update=None):
        n = len(w)
        g0 = np.asarray(server_update, dtype=np.float64)
        g0_sq = sum(float(g0[a:b] @ g0[a:b]) for a, b in blocks(0, dim, block))
        sq, dots = _sq_norms(sweep, n, block, g0)
        coef, trust = agg.fltrust_coefficients(dots, sq, g0_sq)
        out = np.empty(dim)

        def visit(lo, hi, rows):
            out[lo:hi] = agg.weighted_mean(rows, coef)

        sweep(visit)
        total = trust.sum()     # each rescaled update's share: its trust score's
        return Outcome(out, trust / total if total > 0 else trust)


RULES = {cls.name: cls for cls in (Mean, Median, TrimmedMean, Krum, MultiKrum, Bulyan, GeoMed, CenteredClip,
                                   NormBound, FLTrust)}


def build_rule(name, keys) -> Rule:
    """fedmpi's own rule `name` (a plug-in's too: fedmpi.robust.catalog.build_rule)."""
    return RULES[name](keys)
