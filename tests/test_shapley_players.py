"""Players the caller knows about: fixed (always present) and excluded players in
``shapley`` and ``trace_shapley``, canonical forms that value equal coalitions once (16
evaluations instead of 17 for an orchestrator and four workers), and ``event_credit``."""

from __future__ import annotations

import numpy as np
import pytest

import masreplay
from masreplay import event_credit, games
from masreplay.errors import InvalidArgumentError

K = 4


def value(game, players, n):
    mask = np.zeros((1, n), dtype=bool)
    mask[0, list(players)] = True
    return float(game.values(mask)[0])


def subgame(game, n, free, fixed):
    """The dense table of ``game`` among ``free`` players with ``fixed`` always present."""
    rows = []
    for mask in range(1 << len(free)):
        rows.append(value(game, list(fixed) + [p for k, p in enumerate(free) if mask >> k & 1], n))
    return games.table(rows)


@pytest.mark.parametrize("seed", range(4))
def test_fixed_and_excluded_players_leave_the_game(seed):
    n = 7
    game = games.soum(n, 30, seed=seed)
    fixed, exclude = [seed % n], [(seed + 2) % n, (seed + 4) % n]
    free = [p for p in range(n) if p not in fixed + exclude]
    got = masreplay.shapley(game, fixed=fixed, exclude=exclude, method="exact")
    expected = masreplay.shapley(subgame(game, n, free, fixed), method="exact").values
    np.testing.assert_allclose(got.values[free], expected, atol=1e-12)
    assert (got.values[fixed + exclude] == 0).all() and (got.stderr[fixed + exclude] == 0).all()
    target = value(game, free + fixed, n) - value(game, fixed, n)
    for method in ["permutation", "kernel", "auto"]:
        sampled = masreplay.shapley(game, fixed=fixed, exclude=exclude, method=method, budget=300, seed=seed)
        assert sampled.values.sum() == pytest.approx(target, abs=1e-9)


def orchestrated(masks: np.ndarray) -> np.ndarray:
    """Orchestrator 0 and workers 1..K: with no worker the team does what nobody does."""
    workers = masks[:, 1:].sum(axis=1)
    return np.where(workers > 0, workers + np.where(masks[:, 0], 2.0, 0.5), 0.0)


def counting(f):
    rows = []

    def counted(*args):
        rows.append(len(args[-1]))
        return f(*args)

    return counted, rows


def test_a_canonical_form_values_equal_coalitions_once():
    parents = [-1] + [0] * K
    f, rows = counting(orchestrated)
    plain = masreplay.shapley(games.function(f, K + 1), parents=parents)
    assert plain.method == "precedence" and plain.exact
    assert plain.evaluations == sum(rows) == 2**K + 1
    f, rows = counting(orchestrated)
    folded = masreplay.shapley(
        games.function(f, K + 1, canonical=lambda m: m & m[:, 1:].any(axis=1, keepdims=True)), parents=parents
    )
    assert folded.evaluations == sum(rows) == 2**K
    np.testing.assert_allclose(folded.values, plain.values, atol=1e-12)
    # Fixing the orchestrator spends 16 too, and credits the workers alone.
    f, rows = counting(orchestrated)
    fixed = masreplay.shapley(games.function(f, K + 1), parents=parents, fixed=[0])
    assert fixed.evaluations == sum(rows) == 2**K
    assert fixed.values[0] == 0 and fixed.values.sum() == pytest.approx(K + 2.0)


def test_bad_players_and_canonical_forms():
    game = games.soum(4, 5, seed=1)
    for kwargs, match in [
        ({"fixed": [4]}, "out of range"),
        ({"fixed": [1], "exclude": [1]}, "both fixed and excluded"),
        ({"fixed": [0, 1], "exclude": [2, 3]}, "nothing to credit"),
        ({"fixed": ["a"]}, "not a player index"),
        ({"exclude": [-1]}, "not a player index"),
    ]:
        with pytest.raises(InvalidArgumentError, match=match):
            masreplay.shapley(game, **kwargs)
    with pytest.raises(InvalidArgumentError, match="excluded player 0"):
        masreplay.shapley(game, parents=[-1, 0, 0, 0], exclude=[0])
    with pytest.raises(InvalidArgumentError, match="canonical returned"):
        masreplay.shapley(games.function(orchestrated, K + 1, canonical=lambda m: m[:1]))
    with pytest.raises(ZeroDivisionError):
        masreplay.shapley(games.function(orchestrated, K + 1, canonical=lambda m: 1 / 0))


# ---- traces ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def team():
    """Traces of an orchestrator and four workers."""
    batch = masreplay.sim.generate(12, agents=(K, K), depth=1, fan_out=(K, K), seed=3)
    sizes = np.bincount(masreplay.trace_players(batch)["trace_index"].to_numpy())
    batch = batch[[int(t) for t in np.flatnonzero(sizes == K + 1)]]
    players = masreplay.trace_players(batch)
    assert len(batch) >= 4
    assert set(players.filter(players["player"].to_numpy() == 0)["label"].to_pylist()) == {"orchestrator"}
    return batch


