"""Round trips: every source masreplay reads gives back the traces it was given."""

from __future__ import annotations

import copy
import json

import polars as pl
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import masreplay
from masreplay.demo import SEED_EXAMPLE, bundled
from strategies import (
    EDGE_TYPES,
    EVENT_TYPES,
    derived_columns,
    expected_export,
    trace_lists,
    traces,
    typed,
)

DERIVED = ("n_events", "n_edges", "n_agents", "depth", "max_branching")

# The property tests below run the whole pipeline per example; keep them affordable.
roundtrip_settings = settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])


def assert_same_traces(batch: masreplay.TraceBatch, inputs: list[dict]) -> None:
    """The batch holds exactly ``inputs`` (as masreplay exports them), with right derived columns."""
    assert len(batch) == len(inputs)
    assert batch.trace_ids == [t["trace_id"] for t in inputs]
    got = list(batch)
    expected = [expected_export(t) for t in inputs]
    assert got == expected
    # == says 1 == 1.0; the typed text form also checks what kind of number came back.
    assert [typed(t) for t in got] == [typed(t) for t in expected]
    table = batch.to_arrow()
    assert table.select(list(DERIVED)).to_pylist() == [derived_columns(t) for t in inputs]


# ---- the seed example ------------------------------------------------------------------


def test_seed_example_round_trips_through_dict(seed_example):
    batch = masreplay.load_traces(seed_example)
    assert len(batch) == 1
    exported = batch[0]
    expected = dict(seed_example, schema_version=masreplay.SCHEMA_VERSION, group_id=seed_example["task_id"])
    # The file writes rewards like 1.0; whole numbers come back as ints, equal in value.
    expected["rewards"] = {"team": 1, "orchestration": 0.3, "tool": 0.1}
    assert exported == expected
    assert typed(exported) == typed(expected)


def test_seed_example_strict_export_equals_the_file(seed_example, seed_validator):
    batch = masreplay.load_traces(bundled(SEED_EXAMPLE), strict_seed=True)
    exported = batch.to_seed_json(0)
    assert exported == seed_example
    assert list(exported) == list(seed_example)  # also in the file's key order
    seed_validator.validate(exported)


def test_bundled_seed_example_is_the_published_one(seed_example):
    from conftest import SEED_SCHEMA_PATH

    published = json.loads((SEED_SCHEMA_PATH.parent / "example_trace.json").read_text(encoding="utf-8"))
    assert seed_example == published


def test_seed_example_derived_columns(seed_example):
    table = masreplay.load_traces(seed_example).to_arrow()
    row = table.select(list(DERIVED)).to_pylist()[0]
    # e1 -> e2 -> e4 -> e5 -> e6 -> e7 -> e8 is the longest path (6 edges); e1 spawns twice.
    # Agents: orchestrator, planner_1, executor_1 (browser.search only answers a tool call).
    assert row == {"n_events": 8, "n_edges": 8, "n_agents": 3, "depth": 6, "max_branching": 2}
    assert row == derived_columns(seed_example)


def test_seed_example_columnar_form(seed_example):
    batch = masreplay.load_traces(seed_example)
    table = batch.to_arrow()
    assert table.schema.metadata[b"masreplay.schema_version"] == str(masreplay.SCHEMA_VERSION).encode()
    edges = batch.edges()
    index = {e["id"]: i for i, e in enumerate(seed_example["events"])}
    assert edges.column("src").to_pylist() == [index[e["src"]] for e in seed_example["edges"]]
    assert edges.column("dst").to_pylist() == [index[e["dst"]] for e in seed_example["edges"]]
    assert edges.column("type").to_pylist() == [e["type"] for e in seed_example["edges"]]
    events = batch.events()
    assert events.column("id").to_pylist() == [e["id"] for e in seed_example["events"]]
    assert events.column("agent").to_pylist() == [e["agent"] for e in seed_example["events"]]
    assert events.column("trusted").to_pylist() == [e.get("trusted") for e in seed_example["events"]]
    assert pa.types.is_dictionary(events.schema.field("type").type)
    assert pa.types.is_dictionary(events.schema.field("agent").type)


