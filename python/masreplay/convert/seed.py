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

import pyarrow.compute as pc

from masreplay._args import checked
from masreplay.batch import TraceBatch
from masreplay.conversion_report import ConversionReport
from masreplay.convert._lines import IN_MEMORY, local_path
from masreplay.errors import ConversionError, InvalidArgumentError, MasreplayError, StorageError, TraceValidationError
from masreplay.io import as_batch, load_traces, write_text

OUTPUT_SUFFIXES = (".json", ".jsonl", ".parquet")


def _source_name(source: Any) -> str:
    """The file a source names; IN_MEMORY for JSON text and objects."""
    if isinstance(source, os.PathLike) or (isinstance(source, str) and source.lstrip()[:1] not in ("{", "[")):
        return local_path(source)
    return IN_MEMORY


#: Top-level keys masreplay adds to the seed schema (and the column kept for unknown ones).
MASREPLAY_ADDITIONS = ("schema_version", "group_id", "policy_version", "counterfactual_of", "attributes")


def seed(source: Any) -> TraceBatch:
    """Reads seed-schema traces (a path, JSON text, a dict or a list of dicts), rejecting
    anything the seed schema does not allow, in every input form: a ConversionError naming
    the source, with trace id and JSON pointer in its reason and the TraceValidationError as
    its cause. masreplay's own files carry additions and read with :func:`masreplay_traces`."""
    name = _source_name(source)
    batch = _read(name, name if name != IN_MEMORY else source, strict_seed=True)
    try:
        _refuse_additions(batch)
    except TraceValidationError as error:
        raise _conversion_error(name, error) from error
    batch.conversion_report = ConversionReport(
        "seed", sources=[name], records=len(batch), traces=len(batch), events=batch.num_events
    )
    return batch


def masreplay_traces(source: Any) -> TraceBatch:
    """Reads masreplay's own traces (anything :func:`masreplay.load_traces` accepts, seed
    traces included), so ``masreplay convert --from masreplay`` rewrites them as seed JSON or
    Parquet."""
    name = _source_name(source)
    batch = _read(name, name if name != IN_MEMORY else source, strict_seed=False)
    batch.conversion_report = ConversionReport(
        "masreplay", sources=[name], records=len(batch), traces=len(batch), events=batch.num_events
    )
    return batch


def _read(name: str, source: Any, *, strict_seed: bool) -> TraceBatch:
    """load_traces, every failure a ConversionError as in every other converter (a refused
    trace's TraceValidationError its cause), with the way to masreplay's own layout named
    when the seed schema refuses one of its additions."""
    if name != IN_MEMORY and not os.path.exists(name):
        raise ConversionError(name, None, "cannot read: No such file or directory")
    try:
        return load_traces(source, strict_seed=strict_seed)
    except TraceValidationError as error:
        if strict_seed and error.path.lstrip("/") in MASREPLAY_ADDITIONS:
            error = TraceValidationError(error.trace_id, error.path, f"{error.reason} ({_OWN_FILES})")
        raise _conversion_error(name, error) from error
    except StorageError as error:
        raise ConversionError(name, None, f"cannot read: {error}") from error
    except MasreplayError as error:
        raise ConversionError(name, None, str(error)) from error


def _conversion_error(name: str, error: TraceValidationError) -> ConversionError:
    return ConversionError(name, None, f"trace {error.trace_id!r} at {error.path or '/'}: {error.reason}")


_OWN_FILES = "masreplay's own files read with convert.masreplay_traces, or masreplay convert --from masreplay"


def _refuse_additions(batch: TraceBatch) -> None:
    """Columnar input (Parquet, Arrow) always has masreplay's columns: strict means they hold
    nothing a seed trace could not have given (group_id only as its task_id's default)."""
    table = batch.to_arrow()
    checks = [(name, pc.is_valid(table[name])) for name in ("policy_version", "counterfactual_of", "attributes")]
    checks.append(("group_id", pc.not_equal(table["group_id"], table["task_id"])))
    for name, carries in checks:
        rows = pc.indices_nonzero(pc.fill_null(carries, False)).to_pylist()
        if rows:
            reason = f"{name} is a masreplay addition the seed schema does not allow ({_OWN_FILES})"
            raise TraceValidationError(batch.trace_ids[rows[0]], f"/{name}", reason)


def to_seed(batch: Any) -> list[dict[str, Any]]:
    """Each trace of ``batch`` (or of anything :func:`masreplay.load_traces` accepts) as a dict
    the seed JSON Schema accepts (masreplay's top-level additions dropped)."""
    batch = as_batch(batch)
    return [batch.to_seed_json(i) for i in range(len(batch))]


@checked
def write(batch: Any, path: str | os.PathLike[str]) -> None:
    """Writes ``batch`` (or anything :func:`masreplay.load_traces` accepts) in the format
    ``path``'s suffix names (see the module docstring)."""
    batch = as_batch(batch)
    target = pathlib.Path(local_path(path))
    if target.suffix not in OUTPUT_SUFFIXES:
        raise InvalidArgumentError(
            f"cannot tell the output format from {os.fspath(path)!r}: use one of {', '.join(OUTPUT_SUFFIXES)}"
        )
    if target.suffix == ".parquet":
        batch.write_parquet(target)
        return
    traces = to_seed(batch)
    if target.suffix == ".jsonl":
        text = "".join(json.dumps(trace) + "\n" for trace in traces)
    else:
        text = json.dumps(traces[0] if len(traces) == 1 else traces, indent=1)
    write_text(target, text)
