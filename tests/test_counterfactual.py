"""Counterfactual credit: checked against the simulator's ground truth, planted effects and
hand-computed cases, never against itself."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import masreplay
from masreplay import GraphBuffer, InvalidArgumentError, TraceNotFoundError, TraceValidationError
from masreplay.counterfactual import CREDIT_COLUMNS


def _keyed(table: pa.Table) -> dict[tuple[str, str], tuple[float, float, int]]:
    """Credited events of a credit table, keyed by (trace_id, event_id)."""
    rows = table.filter(pc.greater(table["n_branches"], 0)).to_pylist()
    return {(r["trace_id"], r["event_id"]): (r["credit"], r["stderr"], r["n_branches"]) for r in rows}


@pytest.fixture(scope="module")
def truth():
    return masreplay.sim.branches(400, branches=8, branch_points=3, noise=0.2, seed=21)


def test_branch_credit_falls_within_three_standard_errors_of_the_true_effects(truth):
    table = masreplay.counterfactual_credit(truth.batch)
    assert table.column_names == list(CREDIT_COLUMNS)
    assert table.num_rows == int(truth.batch.event_offsets[-1])  # aligned with batch.events()
    credited = _keyed(table)
    effects = truth.effects.to_pylist()
    assert set(credited) == {(e["trace_id"], e["event_id"]) for e in effects}
    within = [
        abs(credited[(e["trace_id"], e["event_id"])][0] - e["effect"]) <= 3 * credited[(e["trace_id"], e["event_id"])][1]
        for e in effects
    ]
    assert np.mean(within) >= 0.95, f"{np.mean(within):.3f} of {len(effects)} effects within 3 standard errors"
    assert {e["kind"] for e in effects} == {"substitute", "ablate", "no_spawn"}


def _standardized_branch_errors() -> dict[str, np.ndarray]:
    """|credit - true effect| / stderr per branch point, by kind, over 24 simulator seeds with
    3 to 8 branches per event (few branches: where a normal interval would be too narrow)."""
    errors: dict[str, list[float]] = {}
    for seed in range(24):
        gt = masreplay.sim.branches(100, branches=3 + seed % 6, branch_points=3, noise=0.2, seed=700 + seed)
        credited = _keyed(masreplay.counterfactual_credit(gt.batch, aligned=False))
        for effect in gt.effects.to_pylist():
            credit, stderr, _ = credited[(effect["trace_id"], effect["event_id"])]
            errors.setdefault(effect["kind"], []).append(abs(credit - effect["effect"]) / stderr)
    return {kind: np.array(values) for kind, values in errors.items()}


def test_branch_credit_intervals_cover_the_true_effect_95_percent_of_the_time():
    """Two-sided: where branches replicate one intervention (ablate, no_spawn), credit +- 1.96
    stderr covers the true effect 93-97% of the time, and 1.4x wider or narrower intervals
    leave that band. Substitute branches each draw another alternative, whose spread
    overstates the factual reward's noise: their intervals are conservative (floor only)."""
    errors = _standardized_branch_errors()
    replicated = np.concatenate([errors["ablate"], errors["no_spawn"]])
    assert replicated.size > 3000
    coverage = {scale: float(np.mean(replicated <= 1.96 * scale)) for scale in (1.0, 1.4, 1 / 1.4)}
    assert 0.93 <= coverage[1.0] <= 0.97, coverage
    assert coverage[1.4] > 0.97, f"1.4x inflated errors would pass: {coverage}"
    assert coverage[1 / 1.4] < 0.93, f"1.4x shrunk errors would pass: {coverage}"
    assert np.mean(errors["substitute"] <= 1.96) >= 0.95


def test_events_without_branches_get_no_credit(truth):
    table = masreplay.counterfactual_credit(truth.batch)
    uncredited = table.filter(pc.equal(table["n_branches"], 0))
    assert uncredited.num_rows == table.num_rows - truth.effects.num_rows
    assert pc.all(pc.is_nan(uncredited["credit"])).as_py()
    assert pc.all(pc.is_nan(uncredited["stderr"])).as_py()
    # Only the factual traces carry credit (baseline "mean" never credits a branch's events).
    factual = set(truth.effects["trace_id"].to_pylist())
    assert set(_keyed(table)) and {t for t, _ in _keyed(table)} <= factual


def test_compact_table_holds_the_credited_rows_of_the_aligned_one(truth):
    for credit in (masreplay.counterfactual_credit, masreplay.same_prefix_credit):
        full = credit(truth.batch)
        compact = credit(truth.batch, aligned=False)
        _assert_same_credit(compact, full.filter(pc.greater(full["n_branches"], 0)))


def test_events_line_up_with_batch_events(truth):
    batch = truth.batch[list(range(30))]
    table = masreplay.counterfactual_credit(batch)
    events = batch.events()
    assert table["trace_id"].cast(pa.string()).to_pylist() == events["trace_id"].to_pylist()
    assert table["event_id"].to_pylist() == events["id"].to_pylist()
    assert table["agent"].to_pylist() == events["agent"].to_pylist()


