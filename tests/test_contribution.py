"""Shapley attributions (fedmpi.analysis.contribution, fedmpi.analysis.contribution_rounds): hand-computed
games, the axioms on seeded random games, the sampled estimators against the exact values."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from fedmpi.analysis.contribution import (
    Estimate,
    average_ranks,
    exact_shapley,
    leave_one_out,
    rank_correlation,
    tmc_shapley,
)
from fedmpi.analysis.contribution_rounds import RoundRecord, gtg_shapley, round_exact_shapley


def subsets(players):
    return [frozenset(c) for r in range(len(players) + 1) for c in itertools.combinations(players, r)]


def game_of(function, players):
    return {s: function(s) for s in subsets(players)}


def random_game(seed, players):
    rng = np.random.default_rng(seed)
    return {s: float(rng.normal()) for s in subsets(players)}


# -- exact ---------------------------------------------------------------------------------------------

def test_glove_game_by_hand():
    # 1 holds a left glove, 2 and 3 right ones; a pair is worth 1. Of the 6 orders, 1 completes the pair in
    # the 4 where it does not come first, 2 only in "1 2 3", 3 only in "1 3 2": 2/3, 1/6, 1/6.
    game = game_of(lambda s: 1.0 if 1 in s and (2 in s or 3 in s) else 0.0, [1, 2, 3])
    phi = exact_shapley(game, [1, 2, 3])
    assert phi == pytest.approx({1: 2 / 3, 2: 1 / 6, 3: 1 / 6}, abs=1e-12)


def test_three_player_game_by_hand():
    # singletons 0; pairs 90, 80, 70; all three 120. phi_1 = 90/6 + 80/6 + (120 - 70)/3 = 45, phi_2 = 40,
    # phi_3 = 35 (weights 1/3 for |S| = 0 and 2, 1/6 for |S| = 1).
    pairs = {frozenset({1, 2}): 90.0, frozenset({1, 3}): 80.0, frozenset({2, 3}): 70.0}
    game = game_of(lambda s: 120.0 if len(s) == 3 else pairs.get(s, 0.0), [1, 2, 3])
    assert exact_shapley(game, [1, 2, 3]) == pytest.approx({1: 45.0, 2: 40.0, 3: 35.0}, abs=1e-9)


@pytest.mark.parametrize("seed", range(5))
def test_axioms_on_random_games(seed):
    players = [0, 1, 2, 3, 4]
    rng = np.random.default_rng(100 + seed)
    # 0 and 1 interchangeable, 4 a null player: v depends on how many of {0, 1} S has and on S's members 2, 3.
    table = {(k, m): float(rng.normal()) for k in range(3) for m in subsets([2, 3])}
    game = game_of(lambda s: table[(len(s & {0, 1}), s & {2, 3})], players)
    phi = exact_shapley(game, players)
    full, empty = frozenset(players), frozenset()
    assert sum(phi.values()) == pytest.approx(game[full] - game[empty], abs=1e-12)     # efficiency
    assert phi[0] == pytest.approx(phi[1], abs=1e-12)                                    # symmetry
    assert phi[4] == pytest.approx(0.0, abs=1e-12)                                       # null player
    other = random_game(200 + seed, players)
    both = {s: game[s] + other[s] for s in game}
    summed = {p: phi[p] + q for p, q in exact_shapley(other, players).items()}
    assert exact_shapley(both, players) == pytest.approx(summed, abs=1e-12)               # additivity


def test_a_missing_subset_is_refused():
    game = random_game(0, [1, 2, 3])
    del game[frozenset({1, 3})]
    with pytest.raises(ValueError, match=r"no value for the subset \[1, 3\]"):
        exact_shapley(game, [1, 2, 3])
    with pytest.raises(ValueError, match="twice"):
        exact_shapley(random_game(0, [1, 2]), [1, 1])


def test_leave_one_out_by_hand():
    assert leave_one_out(0.9, {3: 0.85, 7: 0.92}) == pytest.approx({3: 0.05, 7: -0.02}, abs=1e-12)


# -- truncated Monte Carlo ------------------------------------------------------------------------------

class CountingGame:
    def __init__(self, game):
        self.game, self.calls = game, 0

    def __call__(self, subset):
        self.calls += 1
        return self.game[subset]


def test_tmc_converges_to_the_exact_values():
    players = list(range(6))
    game = random_game(7, players)
    exact = exact_shapley(game, players)
    counting = CountingGame(game)
    est = tmc_shapley(counting, players, permutations=3000, tolerance=0.0, seed=1)
    assert isinstance(est, Estimate) and est.permutations == 3000
    assert counting.calls == len(est.evaluated)              # each distinct subset asked once
    assert est.evaluated == frozenset(game)                   # 3000 orders reach all 64 subsets
    within = [abs(est.values[p] - exact[p]) <= 3 * est.stderr[p] for p in players]
    assert sum(within) >= 5
    assert max(abs(est.values[p] - exact[p]) for p in players) < 0.1
    # tolerance 0: every order is scanned whole, so each order's marginals add up to v(N) - v(empty)
    assert sum(est.values.values()) == pytest.approx(game[frozenset(players)] - game[frozenset()], abs=1e-9)


def test_tmc_without_truncation_is_unbiased_over_seeds():
    players = [0, 1, 2, 3]
    game = random_game(11, players)
    exact = exact_shapley(game, players)
    runs = [tmc_shapley(game.__getitem__, players, permutations=4, tolerance=0.0, seed=s) for s in range(800)]
    for p in players:
        means = np.array([r.values[p] for r in runs])
        pooled = means.std(ddof=1) / math.sqrt(len(means))
        assert abs(means.mean() - exact[p]) <= 4 * pooled


def test_tmc_truncation_rule_by_hand():
    # Player 0 is worth 1, the others 0.001 each. v(N) = 1.003; with tolerance 0.01 any prefix holding 0 is
    # within 0.01 * v(N) of v(N), so an order's scan stops where 0 joins: 0 gets exactly 1 from every order,
    # another player 0.001 from the orders where it comes before 0 and 0 (not 0.001) from the others.
    players = [0, 1, 2, 3]
    game = game_of(lambda s: (1.0 if 0 in s else 0.0) + 0.001 * len(s - {0}), players)
    est = tmc_shapley(game.__getitem__, players, permutations=50, tolerance=0.01, seed=3)
    rng = np.random.default_rng(3)                   # the same orders, drawn as the estimator draws them
    orders = [list(rng.permutation(4)) for _ in range(50)]
    assert est.values[0] == pytest.approx(1.0, abs=1e-12)
    for j in (1, 2, 3):
        before = sum(o.index(j) < o.index(0) for o in orders)
        assert est.values[j] == pytest.approx(0.001 * before / 50, abs=1e-12)
    prefixes = {frozenset(o[:k]) for o in orders for k in range(1, o.index(0) + 2)}
    assert est.evaluated == prefixes | {frozenset(), frozenset(players)}
    # patience 2: a scan stops at the second prefix in a row near v(N), one player past 0
    later = tmc_shapley(game.__getitem__, players, permutations=50, tolerance=0.01, seed=3, patience=2)
    for j in (1, 2, 3):
        counted = sum(o.index(j) <= o.index(0) + 1 for o in orders)
        assert later.values[j] == pytest.approx(0.001 * counted / 50, abs=1e-12)
    assert later.evaluated == {frozenset(o[:k]) for o in orders for k in range(o.index(0) + 3)} | {frozenset(players)}


def test_truncation_reduces_evaluations_within_its_tolerance():
    players = list(range(8))
    rng = np.random.default_rng(5)
    worth = rng.uniform(0.5, 1.5, size=8)
    game = game_of(lambda s: 1 - math.exp(-sum(worth[p] for p in s)), players)     # saturating: late joiners add little
    whole = tmc_shapley(game.__getitem__, players, permutations=200, tolerance=0.0, seed=9)
    cut = tmc_shapley(game.__getitem__, players, permutations=200, tolerance=0.05, seed=9)
    assert len(cut.evaluated) < 0.7 * len(whole.evaluated)
    gain = game[frozenset(players)] - game[frozenset()]
    # each truncated order's marginals add up to v(stop prefix) - v(empty), within 5% of v(N) of the gain
    assert abs(sum(cut.values.values()) - gain) < 0.05 * game[frozenset(players)]
    assert cut.values == tmc_shapley(game.__getitem__, players, permutations=200, tolerance=0.05, seed=9).values


def test_tmc_refuses_bad_arguments():
    game = random_game(0, [1, 2])
    with pytest.raises(ValueError, match="permutations"):
        tmc_shapley(game.__getitem__, [1, 2], permutations=0, tolerance=0.0, seed=0)
    with pytest.raises(ValueError, match="tolerance"):
        tmc_shapley(game.__getitem__, [1, 2], permutations=3, tolerance=-0.1, seed=0)
    one = tmc_shapley(game.__getitem__, [1, 2], permutations=1, tolerance=0.0, seed=0)
    assert all(math.isnan(e) for e in one.stderr.values())


# -- within rounds -----------------------------------------------------------------------------------

def linear_rounds(seed, participants, dim=6):
    """Rounds with random starts, updates and weights; with utility c . x."""
    rng = np.random.default_rng(seed)
    rounds = {}
    for t, clients in enumerate(participants):
        rounds[t] = RoundRecord(start=rng.normal(size=dim), deltas={c: rng.normal(size=dim) for c in clients},
                                weights={c: float(rng.integers(5, 50)) for c in clients})
    return rounds, rng.normal(size=dim)


def direct_round_values(record, c):
    """The round's exact Shapley values, from the closed form v(S) = c.start + sum w u / sum w (u = c.delta),
    enumerated without the module's code."""
    players = sorted(record.deltas)
    u = {i: float(c @ record.deltas[i]) for i in players}

    def v(s):
        return float(c @ record.start) + (sum(record.weights[i] * u[i] for i in s) / sum(record.weights[i] for i in s)
                                           if s else 0.0)
    return exact_shapley(game_of(v, players), players)


