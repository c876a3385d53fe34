"""No input crashes the process (issue 22): deep and self-containing dicts, structurally broken
Arrow, corrupted Parquet, crafted pickled state, concurrent and killed saves, edited buffer
metadata, overflowing priorities, and what JSON syntax errors say.

Inputs that crashed the interpreter run in a subprocess, so a crash fails its test instead of
ending the run."""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import masreplay
from masreplay import GraphBuffer, TraceValidationError
from masreplay.batch import _from_ipc, _to_ipc
from masreplay.buffer import _buffer_from_ipc
from masreplay.errors import DataFormatError, InvalidArgumentError, MasreplayError

MAX_DEPTH = 100  # levels of objects and arrays in a trace, the trace object being level 1
PYTHON_PATH = str(Path(masreplay.__file__).resolve().parents[1])


def isolated(code: str) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter with this masreplay; a crash is its return code."""
    env = {**os.environ, "PYTHONPATH": PYTHON_PATH}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=120)


def assert_clean_exit(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr[-3000:]}"
    return result.stdout


def traces(n: int = 4, seed: int = 0) -> masreplay.TraceBatch:
    return masreplay.sim.generate(n, seed=seed)


def nested(levels: int) -> object:
    """A value of `levels` nested lists around a number."""
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


# ---- 1. Python dicts ------------------------------------------------------------------------
@pytest.mark.parametrize("via", ["load_traces", "convert.seed"])
def test_a_dict_that_contains_itself_is_an_error_not_a_crash(via):
    output = assert_clean_exit(
        isolated(f"""
            import json, masreplay, masreplay.convert
            from masreplay.demo import SEED_EXAMPLE, bundled
            trace = json.loads(bundled(SEED_EXAMPLE).read_text())
            trace["events"][0]["loop"] = trace
            read = masreplay.load_traces if {via!r} == "load_traces" else masreplay.convert.seed
            try:
                read(trace)
            except (masreplay.TraceValidationError, masreplay.ConversionError) as error:
                # a converter's failure is a ConversionError whose cause is the trace's error
                error = error.__cause__ if isinstance(error, masreplay.ConversionError) else error
                print(error.trace_id, error.path.split("/")[:4], "nests deeper" in error.reason)
        """)
    )
    assert output.split() == ["demo-trace-001", "['',", "'events',", "'0',", "'loop']", "True"]


def test_ten_thousand_levels_in_an_unknown_key_is_an_error_not_a_crash():
    output = assert_clean_exit(
        isolated("""
            import json, masreplay
            from masreplay.demo import SEED_EXAMPLE, bundled
            trace = json.loads(bundled(SEED_EXAMPLE).read_text())
            value = 1
            for _ in range(10_000):
                value = {"deeper": value}
            trace["extra"] = value
            try:
                masreplay.load_traces(trace)
            except masreplay.TraceValidationError as error:
                print(error.path.startswith("/extra"), "nests deeper than 100" in error.reason)
        """)
    )
    assert output.split() == ["True", "True"]


class Mutating:
    """A number whose conversion empties the dict being read."""

    def __init__(self, owner: dict) -> None:
        self.owner = owner

    def __float__(self) -> float:
        self.owner.clear()
        return 1.0

    def __index__(self) -> int:
        self.owner.clear()
        return 1


def test_a_value_that_mutates_its_dict_while_read_is_no_panic(seed_example):
    trace = copy.deepcopy(seed_example)
    trace["rewards"]["other"] = Mutating(trace["rewards"])
    trace["events"][0]["tokens"] = Mutating(trace["events"][0])
    # The snapshot of the items is read: no PanicException (a BaseException), a clean outcome.
    with contextlib.suppress(MasreplayError):
        masreplay.load_traces(trace)


def with_extra(seed_example: dict, levels: int) -> dict:
    """The seed trace with an unknown event key whose value makes the trace `levels` deep."""
    trace = copy.deepcopy(seed_example)
    trace["events"][0]["extra"] = nested(levels - 3)  # trace, events, event: 3 levels
    return trace


def test_one_depth_rule_for_every_input_form(seed_example, tmp_path):
    deepest = with_extra(seed_example, MAX_DEPTH)
    batch = masreplay.load_traces(deepest)
    assert masreplay.load_traces(json.dumps(deepest))[0] == batch[0]
    # What is accepted is read back from every form masreplay writes.
    assert masreplay.load_traces(batch.to_arrow())[0] == batch[0]
    batch.write_parquet(tmp_path / "deep.parquet")
    assert masreplay.load_traces(tmp_path / "deep.parquet")[0] == batch[0]
    buffer = GraphBuffer(10)
    buffer.add(batch)
    buffer.save(tmp_path / "deep_buffer.parquet")
    assert GraphBuffer.load(tmp_path / "deep_buffer.parquet").get(batch[0]["trace_id"]) == batch[0]
    assert pickle.loads(pickle.dumps(batch))[0] == batch[0]

    # One level more is refused in every form, at the same place.
    too_deep = with_extra(seed_example, MAX_DEPTH + 1)
    for source in (too_deep, json.dumps(too_deep)):
        with pytest.raises(TraceValidationError, match="nests deeper than 100") as error:
            masreplay.load_traces(source)
        assert error.value.path.startswith("/events/0/extra")
    attributes = json.dumps({"extra": nested(MAX_DEPTH - 2)})  # the event object is level 3
    table = edit_events(batch.to_arrow(), "attributes", lambda old: pa.array([attributes] * len(old), pa.string()))
    with pytest.raises(TraceValidationError, match="nests deeper than 100") as error:
        masreplay.load_traces(table)
    assert error.value.path == "/events/0/attributes/extra"


# ---- 2. Arrow input ---------------------------------------------------------------------------
def longer_dictionary(old: pa.DictionaryArray) -> pa.DictionaryArray:
    """The same values under an int8 dictionary of more than 256 entries (legal Arrow: keys
    reach only the first 128)."""
    vocabulary = pa.array(old.dictionary.to_pylist() + [f"unused-{i}" for i in range(300)])
    return pa.DictionaryArray.from_arrays(pa.array(old.indices.to_pylist(), pa.int8()), vocabulary)


def test_an_int8_dictionary_longer_than_256_values_is_read(seed_example):
    batch = masreplay.load_traces(seed_example)
    table = edit_events(batch.to_arrow(), "type", longer_dictionary)
    edges = table.column("edges").combine_chunks()
    names = list(edges.type.value_type)
    columns = [longer_dictionary(c) if f.name == "type" else c for f, c in zip(names, edges.values.flatten(), strict=True)]
    names = [pa.field(f.name, c.type, f.nullable) for f, c in zip(names, columns, strict=True)]
    struct = pa.StructArray.from_arrays(columns, fields=names)
    table = table.set_column(table.schema.get_field_index("edges"), "edges", pa.ListArray.from_arrays(edges.offsets, struct))
    index = table.schema.get_field_index("topology")
    table = table.set_column(index, "topology", longer_dictionary(table.column(index).combine_chunks()))
    assert masreplay.load_traces(table)[0] == batch[0]


BROKEN_ARROW = {
    "string offsets that go backwards": """
        ids = pa.Array.from_buffers(pa.string(), 2, [None, pa.py_buffer(np.array([0, 3, 1], np.int32)),
                                                     pa.py_buffer(b"ab\\xffd")])
        table = table.set_column(0, "trace_id", ids)
    """,
    "list offsets that go backwards": """
        events = table.column("events").combine_chunks()
        offsets = np.array(events.offsets.to_pylist(), np.int32)
        offsets[1], offsets[2] = offsets[2], offsets[1]
        broken = pa.Array.from_buffers(events.type, len(events), [None, pa.py_buffer(offsets)], children=[events.values])
        table = table.set_column(table.schema.get_field_index("events"), "events", broken)
    """,
    "dictionary keys outside the dictionary": """
        old = table.column("topology").combine_chunks()
        keys = pa.py_buffer(np.array([100, 0], np.int8))
        broken = pa.DictionaryArray.from_buffers(old.type, 2, [None, keys], old.dictionary)
        table = table.set_column(table.schema.get_field_index("topology"), "topology", broken)
    """,
}


@pytest.mark.parametrize("how", sorted(BROKEN_ARROW))
@pytest.mark.parametrize("into", ["load_traces", "GraphBuffer.add", "RecordBatchReader"])
def test_structurally_broken_arrow_is_a_data_format_error(how, into):
    output = assert_clean_exit(
        isolated(
            textwrap.dedent("""
            import numpy as np, pyarrow as pa, masreplay
            table = masreplay.sim.generate(2, seed=3).to_arrow()
            """)
            + textwrap.dedent(BROKEN_ARROW[how])
            + textwrap.dedent(f"""
            into = {into!r}
            try:
                if into == "load_traces":
                    masreplay.load_traces(table)
                elif into == "GraphBuffer.add":
                    masreplay.GraphBuffer(10).add(table)
                else:  # a C stream, which pyarrow does not validate on the way
                    reader = pa.RecordBatchReader.from_batches(table.schema, table.to_batches())
                    masreplay.load_traces(reader)
                print("accepted")
            except masreplay.errors.DataFormatError:
                print("DataFormatError")
            """)
        )
    )
    assert output.split() == ["DataFormatError"]


# ---- 3. Parquet -------------------------------------------------------------------------------
def test_flipped_bytes_in_a_parquet_footer_are_a_data_format_error_naming_the_file(tmp_path):
    path = tmp_path / "good.parquet"
    traces(20, seed=1).write_parquet(path)
    buffer = GraphBuffer(100)
    buffer.add(traces(20, seed=1))
    buffer.save(tmp_path / "buffer.parquet")
    for good in (path, tmp_path / "buffer.parquet"):
        data = good.read_bytes()
        bad = tmp_path / "bad.parquet"
        format_errors = []
        for position in range(len(data) - 1500, len(data) - 1400):
            for bit in (0x01, 0x10):
                corrupted = bytearray(data)
                corrupted[position] ^= bit
                bad.write_bytes(corrupted)
                for read in (masreplay.load_traces, GraphBuffer.load):
                    try:
                        read(bad)
                    except DataFormatError as error:
                        format_errors.append(str(error))
                    except TraceValidationError:
                        pass  # decoded, but the values broke a rule: also a clean rejection
        assert format_errors
        assert all(str(bad) in error for error in format_errors)


def test_a_parquet_decoder_panic_is_an_error_naming_the_file_and_prints_nothing(tmp_path, capfd):
    # The embedded Arrow schema of a one-column file says int32 has 7 bits: arrow-ipc panics
    # reading it (a dependency's bug, caught as a last resort). The caller gets the error; the
    # panic hook's report (a message and, with RUST_BACKTRACE, a backtrace) stays off stderr.
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"x": pa.array([1, 2], pa.int32())}), good)
    stored = pq.read_metadata(good).metadata[b"ARROW:schema"]
    raw = base64.b64decode(stored)
    assert raw.count(b"\x20\x00\x00\x00") == 1  # the bit width, 32
    crafted = base64.b64encode(raw.replace(b"\x20\x00\x00\x00", b"\x07\x00\x00\x00"))
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(good.read_bytes().replace(stored, crafted))
    capfd.readouterr()
    with pytest.raises(DataFormatError, match=r"bad\.parquet: the file is corrupted: the Parquet decoder panicked"):
        masreplay.load_traces(bad)
    assert "panicked" not in capfd.readouterr().err


# ---- 4. Pickled state -------------------------------------------------------------------------
def edit_events(table: pa.Table, field: str, edit) -> pa.Table:
    events = table.column("events").combine_chunks()
    flat = events.values.flatten()
    names = list(events.type.value_type)
    index = [f.name for f in names].index(field)
    columns = list(flat)
    columns[index] = edit(columns[index])
    names[index] = pa.field(field, columns[index].type, nullable=names[index].nullable)
    struct = pa.StructArray.from_arrays(columns, fields=names)
    return table.set_column(table.schema.get_field_index("events"), "events", pa.ListArray.from_arrays(events.offsets, struct))


def edit_edges_src(table: pa.Table, value: int) -> pa.Table:
    edges = table.column("edges").combine_chunks()
    flat = edges.values.flatten()
    names = list(edges.type.value_type)
    columns = [pa.array([value] * len(flat[0]), pa.int32()) if f.name == "src" else c for f, c in zip(names, flat, strict=True)]
    struct = pa.StructArray.from_arrays(columns, fields=names)
    return table.set_column(table.schema.get_field_index("edges"), "edges", pa.ListArray.from_arrays(edges.offsets, struct))


def crafted_states() -> dict[str, pa.Table]:
    table = traces(3, seed=5).to_arrow()
    return {
        "edges out of range": edit_edges_src(table, 10_000),
        "negative t": edit_events(table, "t", lambda t: pa.array([-1.0] * len(t), pa.float64())),
        "duplicate event ids": edit_events(table, "id", lambda ids: pa.array(["same"] * len(ids))),
        "n_events = -5": table.set_column(
            table.schema.get_field_index("n_events"), "n_events", pa.array([-5] * len(table), pa.int32())
        ),
        "agent keys out of range": edit_events(
            table,
            "agent",
            lambda agent: pa.DictionaryArray.from_buffers(
                agent.type, len(agent), [None, pa.py_buffer(bytes([120]) * len(agent) * 8)], agent.dictionary
            ),
        ),
    }


@pytest.mark.parametrize("name", sorted(crafted_states()))
def test_unpickling_crafted_state_raises_or_gives_valid_traces(name):
    table = crafted_states()[name]
    # n_events is derived: a wrong value is recomputed, never trusted.
    if name == "n_events = -5":
        batch = _from_ipc(_to_ipc(table))
        assert (
            list(batch.to_arrow().column("n_events").to_pylist()) == traces(3, seed=5).to_arrow().column("n_events").to_pylist()
        )
        return
    with pytest.raises(MasreplayError):
        _from_ipc(_to_ipc(table))
    buffer = GraphBuffer(100)
    buffer.add(traces(3, seed=5))
    persisted = pa.table(buffer._core.persisted())
    crafted = table.append_column("buffer_priority", persisted.column("buffer_priority"))
    crafted = crafted.replace_schema_metadata(persisted.schema.metadata)
    with pytest.raises(MasreplayError):
        _buffer_from_ipc(_to_ipc(crafted))


def test_pickled_state_that_is_not_arrow_is_a_data_format_error():
    data = pickle.dumps(traces(2))
    with pytest.raises(DataFormatError):
        _from_ipc(b"not an arrow stream")
    assert pickle.loads(data) is not None


# ---- 5. Saving and loading a buffer ---------------------------------------------------------------
def test_concurrent_saves_to_names_of_one_stem_do_not_mix(tmp_path):
    buffers = []
    for seed in (1, 2):
        buffer = GraphBuffer(1000)
        buffer.add(traces(300, seed=seed * 1000))
        buffers.append(buffer)
    targets = [tmp_path / "b.pq", tmp_path / "b.parquet"]
    for _ in range(3):
        threads = [threading.Thread(target=b.save, args=(t,)) for b, t in zip(buffers, targets, strict=True)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for buffer, target in zip(buffers, targets, strict=True):
            assert set(GraphBuffer.load(target).to_batch().trace_ids) == set(buffer.to_batch().trace_ids)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.parquet", "b.pq"]


def test_a_killed_save_leaves_a_temporary_file_that_load_ignores_and_the_next_save_removes(tmp_path):
    target = tmp_path / "buffer.parquet"
    buffer = GraphBuffer(100)
    buffer.add(traces(5))
    buffer.save(target)
    leftover = tmp_path / ".buffer.parquet.12345-0-00000000.masreplay-partial"
    leftover.write_bytes(b"half a file")
    old = time.time() - 3600
    os.utime(leftover, (old, old))
    assert len(GraphBuffer.load(target)) == 5
    buffer.save(target)
    assert not leftover.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["buffer.parquet"]


def test_a_save_killed_midway_never_damages_the_saved_file(tmp_path):
    target = tmp_path / "buffer.parquet"
    output = assert_clean_exit(
        isolated(f"""
            import os, signal, threading, masreplay
            buffer = masreplay.GraphBuffer(100_000)
            buffer.add(masreplay.sim.generate(20, seed=1))
            buffer.save({str(target)!r})
            buffer.add(masreplay.sim.generate(3000, seed=2))
            pid = os.fork()
            if pid == 0:
                buffer.save({str(target)!r})
                os._exit(0)
            import time; time.sleep(0.05)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            print(len(masreplay.GraphBuffer.load({str(target)!r})))
        """)
    )
    assert output.split()[0] in ("20", "3020")


def edited_save(tmp_path: Path, edit) -> Path:
    buffer = GraphBuffer(100)
    buffer.add(traces(5))
    path = tmp_path / "buffer.parquet"
    buffer.save(path)
    table = pq.read_table(path)
    metadata = dict(table.schema.metadata)
    state = json.loads(metadata[b"masreplay.buffer"])
    table, metadata, state = edit(table, metadata, state)
    metadata[b"masreplay.buffer"] = json.dumps(state).encode()
    pq.write_table(table.replace_schema_metadata(metadata), path)
    return path


def with_state(key, value):
    def edit(table, metadata, state):
        state[key] = value
        return table, metadata, state

    return edit


def null_priorities(table, metadata, state):
    index = table.schema.get_field_index("buffer_priority")
    nulls = pa.array([None] * len(table), pa.float64())
    return table.set_column(index, pa.field("buffer_priority", pa.float64()), nulls), metadata, state


def schema_version(table, metadata, state):
    metadata[b"masreplay.schema_version"] = b"99"
    return table, metadata, state


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (with_state("max_priority", -1), "max_priority"),
        (with_state("max_priority", 1e308), "max_priority"),
        (with_state("max_priority", "1.0"), "max_priority"),
        (with_state("capacity", 3), "more than its capacity"),
        (with_state("capacity", 0), "capacity"),
        (with_state("unit", "bytes"), "unit"),
        (null_priorities, "priority is null"),
        (schema_version, "schema_version 99"),
    ],
    ids=[
        "max_priority -1",
        "max_priority 1e308",
        "max_priority string",
        "capacity below the traces",
        "capacity 0",
        "unknown unit",
        "null priorities",
        "unknown schema_version",
    ],
)
def test_edited_buffer_metadata_is_a_clear_error(tmp_path, edit, reason):
    path = edited_save(tmp_path, edit)
    with pytest.raises(DataFormatError, match=reason) as error:
        GraphBuffer.load(path)
    assert str(path) in str(error.value)


# ---- 6. Priorities --------------------------------------------------------------------------------
def test_priorities_whose_sum_would_overflow_are_refused():
    buffer = GraphBuffer(10)
    batch = traces(2)
    buffer.add(batch)
    with pytest.raises(InvalidArgumentError, match="priorities are finite numbers from 0 to"):
        buffer.update_priorities(batch.trace_ids, [1e308, 1e308])
    assert list(buffer.priorities()) == [1.0, 1.0]  # all or nothing
    largest = 4.18e298  # below f64::MAX / 2**32: any 2**32 of them sum to a finite number
    buffer.update_priorities(batch.trace_ids, [largest, largest])
    sample = buffer.sample(4, sampler="prioritized", seed=1)
    assert list(sample.probabilities) == [0.5] * 4


# ---- 10. JSON syntax errors -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (b"hello, not json", "invalid JSON: expected value"),
        ('{"trace_id": "t", ', "ends before its value does"),
        ("[" * 200, "nests too deep"),
    ],
)
def test_a_syntax_error_says_what_is_wrong(text, reason):
    with pytest.raises(TraceValidationError) as error:
        masreplay.load_traces(text)
    assert reason in error.value.reason
    assert "NaN" not in error.value.reason


def test_a_nan_in_one_line_of_json_lines_names_its_trace_and_pointer(seed_example):
    good, bad = copy.deepcopy(seed_example), copy.deepcopy(seed_example)
    bad["trace_id"] = "with-nan"
    bad["events"][2]["duration_s"] = float("nan")
    text = json.dumps(good) + "\n" + json.dumps(bad) + "\n"
    report = masreplay.load_traces(text, on_error="skip")
    assert report.trace_ids == [good["trace_id"]]
    [(position, trace_id, error)] = report.rejected
    assert (position, trace_id, error.path) == (1, "with-nan", "/events/2/duration_s")
    assert "NaN is not a JSON number" in error.reason
    # In a JSON array too, the other traces are read as usual.
    array = json.dumps([good, bad])
    assert masreplay.load_traces(array, on_error="skip").rejected[0][2].path == "/events/2/duration_s"
