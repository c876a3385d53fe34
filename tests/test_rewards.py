"""masreplay.rewards: the PARL reward, schedules and channel composition against hand-computed
values; running-std balancing on synthetic streams; serialisation round trips."""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pytest

import masreplay
from masreplay.errors import ChannelNotFoundError, InvalidArgumentError
from masreplay.rewards import RunningStd, Schedule, compose, parl


def test_parl_on_the_seed_example(seed_example):
    # team 1.0; critical steps 6 of 8 events: r_parallel = 1 - 6/8; finish rate 1/2.
    reward = parl(seed_example, lambda_parallel=0.4, lambda_finish=0.2)
    assert reward.tolist() == pytest.approx([1.0 + 0.4 * 0.25 + 0.2 * 0.5])


def test_parl_without_spawns_earns_no_finish_bonus(seed_example):
    serial = {
        "trace_id": "serial",
        "task_id": "task",
        "events": [{"id": f"e{i}", "t": i, "type": "orchestrator_decision", "agent": "orch"} for i in range(3)],
        "edges": [{"src": "e0", "dst": "e1", "type": "temporal"}, {"src": "e1", "dst": "e2", "type": "temporal"}],
        "rewards": {"other": 0.5},
        "costs": {"tokens": 0, "wall_clock_s": 0},
    }
    reward = parl([serial, seed_example], 1.0, 1.0)
    assert reward[0] == 0.0  # no team channel, serial, nothing spawned
    assert parl([serial], 1.0, 1.0, perf="other").tolist() == [0.5]


def test_parl_lambdas_zero_is_the_outcome_reward():
    batch = masreplay.sim.generate(20, seed=2)
    team = [dict(r)["team"] for r in batch.to_arrow()["rewards"].to_pylist()]
    assert parl(batch, 0.0, 0.0).tolist() == team


def test_constant_linear_cosine_step():
    assert Schedule.constant(0.3)(10**6) == 0.3
    linear = Schedule.linear(1.0, 0.0, 10)
    assert [linear(s) for s in (0, 5, 10, 20)] == [1.0, 0.5, 0.0, 0.0]
    cosine = Schedule.cosine(1.0, 0.0, 10)
    assert cosine(0) == 1.0 and cosine(10) == 0.0 and cosine(99) == 0.0
    assert cosine(5) == pytest.approx(0.5)
    assert cosine(2) == pytest.approx((1 + math.cos(math.pi * 0.2)) / 2)
    step = Schedule.step([1.0, 0.5, 0.1], [10, 20])
    assert [step(s) for s in (0, 9, 10, 19, 20, 1000)] == [1.0, 1.0, 0.5, 0.5, 0.1, 0.1]
    assert Schedule.linear(2.0, 1.0, 0)(0) == 1.0


def test_bad_schedules_are_refused():
    with pytest.raises(ValueError, match="one more value"):
        Schedule.step([1.0], [5])
    with pytest.raises(ValueError, match="increase"):
        Schedule.step([1.0, 2.0, 3.0], [5, 5])
    with pytest.raises(ValueError, match=r"Schedule\.linear: steps must be an integer in \[0"):
        Schedule.linear(1.0, 0.0, -1)
    with pytest.raises(TypeError, match="does not observe"):
        Schedule.constant(1.0).observe(0, 1.0)


def test_indicator_anneal_triggers_after_patience():
    schedule = Schedule.on_indicator(0.5, Schedule.linear(0.5, 0.0, 4), threshold=0.9, patience=3)
    finish_rates = [0.95, 0.95, 0.5, 0.95, 0.95, 0.95, 0.2]
    triggered = [schedule.observe(step, rate) for step, rate in enumerate(finish_rates)]
    assert triggered == [False, False, False, False, False, True, True]
    # Before step 5 the weight holds; from step 5 it anneals over 4 steps, whatever the indicator does.
    assert [schedule(s) for s in (0, 4, 5, 6, 7, 9, 100)] == [0.5, 0.5, 0.5, 0.375, 0.25, 0.0, 0.0]
    below = Schedule.on_indicator(1.0, Schedule.constant(0.0), threshold=0.1, patience=1, above=False)
    assert not below.observe(0, 0.2) and below.observe(1, 0.05) and below(1) == 0.0


def test_schedules_survive_json_and_pickle():
    anneal = Schedule.on_indicator(Schedule.cosine(1, 0.5, 8), Schedule.step([0.5, 0.0], [3]), threshold=0.8, patience=2)
    anneal.observe(0, 0.9)
    schedules = [Schedule.constant(2), Schedule.linear(1, 0, 7), Schedule.step([1, 2], [4]), anneal]
    for schedule in schedules:
        again = Schedule.from_dict(json.loads(json.dumps(schedule.to_dict())))
        assert again == schedule == pickle.loads(pickle.dumps(schedule))
        assert [again(s) for s in range(12)] == [schedule(s) for s in range(12)]
    # The streak was kept: one more observation above the threshold triggers both copies alike.
    again = Schedule.from_dict(anneal.to_dict())
    assert anneal.observe(1, 0.9) and again.observe(1, 0.9)
    assert [again(s) for s in range(6)] == [anneal(s) for s in range(6)]


