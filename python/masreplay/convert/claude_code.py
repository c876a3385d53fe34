"""Claude Code session transcripts -> one orchestration trace per session.

Every transcript line with a ``uuid`` becomes zero or more events whose id is that uuid
(``uuid#k`` for the k-th content block when a line holds several):

- assistant ``thinking`` -> orchestrator_decision, ``text`` -> message, ``tool_use`` ->
  tool_call, or spawn when the tool is Task/Agent (the sub-agent's lines are its events);
- user ``tool_result`` -> tool_result joined to its call by tool_use_id (a ``return`` edge),
  or a return event by the sub-agent for a Task/Agent call; ``is_error`` (a failed tool or a
  failed or interrupted sub-agent) adds a safety_event by the caller;
- user text: the sub-agent's prompt is a message from its parent, text injected by the
  harness (meta lines, ``<task-notification>``..., a sub-agent's other user text) a message
  from ``harness`` (a safety_event addressed to the agent of the blocked call when it reports
  a hook blocking a tool), the compaction summary a message from its compaction's side agent,
  the rest human_intervention by ``human``;
- system ``compact_boundary`` -> aggregate by that compaction's side agent (the
  ``acompact-*`` agent whose request hangs on the boundary's logical parent);
  ``stop_hook_summary`` -> safety_event by ``harness`` when the hooks prevented continuation
  or failed, else counted in ``ignored`` (the hooks passed).

Each event's ``role`` says what its author is to the session: ``orchestrator`` (the session's
own agent), ``sub-agent``, ``compaction`` (a compaction side agent), ``human``, ``harness`` or
``tool`` (a tool result); ``kind`` tells the messages, safety events and aggregates of the
harness apart (``prompt``, ``compaction_summary``, ``hook_block``, ``stop_hook``,
``compaction``), and a spawn carries the call's ``subagent_type``.
Each event's ``content_ref`` is ``file:line`` (``#k`` for block k), a pointer to the text it
came from. Edges come from ``parentUuid`` (causal, through lines that made no event), plus spawn,
return, aggregate and safety_flow edges. Token usage is counted once per message id (the
largest value of each usage field: lines of one message repeat a streaming snapshot) on the
message's first event. Lines that repeat or only narrate others (progress, snapshots, queue
operations, turn durations) are counted in the report's ``ignored``; anything else unread
lands in ``unknown``. A spawned sub-agent whose own lines are missing (no ``subagents/`` file,
or dicts given without them) is a report warning, and its agent_progress lines, then the only
copy of its events, are counted apart: events are not rebuilt from them.

Two layouts are read: 2.1.x, where each sub-agent has ``<session>/subagents/agent-<id>.jsonl``
and its lines carry ``agentId``; and 2.0.x, where sub-agent lines sit in the main file marked
``isSidechain`` and are matched to their Task call by prompt text.
"""

from __future__ import annotations

import functools
import math
import os
import pathlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from typing import Any

from masreplay.batch import TraceBatch
from masreplay.conversion_report import ConversionReport
from masreplay.convert._builder import TraceBuilder, load
from masreplay.convert._lines import IN_MEMORY, local_path, records
from masreplay.convert._shape import describe
from masreplay.errors import ConversionError

MAIN_AGENT = "main"
HUMAN = "human"
HARNESS = "harness"
SPAWN_TOOLS = frozenset({"Task", "Agent"})
USAGE_FIELDS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
# User text that Claude Code itself writes into the conversation, not typed by a person.
HARNESS_PREFIXES = ("<task-notification>", "<system-reminder>", "<command-", "<local-command-", "Caveat: ")
# How the harness tells the model that a hook refused a tool call.
HOOK_BLOCK = "hook blocking error"

