"""OpenTelemetry GenAI spans (OTLP JSON, the SDK's span JSON, Agent Lightning dumps) -> traces.

One trace per OpenTelemetry trace (per Agent Lightning rollout when spans name one). Spans
map by ``gen_ai.operation.name``: ``create_agent`` -> spawn of ``gen_ai.agent.name``;
``invoke_agent`` -> a message to the agent when the run starts and its return when it ends,
with the spans inside as that agent's events; ``execute_tool`` and ``retrieval`` ->
tool_call + tool_result;
``chat`` / ``text_completion`` / ``generate_content`` -> message; ``apply_guardrail`` ->
safety_event. ``gen_ai.usage.input_tokens`` + ``output_tokens`` are the tokens of the span's
first event, on every span that carries them, whatever its operation: an SDK that reports an
agent run's total on its invoke_agent span as well as on the chats inside counts twice (the
converter cannot tell a sum from usage of the agent's own). A span's ``exception`` events
become that event's ``exceptions`` (type and message); its other events and its links are
counted in the report's ``ignored`` (``span event <name>``, ``span link``).
``parent_span_id`` gives causal edges (parent -> child, child -> its parent's return) and
siblings that ran one after the other are linked by temporal edges. Agent Lightning
``agentlightning.reward`` spans are reward channels: the last one is the trace's rewards and
each also rewards the event that finished just before it. Spans with no GenAI operation are
counted in the report and see-through: their children hang on the nearest mapped ancestor.

Roles: an agent invoked by no other agent is an ``orchestrator``, an agent invoked inside
another's run a ``sub-agent``; the spawns and invoking messages of the caller outside every
agent run (``user``) have the role ``user``; tool results ``tool``. An invoke_agent span's
usage and exceptions are on its return (the agent's run, not the message that started it).
A field of the wrong type (a list of spans that is not a list, an attribute without a
``key``, a token count that is not a whole number) is a ConversionError naming the place; a
span that repeats the id of an earlier one is set aside with a report warning.
"""

from __future__ import annotations

import base64
import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from itertools import pairwise
from typing import Any

from masreplay.batch import TraceBatch
from masreplay.conversion_report import ConversionReport
from masreplay.convert._builder import TraceBuilder, load
from masreplay.convert._lines import json_document
from masreplay.convert._shape import Fail, describe, is_number, objects
from masreplay.convert._shape import field as typed
from masreplay.errors import ConversionError

USER = "user"
ORCHESTRATOR, SUB_AGENT, TOOL = "orchestrator", "sub-agent", "tool"
# Deeper OTLP values than the core stores in a trace document (validate/split.rs) are refused here.
MAX_NESTING = 100
REWARD_SPAN = "agentlightning.reward"
MESSAGE_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
# A retrieval is a call to a data source: a tool call whose result comes back.
TOOL_OPERATIONS = frozenset({"execute_tool", "retrieval"})
# Agent Lightning bookkeeping spans: understood, nothing to learn from.
IGNORED_SPANS = frozenset(
    {"agentlightning.message", "agentlightning.object", "agentlightning.virtual", "agentlightning.operation"}
)
_ERROR_STATUS = (2, "STATUS_CODE_ERROR", "ERROR")
USAGE_KEYS = ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens")
EXCEPTION_EVENT = "exception"


@dataclass(frozen=True)
class _Where:
    """Where a span was read: the file, its line for JSON Lines input, and a JSON pointer
    inside that line's object (or inside the whole document)."""

    source: str
    line: int | None
    pointer: str = ""

    def at(self, pointer: str) -> _Where:
        return replace(self, pointer=self.pointer + pointer)

    def fail(self, reason: str) -> ConversionError:
        """The error; a reason that starts with a pointer continues this one."""
        if reason.startswith("/"):
            return ConversionError(self.source, self.line, f"{self.pointer}{reason}" if self.pointer else reason)
        return ConversionError(self.source, self.line, f"{self.pointer}: {reason}" if self.pointer else reason)

    def __str__(self) -> str:
        return (self.source if self.line is None else f"{self.source}:{self.line}") + self.pointer