def test_event_ids_are_taken_at_any_positions(truth):
    """The core's gather of event ids (the compact table's event_id): any order, repeats,
    the last event; a position past the events is refused, not read."""
    ids = truth.batch.events()["id"]
    positions = np.random.default_rng(3).integers(0, len(ids), 500).astype(np.uint64)
    positions = np.concatenate([positions, [len(ids) - 1, 0, 0]]).astype(np.uint64)
    taken = pa.array(truth.batch._core.event_ids_at(positions))
    assert taken.to_pylist() == ids.take(pa.array(positions)).to_pylist()
    with pytest.raises(InvalidArgumentError, match="past the last"):
        truth.batch._core.event_ids_at(np.array([len(ids)], dtype=np.uint64))


def _trace(trace_id, reward, events, of=None):
    """A trace record with these events and team reward, a branch of ``of`` = (trace, event, kind)."""
    record = {
        "trace_id": trace_id,
        "task_id": "task",
        "events": [{"id": e, "t": float(k), "type": "message", "agent": "a"} for k, e in enumerate(events)],
        "edges": [],
        "rewards": {"team": reward},
        "costs": {"tokens": 0, "wall_clock_s": 0},
    }
    if of:
        record["counterfactual_of"] = dict(zip(("trace_id", "event_id", "kind"), of, strict=True))
    return record


def test_leave_one_out_credits_every_alternative_against_the_others():
    trace = _trace
    batch = masreplay.load_traces(
        [
            trace("f", 1.0, ["e0", "e1"]),
            trace("b1", 0.0, ["e0", "e1"], ("f", "e1", "substitute")),
            trace("b2", 0.5, ["e0", "e1"], ("f", "e1", "substitute")),
        ]
    )
    mean = _keyed(masreplay.counterfactual_credit(batch))
    # s^2 = var(0, 0.5) = 0.125 with one degree of freedom: scaled by t(1) / 1.96.
    stderr = np.sqrt(0.125 * 1.5) * 12.706205 / 1.959964
    assert mean == {("f", "e1"): (pytest.approx(0.75), pytest.approx(stderr), 2)}
    loo = _keyed(masreplay.counterfactual_credit(batch, baseline="loo"))
    assert loo[("f", "e1")][0] == pytest.approx(0.75)
    assert loo[("b1", "e1")][0] == pytest.approx(0.0 - 0.75)
    assert loo[("b2", "e1")][0] == pytest.approx(0.5 - 0.5)
    with pytest.raises(InvalidArgumentError, match="baseline"):
        masreplay.counterfactual_credit(batch, baseline="median")
    with pytest.raises(TraceValidationError, match="/rewards/tool"):
        masreplay.counterfactual_credit(batch, channel="tool")


@pytest.mark.parametrize("baseline", ["mean", "loo"])
def test_branch_credit_keeps_its_digits_for_rewards_far_from_zero(baseline):
    """Branch rewards near 1e9 that differ by about 1e-3: credit and stderr agree with numpy's
    two-pass mean and variance in every layout. Squares of the rewards themselves (near 1e18,
    128 apart) would lose the variance entirely."""
    noise = 1e-3 * np.random.default_rng(5).standard_normal(8)
    records = []
    for name, offset in (("far", 1e9), ("near", 0.0)):
        records.append(_trace(name, offset + 2e-3, ["e0", "e1"]))
        records += [_trace(f"{name}/{k}", offset + x, ["e0"], (name, "e1", "ablate")) for k, x in enumerate(noise)]
    far = np.array([r["rewards"]["team"] for r in records[1:9]])
    near_std = np.std(noise, ddof=1)
    for order in (range(len(records)), reversed(range(len(records))), np.random.default_rng(6).permutation(len(records))):
        credit = _keyed(masreplay.counterfactual_credit(masreplay.load_traces([records[k] for k in order]), baseline=baseline))
        # The Student-t factor of n = 8, from the family near zero (exact in any arithmetic).
        factor = credit[("near", "e1")][1] / (near_std * np.sqrt(1 + 1 / 8))
        assert credit[("far", "e1")][0] == pytest.approx(1e9 + 2e-3 - np.mean(far), abs=1e-6)
        assert credit[("far", "e1")][1] == pytest.approx(np.std(far, ddof=1) * np.sqrt(1 + 1 / 8) * factor, rel=1e-6)
        assert credit[("far", "e1")][2] == 8


