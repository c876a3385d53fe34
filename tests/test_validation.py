"""Bad input: every class of broken trace raises TraceValidationError naming the trace, a JSON
pointer and the reason, through every input path; nothing is half-loaded."""

from __future__ import annotations

import copy
import itertools
import json
import pickle
import re
from collections.abc import Callable

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import masreplay
from masreplay import DataFormatError, MasreplayError, TraceValidationError
from strategies import CANONICAL_COLUMNS, REQUIRED_COLUMNS, traces

SEED_ID = "demo-trace-001"
NAN, INF = float("nan"), float("inf")


def check_error(error: TraceValidationError, trace_id: str | None, path: str, reason: str) -> None:
    assert isinstance(error, TraceValidationError)
    assert isinstance(error, ValueError)
    assert isinstance(error, MasreplayError)
    assert error.trace_id == trace_id
    assert error.path == path
    assert reason.lower() in error.reason.lower(), f"{reason!r} not in {error.reason!r}"
    # The message names all three.
    message = str(error)
    assert repr(trace_id) in message or str(trace_id) in message
    assert (path or "/") in message
    assert error.reason in message


def raises(source, **kwargs) -> TraceValidationError:
    with pytest.raises(TraceValidationError) as info:
        masreplay.load_traces(source, **kwargs)
    return info.value


# ---- mutations of the seed example ------------------------------------------------------


def delete(*keys) -> Callable[[dict], None]:
    def apply(trace: dict) -> None:
        target = trace
        for key in keys[:-1]:
            target = target[key]
        del target[keys[-1]]

    return apply


def assign(*keys_and_value) -> Callable[[dict], None]:
    *keys, value = keys_and_value

    def apply(trace: dict) -> None:
        target = trace
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = copy.deepcopy(value)

    return apply


def add_edge(src: str, dst: str, kind: str = "causal") -> Callable[[dict], None]:
    return lambda trace: trace["edges"].append({"src": src, "dst": dst, "type": kind})


