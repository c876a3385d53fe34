"""TraceBuilder: assembles one trace dict (seed schema + masreplay additions) event by event."""

from __future__ import annotations

from typing import Any


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
