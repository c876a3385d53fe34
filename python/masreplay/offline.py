"""Offline credit over Parquet trace dumps of any size, in bounded memory.

:func:`credit_dump` computes, for every trace of a dump, what :func:`masreplay.advantages`,
:func:`masreplay.counterfactual_credit` and :func:`masreplay.metrics` give on the whole dump
loaded in memory, and writes it as Parquet parts; :func:`read_credit` reads the result back.

The design: the numbers of a trace depend only on its *component*, the traces joined by a
shared GRPO group (advantages) or a branch family (counterfactual credit: a branch and its
factual trace). So the job never needs the dump in memory, only whole components:

1. **Plan** (pass 1, key columns only: ``trace_id``, ``group_id``/``task_id``,
   ``counterfactual_of``, ``n_events``): components by union-find over groups and families,
   cut in order of first appearance into *buckets* of ``memory_limit / 2 KB`` events (plus
   at most one component). Memory: a few dozen bytes per trace, never per event.
2. **Stream** (pass 2): the dump is read batch by batch (Parquet row groups cut to the
   memory limit), validated by masreplay's loader, and each trace goes to its bucket's
   buffer; buffers past a third of ``memory_limit`` are spilled to Arrow IPC files under
   ``DEST/_scratch``. A bucket whose traces have all been seen is loaded whole (its traces in
   dump order), handed to the in-memory functions, and written as one part. On a dump written
   group by group nothing is spilled; a shuffled dump costs one extra write and read. A trace
   is validated once: pieces held in memory are joined by their layout alone, spilled ones are
   checked again when read back (the scratch folder is a file system, not masreplay's memory).
   While the stream runs, pyarrow allocates from the system allocator (see
   ``_reusing_allocator``).

Because the in-memory functions run on whole components in dump order, the numbers are the
in-memory numbers (bit for bit, compat modes included). Options whose statistics span the
whole dump (``std="batch"``, ``estimator="reinforce_pp_baseline"``, TRL's
``normalize_then_sum``, ``group_by=None``) are refused: they cannot be bounded.

Working memory is about ``memory_limit``: the read batch, the buffers (a third), and one
bucket in flight with its results. Beside it the plan keeps every trace's id and bucket
(about 170 bytes a trace: 1.25 GB peak at 10^8 events in 3.7 million traces with a 1 GB
limit), and a single component (one GRPO group with its branches) larger than a bucket is
processed alone and may exceed the limit.

Crash safety: parts are written under temporary names and renamed; ``_manifest.json``
(rewritten atomically after each part) is the commit point, so a killed run started again
with ``resume=True`` redoes only the uncommitted buckets and gives the same output. The
manifest records the inputs (sizes and modification times) and the options: a resume
against other inputs or options is refused, and so is a manifest with a field this job
would misread. Nothing in the destination changes before pass 1 has read every input, so a
run starting over (``resume=False``) on a file that cannot be read keeps the earlier output.
``engine="ray"`` runs the same plan on Ray Data (:mod:`masreplay._offline_ray`): it gives the
same parts, and raises the same errors.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pathlib
import re
import resource
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from masreplay import _core
from masreplay._args import I64_MAX, checked, optional_whole
from masreplay._offline_ray import run_ray
from masreplay._offline_steps import (
    PART_NAME,
    SCRATCH,
    Manifest,
    Piece,
    Plan,
    _finish,
    _ipc_read,
    _ipc_write,
    _open,
    _record_null_ids,
    compute_bucket,
    ingest,
    load_bucket,
    make_plan,
    plan_keys,
    read_ahead,
    read_batches,
    split_by_bucket,
    write_part,
)
from masreplay.errors import DataFormatError, InvalidArgumentError, StorageError

#: Bytes of working memory one event of a bucket in flight takes (canonical batch, results,
#: output tables, with headroom); sets the events per bucket from ``memory_limit``.
BYTES_PER_EVENT = 2048

Engine = Literal["local", "ray"]

_ADVANTAGE_OPTIONS = {
    "estimator", "channel", "normalize_by", "std", "eps", "dtype", "compat", "channels",
    "channel_mode", "unit", "weight_by", "missing",
}  # fmt: skip
_COUNTERFACTUAL_OPTIONS = {"channel", "baseline"}


# ---- summary ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DumpSummary:
    """What :func:`credit_dump` did. ``rejected`` lists the traces validation refused (with
    ``on_error="skip"``) as dicts ``trace_id``, ``pointer`` (JSON pointer), ``reason``;
    ``peak_memory`` is the process's peak resident memory in bytes."""

    destination: str
    traces: int
    events: int
    parts: int
    resumed_parts: int
    seconds: float
    peak_memory: int
    engine: str
    rejected: list[dict[str, Any]] = field(default_factory=list)

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else float("nan")

    def rows(self) -> list[tuple[str, str]]:
        return [
            ("traces", str(self.traces)),
            ("events", str(self.events)),
            ("rejected", str(len(self.rejected))),
            ("parts", f"{self.parts} ({self.resumed_parts} from an earlier run)"),
            ("seconds", f"{self.seconds:.2f}"),
            ("events/s", f"{self.events_per_s:,.0f}"),
            ("peak memory", f"{self.peak_memory / 2**20:,.0f} MiB"),
        ]

    def __str__(self) -> str:
        return "\n".join(f"{name}: {value}" for name, value in self.rows())


