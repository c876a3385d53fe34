"""GraphBuffer: adding, eviction, sampling, groups, priorities, queries, persistence, threads."""

from __future__ import annotations

import gc
import math
import multiprocessing
import os
import pickle
import stat
import threading
from collections import Counter, deque

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import masreplay
from masreplay import GraphBuffer, TraceValidationError
from masreplay.errors import ArgumentTypeError, InvalidArgumentError, MasreplayError
from strategies import EVENT_TYPES


def traces(n: int, seed: int, **kwargs) -> masreplay.TraceBatch:
    return masreplay.sim.generate(n, seed=seed, **kwargs)


def snapshot(buffer: GraphBuffer) -> tuple:
    """The buffer's whole state: its traces' Arrow data, priorities, counts and settings."""
    table = buffer.to_arrow()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    settings = (len(buffer), buffer.num_events, buffer.num_groups, buffer.capacity, buffer.unit)
    return sink.getvalue().to_pybytes(), buffer.priorities().tobytes(), settings


# ---- adding and eviction ------------------------------------------------------------------
def test_add_counts_and_lookups():
    buffer = GraphBuffer(100)
    batch = traces(12, seed=1)
    assert buffer.add(batch) == 12
    assert len(buffer) == 12
    assert buffer.num_events == batch.num_events
    assert buffer.num_groups == 3
    assert batch.trace_ids[5] in buffer and "nope" not in buffer and 5 not in buffer
    assert buffer.get(batch.trace_ids[5]) == batch[5]
    assert buffer.to_arrow().to_pylist() == batch.to_arrow().to_pylist()
    with pytest.raises(KeyError, match="nope"):
        buffer.get("nope")


def test_add_accepts_every_source_load_traces_accepts(tmp_path, seed_example):
    buffer = GraphBuffer(100)
    batch = traces(6, seed=2)
    buffer.add(batch[0])  # a dict
    buffer.add([batch[1], batch[2]])
    import json

    buffer.add(json.dumps(batch[3]))
    buffer.add(json.dumps(batch[4]).encode())
    buffer.add(batch[5:6].to_arrow())
    buffer.add(seed_example)
    path = tmp_path / "more.parquet"
    traces(2, seed=3).write_parquet(path)
    buffer.add(path)
    assert len(buffer) == 9


def test_invalid_batch_adds_nothing_byte_for_byte(seed_example):
    buffer = GraphBuffer(50, seed=3)
    buffer.add(traces(8, seed=1))
    buffer.update_priorities(buffer.to_batch().trace_ids[:2], [5.0, 0.5])
    before = snapshot(buffer)
    fresh = list(traces(3, seed=9))
    broken = dict(fresh[1], events=[dict(e) for e in fresh[1]["events"]])
    broken["events"][0]["t"] = -1
    with pytest.raises(TraceValidationError) as info:
        buffer.add([fresh[0], broken, fresh[2]])
    assert info.value.path == "/events/0/t"
    assert snapshot(buffer) == before
    # a duplicate id is an error too, and also adds nothing
    with pytest.raises(TraceValidationError, match="already stored") as info:
        buffer.add([fresh[0], buffer.get(buffer.to_batch().trace_ids[3])])
    assert info.value.path == "/trace_id"
    assert snapshot(buffer) == before
    with pytest.raises(TraceValidationError, match="twice"):
        buffer.add([fresh[0], fresh[0]])
    assert snapshot(buffer) == before


def test_skip_reports_rejected_positions_and_adds_the_rest():
    buffer = GraphBuffer(50)
    buffer.add(traces(2, seed=1))
    stored = buffer.get(buffer.to_batch().trace_ids[0])
    fresh = list(traces(3, seed=5))
    report = buffer.add([fresh[0], {"trace_id": "bad"}, stored, fresh[1], fresh[1], fresh[2]], on_error="skip")
    assert isinstance(report, masreplay.AddReport)
    assert report.added == 3
    assert [(position, trace_id) for position, trace_id, _ in report.rejected] == [
        (1, "bad"),
        (2, stored["trace_id"]),
        (4, fresh[1]["trace_id"]),
    ]
    assert all(isinstance(error, TraceValidationError) for _, _, error in report.rejected)
    assert len(buffer) == 5


def test_fifo_eviction_of_whole_traces_by_trace_count():
    buffer = GraphBuffer(5)
    first, second = traces(4, seed=1), traces(4, seed=2)
    buffer.add(first)
    buffer.add(second)
    assert buffer.to_batch().trace_ids == first.trace_ids[3:] + second.trace_ids
    assert first.trace_ids[0] not in buffer
    assert buffer.num_events == sum(len(buffer.get(t)["events"]) for t in buffer.to_batch().trace_ids)


def test_event_capacity_never_splits_a_trace():
    buffer = GraphBuffer(300, unit="events")
    for seed in range(6):
        buffer.add(traces(5, seed=seed))
        stored = buffer.to_batch()
        assert buffer.num_events <= 300
        assert buffer.num_events == stored.num_events
        lengths = np.diff(stored.event_offsets)
        assert list(lengths) == stored.to_arrow()["n_events"].to_pylist()
    huge = traces(1, seed=99, agents=40, events_per_agent=10)
    with pytest.raises(TraceValidationError, match="whole capacity"):
        buffer.add(huge)


