"""Reading JSON records from files or objects, with errors that name file and line."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from masreplay.errors import ConversionError

#: The source name used in errors and reports for input given as Python objects.
IN_MEMORY = "<object>"


def local_path(path: str | os.PathLike[str]) -> str:
    """A path as given, with a leading ``~`` expanded as a shell would (README examples use it)."""
    return os.path.expanduser(os.fspath(path))


def _read(source: str) -> bytes:
    try:
        with open(source, "rb") as handle:
            return handle.read()
    except OSError as error:
        raise ConversionError(source, None, f"cannot read: {error.strerror or error}") from error
    except ValueError as error:  # a path with a NUL byte in it
        raise ConversionError(source, None, f"cannot read: {error}") from None


def _parse(text: str | bytes, source: str, line: int | None) -> Any:
    """One JSON value; syntax errors, undecodable bytes and nesting deeper than Python's
    parser can follow are ConversionErrors."""
    try:
        return json.loads(text)
    except UnicodeDecodeError as error:
        raise ConversionError(source, line, f"not UTF-8 text (byte {error.start}: {error.reason})") from None
    except ValueError as error:
        raise ConversionError(source, line, f"not valid JSON ({error})") from None
    except RecursionError:
        raise ConversionError(source, line, "JSON nested too deeply to read") from None


def json_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yields (line number, object) for each non-blank line; a line that is not a JSON
    object raises ConversionError naming the file and the line."""
    source = local_path(path)
    for number, raw in enumerate(_read(source).split(b"\n"), start=1):
        if not raw.strip():
            continue
        record = _parse(raw, source, number)
        if not isinstance(record, dict):
            raise ConversionError(source, number, f"expected a JSON object, got {type(record).__name__}")
        yield number, record


def records(source: Any) -> tuple[str, list[tuple[int, dict[str, Any]]]]:
    """A path to a JSON Lines file, or a dict or list of dicts, as (source name, numbered records).

    In-memory records are numbered from 1 like lines, so errors read the same either way.
    """
    if isinstance(source, (str, os.PathLike)):
        return local_path(source), list(json_lines(source))
    if isinstance(source, dict):
        source = [source]
    if not isinstance(source, (list, tuple)):
        raise ConversionError(IN_MEMORY, None, f"expected a path, a dict or a list of dicts, got {type(source).__name__}")
    numbered = []
    for number, record in enumerate(source, start=1):
        if not isinstance(record, dict):
            raise ConversionError(IN_MEMORY, number, f"expected a dict, got {type(record).__name__}")
        numbered.append((number, record))
    return IN_MEMORY, numbered