def test_round_exact_by_hand():
    # two clients, equal weights, c . delta = u1, u2: v(1) - v() = u1, v(12) - v(2) = (u1 + u2)/2 - u2,
    # so phi_1 = (3 u1 - u2) / 4; here u1 = 2, u2 = -1 -> 7/4 and -5/4.
    record = RoundRecord(start=np.array([1.0, 1.0]), deltas={1: np.array([2.0, 0.0]), 2: np.array([0.0, -1.0])},
                         weights={1: 10.0, 2: 10.0})
    phi = round_exact_shapley({0: record}, lambda x: float(x.sum()))
    assert phi == pytest.approx({1: 1.75, 2: -1.25}, abs=1e-12)


def test_round_exact_sums_rounds_and_counts_absent_clients_as_zero():
    rounds, c = linear_rounds(3, [[1, 2, 3], [2, 3, 4, 5]])
    phi = round_exact_shapley(rounds, lambda x: float(c @ x))
    first, second = direct_round_values(rounds[0], c), direct_round_values(rounds[1], c)
    expected = {k: first.get(k, 0.0) + second.get(k, 0.0) for k in (1, 2, 3, 4, 5)}
    assert phi == pytest.approx(expected, abs=1e-9)


def test_gtg_without_truncation_approaches_the_exact_values():
    rounds, c = linear_rounds(4, [[0, 1, 2, 3, 4], [1, 2, 5]])
    utility = lambda x: float(c @ x)     # noqa: E731
    exact = round_exact_shapley(rounds, utility)
    est = gtg_shapley(rounds, utility, seed=2, round_threshold=0.0, eps=0.0, min_permutations=4000,
                      criterion=0.0, max_permutations=4000)
    assert est.permutations == 8000 and set(est.values) == set(exact)
    errors = {k: abs(est.values[k] - exact[k]) for k in exact}
    assert sum(errors[k] <= 3 * est.stderr[k] for k in exact) >= len(exact) - 1
    assert max(errors.values()) < 0.05
    # guided orders put every client first: every singleton's model was evaluated, in both rounds
    for t, record in rounds.items():
        assert all((t, frozenset({k})) in est.evaluated for k in record.deltas)
    # a round's marginals over a whole order add up to v(N) - v(empty)
    gain = sum(utility(rounds[t].start + sum(r.weights[k] * r.deltas[k] for k in r.deltas) / sum(r.weights.values()))
               - utility(rounds[t].start) for t, r in rounds.items())
    assert sum(est.values.values()) == pytest.approx(gain, abs=1e-9)


