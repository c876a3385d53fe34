"""masreplay.advantages: hand-computed cases for every estimator and stratum, the trainers'
edge cases (compat modes), graph returns, loss weights, and hypothesis properties."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import masreplay
from masreplay import InvalidArgumentError
from masreplay.advantages import STRATA

EPS = 1e-6
F32 = np.float32


def _trace(trace_id, events, edges=(), reward=1.0, group="g", rewards=None):
    for i, event in enumerate(events):
        event.setdefault("id", f"e{i}")
        event.setdefault("t", float(i))
        event.setdefault("type", "message")
    return {
        "trace_id": trace_id,
        "task_id": "task",
        "group_id": group,
        "events": events,
        "edges": [{"src": events[a]["id"], "dst": events[b]["id"], "type": "causal"} for a, b in edges],
        "rewards": rewards if rewards is not None else {"team": reward},
        "costs": {"tokens": 0, "wall_clock_s": 0},
    }


def _linear(trace_id, n, reward, group="g", agent="solo"):
    events = [{"agent": agent, "type": "orchestrator_decision"} for _ in range(n)]
    return _trace(trace_id, events, [(i, i + 1) for i in range(n - 1)], reward, group)


def _batch(traces):
    return masreplay.load_traces(traces)


def _grpo(values, eps=EPS):
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return np.zeros_like(values)
    return (values - values.mean()) / (values.std(ddof=1) + eps)


# ---- estimators on plain rows ----------------------------------------------------------------


def test_grpo_by_hand():
    values = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 3.0]
    groups = [7, 7, 7, 7, 2, 2, 9]
    out = masreplay.group_normalize(values, groups, dtype="float64")
    half = 0.5 / (math.sqrt(1 / 3) + EPS)
    np.testing.assert_allclose(out, [half, -half, -half, half, 0.0, 0.0, 0.0], rtol=1e-12)
    assert out.dtype == np.float64
    assert masreplay.group_normalize(values, groups).dtype == np.float32


def test_dr_grpo_is_centering_only():
    out = masreplay.group_normalize([1.0, 0.0, 0.0, 4.0], [0, 0, 1, 1], std=False, dtype="float64")
    np.testing.assert_allclose(out, [0.5, -0.5, -2.0, 2.0])


def test_grpo_batch_std_divides_by_the_batch_std():
    values = np.array([1.0, 0.0, 0.0, 4.0])
    out = masreplay.group_normalize(values, [0, 0, 1, 1], std="batch", dtype="float64")
    np.testing.assert_allclose(out, np.array([0.5, -0.5, -2.0, 2.0]) / (values.std(ddof=1) + EPS))


def test_rloo_by_hand():
    out = masreplay.group_normalize([1.0, 0.0, 0.0, 1.0, 5.0], [0, 0, 0, 0, 1], estimator="rloo", dtype="float64")
    np.testing.assert_allclose(out, [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0])


def test_opo_uses_the_length_weighted_baseline():
    out = masreplay.group_normalize([1.0, 0.0], [0, 0], lengths=[3.0, 1.0], estimator="opo", dtype="float64")
    np.testing.assert_allclose(out, [0.25, -0.75])


def test_reinforce_pp_baseline_centers_then_whitens_by_tokens():
    values, lengths = np.array([1.0, 0.0, 2.0, 0.0]), np.array([1.0, 3.0, 2.0, 2.0])
    out = masreplay.group_normalize(values, [0, 0, 1, 1], lengths=lengths, estimator="reinforce_pp_baseline", dtype="float64")
    centered = np.array([0.5, -0.5, 1.0, -1.0])
    tokens = np.repeat(centered, lengths.astype(int))  # verl whitens every valid token
    mean = tokens.sum() / (len(tokens) + 1e-8)
    var = ((tokens - mean) ** 2).sum() / (len(tokens) + 1e-8) * len(tokens) / (len(tokens) - 1)
    np.testing.assert_allclose(out, (centered - mean) / np.sqrt(var + 1e-8), rtol=1e-12)


def test_stratified_rows_are_normalised_per_group_and_stratum():
    values = [1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 4.0]
    groups = [0, 0, 0, 0, 0, 0, 0]
    agents = [0, 0, 0, 1, 2, 2, 1]  # agent 0: {1,1,0}; agent 1: {1,4}; agent 2: {0,0}
    out = masreplay.group_normalize(values, groups, strata=agents, dtype="float64")
    expected = np.zeros(7)
    expected[[0, 1, 2]] = _grpo([1.0, 1.0, 0.0])
    expected[[3, 6]] = _grpo([1.0, 4.0])
    np.testing.assert_allclose(out, expected, rtol=1e-12)


def test_scattered_groups_equal_contiguous_groups():
    rng = np.random.default_rng(0)
    values = rng.normal(size=400)
    groups = np.repeat(np.arange(50), 8)
    agents = rng.integers(0, 3, size=400)
    contiguous = masreplay.group_normalize(values, groups, strata=agents, dtype="float64")
    order = rng.permutation(400)
    scattered = masreplay.group_normalize(values[order], groups[order], strata=agents[order], dtype="float64")
    np.testing.assert_allclose(scattered, contiguous[order], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize(("group_size", "n_strata"), [(8, 3), (40, 30), (64, 64), (100, 20)])
def test_every_layout_and_group_size_agrees_with_the_definition(group_size, n_strata):
    rng = np.random.default_rng(group_size)
    n = group_size * 12
    values = rng.normal(size=n).round(2)
    groups = np.repeat(np.arange(12) * 3 - 5, group_size)  # sorted labels, not 0-based
    strata = rng.integers(0, n_strata, size=n) * 7
    expected = np.zeros(n)
    for key in set(zip(groups.tolist(), strata.tolist(), strict=True)):
        cell = (groups == key[0]) & (strata == key[1])
        expected[cell] = _grpo(values[cell])
    for order in (np.arange(n), rng.permutation(n), np.arange(n)[::-1]):
        out = masreplay.group_normalize(values[order], groups[order], strata=strata[order], dtype="float64")
        np.testing.assert_allclose(out, expected[order], rtol=1e-10, atol=1e-12)
        rloo = masreplay.group_normalize(values[order], groups[order], estimator="rloo", dtype="float64")
        by_group = np.zeros(n)
        for g in np.unique(groups):
            cell = groups == g
            by_group[cell] = values[cell] - (values[cell].sum() - values[cell]) / (cell.sum() - 1)
        np.testing.assert_allclose(rloo, by_group[order], rtol=1e-10, atol=1e-12)


def test_labels_of_any_kind_and_wide_integer_keys():
    values = [1.0, 0.0, 2.0, 2.0]
    by_text = masreplay.group_normalize(values, ["a", "a", "b", "b"], dtype="float64")
    by_wide = masreplay.group_normalize(values, [10**15, 10**15, -(10**15), -(10**15)], dtype="float64")
    np.testing.assert_array_equal(by_text, by_wide)
    np.testing.assert_allclose(by_text, [_grpo([1, 0])[0], _grpo([1, 0])[1], 0, 0])
    beyond_64_bits = masreplay.group_normalize(values, [2**70, 2**70, 2**70 + 1, 2**70 + 1], dtype="float64")
    np.testing.assert_array_equal(by_text, beyond_64_bits)


def test_unhashable_group_labels_are_an_invalid_argument():
    with pytest.raises(masreplay.InvalidArgumentError, match="groups: every label must be hashable"):
        masreplay.group_normalize([1.0, 0.0], [{"task": 1}, {"task": 1}])


def test_nan_rewards_are_left_out_and_get_zero():
    out = masreplay.group_normalize([1.0, np.nan, 0.0], [0, 0, 0], dtype="float64")
    np.testing.assert_allclose(out, [_grpo([1, 0])[0], 0.0, _grpo([1, 0])[1]])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"estimator": "ppo"}, "estimator"),
        ({"std": "sometimes"}, "std"),
        ({"compat": "deepspeed"}, "compat"),
        ({"compat": "trl", "estimator": "rloo"}, "Trl"),
        ({"compat": "openrlhf", "estimator": "opo"}, "OpenRlhf"),
        ({"compat": "verl", "std": "batch"}, "batch"),
        ({"eps": -1.0}, "eps"),
        ({"dtype": "int8"}, "dtype"),
        ({"strata": [0]}, "strata"),
        ({"lengths": [1.0, -1.0]}, "lengths"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, match):
    with pytest.raises(InvalidArgumentError, match=match):
        masreplay.group_normalize([1.0, 0.0], [0, 0], **kwargs)


def test_mismatched_lengths_and_infinite_values_are_refused():
    with pytest.raises(InvalidArgumentError, match="groups"):
        masreplay.group_normalize([1.0, 0.0], [0])
    with pytest.raises(InvalidArgumentError, match="finite"):
        masreplay.group_normalize([np.inf, 0.0], [0, 0])


# ---- rewards out of range: an error on every path, never NaN, an infinity or a silent 0 -------

BOUND = 2.0**49  # rewards, lengths and value estimates are of smaller magnitude (README)
JUST_BELOW = np.nextafter(BOUND, 0.0)


def _layout(layout: str, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`values` (a multiple of 4 rows) laid out as each path of group_normalize takes it:
    groups of 4 sorted (the small paths), groups of 40 sorted (the general walk), narrow int
    keys shuffled (the scattered table), string labels (renumbered first); and strata that
    split each group in two halves (no cell of one row, where OpenRLHF gives NaN)."""
    n = len(values)
    size = 40 if layout == "long" and n % 40 == 0 else 4
    groups, strata = np.arange(n) // size, np.arange(n) % size // (size // 2)
    if layout == "scattered":
        order = np.random.default_rng(0).permutation(n)
        return values[order], groups[order], strata[order]
    if layout == "strings":
        return values, np.array([f"g{g}" for g in groups], dtype=object), strata
    return values, groups, strata


