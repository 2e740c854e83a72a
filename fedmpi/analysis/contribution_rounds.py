"""Within-round Shapley values from recorded client updates: no run is repeated, only models evaluated.

In round t the clients S of the round's participants would have produced FedAvg's model of their updates,

    model_t(S) = start_t + sum_{i in S} w_i delta_i / sum_{i in S} w_i       (model_t(empty) = start_t),

and a round's game is v_t(S) = utility(model_t(S)) (e.g. the test accuracy of that vector). A client's
contribution is the sum over rounds of its Shapley value in each round's game (0 in rounds it was not counted
in). `round_exact_shapley` enumerates every subset of each round's participants (FedML's MR-Shapley);
`gtg_shapley` samples (GTG-Shapley: Liu, Chen, Yu, Zhang, Luo, Yang, "GTG-Shapley: Efficient and Accurate
Participant Contribution Evaluation in Federated Learning", ACM TIST 2022).

`rounds` is {round t: a record with `start` (the global vector the round began from), `deltas` {client: its
update} and `weights` {client: its aggregation weight}}: what fedmpi.uploads.recorded.read_updates returns, or any
object with those three attributes (`RoundRecord` builds one from arrays).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import NamedTuple

import numpy as np

from fedmpi.analysis.contribution import CachedValue, Estimate, exact_shapley

# Subsets enumerated per round by `round_exact_shapley`: 2^12 model evaluations is already a study of its own.
MAX_EXACT_PLAYERS = 12


class RoundRecord(NamedTuple):
    """One round's recorded updates, in the shape of fedmpi.uploads.recorded.RoundUpdates."""

    start: np.ndarray
    deltas: dict
    weights: dict


class RoundGame:
    """Round t's game: v(S) = utility(FedAvg's model of the updates of S), each subset's model made and
    evaluated once (CachedValue)."""

    def __init__(self, t, record, utility: Callable[[np.ndarray], float]):
        self.t = t
        self.start = np.asarray(record.start)
        self.players = tuple(sorted(record.deltas))
        self.deltas = {cid: np.asarray(record.deltas[cid], dtype=np.float64) for cid in self.players}
        self.weights = {cid: float(record.weights[cid]) if cid in record.weights else math.nan
                        for cid in self.players}
        for cid in self.players:
            if not (math.isfinite(self.weights[cid]) and self.weights[cid] > 0):
                raise ValueError(f"rounds[{t}].weights[{cid}] = {record.weights.get(cid)!r}: every client with "
                                 f"a delta needs a finite weight > 0 (FedAvg's weighting)")
            if self.deltas[cid].shape != self.start.shape:
                raise ValueError(f"rounds[{t}].deltas[{cid}]: shape {self.deltas[cid].shape}, the round's start "
                                 f"has {self.start.shape}; an update has the model's entries")
        self.utility = utility
        self.value = CachedValue(self._evaluate)

    def model(self, subset: frozenset) -> np.ndarray:
        """start + the weighted mean of the updates of `subset` (start itself for the empty set), summed in
        float64 and returned in the start's dtype (what a run's global vector is)."""
        if not subset:
            return self.start.copy()
        total = sum(self.weights[c] for c in subset)
        mean = sum(self.weights[c] * self.deltas[c] for c in sorted(subset)) / total
        return (self.start.astype(np.float64) + mean).astype(self.start.dtype)

    def _evaluate(self, subset):
        return float(self.utility(self.model(subset)))


def _games(rounds, utility):
    if not rounds:
        raise ValueError("rounds: empty; expected {round: record with start, deltas, weights}")
    return [RoundGame(t, rounds[t], utility) for t in sorted(rounds)]


def round_exact_shapley(rounds: Mapping, utility: Callable[[np.ndarray], float]) -> dict[int, float]:
    """{client: sum over rounds of its exact Shapley value in the round's game} (FedML's MR-Shapley): 2^n model
    evaluations for a round of n clients, refused (ValueError) beyond MAX_EXACT_PLAYERS. A client in no
    round's deltas does not appear; one missing from a round gets 0 for it."""
    totals = {}
    for game in _games(rounds, utility):
        n = len(game.players)
        if n > MAX_EXACT_PLAYERS:
            raise ValueError(f"rounds[{game.t}]: {n} clients; the exact per-round values enumerate 2^n subsets, "
                             f"at most {MAX_EXACT_PLAYERS} clients (gtg_shapley samples instead)")
        values = {}
        for mask in range(1 << n):
            subset = frozenset(c for j, c in enumerate(game.players) if mask >> j & 1)
            values[subset] = game.value(subset)
        for cid, phi in exact_shapley(values, game.players).items():
            totals[cid] = totals.get(cid, 0.0) + phi
    return totals


