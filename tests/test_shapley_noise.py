"""Noisy value functions (``shapley(..., noise=, repeats=)``): every evaluation a fresh
draw, standard errors that hold the noise (two-sided coverage 93-97% over a fixed seed set,
in the exact-with-repeats regime and the sampled one, noise known or estimated), repeats
that spend the budget, ``target_stderr`` under noise, and bad input."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import masreplay
from masreplay import games
from masreplay.errors import InvalidArgumentError

SEEDS = range(200)


def value_range(game) -> float:
    n = game.n_players
    masks = np.array(list(itertools.product([False, True], repeat=n)))
    values = game.values(masks)
    return float(values.max() - values.min())


def truth(game, method="auto", **structure):
    exact = masreplay.shapley(game, budget=1 << 22, method=method, **structure)
    assert exact.exact
    return exact.values


class Coverage:
    """Shares of errors within 1.96 k stderr for k = 1, 1.4 and 1/1.4: the intervals must
    cover 93-97%, and 1.4x wider or narrower ones must leave that band (two-sided)."""

    def __init__(self) -> None:
        self.hits = dict.fromkeys((1.0, 1.4, 1 / 1.4), 0)
        self.count = 0

    def add(self, error: np.ndarray, stderr: np.ndarray) -> None:
        self.count += error.size
        for k in self.hits:
            self.hits[k] += int((error <= 1.96 * k * stderr).sum())

    def check(self) -> None:
        shares = {k: h / self.count for k, h in self.hits.items()}
        assert 0.93 <= shares[1.0] <= 0.97, shares
        assert shares[1.4] > 0.97 and shares[1 / 1.4] < 0.93, shares


SPAWN_TREE = {"parents": [-1, 0, 0, 0, -1, 4, 4, 5, 5, 1]}
CASES = {
    # Every coalition fits the budget ten times: exact enumeration with repeats.
    "exact, sigma known": (games.soum(6, 20, 3, seed=1), {}, 640, "known", "auto"),
    "exact, sigma estimated": (games.soum(6, 20, 6, seed=2), {}, 640, "auto", "auto"),
    # 2^10 coalitions exceed the budget: MSR (auto), or orderings, every coalition drawn afresh.
    "msr, sigma estimated": (games.soum(10, 30, 3, seed=3), {}, 2200, "auto", "auto"),
    "msr, sigma known, full order": (games.soum(12, 30, 12, seed=5), {}, 1200, "known", "msr"),
    "permutation": (games.soum(10, 30, 3, seed=3), {}, 2200, "auto", "permutation"),
    # Spawn-tree values: MSR over down-sets (precedence), MSR on the restricted game (permission).
    "precedence": (games.soum(10, 30, 10, seed=4), SPAWN_TREE, 2200, "known", "auto"),
    "permission": (games.soum(10, 30, 10, seed=4), SPAWN_TREE, 2200, "auto", "permission"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_intervals_cover_95_percent_under_noise(case):
    game, structure, budget, noise, method = CASES[case]
    exact = truth(game, "permission" if method == "permission" else "auto", **structure)
    sigma = 0.1 * value_range(game)
    coverage = Coverage()
    for seed in SEEDS:
        result = masreplay.shapley(
            games.noisy(game, sigma, seed=seed),
            budget=budget,
            seed=seed,
            noise=sigma if noise == "known" else "auto",
            method=method,
            **structure,
        )
        assert not result.exact and result.evaluations <= budget
        assert method == "auto" or result.method == method
        error = np.abs(result.values - exact)
        coverage.add(error, result.stderr)
    coverage.check()


def test_repeats_spend_the_budget_where_every_coalition_fits():
    game = games.soum(5, 10, seed=5)
    calls = []

    def draw(masks):
        calls.append(masks.copy())
        return game.values(masks) + np.random.default_rng(len(calls)).normal(0, 0.1, len(masks))

    result = masreplay.shapley(draw, 5, budget=1000, noise=0.1)
    seen = np.concatenate(calls)
    # Nothing cached; the budget spread over sizes, the empty and grand coalitions (weighted
    # 1/n in every value) drawn most.
    assert result.method == "exact" and result.evaluations == len(seen) and 900 < len(seen) <= 1000
    sizes = seen.sum(axis=1)
    empty, pair = (sizes == 0).sum(), (seen == [True, True, False, False, False]).all(axis=1).sum()
    assert empty > 3 * pair >= 3
    assert np.isnan(result.efficiency_gap) and result.noise == 0.1
    uniform = masreplay.shapley(games.noisy(game, 0.1), budget=1000, noise=0.1, repeats=31)
    assert uniform.evaluations == 31 * 32 and uniform.stderr[0] > 1.1 * result.stderr[0]
    fewer = masreplay.shapley(games.noisy(game, 0.1), budget=1000, noise=0.1, repeats=4)
    assert fewer.evaluations == 4 * 32
    assert fewer.stderr[0] == pytest.approx(uniform.stderr[0] * np.sqrt(31 / 4))
    # Sampled: each ordering's n + 1 coalitions drawn afresh, twice with repeats=2.
    noisy = games.noisy(games.soum(12, 20, seed=1), 0.1)
    sampled = masreplay.shapley(noisy, budget=5000, noise="auto", repeats=2, method="permutation")
    assert sampled.method == "permutation" and sampled.evaluations % (2 * 13 * 2) == 0
    assert sampled.evaluations <= 5000 and 0.08 < sampled.noise < 0.12
    # MSR: every request drawn twice, the census's requests more often.
    sampled = masreplay.shapley(noisy, budget=5000, noise="auto", repeats=2)
    assert sampled.method == "msr" and sampled.evaluations % 2 == 0 and 4800 < sampled.evaluations <= 5000
    assert 0.08 < sampled.noise < 0.12


@pytest.mark.parametrize(("n", "budget"), [(1, 3), (2, 7), (4, 30), (5, 76), (6, 152), (8, 669)])
def test_exact_enumeration_under_noise_spends_the_whole_budget(n, budget):
    """Rounding each size's Neyman share down to whole draws of every coalition left up to
    40% of the budget unspent (4 players, 30 evaluations: 18 drawn); what it leaves goes,
    size by size, where another draw of every coalition takes the most noise off."""
    noisy = games.noisy(games.soum(n, 5, seed=n), 0.1)
    result = masreplay.shapley(noisy, budget=budget, noise=0.1)
    assert result.method == "exact" and result.evaluations == budget


def test_repeats_count_against_msrs_ten_requests_a_player():
    """MSR's floor of 10 evaluations a player is one of requests (its strata sample them):
    with 80 evaluations, 8 players and repeats=3 the spawn tree's MSR got 26 requests and
    refused them, where tree-respecting orderings fit; `auto` runs those now."""
    noisy = games.noisy(games.soum(8, 12, seed=8), 0.3)
    parents = [-1, 0, 0, 1, -1, 4, 4, 5]
    result = masreplay.shapley(noisy, budget=80, noise=0.3, repeats=3, parents=parents)
    assert result.method == "precedence" and result.evaluations <= 80
    plain = masreplay.shapley(noisy, budget=80, noise=0.3, repeats=4)
    assert plain.method == "permutation" and plain.evaluations <= 80


def test_msr_under_noise_draws_every_request_afresh_and_repeats_the_bounds_and_the_census():
    game = games.soum(10, 30, 3, seed=3)
    calls = []

    def draw(masks):
        calls.append(np.array(masks, dtype=bool))
        return game.values(masks) + np.random.default_rng(len(calls)).normal(0, 0.1, len(masks))

    result = masreplay.shapley(draw, 10, budget=2000, noise="auto", seed=1)
    seen = np.concatenate(calls)
    # The budget is spent in draws: a coalition asked for twice is drawn twice, never read
    # back from a cache (a cache would leave a tenth of the budget unspent at n = 10).
    assert result.method == "msr" and result.evaluations == len(seen) and 1900 < len(seen) <= 2000
    sizes = seen.sum(axis=1)
    _, first, counts = np.unique(seen, axis=0, return_index=True, return_counts=True)
    assert (counts[(sizes[first] >= 3) & (sizes[first] <= 7)] > 1).any()
    # Neyman's rule: the empty and grand coalitions (1/n of every value) drawn most, then each
    # coalition of the census (sizes 1 and 9 here) more often than a sampled one.
    singles = counts[sizes[first] == 1]
    assert len(singles) == 10 and (singles == singles[0]).all()
    assert (sizes == 0).sum() == (sizes == 10).sum() > singles[0] > counts[sizes[first] == 5].max()
    assert 0.08 < result.noise < 0.12 and np.isnan(result.efficiency_gap)
    assert abs(result.values.sum() - game.shapley_values().sum()) < 0.1


def test_precedence_under_noise_reuses_every_down_set():
    """Under noise, spawn-tree values come from MSR over down-sets: each valued down-set
    informs every player on its border, where an ordering informs each player once. On an
    orchestrator with 11 workers its error is under 0.6x that of tree-respecting orderings
    (numpy, the same budget and noise), over 60 seeds."""
    parents = [-1] + [0] * 11
    game = games.soum(12, 30, 12, seed=4)
    exact = truth(game, parents=parents)
    errors = {"reuse": [], "orderings": []}
    for seed in range(60):
        result = masreplay.shapley(games.noisy(game, 0.1, seed=seed), budget=2200, seed=seed, noise=0.1, parents=parents)
        assert result.method == "precedence" and result.evaluations <= 2200
        errors["reuse"].append(np.abs(result.values - exact).mean())
        # The orchestrator first, then the workers in a uniform order: every prefix valued.
        rng = np.random.default_rng(seed)
        orders = np.array([[0, *rng.permutation(np.arange(1, 12))] for _ in range(2200 // 13)])
        ranks = np.argsort(orders, axis=1)
        prefixes = ranks[:, None, :] < np.arange(13)[None, :, None]
        worth = game.values(prefixes.reshape(-1, 12)).reshape(len(orders), 13)
        worth += rng.normal(0.0, 0.1, worth.shape)
        marginal = np.diff(worth, axis=1)
        phi = np.zeros(12)
        np.add.at(phi, orders.ravel(), marginal.ravel())
        errors["orderings"].append(np.abs(phi / len(orders) - exact).mean())
    assert np.mean(errors["reuse"]) < 0.6 * np.mean(errors["orderings"]), {k: np.mean(v) for k, v in errors.items()}


def test_precedence_at_its_smallest_budget_covers_95_percent():
    """At 10 evaluations a player a stratum of down-sets holds four to eight draws in two to
    four folds: 1.96 bare standard errors covered 92% (pooled over a chain, a star, singletons
    and a mixed forest, 200 seeds each); with Student's t on the strata's Welch-Satterthwaite
    degrees of freedom, 93-97% (two-sided)."""
    game = games.soum(7, 20, 7, seed=1)
    sigma = 0.1 * value_range(game)
    coverage = Coverage()
    for parents in ([-1, 0, 1, 2, 3, 4, 5], [-1, 0, 0, 0, 0, 0, 0], [-1] * 7, [-1, 0, 0, 1, -1, 4, 4]):
        exact = truth(game, parents=parents)
        for seed in SEEDS[:200]:
            noisy = games.noisy(game, sigma, seed=seed)
            result = masreplay.shapley(noisy, budget=70, seed=seed, noise=sigma, parents=parents)
            assert result.method == "precedence" and result.evaluations <= 70
            coverage.add(np.abs(result.values - exact), result.stderr)
    coverage.check()


def test_msr_at_its_smallest_budget_covers_95_percent():
    """At 10 requests a player MSR's strata hold a few pairs each, and a player's contribution
    is (n - s) / s times larger in the pairs it belongs to: a heavy-tailed mixture, whose
    sample variance has a third of the degrees of freedom of Gaussian draws (n = 8, 80
    evaluations: about 8, not 25). 1.96 bare standard errors covered 91%; with Student's t on
    the Welch-Satterthwaite degrees of freedom read from each stratum's fourth moment, 93-97%
    (two-sided), sigma known and estimated, a low-order and a full-order game."""
    coverage = Coverage()
    for order in (3, 8):
        game = games.soum(8, 16, order, seed=order)
        exact = game.shapley_values()
        sigma = 0.1 * value_range(game)
        for seed in SEEDS[:100]:
            for noise in (sigma, "auto"):
                noisy = games.noisy(game, sigma, seed=seed)
                result = masreplay.shapley(noisy, budget=80, seed=seed, noise=noise)
                assert result.method == "msr" and result.evaluations <= 80
                coverage.add(np.abs(result.values - exact), result.stderr)
    coverage.check()


def test_more_budget_never_picks_a_noisier_regime():
    """Exact enumeration at 2^n evaluations draws every coalition once, where Neyman's rule
    gives the empty and grand coalitions many draws: at n = 8 its error (0.083, sigma 0.3) was
    above MSR's one evaluation earlier (0.069). `auto` now runs exact from the budget where its
    noise variance falls below MSR's noise alone (n = 8: 384), so the error falls with the
    budget across the boundary."""
    game = games.soum(8, 16, 3, seed=2)
    exact = game.shapley_values()
    errors = {}
    for budget in (255, 256, 384):
        squares = []
        for seed in range(60):
            result = masreplay.shapley(games.noisy(game, 0.3, seed=seed), budget=budget, seed=seed, noise=0.3)
            squares.append(((result.values - exact) ** 2).mean())
        errors[budget] = (result.method, np.mean(squares))
    assert [errors[b][0] for b in (255, 256, 384)] == ["msr", "msr", "exact"], errors
    assert errors[256][1] <= errors[255][1] * 1.1 and errors[384][1] < errors[256][1], errors


def test_a_target_under_noise_is_met_from_a_pilot_round():
    """MSR's rounds to a target began with max(4096, 40 n) evaluations whatever the target:
    n = 8, target 0.05 spent 4,028 rollouts for an error of 0.011. The first round is now a
    pilot of MSR's smallest budget, the next as large as its standard error says."""
    game = games.soum(8, 16, 3, seed=1)
    result = masreplay.shapley(games.noisy(game, 0.3, seed=1), noise=0.3, target_stderr=0.05, method="msr", seed=1)
    assert result.converged and result.stderr.max() <= 0.05
    assert result.evaluations < 2000


