"""TraceBuilder: assembles one trace dict (seed schema + masreplay additions) event by event;
``load`` turns the converted dicts into a batch."""

from __future__ import annotations

from typing import Any

from masreplay.batch import TraceBatch
from masreplay.errors import ConversionError, MasreplayError, TraceValidationError
from masreplay.io import load_traces

#: Where a converted trace came from: its source and, when one record made it, that record's line.
Origin = tuple[str, int | None]


class TraceBuilder:
    """Collects events and edges; drops unset optional fields and repeated or self edges.

    Converters reach events through their own ids (a transcript line's uuid, a span id), so
    an edge may name an event that was never made (a line the converter set aside):
    ``edge`` ignores those and returns False, and the caller decides whether that matters.
    """

    def __init__(self, trace_id: str, task_id: str, *, system: str | None = None, topology: str | None = None) -> None:
        self.trace_id = trace_id
        self.task_id = task_id
        self.system = system
        self.topology = topology
        self.events: list[dict[str, Any]] = []
        self.edges: list[dict[str, str]] = []
        self._ids: set[str] = set()
        self._edge_keys: set[tuple[str, str]] = set()

    def __contains__(self, event_id: str) -> bool:
        return event_id in self._ids

    def event(self, event_id: str, t: float, type: str, agent: str, **fields: Any) -> str:
        event = {"id": event_id, "t": max(0.0, float(t)), "type": type, "agent": agent}
        # Fields are keyword names; `from` is a Python keyword, so it arrives as `from_`.
        event.update({key.rstrip("_"): value for key, value in fields.items() if value is not None})
        self.events.append(event)
        self._ids.add(event_id)
        return event_id

    def edge(self, src: str | None, dst: str | None, type: str) -> bool:
        if src is None or dst is None or src == dst or src not in self._ids or dst not in self._ids:
            return False
        if (src, dst) not in self._edge_keys:
            self._edge_keys.add((src, dst))
            self.edges.append({"src": src, "dst": dst, "type": type})
        return True

    def build(
        self,
        *,
        wall_clock_s: float,
        rewards: dict[str, float] | None = None,
        metrics: dict[str, float] | None = None,
        tokens: float | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """The trace dict. Costs count tokens over events (unless given: a source may only
        know the total), tool calls and messages."""
        types = [event["type"] for event in self.events]
        costs = {
            "tokens": tokens if tokens is not None else sum(event.get("tokens", 0) for event in self.events),
            "wall_clock_s": max(0.0, wall_clock_s),
            "tool_calls": types.count("tool_call"),
            "messages": types.count("message"),
        }
        trace: dict[str, Any] = {"trace_id": self.trace_id, "task_id": self.task_id}
        if self.system is not None:
            trace["system"] = self.system
        if self.topology is not None:
            trace["topology"] = self.topology
        trace.update(events=self.events, edges=self.edges, rewards=rewards or {}, costs=costs)
        if metrics:
            trace["metrics"] = metrics
        trace.update({key: value for key, value in extra.items() if value is not None})
        return trace


def load(traces: list[dict[str, Any]], origins: list[Origin], source: str) -> TraceBatch:
    """The converted traces as a batch. A trace the data contract rejects carries a value of
    the input it cannot hold (a negative token count, a number beyond 64 bits, an attribute
    nested too deep): a ConversionError naming the record it came from (``origins[i]`` is
    trace i's), with the validation error as its cause."""
    try:
        return load_traces(traces)
    except TraceValidationError as error:
        where = {trace["trace_id"]: origin for trace, origin in zip(traces, origins, strict=True)}
        at, line = where.get(error.trace_id, (source, None))
        raise ConversionError(
            at, line, f"converted trace {error.trace_id!r} is invalid at {error.path or '/'}: {error.reason}"
        ) from error
    except MasreplayError as error:
        raise ConversionError(source, None, f"converted traces rejected: {error}") from error
