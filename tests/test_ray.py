"""masreplay.ray: RayGraphBuffer on a local 2-CPU Ray (one Ray session for the module)."""

from __future__ import annotations

import gc
import json
import math
import os
import time
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import masreplay
from masreplay.errors import InvalidArgumentError, StorageError

ray = pytest.importorskip("ray", reason="masreplay.ray needs the ray package (pip install masreplay[ray])")
masreplay_ray = pytest.importorskip("masreplay.ray")
RayGraphBuffer = masreplay_ray.RayGraphBuffer


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def shard_tables(buffer) -> list[pa.Table]:
    return ray.get([shard.to_arrow.remote() for shard in buffer._shards])


def chi_square_p(observed: np.ndarray, expected: np.ndarray) -> float:
    """Upper tail of the chi-square statistic (Wilson-Hilferty normal approximation)."""
    statistic = float(((observed - expected) ** 2 / expected).sum())
    k = len(observed) - 1
    z = ((statistic / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


def test_the_module_imports_the_real_ray_package():
    assert masreplay_ray.ray is ray and hasattr(masreplay_ray.ray, "remote")


def test_groups_and_branch_families_never_split():
    buffer = RayGraphBuffer(10_000, shards=3, seed=2)
    buffer.add(masreplay.sim.generate(90, seed=1, group_size=3))
    families = pa.table(masreplay.sim.branches(12, branches=3, branch_points=1, seed=5).batch)
    factual = np.array([of is None for of in families["counterfactual_of"].to_pylist()])
    # Factual traces first, their branches in a later add: routed to where the factual went.
    buffer.add(families.filter(factual))
    buffer.add(families.filter(np.logical_not(factual)))
    tables = shard_tables(buffer)
    assert sum(t.num_rows for t in tables) == len(buffer) == 90 + families.num_rows
    shard_of_group, shard_of_trace = {}, {}
    for shard, table in enumerate(tables):
        for trace_id, group in zip(table["trace_id"].to_pylist(), table["group_id"].to_pylist(), strict=True):
            assert shard_of_group.setdefault(group, shard) == shard, f"group {group} split"
            shard_of_trace[trace_id] = shard
    for row in families.filter(np.logical_not(factual)).to_pylist():
        assert shard_of_trace[row["trace_id"]] == shard_of_trace[row["counterfactual_of"]["trace_id"]]
    assert set(shard_of_group.values()) == {0, 1, 2}
    buffer.shutdown()


@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
def test_cross_shard_draws_follow_the_global_rule(sampler):
    buffer = RayGraphBuffer(10_000, shards=3, seed=7)
    batch = masreplay.sim.generate(40, seed=3, group_size=1)
    buffer.add(batch)
    ids = batch.trace_ids
    weights = np.ones(len(ids)) if sampler == "uniform" else np.arange(1.0, len(ids) + 1)
    buffer.update_priorities(ids, weights)
    counts: Counter[str] = Counter()
    expected_probability = dict(zip(ids, weights / weights.sum(), strict=True))
    for _ in range(10):
        drawn = buffer.sample(800, sampler=sampler)
        counts.update(drawn.trace_ids)
        np.testing.assert_allclose(drawn.probabilities, [expected_probability[t] for t in drawn.trace_ids])
    observed = np.array([counts[t] for t in ids], dtype=float)
    assert chi_square_p(observed, 8000 * weights / weights.sum()) > 1e-4
    # Shards hold unequal numbers of traces, so "n/k from each shard" would fail the test.
    assert len({t.num_rows for t in shard_tables(buffer)}) > 1
    buffer.shutdown()


def _tokens_by_trace(table: pa.Table, column: str) -> dict[str, list]:
    return {
        row["trace_id"]: [event[column] for event in row["events"]] for row in table.select(["trace_id", "events"]).to_pylist()
    }


def test_a_sample_reads_only_the_columns_asked_and_in_sample_order():
    source = masreplay.sim.generate(60, seed=11, group_size=3)
    expected = {c: _tokens_by_trace(pa.table(source), c) for c in ("tokens", "t", "logprob")}
    buffer = RayGraphBuffer(10_000, shards=3, seed=8)
    buffer.add(source)
    drawn = buffer.sample(200, seed=4)
    ids = drawn.trace_ids
    assert len(set(ids)) > 20 and len(drawn) == 200
    for column in ("tokens", "t"):  # int64 and float64: numpy arrays from the shards
        values, offsets = drawn.flat(column)
        assert isinstance(values, np.ndarray) and len(offsets) == 201
        for i, trace_id in enumerate(ids):
            assert values[offsets[i] : offsets[i + 1]].tolist() == expected[column][trace_id]
    # A float column with nulls crosses as Arrow and comes back with NaN for the nulls.
    values, offsets = drawn.flat("logprob")
    want = np.concatenate([np.array(expected["logprob"][t], dtype=float) for t in ids])
    np.testing.assert_array_equal(values, want)
    padded, mask, _lengths = drawn.padded("tokens", pad_value=-1)
    assert padded[mask].tolist() == drawn.flat("tokens")[0].tolist() and (padded[~mask] == -1).all()
    assert drawn._collected is None, "reading columns copied the whole traces out"
    # Columns asked for with the draw come with it, equal to those fetched later.
    again = buffer.sample(200, seed=4, columns=["tokens", "logprob"])
    assert set(again._source._columns) == {"tokens", "logprob"} and again.trace_ids == ids
    assert again.flat("tokens")[0].tolist() == drawn.flat("tokens")[0].tolist()
    np.testing.assert_array_equal(again.flat("logprob")[0], want)
    # With a stale idea of the shards' shares, shards 1 and 2 send too few draws' columns:
    # the sample then fetches them when read, and reads the same.
    buffer._shares = np.array([1.0, 0.0, 0.0])
    stale = buffer.sample(200, seed=4, columns=["tokens"])
    assert stale._source._columns == {} and stale.flat("tokens")[0].tolist() == drawn.flat("tokens")[0].tolist()
    with pytest.raises(KeyError, match="nope"):
        buffer.sample(2, columns=["nope"])
    # The whole traces, when asked, come in the same order.
    assert drawn.to_arrow()["trace_id"].to_pylist() == ids
    assert drawn.events()["tokens"].to_pylist() == drawn.flat("tokens")[0].tolist()
    buffer.shutdown()


def test_a_sample_stays_as_drawn_while_the_buffer_moves_on_and_is_freed_when_dropped():
    buffer = RayGraphBuffer(40, shards=2, seed=3)
    first = masreplay.sim.generate(40, seed=21, group_size=1)
    tokens = _tokens_by_trace(pa.table(first), "tokens")
    buffer.add(first)
    drawn = buffer.sample(30, seed=1)
    buffer.add(masreplay.sim.generate(40, seed=22, group_size=1))  # evicts every drawn trace
    assert not set(drawn.trace_ids) & set(pa.concat_tables(shard_tables(buffer))["trace_id"].to_pylist())
    values, offsets = drawn.flat("tokens")
    for i, trace_id in enumerate(drawn.trace_ids):
        assert values[offsets[i] : offsets[i + 1]].tolist() == tokens[trace_id]
    # A one-trace sample: the other shard's draws are let go with the next draw, not the sample's.
    single = buffer.sample(1, seed=5)
    buffer.sample(1)
    assert len(single.flat("tokens")[0]) == single.num_events > 0
    source = drawn._source
    shard, key, rows = source._parts[0]
    del drawn, source
    gc.collect()
    buffer.sample(1)  # the handle tells the shards what was dropped with its next draw
    with pytest.raises(InvalidArgumentError, match="no longer holds this sample"):
        ray.get(shard.flat.remote(key, rows, "tokens"))
    buffer.shutdown()


def test_branches_come_after_their_draws_and_their_factual_is_drawn():
    buffer = RayGraphBuffer(10_000, shards=2, seed=6)
    buffer.add(masreplay.sim.branches(20, branches=2, branch_points=1, seed=9).batch)
    drawn = buffer.sample(12, with_branches=True, seed=2)
    table = drawn.to_arrow()
    assert table["trace_id"].to_pylist() == drawn.trace_ids and len(drawn) > 12
    # Past the 12 draws (factual traces or branches themselves), only branches of a draw.
    drawn_ids = set(drawn.trace_ids[:12])
    appended = table["counterfactual_of"].to_pylist()[12:]
    assert all(of is not None and of["trace_id"] in drawn_ids for of in appended)
    assert len(drawn.probabilities) == len(drawn) == len(drawn.flat("tokens")[1]) - 1
    buffer.shutdown()


def test_seeded_samples_repeat_and_groups_come_whole():
    buffer = RayGraphBuffer(10_000, shards=2, seed=1)
    buffer.add(masreplay.sim.generate(60, seed=2, group_size=4))
    first, again = buffer.sample(50, seed=9), buffer.sample(50, seed=9)
    assert first.trace_ids == again.trace_ids
    groups = buffer.sample_groups(15, seed=3)
    assert Counter(groups.to_arrow()["group_id"].to_pylist()) == Counter(
        dict.fromkeys(set(groups.to_arrow()["group_id"].to_pylist()), 4)
    )
    assert len(groups) == 60
    with pytest.raises(InvalidArgumentError, match="16 groups"):
        buffer.sample_groups(16)
    buffer.shutdown()


def test_staleness_spans_the_shards():
    buffer = RayGraphBuffer(10_000, shards=2, max_staleness=1)
    for version in range(4):
        table = pa.table(masreplay.sim.generate(20, seed=10 + version))
        table = table.set_column(
            table.schema.get_field_index("policy_version"), "policy_version", pa.array([version] * 20, pa.int64())
        )
        buffer.add(table)
    buffer.advance(3)
    assert buffer.policy_version == 3
    drawn = buffer.sample(200)
    assert set(drawn.to_arrow()["policy_version"].to_pylist()) == {2, 3}
    stored = buffer.to_arrow()
    fresh = stored.filter(pc.field("policy_version") >= 2)["trace_id"].to_pylist()
    assert set(drawn.trace_ids) <= set(fresh) and len(set(drawn.trace_ids)) > 20
    assert buffer.evict_stale() == 40 and len(buffer) == 40
    with pytest.raises(InvalidArgumentError):
        buffer.advance(2)
    buffer.shutdown()


@ray.remote
def _writer(handle, writer: int) -> int:
    return sum(handle.add(masreplay.sim.generate(25, seed=100 * writer + k)) for k in range(4))


def test_concurrent_adds_from_four_tasks_lose_nothing():
    buffer = RayGraphBuffer(10_000, shards=2)
    assert ray.get([_writer.remote(buffer, w) for w in range(4)]) == [100] * 4
    stored = pa.concat_tables(shard_tables(buffer))["trace_id"].to_pylist()
    assert len(buffer) == len(set(stored)) == 400
    assert ray.get(buffer.add_async(masreplay.sim.generate(5, seed=999))) == 5
    with pytest.raises(masreplay.TraceValidationError):
        buffer.add(masreplay.sim.generate(5, seed=999))  # ids already stored
    buffer.shutdown()


def test_save_and_load_a_sharded_buffer(tmp_path):
    buffer = RayGraphBuffer(10_000, shards=3, seed=4, max_staleness=5)
    batch = pa.table(masreplay.sim.generate(50, seed=6))
    buffer.add(batch)
    buffer.advance(2)
    buffer.save(tmp_path)
    buffer.add(masreplay.sim.generate(10, seed=7))
    buffer.save(tmp_path)  # the second save replaces the first snapshot
    manifest = json.loads((tmp_path / "ray_buffer.json").read_text())
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == [manifest["snapshot"]]
    restored = RayGraphBuffer.load(tmp_path)
    assert (restored.shards, restored.max_staleness, restored.policy_version, len(restored)) == (3, 5, 2, 60)
    # Logically equal (a reloaded dictionary column may be encoded with other codes).
    for ours, theirs in zip(shard_tables(restored), shard_tables(buffer), strict=True):
        assert ours.to_pylist() == theirs.to_pylist()
    assert restored.sample(20, seed=3).trace_ids == buffer.sample(20, seed=3).trace_ids
    (tmp_path / "ray_buffer.json").write_text("{not json")
    with pytest.raises(StorageError):
        RayGraphBuffer.load(tmp_path)
    for handle in (buffer, restored):
        handle.shutdown()


def test_a_killed_shard_restarts_from_its_last_save_and_reports_the_loss(tmp_path):
    buffer = RayGraphBuffer(10_000, shards=2, seed=5)
    buffer.add(masreplay.sim.generate(40, seed=1))
    buffer.save(tmp_path)
    later = masreplay.sim.generate(30, seed=2)
    buffer.add(later)
    before = [t.num_rows for t in shard_tables(buffer)]
    saved = [pq_rows(tmp_path, s) for s in range(2)]
    ray.kill(buffer._shards[0], no_restart=False)
    # ray.kill returns at once: wait until the restarted actor answers (calls meanwhile are
    # retried by Ray, or reach the old actor before it dies).
    deadline = time.monotonic() + 60
    while ray.get(buffer._shards[0].report.remote()) is None:
        assert time.monotonic() < deadline, "the shard was not restarted"
        time.sleep(0.2)
    with pytest.warns(masreplay_ray.ShardLossWarning, match="shard=0"):
        assert len(buffer) == saved[0] + before[1]
    (loss,) = buffer.losses()
    assert (loss.shard, loss.restarts, loss.restored_traces) == (0, 1, saved[0])
    assert loss.lost_traces == before[0] - saved[0] > 0 and loss.held_traces == before[0]
    buffer.shutdown()


def pq_rows(directory, shard: int) -> int:
    manifest = json.loads((directory / "ray_buffer.json").read_text())
    return pq.read_metadata(directory / manifest["snapshot"] / manifest["files"][shard]).num_rows


def test_bad_arguments_raise_masreplay_errors():
    with pytest.raises(InvalidArgumentError):
        RayGraphBuffer(10, shards=0)
    with pytest.raises(InvalidArgumentError):
        RayGraphBuffer(10, unit="bytes")
    buffer = RayGraphBuffer(100, shards=2)
    with pytest.raises(InvalidArgumentError, match="no stored trace"):
        buffer.sample(4)
    buffer.add(masreplay.sim.generate(4, seed=1))
    with pytest.raises(InvalidArgumentError, match="nope"):
        buffer.update_priorities(["nope"], [1.0])
    with pytest.raises(InvalidArgumentError, match="sampler"):
        buffer.sample(4, sampler="greedy")
    buffer.shutdown()


def test_a_shard_count_past_the_bound_is_refused_before_any_actor():
    # Found by fuzzing: shards=2**40 was a MemoryError from the handle's per-shard lists, and
    # a count in the millions would have started actors for hours before failing.
    with pytest.raises(InvalidArgumentError, match="shards"):
        RayGraphBuffer(2**41, shards=2**40)
    with pytest.raises(InvalidArgumentError, match="shards"):
        RayGraphBuffer(2**41, shards=masreplay_ray.MAX_SHARDS + 1)


def test_shards_no_node_can_hold_are_refused_within_the_start_timeout():
    """num_cpus=64 on this 2-CPU cluster: Ray would hold the shards (and every call) forever."""
    started = time.monotonic()
    with pytest.raises(InvalidArgumentError, match=r"asks for \{'CPU': 64\}.*start_timeout=0.5"):
        RayGraphBuffer(100, shards=2, num_cpus=64, start_timeout=0.5)
    assert time.monotonic() - started < 30
    with pytest.raises(InvalidArgumentError, match="start_timeout"):
        RayGraphBuffer(100, start_timeout=-1.0)
    buffer = RayGraphBuffer(100, num_cpus=1, start_timeout=0.0)  # fits: no wait at all
    buffer.add(masreplay.sim.generate(2, seed=0))
    assert len(buffer) == 2
    buffer.shutdown()


def test_what_a_shard_raises_reaches_the_caller_as_itself():
    # Found by fuzzing: a version moved back raised Ray's RayTaskError, whose message is the
    # worker's traceback, and Ray logged the other shard's error as never retrieved.
    buffer = RayGraphBuffer(100, shards=2)
    buffer.advance(5)
    with pytest.raises(InvalidArgumentError) as caught:
        buffer.advance(3)
    assert type(caught.value) is InvalidArgumentError
    assert str(caught.value).startswith("advance(3) would move the policy version back from 5")
    assert buffer.policy_version == 5
    buffer.shutdown()


def test_a_shard_gone_for_good_is_a_storage_error(tmp_path):
    # Found by fuzzing: Ray's ActorDiedError on every call once a shard was killed for good
    # (or past max_restarts); every call still returns at once.
    buffer = RayGraphBuffer(100, shards=2)
    buffer.add(masreplay.sim.generate(8, seed=4))
    ray.kill(buffer._shards[1], no_restart=True)
    # ray.kill returns before the actor is gone: a call right after it may still be answered.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            ray.get(buffer._shards[1].stats.remote())
        except ray.exceptions.RayActorError:
            break
        time.sleep(0.05)
    calls = [lambda: len(buffer), lambda: buffer.sample(2), lambda: buffer.add(masreplay.sim.generate(8, seed=5)),
             lambda: buffer.advance(1), lambda: buffer.save(tmp_path / "save")]  # fmt: skip
    for call in calls:
        with pytest.raises(StorageError, match="shard of this RayGraphBuffer is gone"):
            call()
    buffer.shutdown()


def test_saving_where_a_file_is_in_the_way_is_a_storage_error(tmp_path):
    # Found by fuzzing: FileExistsError from pathlib's mkdir.
    buffer = RayGraphBuffer(100, shards=1)
    (tmp_path / "taken").write_text("a file")
    with pytest.raises(StorageError, match="cannot save a RayGraphBuffer here"):
        buffer.save(tmp_path / "taken")
    buffer.shutdown()


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m.pop("seed"),
        lambda m: m.update(capacity="lots"),
        lambda m: m.update(shards=0, files=[]),
        lambda m: m.update(unit="rows"),
        lambda m: m.update(snapshot=os.path.join(os.pardir, "elsewhere")),
        lambda m: m.update(files=[7]),
    ],
)
def test_a_tampered_save_is_refused_before_any_actor(tmp_path, edit):
    # Found by fuzzing: a save's settings were not checked as the constructor's are: a key
    # missing was a KeyError, shards=0 with no files loaded a buffer of no shard.
    buffer = RayGraphBuffer(100, shards=1)
    buffer.save(tmp_path / "save")
    buffer.shutdown()
    manifest = json.loads((tmp_path / "save" / "ray_buffer.json").read_text())
    edit(manifest)
    (tmp_path / "save" / "ray_buffer.json").write_text(json.dumps(manifest))
    with pytest.raises(StorageError, match="not a saved RayGraphBuffer"):
        RayGraphBuffer.load(tmp_path / "save")