def test_refusals_under_repeats_count_evaluations():
    """With repeats=8 MSR gets 10 requests of 80 evaluations; its refusal said "10 evaluations
    ... (needs 18)", counting requests. It needs 18 requests: 144 evaluations."""
    noisy = games.noisy(games.soum(8, 12, seed=8), 0.3)
    with pytest.raises(InvalidArgumentError, match=r"budget: 80 evaluations \(10 requests of 8 draws each\).*needs 144"):
        masreplay.shapley(noisy, budget=80, noise=0.3, repeats=8, method="msr")
    with pytest.raises(InvalidArgumentError, match=r"method='exact' under noise values all 2\^8 coalitions 3 times"):
        masreplay.shapley(noisy, budget=600, noise=0.3, repeats=3, method="exact")


def test_msr_spends_the_whole_budget_when_its_census_covers_every_size():
    """With every size a census MSR left the rounding of its Neyman floors unspent (n = 8,
    1,500 evaluations: 1,360 drawn); what is left goes, a draw of every coalition of a size
    pair (or of the empty and grand coalitions) at a time, where it takes the most noise off."""
    noisy = games.noisy(games.soum(8, 12, seed=8), 0.3)
    result = masreplay.shapley(noisy, budget=1500, noise=0.3, method="msr")
    assert result.method == "msr" and 1498 <= result.evaluations <= 1500


