"""Fuzzing the converters: whatever the input, each returns a valid batch or raises
ConversionError, never a builtin exception and never a crash.

Inputs are small valid records of each format (a Claude Code session with a sub-agent, a
MARBLE episode with both task_results forms, OTLP and span JSON, the seed example and a
simulated masreplay trace), mutated
by hypothesis at any place in their structure (a value replaced by another JSON type, a key
dropped, a value nested deep), given in memory or written to a file; files also get broken
bytes (cut short, not UTF-8, nested past the parser's depth). Each converter is fuzzed in a
subprocess, so a crash fails its test instead of killing the runner. The budget is about
four seconds of fuzzing per converter; ``MASREPLAY_FUZZ_SECONDS`` sets the total for all five.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import masreplay
from masreplay import ConversionError, convert

CONVERTERS = ("claude_code", "marble", "otel", "seed", "masreplay")
SECONDS = float(os.environ.get("MASREPLAY_FUZZ_SECONDS", "20")) / len(CONVERTERS)

# ---- valid inputs ------------------------------------------------------------------------
_BASE = {"sessionId": "s1", "version": "2.1.0", "isSidechain": False}


def _at(second: int) -> str:
    return f"2026-01-01T00:00:{second:02d}.000Z"


CLAUDE_CODE = [
    {
        **_BASE,
        "type": "user",
        "uuid": "u1",
        "parentUuid": None,
        "timestamp": _at(0),
        "message": {"role": "user", "content": "do it"},
    },
    {
        **_BASE,
        "type": "assistant",
        "uuid": "a1",
        "parentUuid": "u1",
        "timestamp": _at(1),
        "message": {
            "id": "m1",
            "model": "m",
            "usage": {"input_tokens": 3, "output_tokens": 4},
            "content": [
                {"type": "thinking", "thinking": "plan"},
                {"type": "text", "text": "ok"},
                {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}},
            ],
        },
    },
    {
        **_BASE,
        "type": "user",
        "uuid": "r1",
        "parentUuid": "a1",
        "timestamp": _at(2),
        "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok", "is_error": True}]},
    },
    {
        **_BASE,
        "type": "assistant",
        "uuid": "a2",
        "parentUuid": "r1",
        "timestamp": _at(3),
        "message": {
            "id": "m2",
            "usage": {"input_tokens": 5},
            "content": [
                {"type": "tool_use", "id": "t2", "name": "Task", "input": {"prompt": "look", "subagent_type": "Explore"}}
            ],
        },
    },
    {
        **_BASE,
        "type": "progress",
        "uuid": "p1",
        "parentUuid": "a2",
        "parentToolUseID": "t2",
        "timestamp": _at(4),
        "data": {"type": "agent_progress", "agentId": "sub1"},
    },
    {
        **_BASE,
        "isSidechain": True,
        "agentId": "sub1",
        "type": "user",
        "uuid": "s1",
        "parentUuid": None,
        "timestamp": _at(4),
        "message": {"role": "user", "content": "look"},
    },
    {
        **_BASE,
        "isSidechain": True,
        "agentId": "sub1",
        "type": "assistant",
        "uuid": "s2",
        "parentUuid": "s1",
        "timestamp": _at(5),
        "message": {"id": "m3", "content": [{"type": "text", "text": "found"}]},
    },
    {
        **_BASE,
        "type": "user",
        "uuid": "r2",
        "parentUuid": "a2",
        "timestamp": _at(6),
        "toolUseResult": {"agentId": "sub1", "status": "completed", "totalDurationMs": 2000},
        "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "found"}]},
    },
    {
        **_BASE,
        "type": "system",
        "subtype": "compact_boundary",
        "uuid": "c1",
        "parentUuid": None,
        "logicalParentUuid": "r2",
        "timestamp": _at(7),
        "compactMetadata": {"trigger": "auto", "preTokens": 9},
    },
    {
        **_BASE,
        "type": "user",
        "uuid": "c2",
        "parentUuid": "c1",
        "isCompactSummary": True,
        "timestamp": _at(8),
        "message": {"role": "user", "content": "summary"},
    },
    {
        **_BASE,
        "type": "system",
        "subtype": "stop_hook_summary",
        "uuid": "h1",
        "parentUuid": "c2",
        "timestamp": _at(9),
        "preventedContinuation": True,
        "hookErrors": [],
        "hookCount": 1,
    },
    {"type": "file-history-snapshot", "messageId": "x"},
]

MARBLE = {
    "task": "write a game",
    "coordination_mode": "graph",
    "iterations": [
        {
            "iteration": 1,
            "task_assignments": {"agent1": "code", "agent2": "test"},
            "communications": ["In Session 1\nFrom agent1 to agent2: hi\nFrom agent2 to agent1: yes"],
            "task_results": [{"agent_id": "agent1", "result": "done"}, {"agent2": "tested"}],
            "summary": "ok",
            "continue_simulation": True,
        },
    ],
    "planning_scores": [4, -1],
    "communication_scores": [3],
    "task_evaluation": {"quality": 5},
    "code_quality": -1,
    "agent_kpis": {"agent1": 2, "agent2": 1},
    "total_milestones": 3,
    "token_usage": 1200,
}


def _kv(key: str, value: dict) -> dict:
    return {"key": key, "value": value}


OTLP = {
    "resourceSpans": [
        {
            "scopeSpans": [
                {
                    "spans": [
                        {
                            "traceId": "0af7651916cd43dd8448eb211c80319c",
                            "spanId": "b7ad6b7169203331",
                            "name": "invoke_agent lead",
                            "startTimeUnixNano": "1700000000000000000",
                            "endTimeUnixNano": "1700000005000000000",
                            "attributes": [
                                _kv("gen_ai.operation.name", {"stringValue": "invoke_agent"}),
                                _kv("gen_ai.agent.name", {"stringValue": "lead"}),
                                _kv("gen_ai.usage.input_tokens", {"intValue": "7"}),
                            ],
                        },
                        {
                            "traceId": "0af7651916cd43dd8448eb211c80319c",
                            "spanId": "00f067aa0ba902b7",
                            "parentSpanId": "b7ad6b7169203331",
                            "name": "execute_tool",
                            "startTimeUnixNano": "1700000001000000000",
                            "endTimeUnixNano": "1700000002000000000",
                            "status": {"code": 2},
                            "attributes": [
                                _kv("gen_ai.operation.name", {"stringValue": "execute_tool"}),
                                _kv("gen_ai.tool.name", {"stringValue": "search"}),
                                _kv(
                                    "extra",
                                    {
                                        "arrayValue": {
                                            "values": [
                                                {"doubleValue": 1.5},
                                                {"kvlistValue": {"values": [_kv("k", {"boolValue": True})]}},
                                            ]
                                        }
                                    },
                                ),
                            ],
                            "events": [{"name": "exception", "attributes": [_kv("exception.type", {"stringValue": "E"})]}],
                            "links": [{}],
                        },
                    ]
                }
            ]
        }
    ]
}

SPANS = [
    {
        "name": "chat",
        "context": {"trace_id": "0x1", "span_id": "0x2"},
        "parent_id": None,
        "start_time": "2026-01-01T00:00:00+00:00",
        "end_time": "2026-01-01T00:00:01+00:00",
        "attributes": {"gen_ai.operation.name": "chat", "gen_ai.usage.output_tokens": 3},
        "status": {"status_code": "OK"},
        "events": [],
        "links": [],
    },
    {
        "name": "agentlightning.reward",
        "rollout_id": "r1",
        "span_id": "0x3",
        "start_time": 2.0,
        "end_time": 3.0,
        "attributes": {"agentlightning.reward.0.name": "team", "agentlightning.reward.0.value": 1.0},
    },
]


def _valid(name: str) -> list[Any]:
    """The valid inputs of a converter, as JSON values."""
    if name == "claude_code":
        return [CLAUDE_CODE]
    if name == "marble":
        return [[MARBLE]]
    if name == "otel":
        return [OTLP, SPANS]
    from masreplay.demo import SEED_EXAMPLE, bundled

    example = json.loads(bundled(SEED_EXAMPLE).read_text(encoding="utf-8"))
    # masreplay's own traces add top-level keys and per-event fields to the seed example's.
    return [example] if name == "seed" else [example, masreplay.sim.generate(1, seed=0, agents=2)[0]]


# ---- mutations ---------------------------------------------------------------------------
scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=6)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6
)


def _containers(value: Any, path: tuple = ()) -> list[tuple]:
    """The paths of every list and dict inside ``value``, down to the depth of the valid
    inputs (a value nested deep by a mutation is not walked again)."""
    found = [path] if isinstance(value, (list, dict)) else []
    if len(path) >= 12:
        return found
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found += _containers(item, (*path, key))
    return found


def _get(value: Any, path: tuple) -> Any:
    for key in path:
        value = value[key]
    return value


@st.composite
def mutated(draw, valid: Any) -> Any:
    """``valid`` with one to three places changed."""
    value = copy.deepcopy(valid)
    for _ in range(draw(st.integers(1, 3))):
        paths = _containers(value)
        if not paths:
            break
        container = _get(value, draw(st.sampled_from(paths)))
        keys = list(container.keys()) if isinstance(container, dict) else list(range(len(container)))
        action = draw(st.sampled_from(["replace", "drop", "nest", "wrap", "add"]))
        if action == "add" or not keys:
            new = draw(json_values)
            if isinstance(container, dict):
                container[draw(st.sampled_from([*keys, "uuid", "type", "id", "name"]) if keys else st.text(max_size=5))] = new
            else:
                container.append(new)
            continue
        key = draw(st.sampled_from(keys))
        if action == "replace":
            container[key] = draw(json_values)
        elif action == "drop":
            del container[key]
        elif action == "wrap":
            container[key] = [container[key]]
        else:
            deep: Any = container[key]
            for _ in range(draw(st.sampled_from([50, 150, 400]))):
                deep = [deep]
            container[key] = deep
    return value


def _broken_bytes(text: bytes) -> st.SearchStrategy[bytes]:
    cut = st.integers(0, len(text)).map(lambda n: text[:n])
    flipped = st.tuples(st.integers(0, max(0, len(text) - 1)), st.integers(0, 255)).map(
        lambda p: text[: p[0]] + bytes([p[1]]) + text[p[0] + 1 :]
    )
    nested = st.sampled_from([b"[" * 100_000, b'{"a":' * 5000 + b"1" + b"}" * 5000])
    return st.one_of(cut, flipped, nested, st.binary(max_size=64))


def _text_of(name: str, value: Any) -> bytes:
    """A file's content: JSON Lines for the line formats, one document for the others."""
    if isinstance(value, list) and name in ("claude_code", "marble"):
        return "".join(json.dumps(line) + "\n" for line in value).encode()
    return json.dumps(value).encode()