@pytest.mark.parametrize("baseline", ["mean", "loo"])
@pytest.mark.parametrize(("factual", "branch"), [(1.0, 1e300), (-1e300, 0.5), (1.0, 2.0**49)])
def test_branch_credit_refuses_a_reward_past_2_to_the_49_naming_its_trace(baseline, factual, branch):
    # Before the bound: credit inf or a stderr of NaN over three branches.
    records = [_trace("f", factual, ["e0", "e1"])]
    records += [_trace(f"b{k}", r, ["e0"], ("f", "e1", "ablate")) for k, r in enumerate([0.0, branch, -1.0])]
    bad = "f" if abs(factual) >= 2.0**49 else "b1"
    for order in ([0, 1, 2, 3], [3, 2, 1, 0]):
        batch = masreplay.load_traces([records[k] for k in order])
        with pytest.raises(TraceValidationError, match=r"rewards must be finite, of magnitude below 2\^49") as raised:
            masreplay.counterfactual_credit(batch, baseline=baseline)
        assert (raised.value.trace_id, raised.value.path) == (bad, "/rewards/team")
    records[2]["rewards"]["team"] = np.nextafter(2.0**49, 0.0)
    records[0]["rewards"]["team"] = 1.0
    credit = _keyed(masreplay.counterfactual_credit(masreplay.load_traces(records), baseline=baseline))
    assert np.isfinite(credit[("f", "e1")][:2]).all()


def test_same_prefix_credit_refuses_a_reward_past_2_to_the_49_naming_its_trace():
    batch = masreplay.load_traces([_trace("a", 1.0, ["e0", "e1"]), _trace("b", -1e300, ["e0", "e2"])])
    with pytest.raises(
        TraceValidationError, match=r"the reward is -1e300: rewards must be finite, of magnitude below 2\^49"
    ) as raised:
        masreplay.same_prefix_credit(batch)
    assert (raised.value.trace_id, raised.value.path) == ("b", "/rewards/team")


def test_a_branch_naming_a_missing_event_is_reported():
    gt = masreplay.sim.branches(2, branches=2, branch_points=1, seed=1)
    records = list(gt.batch)
    records[1]["counterfactual_of"]["event_id"] = "nope"
    with pytest.raises(TraceValidationError) as raised:
        masreplay.counterfactual_credit(masreplay.load_traces(records))
    assert raised.value.trace_id == records[1]["trace_id"]
    assert raised.value.path == "/counterfactual_of/event_id"


def test_buffer_keeps_branches_across_save_and_load(truth, tmp_path):
    batch = truth.batch[list(range(90))]
    buffer = GraphBuffer(1000)
    buffer.add(batch)
    expected = masreplay.counterfactual_credit(batch)
    _assert_same_credit(masreplay.counterfactual_credit(buffer), expected)
    buffer.save(tmp_path / "b.parquet")
    _assert_same_credit(masreplay.counterfactual_credit(GraphBuffer.load(tmp_path / "b.parquet")), expected)


def _assert_same_credit(got: pa.Table, expected: pa.Table) -> None:
    assert got.column_names == expected.column_names
    for name in got.column_names:
        if name in ("credit", "stderr"):
            np.testing.assert_array_equal(got[name].to_numpy(), expected[name].to_numpy())  # NaN == NaN here
        else:
            assert got[name].to_pylist() == expected[name].to_pylist(), name


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32), shift=st.floats(-5, 5), order_seed=st.integers(0, 2**32))
def test_credit_ignores_trace_order_and_a_constant_reward_shift(seed, shift, order_seed):
    gt = masreplay.sim.branches(6, branches=3, branch_points=2, seed=seed)
    records = list(gt.batch)
    base = _keyed(masreplay.counterfactual_credit(gt.batch))
    for record in records:
        record["rewards"]["team"] += shift
    np.random.default_rng(order_seed).shuffle(records)
    moved = _keyed(masreplay.counterfactual_credit(masreplay.load_traces(records)))
    assert moved.keys() == base.keys()
    for key, (credit, stderr, n) in base.items():
        assert moved[key][0] == pytest.approx(credit, abs=1e-9)
        assert moved[key][1] == pytest.approx(stderr, abs=1e-9, nan_ok=True)
        assert moved[key][2] == n


def _family_stable(batch: masreplay.TraceBatch, order: np.ndarray) -> list[int]:
    """``order`` with each factual trace's branches put back in their original relative order,
    in the positions ``order`` gave them: families scattered, each factual trace before or after
    its branches, but every event's branch rewards summed in the same order (so the same bits)."""
    factual_of = batch.to_arrow()["counterfactual_of"].combine_chunks().field("trace_id").to_pylist()
    order = [int(row) for row in order]
    positions: dict[str, list[int]] = {}
    for position, row in enumerate(order):
        if factual_of[row] is not None:
            positions.setdefault(factual_of[row], []).append(position)
    for family in positions.values():
        for position, row in zip(family, sorted(order[p] for p in family), strict=True):
            order[position] = row
    return order


