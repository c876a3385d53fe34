"""Converters on the real samples in tests/data, checked against counts derived here
from the raw files with plain json (not the converters' helpers), plus malformed input,
the seed round trip and the ``masreplay convert`` command."""

from __future__ import annotations

import hashlib
import json
import pickle
import re
from collections import Counter, defaultdict
from pathlib import Path

import pytest

import masreplay
from masreplay import ConversionError, convert
from masreplay.cli import main

SAMPLES = Path(__file__).resolve().parent / "data"
SESSION = "fa812bfe-b295-4cca-9c2f-fdf01028cb46"
MARBLE_FILES = ["tree_research_Llama3.1_70B.jsonl", "coding_development_output_0208.jsonl"]


def sample(*parts: str) -> Path:
    path = SAMPLES.joinpath(*parts)
    if not path.exists():
        pytest.fail(
            f"real trace sample missing: expected {path} (tests/data in the repository; see tests/data/README.md)", pytrace=False
        )
    return path


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def blocks(line: dict) -> list[dict]:
    content = line.get("message", {}).get("content", [])
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def by_type(trace: dict) -> Counter:
    return Counter(event["type"] for event in trace["events"])


# ---- Claude Code --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def claude_files() -> dict[str, list[dict]]:
    main_file = sample("claude_code", f"{SESSION}.jsonl")
    files = {"main": read_lines(main_file)}
    for path in sorted(sample("claude_code", SESSION, "subagents").glob("agent-*.jsonl")):
        files[path.stem.removeprefix("agent-")] = read_lines(path)
    return files


@pytest.fixture(scope="module")
def claude_batch() -> masreplay.TraceBatch:
    return convert.claude_code(sample("claude_code", f"{SESSION}.jsonl"))


def test_claude_code_sample_converts_to_one_valid_trace(claude_batch, seed_validator):
    assert len(claude_batch) == 1 and claude_batch.trace_ids == [SESSION]
    masreplay.validate(claude_batch[0])
    seed_validator.validate(claude_batch.to_seed_json(0))


def test_claude_code_agents_and_spawns(claude_batch, claude_files):
    trace = claude_batch[0]
    spawn_calls = {
        block["id"]: block
        for lines in claude_files.values()
        for line in lines
        if line["type"] == "assistant"
        for block in blocks(line)
        if block["type"] == "tool_use" and block["name"] in ("Task", "Agent")
    }
    spawned = {
        line["toolUseResult"]["agentId"]
        for line in claude_files["main"]
        if isinstance(line.get("toolUseResult"), dict) and "agentId" in line["toolUseResult"]
    }
    spawns = [event for event in trace["events"] if event["type"] == "spawn"]
    assert len(spawns) == len(spawn_calls) == 2
    assert {event["to"] for event in spawns} == spawned
    assert {event["tool_use_id"] for event in spawns} == set(spawn_calls)
    returns = [event for event in trace["events"] if event["type"] == "return"]
    assert {event["agent"] for event in returns} == spawned
    acting = {event["agent"] for event in trace["events"] if event["type"] != "tool_result"}
    # The session's agents, the person typing and the harness (hook notes, reminders).
    assert acting == {"main", *claude_files.keys() - {"main"}, "human", "harness"}
    edges = {(edge["src"], edge["dst"]): edge["type"] for edge in trace["edges"]}
    for spawn in spawns:
        # The spawn edge leads to the sub-agent's prompt, the first line of its own file.
        assert edges[(spawn["id"], claude_files[spawn["to"]][0]["uuid"])] == "spawn"


def test_claude_code_tool_calls_pair_with_results(claude_batch, claude_files):
    calls, results = {}, Counter()
    for lines in claude_files.values():
        for line in lines:
            for block in blocks(line):
                if block["type"] == "tool_use" and block["name"] not in ("Task", "Agent"):
                    calls[block["id"]] = block["name"]
                elif block["type"] == "tool_result":
                    results[block["tool_use_id"]] += 1
    trace = claude_batch[0]
    events = {event["id"]: event for event in trace["events"]}
    call_events = [event for event in trace["events"] if event["type"] == "tool_call"]
    result_events = [event for event in trace["events"] if event["type"] == "tool_result"]
    assert len(call_events) == len(calls) and len(result_events) == sum(results[i] for i in calls)
    pairs = {
        (events[edge["src"]]["tool_use_id"], events[edge["dst"]]["tool_use_id"])
        for edge in trace["edges"]
        if edge["type"] == "return" and events[edge["src"]]["type"] == "tool_call"
    }
    assert pairs == {(call, call) for call in calls if results[call]}
    assert all(event["tool"] == calls[event["tool_use_id"]] for event in result_events)
    assert trace["costs"]["tool_calls"] == len(calls)


def test_claude_code_tokens_count_each_message_once(claude_batch, claude_files):
    usage = _usage_per_message(claude_files)
    expected = sum(sum(fields.values()) for fields in usage.values())
    trace = claude_batch[0]
    assert trace["costs"]["tokens"] == expected
    assert sum(1 for event in trace["events"] if "tokens" in event) == len(usage)


AGENT_BLOCKS = ("thinking", "redacted_thinking", "text", "tool_use")


def _own_steps(lines: list[dict]) -> int:
    """Events an agent authors from its own file: one per assistant block, plus a safety
    event per failed tool result (flagged by the caller)."""
    return sum(
        1
        for line in lines
        if line["type"] in ("user", "assistant")
        for block in blocks(line)
        if (line["type"] == "assistant" and block["type"] in AGENT_BLOCKS)
        or (block["type"] == "tool_result" and block.get("is_error"))
    )


