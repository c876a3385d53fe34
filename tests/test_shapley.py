"""masreplay.shapley: closed forms, the axioms (efficiency, symmetry, null player,
linearity), spawn-tree variants and the anchors' worked example, Owen level splits, batched
callables with their cache, per-trace credit, and bad input."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import masreplay
from masreplay import games
from masreplay.errors import InvalidArgumentError

METHODS = ["exact", "permutation", "kernel", "stratified", "msr"]
fast = settings(max_examples=30, deadline=None)


def value(game, players, n):
    mask = np.zeros((1, n), dtype=bool)
    mask[0, list(players)] = True
    return float(game.values(mask)[0])


def gap(game, result):
    n = game.n_players
    return abs(result.values.sum() - (value(game, range(n), n) - value(game, [], n)))


def random_parents(n: int, draws: list[int]) -> list[int]:
    return [-1 if i == 0 or d % 4 == 0 else d % i for i, d in enumerate(draws[:n])]


soum_games = st.builds(
    lambda n, terms, seed, full: games.soum(n, terms, n if full else min(3, n), seed),
    st.integers(2, 11),
    st.integers(1, 20),
    st.integers(0, 2**32),
    st.booleans(),
)


@fast
@given(soum_games)
def test_exact_equals_the_soum_closed_form(game):
    result = masreplay.shapley(game, method="exact")
    assert result.exact and result.converged and result.method == "exact"
    np.testing.assert_allclose(result.values, game.shapley_values(), atol=1e-10)
    assert np.all(result.stderr == 0)
    assert result.evaluations == 2**game.n_players


def efficient_by_construction(result):
    """The gap the projection closed is rounding-sized (stratified's is an estimation error)."""
    return abs(result.efficiency_gap) < 1e-9 * (1 + np.abs(result.values).sum())


@fast
@given(soum_games, st.integers(0, 2**32), st.lists(st.integers(0, 1000), min_size=11, max_size=11))
def test_every_method_is_efficient(game, seed, draws):
    n = game.n_players
    for method in METHODS:
        budget = 2**n if method == "exact" else 600
        result = masreplay.shapley(game, method=method, budget=budget, seed=seed)
        assert gap(game, result) < 1e-9, method
        assert method == "stratified" or efficient_by_construction(result), (method, result.efficiency_gap)
    parents = random_parents(n, draws)
    for method in ["precedence", "permission"]:
        for budget in [40, 5000]:
            result = masreplay.shapley(game, method=method, budget=budget, seed=seed, parents=parents)
            assert gap(game, result) < 1e-9, (method, budget)
            assert efficient_by_construction(result), (method, budget, result.efficiency_gap)
    unions = [[[0, 1], *range(2, n // 2 + 1)], list(range(n // 2 + 1, n))] if n > 3 else [[0, 1]]
    for budget in [60, 10**6]:
        result = masreplay.shapley(game, method="owen", budget=budget, seed=seed, unions=unions)
        assert gap(game, result) < 1e-9
        assert efficient_by_construction(result), (budget, result.efficiency_gap)


def test_stratified_reports_the_gap_its_projection_closed():
    game = games.soum(30, 60, 30, seed=3)
    result = masreplay.shapley(game, method="stratified", budget=2000, seed=1)
    assert gap(game, result) < 1e-9
    assert abs(result.efficiency_gap) > 1e-6 * np.sqrt((result.stderr**2).sum())


@fast
@given(st.integers(3, 8), st.integers(0, 2**32))
def test_symmetric_players_share_equally_and_null_players_get_nothing(n, seed):
    rng = np.random.default_rng(seed)
    # v depends on player 0 and 1 only through how many of them are in: symmetric; the
    # last player never changes anything: null.
    base = rng.uniform(-1, 1, size=2 ** (n - 1))
    table = np.empty(2**n)
    for mask in range(2**n):
        swapped = (mask & ~3) | ((mask & 1) << 1) | ((mask >> 1) & 1)
        rest = mask & ((1 << (n - 1)) - 1)
        rest_swapped = swapped & ((1 << (n - 1)) - 1)
        table[mask] = (base[rest] + base[rest_swapped]) / 2
    game = games.table(table)
    for method in ["exact", "kernel"]:
        result = masreplay.shapley(game, method=method, budget=2**n)
        assert abs(result.values[0] - result.values[1]) < 1e-9
        assert abs(result.values[n - 1]) < 1e-9
    sampled = masreplay.shapley(game, method="permutation", budget=500, seed=seed)
    assert abs(sampled.values[n - 1]) < 1e-12


def within_noise(a, b, stderr_a, stderr_b):
    """Four standard errors of the gap: sampled estimators keep symmetry and the null player in
    expectation, and honest error bars make a wider gap a one-in-16,000 event. The gap's error
    is at most the sum of the two (equal only when the estimates move in opposite ways, as two
    symmetric players' do when only they matter: one's gain in an ordering is the other's loss,
    and the independent sum of squares read a 3.4-sigma gap as 4.8)."""
    return abs(a - b) <= 4 * (stderr_a + stderr_b) + 1e-9


@fast
@given(st.integers(10, 13), st.integers(1, 12), st.integers(0, 2**32), st.integers(0, 2**32))
def test_symmetry_and_null_player_in_the_sampling_regime(n, terms, game_seed, seed):
    # Players 0 and 1 symmetric (each term also with the two swapped), the last one null;
    # 2^n exceeds the budget, so every estimator samples. Terms of at most three players: a
    # high-order term makes each nonzero value a rare draw, whose sample variance at this
    # budget is too unreliable for a four-sigma check (calibration on such games is
    # tests/test_shapley_calibration.py's business).
    swap = {0: 1, 1: 0}
    base = games.soum(n, terms, 3, game_seed).terms()
    game = games.soum(n + 1, [([swap.get(p, p) for p in m], c / 2) for m, c in base] + [(m, c / 2) for m, c in base])
    budget = 1000
    for method in ["kernel", "stratified", "msr"]:
        r = masreplay.shapley(game, method=method, budget=budget, seed=seed)
        assert not r.exact
        assert within_noise(r.values[0], r.values[1], r.stderr[0], r.stderr[1]), (method, r.values, r.stderr)
        assert within_noise(r.values[n], 0.0, r.stderr[n], 0.0), (method, r.values[n], r.stderr[n])
    parents = [2 if i < 2 or i == n else -1 for i in range(n + 1)]
    r = masreplay.shapley(game, method="precedence", budget=budget, seed=seed, parents=parents)
    assert not r.exact
    assert within_noise(r.values[0], r.values[1], r.stderr[0], r.stderr[1]), (r.values, r.stderr)
    # Its marginal contributions are all 0; its stderr is the pooled floor, half the players'
    # mean variance at most (sampling.rs), so within the most uncertain player's.
    assert abs(r.values[n]) < 1e-12 and r.stderr[n] <= r.stderr.max() + 1e-15


@fast
@given(st.integers(3, 30), st.integers(0, 2**32), st.floats(-3, 3), st.floats(-3, 3))
def test_linear_under_the_same_random_stream(n, seed, a, b):
    v, w = games.soum(n, 15, 3, seed), games.soum(n, 15, n, seed + 1)
    combined = games.soum(n, [(m, a * c) for m, c in v.terms()] + [(m, b * c) for m, c in w.terms()])
    # MSR too: its coalitions depend on the seed only and its linear surrogate is a
    # least-squares fit (interaction features are chosen by the values: not linear in them).
    for method, options in [("permutation", {}), ("kernel", {}), ("msr", {"surrogate": "linear"})]:
        phi = [masreplay.shapley(g, method=method, budget=2000, seed=seed, **options).values for g in (v, w, combined)]
        np.testing.assert_allclose(phi[2], a * phi[0] + b * phi[1], atol=1e-9)


def test_the_worked_example_of_the_anchors():
    game = games.additive([0.1, 0.2, 0.3, 0.4])
    parents = [-1, 0, 0, 1]
    precedence = masreplay.shapley(game, method="precedence", parents=parents)
    np.testing.assert_allclose(precedence.values, [0.1, 0.2, 0.3, 0.4], atol=1e-12)
    assert precedence.exact
    permission = masreplay.shapley(game, method="permission", parents=parents)
    np.testing.assert_allclose(permission.values, [0.4833, 0.2333, 0.15, 0.1333], atol=1e-4)
    assert math.isclose(permission.values.sum(), 1.0, abs_tol=1e-12)
    auto = masreplay.shapley(game, parents=parents)
    assert auto.method == "precedence"


def test_precedence_on_a_chain_is_the_increments():
    game = games.soum(7, 25, 7, seed=3)
    result = masreplay.shapley(game, method="precedence", parents=[-1, 0, 1, 2, 3, 4, 5])
    increments = [value(game, range(i + 1), 7) - value(game, range(i), 7) for i in range(7)]
    np.testing.assert_allclose(result.values, increments, atol=1e-12)
    assert result.evaluations == 8


def test_sampled_precedence_converges_to_exact():
    game = games.soum(16, 40, 4, seed=5)
    parents = [-1] * 4 + [i % 4 for i in range(4, 16)]
    exact = masreplay.shapley(game, method="precedence", parents=parents, budget=10**7)
    assert exact.exact
    errors = []
    for budget in [300, 6000]:
        sampled = masreplay.shapley(game, method="precedence", parents=parents, budget=budget, seed=1)
        assert not sampled.exact
        errors.append(np.abs(sampled.values - exact.values).mean())
    assert errors[1] < 0.5 * errors[0]


def test_owen_splits_exactly_level_by_level():
    game = games.soum(6, 20, 6, seed=2)
    unions = [[[0, 1], 2], [3, 4, 5]]
    owen = masreplay.shapley(game, method="owen", unions=unions)
    assert owen.exact and owen.method == "owen"
    # Quotient game between the two top unions, and within the first between {0,1} and {2}.
    top = games.table(
        [value(game, [p for u, group in enumerate([[0, 1, 2], [3, 4, 5]]) if m >> u & 1 for p in group], 6) for m in range(4)]
    )
    quotient = masreplay.shapley(top, method="exact").values
    assert math.isclose(owen.values[:3].sum(), quotient[0], abs_tol=1e-10)
    assert math.isclose(owen.values[3:].sum(), quotient[1], abs_tol=1e-10)
    sampled = masreplay.shapley(game, method="owen", unions=unions, budget=50, seed=4)
    assert not sampled.exact
    assert masreplay.shapley(game, unions=unions).method == "owen"


@pytest.mark.parametrize("method", ["permutation", "kernel", "stratified", "msr"])
def test_error_shrinks_with_budget(method):
    small, large = [], []
    for seed in range(3):
        game = games.soum(40, 100, 3, seed)
        truth = game.shapley_values()
        small.append(np.abs(masreplay.shapley(game, method=method, budget=1000, seed=seed).values - truth).mean())
        large.append(np.abs(masreplay.shapley(game, method=method, budget=40000, seed=seed).values - truth).mean())
    assert np.mean(large) < 0.4 * np.mean(small)


def test_kernel_that_valued_every_coalition_is_exact_to_rounding():
    game = games.soum(10, 100, 10, seed=3)
    result = masreplay.shapley(game, method="kernel", budget=10_000, seed=1)
    assert result.exact and result.evaluations == 2**10
    # Exact by the Shapley weights, not by the ridge-regularised regression (1e-10 off).
    np.testing.assert_allclose(result.values, game.shapley_values(), rtol=0, atol=1e-13)
    assert np.all(result.stderr == 0.0)


def test_kernel_on_a_game_its_design_fits_is_exact_to_rounding():
    # An additive + pairwise game is fitted exactly by the regression on a sampled design too
    # (zero jackknife spread): the values must be exact to rounding, as the zero stderr says,
    # not off by the ridge (the fit is refined once against the matrix without it).
    rng = np.random.default_rng(3)
    terms = [([i], float(rng.uniform(0, 1))) for i in range(10)]
    terms += [([i, j], float(rng.uniform(-1, 1))) for i in range(10) for j in range(i + 1, 10)]
    game = games.soum(10, terms)
    for budget in (300, 1000):
        result = masreplay.shapley(game, method="kernel", budget=budget, seed=2)
        assert not result.exact
        np.testing.assert_allclose(result.values, game.shapley_values(), rtol=0, atol=1e-13)
        assert np.all(result.stderr < 1e-12)


def test_permutation_below_two_antithetic_pairs_draws_plain_orderings_on_few_players():
    game = games.soum(50, 100, 3, seed=2)
    truth = game.shapley_values()
    # 150 evaluations: one antithetic pair (2 + 98) or three orderings (2 + 3 x 49); below 100
    # players the three orderings are plain (the pair's error bars need many players).
    result = masreplay.shapley(game, method="permutation", budget=150, seed=0)
    assert result.evaluations == 2 + 3 * 49
    assert np.all(np.isfinite(result.stderr)) and np.all(result.stderr > 0)
    assert np.mean(np.abs(result.values - truth) <= 1.96 * result.stderr + 1e-12) > 0.8
    plain = masreplay.shapley(game, method="permutation", budget=150, seed=0, antithetic=False)
    np.testing.assert_array_equal(plain.values, result.values)
    # Two pairs fit: antithetic as before (every unit a pair, so the evaluations are even past the bounds).
    paired = masreplay.shapley(game, method="permutation", budget=2 + 4 * 49, seed=0)
    assert paired.evaluations == 2 + 4 * 49 and np.all(np.isfinite(paired.stderr))


def test_permutation_with_one_pair_and_one_more_ordering_values_by_the_pair():
    game = games.soum(120, 100, 3, seed=2)
    truth = game.shapley_values()
    # 400 evaluations: one antithetic pair (2 + 238) and one more ordering (119), not two pairs.
    result = masreplay.shapley(game, method="permutation", budget=400, seed=0)
    assert result.evaluations == 2 + 3 * 119
    assert np.all(np.isfinite(result.stderr)) and np.all(result.stderr > 0)
    assert np.mean(np.abs(result.values - truth) <= 1.96 * result.stderr + 1e-12) > 0.8
    again = masreplay.shapley(game, method="permutation", budget=400, seed=0)
    np.testing.assert_array_equal(result.values, again.values)
    np.testing.assert_array_equal(result.stderr, again.stderr)
    # Without antithetic pairs: three plain orderings, other values.
    plain = masreplay.shapley(game, method="permutation", budget=400, seed=0, antithetic=False)
    assert plain.evaluations == 2 + 3 * 119 and not np.array_equal(plain.values, result.values)


def pairwise_game(n: int, seed: int) -> games.Game:
    rng = np.random.default_rng(seed)
    terms = [([i], float(rng.uniform(0, 1))) for i in range(n)]
    terms += [([i, j], float(rng.uniform(-1, 1)) / n) for i in range(n) for j in range(i + 1, n)]
    return games.soum(n, terms)


def test_one_antithetic_pair_is_exact_on_a_pairwise_game_with_a_nonzero_stderr():
    # An antithetic pair gets every value of a game of order two exactly; the third ordering
    # still gives each an error bar (the ratio's floor), never 0.
    game = pairwise_game(100, 3)
    result = masreplay.shapley(game, method="permutation", budget=2 + 3 * 99 + 10, seed=4)
    np.testing.assert_allclose(result.values, game.shapley_values(), rtol=0, atol=1e-12)
    assert result.evaluations == 2 + 3 * 99 and np.all(result.stderr > 0)


def test_one_antithetic_pair_is_unbiased():
    game = games.soum(100, 40, 100, seed=5)
    truth = game.shapley_values()
    runs = np.array([masreplay.shapley(game, method="permutation", budget=2 + 3 * 99, seed=s).values for s in range(2000)])
    spread = runs.std(axis=0) / np.sqrt(len(runs))
    z = (runs.mean(axis=0) - truth) / np.maximum(spread, 1e-300)
    # Every player within 4.5 standard errors of the mean, and the z-scores about standard normal.
    assert np.all(np.abs(z[spread > 0]) <= 4.5) and 0.6 <= np.std(z[spread > 0]) <= 1.4, z


def test_stderr_is_honest_and_target_stops_sampling():
    game = games.soum(30, 60, 3, seed=8)
    truth = game.shapley_values()
    result = masreplay.shapley(game, method="permutation", target_stderr=0.005, seed=2)
    assert result.converged and result.stderr.max() <= 0.005
    # About 95% of the values lie within two standard errors.
    assert np.mean(np.abs(result.values - truth) <= 2 * result.stderr + 1e-12) > 0.8
    capped = masreplay.shapley(game, method="permutation", target_stderr=1e-6, budget=2000)
    assert not capped.converged and capped.evaluations <= 2000


def test_same_seed_same_values_at_any_thread_count():
    game = games.soum(60, 100, 5, seed=1)
    runs = [masreplay.shapley(game, method="permutation", budget=50_000, seed=7, n_threads=t) for t in (1, 2, 3)]
    for other in runs[1:]:
        np.testing.assert_array_equal(runs[0].values, other.values)
        np.testing.assert_array_equal(runs[0].stderr, other.stderr)
    different = masreplay.shapley(game, method="permutation", budget=50_000, seed=8)
    assert not np.array_equal(runs[0].values, different.values)


def test_auto_says_what_it_picked():
    assert masreplay.shapley(games.soum(8, 10)).method == "exact"
    # The census from 90% of all coalitions (1,000 of 1,024), MSR from 30 evaluations per
    # player (900 of 1,024 is below 90%), antithetic permutations below.
    assert masreplay.shapley(games.soum(10, 10), budget=1000).method == "census"
    assert masreplay.shapley(games.soum(10, 10), budget=900).method == "msr"
    assert masreplay.shapley(games.soum(14, 10), budget=8000).method == "msr"
    assert masreplay.shapley(games.soum(100, 10), budget=3000).method == "msr"
    assert masreplay.shapley(games.soum(100, 10), budget=1000).method == "permutation"


def test_msr_is_unbiased_exact_on_pairwise_games_and_meets_a_target():
    # Unbiased: over 300 seeds the mean estimate is within four standard errors of the mean.
    game = games.soum(12, 30, 12, seed=4)
    truth = game.shapley_values()
    runs = np.array([masreplay.shapley(game, method="msr", budget=300, seed=s).values for s in range(300)])
    assert np.all(np.abs(runs.mean(axis=0) - truth) <= 4 * runs.std(axis=0, ddof=1) / np.sqrt(len(runs)) + 1e-12)
    # Complementary pairs leave a pairwise game's linear part, which the surrogate absorbs.
    rng = np.random.default_rng(0)
    terms = [([i], float(rng.uniform(0, 1))) for i in range(40)]
    terms += [([i, j], float(rng.uniform(-0.1, 0.1))) for i in range(40) for j in range(i + 1, 40)]
    pairwise = games.soum(40, terms)
    result = masreplay.shapley(pairwise, method="msr", budget=4000, seed=1)
    np.testing.assert_allclose(result.values, pairwise.shapley_values(), atol=1e-4)
    # A target standard error grows the sample in rounds until it is met.
    full = games.soum(40, 60, 40, seed=2)
    reached = masreplay.shapley(full, method="msr", target_stderr=0.01)
    assert reached.converged and reached.stderr.max() <= 0.01 and reached.evaluations < 10**6


def sparse_triples(n=40, seed=3):
    """Singletons plus six disjoint triples among 40 players: the odd part of each triple is
    what a linear surrogate cannot absorb."""
    rng = np.random.default_rng(seed)
    terms = [([i], float(rng.uniform(0, 1))) for i in range(n)]
    players = rng.permutation(n).tolist()
    terms += [(sorted(players[3 * k : 3 * k + 3]), float(rng.choice([-1.0, 1.0]) * rng.uniform(0.5, 1))) for k in range(6)]
    return games.soum(n, terms)


def test_msr_surrogate_with_interactions_fits_sparse_triples():
    game = sparse_triples()
    truth = game.shapley_values()

    def runs(surrogate, **options):
        return [masreplay.shapley(game, method="msr", budget=10_000, seed=s, surrogate=surrogate, **options) for s in range(5)]

    def mae(results):
        return float(np.mean([np.abs(r.values - truth).mean() for r in results]))

    linear, interactions = runs("linear"), runs("interactions")
    assert mae(interactions) < mae(linear) / 2
    for result in interactions:  # efficient by construction: the features add no closed-form term
        assert abs(result.efficiency_gap) < 1e-9
    # auto: interactions up to 300 players, and auto's method is msr at 250 evaluations a player.
    auto = masreplay.shapley(game, budget=10_000, seed=0)
    assert auto.method == "msr"
    np.testing.assert_array_equal(auto.values, interactions[0].values)
    with pytest.raises(InvalidArgumentError, match="surrogate"):
        masreplay.shapley(game, method="msr", surrogate="trees")


def test_msr_with_interactions_is_unbiased():
    # Over 300 seeds the mean estimate is within four standard errors of the mean, on a game
    # whose triples the screening finds (the features are fitted on the other folds only).
    game = sparse_triples()
    truth = game.shapley_values()
    runs = np.array(
        [masreplay.shapley(game, method="msr", budget=6000, seed=s, surrogate="interactions").values for s in range(300)]
    )
    assert np.all(np.abs(runs.mean(axis=0) - truth) <= 4 * runs.std(axis=0, ddof=1) / np.sqrt(len(runs)) + 1e-12)


def test_native_games():
    voting = masreplay.shapley(games.weighted_voting([2, 1, 1], quota=3), method="exact")
    np.testing.assert_allclose(voting.values, [2 / 3, 1 / 6, 1 / 6])
    dense = games.table([0, 1, 2, 4])
    np.testing.assert_allclose(masreplay.shapley(dense).values, [1.5, 2.5])
    sparse = games.table({(0, 1): 4.0, 0b01: 1.0, (1,): 2.0}, n_players=2)
    np.testing.assert_allclose(masreplay.shapley(sparse).values, [1.5, 2.5])
    soum = games.soum(3, [([0, 1], 1.0), ([2], 0.5)])
    np.testing.assert_allclose(soum.shapley_values(), [0.5, 0.5, 0.5])
    np.testing.assert_allclose(soum.banzhaf_values(), [0.5, 0.5, 0.5])
    assert repr(soum) == "Game(soum, n_players=3)"


def test_empirical_game_of_logged_rollouts():
    rng = np.random.default_rng(0)
    masks = rng.random((200, 5)) < 0.5
    worth = np.array([1.0, 0.5, 0.0, 2.0, -1.0])
    game = games.empirical(masks, masks @ worth + 0.3)
    result = masreplay.shapley(game, method="exact")
    np.testing.assert_allclose(result.values, worth, atol=1e-3)
    batch = masreplay.sim.generate(12, agents=(2, 4), seed=3)
    group_game, labels = games.empirical_from_traces(batch)
    assert group_game.n_players == len(labels)
    assert "orchestrator" in labels
    # Every trace's coalition is observed: its value is that trace's team reward (mean if repeated).
    players = masreplay.trace_players(batch)
    rewards = [trace["rewards"]["team"] for trace in batch]
    for t in range(len(rewards)):
        present = set(players.filter(players["trace_index"].to_numpy() == t)["label"].to_pylist())
        mask = np.array([[label in present for label in labels]])
        same = [
            r
            for u, r in enumerate(rewards)
            if set(players.filter(players["trace_index"].to_numpy() == u)["label"].to_pylist()) == present
        ]
        assert math.isclose(float(group_game.values(mask)[0]), float(np.mean(same)), abs_tol=1e-12)
    with pytest.raises(InvalidArgumentError, match="reward channel"):
        games.empirical_from_traces(batch, reward="nope")


class Counting:
    """A batched callable that records what it was asked."""

    def __init__(self, game):
        self.game, self.calls, self.rows, self.seen = game, 0, 0, set()

    def __call__(self, masks):
        assert masks.dtype == bool and masks.ndim == 2
        self.calls += 1
        self.rows += len(masks)
        for row in masks:
            key = row.tobytes()
            assert key not in self.seen, "a coalition was valued twice"
            self.seen.add(key)
        return self.game.values(masks)


@pytest.mark.parametrize("method", ["exact", "permutation", "kernel", "msr"])
def test_callable_games_match_native_ones_and_are_valued_once(method):
    native = games.soum(10, 30, 4, seed=4)
    counting = Counting(native)
    wrapped = masreplay.shapley(games.function(counting, 10, chunk_size=64), method=method, budget=1500, seed=3)
    direct = masreplay.shapley(native, method=method, budget=1500, seed=3)
    np.testing.assert_allclose(wrapped.values, direct.values, atol=1e-12)
    assert wrapped.evaluations == counting.rows == len(counting.seen)
    if method == "exact":
        assert wrapped.evaluations == 2**10
    plain = masreplay.shapley(native.values, 10, method=method, budget=1500, seed=3)
    np.testing.assert_allclose(plain.values, wrapped.values, atol=0)


def test_callable_errors_surface():
    def broken(masks):
        raise RuntimeError("the judge model is down")

    with pytest.raises(RuntimeError, match="judge model"):
        masreplay.shapley(broken, 4)
    with pytest.raises(InvalidArgumentError, match="returned 1 values"):
        masreplay.shapley(lambda masks: [0.0], 4)
    with pytest.raises(InvalidArgumentError, match="non-finite"):
        masreplay.shapley(lambda masks: np.full(len(masks), np.nan), 4)
    with pytest.raises(InvalidArgumentError, match="n_players"):
        masreplay.shapley(lambda masks: np.zeros(len(masks)))


@pytest.mark.parametrize("method", ["auto", "exact", "permutation", "kernel", "stratified", "msr"])
def test_values_past_2_to_the_49_are_refused_not_summed_into_an_infinity(method):
    # Before the bound, 1e300 gave a stderr of 0 (permutation) or NaN (stratified).
    just_below = np.nextafter(2.0**49, 0.0)
    fine = masreplay.shapley(lambda masks: masks.sum(axis=1) * just_below / 6, 6, method=method, budget=500, seed=0)
    assert np.isfinite(fine.values).all() and np.isfinite(fine.stderr).all()
    with pytest.raises(
        InvalidArgumentError,
        match=r"returned a value out of range \(1e300\) for a coalition: values must be finite, of magnitude below 2\^49",
    ):
        masreplay.shapley(lambda masks: np.where(masks[:, 0], 1e300, 1.0), 6, method=method, budget=500, seed=0)


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: games.additive([1.0, 1e300]), r"additive: weight 1 must be finite, of magnitude below 2\^49"),
        (lambda: games.weighted_voting([1.0, np.inf], 1.0), r"weighted_voting: weight 1 must be finite"),
        (lambda: games.table(np.array([0.0, 1.0, 2.0, 2.0**49])), r"table: value 3 must be finite, of magnitude"),
        (lambda: games.table({(0,): 1e300}, n_players=2), r"table: the value of \[0\] must be finite"),
        (lambda: games.soum(3, terms=[([0], 1.0), ([1, 2], -1e300)]), r"soum: the coefficient of term 1 must be finite"),
        (lambda: games.empirical(np.eye(2, dtype=bool), [1.0, 1e300]), r"empirical: reward 1 must be finite"),
        (
            lambda: masreplay.difference_rewards(lambda m: m.sum(axis=1) * 1e300, n_players=3),
            r"the game returned a value out of range",
        ),
    ],
)
def test_games_built_from_numbers_past_2_to_the_49_are_refused(build, match):
    with pytest.raises(InvalidArgumentError, match=match):
        build()


def test_census_on_a_vote_does_not_claim_exactness_where_a_coalition_left_out_may_be_missed():
    # The bench's weighted vote at n = 12 (game seed 2), 3,700 of 4,096 coalitions: the step
    # surrogate fits every valued coalition, but misclassifies one left out (every value off
    # by 1.8e-4). A size with no miss among its draws used to read as exact: stderr 7e-10.
    rng = np.random.default_rng(1002)
    weights = rng.integers(1, 6, size=12).astype(np.float64)
    game = games.weighted_voting(weights, 0.6 * weights.sum())
    truth = masreplay.shapley(game, method="exact").values
    result = masreplay.shapley(game, method="census", budget=3700, seed=2009)
    error = np.abs(result.values - truth)
    assert error.min() > 1e-4
    assert (error <= 1.96 * result.stderr).all()
    # About one miss's share of a value (the interval holds a single miss), not the game's range.
    assert result.stderr.max() < 2.5e-4


def test_stratified_refuses_a_budget_that_cannot_draw_two_coalitions_of_every_size():
    # At n = 300 and 1,000 evaluations most sizes got one draw: every value came out the equal
    # split, (v(N) - v(empty)) / n, with a standard error of 0 (coverage 0 on voting games).
    game = games.soum(300, 20, 3, seed=5)
    with pytest.raises(InvalidArgumentError, match=r"method='stratified' needs 1196 evaluations at n = 300"):
        masreplay.shapley(game, method="stratified", budget=1000)
    result = masreplay.shapley(game, method="stratified", budget=1196, seed=1)
    assert result.evaluations == 1196 and (result.stderr > 0).all()
    assert np.ptp(result.values) > 0


def test_a_dense_table_too_large_is_refused_before_anything_is_copied():
    # 2^31 zeros: calloc'd pages that stay untouched. Copied out as a list of Python floats
    # first (before this test), the refusal came after a 70 GB allocation that killed the process.
    with pytest.raises(InvalidArgumentError, match=r"a dense table needs 2\^n values \(n in 1\.\.=30\), got 2147483648"):
        games.table(np.zeros(2**31))
    # A view with strides is read as its values.
    np.testing.assert_allclose(masreplay.shapley(games.table(np.arange(16.0)[::2])).values, [2.0, 4.0, 8.0])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"method": "monte-carlo"}, "method"),
        ({"parents": [-1, 0]}, "parents"),
        ({"parents": [1, 0, -1, -1]}, "cycle"),
        ({"parents": [-1, 9, -1, -1]}, "parents"),
        ({"method": "precedence"}, "parents"),
        ({"method": "owen"}, "unions"),
        ({"unions": [[0, 1], [1]]}, "twice"),
        ({"method": "permutation", "budget": 3}, "budget"),
        ({"method": "exact", "budget": 15}, "budget"),
        ({"target_stderr": 0.0}, "target_stderr"),
        ({"n_threads": 0}, "n_threads"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(InvalidArgumentError, match=match):
        masreplay.shapley(games.soum(4, 5), **kwargs)


def test_bad_games():
    # A callable of 2^64 - 1 players divided by zero (a panic) where the count wrapped.
    for n_players in (2**64 - 1, 2**20 + 1):
        with pytest.raises(InvalidArgumentError, match=r"n_players must be in 1\.\.=1048576"):
            masreplay.shapley(lambda masks: masks.sum(axis=1).astype(float), n_players, budget=10)
    with pytest.raises(InvalidArgumentError, match="2\\^n"):
        games.table([1.0, 2.0, 3.0])
    with pytest.raises(InvalidArgumentError, match="out of range"):
        games.soum(3, [([4], 1.0)])
    with pytest.raises(InvalidArgumentError, match="max_order"):
        games.soum(3, 5, max_order=4)
    with pytest.raises(InvalidArgumentError, match="exceeds"):
        masreplay.shapley(games.soum(40, 5), method="exact")
    with pytest.raises(InvalidArgumentError, match="game"):
        masreplay.shapley("not a game")


# ---- credit on traces --------------------------------------------------------------------


@pytest.fixture(scope="module")
def batch():
    return masreplay.sim.generate(40, agents=(2, 6), depth=2, fan_out=(1, 3), seed=11)


def additive_value_fn(players: pa.Table):  # noqa: F821
    """Each player is worth 1 + its index; a coalition is worth the sum (vectorised)."""
    width = int(players["player"].to_numpy().max()) + 1
    worth = np.arange(1, width + 1, dtype=float)

    def value_fn(trace_index, masks):
        return masks @ worth

    return value_fn


def test_trace_players_follow_the_spawn_tree(batch):
    players = masreplay.trace_players(batch)
    assert players.column_names == ["trace_index", "trace_id", "player", "label", "parent", "n_events"]
    for t in range(len(batch)):
        rows = players.filter(players["trace_index"].to_numpy() == t).to_pylist()
        trace = batch[t]
        labels = [r["label"] for r in rows]
        assert sorted(labels) == sorted({e["agent"] for e in trace["events"] if e["type"] != "tool_result"})
        spawned = {e["to"]: e["agent"] for e in sorted(trace["events"], key=lambda e: -e["t"]) if e["type"] == "spawn"}
        for row in rows:
            parent = labels[row["parent"]] if row["parent"] >= 0 else None
            assert parent == spawned.get(row["label"])
    assert players["n_events"].to_numpy().sum() == batch.num_events


def test_trace_credit_is_efficient_and_aligned(batch):
    value_fn = additive_value_fn(masreplay.trace_players(batch))
    credit = masreplay.trace_shapley(batch, value_fn)
    assert credit.events.num_rows == batch.num_events
    assert set(credit.methods) == {"precedence"}
    # Additive value: every player's credit is its own worth, spawned or not.
    players = credit.players
    np.testing.assert_allclose(players["value"].to_numpy(), players["player"].to_numpy() + 1.0, atol=1e-9)
    per_trace = np.bincount(credit.events["trace_index"].to_numpy(), weights=credit.credit)
    totals = np.bincount(players["trace_index"].to_numpy(), weights=players["player"].to_numpy() + 1.0)
    np.testing.assert_allclose(per_trace, totals, atol=1e-9)
    assert credit.total_evaluations == credit.evaluations.sum()
    first = credit.values_of(0)
    assert len(first) == players.filter(players["trace_index"].to_numpy() == 0).num_rows


def test_trace_credit_matches_shapley_on_each_trace(batch):
    players = masreplay.trace_players(batch)
    rng = np.random.default_rng(1)
    width = int(players["player"].to_numpy().max()) + 1
    pair = rng.normal(size=(len(batch), width, width))

    def value_fn(trace_index, masks):
        m = masks.astype(float)
        return np.einsum("ri,rij,rj->r", m, pair[trace_index], m)

    for kwargs in [{"respect_spawn_tree": False}, {"method": "permission"}, {}]:
        credit = masreplay.trace_shapley(batch, value_fn, **kwargs)
        for t in [0, 7, 23]:
            rows = players.filter(players["trace_index"].to_numpy() == t)
            n = rows.num_rows
            parents = rows["parent"].to_pylist() if kwargs.get("respect_spawn_tree", True) else None

            def one(masks, t=t, n=n):
                padded = np.zeros((len(masks), width), dtype=bool)
                padded[:, :n] = masks
                return value_fn(np.full(len(masks), t), padded)

            method = kwargs.get("method", "auto")
            expected = masreplay.shapley(one, n, parents=parents, method=method).values
            got = credit.players.filter(credit.players["trace_index"].to_numpy() == t)["value"].to_numpy()
            np.testing.assert_allclose(got, expected, atol=1e-9)


def test_trace_credit_of_a_team_that_wins_or_loses_asks_only_for_what_it_recorded(batch):
    # On a two-valued game MSR picks some coalitions after seeing values (a pilot finds the
    # sizes where the outcome never swings); trace_shapley values coalitions only after every
    # estimator has announced them, so it must run MSR without that pilot.
    players = masreplay.trace_players(batch, "event")
    sizes = np.bincount(players["trace_index"].to_numpy(), minlength=len(batch))
    assert sizes.max() >= 20  # enough events for MSR to sample sizes, not only enumerate them

    def value_fn(trace_index, masks):
        return (masks.sum(axis=1) >= np.ceil(0.6 * sizes[trace_index])).astype(float)

    credit = masreplay.trace_shapley(batch, value_fn, players="event", method="msr", budget=3000, seed=5)
    per_trace = np.bincount(
        credit.players["trace_index"].to_numpy(), weights=credit.players["value"].to_numpy(), minlength=len(batch)
    )
    np.testing.assert_allclose(per_trace[sizes > 0], 1.0, atol=1e-9)  # v(N) - v(empty) = 1


@pytest.mark.parametrize("players", ["role", "event", "tool", "agent"])
def test_trace_credit_for_other_players(batch, players):
    table = masreplay.trace_players(batch, players)
    value_fn = additive_value_fn(table)
    credit = masreplay.trace_shapley(batch, value_fn, players=players, respect_spawn_tree=players != "tool", budget=2000)
    assert credit.events.num_rows == batch.num_events
    owned = credit.events["player"].to_numpy() >= 0
    if players == "event":
        assert owned.all()
    per_trace = np.bincount(credit.events["trace_index"].to_numpy(), weights=credit.credit, minlength=len(batch))
    expected = np.bincount(table["trace_index"].to_numpy(), weights=table["player"].to_numpy() + 1.0, minlength=len(batch))
    np.testing.assert_allclose(per_trace, expected, atol=1e-6)


def test_trace_credit_is_deterministic_and_checks_its_input(batch):
    value_fn = additive_value_fn(masreplay.trace_players(batch, "event"))
    one = masreplay.trace_shapley(batch, value_fn, players="event", budget=500, seed=3, n_threads=1)
    two = masreplay.trace_shapley(batch, value_fn, players="event", budget=500, seed=3, n_threads=2)
    np.testing.assert_array_equal(one.credit, two.credit)
    with pytest.raises(InvalidArgumentError, match="returned"):
        masreplay.trace_shapley(batch, lambda t, m: np.zeros(1))
    with pytest.raises(ZeroDivisionError):
        masreplay.trace_shapley(batch, lambda t, m: 1 / 0)
    with pytest.raises(InvalidArgumentError, match="no field"):
        masreplay.trace_shapley(batch, value_fn, players="colour")
    with pytest.raises(InvalidArgumentError, match="stratified"):
        masreplay.trace_shapley(batch, value_fn, method="stratified")


def test_hook_length_counts_and_uniform_orderings_from_python():
    # The spawn-tree orderings counted by brute force match n!/prod(subtree sizes) and the
    # exact precedence value equals the brute-force average over them.
    parents = [-1, 0, 0, 1, -1, 4]
    game = games.soum(6, 15, 6, seed=9)
    valid = [o for o in itertools.permutations(range(6)) if all(p < 0 or o.index(p) < o.index(i) for i, p in enumerate(parents))]
    assert len(valid) == math.factorial(6) // (4 * 2 * 1 * 1 * 2 * 1)
    phi = np.zeros(6)
    for order in valid:
        for k, p in enumerate(order):
            phi[p] += value(game, order[: k + 1], 6) - value(game, order[:k], 6)
    exact = masreplay.shapley(game, method="precedence", parents=parents)
    np.testing.assert_allclose(exact.values, phi / len(valid), atol=1e-12)
    sampled = masreplay.shapley(game, method="precedence", parents=parents, budget=12, seed=0)
    assert not sampled.exact


def _tied_trace(order: list[int]) -> dict:
    """Two spawns of "w" at t = 1 (the one with the smaller id, by "orch", is the earliest) and
    two agents whose first events tie at t = 2.5, stored in the given order."""
    events = [
        {"id": "s2", "t": 1.0, "type": "spawn", "agent": "helper", "to": "w"},
        {"id": "s1", "t": 1.0, "type": "spawn", "agent": "orch", "to": "w"},
        {"id": "a", "t": 0.0, "type": "orchestrator_decision", "agent": "orch"},
        {"id": "h", "t": 0.5, "type": "spawn", "agent": "orch", "to": "helper"},
        {"id": "c", "t": 2.0, "type": "tool_call", "agent": "w"},
        {"id": "r", "t": 3.0, "type": "tool_result", "agent": "search"},
        {"id": "m2", "t": 2.5, "type": "message", "agent": "x"},
        {"id": "m1", "t": 2.5, "type": "message", "agent": "y"},
    ]
    edges = [("a", "h"), ("h", "s2"), ("a", "s1"), ("s1", "c"), ("c", "r")]
    return {
        "trace_id": "tied",
        "task_id": "task",
        "events": [events[i] for i in order],
        "edges": [{"src": src, "dst": dst, "type": "causal"} for src, dst in edges],
        "rewards": {"team": 1.0},
        "costs": {"tokens": 0, "wall_clock_s": 0},
    }


def test_trace_players_break_time_ties_by_event_id_not_by_row():
    # Events in time order are ordered by (t, id), as the metrics and advantages order them:
    # the earliest spawn of "w" is s1 (by orch), and y (m1) comes before x (m2).
    for order in ([0, 1, 2, 3, 4, 5, 6, 7], [7, 6, 5, 4, 3, 2, 1, 0], [1, 0, 6, 7, 2, 3, 5, 4]):
        players = masreplay.trace_players([_tied_trace(order)])
        assert players["label"].to_pylist() == ["orch", "helper", "w", "y", "x"]
        assert players["parent"].to_pylist() == [-1, 0, 0, -1, -1]
        assert players["n_events"].to_pylist() == [3, 1, 2, 1, 1]


def test_auto_fits_a_staircase_where_no_step_separates():
    # A voting game with real weights: no step on an integer grid separates its coalitions, but
    # a staircase (the share of wins at each integer score) is right on average near the quota.
    # Measured on seeds 0-11: half the error of surrogate="interactions" (0.0018 vs 0.0035, lower
    # in every seed), 0.97 of the values within 1.96 standard errors (0.94 over 200 seeds).
    rng = np.random.default_rng(3)
    weights = rng.integers(1, 6, size=14) + rng.normal(0, 0.3, size=14)
    game = games.weighted_voting(weights, 0.6 * weights.sum())
    exact = masreplay.shapley(game, method="exact").values
    errors, plain_errors, stderrs = [], [], []
    for seed in range(6):
        auto = masreplay.shapley(game, method="msr", budget=3000, seed=seed)
        plain = masreplay.shapley(game, method="msr", budget=3000, seed=seed, surrogate="interactions")
        errors.append(np.abs(auto.values - exact))
        plain_errors.append(np.abs(plain.values - exact))
        stderrs.append(np.asarray(auto.stderr))
    assert np.mean(errors) < 0.75 * np.mean(plain_errors)
    # Two-sided, on these 84 intervals: 0.94 covered and errors 0.98x the standard errors (root
    # mean squares); standard errors 1.2x too wide cover 0.99 (0.82x), 1.2x too narrow 0.92 (1.18x).
    errors, stderrs = np.concatenate(errors), np.concatenate(stderrs)
    assert 0.9 <= np.mean(errors <= 1.96 * stderrs) <= 0.98
    assert 0.85 <= np.sqrt(np.mean(errors**2) / np.mean(stderrs**2)) <= 1.15


def test_auto_finds_the_step_of_an_integer_voting_game():
    # Integer weights: every fold's step is the game itself, so the residual, and the error, vanish.
    weights = np.random.default_rng(5).integers(1, 6, size=30).astype(float)
    game = games.weighted_voting(weights, 0.6 * weights.sum())
    exact = _voting_shapley(weights.astype(int), 0.6 * weights.sum())
    stepped = masreplay.shapley(game, method="msr", budget=10_000, seed=0)
    plain = masreplay.shapley(game, method="msr", budget=10_000, seed=0, surrogate="interactions")
    assert np.abs(stepped.values - exact).mean() < 0.5 * np.abs(plain.values - exact).mean()


def _voting_shapley(weights: np.ndarray, quota: float) -> np.ndarray:
    """Exact Shapley values of an integer weighted voting game: for each player, the others'
    coalitions counted by (size, weight sum), weighted by s! (n - s - 1)! / n! where the player swings."""
    n, total = len(weights), int(weights.sum())
    values = np.zeros(n)
    for i in range(n):
        counts = np.zeros((n, total + 1))
        counts[0, 0] = 1.0
        for j in np.delete(np.arange(n), i):
            counts[1:, weights[j] :] += counts[:-1, : total + 1 - weights[j]].copy()
        for size in range(n):
            swing = [w for w in range(total + 1) if w < quota <= w + weights[i]]
            share = math.factorial(size) * math.factorial(n - size - 1) / math.factorial(n)
            values[i] += share * counts[size, swing].sum()
    return values


def test_census_values_most_coalitions_and_stands_in_for_the_rest():
    """Near-complete enumeration: efficient by construction, exact to rounding where its
    surrogate holds the game (a SOUM of order 3 at n = 10, 1,000 of 1,024 coalitions), calibrated
    where it does not (full order), refused where the budget reaches under half the coalitions."""
    low, full = games.soum(10, 40, 3, seed=11), games.soum(10, 40, 10, seed=12)
    result = masreplay.shapley(low, method="census", budget=1000, seed=1)
    assert result.evaluations == 1000 and not result.exact
    assert abs(result.efficiency_gap) < 1e-12
    np.testing.assert_allclose(result.values, low.shapley_values(), atol=1e-9)
    truth = full.shapley_values()
    hits, errors = [], []
    for seed in range(60):
        estimate = masreplay.shapley(full, method="census", budget=1000, seed=seed)
        assert abs(estimate.efficiency_gap) < 1e-12
        hits.extend(np.abs(estimate.values - truth) <= 1.96 * estimate.stderr)
        errors.append(np.abs(estimate.values - truth).mean())
    assert 0.9 <= np.mean(hits) <= 0.985
    # KernelSHAP on the same coalitions' budget, for scale: the census is several times closer.
    kernel = np.mean(
        [np.abs(masreplay.shapley(full, method="kernel", budget=1000, seed=s).values - truth).mean() for s in range(10)]
    )
    assert np.mean(errors) < kernel / 2
    with pytest.raises(InvalidArgumentError, match=r"method='census' values at least half of the 2\^10"):
        masreplay.shapley(full, method="census", budget=500)
    with pytest.raises(InvalidArgumentError, match=r"method=\"census\" under noise"):
        masreplay.shapley(games.function(full.values, 10), method="census", budget=1000, noise=0.1)
