"""Python dicts in: the same traces, errors and positions as the same dicts written as JSON.

``load_traces(list_of_dicts)`` copies the objects onto tapes in chunks while the GIL is held and
checks each chunk on the thread pool while the next one is copied; these tests make the input
span several chunks and put rejected traces in each, so that a position, trace id, JSON pointer or
reason lost at a chunk boundary fails here.
"""

from __future__ import annotations

import collections
import copy
import json
import random
import uuid

import pytest

import masreplay
from masreplay.errors import TraceValidationError

#: Enough traces to fill several of the binding's chunks (2**18 tape nodes each; these traces
#: take about 300 nodes).
N_TRACES = 3000


def realistic_traces(n: int, seed: int) -> list[dict]:
    """Simulated traces as users hold them: UUID event ids, events and edges in any order."""
    rng = random.Random(seed)
    batch = masreplay.sim.generate(n, seed=seed, agents=(1, 3), events_per_agent=(1, 3))
    traces = []
    for trace in batch:
        ids = {event["id"]: str(uuid.UUID(int=rng.getrandbits(128), version=4)) for event in trace["events"]}
        for event in trace["events"]:
            event["id"] = ids[event["id"]]
        for edge in trace["edges"]:
            edge["src"], edge["dst"] = ids[edge["src"]], ids[edge["dst"]]
        rng.shuffle(trace["events"])
        rng.shuffle(trace["edges"])
        traces.append(trace)
    return traces