def test_a_priority_one_shard_would_refuse_changes_no_shard():
    buffer = RayGraphBuffer(100, shards=2)
    batch = masreplay.sim.generate(16, seed=3)
    buffer.add(batch)
    mass = lambda: [ray.get(shard.eligible.remote({}))[1] for shard in buffer._shards]  # noqa: E731
    before = mass()
    assert all(m > 0 for m in before)  # both shards hold traces
    for bad in (1e300, np.inf, -1.0, np.nan):
        with pytest.raises(InvalidArgumentError, match="is not a priority"):
            buffer.update_priorities(batch.trace_ids, [7.0] * 15 + [bad])
        assert mass() == before
    buffer.shutdown()


def test_priorities_of_traces_no_shard_holds_are_skipped_when_asked():
    buffer = RayGraphBuffer(100, shards=2)
    batch = masreplay.sim.generate(6, seed=3)
    buffer.add(batch)
    ids = [*batch.trace_ids, "evicted"]
    with pytest.raises(InvalidArgumentError, match="evicted"):
        buffer.update_priorities(ids, [2.0] * 7)
    assert buffer.update_priorities(ids, [2.0] * 7, missing="skip") == 6
    mass = sum(ray.get(shard.eligible.remote({}))[1] for shard in buffer._shards)
    assert mass == 12.0  # every stored trace at priority 2
    buffer.shutdown()