@dataclass
class _Span:
    trace: str
    id: str
    parent: str | None
    name: str
    start: float
    end: float
    attributes: dict[str, Any]
    error: bool
    where: _Where
    # Span events as (name, attributes), and how many links the span has.
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    links: int = 0

    def __post_init__(self) -> None:
        """The attributes the converter reads have the types it reads them as."""
        attributes, fail = self.attributes, self.where.fail
        typed(attributes, "gen_ai.operation.name", str, fail, "/attributes")
        for key in ("gen_ai.agent.name", "gen_ai.agent.id"):
            if attributes.get(key) is not None and not isinstance(attributes[key], (str, int)):
                raise fail(f"/attributes/{key} is {describe(attributes[key])}, expected text")
        for key in USAGE_KEYS:
            count = attributes.get(key)
            if count is not None and not (is_number(count) and count >= 0 and count == int(count)):
                raise fail(f"/attributes/{key} is {count!r}, expected a whole number of tokens")

    @property
    def operation(self) -> str | None:
        return self.attributes.get("gen_ai.operation.name")

    @property
    def agent_name(self) -> str | None:
        name = self.attributes.get("gen_ai.agent.name") or self.attributes.get("gen_ai.agent.id")
        return str(name) if name is not None else None

    @property
    def tokens(self) -> int | None:
        """Input + output tokens, on whatever span reports them; None when it reports none."""
        counts = [int(self.attributes[key]) for key in USAGE_KEYS if self.attributes.get(key) is not None]
        return sum(counts) if counts else None

    @property
    def exceptions(self) -> list[dict[str, Any]] | None:
        """The span's recorded exceptions (OpenTelemetry's ``exception`` events), type and message."""
        found = [
            {key: attributes[f"exception.{key}"] for key in ("type", "message") if f"exception.{key}" in attributes}
            for name, attributes in self.events
            if name == EXCEPTION_EVENT
        ]
        return found or None


def _any_value(value: Any, fail: Fail, place: str, depth: int = 0) -> Any:
    """An OTLP AnyValue ({"stringValue": ...}, {"intValue": "3"}, ...) as a Python value.
    Protobuf's JSON mapping writes 64-bit integers as text, and non-finite doubles as
    "NaN"/"Infinity", which are kept as text (a trace holds finite numbers only)."""
    if not isinstance(value, dict):
        raise fail(f"{place} is {describe(value)}, expected an OTLP value object")
    if depth > MAX_NESTING:
        raise fail(f"{place} nests values deeper than {MAX_NESTING} levels")
    if "stringValue" in value or "bytesValue" in value:
        return typed(value, "stringValue" if "stringValue" in value else "bytesValue", str, fail, place)
    if "boolValue" in value:
        return typed(value, "boolValue", bool, fail, place)
    if "intValue" in value:
        number = value["intValue"]
        if isinstance(number, str) and number.lstrip("-").isascii() and number.lstrip("-").isdigit():
            return int(number)
        if is_number(number) and number == int(number):
            return int(number)
        raise fail(f"{place}/intValue is {number!r}, expected a whole number")
    if "doubleValue" in value:
        number = value["doubleValue"]
        if is_number(number):
            return float(number)
        if isinstance(number, str):
            return number
        raise fail(f"{place}/doubleValue is {describe(number)}, expected a number")
    if "arrayValue" in value:
        array = typed(value, "arrayValue", dict, fail, place) or {}
        items = typed(array, "values", list, fail, f"{place}/arrayValue") or []
        return [_any_value(item, fail, f"{place}/arrayValue/values/{i}", depth + 1) for i, item in enumerate(items)]
    if "kvlistValue" in value:
        kvlist = typed(value, "kvlistValue", dict, fail, place) or {}
        return _otlp_attributes(kvlist.get("values"), fail, f"{place}/kvlistValue/values", depth + 1)
    return None


