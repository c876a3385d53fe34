"""TraceBatch: an immutable batch of validated traces in the canonical Arrow layout."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from masreplay import _core
from masreplay._args import checked, is_index, is_sequence, item_of_0d, wrong_type
from masreplay.conversion_report import ConversionReport
from masreplay.errors import ArgumentTypeError, ColumnNotFoundError, DataFormatError, InvalidArgumentError

if TYPE_CHECKING:
    import polars as pl

    from masreplay.errors import TraceValidationError

#: A trace the input held but validation rejected: (position in the input, trace_id, error).
Rejected = tuple[int, "str | None", "TraceValidationError"]


class TraceBatch:
    """Traces stored one per row, events and edges as Arrow list columns.

    Arrow leaves without copying: ``pa.table(batch)``, ``polars.DataFrame(batch)`` and
    ``to_arrow()`` all read the same buffers through ``__arrow_c_stream__``.
    """

    __slots__ = ("_collected", "_source", "conversion_report", "probabilities", "rejected")

    def __init__(
        self,
        core: _core.TraceBatch | _core.TraceSelection,
        rejected: Sequence[Rejected] = (),
        probabilities: np.ndarray | None = None,
    ) -> None:
        # A buffer's sample arrives as a TraceSelection: shape queries and single event
        # fields (flat, padded) copy only what they read; anything else collects it once.
        self._source = core
        self._collected = core if isinstance(core, _core.TraceBatch) else None
        #: Traces of the input that failed validation (filled when loading with on_error="skip").
        self.rejected: list[Rejected] = list(rejected)
        #: For a sampled batch, each trace's probability of being drawn (importance weights).
        self.probabilities = probabilities
        #: For a batch made by masreplay.convert, what the converter read, skipped or did not understand.
        self.conversion_report: ConversionReport | None = None

    @property
    def _core(self) -> _core.TraceBatch:
        """The canonical batch (a sampled selection is copied out on first use)."""
        if self._collected is None:
            self._collected = self._source.collect()
        return self._collected

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # What a batch knows besides its traces crosses process boundaries with it.
        extras = (self.rejected, self.probabilities, self.conversion_report)
        return (_from_ipc, (_to_ipc(self.to_arrow()), *extras))

    def _subset(self, core: _core.TraceBatch, positions: Sequence[int]) -> TraceBatch:
        """Traces at ``positions`` as a batch: each keeps its drawing probability, and the
        conversion report (about the source the traces came from) stays attached."""
        probabilities = None if self.probabilities is None else self.probabilities[list(positions)]
        subset = TraceBatch(core, probabilities=probabilities)
        subset.conversion_report = self.conversion_report
        return subset

    # ---- shape -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._source)

    @property
    def trace_ids(self) -> list[str]:
        return self._source.trace_ids

    @property
    def num_events(self) -> int:
        return self._source.num_events

    @property
    def event_offsets(self) -> np.ndarray:
        """int64 array of length n+1: trace i owns rows event_offsets[i]:event_offsets[i+1] of events()."""
        return self._source.event_offsets

    @property
    def edge_offsets(self) -> np.ndarray:
        return self._core.edge_offsets

    def __repr__(self) -> str:
        return f"TraceBatch({len(self)} traces, {self.num_events} events)"

    # ---- Arrow -------------------------------------------------------------------------
    def __arrow_c_stream__(self, requested_schema: object = None) -> object:
        return self._core.__arrow_c_stream__(requested_schema)

    def to_arrow(self) -> pa.Table:
        """The canonical table (one row per trace)."""
        return pa.table(self._core)

    def to_polars(self) -> pl.DataFrame:
        import polars as pl

        return pl.DataFrame(self._core)

    def events(self) -> pa.Table:
        """One row per event: ``trace_index``, ``trace_id``, then the event's fields."""
        return pa.table(self._core.events())

    def edges(self) -> pa.Table:
        """One row per edge: ``trace_index``, ``trace_id``, ``src``, ``dst`` (local event indices), ``type``."""
        return pa.table(self._core.edges())

    @checked
    def write_parquet(self, path: str | os.PathLike[str]) -> None:
        """Writes the canonical layout to one Parquet file (replaced atomically)."""
        self._core.write_parquet(os.fspath(path))

    # ---- traces as dicts ---------------------------------------------------------------
    def _index(self, i: Any) -> int:
        """A trace position (negative: from the end); a bool or a float is refused, as list
        indexing refuses it."""
        if not is_index(i):
            raise wrong_type("trace index", "an integer", i)
        i = int(i)
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"trace index {i} out of range for a batch of {n}")
        return i % n

    def __getitem__(self, key: int | slice | Sequence[int]) -> Any:
        """``batch[i]`` is trace i as a dict (masreplay's full form); a slice or a list of
        indices gives a TraceBatch."""
        key = item_of_0d(key)
        if isinstance(key, slice):
            positions = list(range(len(self)))[key]
        elif is_index(key):
            return json.loads(self._core.trace_json(self._index(key), False))
        elif is_sequence(key):
            positions = [self._index(i) for i in key]
        else:
            raise wrong_type("a trace key", "an integer, a slice or a sequence of integers", key)
        return self._subset(self._core.take(positions), positions)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self)):
            yield json.loads(self._core.trace_json(i, False))

    def to_seed_json(self, i: int) -> dict[str, Any]:
        """Trace i as a dict that the seed JSON Schema accepts (top-level additions dropped)."""
        return json.loads(self._core.trace_json(self._index(i), True))

    @checked
    def padded(self, column: str, pad_value: Any = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A per-event column as a (traces, max_len) array for trainers that need padding.

        Returns ``(values, mask, lengths)``: ``mask`` is True at real events, ``lengths`` the
        events per trace (int64). Numeric and boolean columns keep their type (nulls become
        ``pad_value``); dictionary columns (``type``, ``agent``, ``role``, ...) give their
        int codes. Nothing padded is ever stored: this is built from the flat column.
        """
        _check_event_field(column)
        if not (is_index(pad_value) or isinstance(pad_value, bool | float | np.floating | np.bool_)):
            raise wrong_type("pad_value", "a number or a flag", pad_value)
        try:
            if self._collected is None and _exact_in_double(pad_value):
                # A sample pads a 64-bit number field without nulls straight from the buffer
                # (a pad Arrow would refuse or a bool takes the path below, as a whole batch does).
                fast = self._source.padded(column, pad_value)
                if fast is not None:
                    return fast
            values = _numeric(self._event_array(column), column).fill_null(pad_value).to_numpy(zero_copy_only=False)
            offsets = self.event_offsets
            lengths = np.diff(offsets)
            max_len = int(lengths.max(initial=0))
            # Row-major order of the True cells of the mask is the flat order of the events.
            mask = np.arange(max_len) < lengths[:, None]
            out = np.full(mask.shape, pad_value, dtype=_padded_dtype(values.dtype, pad_value))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, np.exceptions.DTypePromotionError) as error:
            raise InvalidArgumentError(f"pad_value {pad_value!r} does not fit column {column!r}: {error}") from None
        out[mask] = values
        return out, mask, lengths

    @checked
    def flat(self, column: str) -> tuple[np.ndarray, np.ndarray]:
        """A per-event column as flat ``(values, offsets)`` numpy arrays, the layout trainers
        of variable-length data read: trace i owns ``values[offsets[i]:offsets[i+1]]``.

        Numeric and boolean columns keep their type (nulls become NaN, which needs a float
        column: use ``padded`` with a ``pad_value`` otherwise); dictionary columns give their
        int codes. Zero-copy where the column has no nulls.
        """
        _check_event_field(column)
        if self._collected is None:  # a sample: values and offsets gathered in one call
            gathered, offsets = self._source.flat(column)
            if isinstance(gathered, np.ndarray):
                return gathered, offsets
            array = pa.array(gathered)
        else:
            array, offsets = self._event_array(column), self.event_offsets
        array = _numeric(array, column)
        if array.null_count and not pa.types.is_floating(array.type):
            raise InvalidArgumentError(f"column {column!r} has nulls and is not a float column; use padded(column, pad_value)")
        values = array.fill_null(float("nan")) if array.null_count else array
        return values.to_numpy(zero_copy_only=False), offsets

    def _event_array(self, column: str) -> pa.Array:
        _check_event_field(column)
        return pa.array(self._source.event_field(column))

    @staticmethod
    def concat(batches: Sequence[TraceBatch]) -> TraceBatch:
        """The traces of ``batches`` in order; their conversion reports are combined."""
        if not is_sequence(batches):
            raise wrong_type("concat: batches", "a sequence of TraceBatches", batches)
        for i, batch in enumerate(batches):
            if not isinstance(batch, TraceBatch):
                raise wrong_type(f"concat: batches[{i}]", "a TraceBatch", batch)
        joined = TraceBatch(_core.TraceBatch.concat([b._core for b in batches]))
        reports = [b.conversion_report for b in batches if b.conversion_report is not None]
        if reports:
            joined.conversion_report = ConversionReport.combine(reports)
        return joined


#: The per-event fields of the canonical layout, in order. (Read off the stream's schema:
#: ``pa.table`` of any object imports pandas, a quarter of a second of every ``import masreplay``.)
EVENT_FIELDS: tuple[str, ...] = tuple(
    f.name for f in pa.RecordBatchReader.from_stream(_core.empty_batch()).schema.field("events").type.value_type
)


def _exact_in_double(pad_value: Any) -> bool:
    """A float, or an int a double holds exactly: the pads the buffer's own padding takes as
    Arrow would (Arrow refuses to put a wider int in a float column)."""
    return type(pad_value) is float or (type(pad_value) is int and -(2**53) <= pad_value <= 2**53)


def _padded_dtype(values: np.dtype, pad_value: Any) -> np.dtype:
    """The dtype of a column padded with ``pad_value``: the smallest that holds both, except
    that an integer column keeps its own dtype where that holds an integer pad and NumPy's
    rule would make it float64 (a pad from 2**32 on reads as uint64, and int64 with uint64
    promotes to float64, rounding the pad and the column's values past 2**53)."""
    dtype = np.result_type(values, np.min_scalar_type(pad_value))
    if dtype.kind == "f" and values.kind in "iu" and is_index(pad_value):
        limits = np.iinfo(values)
        if limits.min <= pad_value <= limits.max:
            return values
    return dtype


def _check_event_field(column: str) -> None:
    if column not in EVENT_FIELDS:
        raise ColumnNotFoundError(column, EVENT_FIELDS)


def _numeric(array: pa.Array, column: str) -> pa.Array:
    """Dictionary columns as their int codes; anything else must be numeric or boolean."""
    if pa.types.is_dictionary(array.type):
        array = array.indices
    if not (pa.types.is_integer(array.type) or pa.types.is_floating(array.type) or pa.types.is_boolean(array.type)):
        raise ArgumentTypeError(f"column {column!r} of type {array.type} cannot be made a numeric array")
    return array


def _to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _from_ipc_table(data: Any, options: pa.ipc.IpcReadOptions | None = None, what: str = "pickled state") -> pa.Table:
    """The table of an Arrow IPC stream written by masreplay (pickled state, or a part sent
    by another process: ``what`` names it in the error); bytes that are not a whole, valid
    Arrow stream raise DataFormatError (the core checks the traces themselves)."""
    try:
        table = pa.ipc.open_stream(data, options=options).read_all()
    except (pa.ArrowException, OSError, ValueError, TypeError) as error:
        raise DataFormatError(f"{what} is not a valid Arrow stream: {error}") from error
    return _checked_arrow(table)


def _checked_arrow(data: Any) -> Any:
    """pyarrow tables and record batches have their layout checked by pyarrow before the core
    sees them: only the producer knows how long its buffers really are, and the C data interface
    passes pointers, not sizes (an offset past the end would be read as memory). The core then
    checks every value (offsets, UTF-8, dictionary keys) in full."""
    if isinstance(data, pa.RecordBatchReader):
        try:
            data = data.read_all()  # the core reads a stream whole anyway
        except pa.ArrowException as error:  # a batch of another schema; the producer's own errors pass as raised
            raise DataFormatError(f"invalid Arrow stream: {error}") from error
    if isinstance(data, (pa.Table, pa.RecordBatch)):
        try:
            data.validate()
        except pa.ArrowException as error:
            raise DataFormatError(f"invalid Arrow data: {error}") from error
    return data


def _from_ipc(
    data: bytes,
    rejected: Sequence[Rejected] = (),
    probabilities: np.ndarray | None = None,
    conversion_report: ConversionReport | None = None,
) -> TraceBatch:
    """Unpickles a batch. The bytes are checked like any Arrow input (structure, then every
    trace): crafted or corrupted state raises a masreplay error, never a crash."""
    core = _core.TraceBatch.restore(_from_ipc_table(data))
    batch = TraceBatch(core, rejected, probabilities)
    batch.conversion_report = conversion_report
    return batch