# (case id, mutation, trace_id in the error, path, reason substring)
CASES = [
    # missing required fields, top level
    ("missing trace_id", delete("trace_id"), None, "/trace_id", 'missing required field "trace_id"'),
    ("missing task_id", delete("task_id"), SEED_ID, "/task_id", 'missing required field "task_id"'),
    ("missing events", delete("events"), SEED_ID, "/events", 'missing required field "events"'),
    ("missing edges", delete("edges"), SEED_ID, "/edges", 'missing required field "edges"'),
    ("missing rewards", delete("rewards"), SEED_ID, "/rewards", 'missing required field "rewards"'),
    ("missing costs", delete("costs"), SEED_ID, "/costs", 'missing required field "costs"'),
    # missing required fields, events / costs / edges
    ("missing event id", delete("events", 2, "id"), SEED_ID, "/events/2/id", 'missing required field "id"'),
    ("missing event t", delete("events", 2, "t"), SEED_ID, "/events/2/t", 'missing required field "t"'),
    ("missing event type", delete("events", 2, "type"), SEED_ID, "/events/2/type", 'missing required field "type"'),
    ("missing event agent", delete("events", 2, "agent"), SEED_ID, "/events/2/agent", 'missing required field "agent"'),
    ("missing costs.tokens", delete("costs", "tokens"), SEED_ID, "/costs/tokens", 'missing required field "tokens"'),
    (
        "missing costs.wall_clock_s",
        delete("costs", "wall_clock_s"),
        SEED_ID,
        "/costs/wall_clock_s",
        'missing required field "wall_clock_s"',
    ),
    ("missing edge src", delete("edges", 1, "src"), SEED_ID, "/edges/1/src", 'missing required field "src"'),
    ("missing edge dst", delete("edges", 1, "dst"), SEED_ID, "/edges/1/dst", 'missing required field "dst"'),
    ("missing edge type", delete("edges", 1, "type"), SEED_ID, "/edges/1/type", 'missing required field "type"'),
    # wrong value types
    ("trace_id not a string", assign("trace_id", 5), None, "/trace_id", "expected a string, got a number"),
    ("empty trace_id", assign("trace_id", ""), None, "/trace_id", "non-empty string"),
    ("task_id null", assign("task_id", None), SEED_ID, "/task_id", "expected a string, got null"),
    ("system not a string", assign("system", 3), SEED_ID, "/system", "expected a string"),
    ("events not an array", assign("events", {}), SEED_ID, "/events", "expected an array, got an object"),
    ("no events", assign("events", []), SEED_ID, "/events", "at least one event"),
    ("event not an object", assign("events", 1, "spawn"), SEED_ID, "/events/1", "expected an object, got a string"),
    ("t a string", assign("events", 0, "t", "1"), SEED_ID, "/events/0/t", "expected a number, got a string"),
    ("t a boolean", assign("events", 0, "t", True), SEED_ID, "/events/0/t", "expected a number, got a boolean"),
    ("agent empty", assign("events", 4, "agent", ""), SEED_ID, "/events/4/agent", "non-empty string"),
    ("role a number", assign("events", 0, "role", 7), SEED_ID, "/events/0/role", "expected a string"),
    ("trusted a number", assign("events", 3, "trusted", 1), SEED_ID, "/events/3/trusted", "expected a boolean, got a number"),
    ("tokens fractional", assign("events", 0, "tokens", 1.5), SEED_ID, "/events/0/tokens", "expected an integer"),
    ("tokens negative", assign("events", 0, "tokens", -3), SEED_ID, "/events/0/tokens", "negative"),
    ("duration negative", assign("events", 0, "duration_s", -0.5), SEED_ID, "/events/0/duration_s", "negative"),
    ("logprob positive", assign("events", 0, "logprob", 0.5), SEED_ID, "/events/0/logprob", "positive"),
    ("event reward not a map", assign("events", 0, "reward", 1.0), SEED_ID, "/events/0/reward", "expected an object"),
    ("edges not an array", assign("edges", "e1->e2"), SEED_ID, "/edges", "expected an array, got a string"),
    ("edge src a number", assign("edges", 0, "src", 1), SEED_ID, "/edges/0/src", "expected a string"),
    ("rewards an array", assign("rewards", [1.0]), SEED_ID, "/rewards", "expected an object, got an array"),
    ("reward a string", assign("rewards", "team", "1.0"), SEED_ID, "/rewards/team", "expected a number, got a string"),
    ("costs a number", assign("costs", 5), SEED_ID, "/costs", "expected an object, got a number"),
    ("metric null", assign("metrics", "task_success", None), SEED_ID, "/metrics/task_success", "expected a number, got null"),
    # closed vocabularies
    ("unknown event type", assign("events", 3, "type", "telepathy"), SEED_ID, "/events/3/type", 'unknown value "telepathy"'),
    ("unknown edge type", assign("edges", 2, "type", "wormhole"), SEED_ID, "/edges/2/type", 'unknown value "wormhole"'),
    ("bad topology", assign("topology", "star"), SEED_ID, "/topology", 'unknown value "star"'),
    (
        "bad counterfactual kind",
        assign("counterfactual_of", {"trace_id": "x", "event_id": "e1", "kind": "nope"}),
        SEED_ID,
        "/counterfactual_of/kind",
        'unknown value "nope"',
    ),
    ("unsupported schema_version", assign("schema_version", 99), SEED_ID, "/schema_version", "unsupported schema_version 99"),
    ("negative policy_version", assign("policy_version", -1), SEED_ID, "/policy_version", "negative"),
    # identity and references
    (
        "duplicate event id",
        assign("events", 4, "id", "e2"),
        SEED_ID,
        "/events/4/id",
        'duplicate event id "e2" (first used by /events/1)',
    ),
    (
        "edge names a missing event",
        assign("edges", 0, "dst", "e99"),
        SEED_ID,
        "/edges/0/dst",
        'edge names event "e99", which is not in /events',
    ),
    ("edge with an extra key", assign("edges", 0, "weight", 0.5), SEED_ID, "/edges/0/weight", 'unknown edge key "weight"'),
    ("self-loop", add_edge("e5", "e5"), SEED_ID, "/edges/8", 'self-loop on event "e5"'),
    # numbers out of their domain
    ("negative t", assign("events", 2, "t", -1), SEED_ID, "/events/2/t", "negative"),
    ("negative tokens cost", assign("costs", "tokens", -1), SEED_ID, "/costs/tokens", "negative"),
    ("negative wall clock", assign("costs", "wall_clock_s", -0.5), SEED_ID, "/costs/wall_clock_s", "negative"),
    ("negative tool_calls", assign("costs", "tool_calls", -2), SEED_ID, "/costs/tool_calls", "negative"),
    ("negative extra cost", assign("costs", "gpu_hours", -2), SEED_ID, "/costs/gpu_hours", "negative"),
]


