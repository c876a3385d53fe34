"""The TraceBatch API: shape, offsets, flattened tables, indexing, concat, Arrow/Polars, Parquet."""

from __future__ import annotations

import json
import pickle

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import masreplay
from masreplay import TraceBatch
from strategies import CANONICAL_COLUMNS, trace_lists


@pytest.fixture(scope="module")
def batch() -> TraceBatch:
    return masreplay.sim.generate(12, agents=(1, 5), group_size=3, seed=11)


def check_offsets_and_tables(batch: TraceBatch) -> None:
    n = len(batch)
    table = batch.to_arrow()
    for name, offsets, flat, count in (
        ("events", batch.event_offsets, batch.events(), "n_events"),
        ("edges", batch.edge_offsets, batch.edges(), "n_edges"),
    ):
        assert isinstance(offsets, np.ndarray), name
        assert offsets.dtype == np.int64, name
        assert offsets.shape == (n + 1,), name
        assert offsets[0] == 0
        assert np.all(np.diff(offsets) >= 0)
        assert offsets[-1] == flat.num_rows
        assert np.diff(offsets).tolist() == table.column(count).to_pylist()
        assert np.diff(offsets).tolist() == [len(row) for row in table.column(name).to_pylist()]
        trace_index = flat.column("trace_index").to_numpy()
        assert trace_index.tolist() == np.repeat(np.arange(n), np.diff(offsets)).tolist()
        ids = batch.trace_ids
        assert flat.column("trace_id").to_pylist() == [ids[i] for i in trace_index]
    assert batch.num_events == int(batch.event_offsets[-1])


def test_shape(batch):
    assert len(batch) == 12
    assert batch.trace_ids == batch.to_arrow().column("trace_id").to_pylist()
    assert len(set(batch.trace_ids)) == 12
    assert repr(batch) == f"TraceBatch(12 traces, {batch.num_events} events)"
    check_offsets_and_tables(batch)


def test_events_and_edges_tables(batch):
    events = batch.events()
    assert events.column_names[:2] == ["trace_index", "trace_id"]
    assert events.column_names[2:6] == ["id", "t", "type", "agent"]
    assert events.schema.field("trace_index").type == pa.int32()
    edges = batch.edges()
    assert edges.column_names == ["trace_index", "trace_id", "src", "dst", "type"]
    # Edge endpoints are local event indices, inside their own trace.
    offsets = batch.event_offsets
    for row in edges.to_pylist():
        size = offsets[row["trace_index"] + 1] - offsets[row["trace_index"]]
        assert 0 <= row["src"] < size and 0 <= row["dst"] < size
    # The flattened events are the events of the dict form, in order.
    for i, trace in enumerate(batch):
        rows = events.slice(offsets[i], offsets[i + 1] - offsets[i]).to_pylist()
        assert [r["id"] for r in rows] == [e["id"] for e in trace["events"]]
        assert [r["agent"] for r in rows] == [e["agent"] for e in trace["events"]]


def test_offsets_are_fresh_arrays(batch):
    offsets = batch.event_offsets
    before = offsets.copy()
    offsets[:] = -1
    assert batch.event_offsets.tolist() == before.tolist()


@settings(max_examples=30)
@given(trace_lists(max_size=6))
def test_offsets_and_tables_agree_for_any_traces(batch_traces):
    check_offsets_and_tables(masreplay.load_traces(batch_traces))


def test_getitem_int_and_negative_int(batch):
    every = list(batch)
    assert len(every) == 12
    assert batch[0] == every[0]
    assert batch[-1] == every[-1]
    assert batch[-12] == every[0]
    assert batch[np.int64(3)] == every[3]
    assert batch[5]["trace_id"] == batch.trace_ids[5]
    assert isinstance(batch[0], dict)


@pytest.mark.parametrize("key", [12, -13, 10**6])
def test_getitem_out_of_range(batch, key):
    with pytest.raises(IndexError):
        batch[key]
    with pytest.raises(IndexError):
        batch[[0, key]]
    with pytest.raises(IndexError):
        batch.to_seed_json(key)


