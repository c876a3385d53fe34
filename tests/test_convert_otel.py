"""The OpenTelemetry converter on spans that the real OpenTelemetry SDK emitted and its own
exporters wrote: OTLP JSON through the SDK's OTLP encoder, and the SDK's span JSON through
its ConsoleSpanExporter. Expected counts are read back from the written files here."""

from __future__ import annotations

import base64
import json
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest
from google.protobuf.json_format import MessageToJson
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as GenAI
from opentelemetry.trace import Link, Status, StatusCode

import masreplay
from masreplay import convert


class OtlpJsonFileExporter(SpanExporter):
    """Each export as one OTLP JSON document a line (the layout of the Collector's file exporter)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def export(self, spans) -> SpanExportResult:
        with self.path.open("a", encoding="utf-8") as out:
            out.write(MessageToJson(encode_spans(spans), indent=None) + "\n")
        return SpanExportResult.SUCCESS


# apply_guardrail is newer than the semantic conventions package the SDK ships with.
OPERATIONS = {value.value for value in GenAI.GenAiOperationNameValues} | {"apply_guardrail"}


def op(name: str, **attributes) -> dict:
    """Span attributes under their official names: ``gen_ai_usage_input_tokens=3`` is
    ``{GenAI.GEN_AI_USAGE_INPUT_TOKENS: 3}``, taken from the SDK's semantic conventions."""
    assert name in OPERATIONS
    return {GenAI.GEN_AI_OPERATION_NAME: name, **{getattr(GenAI, key.upper()): value for key, value in attributes.items()}}


def run_agents(tracer) -> None:
    """A lead agent that chats, spawns two workers, runs them and gets rewarded; plus a
    second, one-chat trace linked to the first. The coder's run reports usage of its own
    (no chat inside), its failing tool records an exception and a retry event."""
    with tracer.start_as_current_span("invoke_agent lead", attributes=op("invoke_agent", gen_ai_agent_name="lead")) as lead:
        with tracer.start_as_current_span(
            "chat plan",
            attributes=op("chat", gen_ai_request_model="m", gen_ai_usage_input_tokens=120, gen_ai_usage_output_tokens=30),
        ):
            pass
        for worker in ("researcher", "coder"):
            with tracer.start_as_current_span(f"create_agent {worker}", attributes=op("create_agent", gen_ai_agent_name=worker)):
                pass
        with tracer.start_as_current_span(
            "invoke_agent researcher", attributes=op("invoke_agent", gen_ai_agent_name="researcher")
        ):
            with tracer.start_as_current_span(
                "chat", attributes=op("chat", gen_ai_usage_input_tokens=50, gen_ai_usage_output_tokens=7)
            ):
                pass
            with (
                tracer.start_as_current_span("HTTP GET"),  # no GenAI operation: see-through
                tracer.start_as_current_span("execute_tool search", attributes=op("execute_tool", gen_ai_tool_name="search")),
            ):
                pass
        coder = op("invoke_agent", gen_ai_agent_name="coder", gen_ai_usage_input_tokens=11, gen_ai_usage_output_tokens=4)
        with tracer.start_as_current_span("invoke_agent coder", attributes=coder):
            with tracer.start_as_current_span(
                "execute_tool run", attributes=op("execute_tool", gen_ai_tool_name="run"), record_exception=False
            ) as failing:
                failing.add_event("retry", {"attempt": 1})
                failing.record_exception(RuntimeError("exit 1"))
                failing.set_status(Status(StatusCode.ERROR, "exit 1"))
            with tracer.start_as_current_span("apply_guardrail", attributes=op("apply_guardrail")):
                pass
        with tracer.start_as_current_span(
            "agentlightning.reward", attributes={"agentlightning.reward.0.name": "task", "agentlightning.reward.0.value": 0.75}
        ):
            pass
    alone = op("chat", gen_ai_usage_input_tokens=5, gen_ai_usage_output_tokens=1)
    with tracer.start_as_current_span("chat alone", attributes=alone, links=[Link(lead.get_span_context())]):
        pass


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("otel")
    otlp, sdk_json = folder / "spans.otlp.jsonl", folder / "spans.sdk.jsonl"
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OtlpJsonFileExporter(otlp)))
    with sdk_json.open("w", encoding="utf-8") as out:
        console = ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")
        provider.add_span_processor(SimpleSpanProcessor(console))
        run_agents(provider.get_tracer("masreplay-test"))
        provider.shutdown()
    return otlp, sdk_json


def span_hex(span_id: str) -> str:
    """An OTLP JSON span id (protobuf's JSON mapping writes bytes as base64) as hex."""
    return base64.b64decode(span_id).hex()


def raw_spans(otlp: Path) -> list[dict]:
    """Spans of the OTLP JSON file with their attributes as a plain dict."""
    spans = []
    for line in otlp.read_text().splitlines():
        for resource in json.loads(line)["resourceSpans"]:
            for scope in resource["scopeSpans"]:
                for span in scope["spans"]:
                    values = {kv["key"]: next(iter(kv["value"].values())) for kv in span.get("attributes", [])}
                    spans.append({**span, "attrs": values})
    return spans