def test_claude_code_roles(claude_batch, claude_files):
    """Every event says what its author is to the session; no human or harness orchestrates."""
    trace = claude_batch[0]
    roles = {(event["agent"], event["role"]) for event in trace["events"] if event["type"] != "tool_result"}
    subagents = {agent for agent in claude_files if agent != "main" and not agent.startswith("acompact")}
    compaction = {agent for agent in claude_files if agent.startswith("acompact")}
    assert roles == {("main", "orchestrator"), ("human", "human"), ("harness", "harness")} | {
        (agent, "sub-agent") for agent in subagents
    } | {(agent, "compaction") for agent in compaction}
    assert {event["role"] for event in trace["events"] if event["type"] == "tool_result"} == {"tool"}
    spawns = [event for event in trace["events"] if event["type"] == "spawn"]
    calls = {
        block["id"]: block
        for line in claude_files["main"]
        if line["type"] == "assistant"
        for block in blocks(line)
        if block["type"] == "tool_use"
    }
    assert [event["subagent_type"] for event in spawns] == [
        calls[event["tool_use_id"]]["input"]["subagent_type"] for event in spawns
    ]


def test_claude_code_session_metrics(claude_batch, claude_files):
    """The main agent orchestrates the real session (the person typed the first line): its
    steps plus the longer sub-agent run, with counts taken from the raw files."""
    row = masreplay.metrics(claude_batch).to_pylist()[0]
    subagents = [agent for agent in claude_files if agent != "main" and not agent.startswith("acompact")]
    earliest = min(claude_batch[0]["events"], key=lambda event: (event["t"], event["id"]))
    assert earliest["role"] in ("human", "harness")  # the session opens with text the agent did not write
    # main: its own blocks and flagged failures, plus the prompt it sends each sub-agent.
    main_steps = _own_steps(claude_files["main"]) + len(subagents)
    # A sub-agent: its own blocks and failures, plus its return (written in main's file);
    # its first user line is main's prompt. None spawns further, and main never aggregates.
    sub_steps = [_own_steps(claude_files[agent]) + 1 for agent in subagents]
    assert main_steps > 300 and len(subagents) == 2
    assert row["critical_steps"] == main_steps + max(sub_steps)
    assert (row["spawn_depth"], row["spawn_branching"], row["spawn_count"]) == (1, 2, 2)
    assert row["finish_rate"] == 1.0
    # Protocol: tokens of the API messages whose first block is a Task call (a spawn), of all
    # tokens (usage counted once per message id); the agents' text is content.
    usage: dict[str, int] = defaultdict(int)
    first_block: dict[str, dict] = {}
    for lines in claude_files.values():
        for line in lines:
            if line["type"] == "assistant":
                message = line["message"]
                first_block.setdefault(message["id"], blocks(line)[0])
    for message_id, fields in _usage_per_message(claude_files).items():
        usage[message_id] = sum(fields.values())
    spawning = sum(
        tokens
        for message_id, tokens in usage.items()
        if first_block[message_id]["type"] == "tool_use" and first_block[message_id]["name"] in ("Task", "Agent")
    )
    assert row["protocol_overhead"] == pytest.approx(spawning / sum(usage.values()), rel=1e-12)
    # Most tokens come with the agents' own text (0.96-0.99 of them were protocol when every
    # message and tool call counted): content, as are the tool calls.
    text = sum(tokens for message_id, tokens in usage.items() if first_block[message_id]["type"] == "text")
    assert text / sum(usage.values()) > 0.5 and row["protocol_overhead"] < 0.1


def _usage_per_message(files: dict[str, list[dict]]) -> dict[str, dict[str, int]]:
    usage: dict[str, dict[str, int]] = defaultdict(dict)
    for lines in files.values():
        for line in lines:
            if line["type"] == "assistant":
                seen = usage[line["message"]["id"]]
                for name, value in line["message"]["usage"].items():
                    if name.endswith("_tokens"):
                        seen[name] = max(seen.get(name, 0), value)
    return usage


def test_claude_code_progress_repeats_are_not_ingested(claude_batch, claude_files):
    progress = {line["uuid"] for line in claude_files["main"] if line["type"] == "progress"}
    trace = claude_batch[0]
    assert not progress & {event["id"].split("#")[0] for event in trace["events"]}
    agent_progress = sum(
        1 for line in claude_files["main"] if line["type"] == "progress" and line["data"]["type"] == "agent_progress"
    )
    report = claude_batch.conversion_report
    assert report.ignored["progress agent_progress"] == agent_progress > 0
    assert report.records == sum(len(lines) for lines in claude_files.values())
    assert report.clean, str(report)
    # Every user/assistant content block of a sub-agent file is one event, none twice.
    for agent in claude_files.keys() - {"main"}:
        expected = sum(len(blocks(line)) for line in claude_files[agent] if line["type"] in ("user", "assistant"))
        made = [event for event in trace["events"] if event["content_ref"].startswith(f"subagents/agent-{agent}.jsonl:")]
        errors = sum(1 for event in made if event["type"] == "safety_event" and event.get("reason") == "tool_error")
        assert len(made) - errors == expected