def _assert_same_bits(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for key, (credit, stderr, n) in expected.items():
        assert np.float64(got[key][0]).tobytes() == np.float64(credit).tobytes(), key
        assert np.float64(got[key][1]).tobytes() == np.float64(stderr).tobytes(), key
        assert got[key][2] == n, key


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32), order_seed=st.integers(0, 2**32), baseline=st.sampled_from(["mean", "loo"]))
def test_shuffled_traces_get_the_credit_of_the_adjacent_layout(seed, order_seed, baseline):
    gt = masreplay.sim.branches(30, branches=3, branch_points=2, seed=seed)
    expected = _keyed(masreplay.counterfactual_credit(gt.batch, baseline=baseline))
    order = _family_stable(gt.batch, np.random.default_rng(order_seed).permutation(len(gt.batch)))
    shuffled = gt.batch[order]
    _assert_same_bits(_keyed(masreplay.counterfactual_credit(shuffled, baseline=baseline)), expected)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32), order_seed=st.integers(0, 2**32), baseline=st.sampled_from(["mean", "loo"]))
def test_a_buffer_filled_in_two_passes_gets_the_credit_of_one_batch(seed, order_seed, baseline):
    gt = masreplay.sim.branches(30, branches=3, branch_points=2, seed=seed)
    expected = _keyed(masreplay.counterfactual_credit(gt.batch, baseline=baseline))
    factual = gt.batch.to_arrow()["counterfactual_of"].is_null().to_numpy(zero_copy_only=False)
    rng = np.random.default_rng(order_seed)
    buffer = GraphBuffer(len(gt.batch))
    buffer.add(gt.batch[rng.permutation(np.flatnonzero(factual)).tolist()])  # factual traces in any order
    branches = _family_stable(gt.batch, rng.permutation(np.flatnonzero(~factual)))
    buffer.add(gt.batch[branches])
    _assert_same_bits(_keyed(masreplay.counterfactual_credit(buffer, baseline=baseline)), expected)


# ---- same-prefix credit -------------------------------------------------------------------


def _spawn_groups(n_groups: int, size: int, p_spawn: float, effect: float, seed: int, logprob: bool):
    """Groups whose traces share a first decision, then spawn a worker or not (a planted
    effect on the reward), then answer."""
    rng = np.random.default_rng(seed)
    traces = []
    for g in range(n_groups):
        for k in range(size):
            spawn = rng.random() < p_spawn
            second = (
                {"id": "e1", "t": 1.0, "type": "spawn", "agent": "orch", "to": "worker"}
                if spawn
                else {"id": "e1", "t": 1.0, "type": "orchestrator_decision", "agent": "orch", "content_ref": "no-op"}
            )
            if logprob:
                second["logprob"] = float(np.log(p_spawn if spawn else 1 - p_spawn))
            events = [{"id": "e0", "t": 0.0, "type": "orchestrator_decision", "agent": "orch"}, second]
            if spawn:
                events.append({"id": "e2", "t": 2.0, "type": "message", "agent": "worker", "to": "orch"})
            events.append({"id": "e9", "t": 9.0, "type": "aggregate", "agent": "orch"})
            traces.append(
                {
                    "trace_id": f"g{g}-{k}",
                    "task_id": f"g{g}",
                    "events": events,
                    "edges": [],
                    "rewards": {"team": 1.0 + effect * spawn + rng.normal(0, 0.1)},
                    "costs": {"tokens": 0, "wall_clock_s": 0},
                }
            )
    return masreplay.load_traces(traces)


def _decision_credit(table: pa.Table, spawn: bool) -> np.ndarray:
    chosen = table.filter(pc.and_(pc.equal(table["event_id"], "e1"), pc.greater(table["n_branches"], 0)))
    kind = pc.equal(chosen["type"].cast(pa.string()), "spawn")
    return chosen.filter(kind if spawn else pc.invert(kind))["credit"].to_numpy()


def test_same_prefix_recovers_a_planted_spawn_effect():
    batch = _spawn_groups(60, 16, p_spawn=0.5, effect=0.3, seed=2, logprob=False)
    table = masreplay.same_prefix_credit(batch)
    spawned, skipped = _decision_credit(table, True), _decision_credit(table, False)
    # Within each group credit(spawn) - credit(no spawn) = Q(spawn) - Q(no spawn).
    assert spawned.mean() - skipped.mean() == pytest.approx(0.3, abs=0.03)
    # The shared first decision and the events after the fork are not credited.
    first = table.filter(pc.equal(table["event_id"], "e0"))
    assert pc.all(pc.equal(first["n_branches"], 0)).as_py()


def test_importance_weighting_removes_the_behaviour_policys_bias():
    batch = _spawn_groups(80, 20, p_spawn=0.8, effect=0.4, seed=3, logprob=True)
    weighted = _decision_credit(masreplay.same_prefix_credit(batch), True)
    plain = _decision_credit(masreplay.same_prefix_credit(batch, importance_weighting=False), True)
    # Against the mean over both alternatives the spawn earns effect / 2 = 0.2; the plain
    # on-policy baseline leans to spawning and leaves it (1 - 0.8) * 0.4 = 0.08.
    assert weighted.mean() == pytest.approx(0.2, abs=0.03)
    assert plain.mean() == pytest.approx(0.08, abs=0.03)


