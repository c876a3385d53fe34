"""Seeded synthetic orchestration traces, from a two-agent exchange to Kimi scale."""

from __future__ import annotations

import operator

from masreplay import _core
from masreplay.batch import TraceBatch
from masreplay.errors import InvalidArgumentError

Range = int | tuple[int, int]

_U64_MAX = 2**64 - 1


def _count(name: str, value: int, high: int = _U64_MAX) -> int:
    """A non-negative whole number; the core takes unsigned integers, and a negative one would
    surface as an OverflowError that names no argument."""
    number = operator.index(value)
    if not 0 <= number <= high:
        raise InvalidArgumentError(f"{name} must be an integer in [0, {high}], got {number}")
    return number


def _range(name: str, value: Range) -> tuple[int, int]:
    if isinstance(value, tuple | list):
        low, high = value
    else:
        low = high = value
    return (_count(name, low), _count(name, high))


def generate(
    n_traces: int,
    *,
    agents: Range = (2, 4),
    depth: int = 1,
    fan_out: Range = (1, 4),
    events_per_agent: Range = (2, 6),
    group_size: int = 4,
    seed: int = 0,
) -> TraceBatch:
    """Generates ``n_traces`` valid traces, deterministic for ``seed``.

    Ranges are inclusive (an int means exactly that many). ``agents`` counts sub-agents per
    trace (the orchestrator is extra); ``depth`` bounds the spawn tree (1: the orchestrator
    spawns workers, 2: workers may spawn their own, ...); ``fan_out`` is how many children one
    agent spawns at once; ``events_per_agent`` is each sub-agent's work (messages, tool calls
    and results). Consecutive runs of ``group_size`` traces share task_id and group_id, as
    GRPO rollouts of one prompt do. Kimi scale: ``agents=300, events_per_agent=(10, 14)``
    gives about 4,000 events in one trace.
    """
    return TraceBatch(
        _core.simulate(
            _count("n_traces", n_traces),
            agents=_range("agents", agents),
            depth=_count("depth", depth),
            fan_out=_range("fan_out", fan_out),
            events_per_agent=_range("events_per_agent", events_per_agent),
            group_size=_count("group_size", group_size),
            seed=_count("seed", seed),
        )
    )