# Understood and deliberately not turned into events (counted in report.ignored).
IGNORED_LINE_TYPES = frozenset({"file-history-snapshot", "queue-operation", "summary"})
IGNORED_PROGRESS = frozenset({"agent_progress", "hook_progress", "bash_progress", "waiting_for_task", "mcp_progress"})
IGNORED_SYSTEM = frozenset({"turn_duration"})
# agent_progress lines of a sub-agent whose own transcript is missing: the only copy of its events.
MISSING_SUBAGENT_PROGRESS = "progress agent_progress (not repeated: sub-agent transcript missing)"
# A line written twice (same uuid, same content): one copy is read.
REPEATED_LINE = "line repeating an earlier line (same uuid and content)"
# Fields of a line that are looked up as ids or compared as names, and those read into.
TEXT_FIELDS = ("uuid", "parentUuid", "logicalParentUuid", "parentToolUseID", "subtype")
OBJECT_FIELDS = ("compactMetadata",)
BLOCK_FIELDS = (
    ("type", str, "text"),
    ("id", str, "text"),
    ("tool_use_id", str, "text"),
    ("name", str, "text"),
    ("text", str, "text"),
    ("input", dict, "an object"),
)

# Roles (the events' `role`): what the author is to the session. The metrics never take a
# human, the harness or a tool for the orchestrator.
ORCHESTRATOR, SUB_AGENT, COMPACTION, TOOL = "orchestrator", "sub-agent", "compaction", "tool"


@dataclass
class _Line:
    source: str
    number: int
    record: dict[str, Any]
    agent: str = MAIN_AGENT
    events: list[str] = field(default_factory=list)

    def fail(self, reason: str) -> ConversionError:
        return ConversionError(self.source, self.number, reason)

    @property
    def file(self) -> str:
        """The file's name relative to the session folder, for content_ref pointers."""
        path = pathlib.PurePath(self.source)
        return "/".join(path.parts[-2:]) if path.parent.name == "subagents" else path.name

    @property
    def uuid(self) -> str | None:
        return self.record.get("uuid")

    def check(self) -> None:
        """The fields the converter hashes or reads into are of the types it needs."""
        record = self.record
        if not isinstance(record.get("type"), str):
            raise self.fail("line without a string 'type'")
        for key in TEXT_FIELDS:
            if record.get(key) is not None and not isinstance(record[key], str):
                raise self.fail(f"{key} is {describe(record[key])}, expected text")
        for key in OBJECT_FIELDS:
            if record.get(key) is not None and not isinstance(record[key], dict):
                raise self.fail(f"{key} is {describe(record[key])}, expected an object")
        message = record.get("message")
        if isinstance(message, dict):
            if message.get("id") is not None and not isinstance(message["id"], str):
                raise self.fail(f"message.id is {describe(message['id'])}, expected text")
            if message.get("usage") is not None and not isinstance(message["usage"], dict):
                raise self.fail(f"message.usage is {describe(message['usage'])}, expected an object")

    @functools.cached_property
    def content(self) -> list[dict[str, Any]]:
        """The message's blocks (text as one text block), each checked for the types read from it."""
        message = self.record.get("message")
        if not isinstance(message, dict):
            raise self.fail(f"{self.record['type']} line without a message object")
        content = message.get("content")
        if isinstance(content, str):
            return [{"type": "text", "text": content}]
        if not isinstance(content, list) or not all(isinstance(block, dict) for block in content):
            raise self.fail("message.content is neither text nor a list of blocks")
        for index, block in enumerate(content):
            for key, kind, name in BLOCK_FIELDS:
                if block.get(key) is not None and not isinstance(block[key], kind):
                    raise self.fail(f"message.content/{index}/{key} is {describe(block[key])}, expected {name}")
        return content


Files = list[tuple[str, list[tuple[int, dict[str, Any]]]]]


def _transcript(source: Any) -> tuple[Files, pathlib.Path | None]:
    """The main transcript and, for a path, the sub-agent files of the 2.1.x layout (with
    the folder they were looked for in)."""
    if not isinstance(source, (str, os.PathLike)):
        return [records(source)], None
    main = pathlib.Path(local_path(source))
    transcript = records(main)  # first: a path that names no file fails here
    folder = main.with_suffix("") / "subagents"
    return [transcript, *(records(path) for path in sorted(folder.glob("*.jsonl")))], folder


def _seconds(line: _Line) -> float:
    stamp = line.record.get("timestamp")
    if not isinstance(stamp, str):
        raise line.fail("line without a timestamp")
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except (ValueError, OverflowError):
        raise line.fail(f"timestamp {stamp!r} is not an ISO-8601 time") from None