def _hex_id(value: Any, fail: Fail, place: str) -> str | None:
    """Trace and span ids as lowercase hex, whichever way the writer spelled them: OTLP JSON
    uses hex, protobuf's JSON mapping base64, the SDK's span JSON a 0x prefix."""
    if not value:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise fail(f"{place} is {describe(value)}, expected an id")
    text = str(value).lower().removeprefix("0x")
    if all(c in "0123456789abcdef" for c in text):
        return text
    try:
        raw = base64.b64decode(str(value), validate=True)
    except ValueError:
        return str(value)
    return raw.hex() if len(raw) in (8, 16) else str(value)


def _seconds(value: Any, where: _Where) -> float:
    """Epoch seconds from unix nanoseconds (OTLP), float seconds (Agent Lightning) or ISO-8601 (SDK JSON)."""
    try:
        if isinstance(value, str):
            if value.isascii() and value.isdigit():
                return _finite(int(value) / 1e9, value, where)
            return datetime.fromisoformat(value).timestamp()
        if is_number(value):
            return _finite(value / 1e9 if value > 1e14 else float(value), value, where)
    except (ValueError, OverflowError):
        raise where.fail(f"time {value!r} is neither nanoseconds, seconds nor ISO-8601") from None
    raise where.fail("missing or unreadable span time")


def _finite(seconds: float, value: Any, where: _Where) -> float:
    if not 0 <= seconds < 1e12:  # beyond the year 33000: not a time any exporter wrote
        raise where.fail(f"time {value!r} is out of range")
    return seconds


def _otlp_attributes(values: Any, fail: Fail, place: str, depth: int = 0) -> dict[str, Any]:
    """OTLP key-value pairs as a dict; each pair needs a text ``key``."""
    attributes = {}
    for i, kv in enumerate(objects(values, fail, place)):
        key = kv.get("key")
        if not isinstance(key, str):
            raise fail(f"{place}/{i}/key is {describe(key)}, expected text")
        value = kv.get("value")
        attributes[key] = None if value is None else _any_value(value, fail, f"{place}/{i}/value", depth)
    return attributes


def _otlp_spans(document: dict[str, Any], where: _Where) -> list[_Span]:
    spans = []
    for r, resource_spans in enumerate(objects(document.get("resourceSpans"), where.fail, "/resourceSpans")):
        place = f"/resourceSpans/{r}/scopeSpans"
        for s, scope_spans in enumerate(objects(resource_spans.get("scopeSpans"), where.fail, place)):
            for i, span in enumerate(objects(scope_spans.get("spans"), where.fail, f"{place}/{s}/spans")):
                here = where.at(f"{place}/{s}/spans/{i}")
                trace, span_id = (
                    _hex_id(span.get("traceId"), here.fail, "/traceId"),
                    _hex_id(span.get("spanId"), here.fail, "/spanId"),
                )
                if not trace or not span_id:
                    raise here.fail("span without traceId or spanId")
                events = objects(span.get("events"), here.fail, "/events")
                spans.append(
                    _Span(
                        trace,
                        span_id,
                        _hex_id(span.get("parentSpanId"), here.fail, "/parentSpanId"),
                        typed(span, "name", str, here.fail) or "",
                        _seconds(span.get("startTimeUnixNano"), here),
                        _seconds(span.get("endTimeUnixNano"), here),
                        _otlp_attributes(span.get("attributes"), here.fail, "/attributes"),
                        (typed(span, "status", dict, here.fail) or {}).get("code") in _ERROR_STATUS,
                        here,
                        [
                            (
                                typed(event, "name", str, here.fail, f"/events/{k}") or "",
                                _otlp_attributes(event.get("attributes"), here.fail, f"/events/{k}/attributes"),
                            )
                            for k, event in enumerate(events)
                        ],
                        len(objects(span.get("links"), here.fail, "/links")),
                    )
                )
    return spans