def _reproduced(estimator: str, compat: str | None) -> bool:
    """Whether `compat`'s trainer has `estimator` (TRL has GRPO only, OpenRLHF no OPO)."""
    try:
        masreplay.group_normalize([1.0, 0.0], [0, 0], estimator=estimator, compat=compat, lengths=[1.0, 1.0])
    except InvalidArgumentError:
        return False
    return True


PATHS = [
    (layout, estimator, compat, strata)
    for layout in ("sorted", "long", "scattered", "strings")
    for estimator in ("grpo", "rloo", "opo", "reinforce_pp_baseline")
    for compat in (None, "verl", "trl", "openrlhf")
    for strata in (False, True)
    if _reproduced(estimator, compat)
]


def _normalize(laid_out, estimator, compat, strata, **kwargs):
    values, groups, halves = laid_out
    return masreplay.group_normalize(
        values,
        groups,
        estimator=estimator,
        compat=compat,
        strata=halves if strata else None,
        lengths=np.full(len(values), 3.0) if estimator in ("opo", "reinforce_pp_baseline") else None,
        **kwargs,
    )


@pytest.mark.parametrize(("layout", "estimator", "compat", "strata"), PATHS)
def test_rewards_at_the_bound_are_refused_on_every_path_and_those_just_below_are_not(layout, estimator, compat, strata):
    base = np.tile([0.5, -1.0, 2.0, 0.25], 40)
    below = base.copy()
    below[[9, 10]] = [JUST_BELOW, -JUST_BELOW]
    for dtype in ("float32", "float64"):
        out = _normalize(_layout(layout, below), estimator, compat, strata, dtype=dtype)
        assert np.isfinite(out).all(), (dtype, out)
    for bad in (BOUND, -BOUND, -1e308, np.inf):
        over = base.copy()
        over[9] = bad
        laid_out = _layout(layout, over)
        row = int(np.flatnonzero(laid_out[0] == bad)[0])
        with pytest.raises(InvalidArgumentError, match=rf"values\[{row}\] is .*finite, of magnitude below 2\^49"):
            _normalize(laid_out, estimator, compat, strata)


def test_squares_that_would_overflow_were_a_silent_zero_and_are_now_refused():
    # Before the limit: NaN for the first, 0 and -0 for the second (the std overflowed).
    for values in ([1e308, 1e308, -1e308], [1e308, -1e308], [1e200, -1e200, 0.0, 1.0]):
        with pytest.raises(InvalidArgumentError, match=r"values\[0\] is 1e(308|200)"):
            masreplay.group_normalize(values, [0] * len(values))