class _Session:
    """One conversion: the lines of every file, indexed the ways the edges need."""

    def __init__(self, files: Files, folder: pathlib.Path | None, report: ConversionReport) -> None:
        self.report = report
        self.lines: list[_Line] = []
        self.by_uuid: dict[str, _Line] = {}
        for name, numbered in files:
            for number, record in numbered:
                line = _Line(name, number, record)
                line.check()
                first = self.by_uuid.setdefault(line.uuid, line) if line.uuid else line
                if first is line:
                    self.lines.append(line)
                elif first.record == record:
                    report.ignored[REPEATED_LINE] += 1
                else:
                    raise line.fail(f"uuid {line.uuid!r} is already the uuid of {first.source}:{first.number}, a different line")
        stamps = [_seconds(line) for line in self.lines if "timestamp" in line.record]
        self.start, self.end = (min(stamps), max(stamps)) if stamps else (0.0, 0.0)
        self._assign_agents()
        self.calls = self._tool_calls()
        self.spawned = self._match_spawns()
        self.parent_agent = {agent: self.calls[call][0].agent for call, agent in self.spawned.items()}
        self.missing_subagents = self._report_missing_transcripts(folder)
        self.boundaries = sorted((line for line in self.lines if line.record.get("subtype") == "compact_boundary"), key=_seconds)
        self.compaction_agents = self._match_compactions()
        self.usage = self._usage_per_message()

    def _assign_agents(self) -> None:
        """2.1.x lines name their agent; a 2.0.x sidechain line inherits its parent's, and a
        sidechain root starts a new one."""
        roots = 0
        for line in self.lines:
            record = line.record
            if isinstance(record.get("agentId"), str):
                line.agent = record["agentId"]
            elif record.get("isSidechain"):
                parent = self.by_uuid.get(record.get("parentUuid"))
                if parent is not None and parent.record.get("isSidechain"):
                    line.agent = parent.agent
                else:
                    roots += 1
                    line.agent = f"sidechain-{roots}"

    def _tool_calls(self) -> dict[str, tuple[_Line, dict[str, Any]]]:
        """tool_use id -> (its line, its content block)."""
        calls = {}
        for line in self.lines:
            if line.record["type"] == "assistant":
                for block in line.content:
                    if block.get("type") == "tool_use" and isinstance(block.get("id"), str):
                        calls[block["id"]] = (line, block)
        return calls

    def _match_spawns(self) -> dict[str, str]:
        """Task/Agent tool_use id -> the sub-agent it started: by the agentId its result or
        its progress lines name (2.1.x), else by the sub-agent's first prompt (2.0.x)."""
        spawned: dict[str, str] = {}
        for line in self.lines:
            record = line.record
            if record["type"] == "user" and isinstance(record.get("toolUseResult"), dict):
                agent = record["toolUseResult"].get("agentId")
                for block in line.content:
                    if block.get("type") == "tool_result" and isinstance(agent, str):
                        spawned[block.get("tool_use_id")] = agent
            elif record["type"] == "progress" and isinstance(record.get("data"), dict):
                data = record["data"]
                if data.get("type") == "agent_progress" and isinstance(data.get("agentId"), str):
                    spawned.setdefault(record.get("parentToolUseID"), data["agentId"])
        spawn_calls = [i for i, (_, block) in self.calls.items() if block.get("name") in SPAWN_TOOLS]
        spawned = {call: agent for call, agent in spawned.items() if call in spawn_calls}
        taken = set(spawned.values())
        roots: dict[str, _Line] = {}
        for line in self.lines:
            if line.agent.startswith("sidechain-") and line.agent not in taken:
                roots.setdefault(line.agent, line)
        for call in spawn_calls:
            if call in spawned:
                continue
            prompt = (self.calls[call][1].get("input") or {}).get("prompt")
            for agent, root in roots.items():
                if root.record.get("type") == "user" and _text(root.content) == prompt:
                    spawned[call] = agent
                    del roots[agent]
                    break
        return spawned

    def progress_agent(self, line: _Line) -> str | None:
        """The sub-agent an agent_progress line repeats an entry of."""
        data = line.record.get("data") or {}
        agent = data.get("agentId")
        return agent if isinstance(agent, str) else self.spawned.get(line.record.get("parentToolUseID"))

    def _report_missing_transcripts(self, folder: pathlib.Path | None) -> set[str]:
        """Sub-agents that were spawned but whose own lines are not in the input: their
        events then survive only in the parent's agent_progress lines, which this converter
        does not rebuild events from, so the loss is reported, never silent."""
        present = {line.agent for line in self.lines}
        missing = {agent for agent in self.spawned.values() if agent not in present}
        progress = Counter(self.progress_agent(line) for line in self.lines if _progress_kind(line) == "agent_progress")
        main = self.lines[0].source if self.lines else IN_MEMORY
        for call, agent in self.spawned.items():
            if agent in missing:
                where = (
                    folder / f"agent-{agent}.jsonl"
                    if folder
                    else f"agent-{agent}.jsonl (pass the session's path so its subagents/ folder is read)"
                )
                self.report.warnings.append(
                    f"{main}: sub-agent {agent!r} spawned by tool call {call!r} has no transcript ({where} missing); "
                    f"its events were not converted ({progress[agent]} agent_progress lines carry them)"
                )
        for call, (line, block) in self.calls.items():
            if block.get("name") in SPAWN_TOOLS and call not in self.spawned:
                self.report.warnings.append(
                    f"{line.source}:{line.number}: no sub-agent transcript found for {block.get('name')} call {call!r}; "
                    "converted as a plain tool call"
                )
        return missing

    def _match_compactions(self) -> dict[str, str]:
        """compact_boundary uuid -> the side agent that compacted: the acompact agent whose
        compaction request hangs on the boundary's logical parent, else the earliest side agent
        left over; ``compaction-<k>`` when its transcript is not in the input."""
        requests = {line.record.get("parentUuid"): line.agent for line in self.lines if line.agent.startswith("acompact")}
        matched = {
            b.uuid: requests[b.record["logicalParentUuid"]]
            for b in self.boundaries
            if b.record.get("logicalParentUuid") in requests
        }
        started: dict[str, float] = {}
        for line in self.lines:
            if line.agent.startswith("acompact") and line.agent not in matched.values() and "timestamp" in line.record:
                started[line.agent] = min(started.get(line.agent, math.inf), _seconds(line))
        left_over = sorted(started, key=started.__getitem__)
        for number, boundary in enumerate(self.boundaries, start=1):
            if boundary.uuid not in matched:
                matched[boundary.uuid] = left_over.pop(0) if left_over else f"compaction-{number}"
        return matched

    def compaction_of_summary(self, line: _Line) -> str:
        """The side agent of the compaction a summary follows: that of the boundary among its
        ancestors, else of the latest boundary before it."""
        seen, parent = set(), self.by_uuid.get(line.record.get("parentUuid"))
        while parent is not None and parent.uuid not in seen:
            if parent.uuid in self.compaction_agents:
                return self.compaction_agents[parent.uuid]
            seen.add(parent.uuid)
            parent = self.by_uuid.get(parent.record.get("parentUuid"))
        earlier = [boundary for boundary in self.boundaries if _seconds(boundary) <= _seconds(line)]
        return self.compaction_agents[earlier[-1].uuid] if earlier else "compaction"

    def _usage_per_message(self) -> dict[str, dict[str, int]]:
        usage: dict[str, dict[str, int]] = defaultdict(dict)
        for line in self.lines:
            message = line.record.get("message")
            if line.record["type"] != "assistant" or not isinstance(message, dict):
                continue
            counts = message.get("usage") or {}
            merged = usage[message.get("id") or line.uuid]
            for name in USAGE_FIELDS:
                count = counts.get(name)
                if isinstance(count, int) and not isinstance(count, bool):
                    if count < 0:
                        raise line.fail(f"message.usage.{name} is negative ({count})")
                    merged[name] = max(merged.get(name, 0), count)
        return usage

    def t(self, line: _Line) -> float:
        return _seconds(line) - self.start


