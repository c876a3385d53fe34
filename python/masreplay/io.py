"""Reading traces from every source masreplay accepts, and validating them."""

from __future__ import annotations

import errno
import os
import pathlib
from collections.abc import Mapping
from typing import Any, Literal

from masreplay import _core
from masreplay._args import checked
from masreplay.batch import TraceBatch, _checked_arrow
from masreplay.errors import ArgumentTypeError, InvalidArgumentError, StorageError

OnError = Literal["raise", "skip"]

_PARQUET_SUFFIXES = {".parquet", ".pq"}


def _looks_like_json_text(text: str) -> bool:
    return text.lstrip()[:1] in ("{", "[")


def _parquet_files(directory: pathlib.Path) -> list[str]:
    files = sorted(p for p in directory.rglob("*") if p.suffix in _PARQUET_SUFFIXES and p.is_file())
    if not files:
        raise StorageError(errno.ENOENT, "no Parquet files under this directory", os.fspath(directory))
    return [os.fspath(p) for p in files]


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Writes ``text`` to ``path`` as UTF-8; a path that cannot be written (a directory, a
    missing folder) is a StorageError naming it, as the core's writers raise."""
    try:
        pathlib.Path(path).write_text(text, encoding="utf-8")
    except OSError as error:
        raise StorageError(error.errno, error.strerror, os.fspath(path)) from error


def _load_path(path: pathlib.Path, strict_seed: bool) -> tuple[Any, list]:
    if path.is_dir():
        return _core.read_parquet(_parquet_files(path))
    if path.suffix in _PARQUET_SUFFIXES:
        return _core.read_parquet([os.fspath(path)])
    try:
        data = path.read_bytes()
    except OSError as error:
        # The same exception class as a Parquet file that cannot be read (raised by the core).
        raise StorageError(error.errno, error.strerror, os.fspath(path)) from error
    return _core.parse_json(data, strict_seed=strict_seed)


def _load(source: Any, strict_seed: bool) -> tuple[Any, list]:
    if isinstance(source, TraceBatch):
        return source._core, []
    if isinstance(source, _core.TraceBatch):
        return source, []
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _core.parse_json(bytes(source), strict_seed=strict_seed)
    # An empty string is empty JSON text, not the path "" (which pathlib reads as ".").
    if isinstance(source, str) and (_looks_like_json_text(source) or not source.strip()):
        return _core.parse_json(source.encode(), strict_seed=strict_seed)
    if isinstance(source, (str, os.PathLike)):
        return _load_path(pathlib.Path(source), strict_seed)
    if isinstance(source, Mapping):
        return _core.parse_objects([source], strict_seed=strict_seed)
    if isinstance(source, (list, tuple)):
        return _core.parse_objects(list(source), strict_seed=strict_seed)
    if hasattr(source, "__arrow_c_stream__"):
        return _core.ingest_arrow(_checked_arrow(source))
    if hasattr(source, "__arrow_c_array__"):  # a single record batch
        import pyarrow as pa

        return _core.ingest_arrow(pa.Table.from_batches([_checked_arrow(pa.record_batch(source))]))
    raise ArgumentTypeError(
        "load_traces takes a path, JSON text or bytes, a dict or list of dicts, a TraceBatch, "
        f"or Arrow data (an object with __arrow_c_stream__); got {type(source).__name__}"
    )


@checked
def load_traces(source: Any, *, strict_seed: bool = False, on_error: OnError = "raise") -> TraceBatch:
    """Reads and validates traces.

    ``source`` may be a path (seed JSON, a JSON array of traces, JSON Lines, a Parquet file,
    or a directory of Parquet files in the canonical layout), JSON text or bytes, a dict or a
    list of dicts, a TraceBatch, or any Arrow table/stream in the canonical layout.

    With ``on_error="raise"`` the first invalid trace raises TraceValidationError and nothing
    is returned; with ``"skip"`` the valid traces are returned and the rejected ones are listed
    in ``batch.rejected`` as (position, trace_id, error). ``strict_seed`` accepts only what the
    seed schema allows (no top-level additions).
    """
    if on_error not in ("raise", "skip"):
        raise InvalidArgumentError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
    core, rejected = _load(source, strict_seed)
    if rejected and on_error == "raise":
        raise rejected[0][2]
    return TraceBatch(core, rejected)


@checked
def validate(trace: Any, *, strict_seed: bool = False) -> None:
    """Raises TraceValidationError naming the trace, a JSON pointer and the reason if any
    trace in ``trace`` (anything load_traces accepts) breaks the data contract."""
    load_traces(trace, strict_seed=strict_seed, on_error="raise")


def as_batch(source: Any, name: str = "batch") -> TraceBatch:
    """``source`` as a TraceBatch: a TraceBatch as it is, anything else :func:`load_traces`
    accepts loaded and validated (the first invalid trace raises TraceValidationError). A
    value of no accepted kind is refused naming ``name``, the argument it came as."""
    if isinstance(source, TraceBatch):
        return source
    try:
        return load_traces(source)
    except ArgumentTypeError as error:
        raise ArgumentTypeError(f"{name}: {error}") from None
