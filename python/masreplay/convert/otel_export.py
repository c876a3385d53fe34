"""masreplay traces -> OTLP JSON spans under the OpenTelemetry GenAI semantic conventions, with
credit as span attributes, so tools that read OTLP (Langfuse, Phoenix, ...) show it as is.

Each agent is an ``invoke_agent`` span (``gen_ai.agent.name``) nested under the agent that
spawned it, lasting from its first to its last event. Each event is a span inside its
agent's: ``spawn`` -> ``create_agent`` (``gen_ai.agent.name`` the spawned agent),
``tool_call`` -> ``execute_tool`` (``gen_ai.tool.name``) lasting until its result, which it
stands for (the result's figures under ``masreplay.tool_result.*``), ``safety_event`` ->
``apply_guardrail``, any other event -> ``chat`` (a model's output: decision, message,
return, aggregate, ...). Tokens are ``gen_ai.usage.output_tokens``. Every event span carries
``masreplay.event.id``, ``masreplay.event.type``, ``masreplay.trace_id`` and, where known,
``masreplay.credit``, ``masreplay.credit.stderr`` and ``masreplay.advantage`` (GRPO over
the trace's group, for traces with a ``team`` reward). A trace's rewards close it as an
Agent Lightning ``agentlightning.reward`` span. :func:`masreplay.convert.otel` reads the file
back.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow.compute as pc

from masreplay._args import checked
from masreplay.advantages import advantages
from masreplay.batch import TraceBatch
from masreplay.errors import InvalidArgumentError
from masreplay.event_credit import resolve
from masreplay.io import write_text
from masreplay.viewer._model import lanes

SCOPE = {"name": "masreplay", "version": "1"}
OPERATIONS = {
    "spawn": "create_agent",
    "tool_call": "execute_tool",
    "tool_result": "execute_tool",
    "safety_event": "apply_guardrail",
}
REWARD_SPAN = "agentlightning.reward"


def _id(size: int, *parts: str) -> str:
    """A stable hex id of ``size`` bytes derived from names (OTLP ids are opaque bytes)."""
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[: 2 * size]


def _nanos(seconds: float) -> str:
    return str(round(seconds * 1e9))


def _value(value: Any) -> dict[str, Any]:
    """An OTLP AnyValue."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    return {"stringValue": str(value)}