def _progress_kind(line: _Line) -> str | None:
    data = line.record.get("data")
    kind = data.get("type") if line.record["type"] == "progress" and isinstance(data, dict) else None
    return kind if isinstance(kind, str) else None


def _role(agent: str) -> str:
    """The role of an author: the session's own agent orchestrates; the person, the harness
    and the compaction side agents are named as such; every other agent is a sub-agent."""
    if agent == MAIN_AGENT:
        return ORCHESTRATOR
    if agent in (HUMAN, HARNESS):
        return agent
    return COMPACTION if agent.startswith(("acompact", "compaction")) else SUB_AGENT


def _text(content: list[dict[str, Any]]) -> str:
    return "".join(block.get("text") or "" for block in content if block.get("type") == "text")


class _Converter:
    def __init__(self, session: _Session, builder: TraceBuilder) -> None:
        self.session = session
        self.builder = builder
        self.report = session.report
        self.counted_messages: set[str] = set()
        # Sub-agent -> its first user line (the prompt), filled as lines are read.
        self.roots: dict[str, _Line | None] = dict.fromkeys(session.parent_agent)
        self.call_events: dict[str, str] = {}
        self.spawn_events: dict[str, str] = {}

    def run(self) -> None:
        for line in self.session.lines:
            kind = line.record["type"]
            handler = getattr(self, f"_{kind}", None)
            if handler is None:
                bucket = self.report.ignored if kind in IGNORED_LINE_TYPES else self.report.unknown
                bucket[f"line type {kind}"] += 1
                continue
            handler(line)
        self._edges()

    def _new(self, line: _Line, block_index: int, blocks: int, type: str, agent: str, suffix: str = "", **fields: Any) -> str:
        if not line.uuid:
            raise line.fail(f"{line.record['type']} line without a uuid")
        event_id = (line.uuid if blocks == 1 else f"{line.uuid}#{block_index}") + suffix
        content_ref = f"{line.file}:{line.number}" if blocks == 1 else f"{line.file}:{line.number}#{block_index}"
        role = TOOL if type == "tool_result" else _role(agent)
        line.events.append(
            self.builder.event(event_id, self.session.t(line), type, agent, role=role, content_ref=content_ref, **fields)
        )
        return event_id

    # ---- line types ------------------------------------------------------------------
    def _assistant(self, line: _Line) -> None:
        content = line.content
        message = line.record["message"]
        for index, block in enumerate(content):
            kind = block.get("type")
            fields = self._usage_fields(line, message)
            if kind in ("thinking", "redacted_thinking"):
                self._new(line, index, len(content), "orchestrator_decision", line.agent, **fields)
            elif kind == "text":
                self._new(line, index, len(content), "message", line.agent, from_=line.agent, **fields)
            elif kind == "tool_use":
                name = block.get("name")
                if block.get("id") in self.session.spawned:
                    sub = self.session.spawned[block["id"]]
                    subagent_type = (block.get("input") or {}).get("subagent_type")
                    event = self._new(
                        line,
                        index,
                        len(content),
                        "spawn",
                        line.agent,
                        to=sub,
                        subagent_type=subagent_type,
                        tool=name,
                        tool_use_id=block["id"],
                        **fields,
                    )
                    self.spawn_events[sub] = event
                else:
                    event = self._new(
                        line, index, len(content), "tool_call", line.agent, tool=name, tool_use_id=block.get("id"), **fields
                    )
                self.call_events[block.get("id")] = event
            else:
                self.report.unknown[f"assistant content block {kind}"] += 1

    def _usage_fields(self, line: _Line, message: dict[str, Any]) -> dict[str, Any]:
        """Tokens and model for the first event of a message id; nothing for the rest."""
        key = message.get("id") or line.uuid
        if key in self.counted_messages:
            return {}
        self.counted_messages.add(key)
        usage = self.session.usage.get(key, {})
        return {
            "tokens": sum(usage.values()),
            "usage": dict(usage) or None,
            "model": message.get("model"),
            "message_id": message.get("id"),
        }

    def _user(self, line: _Line) -> None:
        content = line.content
        for index, block in enumerate(content):
            kind = block.get("type")
            if kind == "tool_result":
                self._tool_result(line, index, len(content), block)
            elif kind in ("text", "image"):
                self._user_text(line, index, len(content), block)
            else:
                self.report.unknown[f"user content block {kind}"] += 1

    def _tool_result(self, line: _Line, index: int, blocks: int, block: dict[str, Any]) -> None:
        call_id = block.get("tool_use_id")
        call = self.session.calls.get(call_id)
        if call is None:
            self.report.warnings.append(f"{line.source}:{line.number}: tool_result for {call_id!r} has no tool_use")
            tool, duration = "unknown_tool", None
        else:
            tool, duration = call[1].get("name") or "unknown_tool", max(0.0, self.session.t(line) - self.session.t(call[0]))
        if call_id in self.session.spawned:
            self._subagent_return(line, index, blocks, block, call[0].agent)
        else:
            self._new(
                line,
                index,
                blocks,
                "tool_result",
                tool,
                tool=tool,
                tool_use_id=call_id,
                is_error=block.get("is_error"),
                duration_s=duration,
            )
        if block.get("is_error"):
            # A failed or interrupted sub-agent is flagged like any failed tool.
            caller = call[0].agent if call else line.agent
            self._new(line, index, blocks, "safety_event", caller, suffix="!error", tool=tool, reason="tool_error")

    def _subagent_return(self, line: _Line, index: int, blocks: int, block: dict[str, Any], caller: str) -> None:
        call_id = block["tool_use_id"]
        sub = self.session.spawned[call_id]
        result = line.record.get("toolUseResult") if isinstance(line.record.get("toolUseResult"), dict) else {}
        duration = result.get("totalDurationMs")
        self._new(
            line,
            index,
            blocks,
            "return",
            sub,
            from_=sub,
            to=caller,
            tool_use_id=call_id,
            is_error=block.get("is_error"),
            duration_s=duration / 1000 if isinstance(duration, (int, float)) else None,
            status=result.get("status"),
            reported_total_tokens=result.get("totalTokens"),
            reported_tool_uses=result.get("totalToolUseCount"),
        )

    def _user_text(self, line: _Line, index: int, blocks: int, block: dict[str, Any]) -> None:
        record = line.record
        text = block.get("text") or ""
        parent = self.session.parent_agent.get(line.agent)
        if record.get("isCompactSummary"):
            agent = self.session.compaction_of_summary(line)
            self._new(line, index, blocks, "message", agent, from_=agent, to=line.agent, kind="compaction_summary")
        elif parent is not None and self.roots.get(line.agent) is None:
            self.roots[line.agent] = line
            self._new(line, index, blocks, "message", parent, from_=parent, to=line.agent, kind="prompt")
        elif HOOK_BLOCK in text:
            # Addressed to the agent whose tool call was blocked: the note may be written into
            # another agent's file (a compaction agent's, in the sample).
            blocked = self.session.by_uuid.get(record.get("parentUuid"))
            self._new(
                line, index, blocks, "safety_event", HARNESS, to=blocked.agent if blocked else line.agent, kind="hook_block"
            )
        elif record.get("isMeta") or text.startswith(HARNESS_PREFIXES) or line.agent != MAIN_AGENT:
            # Only the session's own conversation has a person in it; a sub-agent's other
            # user text (the compaction request, reminders) comes from the harness.
            self._new(line, index, blocks, "message", HARNESS, from_=HARNESS, to=line.agent)
        else:
            self._new(line, index, blocks, "human_intervention", HUMAN, from_=HUMAN, to=line.agent)

    def _system(self, line: _Line) -> None:
        record = line.record
        subtype = record.get("subtype")
        if subtype == "compact_boundary":
            metadata = record.get("compactMetadata") or {}
            agent = self.session.compaction_agents[line.uuid]
            trigger, pre_tokens = metadata.get("trigger"), metadata.get("preTokens")
            self._new(line, 0, 1, "aggregate", agent, kind="compaction", trigger=trigger, pre_tokens=pre_tokens)
        elif subtype == "stop_hook_summary" and not (record.get("preventedContinuation") or record.get("hookErrors")):
            # The stop hooks ran and let the turn end as it would have: nothing was blocked.
            self.report.ignored["system subtype stop_hook_summary (hooks passed)"] += 1
        elif subtype == "stop_hook_summary":
            self._new(
                line,
                0,
                1,
                "safety_event",
                HARNESS,
                kind="stop_hook",
                prevented_continuation=record.get("preventedContinuation"),
                hook_errors=record.get("hookErrors"),
                hook_count=record.get("hookCount"),
            )
        else:
            bucket = self.report.ignored if subtype in IGNORED_SYSTEM else self.report.unknown
            bucket[f"system subtype {subtype}"] += 1

    def _progress(self, line: _Line) -> None:
        kind = _progress_kind(line)
        if kind == "agent_progress" and self.session.progress_agent(line) in self.session.missing_subagents:
            self.report.ignored[MISSING_SUBAGENT_PROGRESS] += 1
            return
        bucket = self.report.ignored if kind in IGNORED_PROGRESS else self.report.unknown
        bucket[f"progress {kind}"] += 1

    # ---- edges -----------------------------------------------------------------------
    def _event_parent(self, line: _Line) -> str | None:
        """The last event of the nearest ancestor line that made one."""
        seen = set()
        uuid = line.record.get("parentUuid") or line.record.get("logicalParentUuid")
        while uuid and uuid not in seen:
            seen.add(uuid)
            parent = self.session.by_uuid.get(uuid)
            if parent is None:
                self.report.warnings.append(f"{line.source}:{line.number}: parentUuid {uuid!r} names no line")
                return None
            if parent.events:
                return parent.events[-1]
            uuid = parent.record.get("parentUuid") or parent.record.get("logicalParentUuid")
        return None

    def _edges(self) -> None:
        builder, session = self.builder, self.session
        # The last event made from an agent's own lines (its return and the summary it hands
        # back are written into its parent's lines, so they are not counted as its own).
        last_event: dict[str, str] = {}
        for line in sorted(session.lines, key=lambda line: session.t(line) if line.events else 0.0):
            if line.events:
                last_event[line.agent] = line.events[-1]
        for line in session.lines:
            for before, after in pairwise(line.events):
                builder.edge(before, after, "safety_flow" if after.endswith("!error") else "causal")
            if not line.events:
                continue
            first = line.events[0]
            if line.record["type"] == "user":
                for block in line.content:
                    call_id = block.get("tool_use_id")
                    if call_id in session.spawned:
                        builder.edge(last_event.get(session.spawned[call_id]), first, "return")
                    builder.edge(self.call_events.get(call_id), first, "return")
            if line.record.get("subtype") == "compact_boundary":
                builder.edge(last_event.get(session.compaction_agents[line.uuid]), first, "aggregate")
            if self.roots.get(line.agent) is line:
                builder.edge(self.spawn_events.get(line.agent), first, "spawn")
            builder.edge(self._event_parent(line), first, "causal")