def test_bad_settings():
    with pytest.raises(InvalidArgumentError):
        GraphBuffer(0)
    with pytest.raises(InvalidArgumentError, match="unit"):
        GraphBuffer(10, unit="bytes")
    with pytest.raises(InvalidArgumentError, match="empty"):
        GraphBuffer(10).sample(3)


# ---- sampling -------------------------------------------------------------------------------
def test_uniform_draws_pass_a_chi_square_test():
    """The draws themselves, not the reported probabilities: over 20 seeds the statistic of
    4,000 draws from 20 traces has 19 degrees of freedom, so each stays below the 0.1% critical
    value (43.82) and their mean lies near 19 (a biased sampler fails the first, a sampler that
    spreads draws evenly by construction fails the second)."""
    buffer = GraphBuffer(100, seed=0)
    batch = traces(20, seed=2)
    buffer.add(batch)
    statistics = []
    for seed in range(20):
        counts = Counter(buffer.sample(4000, seed=seed).trace_ids)
        observed = np.array([counts[t] for t in batch.trace_ids])
        statistics.append(float(((observed - 200.0) ** 2 / 200.0).sum()))
    assert max(statistics) < 43.82, statistics
    assert 19 - 4 < np.mean(statistics) < 19 + 4, statistics  # the mean of 20 draws: sd sqrt(38/20) ~ 1.4


def test_uniform_sampling_is_seeded_and_covers_the_buffer():
    buffer = GraphBuffer(100, seed=7)
    buffer.add(traces(20, seed=1))
    a, b = buffer.sample(64, seed=3), buffer.sample(64, seed=3)
    assert a.trace_ids == b.trace_ids
    assert np.allclose(a.probabilities, 1 / 20)
    assert set(a.trace_ids) <= set(buffer.to_batch().trace_ids)
    drawn = Counter(buffer.sample(4000, seed=11).trace_ids)
    assert len(drawn) == 20
    # the buffer's own stream advances between calls but is reproducible from its seed
    other = GraphBuffer(100, seed=7)
    other.add(traces(20, seed=1))
    fresh_a = GraphBuffer(100, seed=7)
    fresh_a.add(traces(20, seed=1))
    assert fresh_a.sample(8).trace_ids == other.sample(8).trace_ids
    assert fresh_a.sample(8).trace_ids != fresh_a.sample(8).trace_ids


def test_sampled_batch_is_a_trainable_batch():
    buffer = GraphBuffer(100)
    buffer.add(traces(10, seed=1))
    batch = buffer.sample(5, seed=0)
    events = batch.events()
    assert events.num_rows == batch.num_events == batch.event_offsets[-1]
    for i, trace in enumerate(batch):
        rows = events.slice(batch.event_offsets[i], batch.event_offsets[i + 1] - batch.event_offsets[i])
        assert rows["id"].to_pylist() == [e["id"] for e in trace["events"]]


def test_sampled_fields_match_the_collected_batch_across_chunks():
    """A sample reads single event fields straight from the stored chunks; every field, the
    offsets and the ids agree with the whole batch copied out, across chunk boundaries and
    for runs of consecutive rows (groups) as well as scattered ones."""
    buffer = GraphBuffer(500, seed=3)
    for part in range(5):  # five chunks, some traces evicted from the first
        buffer.add(traces(120, seed=40 + part, group_size=4))
    for batch in (buffer.sample(64, seed=1), buffer.sample_groups(6, seed=2), buffer.sample(1, seed=3)):
        ids, offsets = batch.trace_ids, batch.event_offsets
        lazy = {name: pa.array(batch._source.event_field(name)) for name in masreplay.batch.EVENT_FIELDS}
        whole = batch.to_arrow()
        assert ids == whole.column("trace_id").to_pylist()
        assert offsets.tolist() == [0, *np.cumsum(whole.column("n_events").to_numpy()).tolist()]
        events = batch.events()
        for name, array in lazy.items():
            assert array.to_pylist() == events.column(name).to_pylist(), name
        assert [buffer.get(t) for t in ids[:5]] == [batch[i] for i in range(min(5, len(batch)))]


def test_flat_gives_values_and_offsets():
    buffer = GraphBuffer(100)
    buffer.add(traces(30, seed=5))
    batch = buffer.sample(16, seed=4)
    values, offsets = batch.flat("t")
    assert values.dtype == np.float64 and offsets.tolist() == batch.event_offsets.tolist()
    assert values.tolist() == batch.events().column("t").to_pylist()
    codes, _ = batch.flat("type")
    assert codes.dtype == np.int8
    names = batch.events().column("type").to_pylist()
    vocabulary = batch.events().column("type").combine_chunks().dictionary.to_pylist()
    assert [vocabulary[c] for c in codes] == names
    with pytest.raises(KeyError, match="nope"):
        batch.flat("nope")
    with pytest.raises(TypeError, match="id"):
        batch.flat("id")


