"""convert.to_otel: OTLP JSON under the GenAI semantic conventions, credit as span attributes,
read back by convert.otel and parsed by OpenTelemetry's own protobuf schema."""

from __future__ import annotations

import json

import numpy as np
import pytest
from google.protobuf.json_format import Parse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as GenAI

import masreplay
from masreplay import convert, sim

#: The GenAI operation of each event type's span (any other type: chat).
EXPECTED_OPERATION = {
    "spawn": "create_agent",
    "tool_call": "execute_tool",
    "tool_result": "execute_tool",
    "safety_event": "apply_guardrail",
}


def spans_of(path) -> list[dict]:
    document = json.loads(path.read_text(encoding="utf-8"))
    return [span for rs in document["resourceSpans"] for ss in rs["scopeSpans"] for span in ss["spans"]]


def attributes(span: dict) -> dict:
    return {kv["key"]: next(iter(kv["value"].values())) for kv in span["attributes"]}


@pytest.fixture(scope="module")
def batch() -> masreplay.TraceBatch:
    return sim.generate(6, agents=(2, 5), depth=2, seed=11)


def test_round_trip_keeps_credit_agents_and_rewards(batch, tmp_path):
    credit = np.linspace(-1, 1, batch.num_events)
    path = tmp_path / "spans.json"
    convert.to_otel(batch, path, credit=credit)
    Parse(path.read_text(encoding="utf-8"), ExportTraceServiceRequest())  # OTLP's own schema accepts it
    back = convert.otel(path)
    assert len(back) == len(batch)
    advantage = masreplay.advantages(batch, dtype="float64").per_event
    offsets = batch.event_offsets
    for k, trace in enumerate(batch):
        back_trace = next(
            t
            for t in back
            if trace["trace_id"] in {(e.get("span_attributes") or {}).get("masreplay.trace_id") for e in t["events"]}
        )
        assert back_trace["rewards"] == trace["rewards"]
        read: dict[str, tuple[float, float, str]] = {}
        for event in back_trace["events"]:
            spans = event.get("span_attributes") or {}
            for prefix in ("masreplay", "masreplay.tool_result"):
                if f"{prefix}.event.id" in spans:
                    read[spans[f"{prefix}.event.id"]] = (spans[f"{prefix}.credit"], spans[f"{prefix}.advantage"], event["agent"])
        assert set(read) == {e["id"] for e in trace["events"]}, "every event's credit is read back"
        for i, event in enumerate(trace["events"]):
            row = int(offsets[k]) + i
            value, adv, agent = read[event["id"]]
            assert value == pytest.approx(credit[row]) and adv == pytest.approx(advantage[row])
            if event["type"] != "tool_result":
                assert agent == event["agent"]


def test_semantic_conventions_and_stderr(batch, tmp_path):
    table = masreplay.same_prefix_credit(batch)
    path = tmp_path / "spans.json"
    convert.to_otel(batch, path, credit=table)
    spans = spans_of(path)
    by_event = {}
    for span in spans:
        found = attributes(span)
        operation = found.get(GenAI.GEN_AI_OPERATION_NAME)
        if "masreplay.event.id" in found:
            by_event[(found["masreplay.trace_id"], found["masreplay.event.id"])] = found
            kind = found["masreplay.event.type"]
            assert operation == EXPECTED_OPERATION.get(kind, "chat")
            if operation == "execute_tool":
                assert found[GenAI.GEN_AI_TOOL_NAME]
            if operation == "create_agent":
                assert found[GenAI.GEN_AI_AGENT_NAME]
        elif operation == "invoke_agent":
            assert found[GenAI.GEN_AI_AGENT_NAME]
    for row in table.to_pylist():
        found = by_event.get((str(row["trace_id"]), row["event_id"]))
        if found is None or row["credit"] != row["credit"]:
            continue
        assert found["masreplay.credit"] == pytest.approx(row["credit"])
        if row["stderr"] == row["stderr"]:
            assert found["masreplay.credit.stderr"] == pytest.approx(row["stderr"])
    assert any("masreplay.credit.stderr" in found for found in by_event.values())


def test_sub_agents_nest_under_their_spawner(batch, tmp_path):
    path = tmp_path / "spans.json"
    convert.to_otel(batch[[0]], path)
    spans = spans_of(path)
    invoked = [s for s in spans if attributes(s).get(GenAI.GEN_AI_OPERATION_NAME) == "invoke_agent"]
    agent_span = {attributes(s)[GenAI.GEN_AI_AGENT_NAME]: s for s in invoked}
    events = batch[0]["events"]
    for event in events:
        if event["type"] == "spawn" and event["to"] in agent_span:
            first = min((e for e in events if e["type"] == "spawn" and e["to"] == event["to"]), key=lambda e: e["t"])
            assert agent_span[event["to"]]["parentSpanId"] == agent_span[first["agent"]]["spanId"]
    assert not any("masreplay.credit" in attributes(s) for s in spans), "no credit given, none written"


def test_bad_input(tmp_path):
    with pytest.raises(masreplay.InvalidArgumentError):
        convert.to_otel([{"trace_id": "x"}], tmp_path / "x.json")
    with pytest.raises(masreplay.InvalidArgumentError, match="one value per event"):
        convert.to_otel(sim.generate(1), tmp_path / "x.json", credit=[1.0])