@pytest.mark.parametrize(("n", "target"), [(6, 0.01), (12, 0.05)])
def test_target_stderr_stops_under_noise(n, target):
    game = games.soum(n, 20, seed=n)
    result = masreplay.shapley(games.noisy(game, 0.2, seed=1), noise="auto", target_stderr=target, seed=2)
    assert result.converged and result.stderr.max() <= target
    assert np.abs(result.values - game.shapley_values()).max() < 4 * target
    # A smaller target costs more evaluations.
    tighter = masreplay.shapley(games.noisy(game, 0.2, seed=1), noise="auto", target_stderr=target / 2, seed=2)
    assert tighter.converged and tighter.evaluations > result.evaluations


def test_rounds_to_a_target_under_noise_cover_95_percent():
    """With ``target_stderr`` MSR runs in independent rounds combined by their budgets: the
    combination's intervals cover 93-97% over 150 seeds (two-sided), and every run converged."""
    game = games.soum(11, 30, 4, seed=6)
    exact = game.shapley_values()
    sigma = 0.1 * value_range(game)
    coverage = Coverage()
    for seed in range(150):
        noisy = games.noisy(game, sigma, seed=seed)
        result = masreplay.shapley(noisy, noise="auto", target_stderr=0.05, seed=seed, method="msr")
        assert result.method == "msr" and result.converged and result.stderr.max() <= 0.05
        error = np.abs(result.values - exact)
        coverage.add(error, result.stderr)
    coverage.check()