def test_claude_code_time_safety_human_and_compaction(claude_batch, claude_files):
    from datetime import datetime

    stamps = [
        datetime.fromisoformat(line["timestamp"]).timestamp()
        for lines in claude_files.values()
        for line in lines
        if "timestamp" in line
    ]
    trace = claude_batch[0]
    assert min(event["t"] for event in trace["events"]) >= 0
    assert trace["costs"]["wall_clock_s"] == pytest.approx(max(stamps) - min(stamps))
    errors = sum(1 for lines in claude_files.values() for line in lines for block in blocks(line) if block.get("is_error"))
    stop_hooks = [line for line in claude_files["main"] if line.get("subtype") == "stop_hook_summary"]
    blocking = sum(1 for line in stop_hooks if line["preventedContinuation"] or line["hookErrors"])
    safety = [event for event in trace["events"] if event["type"] == "safety_event"]
    assert sum(event.get("reason") == "tool_error" for event in safety) == errors > 0
    assert sum(event.get("kind") == "stop_hook" for event in safety) == blocking
    ignored = claude_batch.conversion_report.ignored["system subtype stop_hook_summary (hooks passed)"]
    assert ignored == len(stop_hooks) - blocking > 0
    # A person's turns: plain text in the main file that the harness did not write (its
    # notes are meta lines, the compaction summary, or start with a <tag>).
    typed = [
        number
        for number, line in enumerate(claude_files["main"], start=1)
        if line["type"] == "user"
        and not line.get("isMeta")
        and not line.get("isCompactSummary")
        and all(block["type"] == "text" and not block["text"].startswith("<") for block in blocks(line))
    ]
    humans = [event for event in trace["events"] if event["type"] == "human_intervention"]
    assert sorted(int(event["content_ref"].split(":")[1]) for event in humans) == typed
    assert len(typed) == 2 and all(event["agent"] == "human" for event in humans)
    aggregates = [event for event in trace["events"] if event["type"] == "aggregate"]
    compaction = [name for name in claude_files if name.startswith("acompact")]
    assert [event["agent"] for event in aggregates] == compaction
    assert any(edge["dst"] == aggregates[0]["id"] and edge["type"] == "aggregate" for edge in trace["edges"])


def test_claude_code_inline_sidechain_layout(claude_files):
    """The 2.0.x layout, rebuilt from the sample: sub-agent lines inline in the main
    transcript, marked isSidechain, with no agentId anywhere and no progress repeats."""
    lines = []
    for line in claude_files["main"]:
        if line["type"] == "progress" and line["data"]["type"] == "agent_progress":
            continue
        line = dict(line)
        if isinstance(line.get("toolUseResult"), dict):
            line["toolUseResult"] = {k: v for k, v in line["toolUseResult"].items() if k != "agentId"}
        lines.append(line)
    for agent in ("a93ccab", "aa84377"):
        lines += [{k: v for k, v in line.items() if k != "agentId"} for line in claude_files[agent]]
    batch = convert.claude_code(lines)
    trace = batch[0]
    spawns = {event["tool_use_id"]: event["to"] for event in trace["events"] if event["type"] == "spawn"}
    assert sorted(spawns.values()) == ["sidechain-1", "sidechain-2"]
    for event in trace["events"]:
        if event["type"] == "return":
            assert event["agent"] == spawns[event["tool_use_id"]]
    prompts = {line["message"]["content"]: line["uuid"] for line in claude_files["a93ccab"][:1] + claude_files["aa84377"][:1]}
    events = {event["id"]: event for event in trace["events"]}
    for uuid in prompts.values():
        assert events[uuid]["type"] == "message" and events[uuid]["to"] in spawns.values()