def test_closed_vocabularies_use_fixed_codes():
    """Event and edge types are int8 codes over the whole vocabulary, the same in every batch."""
    events = [{"id": f"e{i}", "t": i, "type": kind, "agent": "a"} for i, kind in enumerate(reversed(EVENT_TYPES))]
    edges = [{"src": "e0", "dst": f"e{i + 1}", "type": kind} for i, kind in enumerate(reversed(EDGE_TYPES))]
    trace = {
        "trace_id": "t",
        "task_id": "k",
        "events": events,
        "edges": edges,
        "rewards": {},
        "costs": {"tokens": 0, "wall_clock_s": 0},
    }
    batch = masreplay.load_traces(trace)
    event_types = batch.events().column("type").combine_chunks()
    assert event_types.dictionary.to_pylist() == list(EVENT_TYPES)
    assert event_types.indices.to_pylist() == [EVENT_TYPES.index(kind) for kind in reversed(EVENT_TYPES)]
    edge_types = batch.edges().column("type").combine_chunks()
    assert edge_types.dictionary.to_pylist() == list(EDGE_TYPES)
    assert edge_types.indices.to_pylist() == [EDGE_TYPES.index(kind) for kind in reversed(EDGE_TYPES)]


def test_unknown_keys_are_kept_outside_strict_mode(seed_example):
    trace = copy.deepcopy(seed_example)
    trace["harness"] = {"name": "x", "nested": [1, 2.5, None, True]}
    trace["events"][0]["latency_ms"] = [3, {"deep": "yes"}]
    batch = masreplay.load_traces(trace)
    assert batch[0]["harness"] == trace["harness"]
    assert batch[0]["events"][0]["latency_ms"] == [3, {"deep": "yes"}]
    strict = batch.to_seed_json(0)
    assert "harness" not in strict
    assert strict["events"][0]["latency_ms"] == [3, {"deep": "yes"}]  # events may carry extra keys


def test_group_id_defaults_to_task_id_and_is_kept_when_given(seed_example):
    plain = masreplay.load_traces(seed_example)
    assert plain[0]["group_id"] == seed_example["task_id"]
    assert plain.to_arrow().column("group_id").to_pylist() == [seed_example["task_id"]]
    grouped = masreplay.load_traces(dict(seed_example, group_id="g-7"))
    assert grouped[0]["group_id"] == "g-7"
    assert grouped.to_arrow().column("group_id").to_pylist() == ["g-7"]


def test_whole_floats_come_back_as_ints_and_fractions_stay_floats(seed_example):
    trace = copy.deepcopy(seed_example)
    trace["events"][0]["t"] = 2.0
    trace["events"][1]["t"] = 2.5
    trace["costs"]["wall_clock_s"] = 1e17  # whole, but too large to be an exact JSON integer
    exported = masreplay.load_traces(trace)[0]
    assert type(exported["events"][0]["t"]) is int and exported["events"][0]["t"] == 2
    assert type(exported["events"][1]["t"]) is float and exported["events"][1]["t"] == 2.5
    assert exported["costs"]["wall_clock_s"] == 1e17


# ---- properties ------------------------------------------------------------------------


@roundtrip_settings
@given(traces(extra_top_level=True))
def test_generated_trace_round_trips_through_dict(trace):
    masreplay.validate(trace)
    assert_same_traces(masreplay.load_traces(trace), [trace])
    # A list of one dict is the same input.
    assert list(masreplay.load_traces([trace])) == [expected_export(trace)]


@roundtrip_settings
@given(trace_lists(extra_top_level=True), st.booleans())
def test_generated_traces_round_trip_through_json_text(batch_traces, ascii_only):
    text = json.dumps(batch_traces if len(batch_traces) > 1 else batch_traces[0], ensure_ascii=ascii_only)
    assert_same_traces(masreplay.load_traces(text), batch_traces)
    assert_same_traces(masreplay.load_traces(text.encode()), batch_traces)


@roundtrip_settings
@given(batch_traces=trace_lists(min_size=2, max_size=5, extra_top_level=True))
def test_generated_traces_round_trip_through_json_lines(tmp_path_factory, batch_traces):
    data = "\n".join(json.dumps(t, ensure_ascii=False) for t in batch_traces).encode() + b"\n"
    assert_same_traces(masreplay.load_traces(data), batch_traces)
    path = tmp_path_factory.mktemp("jsonl") / "traces.jsonl"
    path.write_bytes(data)
    assert_same_traces(masreplay.load_traces(path), batch_traces)
    assert_same_traces(masreplay.load_traces(str(path)), batch_traces)