def test_an_update_racing_a_producers_eviction_is_never_half_done(monkeypatch):
    """The handle checks every id, then each shard applies its part; a producer's add that
    evicts a checked trace in between used to make that shard raise after the others had
    applied theirs."""
    buffer = RayGraphBuffer(12, shards=2)  # 6 a shard: holds the first 6 wherever they go
    first, later = masreplay.sim.generate(6, seed=3), masreplay.sim.generate(40, seed=4)
    buffer.add(first)
    real_get, raced = masreplay.ray._get, []

    def get_then_add(refs):
        answer = real_get(refs)
        if not raced:  # the check's answer is in: a producer's add lands before the update
            raced.append(True)
            buffer.add(later)
        return answer

    monkeypatch.setattr(masreplay.ray, "_get", get_then_add)
    set_count = buffer.update_priorities(first.trace_ids, [5.0] * 6)
    monkeypatch.undo()
    held = np.stack(ray.get([shard.contains_many.remote(first.trace_ids) for shard in buffer._shards]))
    still_held = int(held.any(axis=0).sum())
    assert raced and set_count == still_held < 6
    mass = sum(ray.get(shard.eligible.remote({}))[1] for shard in buffer._shards)
    assert mass == len(buffer) + 4.0 * still_held  # the later traces at 1, any survivor at 5
    buffer.shutdown()