def _write_session(folder: Path, main_lines: list[dict], subagents: dict[str, list[dict]]) -> Path:
    """A 2.1.x session on disk: <session>.jsonl and <session>/subagents/agent-<id>.jsonl."""
    main_file = folder / f"{SESSION}.jsonl"
    main_file.write_text("".join(json.dumps(line) + "\n" for line in main_lines))
    (folder / SESSION / "subagents").mkdir(parents=True)
    for agent, lines in subagents.items():
        (folder / SESSION / "subagents" / f"agent-{agent}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return main_file


def _later(line: dict, seconds: float) -> str:
    from datetime import datetime, timedelta

    return (datetime.fromisoformat(line["timestamp"]) + timedelta(seconds=seconds)).isoformat()


def test_claude_code_each_compaction_is_by_its_own_side_agent(claude_files, tmp_path):
    """A second compaction, copied from the sample's one after the session's end with new
    uuids and a new side agent: each aggregate and summary is that compaction's agent's."""
    first = next(name for name in claude_files if name.startswith("acompact"))
    main_lines = claude_files["main"]
    boundary = next(line for line in main_lines if line.get("subtype") == "compact_boundary")
    summary = next(line for line in main_lines if line.get("isCompactSummary"))
    later = 24 * 3600.0  # a day after the first compaction: after the session's end
    logical_parent = [line for line in main_lines if "uuid" in line][-1]["uuid"]
    renamed = {line["uuid"]: line["uuid"] + "-2" for line in claude_files[first]}
    second = []
    for line in claude_files[first]:
        parent = line["parentUuid"]
        parent = renamed.get(parent, logical_parent if parent == boundary["logicalParentUuid"] else parent)
        copy = {
            **line,
            "uuid": renamed[line["uuid"]],
            "parentUuid": parent,
            "agentId": "acompact-second",
            "timestamp": _later(line, later),
        }
        if copy["type"] == "assistant":
            copy["message"] = {**copy["message"], "id": copy["message"]["id"] + "-2"}
        second.append(copy)
    boundary2 = {**boundary, "uuid": "boundary-2", "logicalParentUuid": logical_parent, "timestamp": _later(boundary, later)}
    summary2 = {**summary, "uuid": "summary-2", "parentUuid": "boundary-2", "timestamp": _later(summary, later)}
    subagents = {name: lines for name, lines in claude_files.items() if name != "main"}
    path = _write_session(tmp_path, [*main_lines, boundary2, summary2], {**subagents, "acompact-second": second})
    batch = convert.claude_code(path)
    trace = batch[0]
    assert batch.conversion_report.clean, str(batch.conversion_report)
    events = {event["id"]: event for event in trace["events"]}
    aggregates = [event for event in trace["events"] if event["type"] == "aggregate"]
    assert [event["agent"] for event in aggregates] == [first, "acompact-second"]
    summaries = [event for event in trace["events"] if event.get("kind") == "compaction_summary"]
    assert [(event["id"], event["agent"]) for event in summaries] == [(summary["uuid"], first), ("summary-2", "acompact-second")]
    # Each aggregate edge comes from the last line of its own side agent's file.
    sources = {edge["dst"]: events[edge["src"]]["content_ref"] for edge in trace["edges"] if edge["type"] == "aggregate"}
    assert sources == {
        boundary["uuid"]: f"subagents/agent-{first}.jsonl:{len(claude_files[first])}",
        "boundary-2": f"subagents/agent-acompact-second.jsonl:{len(second)}",
    }
    # Without the side agents' transcripts each compaction still has an agent of its own.
    bare = convert.claude_code([*main_lines, boundary2, summary2])[0]
    assert [event["agent"] for event in bare["events"] if event["type"] == "aggregate"] == ["compaction-1", "compaction-2"]


def test_claude_code_missing_subagent_transcripts_are_reported(claude_files, tmp_path):
    """The main file alone (no subagents/ folder, or its lines as dicts): the sub-agents'
    events exist only in agent_progress lines, so the report says what was lost."""
    spawned = sorted(
        line["toolUseResult"]["agentId"]
        for line in claude_files["main"]
        if isinstance(line.get("toolUseResult"), dict) and "agentId" in line["toolUseResult"]
    )
    progress = sum(1 for line in claude_files["main"] if line["type"] == "progress" and line["data"]["type"] == "agent_progress")
    path = tmp_path / f"{SESSION}.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in claude_files["main"]))
    for source in (path, claude_files["main"]):
        report = convert.claude_code(source).conversion_report
        assert not report.clean
        missing = [warning for warning in report.warnings if "has no transcript" in warning]
        assert len(missing) == len(spawned) == 2
        assert all(f"agent-{agent}.jsonl" in warning for agent, warning in zip(spawned, missing, strict=True))
        assert report.ignored["progress agent_progress (not repeated: sub-agent transcript missing)"] == progress > 0
        assert "progress agent_progress" not in report.ignored


def test_claude_code_hook_blocks_match_the_raw_files(claude_batch, claude_files):
    """Each note that a hook blocked a tool is a safety event addressed to the agent whose
    call it answers (its parentUuid's line), wherever the note was written."""
    agent_of = {line["uuid"]: name for name, lines in claude_files.items() for line in lines if "uuid" in line}
    expected = {
        line["uuid"]: (agent_of[line["parentUuid"]], line["parentUuid"])
        for lines in claude_files.values()
        for line in lines
        if line["type"] == "user" and any("hook blocking error" in block.get("text", "") for block in blocks(line))
    }
    assert expected and {agent for agent, _ in expected.values()} == {"main"}
    trace = claude_batch[0]
    hooks = {event["id"]: event for event in trace["events"] if event.get("kind") == "hook_block"}
    assert {id: event["to"] for id, event in hooks.items()} == {id: agent for id, (agent, _) in expected.items()}
    assert all(event["type"] == "safety_event" and event["agent"] == "harness" for event in hooks.values())
    edges = {(edge["src"], edge["dst"]) for edge in trace["edges"]}
    assert all((call, id) in edges for id, (_, call) in expected.items())


def test_claude_code_stop_hooks_are_safety_events_only_when_they_block():
    base = {
        "type": "system",
        "subtype": "stop_hook_summary",
        "sessionId": "s1",
        "parentUuid": "r1",
        "timestamp": "2026-01-01T00:00:04.000Z",
        "hookCount": 1,
    }
    passed = {**base, "uuid": "h1", "preventedContinuation": False, "hookErrors": []}
    prevented = {**base, "uuid": "h2", "preventedContinuation": True, "hookErrors": []}
    failed = {**base, "uuid": "h3", "preventedContinuation": False, "hookErrors": ["exit 2"]}
    batch = convert.claude_code([*_session_lines(), passed, prevented, failed])
    stops = [event["id"] for event in batch[0]["events"] if event.get("kind") == "stop_hook"]
    assert stops == ["h2", "h3"]
    assert batch.conversion_report.ignored == Counter({"system subtype stop_hook_summary (hooks passed)": 1})


def test_claude_code_failed_subagent_is_a_safety_event():
    """A Task call whose result is an error (the sub-agent failed or was interrupted) is a
    return by the sub-agent plus a tool_error safety event by its caller."""
    base = {"sessionId": "s1", "isSidechain": False}
    task = {"type": "tool_use", "id": "t2", "name": "Task", "input": {"prompt": "look", "subagent_type": "Explore"}}
    lines = [
        *_session_lines(),
        {
            **base,
            "type": "assistant",
            "uuid": "a2",
            "parentUuid": "r1",
            "timestamp": "2026-01-01T00:00:04.000Z",
            "message": {"id": "m2", "content": [task]},
        },
        {
            **base,
            "type": "progress",
            "uuid": "p1",
            "parentUuid": "a2",
            "parentToolUseID": "t2",
            "timestamp": "2026-01-01T00:00:05.000Z",
            "data": {"type": "agent_progress", "agentId": "sub1"},
        },
        {
            **base,
            "isSidechain": True,
            "agentId": "sub1",
            "type": "user",
            "uuid": "s1u",
            "parentUuid": None,
            "timestamp": "2026-01-01T00:00:05.000Z",
            "message": {"role": "user", "content": "look"},
        },
        {
            **base,
            "type": "user",
            "uuid": "r2",
            "parentUuid": "a2",
            "timestamp": "2026-01-01T00:00:09.000Z",
            "toolUseResult": "Error: interrupted",
            "message": {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t2",
                        "is_error": True,
                        "content": "[Request interrupted by user for tool use]",
                    }
                ],
            },
        },
    ]
    trace = convert.claude_code(lines)[0]
    made = [(event["id"], event["type"], event["agent"]) for event in trace["events"] if event["id"].startswith("r2")]
    assert made == [("r2", "return", "sub1"), ("r2!error", "safety_event", "main")]
    assert next(event for event in trace["events"] if event["id"] == "r2!error")["reason"] == "tool_error"
    assert {"src": "r2", "dst": "r2!error", "type": "safety_flow"} in trace["edges"]


