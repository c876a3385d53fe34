"""Logged rollouts as a prior (``shapley(game, prior=...)``): phi(v) = phi(prior) +
phi(v - prior), the live evaluations spent on the residual only. Checked against exact values:
unbiased (a prior equal to the game leaves nothing to estimate; a prior with the wrong values
does not move the estimate off the truth), lower error than without a prior at the same
budget when the prior is close, and two-sided coverage of value +- 1.96 stderr over a fixed
seed set, with and without evaluation noise."""

from __future__ import annotations

import numpy as np
import pytest

import masreplay
from masreplay import games
from masreplay.errors import InvalidArgumentError

# Ten players with interactions of every order, 300 live evaluations (a third of the
# coalitions), 3,000 logged rollouts: most coalitions were seen about three times.
N, BUDGET, SEEDS = 10, 300, range(200)
LIVE = games.soum(N, 40, N, seed=12)


def exact(game) -> np.ndarray:
    result = masreplay.shapley(game, method="exact", budget=1 << 17)
    assert result.exact
    return result.values


def logged_prior(seed: int, rollouts: int = 3_000, sigma: float = 0.1) -> games.Game:
    """The empirical game of ``rollouts`` logged teams (random coalitions, noisy rewards; a
    coalition never seen is predicted by a pairwise regression): close to LIVE, never equal."""
    rng = np.random.default_rng(seed)
    masks = rng.random((rollouts, N)) < 0.5
    rewards = LIVE.values(masks) + rng.normal(0.0, sigma, rollouts)
    return games.empirical(masks, rewards, order=2)


def test_a_prior_equal_to_the_game_leaves_nothing_to_estimate():
    result = masreplay.shapley(LIVE, budget=BUDGET, prior=LIVE, seed=3)
    np.testing.assert_allclose(result.values, exact(LIVE), atol=1e-9)
    assert result.stderr.max() < 1e-9
    assert result.evaluations <= BUDGET and result.prior_evaluations == 1 << N  # the prior exactly


def test_a_wrong_prior_costs_accuracy_not_correctness():
    """A prior with no relation to the game (another SOUM): the estimate is still centred
    on the game's values, its intervals still cover."""
    wrong = games.soum(N, 40, 3, seed=99)
    truth = exact(LIVE)
    errors = np.array([masreplay.shapley(LIVE, budget=BUDGET, prior=wrong, seed=s).values - truth for s in range(40)])
    stderr = masreplay.shapley(LIVE, budget=BUDGET, prior=wrong, seed=0).stderr
    # The mean error over 40 runs is within 4 standard errors of that mean.
    assert (np.abs(errors.mean(axis=0)) <= 4 * stderr / np.sqrt(40)).all()


def test_a_close_prior_cuts_the_error_at_the_same_budget():
    truth = exact(LIVE)
    without = [np.abs(masreplay.shapley(LIVE, budget=BUDGET, seed=s).values - truth).mean() for s in range(20)]
    prior = [
        np.abs(masreplay.shapley(LIVE, budget=BUDGET, seed=s, prior=logged_prior(s)).values - truth).mean() for s in range(20)
    ]
    assert np.mean(prior) < 0.4 * np.mean(without), (np.mean(prior), np.mean(without))


# Under noise the ordering samplers run (MSR is not used there); their standard error needs
# more orderings than 300 evaluations give (30 orderings cover about 92%, prior or not).
@pytest.mark.parametrize(("noise", "budget"), [(None, BUDGET), (0.1, 900)])
def test_intervals_cover_95_percent_with_a_prior(noise, budget):
    truth = exact(LIVE)
    hits = dict.fromkeys((1.0, 1.4, 1 / 1.4), 0)
    count = 0
    for seed in SEEDS:
        game = LIVE if noise is None else games.noisy(LIVE, noise, seed=seed)
        result = masreplay.shapley(game, budget=budget, seed=seed, prior=logged_prior(seed), noise=noise)
        assert not result.exact
        error = np.abs(result.values - truth)
        count += error.size
        for k in hits:
            hits[k] += int((error <= 1.96 * k * result.stderr).sum())
    shares = {k: h / count for k, h in hits.items()}
    assert 0.93 <= shares[1.0] <= 0.97, shares
    assert shares[1.4] > 0.97 and shares[1 / 1.4] < 0.93, shares


def test_a_prior_keeps_the_structure_and_the_fixed_players():
    parents = [-1, 0, 0, 0] + [i % 4 for i in range(4, N)]
    truth = masreplay.shapley(LIVE, parents=parents, fixed=[0], budget=1 << 20).values
    result = masreplay.shapley(LIVE, parents=parents, fixed=[0], budget=BUDGET, prior=logged_prior(1), seed=2)
    # 180 down-sets fit the budget: both parts exact, so the sum is the exact value.
    assert result.values[0] == 0.0 and result.method == "precedence" and result.exact
    np.testing.assert_allclose(result.values, truth, atol=1e-9)


def test_bad_priors_are_refused_clearly():
    with pytest.raises(InvalidArgumentError, match="prior: 4 players"):
        masreplay.shapley(LIVE, budget=BUDGET, prior=games.additive([1.0, 2.0, 3.0, 4.0]))
    with pytest.raises(InvalidArgumentError, match="callable"):
        masreplay.shapley(LIVE, budget=BUDGET, prior="logs")
    with pytest.raises(InvalidArgumentError, match="shape"):
        masreplay.shapley(LIVE, budget=BUDGET, prior=lambda masks: np.zeros(3))
    with pytest.raises(InvalidArgumentError, match="native game is deterministic"):
        masreplay.shapley(LIVE, budget=BUDGET, prior=LIVE, noise=0.1)