def test_compose_weighted_sum_with_nan_and_schedules():
    channels = {"team": [1.0, 0.0, 1.0], "tool": [0.5, float("nan"), 1.0], "unused": [9, 9, 9]}
    assert compose(channels, {"team": 1.0, "tool": 0.5}).tolist() == [1.25, 0.0, 1.5]
    weights = {"team": 1.0, "tool": Schedule.linear(1.0, 0.0, 10)}
    assert compose(channels, weights, step=5).tolist() == [1.25, 0.0, 1.5]
    assert compose(channels, weights, step=10).tolist() == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="step="):
        compose(channels, weights)
    with pytest.raises(KeyError, match="missing"):
        compose(channels, {"missing": 1.0})
    with pytest.raises(ValueError, match="balance"):
        compose(channels, {"team": 1.0}, balance="max")


def test_std_balance_keeps_each_channel_near_unit_std():
    rng = np.random.default_rng(0)
    scales = {"success": 1.0, "latency": 300.0, "kl": 0.001}
    state = RunningStd()
    balanced: dict[str, list[np.ndarray]] = {name: [] for name in scales}
    for _ in range(200):
        batch = {name: rng.normal(5 * scale, scale, size=64) for name, scale in scales.items()}
        for name in scales:  # one channel at a time, so each balanced stream can be read back
            balanced[name].append(compose(batch, {name: 1.0}, balance="std", state=state))
    for name in scales:
        later = np.concatenate(balanced[name][20:])
        assert later.std() == pytest.approx(1.0, abs=0.05), name
        assert state.std(name) == pytest.approx(scales[name], rel=0.05)
    # Unbalanced, the latency channel would drown the others by five orders of magnitude.
    mixed = compose(batch, dict.fromkeys(scales, 1.0), balance="std", state=state)
    assert np.abs(mixed).max() < 20


def test_running_std_matches_numpy_and_round_trips():
    rng = np.random.default_rng(1)
    stream = [rng.normal(2.0, 3.0, size=n) for n in (1, 7, 50, 3)]
    state = RunningStd()
    for values in stream:
        state.update("c", values)
    assert state.std("c") == pytest.approx(np.concatenate(stream).std(ddof=1))
    again = RunningStd.from_dict(json.loads(json.dumps(state.to_dict())))
    batch = {"c": rng.normal(size=16)}
    first = compose(batch, {"c": 2.0}, balance="std", state=state)
    assert compose(batch, {"c": 2.0}, balance="std", state=again).tolist() == first.tolist()
    assert pickle.loads(pickle.dumps(state)).to_dict() == state.to_dict()


def test_balance_leaves_a_channel_alone_until_it_has_spread():
    state = RunningStd()
    assert compose({"c": [3.0]}, {"c": 1.0}, balance="std", state=state).tolist() == [3.0]
    assert compose({"c": [3.0, 3.0]}, {"c": 1.0}, balance="std", state=state).tolist() == [3.0, 3.0]
    assert math.isnan(RunningStd().std("never seen"))


def test_compose_refuses_channels_of_different_lengths_and_leaves_the_state_alone():
    state = RunningStd()
    compose({"a": [1.0, 2.0, 4.0]}, {"a": 1.0}, balance="std", state=state)
    before = state.to_dict()
    # A channel of one value would otherwise be broadcast over every trace.
    with pytest.raises(InvalidArgumentError, match="lengths"):
        compose({"a": [1.0, 2.0, 3.0], "b": [5.0]}, {"a": 1.0, "b": 1.0}, balance="std", state=state)
    with pytest.raises(InvalidArgumentError, match="'b'"):
        compose({"a": [1.0, 2.0, 3.0], "b": ["x", "y", "z"]}, {"a": 1.0, "b": 1.0}, balance="std", state=state)
    with pytest.raises(InvalidArgumentError, match=r"channel 'b' holds inf \(trace 1\): rewards must be finite"):
        compose({"a": [1.0, 2.0, 3.0], "b": [1.0, math.inf, 0.0]}, {"a": 1.0, "b": 1.0}, balance="std", state=state)
    with pytest.raises(InvalidArgumentError, match="1-D"):
        compose({"a": [[1.0, 2.0]]}, {"a": 1.0}, balance="std", state=state)
    with pytest.raises(InvalidArgumentError, match="weight of 'a'"):
        compose({"a": [1.0, 2.0, 3.0]}, {"a": math.nan}, balance="std", state=state)
    # 1e300 times a weight of 1e10 was an infinite reward.
    with pytest.raises(
        InvalidArgumentError, match=r"channel 'b' holds 1e\+300 \(trace 1\): rewards must be finite and of magnitude below 2\^49"
    ):
        compose({"a": [1.0, 2.0, 3.0], "b": [1.0, 1e300, 0.0]}, {"a": 1.0, "b": 1e10}, balance="std", state=state)
    with pytest.raises(InvalidArgumentError, match=r"the weight of 'a' is 1e\+300: weights must be of magnitude below 2\^49"):
        compose({"a": [1.0, 2.0, 3.0]}, {"a": 1e300}, balance="std", state=state)
    assert state.to_dict() == before