def test_otlp_json_from_the_sdk_converts(exported, seed_validator):
    otlp, _ = exported
    spans = raw_spans(otlp)
    operations = Counter(span["attrs"].get("gen_ai.operation.name") for span in spans)
    batch = convert.otel(otlp)
    assert len(batch) == len({span["traceId"] for span in spans}) == 2
    for index in range(len(batch)):
        seed_validator.validate(batch.to_seed_json(index))
    lead = next(trace for trace in batch if len(trace["events"]) > 1)
    types = Counter(event["type"] for event in lead["events"])
    assert types["spawn"] == operations["create_agent"] == 2
    assert types["tool_call"] == types["tool_result"] == operations["execute_tool"] == 2
    assert types["return"] == operations["invoke_agent"] == 3
    assert types["safety_event"] == operations["apply_guardrail"] + 1  # + the failed tool
    tokens = sum(
        int(span["attrs"].get(key, 0)) for span in spans for key in ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens")
    )
    assert sum(trace["costs"]["tokens"] for trace in batch) == tokens
    assert {event["to"] for event in lead["events"] if event["type"] == "spawn"} == {"researcher", "coder"}
    events = {event["id"]: event for event in lead["events"]}
    pairs = [(events[e["src"]], events[e["dst"]]) for e in lead["edges"] if e["type"] == "return"]
    assert sorted(call["tool"] for call, result in pairs if call["type"] == "tool_call" and result["type"] == "tool_result") == [
        "run",
        "search",
    ]
    assert {event["agent"] for event in lead["events"] if event["type"] == "tool_call"} == {"researcher", "coder"}
    assert lead["rewards"] == {"task": 0.75}
    report = batch.conversion_report
    assert report.unknown == Counter({"span without gen_ai.operation.name": 1}) and report.records == len(spans)


def test_usage_counts_on_every_span_that_reports_it(exported):
    otlp, _ = exported
    reporting = [span for span in raw_spans(otlp) if "gen_ai.usage.input_tokens" in span["attrs"]]
    assert {span["attrs"]["gen_ai.operation.name"] for span in reporting} == {"chat", "invoke_agent"}
    events = {event["id"]: event for trace in convert.otel(otlp) for event in trace["events"]}
    for span in reporting:
        # An agent run's usage is on its return (the run's work), any other span's on its first event.
        carrier = next(
            event for id, event in events.items() if id.split(":")[0] == span_hex(span["spanId"]) and not id.endswith(":start")
        )
        assert carrier["tokens"] == int(span["attrs"]["gen_ai.usage.input_tokens"]) + int(
            span["attrs"]["gen_ai.usage.output_tokens"]
        )


def test_span_events_and_links_are_kept_or_counted(exported):
    """Exception events ride on their span's first event; other events and links are
    counted in the report; the SDK's span JSON says the same as OTLP JSON."""
    otlp, sdk_json = exported
    spans = raw_spans(otlp)
    set_aside = Counter(
        f"span event {event['name']}" for span in spans for event in span.get("events", []) if event["name"] != "exception"
    )
    set_aside["span link"] = sum(len(span.get("links", [])) for span in spans)
    assert set_aside == Counter({"span event retry": 1, "span link": 1})
    thrown = {
        span_hex(span["spanId"]): [
            {
                key: attribute["value"]["stringValue"]
                for attribute in event["attributes"]
                for key in ("type", "message")
                if attribute["key"] == f"exception.{key}"
            }
        ]
        for span in spans
        for event in span.get("events", [])
        if event["name"] == "exception"
    }
    assert thrown and all(found == [{"type": "RuntimeError", "message": "exit 1"}] for found in thrown.values())
    for batch in (convert.otel(otlp), convert.otel(sdk_json)):
        assert batch.conversion_report.ignored == set_aside
        firsts = {event["id"].split(":")[0]: event for trace in batch for event in reversed(trace["events"])}
        assert {span_id: firsts[span_id].get("exceptions") for span_id in thrown} == thrown
        assert sum("exceptions" in event for trace in batch for event in trace["events"]) == len(thrown)


def test_parent_span_ids_become_edges(exported):
    otlp, _ = exported
    spans = raw_spans(otlp)
    names = {span["name"]: span for span in spans}
    lead = next(trace for trace in convert.otel(otlp) if len(trace["events"]) > 1)
    edges = {(edge["src"], edge["dst"]) for edge in lead["edges"]}
    by_name = {}
    for event in lead["events"]:
        by_name.setdefault(event["span_name"], event["id"])
    # execute_tool search hangs on invoke_agent researcher through the HTTP span.
    assert (by_name["invoke_agent researcher"], by_name["execute_tool search"]) in edges
    assert names["execute_tool search"]["parentSpanId"] == names["HTTP GET"]["spanId"]
    spawn = by_name["create_agent coder"]
    assert (spawn, by_name["invoke_agent coder"]) in edges