def test_the_add_log_counts_what_came_after_the_ledger(tmp_path):
    log = tmp_path / "shard-00000.adds"
    ledger = {"added_since_save": 5, "held": 5, "log_bytes": 0}
    assert masreplay_ray._with_logged_adds(ledger, log) == ledger  # no log yet
    log.write_bytes(b"3 8\n4 12\n")
    assert masreplay_ray._with_logged_adds({**ledger, "log_bytes": 4}, log) == {
        **ledger,
        "added_since_save": 9,
        "held": 12,
        "log_bytes": 4,
    }
    # A log shorter than the ledger says was emptied after the ledger was written: all of it is new.
    assert masreplay_ray._with_logged_adds({**ledger, "log_bytes": 100}, log)["added_since_save"] == 12


def test_a_shard_never_saved_keeps_its_add_log_short(tmp_path, monkeypatch):
    monkeypatch.setattr(masreplay_ray, "_LOG_LIMIT", 100)
    shard = masreplay_ray._Shard(0, 50, "traces", 0, None, os.fspath(tmp_path), None, b"key")
    try:
        for seed in range(60):  # about 5 bytes of log each
            shard.add(masreplay_ray._to_wire(pa.table(masreplay.sim.generate(2, seed=seed))))
        log = tmp_path / "shard-00000.adds"
        assert log.stat().st_size <= 100
        ledger = json.loads((tmp_path / "shard-00000.json").read_text())
        assert masreplay_ray._with_logged_adds(ledger, log)["added_since_save"] == 120
    finally:
        os.close(shard.log)