def test_compose_names_missing_channels_and_refuses_a_state_without_balance():
    with pytest.raises(ChannelNotFoundError, match="missing") as caught:
        compose({"team": [1.0]}, {"team": 1.0, "missing": 1.0})
    assert isinstance(caught.value, KeyError) and caught.value.channels == ("missing",)
    assert pickle.loads(pickle.dumps(caught.value)).channels == ("missing",)
    with pytest.raises(InvalidArgumentError, match="balance='std'"):
        compose({"team": [1.0]}, {"team": 1.0}, state=RunningStd())


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"eps": "x", "channels": {}},
        {"eps": -1.0, "channels": {}},
        {"eps": 1e-8, "channels": {"c": [2, 0.0]}},
        {"eps": 1e-8, "channels": {"c": [-2, 0.0, 1.0]}},
        {"eps": 1e-8, "channels": {"c": [2, math.nan, 1.0]}},
        {"eps": 1e-8, "channels": {"c": [2, 0.0, -1.0]}},
        {"eps": 1e-8, "channels": [1, 2]},
    ],
)
def test_running_std_from_a_damaged_dict_is_refused(data):
    with pytest.raises(InvalidArgumentError, match=r"RunningStd\.from_dict"):
        RunningStd.from_dict(data)


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"kind": "sawtooth", "params": {}},
        {"kind": "linear", "params": {"start": 1.0, "end": 0.0}},
        {"kind": "linear", "params": {"start": 1.0, "end": 0.0, "steps": -3}},
        {"kind": "step", "params": {"values": [1.0], "boundaries": [5]}},
        {"kind": "constant", "params": {"value": "high"}},
        {"kind": "constant", "params": [1.0]},
        {
            "kind": "on_indicator",
            "params": {
                "before": {"kind": "constant", "params": {"value": 1.0}},
                "after": {"kind": "constant", "params": {"value": 0.0}},
                "threshold": 0.9,
                "patience": 2,
                "above": True,
            },
            "state": {"streak": -1, "since": None},
        },
    ],
)
def test_schedule_from_a_damaged_dict_is_refused(data):
    with pytest.raises(InvalidArgumentError):
        Schedule.from_dict(data)


@pytest.mark.parametrize(
    ("build", "named"),
    [
        (lambda: Schedule.constant(math.nan), "value"),
        (lambda: Schedule.constant(math.inf), "value"),
        (lambda: Schedule.constant("x"), "value"),
        (lambda: Schedule.linear(None, 0.0, 10), "start"),
        (lambda: Schedule.cosine(1.0, 0.0, math.nan), "steps"),
        (lambda: Schedule.linear(1.0, 0.0, 2**70), "steps"),
        (lambda: Schedule.step([1.0, math.nan], [5]), r"values\[1\]"),
        (lambda: Schedule.step(["a", 1.0], [5]), r"values\[0\]"),
        (lambda: Schedule.step([1.0, 2.0], [5.5]), r"boundaries\[0\]"),
        (lambda: Schedule.step([1.0], None), "boundaries"),
        (lambda: Schedule.on_indicator(math.nan, Schedule.constant(0.0), threshold=0.5, patience=1), "value"),
        (lambda: Schedule.on_indicator(1.0, 0.0, threshold=0.5, patience=1), "after"),
        (lambda: Schedule.on_indicator(1.0, Schedule.constant(0.0), threshold="x", patience=1), "threshold"),
        (lambda: Schedule.on_indicator(1.0, Schedule.constant(0.0), threshold=0.5, patience=math.nan), "patience"),
        (lambda: Schedule.constant(1.0)(math.nan), "step"),
        (lambda: Schedule.on_indicator(1.0, Schedule.constant(0.0), threshold=0.5, patience=1).observe(0, "y"), "indicator"),
        (lambda: Schedule.on_indicator(1.0, Schedule.constant(0.0), threshold=0.5, patience=1).observe(math.nan, 1.0), "step"),
        (lambda: RunningStd(eps="x"), "eps"),
        (lambda: compose({"a": [1.0]}, {"a": 1.0}, balance="std", state={}), "state"),
    ],
)
def test_a_schedule_or_state_of_no_finite_numbers_is_refused_by_name(build, named):
    # Found by fuzzing: these were a builtin ValueError/TypeError from float() or int(), or a
    # schedule whose every weight was NaN or infinite.
    with pytest.raises(InvalidArgumentError, match=named):
        build()