# ---- arguments ---------------------------------------------------------------------------

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_memory(limit: int | str) -> int:
    """``"1GB"``, ``"512MiB"``, ``"2e9"`` or a number of bytes, as bytes: from 1 MiB to
    2^63 - 1 (pyarrow's sizes are signed 64-bit)."""
    if isinstance(limit, int) and not isinstance(limit, bool):
        value: float = limit
    else:
        match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([A-Za-z]*)\s*", str(limit))
        unit = match and match.group(2).upper()
        if not match or unit not in _UNITS:
            raise InvalidArgumentError(f"memory_limit must be bytes or a size like '1GB' or '512MiB', got {limit!r}")
        try:
            value = float(match.group(1)) * _UNITS[unit]
        except ValueError:
            raise InvalidArgumentError(f"memory_limit must be bytes or a size like '1GB', got {limit!r}") from None
    # "1e400" reads as an infinity, which int() cannot take.
    if not 2**20 <= value <= I64_MAX:
        raise InvalidArgumentError(f"memory_limit must be from 1 MiB to 2**63 - 1 bytes, got {limit!r}")
    return int(value)


def source_files(source: str | os.PathLike | Sequence[str | os.PathLike], output: str | os.PathLike | None = None) -> list[str]:
    """The Parquet files of ``source`` (a file, a directory searched recursively, a glob or a
    list of those), in the order load_traces reads them, less the parts of a job writing to
    ``output`` (when it writes inside the folder it reads, a second run must not read them)."""
    files = _listed(source)
    if output is not None:
        ours = {pathlib.Path(output).resolve() / name for name in ("traces", "events", SCRATCH)}
        files = [f for f in files if ours.isdisjoint(pathlib.Path(f).parents)]
        if not files:
            raise StorageError(2, "no Parquet files found besides the output's own parts", os.fspath(output))
    return files


def _listed(source: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    if isinstance(source, (list, tuple)):
        return [f for entry in source for f in source_files(entry)]
    if not isinstance(source, (str, os.PathLike)):
        raise InvalidArgumentError(f"source must be a Parquet file, a directory or a glob, got {type(source).__name__}")
    path = pathlib.Path(source)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in (".parquet", ".pq") and p.is_file())
    elif path.is_file():
        files = [path]
    else:
        files = sorted(pathlib.Path(p) for p in glob.glob(os.fspath(source), recursive=True) if os.path.isfile(p))
    if not files:
        raise StorageError(2, "no Parquet files found", os.fspath(source))
    return [os.fspath(p.resolve()) for p in files]