def _flat_span(record: dict[str, Any], where: _Where) -> _Span:
    """A span as the SDK's ``ReadableSpan.to_json`` or Agent Lightning's ``Span`` writes it."""
    fail = where.fail
    context = typed(record, "context", dict, fail) or {}
    parent = record.get("parent_id") or (typed(record, "parent", dict, fail) or {}).get("span_id")
    trace = typed(record, "rollout_id", str, fail) or _hex_id(
        record.get("trace_id") or context.get("trace_id"), fail, "/trace_id"
    )
    span_id = _hex_id(record.get("span_id") or context.get("span_id"), fail, "/span_id")
    if not trace or not span_id:
        raise fail("span without a trace id or span id")
    status = typed(record, "status", dict, fail) or {}
    events = objects(record.get("events"), fail, "/events")
    return _Span(
        trace,
        span_id,
        _hex_id(parent, fail, "/parent_id"),
        typed(record, "name", str, fail) or "",
        _seconds(record.get("start_time"), where),
        _seconds(record.get("end_time"), where),
        _text_keys(typed(record, "attributes", dict, fail) or {}, fail, "/attributes"),
        status.get("status_code") in _ERROR_STATUS,
        where,
        [
            (
                typed(event, "name", str, fail, f"/events/{k}") or "",
                _text_keys(typed(event, "attributes", dict, fail, f"/events/{k}") or {}, fail, f"/events/{k}/attributes"),
            )
            for k, event in enumerate(events)
        ],
        len(typed(record, "links", list, fail) or []),
    )


def _text_keys(attributes: dict[Any, Any], fail: Fail, place: str) -> dict[str, Any]:
    """A copy of span JSON attributes, whose names must be text (JSON's always are)."""
    for key in attributes:
        if not isinstance(key, str):
            raise fail(f"{place} has a name that is not text: {key!r}")
    return dict(attributes)


def _spans(document: Any, source: str, lines: list[int] | None) -> list[_Span]:
    """The spans of a document; ``lines`` numbers its items when it was read as JSON Lines."""
    items = document if isinstance(document, list) else [document]
    spans: list[_Span] = []
    for index, item in enumerate(items):
        if lines is not None:
            where = _Where(source, lines[index])
        else:
            where = _Where(source, None, f"/{index}" if isinstance(document, list) else "")
        if not isinstance(item, dict):
            raise where.fail(f"expected an object, got {type(item).__name__}")
        spans += _otlp_spans(item, where) if "resourceSpans" in item else [_flat_span(item, where)]
    return spans


def _rewards(span: _Span) -> dict[str, float]:
    """Reward channels of an Agent Lightning reward span, across its attribute conventions."""
    attributes = span.attributes
    rewards: dict[str, float] = {}
    for key, value in attributes.items():
        if not key.startswith(REWARD_SPAN + ".") or ".metadata" in key:
            continue
        rest = key[len(REWARD_SPAN) + 1 :]
        if rest.endswith(".value") and f"{REWARD_SPAN}.{rest[:-6]}.name" in attributes:
            if not is_number(value):
                raise span.where.fail(f"/attributes/{key} is {value!r}, expected a finite number")
            rewards[str(attributes[f"{REWARD_SPAN}.{rest[:-6]}.name"])] = float(value)
        elif not rest.endswith(".name") and is_number(value):
            rewards[rest] = float(value)
    output = attributes.get("agentops.task.output")
    if isinstance(output, str):
        try:
            parsed = json.loads(output)
        except (ValueError, RecursionError):
            parsed = None
        if isinstance(parsed, dict) and parsed.get("type") == "reward" and is_number(parsed.get("value")):
            rewards["primary"] = float(parsed["value"])
    if is_number(attributes.get("reward")):
        rewards.setdefault("primary", float(attributes["reward"]))
    return rewards