@pytest.mark.parametrize("key", [slice(2, 5), slice(None, None, -1), slice(1, None, 3), slice(7, 3), slice(-4, None)])
def test_getitem_slice(batch, key):
    part = batch[key]
    assert isinstance(part, TraceBatch)
    assert part.trace_ids == batch.trace_ids[key]
    assert list(part) == list(batch)[key]
    check_offsets_and_tables(part)


@pytest.mark.parametrize("key", [[3, 0, 3], [-1, 2], [], np.array([4, 1])])
def test_getitem_list(batch, key):
    part = batch[key]
    assert isinstance(part, TraceBatch)
    every = list(batch)
    assert list(part) == [every[int(i)] for i in key]
    check_offsets_and_tables(part)


def test_sliced_batch_is_self_contained(batch, tmp_path):
    part = batch[5:8]
    assert part.event_offsets[0] == 0
    assert part.events().column("trace_index").to_pylist()[0] == 0
    part.write_parquet(tmp_path / "part.parquet")
    assert list(masreplay.load_traces(tmp_path / "part.parquet")) == list(part)


def test_iteration_matches_indexing(batch):
    assert [t["trace_id"] for t in batch] == batch.trace_ids
    assert list(batch) == [batch[i] for i in range(len(batch))]


def test_concat(batch, seed_example):
    other = masreplay.load_traces(seed_example)
    joined = TraceBatch.concat([batch[:4], other, batch[4:]])
    assert joined.trace_ids == batch.trace_ids[:4] + other.trace_ids + batch.trace_ids[4:]
    assert list(joined) == list(batch)[:4] + list(other) + list(batch)[4:]
    check_offsets_and_tables(joined)
    # Agents are dictionary-encoded per batch; the merged column still reads right.
    assert joined.events().column("agent").to_pylist() == (
        batch[:4].events().column("agent").to_pylist()
        + other.events().column("agent").to_pylist()
        + batch[4:].events().column("agent").to_pylist()
    )


def test_concat_of_nothing_is_empty():
    empty = TraceBatch.concat([])
    assert len(empty) == 0
    assert empty.event_offsets.tolist() == [0]
    assert empty.edge_offsets.tolist() == [0]
    assert empty.events().num_rows == 0
    assert list(empty) == []
    assert empty.to_arrow().column_names == CANONICAL_COLUMNS


def test_to_seed_json_negative_index(batch):
    assert batch.to_seed_json(-1)["trace_id"] == batch.trace_ids[-1]
    assert "group_id" not in batch.to_seed_json(0)


def test_rejected_traces_survive_pickling(batch):
    loaded = masreplay.load_traces([batch[0], {"trace_id": "bad"}], on_error="skip")
    restored = pickle.loads(pickle.dumps(loaded))
    assert [(p, t, str(e)) for p, t, e in restored.rejected] == [(p, t, str(e)) for p, t, e in loaded.rejected]
    assert restored.rejected[0][:2] == (1, "bad")


def test_load_traces_of_a_batch_is_the_same_batch(batch):
    again = masreplay.load_traces(batch)
    assert again.trace_ids == batch.trace_ids
    assert again.rejected == []


# ---- Arrow and Polars ------------------------------------------------------------------


def test_arrow_table_has_the_canonical_columns(batch):
    table = pa.table(batch)
    assert table.column_names == CANONICAL_COLUMNS
    assert table.num_rows == len(batch)
    assert table.equals(batch.to_arrow())
    assert table.schema.metadata[b"masreplay.schema_version"] == str(masreplay.SCHEMA_VERSION).encode()


def _data_address(array: pa.Array) -> int:
    return array.buffers()[1].address


def test_arrow_export_is_zero_copy(batch):
    """Two exports read the same Rust buffers: the addresses of their numeric data agree."""
    first, second = pa.table(batch), pa.table(batch)
    for name in ("n_events", "depth"):
        a, b = first.column(name), second.column(name)
        assert a.num_chunks == b.num_chunks == 1
        assert _data_address(a.chunk(0)) == _data_address(b.chunk(0)), name
    times = [t.column("events").chunk(0).values.field("t") for t in (first, second, batch.to_arrow())]
    assert len({_data_address(t) for t in times}) == 1
    # And the data behind that address is the trace data.
    assert times[0].to_pylist()[:3] == [e["t"] for e in batch[0]["events"][:3]]


