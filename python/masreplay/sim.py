"""Seeded synthetic orchestration traces, from a two-agent exchange to Kimi scale."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from masreplay import _core
from masreplay._args import I32_MAX, I64_MAX, real, whole
from masreplay.batch import TraceBatch
from masreplay.errors import InvalidArgumentError
from masreplay.io import load_traces

Range = int | tuple[int, int]


def _range(name: str, value: Range) -> tuple[int, int]:
    if isinstance(value, tuple | list):
        if len(value) != 2:
            raise InvalidArgumentError(f"{name} must be a count or a (low, high) pair, got {value!r}")
        low, high = value
    else:
        low = high = value
    return (whole(name, low), whole(name, high))


def generate(
    n_traces: int,
    *,
    agents: Range = (2, 4),
    depth: int = 1,
    fan_out: Range = (1, 4),
    events_per_agent: Range = (2, 6),
    group_size: int = 4,
    seed: int = 0,
    policy_version: int = 0,
) -> TraceBatch:
    """Generates ``n_traces`` valid traces, deterministic for ``seed``.

    Ranges are inclusive (an int means exactly that many). ``agents`` counts sub-agents per
    trace (the orchestrator is extra); ``depth`` bounds the spawn tree (1: the orchestrator
    spawns workers, 2: workers may spawn their own, ...); ``fan_out`` is how many children one
    agent spawns at once; ``events_per_agent`` is each sub-agent's work (messages, tool calls
    and results). Consecutive runs of ``group_size`` traces share task_id and group_id, as
    GRPO rollouts of one prompt do. Kimi scale: ``agents=300, events_per_agent=(10, 14)``
    gives about 4,000 events in one trace. ``policy_version`` tags every trace as made by that
    policy (for staleness-bounded buffers).
    """
    shape = _shape(agents, depth, fan_out, events_per_agent, group_size, seed)
    version = whole("policy_version", policy_version, high=I64_MAX)
    batch = TraceBatch(_core.simulate(whole("n_traces", n_traces, high=I32_MAX), shape))
    if version == 0:  # the core's own tag
        return batch
    table = batch.to_arrow()
    column = table.schema.get_field_index("policy_version")
    return load_traces(table.set_column(column, "policy_version", pa.array([version] * len(batch), pa.int64())))


def _shape(agents: Range, depth: int, fan_out: Range, events_per_agent: Range, group_size: int, seed: int) -> dict:
    """The generator's shape arguments, checked, as the core takes them."""
    return {
        "agents": _range("agents", agents),
        "depth": whole("depth", depth),
        "fan_out": _range("fan_out", fan_out),
        "events_per_agent": _range("events_per_agent", events_per_agent),
        "group_size": whole("group_size", group_size),
        "seed": whole("seed", seed),
    }


@dataclass(frozen=True)
class GroundTruth:
    """Factual traces with branch rollouts, and what the estimators should find."""

    #: Each factual trace followed by its branches (``counterfactual_of`` set).
    batch: TraceBatch
    #: One row per branch point: trace_id, event_id, kind, effect (the true
    #: E[R | factual event] - E[R | its alternatives]).
    effects: pa.Table
    #: One row per agent of each factual trace: trace_id, agent, value (its true Shapley value).
    agent_values: pa.Table


def branches(
    n_traces: int,
    *,
    branches: int = 8,
    branch_points: int = 3,
    noise: float = 0.1,
    agents: Range = (2, 4),
    depth: int = 1,
    fan_out: Range = (1, 4),
    events_per_agent: Range = (2, 6),
    group_size: int = 4,
    seed: int = 0,
) -> GroundTruth:
    """Factual traces (as :func:`generate`) plus branch rollouts from a known reward model.

    The team reward is the sum of per-event contributions (uniform on [-0.5, 0.5]) plus
    Gaussian ``noise``. Each trace gets ``branches`` rollouts at ``branch_points`` of its
    events: a spawn replaced by a no-op (``no_spawn``: the spawned subtree never runs), events
    substituted by an alternative (a fresh contribution) or ablated (removed). Branches keep
    the factual continuation and draw fresh noise, so every event's true effect and every
    agent's true Shapley value (the sum of its events' contributions) are known.
    """
    core, effects, values = _core.simulate_branches(
        whole("n_traces", n_traces, high=I32_MAX),
        _shape(agents, depth, fan_out, events_per_agent, group_size, seed),
        branches=whole("branches", branches, high=I32_MAX),
        branch_points=whole("branch_points", branch_points, high=I32_MAX),
        noise=real("noise", noise, low=0.0),
    )
    effect_columns = list(zip(*effects, strict=True)) if effects else [[], [], [], []]
    value_columns = list(zip(*values, strict=True)) if values else [[], [], []]
    return GroundTruth(
        batch=TraceBatch(core),
        effects=pa.table(
            [pa.array(c, t) for c, t in zip(effect_columns, (pa.string(), pa.string(), pa.string(), pa.float64()), strict=True)],
            names=["trace_id", "event_id", "kind", "effect"],
        ),
        agent_values=pa.table(
            [pa.array(c, t) for c, t in zip(value_columns, (pa.string(), pa.string(), pa.float64()), strict=True)],
            names=["trace_id", "agent", "value"],
        ),
    )
