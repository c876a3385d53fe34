"""The steps of :mod:`masreplay.offline`'s job that both engines run (the local one in
``offline.py``, Ray Data in ``_offline_ray.py``): the plan (pass 1), validation and
bucketing of a streamed batch, one bucket's credit, the parts, the spill files and the
manifest that commits them. The design is in ``offline.py``'s docstring."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from masreplay import _core
from masreplay.advantages import advantages as compute_advantages
from masreplay.batch import TraceBatch
from masreplay.counterfactual import counterfactual_credit
from masreplay.errors import DataFormatError, InvalidArgumentError, StorageError, TraceValidationError
from masreplay.orchestration import metrics as compute_metrics

MANIFEST = "_manifest.json"
SCRATCH = "_scratch"
FORMAT = "masreplay.credit_dump"
#: Version of the output layout (parts, manifest); bumped when either changes.
OUTPUT_VERSION = 1
#: File name of part k under traces/ and events/.
PART_NAME = "part-{:05d}.parquet"

T = TypeVar("T")


# ---- pass 1: the plan ----------------------------------------------------------------------


def _key_columns(schema: pa.Schema) -> list[str]:
    """The columns pass 1 reads: the ids, and the event count as an integer ``n_events``
    (derived, so a column of another type is ignored, as the loader recomputes it) or
    else the length of the ``events`` list."""
    names = set(schema.names)
    if "trace_id" not in names:
        raise DataFormatError("the dump has no trace_id column")
    wanted = [c for c in ("trace_id", "group_id", "task_id", "counterfactual_of") if c in names]
    if "n_events" in names and pa.types.is_integer(schema.field("n_events").type):
        return [*wanted, "n_events"]
    if "events" not in names or not _is_list(schema.field("events").type):
        found = schema.field("events").type if "events" in names else "none"
        raise DataFormatError(f"the dump has no events column of lists of events (found: {found})")
    return [*wanted, "events"]


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)


def trace_keys(table: pa.Table) -> pa.Table:
    """The plan's inputs of each row: trace_id, group_id (else task_id, as the loader
    fills it), task_id, factual (counterfactual_of.trace_id) and events (the trace's event
    count)."""
    n = table.num_rows

    def text(name: str) -> pa.Array:
        if name not in table.column_names:
            return pa.nulls(n, pa.large_string())
        column = table[name]
        try:
            return pc.cast(column, pa.large_string()).combine_chunks()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise DataFormatError(f"column {name!r} of type {column.type} is not text") from None

    task = text("task_id")
    factual = pa.nulls(n, pa.large_string())
    if "counterfactual_of" in table.column_names and pa.types.is_struct(table["counterfactual_of"].type):
        of = table["counterfactual_of"].combine_chunks()
        if of.type.get_field_index("trace_id") >= 0:
            factual = pc.cast(pc.struct_field(of, "trace_id"), pa.large_string())
    if "n_events" in table.column_names:
        # Clipped at 0: a negative count (the loader refuses the trace later) must not
        # move the buckets of the traces after it.
        events = pc.max_element_wise(pc.fill_null(pc.cast(table["n_events"], pa.int64()), 0), 0)
    else:
        events = pc.fill_null(pc.cast(pc.list_value_length(table["events"]), pa.int64()), 0)
    return pa.table(
        {
            "trace_id": text("trace_id"),
            "group_id": pc.coalesce(text("group_id"), task),
            "task_id": task,
            "factual": factual,
            "events": events,
        }
    )


@dataclass
class Plan:
    """Every trace's bucket (``-1``: no trace id, rejected before the stream), in dump order."""

    trace_ids: pa.Array
    bucket: np.ndarray
    expected: np.ndarray  # traces per bucket
    null_ids: np.ndarray  # positions of rows without a trace id

    @property
    def n_buckets(self) -> int:
        return len(self.expected)


@dataclass
class Piece:
    """Part of a bucket waiting for the rest: a canonical table with ``_position``, and
    whether it went through a spill file since this job validated it."""

    table: pa.Table
    spilled: bool = False


def _find(parent: np.ndarray, i: int) -> int:
    root = i
    while parent[root] != root:
        root = parent[root]
    while parent[i] != root:
        parent[i], i = root, parent[i]
    return root