def _options(advantages: Mapping[str, Any] | None, counterfactual: bool | Mapping[str, Any], metrics: bool,
             group_by: str | None, on_error: str) -> dict[str, Any]:  # fmt: skip
    """The options as JSON values (what the manifest records and a resume must match)."""
    if on_error not in ("raise", "skip"):
        raise InvalidArgumentError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    if group_by not in ("group_id", "task_id"):
        raise InvalidArgumentError(
            f"group_by must be 'group_id' or 'task_id' (a dump-wide group cannot be bounded in memory), got {group_by!r}"
        )
    adv = None
    if advantages is not None:
        if not isinstance(advantages, Mapping):
            raise InvalidArgumentError(f"advantages must be a dict of masreplay.advantages arguments or None, got {advantages!r}")
        unknown = set(advantages) - _ADVANTAGE_OPTIONS
        if unknown:
            raise InvalidArgumentError(
                f"advantages takes {sorted(_ADVANTAGE_OPTIONS)}, not {sorted(unknown)} (group_by is credit_dump's own argument)"
            )
        adv = {"dtype": "float64", **{k: _jsonable(v) for k, v in advantages.items()}}
        channels = adv.get("channels") or adv.get("channel", "team")
        several = isinstance(channels, Mapping) and len(channels) > 1
        dump_wide = (
            adv.get("std") == "batch"
            or adv.get("estimator") == "reinforce_pp_baseline"
            or (adv.get("compat") == "trl" and several and adv.get("channel_mode") == "normalize_then_sum")
        )
        if dump_wide:
            raise InvalidArgumentError(
                "these advantage options take statistics over the whole dump (std='batch', reinforce_pp_baseline, "
                "TRL's normalize_then_sum), which a bounded-memory job does not hold; use masreplay.advantages on a batch"
            )
    cf = None
    named = set(counterfactual) if isinstance(counterfactual, Mapping) else set()
    if not isinstance(counterfactual, (bool, Mapping)) or named - _COUNTERFACTUAL_OPTIONS:
        raise InvalidArgumentError(
            f"counterfactual must be True, False or a dict of {sorted(_COUNTERFACTUAL_OPTIONS)}, got {counterfactual!r}"
        )
    if counterfactual:
        cf = {} if counterfactual is True else _jsonable(counterfactual)
    if adv is None and cf is None and not metrics:
        raise InvalidArgumentError("nothing to compute: ask for advantages, counterfactual=True or metrics=True")
    return {"advantages": adv, "counterfactual": cf, "metrics": bool(metrics), "group_by": group_by, "on_error": on_error}


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (np.dtype, type)):
        return np.dtype(value).name
    raise InvalidArgumentError(f"an option value must be a string, number, list or dict, got {value!r}")


def _inputs(files: Sequence[str]) -> list[dict[str, Any]]:
    described = []
    for path in files:
        stat = os.stat(path)
        described.append({"path": path, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns})
    return described


# ---- spill buffers (local engine) -------------------------------------------------------------


class _Buffers:
    """Traces waiting for the rest of their bucket: in memory up to ``limit`` bytes, then
    spilled to Arrow IPC files in ``scratch``."""

    def __init__(self, scratch: pathlib.Path, limit: int) -> None:
        self.scratch = scratch
        self.limit = limit
        self.memory: dict[int, list[pa.Table]] = {}
        self.spilled: dict[int, list[pathlib.Path]] = {}
        self.nbytes = 0
        self.spills = 0

    def add(self, bucket: int, table: pa.Table) -> None:
        self.memory.setdefault(bucket, []).append(table)
        self.nbytes += table.nbytes
        if self.nbytes > self.limit:
            self.spill()

    def spill(self) -> None:
        self.scratch.mkdir(exist_ok=True)
        for bucket, tables in self.memory.items():
            path = self.scratch / f"bucket-{bucket:05d}-{self.spills:06d}.arrow"
            _ipc_write(path, pa.concat_tables(tables, promote_options="permissive"))
            self.spilled.setdefault(bucket, []).append(path)
        self.spills += 1
        self.memory.clear()
        self.nbytes = 0

    def take(self, bucket: int) -> list[Piece]:
        paths = self.spilled.pop(bucket, [])
        in_memory = self.memory.pop(bucket, [])
        self.nbytes -= sum(table.nbytes for table in in_memory)
        pieces = [Piece(_ipc_read(path), spilled=True) for path in paths] + [Piece(table) for table in in_memory]
        for path in paths:
            path.unlink()
        return pieces


# ---- the job ------------------------------------------------------------------------------------


def _progress(enabled: bool, total: int) -> Any:
    """A tqdm bar on stderr when asked and stderr is a terminal, else a silent stand-in."""
    if enabled and sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(total=total, unit=" traces", file=sys.stderr, dynamic_ncols=True)
    return contextlib.nullcontext(_Silent())


class _Silent:
    def update(self, n: int) -> None:
        pass

    def set_postfix_str(self, text: str) -> None:
        pass


def peak_memory() -> int:
    """This process's peak resident memory in bytes: VmHWM where /proc has it (ru_maxrss
    would count the memory of the parent this process was forked from), else ru_maxrss."""
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    # ru_maxrss is in KiB on Linux, in bytes on macOS.
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


@contextlib.contextmanager
def _reusing_allocator() -> Iterator[None]:
    """pyarrow's default pool set to the system allocator while the stream runs, then put
    back. The stream frees and allocates tens of MB per row group (decoded columns, parts
    being encoded); pyarrow's mimalloc hands freed pages back to the OS within milliseconds,
    so the kernel zeroes them again for the next row group (a sixth of the job's CPU time),
    where glibc keeps them for reuse. Buffers are freed by the pool that made them, so
    switching is safe for arrays made before or after."""
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(previous)