def test_sdk_span_json_gives_the_same_traces(exported):
    otlp, sdk_json = exported
    from_otlp, from_sdk = convert.otel(otlp), convert.otel(sdk_json)
    assert sorted(from_otlp.trace_ids) == sorted(from_sdk.trace_ids)
    for trace in from_otlp:
        other = from_sdk[from_sdk.trace_ids.index(trace["trace_id"])]
        assert [(e["id"], e["type"], e["agent"]) for e in trace["events"]] == [
            (e["id"], e["type"], e["agent"]) for e in other["events"]
        ]
        assert trace["edges"] == other["edges"] and trace["rewards"] == other["rewards"]


def seconds(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def test_agent_lightning_span_dump_rewards(exported, tmp_path):
    """The SDK's spans laid out as Agent Lightning stores them (rollout and attempt ids,
    flat attributes, times in seconds), with a reward span per step and a final one."""
    _, sdk_json = exported
    dump = []
    for sequence, line in enumerate(sdk_json.read_text().splitlines()):
        span = json.loads(line)
        dump.append(
            {
                "rollout_id": "ro-1",
                "attempt_id": "at-1",
                "sequence_id": sequence,
                "trace_id": span["context"]["trace_id"],
                "span_id": span["context"]["span_id"],
                "parent_id": span["parent_id"],
                "name": span["name"],
                "attributes": span["attributes"],
                "status": span["status"],
                "start_time": seconds(span["start_time"]),
                "end_time": seconds(span["end_time"]),
            }
        )
    reward = next(span for span in dump if span["name"] == "agentlightning.reward")
    early = {
        **reward,
        "span_id": "0xstep",
        "attributes": {"agentlightning.reward.primary": 0.1},
        "start_time": reward["start_time"] - 1e-3,
    }
    path = tmp_path / "rollout.json"
    path.write_text(json.dumps([*dump, early]))
    batch = convert.otel(path)
    assert batch.trace_ids == ["ro-1"]  # one rollout, whatever its OpenTelemetry traces
    trace = batch[0]
    assert trace["rewards"] == {"task": 0.75}
    rewarded = [event["reward"] for event in trace["events"] if "reward" in event]
    assert sum("primary" in reward for reward in rewarded) == sum("task" in reward for reward in rewarded) == 1


def test_unknown_operations_are_counted():
    batch = convert.otel(
        [
            {
                "name": "x",
                "trace_id": "t",
                "span_id": "s",
                "start_time": 1.0,
                "end_time": 2.0,
                "attributes": {"gen_ai.operation.name": "chat"},
            },
            {
                "name": "y",
                "trace_id": "t",
                "span_id": "u",
                "start_time": 1.0,
                "end_time": 2.0,
                "attributes": {"gen_ai.operation.name": "embeddings"},
            },
        ]
    )
    assert batch.conversion_report.unknown == Counter({"gen_ai.operation.name embeddings": 1})
    looped = [
        {
            "name": n,
            "trace_id": "t",
            "span_id": n,
            "parent_id": p,
            "start_time": 1.0,
            "end_time": 2.0,
            "attributes": {"gen_ai.operation.name": "chat"},
        }
        for n, p in (("a", "b"), ("b", "a"))
    ]
    with pytest.raises(masreplay.ConversionError, match="cycle") as raised:  # a broken export ends, it does not hang
        convert.otel(looped)
    assert isinstance(raised.value.__cause__, masreplay.TraceValidationError)
    retrieval = convert.otel(
        [
            {
                "name": "search docs",
                "trace_id": "t",
                "span_id": "r",
                "start_time": 1.0,
                "end_time": 1.5,
                "attributes": {"gen_ai.operation.name": "retrieval", "gen_ai.data_source.id": "wiki"},
            }
        ]
    )
    assert [(e["type"], e.get("tool")) for e in retrieval[0]["events"]] == [("tool_call", "wiki"), ("tool_result", "wiki")]
    assert isinstance(batch, masreplay.TraceBatch)


def test_roles_and_metrics(exported):
    """The agent the user invokes orchestrates; the agents it runs are its sub-agents; the
    user only asks. Usage of an agent run sits on its return, so no token is protocol here."""
    otlp, _ = exported
    batch = convert.otel(otlp)
    lead = next(index for index, trace in enumerate(batch) if len(trace["events"]) > 1)
    events = batch[lead]["events"]
    roles = {(event["agent"], event.get("role")) for event in events if event["type"] != "tool_result"}
    assert roles == {("user", "user"), ("lead", "orchestrator"), ("researcher", "sub-agent"), ("coder", "sub-agent")}
    assert {event["role"] for event in events if event["type"] == "tool_result"} == {"tool"}
    coder_run = next(event for event in events if event["type"] == "return" and event["agent"] == "coder")
    assert coder_run["tokens"] == 11 + 4
    rows = masreplay.metrics(batch).to_pylist()
    # lead: its chat, 2 spawns, 2 invoking messages, its return; researcher: chat, tool call,
    # return; coder: tool call, its failure flag, the guardrail, return.
    assert (rows[lead]["critical_steps"], rows[lead]["spawn_depth"]) == (6 + 4, 1)
    assert rows[lead]["protocol_overhead"] == 0.0
    # The lone chat has no agent run around it: the application's own step, unnamed.
    assert rows[1 - lead]["critical_steps"] == 1