#: Alternatives of a fork: (name, probability of being taken, mean reward).
FORKS = ([("spawn", 0.6, 0.3), ("answer", 0.4, 0.0)], [("search", 0.5, 0.2), ("ask", 0.3, -0.1), ("stop", 0.2, 0.0)])


def _standardized_fork_errors(importance_weighting: bool, groups: int = 1000, seed: int = 40) -> np.ndarray:
    """|credit - planted effect| / stderr, one per (group, alternative) taken: groups of 6-16
    traces fork once among two or three alternatives with planted mean rewards (noise 0.2);
    the planted effect is mu(alternative) minus the (importance-weighted) mean of mu over the
    group's traces."""
    rng = np.random.default_rng(seed + importance_weighting)
    traces, planted, alternative_of = [], {}, {}
    for g in range(groups):
        fork = FORKS[g % 2]
        probabilities = np.array([p for _, p, _ in fork])
        taken = rng.choice(len(fork), size=int(rng.integers(6, 17)), p=probabilities)
        weights = 1 / probabilities[taken] if importance_weighting else np.ones(len(taken))
        means = np.array([mean for _, _, mean in fork])
        mix = float(weights @ means[taken] / weights.sum())
        for k, choice in enumerate(taken.tolist()):
            name, p, mean = fork[choice]
            decision = {"id": "e1", "t": 1.0, "type": "orchestrator_decision", "agent": "orch", "content_ref": name}
            traces.append(
                {
                    "trace_id": f"g{g}-{k}",
                    "task_id": f"g{g}",
                    "events": [
                        {"id": "e0", "t": 0.0, "type": "orchestrator_decision", "agent": "orch"},
                        {**decision, "logprob": float(np.log(p))},
                        {"id": "e9", "t": 9.0, "type": "aggregate", "agent": "orch"},
                    ],
                    "edges": [],
                    "rewards": {"team": mean + rng.normal(0, 0.2)},
                    "costs": {"tokens": 0, "wall_clock_s": 0},
                }
            )
            planted[(f"g{g}", name)] = mean - mix
            alternative_of[f"g{g}-{k}"] = (f"g{g}", name)
    table = masreplay.same_prefix_credit(
        masreplay.load_traces(traces), importance_weighting=importance_weighting, aligned=False
    ).to_pylist()
    # Every trace of an alternative carries the same interval: one error per alternative.
    errors = {
        alternative_of[row["trace_id"]]: abs(row["credit"] - planted[alternative_of[row["trace_id"]]]) / row["stderr"]
        for row in table
    }
    return np.array(list(errors.values()))


@pytest.mark.parametrize("importance_weighting", [False, True])
def test_same_prefix_intervals_cover_the_planted_effect_95_percent_of_the_time(importance_weighting):
    """Two-sided, as for branch credit: credit +- 1.96 stderr covers the planted effect 93-97%
    of the time, and 1.4x wider or narrower intervals leave that band."""
    errors = _standardized_fork_errors(importance_weighting)
    assert errors.size > 2000
    coverage = {scale: float(np.mean(errors <= 1.96 * scale)) for scale in (1.0, 1.4, 1 / 1.4)}
    assert 0.93 <= coverage[1.0] <= 0.97, coverage
    assert coverage[1.4] > 0.97, f"1.4x inflated errors would pass: {coverage}"
    assert coverage[1 / 1.4] < 0.93, f"1.4x shrunk errors would pass: {coverage}"


def test_same_prefix_signature_is_configurable_and_checked():
    batch = _spawn_groups(3, 4, p_spawn=0.5, effect=0.3, seed=4, logprob=False)
    # Matching on the agent alone, the fork at e1 (same author) disappears; e2 vs e9 remains.
    by_agent = masreplay.same_prefix_credit(batch, signature=["agent"])
    assert pc.sum(pc.and_(pc.equal(by_agent["event_id"], "e1"), pc.greater(by_agent["n_branches"], 0))).as_py() in (None, 0)
    with pytest.raises(InvalidArgumentError, match="colour"):
        masreplay.same_prefix_credit(batch, signature=["colour"])


# ---- difference rewards and COMA ----------------------------------------------------------


