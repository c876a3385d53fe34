"""GraphBuffer: the graph-native, variable-shape replay buffer a training loop calls."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow as pa

from masreplay import _core
from masreplay._args import I32_MAX, I64_MAX, checked, ids, is_text, numbers, optional_whole, whole, wrong_type
from masreplay.bands import band_limits
from masreplay.batch import Rejected, TraceBatch, _from_ipc_table, _to_ipc
from masreplay.io import OnError, _load
from masreplay.vocabulary import Sampler, Unit


class AddReport(int):
    """What ``GraphBuffer.add`` did: the number of traces added (an int, so ``buffer.add(traces)
    == n`` holds), with the traces ``on_error="skip"`` left out in ``rejected`` as (position in
    the input, trace_id, error), in input order (always empty with ``on_error="raise"``, which
    raises instead)."""

    rejected: list[Rejected]

    def __new__(cls, added: int, rejected: list[Rejected] | None = None) -> AddReport:
        report = super().__new__(cls, added)
        report.rejected = [] if rejected is None else list(rejected)
        return report

    @property
    def added(self) -> int:
        return int(self)

    def __repr__(self) -> str:
        return f"AddReport(added={int(self)}, rejected={self.rejected!r})"


class GraphBuffer:
    """A replay buffer of whole orchestration traces, kept as graphs in Arrow.

    ``capacity`` counts traces (``unit="traces"``) or events (``unit="events"``); when full,
    the oldest whole traces are evicted (never part of one). Safe to share between threads:
    rollout workers may ``add`` while the trainer samples.

    Staleness: a trace's ``policy_version`` says which policy produced it, ``policy_version``
    of the buffer is the trainer's current one (``advance`` moves it on), and a sample with
    ``max_staleness=k`` draws only traces with version >= current - k. ``max_staleness`` here
    is the default bound of every sample; a buffer given one refuses traces without a
    policy_version. In a buffer without one, a trace without policy_version is never stale.
    Uniform bounded sampling costs O(batch_size) while versions arrive in order (each add
    no older than the last), prioritized O(batch_size log n); otherwise, or with a shape filter,
    it scans the stored traces once per call.
    """

    __slots__ = ("_core",)

    @checked
    def __init__(
        self,
        capacity: int,
        *,
        unit: Unit = "traces",
        seed: int = 0,
        max_staleness: int | None = None,
    ) -> None:
        self._core = _core.GraphBuffer(
            whole("capacity", capacity),
            unit=unit,
            seed=whole("seed", seed),
            max_staleness=optional_whole("max_staleness", max_staleness),
        )

    @classmethod
    def _wrap(cls, core: _core.GraphBuffer) -> GraphBuffer:
        buffer = cls.__new__(cls)
        buffer._core = core
        return buffer

    # ---- contents ----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._core)

    def __contains__(self, trace_id: object) -> bool:
        return isinstance(trace_id, str) and is_text(trace_id) and trace_id in self._core

    def __repr__(self) -> str:
        if self.unit == "traces":
            return f"GraphBuffer({len(self)}/{self.capacity} traces)"
        return f"GraphBuffer({self.num_events}/{self.capacity} events, {len(self)} traces)"

    @property
    def num_events(self) -> int:
        return self._core.num_events

    @property
    def num_groups(self) -> int:
        return self._core.num_groups

    @property
    def nbytes(self) -> int:
        """Memory held by the stored traces, in bytes (a buffer shared by several columns or
        traces, such as the one zero buffer behind every absent optional field, counts once)."""
        return self._core.nbytes

    @property
    def capacity(self) -> int:
        return self._core.capacity

    @property
    def unit(self) -> str:
        return self._core.unit

    # ---- staleness ---------------------------------------------------------------------
    @property
    def policy_version(self) -> int:
        """The trainer's current policy version (0 until set); staleness counts back from it.
        Setting it accepts any version >= 0 (a resumed trainer); ``advance`` only moves on."""
        return self._core.policy_version

    @policy_version.setter
    def policy_version(self, version: int) -> None:
        self._core.policy_version = whole("policy_version", version, high=I64_MAX)

    def advance(self, version: int) -> None:
        """Moves the current policy version forward to ``version`` (never back)."""
        self._core.advance(whole("policy_version", version, high=I64_MAX))

    @property
    def max_staleness(self) -> int | None:
        """The staleness bound samples use when their call gives none."""
        return self._core.max_staleness

    def evict_stale(self, max_staleness: int | None = None) -> int:
        """Removes every trace with policy_version < current - ``max_staleness`` (the buffer's
        own bound when None), each with its branch rollouts; returns how many traces left.
        Traces without policy_version are never stale."""
        return self._core.evict_stale(optional_whole("max_staleness", max_staleness))

    @checked
    def get(self, trace_id: str) -> dict[str, Any]:
        """The stored trace as a dict; TraceNotFoundError (a KeyError) if it is not stored."""
        return TraceBatch(self._core.get(trace_id))[0]

    def to_arrow(self) -> pa.Table:
        """Every stored trace as the canonical table, in insertion order."""
        return pa.table(self._core.to_batch())

    def to_batch(self) -> TraceBatch:
        return TraceBatch(self._core.to_batch())

    def priorities(self) -> np.ndarray:
        """Priorities of the stored traces, in insertion order."""
        return self._core.priorities()

    # ---- adding ------------------------------------------------------------------------
    @checked
    def add(self, traces: Any, *, on_error: OnError = "raise") -> AddReport:
        """Validates and adds ``traces`` (anything ``masreplay.load_traces`` accepts); returns
        an AddReport, the number of traces added.

        ``on_error="raise"``: if any trace is invalid, or its id is already stored, nothing
        is added and TraceValidationError is raised.
        ``on_error="skip"``: the valid traces are added; the report lists the others.
        """
        core_batch, load_rejected = _load(traces, strict_seed=False)
        if load_rejected and on_error == "raise":
            raise load_rejected[0][2]
        added, add_rejected = self._core.add(core_batch, skip_invalid=on_error == "skip")
        return AddReport(added, _in_input_order(load_rejected, add_rejected, len(core_batch)))

    # ---- sampling ----------------------------------------------------------------------
    @checked
    def sample(
        self,
        batch_size: int,
        *,
        seed: int | None = None,
        sampler: Sampler = "uniform",
        min_events: int | None = None,
        max_events: int | None = None,
        band: int | None = None,
        with_branches: bool = False,
        max_staleness: int | None = None,
    ) -> TraceBatch:
        """Draws ``batch_size`` traces with replacement, uniformly or in proportion to their
        priorities; ``batch.probabilities`` holds each draw's probability (for importance
        weights). ``min_events``/``max_events`` or a length ``band`` (10, 100, 1000, 10000)
        restrict the draw by shape. ``seed=None`` continues the buffer's own seeded stream.
        ``with_branches`` appends the stored branch rollouts of the drawn traces, each
        once and none that was drawn itself (their probability is NaN: they come with a draw,
        they are not drawn), so that ``counterfactual_credit`` of the sample counts each
        rollout once. ``max_staleness``
        (else the buffer's own) draws only among traces with policy_version >= current -
        max_staleness, with the same rule (uniform or by priority) among them."""
        if band is not None:
            min_events, max_events = band_limits(band)
        core, probabilities = self._core.sample(
            whole("batch_size", batch_size, high=I32_MAX),
            sampler=sampler,
            min_events=optional_whole("min_events", min_events),
            max_events=optional_whole("max_events", max_events),
            seed=optional_whole("seed", seed),
            with_branches=with_branches,
            max_staleness=optional_whole("max_staleness", max_staleness),
        )
        return TraceBatch(core, probabilities=probabilities)

    @checked
    def sample_groups(
        self,
        num_groups: int,
        *,
        group_size: int | None = None,
        seed: int | None = None,
        max_staleness: int | None = None,
    ) -> TraceBatch:
        """Draws ``num_groups`` distinct GRPO groups uniformly: each whole (every stored trace
        with that group_id) or, with ``group_size``, exactly that many of its traces. With a
        staleness bound a group is eligible only when every one of its traces is fresh enough."""
        selection = self._core.sample_groups(
            whole("num_groups", num_groups, high=I32_MAX),
            group_size=optional_whole("group_size", group_size),
            seed=optional_whole("seed", seed),
            max_staleness=optional_whole("max_staleness", max_staleness),
        )
        return TraceBatch(selection)

    @checked
    def update_priorities(self, trace_ids: Any, priorities: Any, *, missing: OnError = "raise") -> int:
        """Sets priorities (finite, >= 0) of stored traces and returns how many it set; all or
        nothing. A trace no longer stored (drawn, then evicted by later adds before the
        update) is refused with ``missing="raise"``, and left out with ``missing="skip"``,
        what a learner wants while producers keep adding. A trace named more than once (a
        sample drawn with replacement) takes its last priority, as numpy's assignment does.
        New traces get the largest priority seen so far."""
        if isinstance(trace_ids, (set, frozenset)):  # its order is the hash table's, not the caller's
            raise wrong_type("trace_ids", "ids in the order of their priorities (a list or an array)", trace_ids)
        keys = ids("trace_ids", trace_ids)
        values = numbers("priorities", priorities).ravel().tolist()
        return self._core.update_priorities(keys, values, skip_missing=missing == "skip")

    @checked
    def branches(self, trace_id: str, event_id: str | None = None) -> TraceBatch:
        """The stored branch rollouts of ``trace_id`` (only those at ``event_id`` when given),
        in insertion order. A branch is added only with or after its factual trace, and is
        evicted together with it, so a stored branch always has its factual trace."""
        return TraceBatch(self._core.branches(trace_id, event_id))

    # ---- graph queries -----------------------------------------------------------------
    @checked
    def ancestors(self, trace_id: str, event_id: str) -> list[str]:
        """Ids of the events that have a path to ``event_id``."""
        return self._core.ancestors(trace_id, event_id)

    @checked
    def descendants(self, trace_id: str, event_id: str) -> list[str]:
        """Ids of the events reachable from ``event_id``."""
        return self._core.descendants(trace_id, event_id)

    @checked
    def subgraph(self, trace_id: str, event_ids: Any) -> TraceBatch:
        """The trace restricted to ``event_ids`` and the edges between them."""
        return TraceBatch(self._core.subgraph(trace_id, ids("event_ids", event_ids)))

    @checked
    def agent_view(self, trace_id: str, agent: str) -> TraceBatch:
        """The events of one agent and the edges between them."""
        return TraceBatch(self._core.agent_view(trace_id, agent))

    # ---- persistence -------------------------------------------------------------------
    @checked
    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes traces (canonical Parquet layout), priorities, insertion order and settings
        to one file, atomically (a killed save leaves the previous file intact)."""
        self._core.save(os.fspath(path))

    @classmethod
    @checked
    def load(cls, path: str | os.PathLike[str]) -> GraphBuffer:
        """Resumes a saved buffer exactly; a truncated or foreign file raises MasreplayError."""
        return cls._wrap(_core.GraphBuffer.load(os.fspath(path)))

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        return (_buffer_from_ipc, (_to_ipc(pa.table(self._core.persisted())),))


def _in_input_order(load_rejected: list[Rejected], add_rejected: list[Rejected], n_passed: int) -> list[Rejected]:
    """Traces refused by validation and by the buffer, by position in the caller's input:
    the buffer numbers only the ``n_passed`` traces that passed validation."""
    refused = {position for position, _, _ in load_rejected}
    passed = [p for p in range(n_passed + len(load_rejected)) if p not in refused]
    rejected = [*load_rejected, *((passed[k], trace_id, error) for k, trace_id, error in add_rejected)]
    return sorted(rejected, key=lambda entry: entry[0])


def _buffer_from_ipc(data: bytes) -> GraphBuffer:
    """Unpickles a buffer, checked in full (see batch._from_ipc)."""
    return GraphBuffer._wrap(_core.GraphBuffer.restore(_from_ipc_table(data)))