def test_gtg_truncations_and_convergence():
    rounds, c = linear_rounds(8, [[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5]])
    rounds[1] = rounds[1]._replace(deltas={k: d * 1e-4 for k, d in rounds[1].deltas.items()})   # moves nothing
    utility = lambda x: float(c @ x)     # noqa: E731
    est = gtg_shapley(rounds, utility, seed=0, eps=0.05)
    # between rounds: round 1's gain is below 0.01, so its clients get 0 from it and only v(empty), v(N) are made
    assert {s for t, s in est.evaluated if t == 1} == {frozenset(), frozenset(range(6))}
    # convergence: whole cycles of 6 orders, past the 30 of the minimum, well before the cap
    assert est.permutations % 6 == 0 and 30 < est.permutations < 1000
    # within a round: every order stops once within eps of v(N), so the values add up to the gain within eps
    r = rounds[0]
    gain = utility(r.start + sum(r.weights[k] * r.deltas[k] for k in r.deltas) / sum(r.weights.values())) \
        - utility(r.start)
    assert abs(sum(est.values.values()) - gain) < 0.05
    whole = gtg_shapley(rounds, utility, seed=0, eps=0.0, min_permutations=est.permutations,
                        max_permutations=est.permutations)
    assert len(whole.evaluated) >= len(est.evaluated)
    assert gtg_shapley(rounds, utility, seed=0, eps=0.05) == est                      # seeded
    assert est.stderr[0] > 0