def break_some(traces: list[dict], seed: int) -> list[int]:
    """Breaks one trace in about fifty, each in another way; returns their positions."""
    rng = random.Random(seed)
    breakages = [
        lambda t: t["events"][0].__setitem__("t", -1.0),
        lambda t: t["events"][-1].__setitem__("type", "teleport"),
        lambda t: t["events"][0].__setitem__("id", t["events"][-1]["id"]),
        lambda t: t["edges"].append({"src": t["events"][0]["id"], "dst": "nowhere", "type": "causal"}),
        lambda t: t.__setitem__("rewards", {"team": "high"}),
        lambda t: t["events"][0].__setitem__("logprob", 0.5),
        lambda t: t.__setitem__("topology", "ring"),
        lambda t: t.pop("task_id"),
    ]
    positions = sorted(rng.sample(range(len(traces)), len(traces) // 50))
    for k, position in enumerate(positions):
        breakages[k % len(breakages)](traces[position])
    return positions


def assert_same_outcome(ours: masreplay.TraceBatch, reference: masreplay.TraceBatch) -> None:
    assert ours.to_arrow().equals(reference.to_arrow())
    assert [(p, t, str(e)) for p, t, e in ours.rejected] == [(p, t, str(e)) for p, t, e in reference.rejected]


def test_many_dicts_give_what_their_json_gives():
    traces = realistic_traces(N_TRACES, seed=5)
    positions = break_some(traces, seed=6)
    reference = masreplay.load_traces(json.dumps(traces), on_error="skip")
    batch = masreplay.load_traces(traces, on_error="skip")
    assert [p for p, _, _ in batch.rejected] == positions
    assert len(batch) == N_TRACES - len(positions)
    assert_same_outcome(batch, reference)


def test_the_first_bad_dict_is_the_error_raised():
    traces = realistic_traces(N_TRACES, seed=7)
    traces[N_TRACES - 10]["events"][0]["agent"] = ""
    with pytest.raises(TraceValidationError) as error:
        masreplay.load_traces(traces)
    assert error.value.trace_id == traces[N_TRACES - 10]["trace_id"]
    assert error.value.path.endswith("/agent")


def test_a_dict_that_is_not_json_keeps_its_position_among_many():
    traces = realistic_traces(N_TRACES, seed=8)
    traces[1234]["events"][0]["tokens"] = float("nan")
    traces[2500]["metrics"] = {"score": object()}
    traces[2999]["extra"] = {1: "a non-string key"}
    batch = masreplay.load_traces(traces, on_error="skip")
    assert [(p, t) for p, t, _ in batch.rejected] == [(i, traces[i]["trace_id"]) for i in (1234, 2500, 2999)]
    paths = [e.path for _, _, e in batch.rejected]
    assert paths[0].startswith("/events/") and paths[0].endswith("/tokens")
    assert paths[1:] == ["/metrics/score", "/extra"]
    assert len(batch) == N_TRACES - 3


class Index:
    """An integer that is not an int (as numpy's integers are not)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


class Real:
    """A number that is not a float."""

    def __float__(self) -> float:
        return 2.5


def test_python_forms_json_has_no_name_for_read_as_their_json(seed_example):
    """Tuples, dict subclasses, int and float look-alikes and integers past 64 bits: read as
    ``json.dumps`` of their plain equivalents reads."""
    trace = copy.deepcopy(seed_example)
    plain = copy.deepcopy(seed_example)
    trace["events"] = tuple(collections.OrderedDict(event) for event in trace["events"])
    trace["events"][0]["tokens"] = Index(7)
    plain["events"][0]["tokens"] = 7
    trace["costs"]["wall_clock_s"] = Real()
    plain["costs"]["wall_clock_s"] = 2.5
    for target in (trace, plain):
        target["wide"] = [2**63 - 1, 2**64 - 1, 2**70, -(2**63), True, None, "é"]
    assert masreplay.load_traces(trace)[0] == masreplay.load_traces(json.dumps(plain))[0]


class Empties:
    """A number whose conversion empties the list or dict it is given."""

    def __init__(self, owner: list) -> None:
        self.owner = owner

    def __float__(self) -> float:
        self.owner.clear()
        return 1.0


def test_a_value_that_empties_its_list_while_read_is_read_from_the_snapshot(seed_example):
    trace = copy.deepcopy(seed_example)
    values = [1, 2]
    values.insert(1, Empties(values))
    trace["numbers"] = values
    batch = masreplay.load_traces(trace)
    assert batch[0]["numbers"] == [1, 1.0, 2]


def test_plain_values_at_their_edges_are_read_as_their_json(seed_example):
    """A trace of builtin values only is read in place (no snapshot); at every edge of that
    path (64-bit integers, bools among ints, tuples, empty containers, non-ASCII text) it gives
    what its JSON gives."""
    trace = copy.deepcopy(seed_example)
    trace["plain"] = {
        "ints": [0, -1, 2**63 - 1, -(2**63), 2**63, 2**64 - 1, 2**64, -(2**63) - 1, 2**70],
        "floats": [0.0, -0.0, 1e308, 5e-324, 0.1],
        "constants": [True, False, None, 1, 0],
        "tuple": (1, "two", (3.0, [])),
        "texts": ["", "é", "日本語", "🙂", "nul \x00 inside"],
        "empty": [{}, [], ()],
        "": {"nested": {"deeper": [{"key": "value"}]}},
    }
    ours = masreplay.load_traces(trace)
    theirs = masreplay.load_traces(json.dumps(trace))
    assert ours.to_arrow().equals(theirs.to_arrow())
    assert ours[0]["plain"] == theirs[0]["plain"]
    assert ours[0]["plain"]["constants"] == [True, False, None, 1, 0]
    assert [type(v) for v in ours[0]["plain"]["constants"][:2]] == [bool, bool]


def test_a_string_that_is_not_utf8_is_an_error_with_its_pointer(seed_example):
    trace = copy.deepcopy(seed_example)
    trace["events"][1]["content_ref"] = "half a pair \ud800"
    with pytest.raises(TraceValidationError, match="UTF-8") as error:
        masreplay.load_traces(trace)
    assert error.value.trace_id == trace["trace_id"]
    assert error.value.path == "/events/1/content_ref"
    # Python's error from the string was cleared, not left pending for the next call.
    assert len(masreplay.load_traces([seed_example] * 3)) == 3


def test_a_value_that_empties_the_trace_while_read_is_read_from_the_snapshot(seed_example):
    """The trace is read in place until a value that runs Python code; then it is read again
    from snapshots, so that the code emptying the trace's own dict changes nothing read."""
    trace = copy.deepcopy(seed_example)
    expected = copy.deepcopy(seed_example)
    trace["costs"]["late"] = Empties(trace)
    expected["costs"]["late"] = 1.0
    trace["after"] = {"a": 1, "b": Empties(trace["events"][0]), "c": [3]}
    expected["after"] = {"a": 1, "b": 1.0, "c": [3]}
    assert masreplay.load_traces(trace)[0] == masreplay.load_traces(expected)[0]
    assert trace == {}