def test_flat_of_a_sample_equals_flat_of_the_collected_batch():
    """A sample answers flat() in one call (64-bit numbers without nulls come as a numpy
    array owning the copy; other columns through Arrow); the collected batch must agree."""
    buffer = GraphBuffer(400, seed=2)
    for part in range(3):
        buffer.add(traces(120, seed=60 + part))
    for column in ("t", "logprob", "duration_s", "agent", "type"):
        batch = buffer.sample(50, seed=8)
        values, offsets = batch.flat(column)
        batch.events()  # collects the sample
        expected_values, expected_offsets = batch.flat(column)
        assert np.array_equal(offsets, expected_offsets)
        assert values.dtype == expected_values.dtype, column
        assert np.array_equal(values, expected_values, equal_nan=values.dtype.kind == "f"), column
    values, _ = buffer.sample(50, seed=9).flat("t")
    assert values.flags.writeable  # the gathered copy is the caller's
    values[0] = -1.0  # and the stored traces are untouched
    assert (buffer.to_arrow().column("events").combine_chunks().values.field("t").to_numpy() >= 0).all()


def test_prioritized_frequencies_follow_priorities():
    buffer = GraphBuffer(10, seed=1)
    batch = traces(4, seed=1)
    buffer.add(batch)
    weights = np.array([1.0, 2.0, 3.0, 4.0])
    buffer.update_priorities(batch.trace_ids, weights)
    assert np.array_equal(buffer.priorities(), weights)
    n = 20000
    sample = buffer.sample(n, sampler="prioritized", seed=5)
    expected = weights / weights.sum()
    counts = Counter(sample.trace_ids)
    observed = np.array([counts[t] for t in batch.trace_ids]) / n
    # binomial standard error; 5 sigma keeps the fixed-seed test meaningful and stable
    assert np.all(np.abs(observed - expected) < 5 * np.sqrt(expected * (1 - expected) / n))
    by_id = dict(zip(batch.trace_ids, expected, strict=True))
    assert np.allclose(sample.probabilities, [by_id[t] for t in sample.trace_ids])
    # importance weights survive pickling and follow the traces when the batch is cut
    assert np.array_equal(pickle.loads(pickle.dumps(sample)).probabilities, sample.probabilities)
    assert np.array_equal(sample[[3, 1]].probabilities, sample.probabilities[[3, 1]])
    # a zero priority is never drawn; new traces get the largest priority seen
    buffer.update_priorities([batch.trace_ids[0]], [0.0])
    assert batch.trace_ids[0] not in buffer.sample(2000, sampler="prioritized", seed=1).trace_ids
    buffer.add(traces(1, seed=50))
    assert buffer.priorities()[-1] == 4.0


def test_priorities_survive_growth_and_eviction():
    buffer = GraphBuffer(50)
    expected: dict[str, float] = {}
    for seed in range(12):
        batch = traces(7, seed=seed)
        buffer.add(batch)
        values = [float(seed * 10 + i) for i in range(7)]
        buffer.update_priorities(batch.trace_ids, values)
        expected.update(zip(batch.trace_ids, values, strict=True))
    stored = buffer.to_batch().trace_ids
    assert len(stored) == 50
    assert buffer.priorities().tolist() == [expected[t] for t in stored]
    sample = buffer.sample(5000, sampler="prioritized", seed=0)
    assert set(sample.trace_ids) <= set(stored)


def test_update_priorities_is_all_or_nothing():
    buffer = GraphBuffer(10)
    batch = traces(3, seed=1)
    buffer.add(batch)
    before = buffer.priorities().copy()
    for ids, values, error in [
        (batch.trace_ids, [1.0, -1.0, 2.0], InvalidArgumentError),
        (batch.trace_ids, [1.0, math.nan, 2.0], InvalidArgumentError),
        ([batch.trace_ids[0], "ghost"], [1.0, 2.0], InvalidArgumentError),
        (batch.trace_ids, [1.0], InvalidArgumentError),
    ]:
        with pytest.raises(error):
            buffer.update_priorities(ids, values)
        assert np.array_equal(buffer.priorities(), before)


def test_a_priority_too_large_is_quoted_in_short():
    # Quoted digit by digit before (a 309-character number in the message).
    buffer = GraphBuffer(10)
    batch = traces(1, seed=1)
    buffer.add(batch)
    with pytest.raises(InvalidArgumentError, match=r"^priority of \"[^\"]+\": 1e308 is not a priority"):
        buffer.update_priorities(batch.trace_ids, [1e308])


