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

The conversion runs in the Rust core (``masreplay-core``'s ``convert::otel``), with the GIL
released; a file is read there too.
"""

from __future__ import annotations

import os
from typing import Any

from masreplay import _core
from masreplay.batch import TraceBatch
from masreplay.convert._converted import converted
from masreplay.convert._lines import IN_MEMORY, _read, local_path


def otel(source: Any) -> TraceBatch:
    """Converts OpenTelemetry spans: a path to an OTLP JSON export (one document, or JSON
    Lines of them as the Collector's file exporter writes), a file of span JSON objects (the
    SDK's ``to_json``, Agent Lightning span dumps), or the parsed objects themselves."""
    if isinstance(source, (str, os.PathLike)):
        name = local_path(source)
        result = _core.convert_otel(name, None, text=_read(name))
    else:
        name = IN_MEMORY
        result = _core.convert_otel(name, source)
    return converted("otel", [name], result)