# ---- malformed Claude Code input ----------------------------------------------------------
def _session_lines() -> list[dict]:
    base = {"sessionId": "s1", "version": "2.1.0", "isSidechain": False}
    return [
        {
            **base,
            "type": "user",
            "uuid": "u1",
            "parentUuid": None,
            "timestamp": "2026-01-01T00:00:00.000Z",
            "message": {"role": "user", "content": "do it"},
        },
        {
            **base,
            "type": "assistant",
            "uuid": "a1",
            "parentUuid": "u1",
            "timestamp": "2026-01-01T00:00:01.000Z",
            "message": {
                "id": "m1",
                "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}],
                "usage": {"input_tokens": 3, "output_tokens": 4},
            },
        },
        {
            **base,
            "type": "user",
            "uuid": "r1",
            "parentUuid": "a1",
            "timestamp": "2026-01-01T00:00:03.000Z",
            "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
        },
    ]


def _write(tmp_path: Path, lines: list) -> Path:
    path = tmp_path / "session.jsonl"
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def test_claude_code_repeated_lines():
    """A line written twice is read once and counted; a different line reusing a uuid is an error."""
    lines = _session_lines()
    batch = convert.claude_code([*lines, lines[1]])
    assert len(batch[0]["events"]) == 3 and batch.conversion_report.ignored == Counter(
        {"line repeating an earlier line (same uuid and content)": 1}
    )
    assert batch.conversion_report.records == 4
    with pytest.raises(ConversionError, match=r"<object>:4: uuid 'a1' is already the uuid of <object>:2, a different line"):
        convert.claude_code([*lines, {**lines[1], "timestamp": "2026-01-01T00:00:02.000Z"}])


def test_claude_code_small_session_shape():
    trace = convert.claude_code(_session_lines())[0]
    assert [(e["id"], e["type"], e["t"]) for e in trace["events"]] == [
        ("u1", "human_intervention", 0),
        ("a1", "tool_call", 1),
        ("r1", "tool_result", 3),
    ]
    assert trace["events"][2]["duration_s"] == 2 and trace["events"][1]["tokens"] == 7
    assert {(e["src"], e["dst"], e["type"]) for e in trace["edges"]} == {("u1", "a1", "causal"), ("a1", "r1", "return")}


def test_truncated_json_line_names_file_and_line(tmp_path):
    path = _write(tmp_path, [*_session_lines()[:2], json.dumps(_session_lines()[2])[:40]])
    with pytest.raises(ConversionError) as caught:
        convert.claude_code(path)
    assert caught.value.source == str(path) and caught.value.line == 3
    assert f"{path}:3" in str(caught.value) and isinstance(caught.value, ValueError)


def test_line_missing_what_its_type_needs_is_an_error(tmp_path):
    lines = _session_lines()
    del lines[1]["timestamp"]
    with pytest.raises(ConversionError, match=r"session.jsonl:2: line without a timestamp"):
        convert.claude_code(_write(tmp_path, lines))


def test_tool_result_without_its_call_is_kept_and_reported(tmp_path):
    lines = _session_lines()
    del lines[1]
    lines[1]["parentUuid"] = "u1"
    batch = convert.claude_code(_write(tmp_path, lines))
    result = next(e for e in batch[0]["events"] if e["type"] == "tool_result")
    assert result["agent"] == "unknown_tool" and "duration_s" not in result
    assert batch.conversion_report.warnings == [f"{tmp_path / 'session.jsonl'}:2: tool_result for 't1' has no tool_use"]
    assert not batch.conversion_report.clean


def test_unknown_line_types_and_blocks_are_counted(tmp_path):
    lines = [
        *_session_lines(),
        {"type": "brand-new", "uuid": "x"},
        {"type": "progress", "uuid": "p", "data": {"type": "novel_progress"}},
    ]
    lines[1]["message"]["content"].append({"type": "server_tool_use", "id": "s"})
    report = convert.claude_code(_write(tmp_path, lines)).conversion_report
    assert report.unknown == Counter(
        {"line type brand-new": 1, "progress novel_progress": 1, "assistant content block server_tool_use": 1}
    )
    assert "unknown 1 x line type brand-new" in str(report)