@roundtrip_settings
@given(trace_lists(extra_top_level=True))
def test_generated_traces_round_trip_through_pyarrow(batch_traces):
    batch = masreplay.load_traces(batch_traces)
    table = batch.to_arrow()
    again = masreplay.load_traces(table)
    assert_same_traces(again, batch_traces)
    assert again.to_arrow().equals(table)
    # A TraceBatch and a bare RecordBatch are Arrow sources too.
    assert_same_traces(masreplay.load_traces(batch), batch_traces)
    assert_same_traces(masreplay.load_traces(table.combine_chunks().to_batches()[0]), batch_traces)


@roundtrip_settings
@given(trace_lists(extra_top_level=True))
def test_generated_traces_round_trip_through_polars(batch_traces):
    batch = masreplay.load_traces(batch_traces)
    frame = batch.to_polars()
    assert isinstance(frame, pl.DataFrame)
    assert frame.height == len(batch_traces)
    assert_same_traces(masreplay.load_traces(frame), batch_traces)


@roundtrip_settings
@given(batch_traces=trace_lists(min_size=2, max_size=5, extra_top_level=True), data=st.data())
def test_generated_traces_round_trip_through_parquet(tmp_path_factory, batch_traces, data):
    batch = masreplay.load_traces(batch_traces)
    directory = tmp_path_factory.mktemp("parquet")
    single = directory / "single.parquet"
    batch.write_parquet(single)
    from_file = masreplay.load_traces(single)
    assert_same_traces(from_file, batch_traces)
    assert from_file.to_arrow().equals(batch.to_arrow())
    # pyarrow reads the file with no masreplay code, dictionaries and all.
    import pyarrow.parquet as pq

    assert pq.read_table(single).column("trace_id").to_pylist() == batch.trace_ids

    split = data.draw(st.integers(min_value=1, max_value=len(batch_traces) - 1), label="split")
    parts = directory / "parts"
    parts.mkdir()
    batch[:split].write_parquet(parts / "part-0.parquet")
    batch[split:].write_parquet(parts / "part-1.parquet")
    assert sorted(p.name for p in parts.iterdir()) == ["part-0.parquet", "part-1.parquet"]
    assert_same_traces(masreplay.load_traces(parts), batch_traces)


@roundtrip_settings
@given(trace=traces(extra_top_level=True))
def test_seed_export_validates_against_the_seed_schema(seed_validator, trace):
    batch = masreplay.load_traces(trace)
    exported = batch.to_seed_json(0)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in seed_validator.iter_errors(exported)]
    assert errors == []
    assert exported == expected_export(trace, strict_seed=True)
    assert typed(exported) == typed(expected_export(trace, strict_seed=True))
    # ... and it reads back in strict mode as the same trace.
    again = masreplay.load_traces(exported, strict_seed=True)
    assert again.to_seed_json(0) == exported


@roundtrip_settings
@given(trace=traces(masreplay_fields=False))
def test_seed_shaped_traces_are_valid_for_both_validators(seed_validator, trace):
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in seed_validator.iter_errors(trace)]
    assert errors == []
    masreplay.validate(trace, strict_seed=True)
    batch = masreplay.load_traces(json.dumps(trace), strict_seed=True)
    assert batch.to_seed_json(0) == expected_export(trace, strict_seed=True)


@roundtrip_settings
@given(trace_lists(max_size=6))
def test_events_and_edges_tables_match_the_traces(batch_traces):
    batch = masreplay.load_traces(batch_traces)
    events = batch.events().to_pylist()
    edges = batch.edges().to_pylist()
    assert len(events) == batch.num_events == sum(len(t["events"]) for t in batch_traces)
    assert len(edges) == int(batch.edge_offsets[-1]) == sum(len(t["edges"]) for t in batch_traces)
    offsets = batch.event_offsets.tolist()
    edge_offsets = batch.edge_offsets.tolist()
    for i, trace in enumerate(batch_traces):
        rows = events[offsets[i] : offsets[i + 1]]
        assert [r["id"] for r in rows] == [e["id"] for e in trace["events"]]
        assert [r["type"] for r in rows] == [e["type"] for e in trace["events"]]
        assert {r["trace_index"] for r in rows} <= {i}
        assert {r["trace_id"] for r in rows} <= {trace["trace_id"]}
        index = {e["id"]: k for k, e in enumerate(trace["events"])}
        edge_rows = edges[edge_offsets[i] : edge_offsets[i + 1]]
        assert [(r["src"], r["dst"], r["type"]) for r in edge_rows] == [
            (index[e["src"]], index[e["dst"]], e["type"]) for e in trace["edges"]
        ]
        assert all(r["src"] != r["dst"] for r in edge_rows)