def test_arrow_stream_capsule(batch):
    reader = pa.RecordBatchReader.from_stream(batch)
    table = reader.read_all()
    assert table.equals(batch.to_arrow())


def test_polars(batch):
    frame = pl.DataFrame(batch)
    assert frame.shape == (len(batch), len(CANONICAL_COLUMNS))
    assert frame.columns == CANONICAL_COLUMNS
    assert frame.equals(batch.to_polars())
    assert frame["trace_id"].to_list() == batch.trace_ids
    assert frame["n_events"].to_list() == np.diff(batch.event_offsets).tolist()
    exploded = frame.select(pl.col("events").list.len()).to_series().to_list()
    assert exploded == np.diff(batch.event_offsets).tolist()


# ---- Parquet ---------------------------------------------------------------------------


def test_write_parquet_replaces_atomically_and_leaves_no_partial(batch, tmp_path):
    path = tmp_path / "traces.parquet"
    batch[:2].write_parquet(path)
    batch.write_parquet(str(path))  # replaces the file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["traces.parquet"]
    assert masreplay.load_traces(path).trace_ids == batch.trace_ids


def test_write_parquet_into_a_missing_directory_is_a_storage_error(batch, tmp_path):
    target = tmp_path / "no" / "such" / "dir" / "traces.parquet"
    with pytest.raises(masreplay.StorageError) as info:
        batch.write_parquet(target)
    assert isinstance(info.value, OSError)
    assert isinstance(info.value, masreplay.MasreplayError)
    assert "no/such/dir" in str(info.value)
    assert not (tmp_path / "no").exists()
    assert list(tmp_path.iterdir()) == []


def test_write_parquet_over_a_directory_fails_and_cleans_up(batch, tmp_path):
    target = tmp_path / "taken.parquet"
    target.mkdir()
    (target / "keep.txt").write_text("x")
    with pytest.raises(masreplay.StorageError):
        batch.write_parquet(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken.parquet"]
    assert (target / "keep.txt").read_text() == "x"


def test_parquet_is_readable_without_masreplay(batch, tmp_path):
    import pyarrow.parquet as pq

    path = tmp_path / "traces.parquet"
    batch.write_parquet(path)
    table = pq.read_table(path)
    assert table.column_names == CANONICAL_COLUMNS
    assert table.column("trace_id").to_pylist() == batch.trace_ids
    assert pa.types.is_dictionary(table.schema.field("topology").type)
    frame = pl.read_parquet(path)
    assert frame.shape == (len(batch), len(CANONICAL_COLUMNS))
    # Event attributes travel as JSON text.
    attributes = [a for row in table.column("events").to_pylist() for e in row if (a := e["attributes"])]
    assert all(isinstance(json.loads(a), dict) for a in attributes)


@settings(max_examples=10)
@given(st.integers(min_value=0, max_value=2**32))
def test_parquet_round_trip_of_simulated_batches(tmp_path_factory, seed):
    batch = masreplay.sim.generate(3, agents=(1, 4), seed=seed)
    path = tmp_path_factory.mktemp("sim") / "sim.parquet"
    batch.write_parquet(path)
    assert masreplay.load_traces(path).to_arrow().equals(batch.to_arrow())


@pytest.mark.parametrize("pad_value", [float("nan"), 2**70])
@pytest.mark.parametrize("source", ["batch", "sample"])
def test_a_pad_value_that_does_not_fit_the_column_is_an_invalid_argument(pad_value, source):
    batch = masreplay.sim.generate(6, seed=4)
    if source == "sample":
        buffer = masreplay.GraphBuffer(10)
        buffer.add(batch)
        batch = buffer.sample(4, seed=1)
    with pytest.raises(masreplay.InvalidArgumentError, match=r"pad_value .* does not fit column 'tokens'"):
        batch.padded("tokens", pad_value)


def test_concat_names_an_item_that_is_no_batch():
    with pytest.raises(masreplay.ArgumentTypeError, match=r"concat: batches\[1\] must be a TraceBatch, got int 5"):
        TraceBatch.concat([masreplay.sim.generate(2, seed=1), 5])
    assert issubclass(masreplay.ArgumentTypeError, TypeError)