def claude_code(source: Any, *, trace_id: str | None = None, task_id: str | None = None) -> TraceBatch:
    """Converts a Claude Code session into one trace.

    ``source`` is the path of the session's ``<session>.jsonl`` (its ``<session>/subagents/``
    folder is read too) or the transcript's lines as a list of dicts. ``trace_id`` defaults
    to the session id, ``task_id`` to the trace id. A line that is not a JSON object, or lacks
    what its type needs, raises ConversionError naming file and line.
    """
    files, folder = _transcript(source)
    report = ConversionReport("claude_code", sources=[name for name, _ in files])
    session = _Session(files, folder, report)
    report.records = sum(len(numbered) for _, numbered in files)
    session_id = next((line.record["sessionId"] for line in session.lines if isinstance(line.record.get("sessionId"), str)), None)
    trace_id = trace_id or session_id
    if not trace_id:
        raise ConversionError(report.sources[0], None, "no sessionId in the transcript; pass trace_id=")
    version = next((line.record["version"] for line in session.lines if isinstance(line.record.get("version"), str)), None)
    builder = TraceBuilder(
        trace_id, task_id or trace_id, system=f"claude-code {version}" if version else "claude-code", topology="centralized"
    )
    _Converter(session, builder).run()
    trace = builder.build(wall_clock_s=session.end - session.start)
    batch = load([trace], [(report.sources[0], None)], report.sources[0])
    report.traces, report.events = 1, len(builder.events)
    batch.conversion_report = report
    return batch