def test_empty_list_loads_as_an_empty_batch_with_the_canonical_schema(seed_example):
    empty = masreplay.load_traces([])
    assert len(empty) == 0
    assert empty.event_offsets.tolist() == [0]
    assert empty.to_arrow().schema.equals(masreplay.load_traces(seed_example).to_arrow().schema)


@pytest.mark.parametrize("layout", ["array", "concatenated", "jsonl"])
def test_json_layouts_hold_several_traces(seed_example, layout):
    traces_ = [dict(seed_example, trace_id=f"t{i}") for i in range(3)]
    if layout == "array":
        text = json.dumps(traces_, indent=2)
    elif layout == "concatenated":
        text = "".join(json.dumps(t, indent=1) for t in traces_)
    else:
        text = "\n".join(json.dumps(t) for t in traces_)
    assert masreplay.load_traces(text).trace_ids == ["t0", "t1", "t2"]


def test_numpy_scalars_in_dicts_are_numbers(seed_example):
    import numpy as np

    trace = copy.deepcopy(seed_example)
    trace["rewards"] = {"team": np.float64(0.75), "tool": np.float32(0.5), "count": np.int64(3)}
    trace["events"][0]["tokens"] = np.int32(12)
    exported = masreplay.load_traces(trace)[0]
    assert exported["rewards"] == {"team": 0.75, "tool": 0.5, "count": 3}
    assert exported["events"][0]["tokens"] == 12


def test_dict_and_json_text_agree_on_integers_beyond_64_bits(seed_example):
    """A number field holds an f64; an integer too wide for i64/u64 is still a JSON number.
    JSON text reads it as the nearest f64, and a dict holding the same integer must too."""
    value = 10**20
    trace = copy.deepcopy(seed_example)
    trace["rewards"]["team"] = value
    from_text = masreplay.load_traces(json.dumps(trace))[0]
    assert from_text["rewards"]["team"] == float(value)
    from_dict = masreplay.load_traces(trace)[0]
    assert from_dict == from_text


def test_a_batch_read_from_parquet_writes_again_with_pyarrow(tmp_path):
    # Branch rollouts beside factual traces: counterfactual_of is null on the factual rows. The
    # Parquet reader gave the struct's required children nulls of their own there, which
    # pyarrow's writer refuses ("declared non-nullable but contains nulls").
    import pyarrow.parquet as pq

    batch = masreplay.sim.branches(6, branches=2, seed=3).batch
    batch.write_parquet(tmp_path / "dump.parquet")
    table = masreplay.load_traces(tmp_path / "dump.parquet").to_arrow()
    pq.write_table(table, tmp_path / "again.parquet")
    assert masreplay.load_traces(tmp_path / "again.parquet").to_arrow().equals(batch.to_arrow())


def test_a_folder_of_parquet_files_with_different_optional_columns_loads_as_one(tmp_path):
    # One file written without the optional group_id: Arrow cannot join the files' own columns
    # (group_id required in one, absent in the other), so each is brought to the canonical
    # layout first; a rejected trace keeps its position across the files.
    import pyarrow.parquet as pq

    first = masreplay.sim.generate(4, seed=1)
    first.write_parquet(tmp_path / "a.parquet")
    second = masreplay.sim.generate(3, seed=2).to_arrow().drop_columns(["group_id"])
    rows = second.to_pylist()
    rows[1]["events"] = []
    pq.write_table(pa.Table.from_pylist(rows, schema=second.schema), tmp_path / "b.parquet")
    loaded = masreplay.load_traces(tmp_path, on_error="skip")
    assert [position for position, _, _ in loaded.rejected] == [5]
    expected = (
        first.to_arrow().to_pylist() + masreplay.load_traces(tmp_path / "b.parquet", on_error="skip").to_arrow().to_pylist()
    )
    assert loaded.to_arrow().to_pylist() == expected