def test_priorities_of_evicted_traces_are_skipped_when_asked():
    # A learner updates the priorities of a sample after producers' adds evicted part of it.
    buffer = GraphBuffer(4)
    first = traces(4, seed=1)
    buffer.add(first)
    drawn = buffer.sample(4, seed=0)
    buffer.add(traces(2, seed=2))  # evicts the two oldest
    stored = set(buffer.to_batch().trace_ids)
    before = buffer.priorities().copy()
    with pytest.raises(InvalidArgumentError, match="no trace"):
        buffer.update_priorities(drawn.trace_ids, [3.0] * 4)
    assert np.array_equal(buffer.priorities(), before)
    kept = [trace_id for trace_id in drawn.trace_ids if trace_id in stored]
    assert buffer.update_priorities(drawn.trace_ids, [3.0] * 4, missing="skip") == len(kept)
    expected = {t: (3.0 if t in kept else p) for t, p in zip(buffer.to_batch().trace_ids, before, strict=True)}
    assert buffer.priorities().tolist() == list(expected.values())
    assert buffer.update_priorities(["ghost"], [1.0], missing="skip") == 0
    with pytest.raises(InvalidArgumentError, match="missing"):
        buffer.update_priorities(drawn.trace_ids, [3.0] * 4, missing="ignore")


def test_a_trace_named_twice_takes_its_last_priority():
    # A sample drawn with replacement holds a trace twice; its TD errors come back twice.
    buffer = GraphBuffer(10)
    batch = traces(3, seed=1)
    buffer.add(batch)
    first, second, _ = batch.trace_ids
    buffer.update_priorities([first, second, first], [4.0, 2.0, 0.5])
    assert buffer.priorities()[:2].tolist() == [0.5, 2.0]


def test_shape_filters_and_length_bands():
    buffer = GraphBuffer(200)
    buffer.add(traces(30, seed=1, agents=(1, 6), events_per_agent=(1, 10)))
    lengths = dict(zip(buffer.to_batch().trace_ids, buffer.to_arrow()["n_events"].to_pylist(), strict=True))
    low, high = sorted(lengths.values())[5], sorted(lengths.values())[20]
    sample = buffer.sample(200, min_events=low, max_events=high, seed=2)
    assert all(low <= lengths[t] <= high for t in sample.trace_ids)
    prioritized = buffer.sample(200, min_events=low, sampler="prioritized", seed=2)
    assert all(lengths[t] >= low for t in prioritized.trace_ids)
    banded = buffer.sample(100, band=100, seed=1)
    assert all(10 < lengths[t] <= 100 for t in banded.trace_ids)
    with pytest.raises(InvalidArgumentError, match="no stored trace"):
        buffer.sample(3, min_events=10_000)
    with pytest.raises(ValueError, match="band"):
        buffer.sample(3, band=50)


def test_sample_groups_returns_whole_groups():
    buffer = GraphBuffer(100, seed=4)
    buffer.add(traces(24, seed=1, group_size=4))
    buffer.add(traces(3, seed=2, group_size=3))  # one smaller group
    stored = buffer.to_arrow()
    members: dict[str, list[str]] = {}
    for trace_id, group in zip(stored["trace_id"].to_pylist(), stored["group_id"].to_pylist(), strict=True):
        members.setdefault(group, []).append(trace_id)
    batch = buffer.sample_groups(3, seed=1)
    table = batch.to_arrow()
    groups = list(dict.fromkeys(table["group_id"].to_pylist()))
    assert len(groups) == 3
    for group in groups:
        ids = [t for t, g in zip(table["trace_id"].to_pylist(), table["group_id"].to_pylist(), strict=True) if g == group]
        assert ids == members[group]
    exact = buffer.sample_groups(6, group_size=4, seed=2).to_arrow()
    counts = Counter(exact["group_id"].to_pylist())
    assert len(counts) == 6 and set(counts.values()) == {4}
    assert len(set(exact["trace_id"].to_pylist())) == 24
    subset = buffer.sample_groups(7, group_size=2, seed=3).to_arrow()
    assert set(Counter(subset["group_id"].to_pylist()).values()) == {2}
    with pytest.raises(InvalidArgumentError, match="at least 4"):
        buffer.sample_groups(7, group_size=4)
    with pytest.raises(InvalidArgumentError):
        buffer.sample_groups(8)


# ---- graph queries and the padded view -------------------------------------------------------
def _reach(trace: dict, start: str, forward: bool) -> set[str]:
    edges = [(e["src"], e["dst"]) if forward else (e["dst"], e["src"]) for e in trace["edges"]]
    seen, frontier = set(), deque([start])
    while frontier:
        node = frontier.popleft()
        for a, b in edges:
            if a == node and b not in seen:
                seen.add(b)
                frontier.append(b)
    return seen