def test_skipped_traces_are_reported_at_their_input_positions_across_shards():
    buffer = RayGraphBuffer(1_000, shards=2, seed=1)
    old = pa.table(masreplay.sim.generate(10, seed=1, group_size=1))
    buffer.add(old)
    new = old
    for name in ("trace_id", "group_id"):
        renamed = pc.binary_join_element_wise("new-", new[name].cast(pa.string()), "")
        new = new.set_column(new.schema.get_field_index(name), new.schema.field(name), renamed)
    mixed = pa.concat_tables([new.slice(0, 5), old.slice(2, 1), new.slice(5, 5), old.slice(7, 1)])
    report = buffer.add(mixed, on_error="skip")
    assert report.added == 10 and len(buffer) == 20
    assert [(position, trace_id) for position, trace_id, _ in report.rejected] == [
        (5, old["trace_id"][2].as_py()),
        (11, old["trace_id"][7].as_py()),
    ]
    held = [set(t["trace_id"].to_pylist()) for t in shard_tables(buffer)]
    assert all(held), "the traces all went to one shard: the test would not cross shards"
    buffer.shutdown()


def test_add_async_counts_across_shards_without_a_task_of_its_own():
    buffer = RayGraphBuffer(1_000, shards=3, seed=1)
    batch = masreplay.sim.generate(30, seed=41, group_size=1)
    assert ray.get(buffer.add_async(batch)) == 30
    assert all(t.num_rows for t in shard_tables(buffer)), "the add did not reach every shard"
    fresh = masreplay.sim.generate(6, seed=42, group_size=1)
    # Stored ids refused by some shards: the count's ref raises, the fresh traces landed.
    with pytest.raises(masreplay.TraceValidationError):
        ray.get(buffer.add_async(pa.concat_tables([pa.table(fresh), pa.table(batch)])))
    assert len(buffer) == 36
    # A refusal by a lower shard reaches the count through the last shard of the add.
    first_shard_id = shard_tables(buffer)[0]["trace_id"][0].as_py()
    stored_there = pa.table(batch).filter(pc.field("trace_id") == first_shard_id)
    fresh = pa.table(masreplay.sim.generate(30, seed=44, group_size=1))
    with pytest.raises(masreplay.TraceValidationError, match=first_shard_id):
        ray.get(buffer.add_async(pa.concat_tables([fresh, stored_there])))
    assert len(buffer) == 66
    assert ray.get(buffer.add_async(masreplay.sim.generate(0, seed=43))) == 0
    buffer.shutdown()