@pytest.mark.parametrize(("layout", "estimator", "compat", "strata"), [p for p in PATHS if p[2] is None])
def test_a_spread_whose_squares_underflow_with_eps_0_gives_0_not_an_infinity(layout, estimator, compat, strata):
    tiny = np.tile([0.0, 8e-220, 0.0, 8e-220], 40)
    for std in (True, "batch") if estimator == "grpo" and not strata else (True,):
        out = _normalize(_layout(layout, tiny), estimator, compat, strata, eps=0.0, std=std, dtype="float64")
        assert np.isfinite(out).all() and np.abs(out).max() < 1e-200, (std, out)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=2, max_size=24),
    st.sampled_from(["sorted", "scattered", "strings"]),
)
def test_any_finite_rewards_give_the_two_pass_advantages_or_an_error(raw, layout):
    values = np.asarray(raw * 2)
    values, groups, _ = _layout(layout, np.concatenate([values, np.zeros(-len(values) % 4)]))
    if np.abs(values).max() >= BOUND:
        with pytest.raises(InvalidArgumentError, match=r"magnitude below 2\^49"):
            masreplay.group_normalize(values, groups, eps=0.0, dtype="float64")
        return
    out = masreplay.group_normalize(values, groups, eps=0.0, dtype="float64")
    assert np.isfinite(out).all(), (values, out)  # a spread whose squares underflow gives 0
    codes = np.unique(groups, return_inverse=True)[1]
    expected, tolerance = _two_pass_grpo(values, codes)
    # Where a group's spread squares to a normal number, the digits are there to compare.
    spreads = np.array([np.ptp(values[codes == code]) for code in codes])
    resolved = spreads > 1e-150
    assert np.all(np.abs(out - expected)[resolved] <= tolerance[resolved]), (values, out, expected)


def test_a_batch_reward_past_the_bound_names_its_trace_and_event():
    traces = [_linear(f"t{i}", 2, reward) for i, reward in enumerate([1.0, 1e300, 0.0])]
    for kwargs in ({}, {"normalize_by": "agent"}, {"normalize_by": "agent", "unit": "events"}):
        with pytest.raises(InvalidArgumentError, match=r'trace "t1": the reward is 1e300: rewards must be finite'):
            masreplay.advantages(_batch(traces), **kwargs)
    batch = _batch([_linear(f"t{i}", 2, 1.0) for i in range(3)])
    with pytest.raises(InvalidArgumentError, match=r'trace "t2", event "e0": the reward is -inf'):
        masreplay.advantages(batch, credit=[0.0, 1.0, 2.0, 3.0, -np.inf, 0.0])


def test_lengths_and_returns_past_the_bound_are_refused():
    with pytest.raises(InvalidArgumentError, match=r"lengths\[1\] is .*below 2\^49"):
        masreplay.group_normalize([1.0, 0.0], [0, 0], estimator="opo", lengths=[1.0, 1e300])
    batch = _diamond([0.0, 0.0, 0.0, 1.0])
    for bad in (1e300, np.nan):
        with pytest.raises(InvalidArgumentError, match=r"rewards\[2\] is .*magnitude below 2\^49"):
            masreplay.graph_returns(batch, [0.0, 1.0, bad, 1.0], gamma=0.5)


# ---- the trainers' edge cases (anchors/advantages.md) ----------------------------------------


def _f32(x):
    return np.asarray(x, dtype=np.float32)


def test_verl_grpo_edge_cases():
    values = [0.3, 0.7, 0.1, 2.0, 1.0, 1.0]
    groups = [0, 0, 0, 1, 2, 2]
    out = masreplay.group_normalize(values, groups, compat="verl")
    assert out.dtype == np.float32
    scores = _f32([0.3, 0.7, 0.1])
    mean = scores.sum(dtype=F32) / F32(3)
    std = F32(np.sqrt(((scores.astype(np.float64) - np.float64(mean)) ** 2).sum() / 2))
    np.testing.assert_array_equal(out[:3], (scores - mean) / (std + F32(1e-6)))
    # A group of one: mean 0, std 1, so r / (1 + eps), not 0.
    assert out[3] == F32(2.0) / (F32(1.0) + F32(1e-6))
    # All-equal group: 0.
    np.testing.assert_array_equal(out[4:], [0.0, 0.0])
    dr = masreplay.group_normalize(values, groups, compat="verl", std=False)
    assert dr[3] == F32(2.0)


def test_verl_rloo_and_opo_edge_cases():
    rloo = masreplay.group_normalize([1.0, 0.0, 0.5, 2.0], [0, 0, 0, 1], estimator="rloo", compat="verl")
    n = F32(3)
    mean = _f32([1.0, 0.0, 0.5]).sum(dtype=F32) / n
    np.testing.assert_array_equal(rloo[:3], _f32([1.0, 0.0, 0.5]) * n / (n - 1) - mean * n / (n - 1))
    assert rloo[3] == F32(2.0)  # a group of one keeps its score (verl's loop version)
    opo = masreplay.group_normalize([1.0, 0.0, 2.0], [0, 0, 1], lengths=[3.0, 1.0, 5.0], estimator="opo", compat="verl")
    np.testing.assert_array_equal(opo, _f32([0.25, -0.75, 2.0]))


def _torch_sqrt(x):
    """TRL's fp32 torch.sqrt as compat="trl" rounds it on this CPU (MKL's kernel; held
    against captured MKL outputs in test_torch_sqrt.py and against torch.sqrt in
    test_integrations.py)."""
    return masreplay._core.torch_sqrt(np.atleast_1d(np.float32(x)))[0][0]


def test_trl_edge_cases():
    values = [0.3, 0.7, 0.1, 2.0, 1.0, 1.0, np.nan, 0.5]
    groups = [0, 0, 0, 1, 2, 2, 3, 3]
    out = masreplay.group_normalize(values, groups, compat="trl")
    r = _f32([0.3, 0.7, 0.1])
    mean = r.sum(dtype=F32) / F32(3)
    var = ((r - mean) ** 2).sum(dtype=F32) / F32(3)
    var *= F32(3) / F32(2)
    np.testing.assert_array_equal(out[:3], (r - mean) / (_torch_sqrt(var) + F32(1e-4)))
    # A group of one has std 0 and advantage 0; an all-equal group 0; an unscorable row 0
    # and left out of its group (whose one scorable row then gets 0).
    np.testing.assert_array_equal(out[3:], [0.0, 0.0, 0.0, 0.0, 0.0])
    none = masreplay.group_normalize(values[:3], groups[:3], compat="trl", std=False)
    np.testing.assert_array_equal(none, r - mean)