def test_noise_with_structure_and_fixed_players():
    game = games.soum(9, 25, seed=7)
    parents = [-1, 0, 0, 1, 1, -1, 5, 5, 6]
    for method in ["permission", "owen"]:
        structure = {"unions": [[0, 1, 2], [3, 4], [5, 6, 7, 8]]} if method == "owen" else {"parents": parents}
        result = masreplay.shapley(games.noisy(game, 0.05), noise=0.05, method=method, budget=3000, **structure)
        exact = masreplay.shapley(game, method=method, budget=1 << 20, **structure).values
        assert result.method == method and (np.abs(result.values - exact) <= 5 * result.stderr + 1e-12).all()
    fixed = masreplay.shapley(games.noisy(game, 0.05), noise=0.05, fixed=[0], budget=3000)
    assert fixed.values[0] == 0 and fixed.evaluations <= 3000


def test_bad_noise_arguments():
    game = games.soum(4, 5, seed=1)
    noisy = games.noisy(game, 0.1)
    for kwargs, match in [
        ({"noise": "loud"}, "noise must be"),
        ({"noise": -1.0}, "noise must be"),
        ({"noise": 0.1, "method": "kernel"}, "under noise"),
        ({"noise": 0.1, "method": "stratified"}, "under noise"),
        ({"noise": 0.1, "repeats": 0}, "repeats must be"),
        ({"repeats": 2}, "only a noisy game"),
        ({"noise": "auto", "method": "exact", "budget": 20}, "budget"),
        # Nothing measures the noise: one draw of each coalition, or a single ordering.
        ({"noise": "auto", "repeats": 1, "budget": 1000}, "repeats=1 with noise='auto'"),
        ({"noise": 0.1, "method": "permutation", "budget": 9}, "fewer than two orderings"),
    ]:
        with pytest.raises(InvalidArgumentError, match=match):
            masreplay.shapley(noisy, **kwargs)
    # The empty and the grand coalition drawn more often than the budget allows.
    one = games.noisy(games.soum(1, 1, seed=1), 0.1)
    with pytest.raises(InvalidArgumentError, match="cannot draw the empty and the grand coalition"):
        masreplay.shapley(one, noise=0.1, method="msr", budget=4, repeats=3)
    with pytest.raises(InvalidArgumentError, match="native game is deterministic"):
        masreplay.shapley(game, noise=0.1)
    with pytest.raises(InvalidArgumentError, match="sigma"):
        games.noisy(game, -1)