def test_a_writer_holds_sends_and_flushes_on_exit():
    buffer = RayGraphBuffer(1_000, shards=2, seed=1)
    with buffer.writer(flush_traces=50, max_in_flight=2) as writer:
        assert writer.add(masreplay.sim.generate(20, seed=51)) == 20
        assert writer.pending == 20 and len(buffer) == 0  # held here, below flush_traces
        for seed in range(52, 56):
            writer.add(masreplay.sim.generate(20, seed=seed))
        assert writer.pending <= 100 and writer.added + writer.pending == 100
    assert writer.added == len(buffer) == 100 and writer.pending == 0
    stored = pa.concat_tables(shard_tables(buffer))["trace_id"].to_pylist()
    assert len(set(stored)) == 100
    with pytest.raises(InvalidArgumentError, match="closed"):
        writer.add(masreplay.sim.generate(1, seed=57))
    buffer.shutdown()


def test_a_writer_left_by_an_error_loses_nothing():
    buffer = RayGraphBuffer(1_000, shards=2, seed=1)
    writer = buffer.writer(flush_traces=1_000)

    def rollout():
        with writer:
            writer.add(masreplay.sim.generate(30, seed=61))
            raise RuntimeError("rollout crashed")

    with pytest.raises(RuntimeError, match="rollout crashed"):
        rollout()
    assert writer.added == len(buffer) == 30
    # An invalid trace raises at its add; what was validated before still lands.
    bad = pa.table(masreplay.sim.generate(2, seed=62))
    bad = bad.set_column(bad.schema.get_field_index("trace_id"), "trace_id", pa.array([None, "x"], pa.string()))
    with buffer.writer(flush_traces=1_000) as writer:
        writer.add(masreplay.sim.generate(5, seed=63))
        with pytest.raises(masreplay.TraceValidationError):
            writer.add(bad)
    assert writer.added == 5 and len(buffer) == 35
    buffer.shutdown()


