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

import os
import pathlib
from typing import Any

from masreplay import _core
from masreplay.batch import TraceBatch
from masreplay.convert._converted import converted
from masreplay.convert._lines import _read, local_path, records


def _label(source: str) -> str:
    """The file's name relative to the session folder, for content_ref pointers."""
    path = pathlib.PurePath(source)
    return "/".join(path.parts[-2:]) if path.parent.name == "subagents" else path.name


def _sources(source: Any) -> tuple[list[tuple[str, str, Any]], str | None]:
    """(name, content_ref label, bytes or records) of the main transcript and, for a path, of
    the sub-agent files of the 2.1.x layout; with the folder these were looked for in."""
    if not isinstance(source, (str, os.PathLike)):
        name, numbered = records(source)
        return [(name, _label(name), [record for _, record in numbered])], None
    main = pathlib.Path(local_path(source))
    files = [(str(main), _label(str(main)), _read(str(main)))]  # first: a path that names no file fails here
    folder = main.with_suffix("") / "subagents"
    for path in sorted(folder.glob("*.jsonl")):
        name = local_path(path)
        files.append((name, _label(name), _read(name)))
    return files, str(folder)


def claude_code(source: Any, *, trace_id: str | None = None, task_id: str | None = None) -> TraceBatch:
    """Converts a Claude Code session into one trace.

    ``source`` is the path of the session's ``<session>.jsonl`` (its ``<session>/subagents/``
    folder is read too) or the transcript's lines as a list of dicts. ``trace_id`` defaults
    to the session id, ``task_id`` to the trace id. A line that is not a JSON object, or lacks
    what its type needs, raises ConversionError naming file and line.
    """
    files, folder = _sources(source)
    result = _core.convert_claude_code(files, folder=folder, trace_id=trace_id or None, task_id=task_id or None)
    return converted("claude_code", [name for name, _, _ in files], result)