def test_graph_queries_match_a_python_search():
    buffer = GraphBuffer(10)
    buffer.add(traces(3, seed=4, depth=2, agents=(3, 5)))
    trace_id = buffer.to_batch().trace_ids[1]
    trace = buffer.get(trace_id)
    order = [e["id"] for e in trace["events"]]
    for event in order[:: max(1, len(order) // 6)]:
        assert set(buffer.descendants(trace_id, event)) == _reach(trace, event, True)
        assert set(buffer.ancestors(trace_id, event)) == _reach(trace, event, False)
        assert buffer.descendants(trace_id, event) == [e for e in order if e in _reach(trace, event, True)]
    keep = order[:5]
    sub = buffer.subgraph(trace_id, keep)[0]
    assert [e["id"] for e in sub["events"]] == keep
    assert sub["edges"] == [e for e in trace["edges"] if e["src"] in keep and e["dst"] in keep]
    view = buffer.agent_view(trace_id, "orchestrator")[0]
    assert {e["agent"] for e in view["events"]} == {"orchestrator"}
    assert len(view["events"]) == sum(e["agent"] == "orchestrator" for e in trace["events"])
    with pytest.raises(KeyError):
        buffer.ancestors("ghost", "e0")
    with pytest.raises(InvalidArgumentError, match="no event"):
        buffer.descendants(trace_id, "e-missing")
    with pytest.raises(InvalidArgumentError, match="no event by agent"):
        buffer.agent_view(trace_id, "nobody")


def test_padded_view():
    batch = traces(6, seed=3)
    values, mask, lengths = batch.padded("t", pad_value=-1.0)
    offsets = batch.event_offsets
    assert lengths.tolist() == np.diff(offsets).tolist()
    assert values.shape == mask.shape == (6, lengths.max())
    flat = batch.events()["t"].to_numpy()
    for i in range(6):
        assert values[i, : lengths[i]].tolist() == flat[offsets[i] : offsets[i + 1]].tolist()
        assert mask[i, : lengths[i]].all() and not mask[i, lengths[i] :].any()
        assert (values[i, lengths[i] :] == -1.0).all()
    codes, _, _ = batch.padded("type", pad_value=-1)
    assert codes.dtype.kind == "i"
    names = batch.events()["type"].to_pylist()
    vocabulary = pa.table(batch).schema.field("events").type.value_type.field("type").type
    assert vocabulary.index_type == pa.int8()
    assert codes[0, 0] == EVENT_TYPES.index(names[0])
    tokens, _, _ = batch.padded("tokens")
    assert tokens.dtype == np.int64
    with pytest.raises(KeyError):
        batch.padded("nope")
    with pytest.raises(TypeError):
        batch.padded("id")
    for pad_value in (None, "x", [0]):  # None made an array of objects
        for column in ("t", "tokens"):
            with pytest.raises(ArgumentTypeError, match="pad_value must be a number or a flag"):
                batch.padded(column, pad_value=pad_value)


@pytest.mark.parametrize(
    ("column", "pad_value"),
    [("tokens", 0), ("tokens", -1), ("tokens", 2.5), ("t", -1), ("t", float("nan")), ("logprob", 0), ("type", -1)],
)
def test_padded_sample_equals_padded_collected_batch(column, pad_value):
    """A sample pads 64-bit number fields without nulls straight from the buffer (other
    fields and pads go through the flat column); either way it gives what the collected batch
    gives."""
    traces = list(masreplay.sim.generate(40, seed=5))
    for trace in traces[:20]:  # logprob in the first add only: the second's column is all null
        for event in trace["events"]:
            event["logprob"] = -0.5
    buffer = GraphBuffer(100, seed=2)
    buffer.add(traces[:20])
    buffer.add(traces[20:])
    for drawn in (buffer.sample(50, seed=4), buffer.sample_groups(3, seed=1), buffer.sample(3, seed=9)):
        fast = drawn.padded(column, pad_value=pad_value)
        slow = masreplay.load_traces(drawn.to_arrow()).padded(column, pad_value=pad_value)
        for ours, theirs in zip(fast, slow, strict=True):
            assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
            np.testing.assert_array_equal(ours, theirs)


# ---- persistence -----------------------------------------------------------------------------
def _filled() -> GraphBuffer:
    buffer = GraphBuffer(30, seed=5)
    buffer.add(traces(20, seed=1))
    buffer.add(traces(20, seed=2))  # evicts 10
    batch = buffer.to_batch()
    buffer.update_priorities(batch.trace_ids[:4], [0.5, 3.0, 0.0, 7.0])
    buffer.sample(3)  # advance the buffer's stream
    return buffer


def test_save_and_load_resume_exactly(tmp_path):
    buffer = _filled()
    path = tmp_path / "buffer.parquet"
    buffer.save(path)
    again = GraphBuffer.load(path)
    assert (again.capacity, again.unit, len(again), again.num_events) == (30, "traces", 30, buffer.num_events)
    assert again.to_arrow().to_pylist() == buffer.to_arrow().to_pylist()
    assert np.array_equal(again.priorities(), buffer.priorities())
    assert again.sample(16).trace_ids == buffer.sample(16).trace_ids
    assert again.sample(16, sampler="prioritized").trace_ids == buffer.sample(16, sampler="prioritized").trace_ids
    # the saved file is the canonical layout: load_traces reads it without the buffer
    assert masreplay.load_traces(path).trace_ids == buffer.to_batch().trace_ids
    # eviction continues in the same order after a reload
    again.add(traces(1, seed=3))
    buffer.add(traces(1, seed=3))
    assert again.to_batch().trace_ids == buffer.to_batch().trace_ids


def test_an_empty_buffer_saves_pickles_and_resumes(tmp_path):
    # A checkpoint taken before the first rollout: a file of no rows read back as no batch, so
    # the settings kept in its schema were lost and load refused it ("no data").
    buffer = GraphBuffer(120, unit="events", seed=5, max_staleness=2)
    buffer.policy_version = 3
    path = tmp_path / "empty.parquet"
    buffer.save(path)
    for again in (GraphBuffer.load(path), pickle.loads(pickle.dumps(buffer))):
        assert (len(again), again.capacity, again.unit) == (0, 120, "events")
        assert (again.policy_version, again.max_staleness) == (3, 2)
        again.add(traces(1, seed=3))
        assert again.to_batch().trace_ids == traces(1, seed=3).trace_ids


def test_save_replaces_atomically_and_bad_files_raise(tmp_path):
    path = tmp_path / "buffer.parquet"
    _filled().save(path)
    small = GraphBuffer(5)
    small.add(traces(2, seed=8))
    small.save(path)
    assert len(GraphBuffer.load(path)) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["buffer.parquet"]
    with pytest.raises(masreplay.StorageError):
        small.save(tmp_path / "missing-dir" / "b.parquet")
    assert not (tmp_path / "missing-dir").exists()
    data = path.read_bytes()
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(MasreplayError):
        GraphBuffer.load(truncated)
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"PAR1 this is not parquet PAR1")
    with pytest.raises(MasreplayError):
        GraphBuffer.load(garbage)
    plain = tmp_path / "plain.parquet"
    traces(2, seed=1).write_parquet(plain)
    with pytest.raises(MasreplayError, match="not a saved GraphBuffer"):
        GraphBuffer.load(plain)
    with pytest.raises(masreplay.StorageError):
        GraphBuffer.load(tmp_path / "absent.parquet")


def test_pickle_round_trips():
    buffer = _filled()
    again = pickle.loads(pickle.dumps(buffer))
    assert again.to_arrow().to_pylist() == buffer.to_arrow().to_pylist()
    assert np.array_equal(again.priorities(), buffer.priorities())
    assert again.sample(8).trace_ids == buffer.sample(8).trace_ids
    batch = buffer.sample(5, seed=1)
    copy = pickle.loads(pickle.dumps(batch))
    assert copy.to_arrow().to_pylist() == batch.to_arrow().to_pylist()


def test_unpickling_takes_the_canonical_layout_as_is_and_checks_anything_else():
    batch = traces(3, seed=2)
    copy = pickle.loads(pickle.dumps(batch))
    assert copy.to_arrow().equals(batch.to_arrow())
    # A table in another layout (a column left out) is validated and completed on the way in.
    partial = batch.to_arrow().drop_columns(["n_agents"])
    rebuilt = masreplay.load_traces(partial)
    assert rebuilt.to_arrow().to_pylist() == batch.to_arrow().to_pylist()
    restored = pickle.loads(pickle.dumps(_filled()))
    assert restored.add(traces(1, seed=99)) == 1


def test_nbytes_counts_shared_memory_once_and_follows_eviction():
    buffer = GraphBuffer(6)
    assert buffer.nbytes == 0
    buffer.add(traces(3, seed=1))
    three = buffer.nbytes
    assert three > 0
    buffer.add(traces(3, seed=2))
    assert buffer.nbytes > three
    buffer.add(traces(6, seed=3))  # evicts every earlier trace, and their memory with them
    fresh = GraphBuffer(6)
    fresh.add(traces(6, seed=3))
    assert buffer.nbytes == fresh.nbytes


def _event_fields_nulled(table: pa.Table, names: tuple[str, ...], *, drop: bool) -> pa.Table:
    """``table`` with the event fields ``names`` dropped, or given as columns of nulls."""
    events = table.column("events").combine_chunks()
    values = events.values
    fields = [f for f in values.type if not (drop and f.name in names)]
    arrays = [pa.nulls(len(values), f.type) if f.name in names else values.field(f.name) for f in fields]
    rebuilt = pa.ListArray.from_arrays(events.offsets, pa.StructArray.from_arrays(arrays, fields=fields))
    return table.set_column(table.schema.get_field_index("events"), "events", rebuilt)


def test_event_fields_given_as_nulls_cost_what_absent_fields_cost():
    """pyarrow writes a column of nulls out in full; stored, it becomes a view of the zeros
    that absent fields share, also after small adds are merged into one chunk."""
    table = traces(40, seed=5).to_arrow()
    names = ("role", "tokens", "duration_s")
    given, absent = (_event_fields_nulled(table, names, drop=drop) for drop in (False, True))
    n_events = sum(len(e) for e in table.column("events").to_pylist())
    for step in (40, 4):  # one add; ten adds merged as they come
        buffers = [GraphBuffer(100), GraphBuffer(100)]
        for buffer, source in zip(buffers, (given, absent), strict=True):
            for start in range(0, 40, step):
                buffer.add(source.slice(start, step))
        assert buffers[0].to_arrow().equals(buffers[1].to_arrow())
        # The three columns written out take at least 20 bytes an event.
        assert abs(buffers[0].nbytes - buffers[1].nbytes) < 4 * n_events


def _stored_ids(buffer: GraphBuffer) -> list[str]:
    return buffer.to_batch().trace_ids


def test_buffer_crosses_a_process_boundary():
    buffer = _filled()
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        ids = pool.apply(_stored_ids, (buffer,))
    assert ids == buffer.to_batch().trace_ids


# ---- concurrency -----------------------------------------------------------------------------
def test_threads_adding_while_sampling_lose_nothing():
    buffer = GraphBuffer(10_000, seed=1)
    buffer.add(traces(4, seed=1000))
    batches = [traces(5, seed=seed) for seed in range(40)]
    expected = set(_stored_ids(buffer)) | {t for b in batches for t in b.trace_ids}
    errors: list[BaseException] = []
    stop = threading.Event()

    def adder(chunk):
        try:
            for batch in chunk:
                buffer.add(batch)
        except BaseException as error:  # surfaced by the assertion below
            errors.append(error)

    def sampler():
        try:
            while not stop.is_set():
                sample = buffer.sample(16)
                assert set(sample.trace_ids) <= expected
                assert sample.events().num_rows == sample.num_events
        except BaseException as error:
            errors.append(error)

    adders = [threading.Thread(target=adder, args=(batches[i::4],)) for i in range(4)]
    reader = threading.Thread(target=sampler)
    reader.start()
    for thread in adders:
        thread.start()
    for thread in adders:
        thread.join()
    stop.set()
    reader.join()
    assert not errors, errors
    assert set(_stored_ids(buffer)) == expected
    assert len(buffer) == len(expected) == 204
    for batch in batches[:3]:
        for i, trace_id in enumerate(batch.trace_ids):
            assert buffer.get(trace_id) == batch[i]


# ---- a model-based test of add / sample / evict ---------------------------------------------
class BufferAgainstModel(RuleBasedStateMachine):
    """Random sequences of operations against a plain Python model of FIFO eviction."""

    def __init__(self):
        super().__init__()
        self.capacity = 12
        self.buffer = GraphBuffer(self.capacity, seed=0)
        self.model: list[tuple[str, str, int]] = []  # (trace_id, group_id, n_events), oldest first

    @rule(seed=st.integers(0, 30), n=st.integers(1, 6), group_size=st.integers(1, 3))
    def add(self, seed, n, group_size):
        batch = traces(n, seed=seed, group_size=group_size)
        table = batch.to_arrow()
        rows = list(zip(table["trace_id"].to_pylist(), table["group_id"].to_pylist(), table["n_events"].to_pylist(), strict=True))
        stored = {row[0] for row in self.model}
        if any(row[0] in stored for row in rows):
            with pytest.raises(TraceValidationError, match="already stored"):
                self.buffer.add(batch)
            return
        assert self.buffer.add(batch) == n
        self.model.extend(rows)
        del self.model[: max(0, len(self.model) - self.capacity)]

    @precondition(lambda self: self.model)
    @rule(size=st.integers(1, 20), seed=st.integers(0, 5))
    def sample(self, size, seed):
        batch = self.buffer.sample(size, seed=seed)
        assert len(batch) == size
        assert set(batch.trace_ids) <= {row[0] for row in self.model}

    @precondition(lambda self: self.model)
    @rule(seed=st.integers(0, 5))
    def sample_one_group(self, seed):
        table = self.buffer.sample_groups(1, seed=seed).to_arrow()
        group = table["group_id"][0].as_py()
        assert table["trace_id"].to_pylist() == [row[0] for row in self.model if row[1] == group]

    @invariant()
    def matches_the_model(self):
        assert len(self.buffer) == len(self.model)
        assert self.buffer.num_events == sum(row[2] for row in self.model)
        assert self.buffer.num_groups == len({row[1] for row in self.model})
        assert _stored_ids(self.buffer) == [row[0] for row in self.model]


TestBufferAgainstModel = BufferAgainstModel.TestCase


def test_an_unknown_trace_is_one_error_whatever_the_query():
    # get and the graph queries raised a bare KeyError (whose str quotes the message),
    # branches an InvalidArgumentError: now one TraceNotFoundError, still a KeyError.
    buffer = GraphBuffer(10)
    buffer.add(traces(2, seed=1))
    queries = {
        "get": lambda: buffer.get("ghost"),
        "branches": lambda: buffer.branches("ghost"),
        "ancestors": lambda: buffer.ancestors("ghost", "e0"),
        "descendants": lambda: buffer.descendants("ghost", "e0"),
        "subgraph": lambda: buffer.subgraph("ghost", ["e0"]),
        "agent_view": lambda: buffer.agent_view("ghost", "orchestrator"),
    }
    for name, query in queries.items():
        with pytest.raises(masreplay.TraceNotFoundError) as raised:
            query()
        error = raised.value
        assert isinstance(error, KeyError) and isinstance(error, masreplay.MasreplayError), name
        assert (str(error), error.trace_id) == ("no trace 'ghost' in the buffer", "ghost"), name
        assert str(pickle.loads(pickle.dumps(error))) == str(error)
    assert len(buffer) == 2


def test_a_lookup_racing_an_eviction_is_refused_as_an_absent_trace():
    """The queries checked for the trace, then looked it up under the buffer's lock: a rollout
    thread evicting it in between turned TraceNotFoundError (a KeyError) into an
    InvalidArgumentError (a ValueError), 24 times in 138,000 queries (fuzz4). The lookup under
    the lock is now the only check, so the core's own refusal is the one raised."""
    buffer = GraphBuffer(10)
    buffer.add(traces(2, seed=1))
    core = buffer._core
    lookups = {
        "get": lambda: core.get("ghost"),
        "branches": lambda: core.branches("ghost", None),
        "ancestors": lambda: core.ancestors("ghost", "e0"),
        "descendants": lambda: core.descendants("ghost", "e0"),
        "subgraph": lambda: core.subgraph("ghost", ["e0"]),
        "agent_view": lambda: core.agent_view("ghost", "orchestrator"),
    }
    for lookup in lookups.values():
        with pytest.raises(masreplay.TraceNotFoundError, match="no trace 'ghost' in the buffer"):
            lookup()
    # An unknown id among update_priorities' arguments stays a bad argument, as in the
    # sharded buffer.
    with pytest.raises(masreplay.InvalidArgumentError, match='no trace "ghost" in the buffer'):
        buffer.update_priorities(["ghost"], [1.0])


@pytest.mark.parametrize(
    "refused",
    [
        lambda buffer: buffer.sample_groups(99),  # more groups than stored
        lambda buffer: buffer.sample(4, min_events=10**6),  # no trace of that shape
        lambda buffer: buffer.sample(4, max_staleness=0),  # every trace too old
    ],
)
def test_a_refused_draw_leaves_the_buffer_and_its_stream_as_they_were(refused):
    # Found by fuzzing: a refused unseeded draw took one of the buffer's streams (its saved
    # `calls` moved), so every later unseeded draw differed from a buffer that never saw it.
    buffer, untouched = GraphBuffer(100, seed=3), GraphBuffer(100, seed=3)
    for each in (buffer, untouched):
        each.add(traces(8, seed=1))
        each.policy_version = 5
    with pytest.raises(InvalidArgumentError):
        refused(buffer)
    assert pa.table(buffer._core.persisted()).equals(pa.table(untouched._core.persisted()), check_metadata=True)
    assert buffer.sample(6).trace_ids == untouched.sample(6).trace_ids


@pytest.mark.parametrize(
    "call",
    [
        lambda buffer: buffer.get("\ud800"),
        lambda buffer: buffer.descendants("x\udcff", "e1"),
        lambda buffer: buffer.update_priorities(["\ud800"], [1.0]),
        lambda buffer: buffer.subgraph(buffer.to_batch().trace_ids[0], ["\ud800"]),
        lambda buffer: buffer.save("\udcff.parquet"),
    ],
)
def test_a_lone_surrogate_is_refused_by_name(call):
    # Found by fuzzing: these raised a UnicodeEncodeError from the binding, naming nothing.
    buffer = GraphBuffer(10)
    buffer.add(traces(2, seed=1))
    assert "\ud800" not in buffer
    with pytest.raises(InvalidArgumentError, match="UTF-8"):
        call(buffer)


def test_save_over_a_pipe_or_a_folder_is_refused_and_leaves_it(tmp_path):
    # Found by fuzzing: save renamed its file over whatever the path named; as root, a save
    # to /dev/null replaced the device with a Parquet file.
    buffer = GraphBuffer(10)
    buffer.add(traces(2, seed=1))
    pipe, folder = tmp_path / "pipe", tmp_path / "folder"
    os.mkfifo(pipe)
    folder.mkdir()
    for target in (pipe, folder):
        with pytest.raises(masreplay.StorageError, match="replaces a regular file only"):
            buffer.save(target)
        with pytest.raises(masreplay.StorageError, match="replaces a regular file only"):
            buffer.to_batch().write_parquet(target)
    assert stat.S_ISFIFO(os.lstat(pipe).st_mode) and folder.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "pipe"]  # no temporary file left


def test_refused_adds_keep_nothing_they_built():
    # Soak check (an error path run for days): traces refused by validation or by the buffer
    # (ids already stored) hold none of the Arrow memory their add built.
    buffer = GraphBuffer(100)
    good = masreplay.sim.generate(16, seed=1).to_arrow()
    buffer.add(good)
    rows = good.to_pylist()
    rows[3]["events"][0]["type"] = "no_such_type"
    bad = pa.Table.from_pylist(rows, schema=good.schema)
    gc.collect()
    start = pa.total_allocated_bytes()
    for _ in range(50):
        for table in (bad, good):
            with pytest.raises(TraceValidationError):
                buffer.add(table)
            assert buffer.add(table, on_error="skip").added == 0
    gc.collect()
    assert pa.total_allocated_bytes() == start
    assert len(buffer) == 16
