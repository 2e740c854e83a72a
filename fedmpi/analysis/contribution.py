"""How much each client's participation is worth: Shapley values of a cooperative game over clients.

A game gives every subset S of the players (clients) a value v(S): in a counterfactual study, the final test
accuracy of the run in which only the clients of S count (`counterfactual.drop` = every other client). The
Shapley value of player i is its marginal contribution v(S + i) - v(S) averaged over the orders in which the
players can join:

    phi_i = sum over S not containing i of |S|! (n - |S| - 1)! / n! * (v(S + i) - v(S))

The only attribution that is efficient (sum phi = v(N) - v(empty)), symmetric, gives a null player 0 and adds
over games. Here, as pure functions of values already measured or of a callable that measures them:

- `exact_shapley`: by enumeration of all 2^n subsets (every run of the study made);
- `leave_one_out`: v(N) - v(N minus i), n + 1 runs, blind to substitutes (two clients holding the same data
  each get 0);
- `tmc_shapley`: Truncated Monte Carlo (Ghorbani & Zou, "Data Shapley", ICML 2019), which asks for the
  values of permutations' prefixes only, and stops scanning a permutation once its prefix is as good as
  everyone together;
- `rank_correlation`: Spearman's rho between two attributions, to say whether two estimates order the clients
  alike.

The within-round estimates from recorded client updates (GTG-Shapley, and the exact per-round values) are in
fedmpi.analysis.contribution_rounds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Estimate:
    """A sampled Shapley estimate. `values` {player: mean marginal contribution}; `stderr` {player: standard
    error of that mean, the marginals' sample standard deviation over sqrt(permutations); NaN from a single
    permutation}; `evaluated` the subsets whose values were asked for (each once: its size is the cost, in runs
    or model evaluations); `permutations` how many orders were scanned."""

    values: dict
    stderr: dict
    evaluated: frozenset
    permutations: int


def _check_players(players) -> tuple:
    players = tuple(players)
    if not players:
        raise ValueError("players: empty; a game needs at least one player")
    if len(set(players)) != len(players):
        raise ValueError(f"players: {list(players)} names a player twice; each player once")
    return players


def shapley_weights(n: int) -> list:
    """|S|! (n - |S| - 1)! / n! for |S| = 0..n-1: the probability that a given player joins right after exactly
    the players of a given S of that size, in a uniformly random order."""
    return [math.factorial(s) * math.factorial(n - s - 1) / math.factorial(n) for s in range(n)]


def exact_shapley(values: Mapping[frozenset, float], players: Sequence[int]) -> dict[int, float]:
    """{player: Shapley value} of the game `values` ({frozenset of players: v(S)}, every subset of `players`
    present, the empty set included; keys with other players are ignored). ValueError naming a missing subset.
    n 2^(n-1) terms: meant for the few clients a study can run every subset of."""
    players = _check_players(players)
    n = len(players)
    table = np.empty(1 << n)        # v of the subset whose bit j says whether players[j] is in it
    missing = []
    for mask in range(1 << n):
        subset = frozenset(p for j, p in enumerate(players) if mask >> j & 1)
        if subset in values:
            table[mask] = float(values[subset])
        else:
            missing.append(subset)
    if missing:
        first = sorted(missing[0])
        raise ValueError(f"values: no value for the subset {first} ({len(missing)} of the {1 << n} subsets of "
                         f"players {list(players)} missing); the exact Shapley value needs v(S) for every subset, "
                         f"the empty set included")
    weights = shapley_weights(n)
    sizes = [bin(mask).count("1") for mask in range(1 << n)]
    result = {}
    for j, player in enumerate(players):
        bit = 1 << j
        total = 0.0
        for mask in range(1 << n):
            if not mask & bit:
                total += weights[sizes[mask]] * (table[mask | bit] - table[mask])
        result[player] = total
    return result


def leave_one_out(v_full: float, without: Mapping[int, float]) -> dict[int, float]:
    """{player: v(N) - v(N minus that player)}, from v(N) and {player: v(N minus player)}."""
    return {player: float(v_full) - float(value) for player, value in without.items()}


class CachedValue:
    """`value` asked at most once per subset; `asked` the subsets it was asked for."""

    def __init__(self, value: Callable[[frozenset], float]):
        self.value = value
        self.known = {}

    def __call__(self, subset: frozenset) -> float:
        subset = frozenset(subset)
        if subset not in self.known:
            self.known[subset] = float(self.value(subset))
        return self.known[subset]

    @property
    def asked(self) -> frozenset:
        return frozenset(self.known)


def _check_count(name, count, least):
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < least:
        raise ValueError(f"{name} = {count!r}: expected an integer >= {least}")


def tmc_shapley(value: Callable[[frozenset], float], players: Sequence[int], *, permutations: int,
                tolerance: float, seed: int, patience: int = 1) -> Estimate:
    """Truncated Monte Carlo Shapley (Ghorbani & Zou 2019). Each of `permutations` uniformly random orders of
    `players` (numpy default_rng(seed)) is scanned from the empty set: each player's marginal is v(prefix with
    it) - v(prefix without it). Once |v(N) - v(prefix)| < tolerance * |v(N)| for `patience` prefixes in a row,
    the scan stops and the remaining players' marginals are 0: a prefix already as good as everyone leaves
    little to add, and the costly values (whole runs) of larger prefixes are never asked for.

    Follows the reference code (github.com/amiratag/DataShapley, DShap.py `one_iteration`, commit 303d91d,
    a prefix's distance to the full score checked after its value is known) with these differences:
    - v(N) is `value(players)`, not a bagged mean over test resamples, and v(empty) is `value(frozenset())`
      (the reference: the score of an untrained model);
    - the test is strict (<), so that tolerance 0 never truncates and gives the unbiased permutation estimate
      (the reference's <= would stop at a prefix that merely equals v(N), where a non-monotone game still
      moves);
    - `patience` prefixes in a row (the reference: more than 5, i.e. patience 6; the paper and the default
      here: the first).
    `value` (frozenset -> float) is asked once per distinct subset (cached); `Estimate.evaluated` lists them."""
    players = _check_players(players)
    _check_count("permutations", permutations, 1)
    _check_count("patience", patience, 1)
    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"tolerance = {tolerance!r}: expected a finite number >= 0 (0: never truncate)")
    v = CachedValue(value)
    n = len(players)
    v_full, v_empty = v(frozenset(players)), v(frozenset())
    close = tolerance * abs(v_full)
    rng = np.random.default_rng(seed)
    marginals = np.zeros((permutations, n))
    for k in range(permutations):
        order = rng.permutation(n)
        prefix, previous, near_full = set(), v_empty, 0
        for j in order:
            prefix.add(players[j])
            current = v(frozenset(prefix))
            marginals[k, j] = current - previous
            previous = current
            near_full = near_full + 1 if abs(v_full - current) < close else 0
            if near_full >= patience:
                break               # the rest of this order's marginals stay 0
    return _estimate(players, marginals, v.asked)


def _estimate(players, marginals, asked) -> Estimate:
    """The Estimate of rows of marginals [permutation, player]."""
    count = marginals.shape[0]
    means = marginals.mean(axis=0)
    errors = (marginals.std(axis=0, ddof=1) / math.sqrt(count) if count > 1
              else np.full(len(players), np.nan))
    return Estimate(values={p: float(m) for p, m in zip(players, means)},
                    stderr={p: float(e) for p, e in zip(players, errors)},
                    evaluated=frozenset(asked), permutations=int(count))


def average_ranks(values) -> np.ndarray:
    """Ranks 1..n of `values`, tied values sharing the mean of the ranks they span."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    start = 0
    while start < len(values):
        stop = start
        while stop + 1 < len(values) and values[order[stop + 1]] == values[order[start]]:
            stop += 1
        ranks[order[start:stop + 1]] = (start + stop) / 2 + 1
        start = stop + 1
    return ranks


def rank_correlation(a: Mapping, b: Mapping) -> float:
    """Spearman's rho between two attributions over their common keys: the Pearson correlation of their
    ranks, ties given average ranks. NaN where one side ranks every common key alike (rho undefined);
    ValueError with fewer than two common keys."""
    keys = [k for k in a if k in b]
    if len(keys) < 2:
        raise ValueError(f"rank_correlation: {len(keys)} key(s) in common; a rank correlation needs at least 2")
    ra = average_ranks([a[k] for k in keys])
    rb = average_ranks([b[k] for k in keys])
    da, db = ra - ra.mean(), rb - rb.mean()
    scale = math.sqrt(float(da @ da) * float(db @ db))
    return float(da @ db) / scale if scale > 0 else float("nan")