def test_difference_rewards_on_games():
    weights = np.array([0.5, -1.0, 2.0, 0.0])

    def additive(masks):
        return masks.astype(float) @ weights

    assert np.allclose(masreplay.difference_rewards(additive, n_players=4), weights)

    def pair(masks):  # players 0 and 1 only count together
        return (masks[:, 0] & masks[:, 1]).astype(float)

    assert np.allclose(masreplay.difference_rewards(pair, [0, 1, 2], n_players=3), [1.0, 1.0, 0.0])

    def with_defaults(masks):  # a replaced player still contributes a quarter of its weight
        return np.where(masks, weights, 0.25 * weights).sum(axis=1)

    replaced = masreplay.difference_rewards(additive, n_players=4, replaced=with_defaults)
    assert np.allclose(replaced, 0.75 * weights)
    native = masreplay.games.additive(weights.tolist())
    assert np.allclose(masreplay.difference_rewards(native), weights)  # n_players from the game
    wrapped = masreplay.games.function(pair, 3)
    assert np.allclose(masreplay.difference_rewards(wrapped, [0]), [1.0])
    soum = masreplay.games.soum(6, 10, max_order=3, seed=1)
    everyone = np.ones((1, 6), dtype=bool)
    without_two = everyone.copy()
    without_two[0, 2] = False
    expected = soum.values(everyone)[0] - soum.values(without_two)[0]
    assert masreplay.difference_rewards(soum, [2])[0] == pytest.approx(expected)
    with pytest.raises(InvalidArgumentError, match="n_players"):
        masreplay.difference_rewards(additive)
    with pytest.raises(InvalidArgumentError, match="players"):
        masreplay.difference_rewards(additive, [4], n_players=4)


def test_coma_credit_by_hand_and_its_checks():
    q = np.array([[1.0, 2.0, np.nan], [0.0, 4.0, 2.0]])
    pi = np.array([[0.5, 0.5, 0.0], [0.25, 0.25, 0.5]])
    assert np.allclose(masreplay.coma_credit(q, pi, [1, 0]), [2.0 - 1.5, 0.0 - 2.0])
    with pytest.raises(InvalidArgumentError, match="sum to 1"):
        masreplay.coma_credit(q, pi * 2, [0, 0])
    with pytest.raises(InvalidArgumentError, match="no Q value"):
        masreplay.coma_credit(q, pi, [2, 0])
    with pytest.raises(InvalidArgumentError, match="chosen"):
        masreplay.coma_credit(q, pi, [3, 0])


def test_ground_truth_reports_agent_values_that_sum_to_the_expected_reward():
    gt = masreplay.sim.branches(20, branches=2, branch_points=1, noise=0.0, seed=8)
    values = gt.agent_values.group_by("trace_id").aggregate([("value", "sum")])
    totals = dict(zip(values["trace_id"].to_pylist(), values["value_sum"].to_pylist(), strict=True))
    for record in gt.batch:
        if "counterfactual_of" not in record:
            assert record["rewards"]["team"] == pytest.approx(totals[record["trace_id"]])
    with pytest.raises(InvalidArgumentError, match="noise"):
        masreplay.sim.branches(2, noise=-1.0)


# ---- branches in a GraphBuffer ---------------------------------------------------------


def _branch_ids(batch: masreplay.TraceBatch) -> set[str]:
    return {r["trace_id"] for r in batch if "counterfactual_of" in r}


def test_buffer_indexes_branches_by_factual_trace_and_event():
    gt = masreplay.sim.branches(4, branches=3, branch_points=2, seed=31)
    buffer = GraphBuffer(100)
    buffer.add(gt.batch)
    effect = gt.effects.to_pylist()[0]
    all_branches = buffer.branches(effect["trace_id"])
    assert len(all_branches) == 6
    at_event = buffer.branches(effect["trace_id"], effect["event_id"])
    assert len(at_event) == 3
    assert {r["counterfactual_of"]["event_id"] for r in at_event} == {effect["event_id"]}
    assert len(buffer.branches(at_event.trace_ids[0])) == 0  # a branch has no branches of its own
    with pytest.raises(TraceNotFoundError, match="no trace 'absent' in the buffer"):
        buffer.branches("absent")


def test_a_branch_without_its_factual_trace_is_not_added():
    gt = masreplay.sim.branches(2, branches=2, branch_points=1, seed=32)
    records = list(gt.batch)
    orphan = masreplay.load_traces(records[1:3])  # the first trace's branches, without it
    buffer = GraphBuffer(100)
    with pytest.raises(TraceValidationError) as raised:
        buffer.add(orphan)
    assert raised.value.path == "/counterfactual_of/trace_id"
    assert len(buffer) == 0
    report = buffer.add(gt.batch[[0, 3, 4, 5, 1, 2]], on_error="skip")  # factual first: all added
    assert report.added == 6 and not report.rejected
    later = GraphBuffer(100)
    later.add(gt.batch[[0]])
    assert later.add(orphan) == 2  # the factual is stored already