@pytest.mark.parametrize(("mutate", "trace_id", "path", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.parametrize("form", ["dict", "json text", "json bytes", "validate"])
def test_bad_trace_is_rejected_with_trace_id_path_and_reason(seed_example, form, mutate, trace_id, path, reason):
    trace = copy.deepcopy(seed_example)
    mutate(trace)
    if form == "dict":
        error = raises(trace)
    elif form == "json text":
        error = raises(json.dumps(trace))
    elif form == "json bytes":
        error = raises(json.dumps(trace, indent=2).encode())
    else:
        with pytest.raises(TraceValidationError) as info:
            masreplay.validate(trace)
        error = info.value
    check_error(error, trace_id, path, reason)


NON_FINITE = [
    ("rewards", ("rewards", "team"), "/rewards/team"),
    ("costs", ("costs", "tokens"), "/costs/tokens"),
    ("costs extra", ("costs", "gpu_hours"), "/costs/gpu_hours"),
    ("metrics", ("metrics", "protocol_overhead"), "/metrics/protocol_overhead"),
    ("event t", ("events", 5, "t"), "/events/5/t"),
    ("event reward", ("events", 1, "reward"), None),
    ("event attribute", ("events", 1, "score"), "/events/1/score"),
    ("escaped key", ("rewards", "a/b~c"), "/rewards/a~1b~0c"),
]


@pytest.mark.parametrize("value", [NAN, INF, -INF], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize(("keys", "path"), [c[1:] for c in NON_FINITE], ids=[c[0] for c in NON_FINITE])
def test_non_finite_numbers_in_a_dict_are_rejected_at_their_path(seed_example, keys, path, value):
    trace = copy.deepcopy(seed_example)
    if path is None:  # a per-event reward map
        trace["events"][1]["reward"] = {"verifier": value}
        path = "/events/1/reward/verifier"
    else:
        assign(*keys, value)(trace)
    error = raises(trace)
    check_error(error, SEED_ID, path, "not a finite number")
    assert repr(value).lower().lstrip("-") in error.reason.lower()


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_in_json_text_get_a_clear_message(seed_example, token):
    text = json.dumps(seed_example).replace('"team": 1.0', f'"team": {token}')
    assert token in text
    for source in (text, text.encode()):
        error = raises(source)
        # The document is readable but for the literal: the error names the trace and the value.
        check_error(error, SEED_ID, "/rewards/team", f"{token} is not a JSON number")


def test_python_json_dumps_of_a_nan_trace_is_rejected(seed_example):
    trace = copy.deepcopy(seed_example)
    trace["metrics"]["task_success"] = NAN
    error = raises(json.dumps(trace))  # json.dumps writes NaN, which is not JSON
    check_error(error, SEED_ID, "/metrics/task_success", "NaN is not a JSON number")


def test_cycle_is_rejected_and_the_reason_names_its_events(seed_example):
    trace = copy.deepcopy(seed_example)
    trace["edges"].append({"src": "e7", "dst": "e4", "type": "causal"})  # e4 -> e5 -> e6 -> e7 -> e4
    for source in (trace, json.dumps(trace)):
        error = raises(source)
        assert error.trace_id == SEED_ID
        assert "cycle" in error.reason
        named = re.findall(r'"([^"]+)"', error.reason)
        assert set(named) == {"e4", "e5", "e6", "e7"}
        assert named[0] == named[-1]  # read as a closed walk
        pairs = {(e["src"], e["dst"]) for e in trace["edges"]}
        assert all((a, b) in pairs for a, b in itertools.pairwise(named)), named
        match = re.fullmatch(r"/edges/(\d+)", error.path)
        assert match, error.path
        edge = trace["edges"][int(match.group(1))]
        assert edge["src"] in named and edge["dst"] in named


@given(st.data())
@settings(max_examples=40)
def test_any_back_edge_makes_a_cycle(data):
    trace = data.draw(traces(min_events=2, masreplay_fields=False))
    events = trace["events"]
    # A path 0 -> 1 -> ... -> k plus the edge k -> j (j <= k) closes a cycle.
    k = data.draw(st.integers(min_value=1, max_value=len(events) - 1))
    j = data.draw(st.integers(min_value=0, max_value=k - 1))
    trace["edges"] = [{"src": events[i]["id"], "dst": events[i + 1]["id"], "type": "temporal"} for i in range(k)]
    trace["edges"].append({"src": events[k]["id"], "dst": events[j]["id"], "type": "causal"})
    error = raises(trace)
    assert error.trace_id == trace["trace_id"]
    assert "cycle" in error.reason
    assert error.path.startswith("/edges/")


def test_extra_top_level_key_is_kept_by_default_and_rejected_in_strict_mode(seed_example):
    trace = dict(copy.deepcopy(seed_example), annotator="alice")
    assert masreplay.load_traces(trace)[0]["annotator"] == "alice"
    for source in (trace, json.dumps(trace)):
        error = raises(source, strict_seed=True)
        check_error(error, SEED_ID, "/annotator", 'unknown top-level key "annotator"')


@pytest.mark.parametrize("key", ["schema_version", "group_id", "policy_version"])
def test_masreplay_additions_are_not_seed_schema(seed_example, key):
    value = {"schema_version": 1, "group_id": "g", "policy_version": 3}[key]
    trace = dict(copy.deepcopy(seed_example), **{key: value})
    masreplay.validate(trace)
    check_error(raises(trace, strict_seed=True), SEED_ID, f"/{key}", "unknown top-level key")


def test_strict_mode_accepts_the_seed_example(seed_example):
    masreplay.validate(seed_example, strict_seed=True)


# ---- documents that are not traces ------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ('{"trace_id": "t", ', "invalid JSON"),
        (b"[", "invalid JSON"),
        ("", "empty document"),
        ("   \n", "empty document"),
        (b"", "empty document"),
        (b"\xff\xfe\x00{", "not valid UTF-8"),
        ("[1, 2]", "a trace must be a JSON object, got a number"),
        (b'"a string"', "a trace must be a JSON object, got a string"),
        (b"null", "a trace must be a JSON object, got null"),
        ("[[]]", "a trace must be a JSON object, got an array"),
    ],
    ids=[
        "truncated",
        "open bracket",
        "empty str",
        "blank str",
        "empty bytes",
        "binary",
        "array of ints",
        "string",
        "null",
        "nested array",
    ],
)
def test_input_that_holds_no_trace(source, reason):
    error = raises(source)
    check_error(error, None, "", reason)


def test_non_utf8_bytes_inside_a_string(seed_example):
    data = json.dumps(seed_example).encode().replace(b'"lead"', b'"l\xffad"')
    check_error(raises(data), None, "", "not valid UTF-8")


def test_list_of_ints_is_rejected_per_position():
    error = raises([1, 2])
    check_error(error, None, "", "a trace must be a JSON object, got a number")
    batch = masreplay.load_traces([1, "x", None], on_error="skip")
    assert len(batch) == 0
    assert [(position, trace_id) for position, trace_id, _ in batch.rejected] == [(0, None), (1, None), (2, None)]
    assert "got null" in batch.rejected[2][2].reason


@pytest.mark.parametrize("source", [None, 42, 4.5, object()], ids=["None", "int", "float", "object"])
def test_wrong_top_level_type_is_a_type_error(source):
    with pytest.raises(TypeError, match="load_traces takes"):
        masreplay.load_traces(source)


def test_python_values_that_are_not_json(seed_example):
    trace = copy.deepcopy(seed_example)
    trace["events"][2]["extra"] = {1: "int key"}
    check_error(raises(trace), SEED_ID, "/events/2/extra", "keys must be strings")
    trace["events"][2]["extra"] = {"when": object()}
    check_error(raises(trace), SEED_ID, "/events/2/extra/when", "not a JSON value")


def test_missing_file_is_a_storage_error(tmp_path):
    for name in ("missing.json", "missing.jsonl", "missing.parquet"):
        with pytest.raises(masreplay.StorageError) as info:
            masreplay.load_traces(tmp_path / name)
        assert isinstance(info.value, OSError)
        assert name in str(info.value)
    empty_directory = tmp_path / "empty"
    empty_directory.mkdir()
    with pytest.raises(masreplay.StorageError):
        masreplay.load_traces(empty_directory)


def test_on_error_must_be_raise_or_skip(seed_example):
    with pytest.raises(ValueError, match="on_error"):
        masreplay.load_traces(seed_example, on_error="ignore")


# ---- skip, atomicity, pickling ---------------------------------------------------------


def five_traces(seed_example) -> list[dict]:
    """Valid at positions 0, 2, 4; invalid at 1 (unknown event type) and 3 (negative cost)."""
    out = []
    for i in range(5):
        trace = copy.deepcopy(seed_example)
        trace["trace_id"] = f"t{i}"
        out.append(trace)
    out[1]["events"][3]["type"] = "telepathy"
    out[3]["costs"]["wall_clock_s"] = -1
    return out


EXPECTED_REJECTED = [(1, "t1", "/events/3/type", "unknown value"), (3, "t3", "/costs/wall_clock_s", "negative")]


def sources(items: list[dict]) -> dict[str, object]:
    return {
        "dicts": items,
        "json array": json.dumps(items),
        "json lines": "\n".join(json.dumps(t) for t in items).encode(),
        "concatenated json": "".join(json.dumps(t, indent=1) for t in items),
    }


@pytest.mark.parametrize("form", list(sources([])))
def test_skip_returns_the_valid_traces_and_reports_the_rejected(seed_example, form):
    source = sources(five_traces(seed_example))[form]
    batch = masreplay.load_traces(source, on_error="skip")
    assert batch.trace_ids == ["t0", "t2", "t4"]
    assert len(batch.rejected) == 2
    for (position, trace_id, error), want in zip(batch.rejected, EXPECTED_REJECTED, strict=True):
        want_position, want_id, path, reason = want
        assert (position, trace_id) == (want_position, want_id)
        check_error(error, want_id, path, reason)
    # The kept traces are whole and right.
    assert [t["trace_id"] for t in batch] == ["t0", "t2", "t4"]
    assert batch.event_offsets.tolist() == [0, 8, 16, 24]


@pytest.mark.parametrize("form", list(sources([])))
def test_raise_returns_nothing_and_names_the_first_bad_trace(seed_example, form):
    items = five_traces(seed_example)
    snapshot = copy.deepcopy(items)
    result = None
    with pytest.raises(TraceValidationError) as info:
        result = masreplay.load_traces(sources(items)[form])
    assert result is None
    check_error(info.value, "t1", "/events/3/type", "unknown value")
    assert items == snapshot  # the input is left as it was


def test_validate_checks_every_trace(seed_example):
    items = five_traces(seed_example)
    with pytest.raises(TraceValidationError) as info:
        masreplay.validate(items)
    assert info.value.trace_id == "t1"
    masreplay.validate([items[0], items[2]])


def test_json_lines_syntax_error_costs_only_its_line(seed_example):
    lines = [json.dumps(dict(seed_example, trace_id=f"t{i}")) for i in range(3)]
    lines[1] = lines[1].replace('"team": 1.0', '"team": NaN')
    batch = masreplay.load_traces("\n".join(lines).encode(), on_error="skip")
    assert batch.trace_ids == ["t0", "t2"]
    [(position, trace_id, error)] = batch.rejected
    # The line is readable but for the literal: the error names its trace and the value.
    assert (position, trace_id, error.path) == (1, "t1", "/rewards/team")
    assert "line 2" in error.reason and "NaN is not a JSON number" in error.reason


def test_json_lines_with_a_broken_first_line_keeps_the_other_lines(seed_example, tmp_path):
    """A .jsonl file whose first line is not valid JSON is still JSON Lines: the error costs
    that line only, and the valid lines load with on_error='skip'."""
    lines = [json.dumps(dict(seed_example, trace_id=f"t{i}")) for i in range(3)]
    lines[0] = lines[0].replace('"team": 1.0', '"team": NaN')
    path = tmp_path / "traces.jsonl"
    path.write_text("\n".join(lines) + "\n")
    batch = masreplay.load_traces(path, on_error="skip")
    assert [position for position, _, _ in batch.rejected] == [0]
    assert batch.trace_ids == ["t1", "t2"]


def test_errors_pickle_with_their_attributes(seed_example):
    trace = copy.deepcopy(seed_example)
    trace["events"][3]["type"] = "telepathy"
    error = raises(trace)
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        again = pickle.loads(pickle.dumps(error, protocol=protocol))
        assert type(again) is TraceValidationError
        assert (again.trace_id, again.path, again.reason) == (error.trace_id, error.path, error.reason)
        assert str(again) == str(error)
    unnamed = pickle.loads(pickle.dumps(raises("[1]")))
    assert (unnamed.trace_id, unnamed.path) == (None, "")
    assert "trace None at /" in str(unnamed)


def test_rejected_report_pickles(seed_example):
    batch = masreplay.load_traces(five_traces(seed_example), on_error="skip")
    again = pickle.loads(pickle.dumps(batch.rejected))
    assert [(p, i, e.path, e.reason) for p, i, e in again] == [(p, i, e.path, e.reason) for p, i, e in batch.rejected]


# ---- Arrow input -----------------------------------------------------------------------


def _nullable_type(data_type: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(data_type):
        return pa.struct([_nullable_field(field) for field in data_type])
    if pa.types.is_list(data_type):
        return pa.list_(_nullable_field(data_type.value_field))
    return data_type


def _nullable_field(field: pa.Field) -> pa.Field:
    return pa.field(field.name, _nullable_type(field.type), nullable=True)


@pytest.fixture
def arrow_traces(seed_example):
    """A valid three-trace table and its rows as Python objects (maps as lists of pairs)."""
    items = [dict(copy.deepcopy(seed_example), trace_id=f"t{i}") for i in range(3)]
    table = masreplay.load_traces(items).to_arrow()
    return table, table.to_pylist()


def rebuild(table: pa.Table, rows: list[dict], *, nullable: bool = False) -> pa.Table:
    """The table of ``rows`` with the canonical schema (or one where every field may be null,
    so that a null is a value to report rather than a schema violation).

    The counterfactual_of column is carried over from the original table: pyarrow writes an
    all-null struct with an empty kind dictionary, which trips a separate bug (see
    test_pyarrow_rebuilt_table_without_counterfactuals_loads).
    """
    schema = pa.schema([_nullable_field(f) for f in table.schema]) if nullable else table.schema
    rebuilt = pa.Table.from_pylist(rows, schema=schema)
    index = schema.get_field_index("counterfactual_of")
    original = table.column("counterfactual_of").cast(schema.field("counterfactual_of").type)
    return rebuilt.set_column(index, schema.field("counterfactual_of"), original)


def test_arrow_rebuilt_from_rows_is_accepted(arrow_traces):
    table, rows = arrow_traces
    for nullable in (False, True):
        batch = masreplay.load_traces(rebuild(table, rows, nullable=nullable))
        assert list(batch) == list(masreplay.load_traces(table))


ARROW_CASES = [
    ("unknown event type", lambda r: r[1]["events"][3].update(type="telepathy"), "/events/3/type", 'unknown value "telepathy"'),
    ("unknown edge type", lambda r: r[1]["edges"][2].update(type="wormhole"), "/edges/2/type", 'unknown value "wormhole"'),
    ("bad topology", lambda r: r[1].update(topology="star"), "/topology", 'unknown value "star"'),
    ("negative t", lambda r: r[1]["events"][3].update(t=-2.0), "/events/3/t", "negative"),
    ("NaN t", lambda r: r[1]["events"][3].update(t=NAN), "/events/3/t", "not a finite number"),
    ("null t", lambda r: r[1]["events"][3].update(t=None), "/events/3/t", "missing required field"),
    ("null agent", lambda r: r[1]["events"][3].update(agent=None), "/events/3/agent", "missing required field"),
    ("empty agent", lambda r: r[1]["events"][3].update(agent=""), "/events/3/agent", "non-empty"),
    ("null event type", lambda r: r[1]["events"][3].update(type=None), "/events/3/type", "missing required field"),
    ("duplicate id", lambda r: r[1]["events"][3].update(id="e1"), "/events/3/id", 'duplicate event id "e1"'),
    ("edge index out of range", lambda r: r[1]["edges"][2].update(dst=99), "/edges/2/dst", "out of range"),
    ("negative edge index", lambda r: r[1]["edges"][2].update(src=-1), "/edges/2/src", "negative"),
    ("null edge src", lambda r: r[1]["edges"][2].update(src=None), "/edges/2/src", "missing required field"),
    ("self-loop", lambda r: r[1]["edges"].append({"src": 4, "dst": 4, "type": "causal"}), "/edges/8", 'self-loop on event "e5"'),
    ("cycle", lambda r: r[1]["edges"].append({"src": 6, "dst": 3, "type": "causal"}), None, "cycle"),
    ("no events", lambda r: r[1].update(events=[], edges=[]), "/events", "at least one event"),
    ("infinite reward", lambda r: r[1]["rewards"].append(("bonus", INF)), "/rewards/bonus", "not a finite number"),
    ("negative cost", lambda r: r[1]["costs"].update(tokens=-5.0), "/costs/tokens", "negative"),
    ("negative logprob rule", lambda r: r[1]["events"][0].update(logprob=0.25), "/events/0/logprob", "positive"),
    (
        "attributes not an object",
        lambda r: r[1]["events"][0].update(attributes="[1]"),
        "/events/0/attributes",
        "JSON text of an object",
    ),
    ("empty task_id", lambda r: r[1].update(task_id=""), "/task_id", "non-empty"),
]


# A null in a field that the canonical schema declares non-nullable makes the table itself
# inconsistent; those cases run with a schema whose fields may all be null.
NULL_CASES = {"null t", "null agent", "null event type", "null edge src"}
ARROW_PARAMS = [
    pytest.param(corrupt, path, reason, nullable, id=f"{name}-{'nullable' if nullable else 'canonical'} schema")
    for name, corrupt, path, reason in ARROW_CASES
    for nullable in ((True,) if name in NULL_CASES else (True, False))
]


@pytest.mark.parametrize(("corrupt", "path", "reason", "nullable"), ARROW_PARAMS)
def test_corrupt_arrow_trace_is_rejected_at_its_path(arrow_traces, corrupt, path, reason, nullable):
    table, rows = arrow_traces
    corrupted = copy.deepcopy(rows)
    corrupt(corrupted)
    source = rebuild(table, corrupted, nullable=nullable)
    error = raises(source)
    assert error.trace_id == "t1"
    if path is None:
        assert error.path.startswith("/edges/")
    else:
        assert error.path == path
    assert reason in error.reason
    batch = masreplay.load_traces(source, on_error="skip")
    assert batch.trace_ids == ["t0", "t2"]
    assert [(p, i, e.path) for p, i, e in batch.rejected] == [(1, "t1", error.path)]
    assert list(batch) == [masreplay.load_traces(table)[0], masreplay.load_traces(table)[2]]


@pytest.mark.parametrize("field", ["agent", "trace_id"])
def test_null_in_a_non_nullable_canonical_field_is_a_masreplay_error(arrow_traces, field):
    """Such a table contradicts its own schema; it must still fail inside the masreplay
    hierarchy (a ValueError), not with a bare TypeError or a panic."""
    table, rows = arrow_traces
    corrupted = copy.deepcopy(rows)
    if field == "agent":
        corrupted[1]["events"][3]["agent"] = None
    else:
        corrupted[1]["trace_id"] = None
    with pytest.raises(MasreplayError) as info:
        masreplay.load_traces(rebuild(table, corrupted))
    assert isinstance(info.value, ValueError)


def test_arrow_null_trace_id_is_reported_without_an_id(arrow_traces):
    table, rows = arrow_traces
    corrupted = copy.deepcopy(rows)
    corrupted[2]["trace_id"] = None
    batch = masreplay.load_traces(rebuild(table, corrupted, nullable=True), on_error="skip")
    assert batch.trace_ids == ["t0", "t1"]
    [(position, trace_id, error)] = batch.rejected
    assert (position, trace_id) == (2, None)
    check_error(error, None, "/trace_id", "missing required field")


def test_arrow_missing_required_column_is_reported(arrow_traces):
    table, _ = arrow_traces
    with pytest.raises(TraceValidationError) as info:
        masreplay.load_traces(table.drop_columns(["costs"]))
    assert info.value.path == "/costs"
    assert "missing required column" in info.value.reason
    # An empty table (no batch at all) has its columns checked as a full one does; it was
    # read as zero traces whatever its columns.
    with pytest.raises(TraceValidationError) as info:
        masreplay.load_traces(table.drop_columns(["costs"]).slice(0, 0).combine_chunks())
    assert "missing required column" in info.value.reason
    assert len(masreplay.load_traces(table.slice(0, 0))) == 0


def test_arrow_without_derived_or_optional_columns_is_completed(arrow_traces):
    table, _ = arrow_traces
    optional = [name for name in CANONICAL_COLUMNS if name not in REQUIRED_COLUMNS]
    batch = masreplay.load_traces(table.drop_columns(optional))
    assert batch.trace_ids == ["t0", "t1", "t2"]
    full = batch.to_arrow()
    assert full.column("group_id").to_pylist() == table.column("group_id").to_pylist()
    for name in ("n_events", "n_edges", "n_agents", "depth", "max_branching"):
        assert full.column(name).to_pylist() == table.column(name).to_pylist()


def test_arrow_derived_columns_are_recomputed_not_trusted(arrow_traces):
    table, _ = arrow_traces
    index = table.schema.get_field_index("depth")
    lying = table.set_column(index, table.schema.field("depth"), pa.array([99, 99, 99], pa.int32()))
    assert masreplay.load_traces(lying).to_arrow().column("depth").to_pylist() == [6, 6, 6]


def test_arrow_column_of_the_wrong_type_is_a_masreplay_error(arrow_traces):
    table, _ = arrow_traces
    index = table.schema.get_field_index("events")
    broken = table.set_column(index, "events", pa.array([1, 2, 3]))
    with pytest.raises(MasreplayError) as info:
        masreplay.load_traces(broken)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, (TraceValidationError, DataFormatError))
    assert "events" in str(info.value)


def test_pyarrow_rebuilt_table_without_counterfactuals_loads(arrow_traces):
    """pa.Table.from_pylist(batch.to_arrow().to_pylist(), schema=...) is the same data; with no
    counterfactual_of anywhere pyarrow gives the all-null struct an empty kind dictionary."""
    table, rows = arrow_traces
    rebuilt = pa.Table.from_pylist(rows, schema=table.schema)
    assert rebuilt.to_pylist() == rows
    batch = masreplay.load_traces(rebuilt)
    assert list(batch) == list(masreplay.load_traces(table))


@settings(max_examples=60)
@given(
    data=st.data(),
    kind=st.sampled_from(
        ["negative t", "unknown type", "empty agent", "dangling edge", "duplicate id", "nan reward", "bad logprob"]
    ),
)
def test_any_corrupted_generated_trace_is_rejected_at_its_path(data, kind):
    trace = data.draw(traces(min_events=2), label="trace")
    events = trace["events"]
    i = data.draw(st.integers(min_value=0, max_value=len(events) - 1), label="event")
    if kind == "negative t":
        events[i]["t"] = -data.draw(st.floats(min_value=1e-300, max_value=1e300))
        path, reason = f"/events/{i}/t", "negative"
    elif kind == "unknown type":
        events[i]["type"] = "x" + events[i]["type"]
        path, reason = f"/events/{i}/type", "unknown value"
    elif kind == "empty agent":
        events[i]["agent"] = ""
        path, reason = f"/events/{i}/agent", "non-empty"
    elif kind == "dangling edge":
        missing = "".join(e["id"] for e in events)  # longer than every id, so not one of them
        trace["edges"].append({"src": events[i]["id"], "dst": missing, "type": "causal"})
        path, reason = f"/edges/{len(trace['edges']) - 1}/dst", "which is not in /events"
    elif kind == "duplicate id":
        j = data.draw(st.integers(min_value=0, max_value=len(events) - 1).filter(lambda j: j != i), label="other")
        events[max(i, j)]["id"] = events[min(i, j)]["id"]
        # Edges named the overwritten id; keep only those that still resolve.
        ids = {e["id"] for e in events}
        trace["edges"] = [e for e in trace["edges"] if e["src"] in ids and e["dst"] in ids]
        path, reason = f"/events/{max(i, j)}/id", f"first used by /events/{min(i, j)}"
    elif kind == "nan reward":
        events[i]["reward"] = {"verifier": NAN}
        path, reason = f"/events/{i}/reward/verifier", "not a finite number"
    else:
        events[i]["logprob"] = data.draw(st.floats(min_value=1e-300, max_value=1e300))
        path, reason = f"/events/{i}/logprob", "positive"
    error = raises(trace)
    assert (error.trace_id, error.path) == (trace["trace_id"], path)
    assert reason in error.reason
    if kind != "nan reward":
        text_error = raises(json.dumps(trace))
        assert (text_error.trace_id, text_error.path, text_error.reason) == (error.trace_id, error.path, error.reason)


def test_arrow_unknown_counterfactual_kind_is_rejected_at_its_path(seed_example):
    of = {"trace_id": "x", "event_id": "e1", "kind": "ablate"}
    items = [dict(seed_example, trace_id=f"t{i}", counterfactual_of=of) for i in range(3)]
    table = masreplay.load_traces(items).to_arrow()
    rows = table.to_pylist()
    rows[1]["counterfactual_of"]["kind"] = "bogus"
    source = pa.Table.from_pylist(rows, schema=table.schema)
    batch = masreplay.load_traces(source, on_error="skip")
    assert batch.trace_ids == ["t0", "t2"]
    [(position, trace_id, error)] = batch.rejected
    assert (position, trace_id) == (1, "t1")
    check_error(error, "t1", "/counterfactual_of/kind", 'unknown value "bogus"')