def gtg_shapley(rounds: Mapping, utility: Callable[[np.ndarray], float], *, seed: int,
                round_threshold: float = 0.01, eps: float = 0.001, min_permutations: int = 30,
                last_k: int = 10, criterion: float = 0.05, max_permutations: int = 1000) -> Estimate:
    """GTG-Shapley over the recorded rounds: per round, guided and truncated permutation sampling of the
    round's game, the per-round means summed over rounds. Ported from FedML
    (github.com/FedML-AI/FedML, python/fedml/core/contribution/gtg_shapley_value.py, commit 03e11df), whose
    defaults these are:

    - between-round truncation: a round whose model moved the utility by at most `round_threshold`
      (|v(N) - v(empty)| <= round_threshold) gives every participant 0, and nothing else is evaluated;
    - within-round truncation: while scanning a permutation, once the prefix so far is within `eps` of the
      whole round's value (|v(N) - v(prefix)| < eps), each further player's marginal is 0 and its prefix is
      not evaluated;
    - guided sampling: permutations come in cycles of n, the k-th putting participant k first and the others
      in a random order (each client's marginal to the empty set, the largest term, measured every cycle);
    - convergence: after each cycle, once more than `min_permutations` permutations were scanned, stop when
      over the last `last_k` running means the mean relative change against the latest, averaged over
      players, is at most `criterion` for each of them (FedML's `_is_not_converged`).

    Differences from FedML: a truncated prefix's value is not stored as that subset's value (FedML's cache
    then hands the copied value to a later permutation that reaches the same subset untruncated); marginals
    are kept per client id rather than at index id - 1 (FedML assumes ids 1..n); `max_permutations` bounds a
    round that never meets the criterion (FedML loops on); v(empty) and v(N) are the utility of the round's
    start and of FedAvg's model of every update (FedML: the previous and the new global accuracy); each round's
    random orders come from numpy default_rng((seed, t)), so a round's estimate does not depend on the others.

    Estimate: `values` {client: summed per-round means} (every client of any round's deltas); `stderr` the
    per-round standard errors combined as independent (root of the sum of squares; 0 for a truncated round);
    `evaluated` the (round, subset) pairs whose models were evaluated; `permutations` summed over rounds."""
    if not (min_permutations >= 0 and last_k >= 1 and max_permutations >= 1 and criterion >= 0
            and round_threshold >= 0 and eps >= 0):
        raise ValueError(f"gtg_shapley: min_permutations = {min_permutations}, last_k = {last_k}, max_permutations "
                         f"= {max_permutations}, criterion = {criterion}, round_threshold = {round_threshold}, eps = "
                         f"{eps}: expected counts >= 0 (last_k, max_permutations >= 1) and thresholds >= 0")
    values, variances, evaluated, scanned = {}, {}, set(), 0
    for game in _games(rounds, utility):
        rng = np.random.default_rng([int(seed), int(game.t)])
        means, errors, count = _gtg_round(game, rng, round_threshold, eps, min_permutations, last_k, criterion,
                                          max_permutations)
        for cid in game.players:
            values[cid] = values.get(cid, 0.0) + means[cid]
            variances[cid] = variances.get(cid, 0.0) + errors[cid] ** 2
        evaluated.update((game.t, subset) for subset in game.value.asked)
        scanned += count
    return Estimate(values=values, stderr={c: math.sqrt(v) for c, v in variances.items()},
                    evaluated=frozenset(evaluated), permutations=scanned)


def _gtg_round(game, rng, round_threshold, eps, min_permutations, last_k, criterion, max_permutations):
    """({client: mean marginal}, {client: its standard error}, permutations scanned) of one round's game."""
    players, n = game.players, len(game.players)
    v_empty, v_full = game.value(frozenset()), game.value(frozenset(players))
    if abs(v_full - v_empty) <= round_threshold:
        return {c: 0.0 for c in players}, {c: 0.0 for c in players}, 0
    records = []
    while len(records) < max_permutations and not _converged(records, min_permutations, last_k, criterion):
        for first in range(n):
            if len(records) >= max_permutations:
                break
            others = np.array([j for j in range(n) if j != first])
            order = [first, *others[rng.permutation(n - 1)].tolist()]
            records.append(_scan(game, order, v_empty, v_full, eps))
    marginals = np.array(records)
    means = marginals.mean(axis=0)
    count = len(records)
    errors = marginals.std(axis=0, ddof=1) / math.sqrt(count) if count > 1 else np.full(n, np.nan)
    return ({c: float(m) for c, m in zip(players, means)}, {c: float(e) for c, e in zip(players, errors)},
            count)


def _scan(game, order, v_empty, v_full, eps):
    """One permutation's marginals (indexed as game.players), truncated within the round."""
    marginals = np.zeros(len(game.players))
    prefix, previous = set(), v_empty
    for j in order:
        prefix.add(game.players[j])
        if abs(v_full - previous) >= eps:
            current = game.value(frozenset(prefix))
        else:
            current = previous          # truncated: this and every later marginal is 0
        marginals[j] = current - previous
        previous = current
    return marginals


def _converged(records, min_permutations, last_k, criterion) -> bool:
    """FedML's test: past `min_permutations`, the running means' last `last_k` rows each differ from the
    latest by a mean (over players) relative change of at most `criterion`."""
    if len(records) <= min_permutations:
        return False
    running = np.cumsum(records, axis=0) / np.arange(1, len(records) + 1)[:, None]
    recent = running[-last_k:]
    changes = np.mean(np.abs(recent - recent[-1]) / (np.abs(recent[-1]) + 1e-12), axis=1)
    return bool(np.max(changes) <= criterion)
