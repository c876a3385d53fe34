"""GraphBuffer staleness control: policy versions, bounded sampling, evict_stale, persistence."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import masreplay
from masreplay import GraphBuffer, TraceValidationError
from masreplay.errors import InvalidArgumentError


def trace(trace_id: str, group: str, version: int | None, factual: str | None = None) -> dict[str, Any]:
    """A one-event trace with the fields staleness reads."""
    record: dict[str, Any] = {
        "trace_id": trace_id,
        "task_id": group,
        "group_id": group,
        "events": [{"id": "e0", "t": 0.0, "type": "message", "agent": "a"}],
        "edges": [],
        "rewards": {"team": 1.0},
        "costs": {"tokens": 1, "wall_clock_s": 0.1},
    }
    if version is not None:
        record["policy_version"] = version
    if factual is not None:
        record["counterfactual_of"] = {"trace_id": factual, "event_id": "e0", "kind": "ablate"}
    return record


class StalenessModel(RuleBasedStateMachine):
    """The buffer against a list of (id, group, version, factual) in insertion order, with FIFO
    capacity eviction and stale eviction both taking branch rollouts with their factual trace."""

    CAPACITY = 14

    def __init__(self) -> None:
        super().__init__()
        self.buffer = GraphBuffer(self.CAPACITY, seed=3)
        self.stored: list[tuple[str, str, int | None, str | None]] = []
        self.current = 0
        self.next_id = 0

    def _family(self, trace_id: str) -> set[str]:
        """The trace and, transitively, its stored branches."""
        family, frontier = {trace_id}, [trace_id]
        while frontier:
            parent = frontier.pop()
            children = {t for t, _, _, f in self.stored if f == parent} - family
            family |= children
            frontier.extend(children)
        return family

    def _remove(self, trace_ids: set[str]) -> None:
        self.stored = [row for row in self.stored if row[0] not in trace_ids]

    def _eligible(self, staleness: int | None) -> list[str]:
        bound = None if staleness is None else self.current - staleness
        return [t for t, _, v, _ in self.stored if bound is None or v is None or v >= bound]

    @rule(
        versions=st.lists(st.one_of(st.none(), st.integers(0, 12)), min_size=1, max_size=5),
        group=st.integers(0, 3),
        branch_of_stored=st.booleans(),
    )
    def add(self, versions: list[int | None], group: int, branch_of_stored: bool) -> None:
        batch = []
        for k, version in enumerate(versions):
            trace_id = f"t{self.next_id}"
            self.next_id += 1
            factual = None
            if branch_of_stored and k > 0:
                factual = batch[0]["trace_id"]  # a branch of a trace of this same add
            elif branch_of_stored and self.stored:
                factual = self.stored[-1][0]
            batch.append(trace(trace_id, f"g{group}", version, factual))
        assert self.buffer.add(batch) == len(batch)
        for record in batch:
            factual = record.get("counterfactual_of", {}).get("trace_id")
            self.stored.append((record["trace_id"], record["group_id"], record.get("policy_version"), factual))
        while len(self.stored) > self.CAPACITY:
            self._remove(self._family(self.stored[0][0]))

    @rule(step=st.integers(0, 3))
    def advance(self, step: int) -> None:
        self.current += step
        self.buffer.advance(self.current)

    @rule(version=st.integers(0, 12))
    def set_version(self, version: int) -> None:
        self.current = version
        self.buffer.policy_version = version

    @rule(staleness=st.integers(0, 6))
    def evict_stale(self, staleness: int) -> None:
        bound = self.current - staleness
        stale = [t for t, _, v, _ in self.stored if v is not None and v < bound]
        gone: set[str] = set()
        for trace_id in stale:
            gone |= self._family(trace_id)
        self._remove(gone)
        assert self.buffer.evict_stale(staleness) == len(gone)

    @rule(staleness=st.one_of(st.none(), st.integers(0, 6)), prioritized=st.booleans(), seed=st.integers(0, 99))
    def sample(self, staleness: int | None, prioritized: bool, seed: int) -> None:
        eligible = self._eligible(staleness)
        sampler = "prioritized" if prioritized else "uniform"
        if not eligible:
            with pytest.raises(InvalidArgumentError):
                self.buffer.sample(4, sampler=sampler, max_staleness=staleness, seed=seed)
            return
        batch = self.buffer.sample(40, sampler=sampler, max_staleness=staleness, seed=seed)
        assert set(batch.trace_ids) <= set(eligible)
        # Every stored trace has priority 1 here, so both samplers give 1/eligible.
        np.testing.assert_allclose(batch.probabilities, 1 / len(eligible))
        assert self.buffer._core.eligible(max_staleness=staleness) == (len(eligible), float(len(eligible)))

    @rule(staleness=st.integers(0, 6))
    def sample_groups(self, staleness: int) -> None:
        eligible = set(self._eligible(staleness))
        groups = {g for _, g, _, _ in self.stored}
        fresh_groups = {g for g in groups if all(t in eligible for t, h, _, _ in self.stored if h == g)}
        assert self.buffer._core.eligible_group_count(max_staleness=staleness) == len(fresh_groups)
        if fresh_groups:
            batch = self.buffer.sample_groups(len(fresh_groups), max_staleness=staleness, seed=1)
            assert set(pa_column(batch, "group_id")) == fresh_groups
            assert len(batch) == sum(1 for _, g, _, _ in self.stored if g in fresh_groups)

    @invariant()
    def same_traces(self) -> None:
        assert self.buffer.to_batch().trace_ids == [t for t, _, _, _ in self.stored]
        assert self.buffer.policy_version == self.current


def pa_column(batch: masreplay.TraceBatch, name: str) -> list[Any]:
    return batch.to_arrow().column(name).to_pylist()


TestStalenessModel = StalenessModel.TestCase
TestStalenessModel.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)


def versioned(n: int, version: int, first: int = 0, group_size: int = 1) -> list[dict[str, Any]]:
    return [trace(f"v{version}-{first + k}", f"g{(first + k) // group_size}", version) for k in range(n)]


def test_a_bounded_buffer_refuses_traces_without_a_version():
    buffer = GraphBuffer(10, max_staleness=2)
    with pytest.raises(TraceValidationError) as error:
        buffer.add([trace("a", "g", 0), trace("b", "g", None)])
    assert error.value.trace_id == "b" and error.value.path == "/policy_version"
    assert len(buffer) == 0
    report = buffer.add([trace("a", "g", 0), trace("b", "g", None)], on_error="skip")
    assert report.added == 1 and [r[1] for r in report.rejected] == ["b"]


def test_the_buffer_bound_is_the_default_and_a_call_overrides_it():
    buffer = GraphBuffer(100, max_staleness=1, seed=4)
    for version in range(5):
        buffer.add(versioned(10, version))
    buffer.advance(4)
    assert buffer.max_staleness == 1
    assert set(buffer.sample(200).trace_ids) == {f"v{v}-{k}" for v in (3, 4) for k in range(10)}
    assert len(set(buffer.sample(400, max_staleness=4).trace_ids)) == 50
    assert buffer.evict_stale() == 30 and len(buffer) == 20


def test_advance_never_goes_back_but_the_version_may_be_set():
    buffer = GraphBuffer(10)
    buffer.advance(5)
    with pytest.raises(InvalidArgumentError, match="back"):
        buffer.advance(4)
    buffer.policy_version = 2
    assert buffer.policy_version == 2
    for bad in (-1, 1.5, None, True):
        with pytest.raises(InvalidArgumentError):
            buffer.policy_version = bad
    with pytest.raises(InvalidArgumentError, match="max_staleness"):
        buffer.evict_stale()
    with pytest.raises(InvalidArgumentError, match="max_staleness"):
        GraphBuffer(10, max_staleness=-1)


def test_out_of_order_versions_are_drawn_by_the_same_rule():
    """A late rollout of an old policy breaks the in-order fast path; the scan gives the same."""
    buffer = GraphBuffer(1000, seed=2)
    buffer.add(versioned(100, 5))
    buffer.add(versioned(100, 1))
    buffer.add(versioned(100, 6))
    buffer.advance(6)
    picked = buffer.sample(3000, max_staleness=1, seed=1).trace_ids
    assert {t.split("-")[0] for t in picked} == {"v5", "v6"}
    assert buffer._core.eligible(max_staleness=1) == (200, 200.0)
    assert buffer.evict_stale(1) == 100
    assert [t.split("-")[0] for t in buffer.to_batch().trace_ids] == ["v5"] * 100 + ["v6"] * 100


@pytest.mark.parametrize("in_order", [True, False])
def test_prioritized_draws_follow_priorities_among_the_fresh(in_order):
    buffer = GraphBuffer(64, seed=9)
    versions = [0, 1, 2, 3] if in_order else [3, 0, 2, 1]
    for version in versions:
        buffer.add(versioned(4, version, first=version * 4))
    ids = buffer.to_batch().trace_ids
    priorities = np.arange(1, len(ids) + 1, dtype=float)
    buffer.update_priorities(ids, priorities)
    buffer.advance(3)
    batch = buffer.sample(20000, sampler="prioritized", max_staleness=1, seed=5)
    fresh = {t: p for t, p in zip(ids, priorities, strict=True) if t.startswith(("v2", "v3"))}
    total = sum(fresh.values())
    counts = dict.fromkeys(fresh, 0)
    for t in batch.trace_ids:
        counts[t] += 1
    for t, p in fresh.items():
        assert abs(counts[t] / 20000 - p / total) < 0.02
    expected = np.array([fresh[t] / total for t in batch.trace_ids])
    np.testing.assert_allclose(batch.probabilities, expected)


def test_a_ring_that_wraps_draws_only_from_the_fresh_suffix():
    """Capacity evictions move the first slot around the priority ring: the fresh range then
    runs past the ring's end and on from slot 0."""
    buffer = GraphBuffer(6, seed=1)
    for version in range(7):
        buffer.add(versioned(2, version))
    buffer.advance(6)
    assert len(buffer) == 6
    for sampler in ("uniform", "prioritized"):
        picked = set(buffer.sample(500, sampler=sampler, max_staleness=1, seed=2).trace_ids)
        assert picked == {"v5-0", "v5-1", "v6-0", "v6-1"}