def test_a_writer_raises_or_reports_what_shards_refuse():
    buffer = RayGraphBuffer(1_000, shards=2, seed=1)
    stored = masreplay.sim.generate(10, seed=71, group_size=1)
    buffer.add(stored)
    fresh = masreplay.sim.generate(10, seed=72, group_size=1)
    writer = buffer.writer(max_in_flight=100)
    writer.add(stored)  # every id already stored: refused by the shards, raised at the flush
    writer.add(fresh)
    with pytest.raises(masreplay.TraceValidationError):
        writer.close()
    assert writer.added == 10 and len(buffer) == 20 and writer.pending == 0
    with buffer.writer(on_error="skip") as skipping:
        skipping.add(stored)
        skipping.add(masreplay.sim.generate(3, seed=73))
    assert skipping.added == 3 and sorted(t for t, _ in skipping.rejected) == sorted(stored.trace_ids)
    assert all(isinstance(error, masreplay.TraceValidationError) for _, error in skipping.rejected)
    for bad in ({"flush_traces": 0}, {"max_in_flight": -1}, {"on_error": "ignore"}):
        with pytest.raises(InvalidArgumentError):
            buffer.writer(**bad)
    buffer.shutdown()


def test_a_writer_sends_branches_where_their_held_factual_goes():
    buffer = RayGraphBuffer(1_000, shards=3, seed=1)
    families = pa.table(masreplay.sim.branches(12, branches=3, branch_points=1, seed=81).batch)
    factual = np.array([of is None for of in families["counterfactual_of"].to_pylist()])
    with buffer.writer(flush_traces=1_000) as writer:
        writer.add(families.filter(factual))  # held here
        writer.add(families.filter(np.logical_not(factual)))  # flushes the factual traces first
    assert writer.added == len(buffer) == families.num_rows and not writer.rejected
    shard_of = {t: s for s, table in enumerate(shard_tables(buffer)) for t in table["trace_id"].to_pylist()}
    for row in families.filter(np.logical_not(factual)).to_pylist():
        assert shard_of[row["trace_id"]] == shard_of[row["counterfactual_of"]["trace_id"]]
    assert len(set(shard_of.values())) > 1
    buffer.shutdown()