def test_trl_batch_scale():
    values = _f32([0.3, 0.7, 0.1, 0.9])
    out = masreplay.group_normalize(values, [0, 0, 1, 1], compat="trl", std="batch")
    mean = values.sum(dtype=F32) / F32(4)
    var = ((values - mean) ** 2).sum(dtype=F32) / F32(4) * (F32(4) / F32(3))
    group_means = np.repeat([values[:2].sum(dtype=F32) / F32(2), values[2:].sum(dtype=F32) / F32(2)], 2)
    np.testing.assert_array_equal(out, (values - group_means) / (_torch_sqrt(var) + F32(1e-4)))


def test_openrlhf_edge_cases():
    out = masreplay.group_normalize([1.0, 0.0, 0.5, 2.0], [0, 0, 0, 1], compat="openrlhf")
    r = _f32([1.0, 0.0, 0.5])
    mean = r.sum(dtype=F32) / F32(3)
    std = F32(np.std([1.0, 0.0, 0.5], ddof=1))
    np.testing.assert_array_equal(out[:3], (r - mean) / (std + F32(1e-9)))
    assert np.isnan(out[3])  # torch.std of one sample is NaN, as in OpenRLHF
    rloo = masreplay.group_normalize([1.0, 0.0, 0.5], [0, 0, 0], estimator="rloo", compat="openrlhf")
    np.testing.assert_array_equal(rloo, r - (r.sum(dtype=F32) - r) / F32(2))
    baseline = masreplay.group_normalize([1.0, 0.0], [0, 0], estimator="reinforce_pp_baseline", compat="openrlhf")
    np.testing.assert_array_equal(baseline, _f32([0.5, -0.5]))