# ---- MARBLE -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", MARBLE_FILES)
def test_marble_episodes_convert_with_their_agents_returns_and_scores(name, seed_validator):
    episodes = read_lines(sample("marble", name))
    batch = convert.marble(sample("marble", name))
    assert len(batch) == len(episodes) and batch.conversion_report.clean
    scored_channels, files_missing = set(), 0
    for index, (episode, trace) in enumerate(zip(episodes, batch, strict=True)):
        seed_validator.validate(batch.to_seed_json(index))
        agents, messages, returns = {"planner"}, 0, 0
        for iteration in episode["iterations"]:
            agents |= set(iteration["task_assignments"])
            messages += len(iteration["task_assignments"])
            returns += len(iteration["task_results"])
            agents |= {result["agent_id"] for result in iteration["task_results"]}
            for text in iteration["communications"]:
                for line in text.splitlines():
                    if line.startswith("From ") and " to " in line and ":" in line:
                        sender, receiver = line[5:].split(":", 1)[0].split(" to ")
                        agents |= {sender, receiver}
                        messages += 1
        types = by_type(trace)
        assert {name for event in trace["events"] for name in (event["agent"], event.get("to")) if name} == agents
        assert types["message"] == messages and types["return"] == returns and types["spawn"] == 0
        assert types["aggregate"] == sum("summary" in iteration for iteration in episode["iterations"])
        assert trace["costs"]["tokens"] == episode.get("token_usage", 0)
        planning = [s for s in episode.get("planning_scores") or [] if s != -1]
        communication = [s for s in episode.get("communication_scores") or [] if s != -1]
        assert trace["rewards"].get("planning") == (sum(planning) / len(planning) if planning else None)
        assert trace["rewards"].get("communication") == (sum(communication) / len(communication) if communication else None)
        assert all(value != -1 for value in trace["rewards"].values())
        assert types["orchestrator_decision"] == len(episode["iterations"])
        channels, missing = {"planning", "communication"} & set(trace["rewards"]), []
        for key in ("planning_scores", "communication_scores"):
            missing += [f"{key}/{i}" for i, score in enumerate(episode.get(key) or []) if score == -1]
        for key in ("task_evaluation", "code_quality"):
            value = episode.get(key)
            for score_name, score in value.items() if isinstance(value, dict) else [] if value is None else [("", value)]:
                channel = f"{key}.{score_name}" if score_name else key
                if score == -1:
                    missing.append(channel)
                else:
                    assert trace["rewards"][channel] == score
                    channels.add(channel)
                    scored_channels.add(key)
        for agent, milestones in (episode.get("agent_kpis") or {}).items():
            assert trace["rewards"][f"milestones.{agent}"] == milestones
            channels.add(f"milestones.{agent}")
        assert set(trace["rewards"]) == channels
        assert trace.get("missing_scores") == (missing or None)
        files_missing += len(missing)
    # Each sample has episode scores by name and scores that were not given.
    assert scored_channels == {"task_evaluation" if name.startswith("tree") else "code_quality"} and files_missing > 0


def test_marble_task_results_in_both_forms():
    """MARBLE writes a result as {"agent_id": ..., "result": ...} or, in its minecraft and
    discussion runs, as {"<agent>": "<result>"}: both are returns by that agent."""
    episode = {
        "task": "t",
        "iterations": [
            {
                "task_assignments": {"agent1": "a", "agent2": "b"},
                "task_results": [{"agent1": "built it"}, {"agent_id": "agent2", "result": "tested"}],
            }
        ],
    }
    trace = convert.marble(episode)[0]
    returns = [(event["agent"], event["to"], event["content_ref"]) for event in trace["events"] if event["type"] == "return"]
    assert returns == [
        ("agent1", "planner", "<object>:1#/iterations/0/task_results/0"),
        ("agent2", "planner", "<object>:1#/iterations/0/task_results/1"),
    ]
    assert {event["agent"]: event["role"] for event in trace["events"]} == {
        "planner": "orchestrator",
        "agent1": "sub-agent",
        "agent2": "sub-agent",
    }
    for broken, reason in (
        ([{}], "task_results/0 is empty: it names no agent"),
        ([{"agent_id": 3}], "task_results/0/agent_id is a number"),
    ):
        with pytest.raises(ConversionError, match=reason):
            convert.marble({**episode, "iterations": [{"task_results": broken}]})


@pytest.mark.parametrize("name", MARBLE_FILES)
def test_marble_planner_orchestrates(name):
    """No spawns: the critical steps are the planner's own, one decision and a message per
    assignment and a summary per iteration, counted from the raw file."""
    episodes = read_lines(sample("marble", name))
    table = masreplay.metrics(convert.marble(sample("marble", name)))
    expected = [
        sum(1 + len(it.get("task_assignments") or {}) + ("summary" in it) for it in episode["iterations"]) for episode in episodes
    ]
    assert table["critical_steps"].to_pylist() == expected
    assert set(table["spawn_depth"].to_pylist()) == {0}


def test_marble_reads_communications_as_python_re_splits_them(tmp_path):
    """Speaker lines, session headers, task ids and score means computed here with Python's
    own re, hashlib and int arithmetic: the converter (Rust) must agree on the edge cases,
    whether the episode comes from a file or from a dict."""
    speaker = re.compile(r"^From (\S+) to (\S+?): ", re.MULTILINE)
    header = re.compile(r"^\s*(In Session \S+\s*)?$")
    texts = [
        "In Session 1 \nFrom a to b: hi\nFrom b to a:c: colon in the receiver",
        "\x1c In Session x\x1f\nFrom a\x1cb to c: U+001C ends a name in Python",
        "preamble\rFrom a to b: no line starts after a carriage return\r\nFrom é to ü✓: ok",
        "From a to b:\tno space\nFrom a  to b: two spaces\nFrom a to b: From c to d: one per line",
        "",
    ]
    scores = [2**62 + 1, 2**62 + 2, -1, 3]
    task = "Développer ✓\n"
    episode = {
        "task": task,
        "iterations": [{"task_assignments": {"a": "x"}, "communications": texts}],
        "planning_scores": scores,
        "communication_scores": [7, 2**53, 1, 1],
        "surprise": 1,
    }
    path = tmp_path / "episode.jsonl"
    path.write_text(json.dumps(episode) + "\n", encoding="utf-8")
    from_file, from_dict = convert.marble(path), convert.marble(episode)
    for batch in (from_file, from_dict):
        trace = batch[0]
        expected = [tuple(turn) for text in texts for turn in zip(*[iter(speaker.split(text)[1:])] * 3, strict=True)]
        talk = [(e["from"], e["to"]) for e in trace["events"] if e["type"] == "message" and e.get("kind") is None]
        assert talk == [(sender, receiver) for sender, receiver, _ in expected]
        outside = sum(not header.match(speaker.split(text)[0]) for text in texts)
        assert batch.conversion_report.unknown == Counter(
            {"communication text outside 'From A to B:' lines": outside, "episode key surprise": 1}
        )
        assert trace["task_id"] == "marble-" + hashlib.sha256(task.encode()).hexdigest()[:16]
        scored = [s for s in scores if s != -1]
        assert trace["rewards"]["planning"] == sum(scored) / len(scored)  # int / int: one rounding
        assert trace["rewards"]["communication"] == (7 + 2**53 + 1 + 1) / 4
        assert trace["missing_scores"] == ["planning_scores/2"]
    assert [t["events"] for t in from_file] != [] and from_file[0]["trace_id"] == "episode:1"
    assert from_dict[0]["trace_id"] == "<object>:1"
    assert [e["content_ref"].split("#")[1] for e in from_file[0]["events"]] == [
        e["content_ref"].split("#")[1] for e in from_dict[0]["events"]
    ]