class _Trace:
    def __init__(self, trace_id: str, spans: list[_Span], report: ConversionReport) -> None:
        self.report = report
        self.by_id: dict[str, _Span] = {}
        for span in spans:
            first = self.by_id.setdefault(span.id, span)
            if first is not span:
                report.warnings.append(f"{span.where}: span {span.id!r} repeats the id of the span at {first.where}; set aside")
        self.spans = sorted(self.by_id.values(), key=lambda span: (span.start, span.end))
        self.start = min(span.start for span in self.spans)
        self.builder = TraceBuilder(trace_id, trace_id, system="opentelemetry", topology="hierarchical")
        self.first: dict[str, str] = {}  # span id -> its first event
        self.last: dict[str, str] = {}  # span id -> its last event
        self.reported: set[str] = set()  # spans whose usage and exceptions are on an event
        self.reward_spans: list[_Span] = []
        self.roles = self._agent_roles()

    def _agent_roles(self) -> dict[str, str]:
        """Agent -> orchestrator when some run of it is inside no other agent's, else sub-agent."""
        roles: dict[str, str] = {}
        for span in self.spans:
            if span.operation == "invoke_agent" and span.agent_name:
                top = self.agent_of(span) == USER or roles.get(span.agent_name) == ORCHESTRATOR
                roles[span.agent_name] = ORCHESTRATOR if top else SUB_AGENT
        return roles

    def ancestors(self, span: _Span) -> Iterator[_Span]:
        """Parent, grandparent, ...; stops at a parent missing from the export (a partial
        export) and at a loop of parent ids (a broken one)."""
        seen = {span.id}
        while span.parent and span.parent not in seen:
            seen.add(span.parent)
            parent = self.by_id.get(span.parent)
            if parent is None:
                return
            yield parent
            span = parent

    def mapped_parent(self, span: _Span) -> _Span | None:
        return next((parent for parent in self.ancestors(span) if parent.id in self.first), None)

    def agent_of(self, span: _Span) -> str:
        """The agent a span acts for: the agent name of the nearest enclosing invoke_agent span."""
        return next((p.agent_name for p in self.ancestors(span) if p.operation == "invoke_agent" and p.agent_name), USER)

    def event(self, span: _Span, suffix: str, t: float, type: str, agent: str, **fields: Any) -> str:
        if span.id not in self.reported and suffix != ":start":
            # The span's first event carries what the whole span reports: its token usage
            # (on any operation: an invoke_agent span may report usage its chats do not)
            # and the exceptions it recorded; an agent run's are on its return, the run's
            # own work, not on the message that started it.
            self.reported.add(span.id)
            fields.update(tokens=span.tokens, exceptions=span.exceptions)
        fields.setdefault("role", TOOL if type == "tool_result" else self.roles.get(agent))
        event_id = self.builder.event(f"{span.id}{suffix}", t - self.start, type, agent, span_name=span.name, **fields)
        self.first.setdefault(span.id, event_id)
        self.last[span.id] = event_id
        return event_id

    def convert_span(self, span: _Span) -> None:
        operation, attributes = span.operation, span.attributes
        caller = self.agent_of(span)
        duration = max(0.0, span.end - span.start)
        extra = {"span_attributes": attributes or None, "status_error": span.error or None}
        # The caller outside every agent run is the user (or the application) asking.
        asking = {"role": USER} if caller == USER else {}
        if operation == "create_agent":
            self.event(span, "", span.start, "spawn", caller, to=span.agent_name, duration_s=duration, **asking, **extra)
        elif operation == "invoke_agent":
            agent = span.agent_name or caller
            self.event(
                span, ":start", span.start, "message", caller, from_=caller, to=agent, kind="invoke_agent", **asking, **extra
            )
            self.event(span, ":end", span.end, "return", agent, from_=agent, to=caller, duration_s=duration)
        elif operation in TOOL_OPERATIONS:
            tool = str(attributes.get("gen_ai.tool.name") or attributes.get("gen_ai.data_source.id") or span.name)
            call = self.event(span, ":call", span.start, "tool_call", caller, tool=tool, **extra)
            result = self.event(
                span, ":result", span.end, "tool_result", tool, tool=tool, duration_s=duration, is_error=span.error or None
            )
            self.builder.edge(call, result, "return")
            if span.error:
                self.builder.edge(
                    result,
                    self.event(span, ":error", span.end, "safety_event", caller, tool=tool, reason="tool_error"),
                    "safety_flow",
                )
        elif operation in MESSAGE_OPERATIONS:
            model = attributes.get("gen_ai.response.model") or attributes.get("gen_ai.request.model")
            self.event(span, "", span.start, "message", caller, from_=caller, model=model, duration_s=duration, **extra)
        elif operation == "apply_guardrail":
            self.event(span, "", span.start, "safety_event", caller, kind="guardrail", duration_s=duration, **extra)
        elif span.name == REWARD_SPAN:
            self.reward_spans.append(span)
        elif operation is None and span.name in IGNORED_SPANS:
            self.report.ignored[f"span {span.name}"] += 1
        else:
            key = f"gen_ai.operation.name {operation}" if operation else "span without gen_ai.operation.name"
            self.report.unknown[key] += 1

    def count_set_aside(self, span: _Span) -> None:
        """Span events and links have no place in a trace: counted, so none vanish silently
        (a mapped span's exception events are on its first event instead)."""
        for name, _ in span.events:
            if name != EXCEPTION_EVENT or span.id not in self.reported:
                self.report.ignored[f"span event {name}"] += 1
        if span.links:
            self.report.ignored["span link"] += span.links

    def link(self) -> None:
        builder = self.builder
        children: dict[str | None, list[_Span]] = defaultdict(list)
        for span in self.spans:
            if span.id in self.first:
                parent = self.mapped_parent(span)
                children[parent.id if parent else None].append(span)
        for parent_id, kids in children.items():
            for before, after in pairwise(kids):
                if before.end <= after.start:
                    builder.edge(self.last[before.id], self.first[after.id], "temporal")
            if parent_id is None:
                continue
            for kid in kids:
                builder.edge(self.first[parent_id], self.first[kid.id], "causal")
                if self.last[parent_id] != self.first[parent_id]:
                    builder.edge(self.last[kid.id], self.last[parent_id], "return")
        spawns = {event["to"]: event["id"] for event in builder.events if event["type"] == "spawn" and "to" in event}
        for event in builder.events:
            if event.get("kind") == "invoke_agent" and event.get("to") in spawns:
                builder.edge(spawns[event["to"]], event["id"], "spawn")

    def reward(self) -> dict[str, float]:
        """Rewards each reward span's preceding event; the last reward span is the trace's."""
        finished = sorted(
            ((span.end, self.last[span.id]) for span in self.spans if span.id in self.last), key=lambda pair: pair[0]
        )
        events = {event["id"]: event for event in self.builder.events}
        rewards: dict[str, float] = {}
        for span in self.reward_spans:
            rewards = _rewards(span)
            if not rewards:
                self.report.warnings.append(f"{span.where}: reward span {span.id!r} carries no reward value")
            before = [event for end, event in finished if end <= span.start]
            if before and rewards:
                events[before[-1]].setdefault("reward", {}).update(rewards)
        return rewards

    def build(self) -> dict[str, Any] | None:
        for span in self.spans:
            self.convert_span(span)
            self.count_set_aside(span)
        if not self.builder.events:
            return None
        self.link()
        rewards = self.reward()
        return self.builder.build(wall_clock_s=max(span.end for span in self.spans) - self.start, rewards=rewards)


def otel(source: Any) -> TraceBatch:
    """Converts OpenTelemetry spans: a path to an OTLP JSON export (one document, or JSON
    Lines of them as the Collector's file exporter writes), a file of span JSON objects (the
    SDK's ``to_json``, Agent Lightning span dumps), or the parsed objects themselves."""
    name, document, lines = json_document(source)
    spans = _spans(document, name, lines)
    report = ConversionReport("otel", sources=[name], records=len(spans))
    grouped: dict[str, list[_Span]] = defaultdict(list)
    for span in spans:
        grouped[span.trace].append(span)
    traces, origins = [], []
    for trace_id, members in grouped.items():
        trace = _Trace(trace_id, members, report).build()
        if trace is None:
            report.warnings.append(f"{name}: trace {trace_id!r} has no GenAI spans; no trace made")
        else:
            traces.append(trace)
            origins.append((name, members[0].where.line))
    batch = load(traces, origins, name)
    report.traces, report.events = len(traces), sum(len(trace["events"]) for trace in traces)
    batch.conversion_report = report
    return batch