def _with_empty_id(table: pa.Table, row: int) -> pa.Table:
    """The canonical table with one trace breaking a trace rule (an empty trace_id)."""
    ids = table["trace_id"].to_pylist()
    ids[row] = ""
    return table.set_column(0, table.schema.field(0), pa.array(ids, pa.string()))


def test_a_shard_trusts_only_streams_signed_with_its_buffers_key():
    """The digest spares a shard the second validation only for bytes a handle of its buffer
    wrote: a stream changed after signing, signed with another buffer's key or not signed is
    checked in full and refused if invalid, and a refused add leaves the shard as it was."""
    from masreplay.errors import DataFormatError, TraceValidationError

    buffer, other = RayGraphBuffer(1000, shards=1), RayGraphBuffer(1000, shards=1)
    shard = buffer._shards[0]
    buffer.add(masreplay.sim.generate(4, seed=1))
    stored = shard_tables(buffer)[0]
    valid = masreplay.sim.generate(3, seed=2).to_arrow()
    invalid = masreplay_ray._to_wire(_with_empty_id(valid, 1))
    signed_valid = masreplay_ray._to_wire(valid)
    for digest in (
        b"",  # not signed
        masreplay_ray._digest(buffer._key, signed_valid),  # signed, then the bytes changed
        masreplay_ray._digest(other._key, invalid),  # signed with another buffer's key
        bytes([masreplay_ray._digest(buffer._key, invalid)[0] ^ 1])
        + masreplay_ray._digest(buffer._key, invalid)[1:],  # one bit off
    ):
        with pytest.raises(TraceValidationError, match="trace_id"):
            ray.get(shard.add.remote(invalid, digest))
        assert shard_tables(buffer)[0].equals(stored) and len(buffer) == 4
    # A layout that is not canonical is refused even when signed.
    raw = masreplay_ray._to_wire(valid.drop_columns(["n_events"]))
    with pytest.raises(DataFormatError, match="canonical"):
        ray.get(shard.add.remote(raw, masreplay_ray._digest(buffer._key, raw)))
    assert shard_tables(buffer)[0].equals(stored)
    # Valid traces under a wrong digest are checked in full and taken.
    assert ray.get(shard.add.remote(signed_valid, b"\0" * 32)) == (3, [])
    assert len(buffer) == 7
    # What the digest saves: a signed stream is not checked again (only a handle that
    # validated its traces holds the key; this one is written by hand to show it).
    ray.get(other._shards[0].add.remote(invalid, masreplay_ray._digest(other._key, invalid)))
    assert "" in shard_tables(other)[0]["trace_id"].to_pylist()
    for handle in (buffer, other):
        handle.shutdown()


def test_a_handle_in_another_process_signs_with_its_buffers_key():
    """A handle pickled into a Ray task keeps its buffer's key, so a rollout worker's adds
    take the shards' signed path."""
    buffer = RayGraphBuffer(1000, shards=2, seed=1)
    key_in_task = ray.get(ray.remote(num_cpus=0)(lambda handle: handle._key).remote(buffer))
    assert key_in_task == buffer._key and len(key_in_task) == 32
    assert buffer.add(masreplay.sim.generate(20, seed=3, group_size=2)) == 20
    buffer.shutdown()
