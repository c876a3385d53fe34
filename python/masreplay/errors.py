"""The exception hierarchy of masreplay, rooted at :class:`MasreplayError`.

Each class also derives from the builtin a caller would catch without knowing masreplay
(``ValueError`` for bad data, ``OSError`` for files), so ``except ValueError`` keeps working.
"""

from __future__ import annotations

from typing import Any


class MasreplayError(Exception):
    """Base class of every error raised by masreplay."""


class TraceValidationError(MasreplayError, ValueError):
    """A trace breaks the data contract.

    Attributes:
        trace_id: the trace's id, or ``None`` when it could not be read.
        path: JSON pointer into the trace (``/events/3/type``); ``""`` for the whole input.
        reason: what is wrong, in words.
    """

    def __init__(self, trace_id: str | None, path: str, reason: str) -> None:
        self.trace_id = trace_id
        self.path = path
        self.reason = reason
        where = path or "/"
        super().__init__(f"trace {trace_id!r} at {where}: {reason}")

    def __reduce__(self):
        return (type(self), (self.trace_id, self.path, self.reason))


class ConversionError(MasreplayError, ValueError):
    """A foreign trace format (Claude Code, OpenTelemetry, MARBLE) could not be read.

    Attributes:
        source: the file (or ``"<object>"`` for in-memory input).
        line: 1-based line number in ``source``, or ``None`` when the error is not about one line.
        reason: what is wrong, in words.
    """

    def __init__(self, source: str, line: int | None, reason: str) -> None:
        self.source = source
        self.line = line
        self.reason = reason
        where = source if line is None else f"{source}:{line}"
        super().__init__(f"{where}: {reason}")

    def __reduce__(self):
        return (type(self), (self.source, self.line, self.reason))


class StorageError(MasreplayError, OSError):
    """A file could not be read or written."""


class DataFormatError(MasreplayError, ValueError):
    """Arrow or Parquet data that cannot be read as traces."""


class InvalidArgumentError(MasreplayError, ValueError):
    """An argument outside its domain; the message names the argument and the reason."""


class ArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument of the wrong type (a number where a name goes, a string where a list
    does): an :class:`InvalidArgumentError` that is also the ``TypeError`` Python raises for
    one, so ``except TypeError`` keeps working."""


class _NotFound(MasreplayError, KeyError):
    """Something asked for by name is not there: a ``KeyError`` too, as for a mapping, whose
    ``args`` hold the key asked for. A subclass keeps its constructor's arguments as
    attributes, passes them on (the key first) and says what is missing in ``__str__``
    (KeyError's own would quote the key)."""

    def __init__(self, key: Any, *context: Any) -> None:
        self._arguments = (key, *context)
        super().__init__(key)

    def __reduce__(self):
        return (type(self), self._arguments)


class TraceNotFoundError(_NotFound):
    """No trace of that id is stored (``GraphBuffer.get``, ``branches``, the graph queries);
    also a ``KeyError``, as for a mapping.

    Attributes:
        trace_id: the id asked for.
    """

    def __init__(self, trace_id: str) -> None:
        self.trace_id = trace_id
        super().__init__(trace_id)

    def __str__(self) -> str:
        return f"no trace {self.trace_id!r} in the buffer"


class ColumnNotFoundError(_NotFound):
    """No per-event column of that name (``TraceBatch.flat``, ``padded``, a sample's
    ``columns``); also a ``KeyError``, as for a mapping.

    Attributes:
        column: the name asked for.
    """

    def __init__(self, column: str, known: tuple[str, ...]) -> None:
        self.column = column
        self.known = known
        super().__init__(column, known)

    def __str__(self) -> str:
        return f"no per-event column {self.column!r}; events have {list(self.known)}"


class ChannelNotFoundError(_NotFound):
    """A reward channel named (in ``compose``'s weights) that is not given; also a
    ``KeyError``, as for a mapping.

    Attributes:
        channels: the names asked for and not found, sorted.
    """

    def __init__(self, channels: tuple[str, ...], known: tuple[str, ...]) -> None:
        self.channels = channels
        self.known = known
        super().__init__(channels, known)

    def __str__(self) -> str:
        return f"weights name channels that are not given: {list(self.channels)}; the channels are {list(self.known)}"


__all__ = [
    "ArgumentTypeError",
    "ChannelNotFoundError",
    "ColumnNotFoundError",
    "ConversionError",
    "DataFormatError",
    "InvalidArgumentError",
    "MasreplayError",
    "StorageError",
    "TraceNotFoundError",
    "TraceValidationError",
]