def _run(name: str, source: Any) -> None:
    """Converts; a ConversionError is a fine answer, any other exception fails the fuzz."""
    try:
        batch = convert.FORMATS[name](source)
    except ConversionError:
        return
    assert isinstance(batch, masreplay.TraceBatch)


def fuzz(name: str, seconds: float) -> int:
    """Runs hypothesis on converter ``name`` for about ``seconds``; returns the runs made."""
    valid = _valid(name)
    folder = Path(tempfile.mkdtemp(prefix="masreplay-fuzz-"))
    path = folder / ("input.jsonl" if name in ("claude_code", "marble") else "input.json")

    @settings(max_examples=20, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def once(data: st.DataObject) -> None:
        value = data.draw(mutated(data.draw(st.sampled_from(valid))))
        where = data.draw(st.sampled_from(["memory", "file", "bytes"]))
        if where == "memory":
            _run(name, value)
            return
        text = _text_of(name, value)
        path.write_bytes(data.draw(_broken_bytes(text)) if where == "bytes" else text)
        _run(name, path)

    end, runs = time.monotonic() + seconds, 0
    while runs == 0 or time.monotonic() < end:
        seed(runs)(once)()
        runs += 1
    return runs


@pytest.mark.parametrize("name", CONVERTERS)
def test_converter_survives_fuzzing(name):
    child = subprocess.run(
        [sys.executable, "-c", f"import test_fuzz_convert as f; print('runs', f.fuzz({name!r}, {SECONDS}))"],
        cwd=Path(__file__).parent,
        capture_output=True,
        text=True,
        timeout=SECONDS * 10 + 120,
    )
    # A negative return code is the signal that killed the child: a crash.
    assert child.returncode == 0, (
        f"fuzzing {name} failed (exit {child.returncode}):\n{child.stdout[-4000:]}\n{child.stderr[-8000:]}"
    )