def _attributes(values: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": key, "value": _value(value)} for key, value in values.items() if value is not None]


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


class _TraceSpans:
    """The spans of one trace, given its events' credit, stderr and advantage (NaN: none)."""

    def __init__(self, trace: dict[str, Any], credit: np.ndarray, stderr: np.ndarray, advantage: np.ndarray) -> None:
        self.trace = trace
        self.trace_hex = _id(16, trace["trace_id"])
        self.credit, self.stderr, self.advantage = credit, stderr, advantage
        self.spans: list[dict[str, Any]] = []

    def span(self, key: str, name: str, parent: str | None, start: float, end: float, attributes: dict[str, Any]) -> str:
        span_id = _id(8, self.trace["trace_id"], key)
        record = {
            "traceId": self.trace_hex,
            "spanId": span_id,
            "name": name,
            "kind": 1,
            "startTimeUnixNano": _nanos(start),
            "endTimeUnixNano": _nanos(max(start, end)),
            "attributes": _attributes(attributes),
        }
        if parent:
            record["parentSpanId"] = parent
        self.spans.append(record)
        return span_id

    def figures(self, i: int, prefix: str = "masreplay") -> dict[str, Any]:
        event = self.trace["events"][i]
        return {
            f"{prefix}.event.id": event["id"],
            f"{prefix}.event.type": event["type"],
            f"{prefix}.credit": _finite(self.credit[i]),
            f"{prefix}.credit.stderr": _finite(self.stderr[i]),
            f"{prefix}.advantage": _finite(self.advantage[i]),
        }

    def build(self) -> list[dict[str, Any]]:
        trace, events = self.trace, self.trace["events"]
        end_of = [event["t"] + (event.get("duration_s") or 0.0) for event in events]
        tree = lanes(trace)
        order, owner, result_of = tree.order, tree.of_event, tree.answers
        answered = set(result_of.values())
        of_lane: dict[int, list[int]] = defaultdict(list)
        for i, lane_index in enumerate(owner):
            of_lane[lane_index].append(i)
        agent_span: dict[int, str] = {}
        for lane_index, lane in enumerate(order):
            if lane["tool"]:  # a tool is no agent: its unanswered results sit in the root agent's span
                continue
            mine = of_lane[lane_index]
            start = min((events[i]["t"] for i in mine), default=0.0)
            end = max((end_of[i] for i in mine), default=start)
            parent = agent_span.get(lane["parent"])
            agent_span[lane_index] = self.span(
                f"agent:{lane['agent']}",
                f"invoke_agent {lane['agent']}",
                parent,
                start,
                end,
                {
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.agent.name": lane["agent"],
                    "masreplay.trace_id": trace["trace_id"],
                },
            )
        for i, event in enumerate(events):
            if i in answered:
                continue
            operation = OPERATIONS.get(event["type"], "chat")
            attributes: dict[str, Any] = {"gen_ai.operation.name": operation, "masreplay.trace_id": trace["trace_id"]}
            end = end_of[i]
            if operation == "create_agent":
                attributes["gen_ai.agent.name"] = event.get("to")
            elif operation == "execute_tool":
                attributes["gen_ai.tool.name"] = event.get("tool") or event["agent"]
            attributes["gen_ai.usage.output_tokens"] = event.get("tokens")
            attributes["masreplay.event.role"] = event.get("role")
            attributes.update(self.figures(i))
            if i in result_of:
                result = result_of[i]
                end = max(end, end_of[result])
                attributes.update(self.figures(result, "masreplay.tool_result"))
                attributes["masreplay.tool_result.tokens"] = events[result].get("tokens")
            name = f"{operation} {attributes.get('gen_ai.tool.name') or attributes.get('gen_ai.agent.name') or event['agent']}"
            self.span(f"event:{event['id']}", name, agent_span.get(owner[i], agent_span.get(0)), event["t"], end, attributes)
        rewards = {key: value for key, value in (trace.get("rewards") or {}).items() if isinstance(value, (int, float))}
        if rewards:
            last = max(end_of, default=0.0)
            channels: dict[str, Any] = {}
            for k, (channel, value) in enumerate(rewards.items()):
                channels[f"{REWARD_SPAN}.{k}.name"] = channel
                channels[f"{REWARD_SPAN}.{k}.value"] = float(value)
            self.span("rewards", REWARD_SPAN, agent_span.get(0), last, last, channels)
        return self.spans


@checked
def to_otel(batch: TraceBatch, path: str | os.PathLike[str], *, credit: Any = None) -> None:
    """Writes ``batch`` to ``path`` as one OTLP JSON document (``resourceSpans``), one
    OpenTelemetry trace per trace. ``credit``: per-event credit as :func:`masreplay.view`
    takes it (an array aligned with ``batch.events()``, :class:`~masreplay.Advantages`,
    :class:`~masreplay.TraceCredit`, or a table with trace_id, event_id, credit and
    optionally stderr columns)."""
    if not isinstance(batch, TraceBatch):
        raise InvalidArgumentError(f"batch must be a TraceBatch, got {type(batch).__name__}")
    n = batch.num_events
    given = resolve(batch, None, credit) if credit is not None else None
    values = given.values if given is not None else np.full(n, np.nan)
    stderr = given.stderr if given is not None else np.full(n, np.nan)
    team = pc.map_lookup(batch.to_arrow()["rewards"], "team", "first") if len(batch) else None
    advantage = np.full(n, np.nan)
    if team is not None and team.null_count < len(team):
        computed = advantages(batch, missing="skip", dtype="float64").per_event
        has_team = np.repeat(pc.is_valid(team).to_numpy(zero_copy_only=False), np.diff(batch.event_offsets))
        advantage = np.where(has_team, computed, np.nan)
    offsets = batch.event_offsets
    spans = []
    for k, trace in enumerate(batch):
        rows = slice(int(offsets[k]), int(offsets[k + 1]))
        spans += _TraceSpans(trace, values[rows], stderr[rows], advantage[rows]).build()
    document = {
        "resourceSpans": [
            {
                "resource": {"attributes": _attributes({"service.name": "masreplay"})},
                "scopeSpans": [{"scope": SCOPE, "spans": spans}],
            }
        ]
    }
    write_text(path, json.dumps(document, separators=(",", ":")))