def test_evicting_a_factual_trace_evicts_its_branches_and_nothing_else(tmp_path):
    gt = masreplay.sim.branches(6, branches=3, branch_points=1, seed=33)  # 6 x (1 + 3) traces
    interleaved = [*gt.batch[[0, 4]], *gt.batch[[1, 2, 3, 5, 6, 7]], *gt.batch[list(range(8, 24))]]
    buffer = GraphBuffer(20, seed=4)
    buffer.add(masreplay.load_traces(interleaved))  # 24 traces: the first factual goes, with its 3 branches
    stored = buffer.to_batch()
    assert len(buffer) == len(stored) == 20
    first = gt.batch.trace_ids[0]
    assert first not in buffer and not any(t.startswith(first + "/") for t in stored.trace_ids)
    assert gt.batch.trace_ids[4] in buffer  # the second factual stayed, though added before the evicted branches
    factual_ids = set(stored.trace_ids)
    assert all(r["counterfactual_of"]["trace_id"] in factual_ids for r in stored if "counterfactual_of" in r)
    assert buffer.num_events == int(stored.event_offsets[-1])
    for _ in range(20):
        assert set(buffer.sample(16).trace_ids) <= factual_ids
    again = GraphBuffer.load(_saved(buffer, tmp_path))
    assert again.to_arrow().to_pylist() == buffer.to_arrow().to_pylist()
    assert again.sample(32).trace_ids == buffer.sample(32).trace_ids


def _saved(buffer: GraphBuffer, tmp_path) -> str:
    path = tmp_path / "buffer.parquet"
    buffer.save(path)
    return path


def test_sampling_can_bring_the_branches_of_the_drawn_traces():
    gt = masreplay.sim.branches(5, branches=2, branch_points=2, seed=34)
    buffer = GraphBuffer(100, seed=2)
    buffer.add(gt.batch)
    sample = buffer.sample(6, seed=5, with_branches=True)
    drawn = buffer.sample(6, seed=5)
    assert sample.trace_ids[:6] == drawn.trace_ids
    # Each stored branch once, after the draws, and none that was drawn itself.
    expected = list(dict.fromkeys(b for t in drawn.trace_ids for b in buffer.branches(t).trace_ids if b not in drawn.trace_ids))
    assert sample.trace_ids[6:] == expected
    assert np.isnan(sample.probabilities[6:]).all() and not np.isnan(sample.probabilities[:6]).any()
    assert _branch_ids(masreplay.load_traces(list(sample))) >= set(expected)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32), draw_seed=st.integers(0, 2**32), order_seed=st.integers(0, 2**32))
def test_a_sample_drawn_with_replacement_is_credited_row_by_row_in_any_order(seed, draw_seed, order_seed):
    """A sample with branches holds factual traces drawn more than once and branches drawn as
    well as brought: every copy of a factual trace gets the credit of all the branch rows of its
    id (each row one rollout), whatever the order of the rows."""
    gt = masreplay.sim.branches(4, branches=3, branch_points=1, seed=seed)
    buffer = GraphBuffer(100, seed=1)
    buffer.add(gt.batch)
    sample = buffer.sample(12, seed=draw_seed, with_branches=True)
    brought = [t for t, p in zip(sample.trace_ids, sample.probabilities, strict=True) if np.isnan(p)]
    assert len(set(brought)) == len(brought) and not set(brought) & set(sample.trace_ids[: len(sample) - len(brought)])
    records = list(sample)
    rewards: dict[str, list[float]] = {}
    for record in records:
        if record.get("counterfactual_of"):
            rewards.setdefault(record["counterfactual_of"]["trace_id"], []).append(record["rewards"]["team"])
    factual = [r for r in records if not r.get("counterfactual_of") and r["trace_id"] in rewards]
    for order in (np.arange(len(sample)), np.random.default_rng(order_seed).permutation(len(sample))):
        table = masreplay.counterfactual_credit(sample[order.tolist()], aligned=False).to_pylist()
        assert sorted(row["trace_id"] for row in table) == sorted(r["trace_id"] for r in factual)
        for row in table:
            branch_rewards = rewards[row["trace_id"]]
            factual_reward = next(r["rewards"]["team"] for r in factual if r["trace_id"] == row["trace_id"])
            assert row["n_branches"] == len(branch_rewards)
            assert row["credit"] == pytest.approx(factual_reward - np.mean(branch_rewards), abs=1e-12)
        stderr = {row["trace_id"]: row["stderr"] for row in table}
        assert all(row["stderr"] == stderr[row["trace_id"]] or np.isnan(row["stderr"]) for row in table)


def test_credit_feeds_the_advantage_estimators():
    gt = masreplay.sim.branches(8, branches=4, branch_points=2, group_size=4, seed=35)
    credit = masreplay.counterfactual_credit(gt.batch)["credit"].to_numpy()
    result = masreplay.advantages(gt.batch, credit=credit, unit="events")
    credited = ~np.isnan(credit)
    assert (result.per_event[~credited] == 0).all()
    assert np.abs(result.per_event[credited]).max() > 0.1