MALFORMED = {
    "marble episode without events": ("marble", '{"task": "t", "iterations": []}\n', r":1: an episode without iterations"),
    "marble episode without iterations": (
        "marble",
        '{"task": "t", "iterations": [{"task_assignments": {"a": "x"}}]}\n{"task": "t"}\n',
        r":2: .*'iterations'",
    ),
    "marble line not an object": ("marble", "[1, 2]\n", r":1: expected a JSON object, got list"),
    "truncated span line": (
        "otel",
        '{"name": "chat", "context": {"trace_id": "0x1", "span_id": "0x2"}, "start_time": 1, "end_time": 2}\n{"name": \n',
        r":2: not valid JSON",
    ),
    "span without ids": ("otel", '{"name": "chat", "start_time": 1, "end_time": 2}', r"span without a trace id"),
    "span line without an end time": (
        "otel",
        '{"name": "chat", "context": {"trace_id": "0x1", "span_id": "0x2"}, "start_time": 1, "end_time": 2}\n\n'
        '{"name": "chat", "context": {"trace_id": "0x1", "span_id": "0x3"}, "start_time": 1}\n',
        r":3: missing or unreadable span time$",
    ),
    "uuid that cannot be an id": (
        "claude_code",
        '{"type": "user", "uuid": ["u"], "timestamp": "2026-01-01T00:00:00Z"}\n',
        r":1: uuid is a list, expected text$",
    ),
    "tool name that is not text": (
        "claude_code",
        '{"type": "assistant", "uuid": "a", "timestamp": "2026-01-01T00:00:00Z", '
        '"message": {"content": [{"type": "tool_use", "id": "t", "name": {}}]}}\n',
        r":1: message.content/0/name is an object, expected text$",
    ),
    "JSON nested past the parser": (
        "claude_code",
        '{"a":' * 100_000 + "1" + "}" * 100_000 + "\n",
        r":1: JSON nested too deeply to read$",
    ),
    "resourceSpans of text": ("otel", '{"resourceSpans": ["x"]}', r": /resourceSpans/0 is text, expected an object$"),
    "OTLP attribute without a key": (
        "otel",
        '{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "01", "spanId": "02", '
        '"startTimeUnixNano": 1, "endTimeUnixNano": 2, "attributes": [{"value": {"intValue": "1"}}]}]}]}]}',
        r": /resourceSpans/0/scopeSpans/0/spans/0/attributes/0/key is null, expected text$",
    ),
    "OTel file that is not UTF-8": ("otel", b'{"name": "chat"}\n{"name": "\xff"}\n', r":2: not UTF-8 text"),
    "marble tokens the contract refuses": (
        "marble",
        '{"task": "t", "token_usage": -5, "iterations": [{"task_assignments": {"a": "x"}}]}\n',
        r":1: converted trace 'input:1' is invalid at /costs/tokens",
    ),
    "marble mode that is not text": (
        "marble",
        '{"task": "t", "coordination_mode": [], "iterations": []}\n',
        r":1: /coordination_mode is a list, expected text$",
    ),
    "otlp line with a span without ids": (
        "otel",
        '{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "x"}]}]}]}\n{"resourceSpans": []}\n',
        r":1: /resourceSpans/0/scopeSpans/0/spans/0: span without traceId",
    ),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_input_names_file_and_line(case, tmp_path):
    converter, text, message = MALFORMED[case]
    path = tmp_path / "input.jsonl"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConversionError, match=f"^{path}{message}" if message.startswith(":") else message):
        convert.FORMATS[converter](path)


# ---- seed, both directions ----------------------------------------------------------------
def test_seed_round_trip_is_strict_both_ways(seed_example, seed_validator, tmp_path):
    batch = convert.seed(seed_example)
    assert convert.to_seed(batch) == [batch.to_seed_json(0)]
    seed_validator.validate(convert.to_seed(batch)[0])
    with pytest.raises(ConversionError, match="at /group_id") as raised:
        convert.seed({**seed_example, "group_id": "g"})
    assert isinstance(raised.value.__cause__, masreplay.TraceValidationError)
    for suffix in (".json", ".jsonl", ".parquet"):
        convert.write(batch, tmp_path / f"out{suffix}")
        again = (
            convert.seed(tmp_path / f"out{suffix}") if suffix != ".parquet" else masreplay.load_traces(tmp_path / f"out{suffix}")
        )
        assert again[0]["events"] == batch[0]["events"]
    with pytest.raises(ValueError, match="output format"):
        convert.write(batch, tmp_path / "out.csv")