def trace_value(trace_index, masks):
    return orchestrated(masks[:, : K + 1]) * (1 + trace_index)


def test_trace_shapley_spends_sixteen_evaluations_with_the_orchestrator_fixed(team):
    f, rows = counting(trace_value)
    plain = masreplay.trace_shapley(team, f)
    assert (plain.evaluations == 2**K + 1).all() and sum(rows) == plain.total_evaluations
    seen = []

    def fixed_value(trace_index, masks):
        seen.append(masks.copy())
        return trace_value(trace_index, masks)

    f, rows = counting(fixed_value)
    fixed = masreplay.trace_shapley(team, f, fixed=["orchestrator"])
    assert (fixed.evaluations == 2**K).all() and sum(rows) == fixed.total_evaluations == len(team) * 2**K
    assert np.concatenate(seen)[:, 0].all()
    players = fixed.players
    orchestrator = players["label"].to_numpy(zero_copy_only=False) == "orchestrator"
    assert not players["in_game"].to_numpy(zero_copy_only=False)[orchestrator].any()
    assert (players["value"].to_numpy()[orchestrator] == 0).all()
    # Workers share v(N) - v(orchestrator) = K * (1 + t) symmetrically.
    per_trace = np.bincount(players["trace_index"].to_numpy(), weights=players["value"].to_numpy())
    np.testing.assert_allclose(per_trace, [(K + 2.0) * (1 + t) for t in range(len(team))], atol=1e-9)


def test_trace_shapley_canonical_forms_and_exclusion(team):
    def canonical(trace_index, masks):
        return masks & masks[:, 1:].any(axis=1, keepdims=True)

    f, rows = counting(trace_value)
    plain = masreplay.trace_shapley(team, trace_value)
    folded = masreplay.trace_shapley(team, f, canonical=canonical)
    assert (folded.evaluations == 2**K).all() and sum(rows) == folded.total_evaluations
    np.testing.assert_allclose(folded.players["value"].to_numpy(), plain.players["value"].to_numpy(), atol=1e-9)
    seen = []

    def excluded_value(trace_index, masks):
        seen.append(masks.copy())
        return trace_value(trace_index, masks)

    excluded = masreplay.trace_shapley(team, excluded_value, exclude=["worker_2"], fixed=["absent label"])
    assert (excluded.evaluations == 2 ** (K - 1) + 1).all()
    labels = excluded.players["label"].to_numpy(zero_copy_only=False)
    column = masreplay.trace_players(team)["player"].to_numpy()[labels == "worker_2"]
    assert not any(m[:, c].any() for m in seen for c in set(column))
    # A batch whose traces differ in size pads the masks; a canonical form may not fill the padding.
    small = masreplay.sim.generate(1, agents=(1, 1), depth=1, fan_out=(1, 1), seed=0)
    mixed = masreplay.TraceBatch.concat([team[[0]], small])
    with pytest.raises(InvalidArgumentError, match="beyond the trace"):
        masreplay.trace_shapley(mixed, trace_value, canonical=lambda t, m: np.ones_like(m))
    with pytest.raises(InvalidArgumentError, match="canonical returned"):
        masreplay.trace_shapley(team, trace_value, canonical=lambda t, m: m[:1])
    with pytest.raises(InvalidArgumentError, match="trace_shapley: fixed must be a sequence of strings, got str"):
        masreplay.trace_shapley(team, trace_value, fixed="orchestrator")


def test_event_credit_splits_by_default_or_credits_each_event(team):
    split = masreplay.trace_shapley(team, trace_value)
    each = masreplay.trace_shapley(team, trace_value, event_credit="each")
    assert split.event_credit == "split" and each.event_credit == "each"
    owned = each.events["player"].to_numpy() >= 0
    np.testing.assert_array_equal(each.credit[owned], each.events["player_value"].to_numpy()[owned])
    n_events = masreplay.trace_players(team)["n_events"].to_numpy()
    np.testing.assert_allclose(
        np.bincount(split.events["trace_index"].to_numpy(), weights=split.credit),
        np.bincount(split.players["trace_index"].to_numpy(), weights=split.players["value"].to_numpy()),
    )
    assert (n_events > 1).any() and not np.allclose(split.credit[owned], each.credit[owned])
    # The viewer's per-event stderr follows the same choice (sampled: 17 down-sets, budget 12).
    players = masreplay.trace_players(team)
    row = np.searchsorted(players["trace_index"].to_numpy(), split.events["trace_index"].to_numpy())
    row = (row + np.maximum(split.events["player"].to_numpy(), 0))[owned]
    for share in ["split", "each"]:
        credit = masreplay.trace_shapley(team, trace_value, budget=12, event_credit=share)
        assert (credit.players["stderr"].to_numpy() > 0).any()
        resolved = event_credit.resolve(team, None, credit)
        divisor = n_events[row] if share == "split" else 1
        np.testing.assert_allclose(resolved.values[owned], credit.credit[owned])
        np.testing.assert_allclose(resolved.stderr[owned], credit.players["stderr"].to_numpy()[row] / divisor)
    with pytest.raises(InvalidArgumentError, match="event_credit must be one of"):
        masreplay.trace_shapley(team, trace_value, event_credit="half")