def test_gtg_refuses_a_client_without_a_weight():
    rounds, c = linear_rounds(1, [[1, 2]])
    rounds[0] = rounds[0]._replace(weights={1: 3.0})
    with pytest.raises(ValueError, match=r"rounds\[0\]\.weights\[2\]"):
        gtg_shapley(rounds, lambda x: float(c @ x), seed=0)


# -- rank correlation ------------------------------------------------------------------------------------

def test_rank_correlation_by_hand():
    # ranks 1 2 3 4 against 1 3 2 4: sum d^2 = 2, rho = 1 - 6 * 2 / (4 * 15) = 0.8
    assert rank_correlation({1: 10, 2: 20, 3: 30, 4: 40}, {1: 1, 2: 3, 3: 2, 4: 4}) == pytest.approx(0.8)
    # ties: ranks 1 2.5 2.5 4 against 1 2 3 4 -> 4.5 / sqrt(4.5 * 5) = 3 / sqrt(10); key 9 is not common
    tied = rank_correlation({1: 1, 2: 2, 3: 2, 4: 3, 9: 0}, {1: 1, 2: 2, 3: 3, 4: 4})
    assert tied == pytest.approx(3 / math.sqrt(10))
    assert rank_correlation({1: 1, 2: 2, 3: 3}, {1: 3, 2: 2, 3: 1}) == pytest.approx(-1.0)
    assert math.isnan(rank_correlation({1: 5, 2: 5}, {1: 1, 2: 2}))
    assert list(average_ranks([3.0, 1.0, 3.0, 2.0])) == [3.5, 1.0, 3.5, 2.0]
    with pytest.raises(ValueError, match="in common"):
        rank_correlation({1: 1}, {1: 2, 2: 3})