def _stream_local(files: Sequence[str], plan: Plan, manifest: Manifest, options: Mapping[str, Any],
                  limit: int, bar: Any, on_part: Callable[[int, int], None]) -> None:  # fmt: skip
    """Pass 2 on one machine: stream, buffer by bucket, compute and commit each bucket as
    soon as all its traces have been seen."""
    destination = manifest.path.parent
    shutil.rmtree(destination / SCRATCH, ignore_errors=True)  # a stopped run's spills
    buffers = _Buffers(destination / SCRATCH, limit // 3)
    with ThreadPoolExecutor(1, thread_name_prefix="masreplay-write") as writer:
        _stream_into(files, plan, manifest, options, buffers, bar, on_part, writer)
    shutil.rmtree(destination / SCRATCH, ignore_errors=True)


def _stream_into(files: Sequence[str], plan: Plan, manifest: Manifest, options: Mapping[str, Any], buffers: _Buffers,
                 bar: Any, on_part: Callable[[int, int], None], writer: ThreadPoolExecutor) -> None:  # fmt: skip
    """The loop of :func:`_stream_local`. A whole bucket's part is written and committed on
    ``writer`` while the stream goes on (Parquet encoding runs without the GIL); one part at
    a time, so parts are committed in the order they were computed and an error surfaces at
    the next part or at the end."""
    destination = manifest.path.parent
    done = manifest.done
    seen = np.zeros(plan.n_buckets, dtype=np.int64)
    rejected: dict[int, list[dict]] = {}
    writing: Future | None = None

    def commit(bucket: int, traces: pa.Table, events: pa.Table, refused: list[dict]) -> None:
        write_part(destination, bucket, traces, events)
        manifest.commit(bucket, traces.num_rows, events.num_rows, refused)
        on_part(traces.num_rows, events.num_rows)

    position = 0
    for path, table in read_ahead(read_batches(files, None)):
        positions = np.arange(position, position + table.num_rows)
        position += table.num_rows
        buckets = plan.bucket[positions]
        todo = (buckets >= 0) & ~np.isin(buckets, list(done))
        if todo.any():
            # Filtering copies the whole row group: only when a resumed run skips some of it.
            wanted = table if todo.all() else table.filter(pa.array(todo))
            core, kept, bad = ingest(wanted, positions[todo], options["on_error"], path)
            for entry in bad:
                rejected.setdefault(int(plan.bucket[entry["position"]]), []).append(entry)
            for bucket, piece in split_by_bucket(core, kept, plan.bucket[kept]):
                buffers.add(bucket, piece)
            np.add.at(seen, buckets[todo], 1)
        bar.update(table.num_rows)
        for bucket in np.unique(buckets[todo]) if todo.any() else ():
            if seen[bucket] == plan.expected[bucket]:
                traces, events = compute_bucket(load_bucket(buffers.take(int(bucket))), options)
                if writing is not None:
                    writing.result()
                writing = writer.submit(commit, int(bucket), traces, events, rejected.pop(int(bucket), []))
    if writing is not None:
        writing.result()
    if plan.expected[0] == 0 and 0 not in done:  # a dump of no trace: its one bucket is empty
        commit(0, *compute_bucket(_core.empty_batch(), options), [])


@checked
def credit_dump(
    source: str | os.PathLike | Sequence[str | os.PathLike],
    destination: str | os.PathLike,
    *,
    advantages: Mapping[str, Any] | None = None,
    counterfactual: bool | Mapping[str, Any] = False,
    metrics: bool = False,
    group_by: str = "group_id",
    engine: Engine = "local",
    memory_limit: int | str = "1GB",
    resume: bool = True,
    on_error: Literal["raise", "skip"] = "raise",
    progress: bool = True,
    workers: int | None = None,
) -> DumpSummary:
    """Credit for every trace of a Parquet dump, written as Parquet under ``destination``.

    - ``source``: a Parquet file, a directory of them (searched recursively), a glob, or a
      list of those, in the canonical layout or any layout ``load_traces`` accepts. Traces
      are validated as they stream; ``on_error="skip"`` lists rejected ones in the summary
      and the manifest (trace id, JSON pointer, reason) instead of stopping. Trace ids must
      be unique across the dump.
    - ``advantages``: keyword arguments of :func:`masreplay.advantages` (``estimator``,
      ``normalize_by``, ``unit``, ``std``, ``eps``, ``compat``, ``channels``, ...; ``dtype``
      defaults to float64 here), grouped by ``group_by`` (``"group_id"`` or ``"task_id"``).
      ``counterfactual=True`` (or a dict of ``channel``, ``baseline``) adds
      :func:`masreplay.counterfactual_credit`; ``metrics=True`` adds :func:`masreplay.metrics`.
    - Output: ``traces/part-*.parquet`` (``trace_id``, ``group_id``, ``advantage``, the
      metrics columns), ``events/part-*.parquet`` (``trace_id``, ``event_id``, ``agent``,
      ``advantage``, ``weight``, ``credit``, ``stderr``, ``n_branches``, as asked) and
      ``_manifest.json``; read it with :func:`read_credit`, Polars or DuckDB.
    - ``memory_limit`` (``"1GB"``, ``"512MiB"`` or bytes) bounds the working memory (see the
      module's docstring for the design and the bound); ``resume`` continues a run that was
      stopped (else the destination is started over); ``progress`` draws a tqdm bar on
      stderr when it is a terminal.
    - ``engine="ray"`` runs the same job on Ray Data (``pip install "masreplay[ray]"``) with
      ``workers`` actors (default: one per two CPUs of the cluster, at least one); it writes
      the same parts as ``engine="local"``.
    """
    started = time.perf_counter()
    options = _options(advantages, counterfactual, metrics, group_by, on_error)
    if engine not in ("local", "ray"):
        raise InvalidArgumentError(f"engine must be 'local' or 'ray', got {engine!r}")
    limit = parse_memory(memory_limit)
    workers = optional_whole("workers", workers, low=1)
    files = source_files(source, destination)
    destination = pathlib.Path(destination)
    try:
        destination.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a file in the way, or no permission
        raise StorageError(
            error.errno, f"destination cannot be a directory of parts ({error.strerror})", os.fspath(destination)
        ) from None
    manifest = _open(destination, _inputs(files), options, max(1, limit // BYTES_PER_EVENT), resume)
    resumed = len(manifest.state["parts"])
    if not manifest.state["complete"]:
        bucket_events = int(manifest.state["bucket_events"])
        if engine == "ray":
            run_ray(files, manifest, options, bucket_events, limit, progress, workers)
        else:
            plan = make_plan(plan_keys(files), options, bucket_events)
            _record_null_ids(plan, manifest, options)
            manifest.begin()
            totals = [0, 0]

            def on_part(traces: int, events: int) -> None:
                totals[0] += traces
                totals[1] += events
                rate = totals[1] / max(time.perf_counter() - started, 1e-9)
                bar.set_postfix_str(f"{len(manifest.state['parts'])}/{plan.n_buckets} parts, {rate:,.0f} events/s")

            with _progress(progress, len(plan.bucket)) as bar, _reusing_allocator():
                _stream_local(files, plan, manifest, options, limit, bar, on_part)
            _finish(manifest, plan.n_buckets)
    return _summary(manifest, destination, resumed, time.perf_counter() - started, engine)


def _summary(manifest: Manifest, destination: pathlib.Path, resumed: int, seconds: float, engine: str) -> DumpSummary:
    state = manifest.state
    return DumpSummary(
        destination=os.fspath(destination),
        traces=state["traces"],
        events=state["events"],
        parts=len(state["parts"]),
        resumed_parts=resumed,
        seconds=seconds,
        peak_memory=peak_memory(),
        engine=engine,
        rejected=[{k: r[k] for k in ("trace_id", "pointer", "reason")} for r in state["rejected"]],
    )


@checked
def read_credit(destination: str | os.PathLike) -> tuple[pa.Table, pa.Table]:
    """The ``(traces, events)`` tables of a finished :func:`credit_dump` output, parts in
    order. An unfinished output (a run stopped before its end) is refused."""
    destination = pathlib.Path(destination)
    manifest = Manifest.read(destination)
    if manifest is None:
        raise StorageError(2, "no credit_dump output here (no _manifest.json)", os.fspath(destination))
    if not manifest.state.get("complete"):
        raise DataFormatError(
            f"{destination} is an unfinished credit_dump output ({len(manifest.state['parts'])} parts committed); "
            "run credit_dump again with resume=True to finish it"
        )
    tables = []
    for folder in ("traces", "events"):
        paths = [destination / folder / PART_NAME.format(entry["part"]) for entry in manifest.state["parts"]]
        try:
            tables.append(pa.concat_tables([pq.read_table(p) for p in paths]) if paths else pa.table({}))
        except (OSError, pa.ArrowException) as error:
            raise StorageError(5, f"a committed part cannot be read ({error})", os.fspath(destination)) from error
    return tables[0], tables[1]