def test_trace_shapley_under_noise_draws_every_request_and_covers():
    """Each coalition an estimator asks for is a row of its own (a repeat is a second
    rollout), and value +- 1.96 stderr covers the exact spawn-tree values 93-97% of the time
    over 100 seeds (two-sided)."""
    batch = masreplay.sim.generate(20, agents=(3, 5), seed=4)
    weights = np.random.default_rng(0).uniform(-1, 1, (len(batch), 8))

    def value(trace_index, masks):
        own = (masks * weights[trace_index, : masks.shape[1]]).sum(axis=1)
        return own + 0.5 * (masks[:, 0] & masks[:, 1])  # the first two players' synergy

    truth = masreplay.trace_shapley(batch, value, budget=1 << 16)
    assert all(method == "precedence" for method in truth.methods)
    exact = truth.players["value"].to_numpy()
    sigma = 0.3
    coverage = Coverage()
    for seed in range(100):
        rng, rows = np.random.default_rng(seed), []

        def noisy(trace_index, masks, rng=rng, rows=rows):
            rows.append(len(masks))
            return value(trace_index, masks) + rng.normal(0.0, sigma, len(masks))

        credit = masreplay.trace_shapley(batch, noisy, budget=600, seed=seed, noise=sigma)
        assert sum(rows) == credit.total_evaluations == credit.evaluations.sum()
        assert (credit.evaluations <= 600).all() and (credit.noise == sigma).all()
        error = np.abs(credit.players["value"].to_numpy() - exact)
        stderr = credit.players["stderr"].to_numpy()
        coverage.add(error, stderr)
    coverage.check()


def test_trace_shapley_repeats_send_a_coalition_twice_and_estimate_the_noise():
    batch = masreplay.sim.generate(6, agents=(3, 4), seed=5)
    rng = np.random.default_rng(1)
    seen = []

    def noisy(trace_index, masks):
        seen.append((trace_index.copy(), masks.copy()))
        return masks.sum(axis=1) + rng.normal(0.0, 0.5, len(masks))

    credit = masreplay.trace_shapley(batch, noisy, budget=2_000, noise="auto", repeats=2)
    trace_index = np.concatenate([t for t, _ in seen])
    masks = np.concatenate([m for _, m in seen])
    rows = np.column_stack([trace_index, masks]).astype(np.int64)
    _, counts = np.unique(rows, axis=0, return_counts=True)
    assert counts.min() >= 2  # every coalition drawn at least twice, each draw a row
    assert np.all(np.abs(credit.noise - 0.5) < 0.15), credit.noise
    # Without noise the same value function is called once per coalition.
    plain = masreplay.trace_shapley(batch, lambda t, m: m.sum(axis=1).astype(float), budget=2_000)
    assert plain.noise is None and plain.total_evaluations < credit.total_evaluations
