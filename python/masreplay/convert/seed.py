"""The seed orchestration-trace schema, both directions, strictly.

Reading accepts exactly the seed schema (no masreplay top-level additions); writing gives
files every seed-schema tool reads: ``.json`` one trace object (a JSON array for several),
``.jsonl`` one seed trace a line. ``.parquet`` keeps masreplay's full canonical layout.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

from masreplay.batch import TraceBatch
from masreplay.convert._lines import IN_MEMORY, local_path
from masreplay.convert._report import ConversionReport
from masreplay.errors import ConversionError, InvalidArgumentError, MasreplayError, TraceValidationError
from masreplay.io import load_traces

OUTPUT_SUFFIXES = (".json", ".jsonl", ".parquet")


def _source_name(source: Any) -> str:
    """The file a source names; IN_MEMORY for JSON text and objects."""
    if isinstance(source, os.PathLike) or (isinstance(source, str) and source.lstrip()[:1] not in ("{", "[")):
        return local_path(source)
    return IN_MEMORY


def seed(source: Any) -> TraceBatch:
    """Reads seed-schema traces (a path, JSON text, a dict or a list of dicts), rejecting
    anything the seed schema does not allow: a ConversionError naming the source, with the
    trace id and JSON pointer in its reason and the TraceValidationError as its cause."""
    name = _source_name(source)
    try:
        batch = load_traces(name if name != IN_MEMORY else source, strict_seed=True)
    except TraceValidationError as error:
        raise ConversionError(name, None, f"trace {error.trace_id!r} at {error.path or '/'}: {error.reason}") from error
    except MasreplayError as error:
        raise ConversionError(name, None, str(error)) from error
    report = ConversionReport("seed", sources=[name], records=len(batch), traces=len(batch), events=batch.num_events)
    batch.conversion_report = report
    return batch


def to_seed(batch: TraceBatch) -> list[dict[str, Any]]:
    """Each trace as a dict the seed JSON Schema accepts (masreplay's top-level additions dropped)."""
    return [batch.to_seed_json(i) for i in range(len(batch))]


def write(batch: TraceBatch, path: str | os.PathLike[str]) -> None:
    """Writes ``batch`` in the format ``path``'s suffix names (see the module docstring)."""
    target = pathlib.Path(local_path(path))
    if target.suffix not in OUTPUT_SUFFIXES:
        raise InvalidArgumentError(f"cannot tell the output format from {os.fspath(path)!r}: use one of {', '.join(OUTPUT_SUFFIXES)}")
    if target.suffix == ".parquet":
        batch.write_parquet(target)
        return
    traces = to_seed(batch)
    if target.suffix == ".jsonl":
        text = "".join(json.dumps(trace) + "\n" for trace in traces)
    else:
        text = json.dumps(traces[0] if len(traces) == 1 else traces, indent=1)
    target.write_text(text, encoding="utf-8")