def test_staleness_settings_survive_save_load_and_pickle(tmp_path):
    buffer = GraphBuffer(100, max_staleness=2, seed=7)
    for version in range(4):
        buffer.add(versioned(5, version))
    buffer.advance(3)
    path = tmp_path / "buffer.parquet"
    buffer.save(path)
    for restored in (GraphBuffer.load(path), pickle.loads(pickle.dumps(buffer))):
        assert (restored.policy_version, restored.max_staleness) == (3, 2)
        assert restored._core.eligible() == (15, 15.0)
        assert restored.sample(64, seed=11).trace_ids == buffer.sample(64, seed=11).trace_ids


def test_traces_evicted_behind_a_trace_that_is_never_stale_are_let_go():
    # A demonstration (no policy_version: never stale) stays first while the trainer evicts
    # every stale version behind it, far below capacity: the buffer once kept every trace
    # added after it (its memory grew with every step).
    buffer = GraphBuffer(1_000_000)
    buffer.add([trace("demo", "demo", None)])
    for version in range(1, 61):
        buffer.add([trace(f"v{version}-{k}", f"g{version}-{k // 4}", version) for k in range(500)])
        buffer.advance(version)
        buffer.evict_stale(2)
    assert len(buffer) == 1 + 3 * 500
    assert buffer.to_batch().trace_ids[:2] == ["demo", "v58-0"]
    stored = GraphBuffer(1_000_000)
    stored.add(buffer.to_batch())
    assert buffer.nbytes <= 3 * stored.nbytes  # 23 times as much before