def make_plan(keys: pa.Table, options: Mapping[str, Any], bucket_events: int) -> Plan:
    """Components (groups when advantages are asked for, branch families when
    counterfactual credit is) packed into buckets of about ``bucket_events`` events."""
    n = keys.num_rows
    ids = keys["trace_id"].combine_chunks()
    null_ids = np.flatnonzero(ids.is_null().to_numpy(zero_copy_only=False))
    # pc.unique hashes faster than pc.count_distinct (null, if any, is one value of it).
    if n and len(pc.unique(ids)) - (len(null_ids) > 0) != n - len(null_ids):
        counts = pc.value_counts(ids.drop_null())
        repeated = counts.filter(pc.greater(counts.field("counts"), 1))[0]["values"].as_py()
        raise DataFormatError(f"trace id {repeated!r} appears more than once in the dump; an offline job needs unique ids")
    component = np.arange(n, dtype=np.int64)
    if options["advantages"] is not None:
        # Rows without a group are their own component.
        group = keys[options["group_by"]].combine_chunks()
        codes = pc.dictionary_encode(group).indices.to_numpy(zero_copy_only=False)
        grouped = ~group.is_null().to_numpy(zero_copy_only=False)
        component = np.where(grouped, codes, len(group) + np.arange(n)).astype(np.int64)
    if options["counterfactual"] is not None:
        parent = np.arange(component.max(initial=-1) + 1, dtype=np.int64)
        position = {trace_id: i for i, trace_id in enumerate(ids.to_pylist()) if trace_id is not None}
        for branch, factual in enumerate(keys["factual"].to_pylist()):
            target = position.get(factual) if factual is not None else None
            if target is not None:
                a, b = _find(parent, int(component[branch])), _find(parent, int(component[target]))
                parent[max(a, b)] = min(a, b)
        roots = np.array([_find(parent, i) for i in range(len(parent))], dtype=np.int64)
        component = roots[component] if n else component
    # Components in order of first appearance; a component goes to the bucket where its
    # first event falls (buckets of bucket_events events, one component at most over).
    _, first, inverse = np.unique(component, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    row_rank = rank[inverse] if n else inverse
    valid = np.ones(n, dtype=bool)
    valid[null_ids] = False
    events = keys["events"].to_numpy(zero_copy_only=False)
    component_events = np.bincount(row_rank[valid], weights=events[valid], minlength=len(order)).astype(np.int64)
    starts = np.cumsum(component_events) - component_events
    component_bucket = np.unique(starts // max(bucket_events, 1), return_inverse=True)[1]
    row_bucket = component_bucket[row_rank] if n else row_rank
    row_bucket[~valid] = -1
    # A dump of no trace still gets one bucket: its part of no rows gives readers the columns.
    n_buckets = max(int(row_bucket.max(initial=-1)) + 1, 1)
    return Plan(
        trace_ids=ids,
        bucket=row_bucket,
        expected=np.bincount(row_bucket[valid], minlength=n_buckets),
        null_ids=null_ids,
    )


def read_batches(files: Sequence[str], columns: list[str] | None) -> Iterator[tuple[str, pa.Table]]:
    """The dump in order, one Parquet row group at a time with the file it comes from
    (``columns=["keys"]``: the plan's key columns only). A row group is the unit of reading:
    pyarrow cannot cut the canonical layout's nested dictionary columns into smaller batches."""
    for path in files:
        # Closed as soon as it is read: a failure in a later file keeps this frame alive.
        with _reading(path), pq.ParquetFile(path) as reader:
            wanted = _key_columns(reader.schema_arrow) if columns == ["keys"] else columns
            for index in range(reader.metadata.num_row_groups):
                yield path, reader.read_row_group(index, columns=wanted)


def row_groups(files: Sequence[str]) -> list[tuple[str, int, int]]:
    """Every row group of the dump as (file, index in the file, dump position of its first
    row), from the files' footers: the units of work of :func:`read_row_group`."""
    units, start = [], 0
    for path in files:
        with _reading(path):
            metadata = pq.ParquetFile(path).metadata
        for index in range(metadata.num_row_groups):
            units.append((path, index, start))
            start += metadata.row_group(index).num_rows
    return units


def read_row_group(path: str, index: int) -> pa.Table:
    """One row group of the dump, as :func:`read_batches` reads it."""
    with _reading(path):
        return pq.ParquetFile(path).read_row_group(index)


@contextlib.contextmanager
def _reading(path: str) -> Iterator[None]:
    """Errors of reading ``path`` as masreplay's, naming it."""
    try:
        yield
    except (OSError, pa.ArrowException) as error:
        # The failed read's frames hold the file it opened for as long as the caller keeps
        # this error (a list of failures, a logger): their locals are let go now.
        traceback.clear_frames(error.__traceback__)
        # On one line: some of Arrow's messages end in a newline (a thrift decoding error).
        raise StorageError(5, f"not a readable Parquet file ({' '.join(str(error).split())})", path) from error
    except DataFormatError as error:
        raise DataFormatError(f"{path}: {error}") from None


def read_ahead(batches: Iterator[T]) -> Iterator[T]:
    """``batches`` with the next one read on a thread while the caller works on this one:
    pyarrow decodes Parquet without the GIL, so reading overlaps validation, the credit
    functions and the writing of parts (one more row group in memory). Errors surface in
    order, where the read would have raised them."""
    with ThreadPoolExecutor(1, thread_name_prefix="masreplay-read") as pool:
        upcoming = pool.submit(next, batches, None)
        while (batch := upcoming.result()) is not None:
            upcoming = pool.submit(next, batches, None)
            yield batch


def plan_keys(files: Sequence[str]) -> pa.Table:
    """Pass 1 on one machine: the key table of the whole dump."""
    parts = [trace_keys(batch) for _, batch in read_ahead(read_batches(files, ["keys"]))]
    return pa.concat_tables(parts) if parts else trace_keys(pa.table({"trace_id": pa.array([], pa.string())}))


# ---- validation of a streamed batch --------------------------------------------------------


def _rejection(position: int, error: TraceValidationError) -> dict[str, Any]:
    return {"position": position, "trace_id": error.trace_id, "pointer": error.path, "reason": error.reason}


def ingest(table: pa.Table, positions: np.ndarray, on_error: str, source: str) -> tuple[_core.TraceBatch, np.ndarray, list[dict]]:
    """Validates a streamed table read from the file ``source`` with masreplay's loader: the
    valid traces, their dump positions, and the rejected ones (raised at once with
    ``on_error="raise"``). An error of the whole table (a column missing or of another
    type) names the file: it names no trace."""
    try:
        core, rejected = _core.ingest_arrow(table)
    except TraceValidationError as error:
        if error.trace_id is not None:
            raise
        raise TraceValidationError(None, error.path, f"{error.reason} (in {source})") from None
    except DataFormatError as error:
        raise DataFormatError(f"{source}: {error}") from None
    if rejected and on_error == "raise":
        raise rejected[0][2]
    keep = np.ones(len(positions), dtype=bool)
    keep[[r[0] for r in rejected]] = False
    return core, positions[keep], [_rejection(int(positions[r[0]]), r[2]) for r in rejected]


def split_by_bucket(core: _core.TraceBatch, positions: np.ndarray, buckets: np.ndarray) -> Iterator[tuple[int, pa.Table]]:
    """The valid traces of a streamed table as (bucket, canonical table with ``_position``)."""
    table = pa.table(core).append_column("_position", pa.array(positions, pa.int64()))
    if len(buckets) and (buckets == buckets[0]).all():
        yield int(buckets[0]), table
        return
    ordered = buckets
    if (np.diff(buckets) < 0).any():  # else contiguous runs: slices, no copy
        order = np.argsort(buckets, kind="stable")
        table, ordered = table.take(pa.array(order)), buckets[order]
    bounds = np.flatnonzero(np.diff(ordered)) + 1
    for start, stop in zip(np.r_[0, bounds], np.r_[bounds, len(ordered)], strict=True):
        if stop > start:
            yield int(ordered[start]), table.slice(start, stop - start)


# ---- one bucket -------------------------------------------------------------------------------


def compute_bucket(core: _core.TraceBatch, options: Mapping[str, Any]) -> tuple[pa.Table, pa.Table]:
    """The traces and events tables of one whole bucket, by the in-memory functions."""
    batch = TraceBatch(core)
    ids = pa.array(batch._core.trace_field("trace_id"), pa.string())
    offsets = batch.event_offsets
    trace_index = np.repeat(np.arange(len(batch), dtype=np.int64), np.diff(offsets))
    traces: dict[str, Any] = {"trace_id": ids, "group_id": pa.array(batch._core.trace_field("group_id"), pa.string())}
    # Repeated text as dictionary arrays: no string copied per event, and the Parquet writer
    # stores their codes as they are (the parts are read back as plain strings).
    events: dict[str, Any] = {
        "trace_id": pa.DictionaryArray.from_arrays(pa.array(trace_index, pa.int32()), ids),
        "event_id": pa.array(batch._event_array("id"), pa.string()),
        "agent": _in_first_seen_order(batch._event_array("agent")),
    }
    if options["advantages"] is not None:
        result = compute_advantages(batch, group_by=options["group_by"], **options["advantages"])
        traces["advantage"] = result.per_trace
        events["advantage"] = result.per_event
        events["weight"] = result.weights
    if options["counterfactual"] is not None:
        credit = counterfactual_credit(batch, **options["counterfactual"])
        for name in ("credit", "stderr", "n_branches"):
            events[name] = credit[name]
    traces_table = pa.table(traces)
    if options["metrics"]:
        table = compute_metrics(batch)
        for name in table.column_names[1:]:
            traces_table = traces_table.append_column(name, table[name])
    return traces_table, pa.table(events)


def _in_first_seen_order(array: pa.DictionaryArray) -> pa.DictionaryArray:
    """``array`` with a dictionary of the values used, each once, in order of first use: the
    same values then give the same part, byte for byte, however the bucket's pieces were cut
    (joined pieces bring their dictionaries along, repeats included). Hashes the codes, not
    the strings."""
    values = pc.dictionary_encode(array.dictionary)  # a few entries: the repeats merged
    seen = pc.dictionary_encode(pc.take(values.indices, array.indices))  # first-seen order
    return pa.DictionaryArray.from_arrays(seen.indices, values.dictionary.take(seen.dictionary))


def _atomic_write(path: pathlib.Path, write: Callable[[str], None]) -> None:
    """``write`` to a temporary file, then renamed to ``path``; a failure (a full disk, no
    permission) is a StorageError naming ``path`` and leaves no temporary file."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(os.fspath(temporary))
        os.replace(temporary, path)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise StorageError(error.errno, f"cannot write the output ({error.strerror or error})", os.fspath(path)) from error


def write_part(destination: pathlib.Path, part: int, traces: pa.Table, events: pa.Table) -> None:
    """One part of each table, under temporary names then renamed (not yet committed)."""
    for folder, table in (("traces", traces), ("events", events)):
        target = destination / folder / PART_NAME.format(part)
        # Dictionary pages only for the text columns (ids and agents repeat; credit values
        # almost never do, and trying a dictionary on them costs a hash per value). Without the
        # Arrow schema, readers see every text column as plain strings.
        text = [field.name for field in table.schema if _is_text(field.type)]
        _atomic_write(
            target,
            lambda tmp, table=table, text=text: pq.write_table(
                table, tmp, compression="zstd", use_dictionary=text, store_schema=False
            ),
        )


def _is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or (pa.types.is_dictionary(kind) and pa.types.is_string(kind.value_type))


# ---- the manifest ----------------------------------------------------------------------------


class Manifest:
    """``_manifest.json``: inputs, options, plan, committed parts; rewritten atomically."""

    def __init__(self, destination: pathlib.Path, state: dict[str, Any]) -> None:
        self.path = destination / MANIFEST
        self.state = state
        #: A manifest of a run starting over: nothing is on disk until :meth:`begin`.
        self.fresh = False

    @classmethod
    def read(cls, destination: pathlib.Path) -> Manifest | None:
        """The manifest in ``destination`` (None: there is none), checked field by field: a
        manifest another program wrote or edited is refused by name, not met deep inside."""
        state = _read_state(destination / MANIFEST)
        if state is None:
            return None
        if state.get("output_version") != OUTPUT_VERSION:
            raise DataFormatError(f"{destination / MANIFEST} was written by another version of masreplay's offline job")
        _check_state(destination / MANIFEST, state)
        return cls(destination, state)

    def begin(self) -> None:
        """Puts the manifest on disk (a run starting over first clears what an earlier run
        left) and the folders of parts. The engines call it once the inputs' keys are read,
        so that an input that cannot be read leaves the destination as it was."""
        destination = self.path.parent
        try:
            if self.fresh:
                for name in ("traces", "events", SCRATCH, MANIFEST):
                    path = destination / name
                    if path.is_dir():
                        shutil.rmtree(path)
                    elif path.exists():
                        path.unlink()
                self.save()  # first, so that nothing of ours is ever in a destination without one
                self.fresh = False
            for name in ("traces", "events"):
                (destination / name).mkdir(exist_ok=True)
        except OSError as error:  # a file where a folder of parts goes, or no permission
            raise StorageError(error.errno, f"cannot prepare the output ({error.strerror})", error.filename) from None

    def save(self) -> None:
        text = json.dumps(self.state, indent=1, sort_keys=True)
        _atomic_write(self.path, lambda tmp: pathlib.Path(tmp).write_text(text))

    @property
    def done(self) -> dict[int, dict[str, Any]]:
        return {entry["part"]: entry for entry in self.state["parts"]}

    def commit(self, part: int, traces: int, events: int, rejected: list[dict]) -> None:
        self.state["parts"].append({"part": part, "traces": traces, "events": events, "rejected": rejected})
        self.state["parts"].sort(key=lambda entry: entry["part"])
        self.save()


def _read_state(path: pathlib.Path) -> dict[str, Any] | None:
    """The JSON of a manifest of ours (None: no file there)."""
    if not path.exists():
        return None
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise DataFormatError(f"{path}: not a readable credit_dump manifest ({error})") from error
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise DataFormatError(f"{path}: not a masreplay credit_dump manifest")
    return state


#: The manifest's fields this job reads, and their JSON types (``int``: a whole number >= 0).
_STATE_FIELDS = {"complete": bool, "inputs": list, "options": dict, "bucket_events": int, "parts": list}
_PART_FIELDS = {"part": int, "traces": int, "events": int, "rejected": list}
_FINISHED_FIELDS = {"traces": int, "events": int, "rejected": list}
_REJECTION_FIELDS = {"position": int, "pointer": str, "reason": str}


def _check_state(path: pathlib.Path, state: dict[str, Any]) -> None:
    """Refuses a manifest with a field this job would misread, naming it by JSON pointer."""

    def check(value: Any, fields: Mapping[str, type], pointer: str) -> None:
        if not isinstance(value, dict):
            raise DataFormatError(f"{path}: {pointer or '/'} must be an object, got {json.dumps(value)[:80]}")
        for name, kind in fields.items():
            item = value.get(name)
            whole = kind is int and type(item) is int and item >= 0
            if not (whole or (kind is not int and isinstance(item, kind))):
                wanted = "a whole number >= 0" if kind is int else f"a JSON {kind.__name__}"
                raise DataFormatError(f"{path}: {pointer}/{name} must be {wanted}, got {json.dumps(item)[:80]}")

    def check_rejections(rejected: list, pointer: str) -> None:
        for k, entry in enumerate(rejected):
            check(entry, _REJECTION_FIELDS, f"{pointer}/{k}")

    check(state, _STATE_FIELDS, "")
    for k, entry in enumerate(state["parts"]):
        check(entry, _PART_FIELDS, f"/parts/{k}")
        check_rejections(entry["rejected"], f"/parts/{k}/rejected")
    numbers = [entry["part"] for entry in state["parts"]]
    if numbers != sorted(set(numbers)):
        raise DataFormatError(f"{path}: /parts must list each part once, in order, got parts {numbers[:10]}")
    if state["complete"]:
        check(state, _FINISHED_FIELDS, "")
        check_rejections(state["rejected"], "/rejected")


def _open(destination: pathlib.Path, inputs: list[dict], options: dict, bucket_events: int, resume: bool) -> Manifest:
    """The manifest to continue from (checked against inputs and options), or a fresh one
    (not yet on disk: see :meth:`Manifest.begin`)."""
    existing = Manifest.read(destination) if destination.exists() and resume else None
    if existing is not None:
        state = existing.state
        if state["inputs"] != inputs:
            raise InvalidArgumentError(
                f"the inputs changed since {existing.path} was written (files, sizes or modification times); "
                "pass resume=False (CLI: --no-resume) to start over"
            )
        if state["options"] != options:
            raise InvalidArgumentError(
                f"{existing.path} was written with other options ({state['options']}, now {options}); "
                "pass resume=False (CLI: --no-resume) to start over"
            )
        for leftover in [*destination.glob(".*.tmp"), *destination.glob("*/.*.tmp")]:
            leftover.unlink()  # written by a run stopped before its rename
        return existing
    ours = destination.exists() and _read_state(destination / MANIFEST) is not None
    if not ours and destination.exists() and any(destination.iterdir()):
        raise StorageError(17, "destination is not empty and holds no credit_dump manifest", os.fspath(destination))
    manifest = Manifest(
        destination,
        {
            "format": FORMAT,
            "output_version": OUTPUT_VERSION,
            "schema_version": _core.SCHEMA_VERSION,
            "complete": False,
            "inputs": inputs,
            "options": options,
            "bucket_events": bucket_events,
            "parts": [],
        },
    )
    manifest.fresh = True
    return manifest


# ---- spill files ----------------------------------------------------------------------------


def _ipc_write(path: pathlib.Path, table: pa.Table) -> None:
    # The stream format: the spilled pieces keep their own dictionaries (agents differ between
    # row groups), which the file format refuses ("dictionary replacement").
    with pa.OSFile(os.fspath(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)


def _ipc_read(path: pathlib.Path) -> pa.Table:
    try:
        with pa.memory_map(os.fspath(path)) as source:
            return pa.ipc.open_stream(source).read_all()
    except (OSError, pa.ArrowException) as error:  # the scratch folder is a file system anyone can write
        raise StorageError(5, f"a spill file cannot be read ({' '.join(str(error).split())})", os.fspath(path)) from error


def load_bucket(pieces: Sequence[Piece]) -> _core.TraceBatch:
    """One bucket's pieces (canonical tables with a ``_position`` column, the trace's row in
    the dump) as one batch in dump order. Pieces this job validated in memory are taken by
    their layout alone; spilled ones, read back from the file system (not memory masreplay
    owns), are checked in full like any Arrow input first."""
    if not pieces:
        return _core.empty_batch()
    tables = [
        pa.table(_core.TraceBatch.restore(piece.table.drop_columns(["_position"])))
        if piece.spilled
        else piece.table.drop_columns(["_position"])
        for piece in pieces
    ]
    # One batch of the pieces as one chunked table: cheaper than a batch per piece, then concat.
    core = _core.TraceBatch.restore_validated(pa.concat_tables(tables))
    positions = np.concatenate([piece.table["_position"].to_numpy() for piece in pieces])
    if (np.diff(positions) < 0).any():  # pieces from several workers
        core = core.take(np.argsort(positions, kind="stable").tolist())
    return core


# ---- the end of a run --------------------------------------------------------------------------


def _record_null_ids(plan: Plan, manifest: Manifest, options: Mapping[str, Any]) -> None:
    """Rows without a trace id are rejected before the stream (they belong to no bucket)."""
    rejected = [
        {"position": int(p), "trace_id": None, "pointer": "/trace_id", "reason": "the trace has no trace_id"}
        for p in plan.null_ids
    ]
    if rejected and options["on_error"] == "raise":
        raise TraceValidationError(None, "/trace_id", f"the trace at row {int(plan.null_ids[0])} of the dump has no trace_id")
    manifest.state["unplaced_rejected"] = rejected


def _finish(manifest: Manifest, n_buckets: int) -> None:
    """Marks the output complete once every bucket is committed: the last commit point."""
    missing = sorted(set(range(n_buckets)) - set(manifest.done))
    if missing:
        raise StorageError(5, f"parts {missing[:5]} were never committed", os.fspath(manifest.path))
    parts = manifest.state["parts"]
    rejected = manifest.state.pop("unplaced_rejected", []) + [r for entry in parts for r in entry["rejected"]]
    manifest.state["rejected"] = sorted(rejected, key=lambda r: r["position"])
    manifest.state["traces"] = sum(entry["traces"] for entry in parts)
    manifest.state["events"] = sum(entry["events"] for entry in parts)
    manifest.state["complete"] = True
    manifest.save()