class BranchesAgainstModel(RuleBasedStateMachine):
    """Random adds of factual traces and their branches (together or later) against a Python
    model: FIFO eviction of whole traces, where evicting a factual trace takes its branches."""

    def __init__(self):
        super().__init__()
        self.capacity = 10
        self.buffer = GraphBuffer(self.capacity, seed=0)
        self.model: list[tuple[str, str | None]] = []  # (trace_id, factual trace_id), oldest first
        self.pending: dict[int, masreplay.TraceBatch] = {}  # branches held back, by family seed

    def _family(self, seed: int, branches: int, points: int) -> tuple[masreplay.TraceBatch, list]:
        batch = masreplay.sim.branches(1, branches=branches, branch_points=points, seed=seed).batch
        rows = [(r["trace_id"], r.get("counterfactual_of", {}).get("trace_id")) for r in batch]
        return batch, rows

    def _add(self, batch: masreplay.TraceBatch, rows: list) -> None:
        stored = {trace_id for trace_id, _ in self.model}
        if any(trace_id in stored for trace_id, _ in rows):
            with pytest.raises(TraceValidationError, match="already stored"):
                self.buffer.add(batch)
            return
        known = stored | {trace_id for trace_id, _ in rows}
        if any(factual is not None and factual not in known for _, factual in rows):
            with pytest.raises(TraceValidationError) as raised:
                self.buffer.add(batch)
            assert raised.value.path == "/counterfactual_of/trace_id"
            return
        assert self.buffer.add(batch) == len(rows)
        self.model.extend(rows)
        while len(self.model) > self.capacity:
            evicted, _ = self.model.pop(0)
            self.model = [row for row in self.model if row[1] != evicted]

    @rule(seed=st.integers(0, 25), branches=st.integers(1, 3), points=st.integers(1, 2))
    def add_family(self, seed, branches, points):
        self._add(*self._family(seed, branches, points))

    @rule(seed=st.integers(0, 25), branches=st.integers(1, 3))
    def add_factual_now_branches_later(self, seed, branches):
        batch, rows = self._family(seed, branches, 1)
        self._add(batch[[0]], rows[:1])
        self.pending[seed] = batch[list(range(1, len(batch)))]

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def add_pending_branches(self, data):
        seed = data.draw(st.sampled_from(sorted(self.pending)))
        batch = self.pending.pop(seed)
        rows = [(r["trace_id"], r["counterfactual_of"]["trace_id"]) for r in batch]
        self._add(batch, rows)

    @precondition(lambda self: self.model)
    @rule(size=st.integers(1, 12), seed=st.integers(0, 5))
    def sample_with_branches(self, size, seed):
        batch = self.buffer.sample(size, seed=seed, with_branches=True)
        assert set(batch.trace_ids) <= {trace_id for trace_id, _ in self.model}

    @invariant()
    def matches_the_model(self):
        assert len(self.buffer) == len(self.model)
        assert self.buffer.to_batch().trace_ids == [trace_id for trace_id, _ in self.model]
        for trace_id, factual in self.model:
            if factual is None:
                expected = [b for b, f in self.model if f == trace_id]
                assert self.buffer.branches(trace_id).trace_ids == expected


TestBranchesAgainstModel = BranchesAgainstModel.TestCase


def test_a_branch_whose_factual_trace_is_rejected_is_rejected_too():
    gt = masreplay.sim.branches(1, branches=1, branch_points=1, agents=(3, 4), seed=36)
    sizes = np.diff(gt.batch.event_offsets)
    assert gt.effects["kind"][0].as_py() == "no_spawn" and sizes[1] < sizes[0]
    buffer = GraphBuffer(int(sizes[1]), unit="events")  # room for the branch, not the factual
    report = buffer.add(gt.batch, on_error="skip")
    assert report.added == 0 and len(buffer) == 0
    assert [error.path for _, _, error in report.rejected] == ["/events", "/counterfactual_of/trace_id"]


def test_difference_rewards_of_more_players_than_a_trace_holds_is_refused():
    # Found by fuzzing: n_players=2**62 asked numpy for 2**62-byte masks (a MemoryError).
    with pytest.raises(InvalidArgumentError, match="n_players"):
        masreplay.difference_rewards(lambda masks: masks.sum(axis=1).astype(float), [0], n_players=2**62)


@pytest.mark.parametrize(
    ("q", "pi", "chosen"),
    [([[1.0, np.inf]], [[0.0, 1.0]], [1]), ([[1e308, -1e308]], [[0.5, 0.5]], [0]), ([[np.inf, 1.0]], [[0.0, 1.0]], [0])],
)
def test_coma_credit_of_a_q_value_beyond_the_bound_is_refused(q, pi, chosen):
    # Found by fuzzing: these gave an infinite or NaN advantage.
    with pytest.raises(InvalidArgumentError, match="q_values must be finite"):
        masreplay.coma_credit(np.array(q), np.array(pi), chosen)