def test_converted_samples_round_trip_through_seed_json(claude_batch, tmp_path, seed_validator):
    marble = convert.marble(sample("marble", MARBLE_FILES[0]))
    for batch in (claude_batch, marble):
        convert.write(batch, tmp_path / "traces.json")
        document = json.loads((tmp_path / "traces.json").read_text())
        for trace in document if isinstance(document, list) else [document]:
            seed_validator.validate(trace)
        again = convert.seed(tmp_path / "traces.json")
        assert [t["events"] for t in again] == [t["events"] for t in batch]


def test_paths_may_start_with_a_tilde(claude_files, seed_example, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    _write_session(tmp_path, claude_files["main"], {name: lines for name, lines in claude_files.items() if name != "main"})
    batch = convert.claude_code(f"~/{SESSION}.jsonl")
    assert batch.conversion_report.sources[0] == str(tmp_path / f"{SESSION}.jsonl")
    assert batch.conversion_report.clean, str(batch.conversion_report)
    convert.write(convert.seed(seed_example), "~/seed.json")
    assert len(convert.seed("~/seed.json")) == 1
    (tmp_path / "marble.jsonl").write_text(sample("marble", MARBLE_FILES[0]).read_text())
    assert len(convert.marble("~/marble.jsonl")) == len(read_lines(tmp_path / "marble.jsonl"))
    (tmp_path / "spans.jsonl").write_text(
        '{"name": "chat", "context": {"trace_id": "0x1", "span_id": "0x2"}, "start_time": 1, "end_time": 2, '
        '"attributes": {"gen_ai.operation.name": "chat"}}\n'
    )
    assert len(convert.otel("~/spans.jsonl")) == 1


# ---- the command line ---------------------------------------------------------------------
def test_cli_convert(tmp_path, capsys):
    source = sample("claude_code", f"{SESSION}.jsonl")
    for suffix in (".json", ".jsonl", ".parquet"):
        assert main(["convert", "--from", "claude_code", str(source), str(tmp_path / f"cc{suffix}")]) == 0
        assert masreplay.load_traces(tmp_path / f"cc{suffix}").trace_ids == [SESSION]
    out = capsys.readouterr().out
    assert "wrote 1 traces" in out and "ignored" in out
    assert main(["convert", "--from", "marble", str(sample("marble", MARBLE_FILES[1])), str(tmp_path / "m.jsonl")]) == 0
    assert len(masreplay.load_traces(tmp_path / "m.jsonl")) == len(read_lines(sample("marble", MARBLE_FILES[1])))
    assert main(["validate", "--strict-seed", str(tmp_path / "m.jsonl")]) == 0
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    assert main(["convert", "--from", "marble", str(bad), str(tmp_path / "x.json")]) == 1
    assert f"{bad}:1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["convert", "--from", "csv", str(bad), str(tmp_path / "x.json")])


def test_the_conversion_report_travels_with_the_traces(claude_batch):
    """Pickled (multiprocessing, Ray), sliced or concatenated, a converted batch still says
    what its converter read and set aside."""
    report = claude_batch.conversion_report
    restored = pickle.loads(pickle.dumps(claude_batch))
    assert restored.conversion_report == report
    assert restored.to_arrow().equals(claude_batch.to_arrow())
    assert claude_batch[:1].conversion_report == report
    assert claude_batch[[0]].conversion_report == report
    twice = masreplay.TraceBatch.concat([claude_batch, claude_batch])
    assert twice.conversion_report.records == 2 * report.records
    assert twice.conversion_report.ignored == report.ignored + report.ignored
    assert twice.conversion_report.sources == report.sources * 2
    assert twice.conversion_report.format == report.format


def test_seed_is_strict_in_every_input_form(tmp_path, seed_example):
    own = masreplay.sim.generate(2, seed=0)
    (tmp_path / "own.json").write_text(json.dumps(own[0]))
    own.write_parquet(tmp_path / "own.parquet")
    for source in (tmp_path / "own.json", tmp_path / "own.parquet", own.to_arrow()):
        with pytest.raises(ConversionError, match="--from masreplay") as caught:
            convert.seed(source)
        assert caught.value.__cause__.trace_id == own.trace_ids[0]
    # the same traces as seed JSON pass, in Parquet too (group_id only as task_id's default)
    convert.write(convert.seed(seed_example), tmp_path / "seed.parquet")
    assert convert.seed(tmp_path / "seed.parquet").trace_ids == [seed_example["trace_id"]]


def test_masreplay_format_reads_its_own_files(tmp_path):
    own = masreplay.sim.generate(3, seed=0)
    (tmp_path / "own.jsonl").write_text("".join(json.dumps(own[i]) + "\n" for i in range(3)))
    assert main(["convert", "--from", "masreplay", str(tmp_path / "own.jsonl"), str(tmp_path / "out.parquet")]) == 0
    assert masreplay.load_traces(tmp_path / "out.parquet").to_arrow().equals(own.to_arrow())


@pytest.mark.parametrize("name", sorted(convert.FORMATS))
def test_a_missing_file_is_a_conversion_error_in_every_converter(name, tmp_path):
    with pytest.raises(ConversionError, match=r"missing\.json"):
        convert.FORMATS[name](str(tmp_path / "missing.json"))


def test_to_seed_and_write_take_anything_load_traces_takes(tmp_path):
    batch = masreplay.sim.generate(3, seed=5)
    path = tmp_path / "traces.parquet"
    batch.write_parquet(path)
    assert convert.to_seed(path) == convert.to_seed(batch)
    convert.write(path, tmp_path / "traces.jsonl")
    assert masreplay.load_traces(tmp_path / "traces.jsonl").trace_ids == batch.trace_ids
    with pytest.raises(TypeError, match="load_traces takes"):
        convert.to_seed(5)