@pytest.mark.parametrize(
    ("compat", "estimator", "std"),
    [
        ("verl", "grpo", True),
        ("verl", "rloo", True),
        ("trl", "grpo", True),
        ("trl", "grpo", "batch"),
        ("openrlhf", "grpo", True),
        ("openrlhf", "rloo", True),
        ("verl", "grpo", False),
    ],
)
def test_trainer_modes_give_the_same_bits_with_groups_interleaved(compat, estimator, std):
    """Interleaved groups (gathered by a counting sort, then written from a table per group)
    and the same rows with each group's rows brought together in the same order (read group
    by group) give the same bits: groups of 1-70 rows take every shape of torch's summation
    order, values of mixed scales make that order show, and some rewards are NaN."""
    rng = np.random.default_rng(18)
    sizes = rng.integers(1, 71, size=400)
    groups = rng.permutation(np.repeat(np.arange(len(sizes)) * 3 - 50, sizes))
    values = rng.normal(size=len(groups)) * rng.choice([1e-3, 1.0, 1e3], size=len(groups))
    values[rng.choice(len(values), size=20, replace=False)] = np.nan
    together = np.argsort(groups, kind="stable")
    interleaved = masreplay.group_normalize(values, groups, compat=compat, estimator=estimator, std=std)
    contiguous = masreplay.group_normalize(values[together], groups[together], compat=compat, estimator=estimator, std=std)
    np.testing.assert_array_equal(interleaved[together], contiguous)


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
@pytest.mark.parametrize("inexact", [False, True], ids=["fp32-rewards", "one-f64-reward"])
def test_openrlhf_interleaved_groups_give_the_same_bits_whether_rewards_fit_fp32(estimator, inexact):
    """OpenRLHF's std reads the f64 rewards: interleaved groups gather rewards exact in fp32
    (an fp32 tensor's) in 4 bytes, others in 8. Either way the bits are those of the same rows
    read group by group, also where a single reward of many needs f64."""
    rng = np.random.default_rng(19)
    sizes = rng.integers(1, 71, size=400)
    groups = rng.permutation(np.repeat(np.arange(len(sizes)) * 3 - 50, sizes))
    values = rng.normal(size=len(groups)) * rng.choice([1e-3, 1.0, 1e3], size=len(groups))
    values = values.astype(np.float32).astype(np.float64)
    values[rng.choice(len(values), size=20, replace=False)] = np.nan
    if inexact:
        values[len(values) // 2] = 0.1
    together = np.argsort(groups, kind="stable")
    interleaved = masreplay.group_normalize(values, groups, compat="openrlhf", estimator=estimator)
    contiguous = masreplay.group_normalize(values[together], groups[together], compat="openrlhf", estimator=estimator)
    np.testing.assert_array_equal(interleaved[together], contiguous)


def test_native_group_of_one_is_zero_for_every_estimator():
    for estimator in ("grpo", "rloo", "reinforce_pp_baseline", "opo"):
        out = masreplay.group_normalize([3.0, 1.0, 2.0], [0, 1, 1], estimator=estimator, dtype="float64")
        # REINFORCE++ whitens the centred rows [0, -0.5, 0.5] over the batch: their mean is 0,
        # so the group of one stays exactly 0 there too.
        assert out[0] == 0.0, estimator
        assert out[1] == -out[2] and out[2] > 0, estimator


# ---- batches: channels, groups, strata ---------------------------------------------------------


def _two_groups():
    return _batch(
        [
            _linear("a", 2, 1.0, "g1"),
            _linear("b", 3, 0.0, "g1"),
            _linear("c", 1, 0.5, "g1"),
            _linear("d", 2, 2.0, "g2"),
            _linear("e", 2, 4.0, "g2"),
        ]
    )


def test_batch_grpo_by_hand():
    batch = _two_groups()
    adv = masreplay.advantages(batch, dtype="float64")
    expected = np.concatenate([_grpo([1.0, 0.0, 0.5]), _grpo([2.0, 4.0])])
    np.testing.assert_allclose(adv.per_trace, expected, rtol=1e-12)
    np.testing.assert_array_equal(adv.per_event, np.repeat(expected, [2, 3, 1, 2, 2]))
    np.testing.assert_array_equal(adv.trace_index, np.repeat(np.arange(5), [2, 3, 1, 2, 2]))
    np.testing.assert_array_equal(adv.group_index, [0, 0, 0, 1, 1])
    assert len(adv.per_event) == batch.events().num_rows
    assert "grpo" in repr(adv)


def test_group_by_task_none_and_labels():
    batch = _two_groups()
    whole = masreplay.advantages(batch, group_by=None, dtype="float64")
    np.testing.assert_allclose(whole.per_trace, _grpo([1.0, 0.0, 0.5, 2.0, 4.0]))
    by_task = masreplay.advantages(batch, group_by="task_id", dtype="float64")
    np.testing.assert_array_equal(by_task.per_trace, whole.per_trace)
    labels = masreplay.advantages(batch, group_by=["x", "y", "x", "y", "y"], dtype="float64")
    np.testing.assert_allclose(
        labels.per_trace, [_grpo([1, 0.5])[0], _grpo([0, 2, 4])[0], _grpo([1, 0.5])[1], *_grpo([0, 2, 4])[1:]]
    )
    with pytest.raises(InvalidArgumentError, match="group_by"):
        masreplay.advantages(batch, group_by="system")


def test_group_ids_are_numbered_in_order_of_first_appearance():
    # Interleaved, "g2" first: numbered as they come, like the integer labels below.
    batch = _batch(
        [_linear("a", 1, 1.0, "g2"), _linear("b", 2, 0.0, "g1"), _linear("c", 1, 3.0, "g2"), _linear("d", 1, 2.0, "g1")]
    )
    by_id = masreplay.advantages(batch, dtype="float64")
    np.testing.assert_array_equal(by_id.group_index, [0, 1, 0, 1])
    by_label = masreplay.advantages(batch, group_by=[5, 8, 5, 8], dtype="float64")
    np.testing.assert_array_equal(by_id.per_trace, by_label.per_trace)
    np.testing.assert_array_equal(by_id.group_index, by_label.group_index)
    with pytest.raises(InvalidArgumentError, match="not text"):
        masreplay._core.trace_text_codes(batch._core, "n_events")


def _multi_agent_group():
    # Trace A (team 1): orch decides, w1 works, orch aggregates. Trace B (team 0): orch, w2, w2.
    def events(*rows):
        return [{"agent": agent, "role": role, "type": kind, "tokens": tokens} for agent, role, kind, tokens in rows]

    decide, work = ("orch", "planner", "orchestrator_decision"), "message"
    a = _trace(
        "A",
        events((*decide, 10), ("w1", "worker", work, 30), ("orch", "planner", "aggregate", 10)),
        [(0, 1), (1, 2)],
        1.0,
    )
    b = _trace("B", events((*decide, 20), ("w2", "worker", work, 5), ("w2", "worker", work, 15)), [(0, 1), (0, 2)], 0.0)
    return _batch([a, b])


def test_agent_wise_over_events_is_dr_mas():
    adv = masreplay.advantages(_multi_agent_group(), normalize_by="agent", unit="events", dtype="float64")
    orch = _grpo([1.0, 1.0, 0.0])  # orch's steps: A0, A2, B0
    np.testing.assert_allclose(adv.per_event, [orch[0], 0.0, orch[1], orch[2], 0.0, 0.0], rtol=1e-12)
    np.testing.assert_allclose(adv.per_trace, [(orch[0] + orch[1]) / 3, orch[2] / 3])


def test_agent_wise_over_traces_counts_a_trace_once():
    adv = masreplay.advantages(_multi_agent_group(), normalize_by="agent", dtype="float64")
    orch = _grpo([1.0, 0.0])
    np.testing.assert_allclose(adv.per_event, [orch[0], 0.0, orch[0], orch[1], 0.0, 0.0], rtol=1e-12)
    np.testing.assert_allclose(adv.per_trace, [orch[0] / 2, orch[1] / 2])


def test_role_depth_turn_and_event_type_strata():
    batch = _multi_agent_group()
    pair = _grpo([1.0, 0.0])
    role = masreplay.advantages(batch, normalize_by="role", dtype="float64").per_event
    np.testing.assert_allclose(role, np.repeat(pair, 3), rtol=1e-12)  # both roles in both traces
    # depth: A is a chain (0, 1, 2); B fans out (0, 1, 1). Depth 2 exists in A only.
    depth = masreplay.advantages(batch, normalize_by="depth", dtype="float64").per_event
    np.testing.assert_allclose(depth, [pair[0], pair[0], 0.0, pair[1], pair[1], pair[1]], rtol=1e-12)
    depth_events = masreplay.advantages(batch, normalize_by="depth", unit="events", dtype="float64").per_event
    level1 = _grpo([1.0, 0.0, 0.0])
    np.testing.assert_allclose(depth_events, [pair[0], level1[0], 0.0, pair[1], level1[1], level1[2]], rtol=1e-12)
    # turn: the k-th event of its author. Turn 0: every author's first event, in both traces.
    turn = masreplay.advantages(batch, normalize_by="turn", unit="events", dtype="float64").per_event
    first = _grpo([1.0, 1.0, 0.0, 0.0])  # A0, A1 | B0, B1
    # Turn 1: orch's second event in A, w2's second in B.
    np.testing.assert_allclose(turn, [first[0], first[1], pair[0], first[2], first[3], pair[1]], rtol=1e-12)
    # event_type: decisions in both, messages in both, the aggregate in A only.
    types = masreplay.advantages(batch, normalize_by="event_type", dtype="float64").per_event
    np.testing.assert_allclose(types, [pair[0], pair[0], 0.0, pair[1], pair[1], pair[1]], rtol=1e-12)


def test_joint_strata():
    batch = _multi_agent_group()
    joint = masreplay.advantages(batch, normalize_by=["role", "event_type"], dtype="float64").per_event
    pair = _grpo([1.0, 0.0])
    # (planner, decision) and (worker, message) are in both traces; (planner, aggregate) in A only.
    np.testing.assert_allclose(joint, [pair[0], pair[0], 0.0, pair[1], pair[1], pair[1]], rtol=1e-12)
    with pytest.raises(InvalidArgumentError, match="normalize_by"):
        masreplay.advantages(batch, normalize_by=["agent", "mood"])
    with pytest.raises(InvalidArgumentError, match="twice"):
        masreplay.advantages(batch, normalize_by=["agent", "agent"])


def test_weights_are_one_over_agents_times_token_share():
    adv = masreplay.advantages(_multi_agent_group(), dtype="float64")
    # Trace A: agents orch (20 tokens) and w1 (30): 1/2 traces * 1/2 agents * token share.
    # Trace B: orch (20) and w2 (5 + 15).
    expected = np.array([10 / 20, 1.0, 10 / 20, 1.0, 5 / 20, 15 / 20]) / 4
    np.testing.assert_allclose(adv.weights, expected)
    assert math.isclose(adv.weights.sum(), 1.0)
    by_role = masreplay.advantages(_multi_agent_group(), weight_by="role", dtype="float64").weights
    np.testing.assert_allclose(by_role, expected)  # roles coincide with agent kinds here


def test_weights_fall_back_to_counts_without_tokens():
    adv = masreplay.advantages(_two_groups(), dtype="float64")
    np.testing.assert_allclose(adv.weights, np.repeat([1 / 6, 1 / 9, 1 / 3, 1 / 4, 1 / 4], [2, 3, 1, 2, 2]))
    sums = np.bincount(adv.group_index[adv.trace_index], weights=adv.weights)
    np.testing.assert_allclose(sums, [1.0, 1.0])


def test_channels_sum_then_normalize_and_normalize_then_sum():
    traces = [
        _trace("a", [{"agent": "o"}], reward=0, rewards={"team": 1.0, "orchestration": 0.0}),
        _trace("b", [{"agent": "o"}], reward=0, rewards={"team": 0.0, "orchestration": 2.0}),
        _trace("c", [{"agent": "o"}], reward=0, rewards={"team": 1.0, "orchestration": 1.0}),
    ]
    batch = _batch(traces)
    weights = {"team": 1.0, "orchestration": 0.3}
    summed = masreplay.advantages(batch, channels=weights, dtype="float64").per_trace
    np.testing.assert_allclose(summed, _grpo([1.0, 0.6, 1.3]), rtol=1e-12)
    as_channel = masreplay.advantages(batch, channel=weights, dtype="float64").per_trace
    np.testing.assert_array_equal(as_channel, summed)
    separate = masreplay.advantages(batch, channels=weights, channel_mode="normalize_then_sum", dtype="float64").per_trace
    np.testing.assert_allclose(separate, _grpo([1, 0, 1]) + 0.3 * _grpo([0, 2, 1]), rtol=1e-12)


def test_missing_channel_raises_or_is_skipped():
    batch = _batch([_trace("a", [{"agent": "o"}], rewards={"team": 1.0}), _trace("b", [{"agent": "o"}], rewards={"other": 1.0})])
    with pytest.raises(InvalidArgumentError, match="'b'"):
        masreplay.advantages(batch)
    skipped = masreplay.advantages(batch, missing="skip", dtype="float64")
    np.testing.assert_array_equal(skipped.per_trace, [0.0, 0.0])


def test_credit_replaces_the_team_reward():
    batch = _multi_agent_group()
    credit = np.array([1.0, 2.0, 3.0, 0.0, 4.0, 2.0])
    per_event = masreplay.advantages(batch, credit=credit, unit="events", dtype="float64").per_event
    np.testing.assert_allclose(per_event, _grpo(credit), rtol=1e-12)
    per_trace = masreplay.advantages(batch, credit=credit, dtype="float64").per_trace
    np.testing.assert_allclose(per_trace, _grpo([2.0, 2.0]))
    with pytest.raises(InvalidArgumentError, match="credit"):
        masreplay.advantages(batch, credit=[1.0])


def test_trl_normalize_then_sum_whitens_the_sum_in_fp32():
    traces = [_trace(f"t{i}", [{"agent": "o"}], rewards={"a": float(i % 3), "b": float(i % 2)}) for i in range(4)]
    batch = _batch(traces)
    adv = masreplay.advantages(batch, channels={"a": 1.0, "b": 0.5}, channel_mode="normalize_then_sum", compat="trl")
    a = masreplay.group_normalize([0, 1, 2, 0], [0] * 4, compat="trl")
    b = masreplay.group_normalize([0, 1, 0, 1], [0] * 4, compat="trl")
    total = a + F32(0.5) * b
    mean = total.sum(dtype=F32) / F32(4)
    var = ((total - mean) ** 2).sum(dtype=F32) / F32(4) * (F32(4) / F32(3))
    np.testing.assert_array_equal(adv.per_trace, (total - mean) / (_torch_sqrt(var) + F32(1e-4)))


def test_bad_batch_arguments():
    batch = _two_groups()
    with pytest.raises(InvalidArgumentError, match="unit"):
        masreplay.advantages(batch, normalize_by="agent", unit="tokens")
    with pytest.raises(InvalidArgumentError, match="channel_mode"):
        masreplay.advantages(batch, channel_mode="mix")
    with pytest.raises(InvalidArgumentError, match="channel"):
        masreplay.advantages(batch, channel={})
    with pytest.raises(InvalidArgumentError, match="missing"):
        masreplay.advantages(batch, missing="ignore")


def test_sampled_and_simulated_batches():
    batch = masreplay.sim.generate(64, agents=(2, 6), group_size=8, seed=3)
    adv = masreplay.advantages(batch, normalize_by="agent", unit="events")
    assert adv.per_event.shape == (batch.num_events,) and adv.per_trace.shape == (64,)
    assert np.isfinite(adv.per_event).all()
    buffer = masreplay.GraphBuffer(64, seed=0)
    buffer.add(batch)
    sample = buffer.sample_groups(2, group_size=8, seed=1)
    again = masreplay.advantages(sample)
    assert again.per_trace.shape == (16,)


# ---- graph returns -----------------------------------------------------------------------------


def _diamond(rewards):
    events = [{"agent": a, "reward": {"process": r}} for a, r in zip(["o", "x", "y", "o"], rewards, strict=True)]
    return _batch([_trace("d", events, [(0, 1), (0, 2), (1, 3), (2, 3)])])


def test_return_to_go_counts_a_join_once():
    batch = _diamond([0.0, 0.0, 0.0, 1.0])
    returns = masreplay.graph_returns(batch, "process", gamma=0.5)
    np.testing.assert_allclose(returns, [0.25, 0.5, 0.5, 1.0])  # not 0.5 at the root
    undiscounted = masreplay.graph_returns(batch, [1.0, 2.0, 3.0, 4.0], gamma=1.0)
    np.testing.assert_allclose(undiscounted, [10.0, 6.0, 7.0, 4.0])


def test_tree_returns_average_the_children():
    batch = _diamond([1.0, 2.0, 0.0, 4.0])
    tree = masreplay.graph_returns(batch, "process", gamma=0.9, kind="tree")
    r3, r1, r2 = 4.0, 2.0 + 0.9 * 4.0, 0.0 + 0.9 * 4.0
    np.testing.assert_allclose(tree, [1.0 + 0.9 * (r1 + r2) / 2, r1, r2, r3])


def test_turn_returns_run_over_each_agents_own_events():
    batch = _diamond([1.0, 2.0, 3.0, 4.0])  # agent o owns events 0 and 3; x owns 1; y owns 2
    turns = masreplay.graph_returns(batch, "process", gamma=0.5, kind="turns")
    np.testing.assert_allclose(turns, [1.0 + 0.5 * 4.0, 2.0, 3.0, 4.0])


def test_event_rewards_fill_missing():
    batch = _batch([_trace("t", [{"agent": "o", "reward": {"tool": 1.0}}, {"agent": "o"}])])
    np.testing.assert_array_equal(masreplay.event_rewards(batch, "tool"), [1.0, 0.0])
    np.testing.assert_array_equal(masreplay.event_rewards(batch, "tool", fill=-1), [1.0, -1.0])
    assert np.isnan(masreplay.event_rewards(batch, "tool", fill=np.nan)[1])
    for beyond in (2**70, -(2.0**49), np.inf):
        with pytest.raises(InvalidArgumentError, match=r"fill must be a number in"):
            masreplay.event_rewards(batch, "tool", fill=beyond)


def _verl_gae(rewards, values, gamma, lam):
    advantages, last, next_value = np.zeros(len(rewards)), 0.0, 0.0
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * next_value - values[t]
        last = delta + gamma * lam * last
        advantages[t], next_value = last, values[t]
    return advantages


def test_gae_on_a_chain_is_verls_gae():
    batch = _batch([_linear("c", 5, 1.0)])
    rewards, values = np.array([0.0, 0.5, 0.0, 0.0, 1.0]), np.array([0.2, 0.4, 0.1, 0.3, 0.6])
    advantages, returns = masreplay.graph_gae(batch, rewards, values, gamma=0.9, lam=0.8)
    np.testing.assert_allclose(advantages, _verl_gae(rewards, values, 0.9, 0.8), rtol=1e-12)
    np.testing.assert_allclose(returns, advantages + values)


def test_gae_averages_over_branches():
    batch = _diamond([0.0, 0.0, 0.0, 1.0])
    values = np.array([0.5, 0.2, 0.4, 0.0])
    advantages, _ = masreplay.graph_gae(batch, "process", values, gamma=1.0, lam=1.0)
    a3 = 1.0
    a1, a2 = 0.0 - 0.2 + a3, 0.0 - 0.4 + a3
    np.testing.assert_allclose(advantages, [0.3 - 0.5 + (a1 + a2) / 2, a1, a2, a3])


def test_graph_argument_errors():
    batch = _diamond([0.0, 0.0, 0.0, 1.0])
    with pytest.raises(InvalidArgumentError, match="gamma"):
        masreplay.graph_returns(batch, "process", gamma=1.5)
    with pytest.raises(InvalidArgumentError, match="kind"):
        masreplay.graph_returns(batch, "process", kind="forest")
    with pytest.raises(InvalidArgumentError, match="rewards"):
        masreplay.graph_returns(batch, [1.0])
    with pytest.raises(InvalidArgumentError, match="lam"):
        masreplay.graph_gae(batch, "process", np.zeros(4), lam=-0.1)


# ---- properties --------------------------------------------------------------------------------

rows = st.integers(min_value=1, max_value=60).flatmap(
    lambda n: st.tuples(
        st.lists(st.floats(-100, 100, allow_nan=False).map(lambda x: round(x, 3)), min_size=n, max_size=n),
        st.lists(st.integers(0, 4), min_size=n, max_size=n),
        st.lists(st.integers(0, 2), min_size=n, max_size=n),
    )
)


@settings(max_examples=150, deadline=None)
@given(rows)
def test_cells_have_mean_zero_and_unit_std(data):
    values, groups, strata = (np.asarray(x) for x in data)
    out = masreplay.group_normalize(values, groups, strata=strata, eps=0.0, dtype="float64")
    for key in set(zip(groups.tolist(), strata.tolist(), strict=True)):
        cell = (groups == key[0]) & (strata == key[1])
        if cell.sum() < 2 or np.ptp(values[cell]) < 1e-6:
            np.testing.assert_allclose(out[cell], 0.0, atol=1e-6)
            continue
        assert abs(out[cell].mean()) < 1e-9
        assert math.isclose(out[cell].std(ddof=1), 1.0, rel_tol=1e-9)


@settings(max_examples=100, deadline=None)
@given(rows, st.randoms(use_true_random=False), st.floats(-50, 50).map(lambda x: round(x, 2)))
def test_invariant_to_row_order_and_constant_shift(data, random, shift):
    values, groups, strata = (np.asarray(x) for x in data)
    base = masreplay.group_normalize(values, groups, strata=strata, dtype="float64")
    order = np.array(random.sample(range(len(values)), len(values)))
    permuted = masreplay.group_normalize(values[order], groups[order], strata=strata[order], dtype="float64")
    np.testing.assert_allclose(permuted, base[order], rtol=1e-9, atol=1e-9)
    for estimator in ("grpo", "rloo", "opo"):
        plain = masreplay.group_normalize(values, groups, strata=strata, estimator=estimator, dtype="float64")
        shifted = masreplay.group_normalize(values + shift, groups, strata=strata, estimator=estimator, dtype="float64")
        np.testing.assert_allclose(shifted, plain, rtol=1e-6, atol=1e-6)


# Unrounded values far from zero and groups nearly constant: where a one-pass variance
# (E[x^2] - E[x]^2) loses every digit; masreplay must agree with a two-pass numpy reference.
offset_rows = st.integers(min_value=2, max_value=40).flatmap(
    lambda n: st.tuples(
        st.floats(-1e6, 1e6),
        st.integers(-4, 3).map(lambda k: 10.0**k),
        # Differences below 1e-9 of the spread would square to subnormals, where no
        # implementation keeps the digits the comparison needs.
        st.lists(st.floats(-1, 1).map(lambda x: x if abs(x) > 1e-9 else 0.0), min_size=n, max_size=n),
        st.lists(st.integers(0, 3), min_size=n, max_size=n),
    )
)


def _two_pass_grpo(values: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GRPO by a two-pass numpy reference, and per row the error any implementation may make:
    the inputs carry max|x| * 2^-52 of rounding, which relative to the group's spread is all
    the precision there is to reach."""
    out, tolerance = np.zeros_like(values), np.full_like(values, 1e-6)
    for group in np.unique(groups):
        cell = groups == group
        if cell.sum() > 1 and values[cell].std() > 0:
            std = values[cell].std(ddof=1)
            out[cell] = (values[cell] - values[cell].mean()) / std
            tolerance[cell] += 64 * np.finfo(float).eps * np.abs(values[cell]).max() / std
    return out, tolerance


@settings(max_examples=150, deadline=None)
@given(offset_rows, st.floats(1e-3, 1e3))
def test_large_offsets_and_near_constant_groups_match_two_pass_and_are_scale_invariant(data, scale):
    offset, spread, noise, groups = data
    values = offset + spread * np.asarray(noise)
    groups = np.asarray(groups)
    out = masreplay.group_normalize(values, groups, eps=0.0, dtype="float64")
    expected, tolerance = _two_pass_grpo(values, groups)
    assert np.all(np.abs(out - expected) <= tolerance), (out, expected)
    scaled = masreplay.group_normalize(values * scale, groups, eps=0.0, dtype="float64")
    assert np.all(np.abs(scaled - out) <= tolerance), (scaled, out)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(0, 1).map(lambda x: round(x, 2)), min_size=2, max_size=10),
    st.integers(1, 5),
    st.integers(1, 4),
)
def test_single_agent_linear_traces_equal_plain_grpo_under_every_stratum(rewards, length, group_size):
    traces = [_linear(f"t{i}", length, r, group=f"g{i // group_size}") for i, r in enumerate(rewards)]
    batch = _batch(traces)
    plain = masreplay.advantages(batch, dtype="float64")
    for stratum in (*STRATA, ["agent", "depth"], ["role", "turn", "event_type"]):
        stratified = masreplay.advantages(batch, normalize_by=stratum, dtype="float64")
        np.testing.assert_allclose(stratified.per_event, plain.per_event, rtol=1e-12, atol=1e-12, err_msg=str(stratum))
        np.testing.assert_allclose(stratified.per_trace, plain.per_trace, rtol=1e-12, atol=1e-12, err_msg=str(stratum))
    if length == 1:  # one event per trace: counting events is counting traces
        events = masreplay.advantages(batch, normalize_by="agent", unit="events", dtype="float64")
        np.testing.assert_allclose(events.per_event, plain.per_event, rtol=1e-12, atol=1e-12)


def test_labels_of_any_form_group_alike():
    """Strings (lists, object and unicode arrays, Arrow with nulls and several chunks), tuples
    and mixed objects group rows exactly as the integer labels they stand for."""
    rng = np.random.default_rng(3)
    groups = rng.integers(0, 40, 600)
    values = rng.normal(size=600)
    expected = masreplay.group_normalize(values, groups, dtype="float64")
    names = [f"uid-{g}" for g in groups]
    forms = [
        names,
        np.array(names, dtype=object),
        np.array(names),
        pa.chunked_array([pa.array(names[:100]), pa.array(names[100:])]),
        pa.array([None if g == 0 else name for g, name in zip(groups, names, strict=True)]),
        [("uid", int(g)) if g % 2 else int(g) for g in groups],
    ]
    for labels in forms:
        np.testing.assert_array_equal(masreplay.group_normalize(values, labels, dtype="float64"), expected)
    with pytest.raises(InvalidArgumentError, match="600 entries"):
        masreplay.group_normalize(values, pa.array(names[:10]))


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from(["narrow", "wide", "strings"]), st.integers(2_000, 20_000))
def test_interleaved_groups_of_every_label_form_match_numpy(seed, form, n):
    """Groups of 1-64 rows shuffled (the tables read in place), labelled by small integers,
    random 62-bit integers or string uids, with offsets and near-constant groups."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 65, size=n // 32 + 1)
    groups = np.repeat(np.arange(len(sizes)), sizes)[:n]
    offsets = rng.choice([0.0, 1e4, -7.0], size=len(sizes))
    spreads = rng.choice([1.0, 1e-3, 0.0], size=len(sizes))
    values = offsets[groups] + spreads[groups] * rng.normal(size=len(groups))
    order = rng.permutation(len(groups))
    groups, values = groups[order], values[order]
    labels = {
        "narrow": groups * 3 + 11,
        "wide": rng.integers(-(2**62), 2**62, size=len(sizes))[groups],
        "strings": np.array([f"{g:06x}-uid" for g in groups], dtype=object),
    }[form]
    out = masreplay.group_normalize(values, labels, eps=0.0, dtype="float64")
    expected, tolerance = _two_pass_grpo(values, groups)
    assert np.all(np.abs(out - expected) <= tolerance), form
    # Every form of label gives the same bits (the same rows in the same order per group).
    np.testing.assert_array_equal(masreplay.group_normalize(values, groups, eps=0.0, dtype="float64"), out)


def test_group_index_numbers_text_labels_by_first_appearance_and_numbers_by_value():
    sim = masreplay.sim.generate(6, agents=2, group_size=2, seed=0)
    batch = masreplay.load_traces([sim[i] for i in (4, 5, 0, 1, 2, 3)])
    assert masreplay.advantages(batch).group_index.tolist() == [0, 0, 1, 1, 2, 2]
    assert masreplay.advantages(batch, group_by=["zz", "zz", "aa", "aa", "mm", "mm"]).group_index.tolist() == [0, 0, 1, 1, 2, 2]
    assert masreplay.advantages(batch, group_by=[9, 9, 1, 1, 5, 5]).group_index.tolist() == [2, 2, 0, 0, 1, 1]
