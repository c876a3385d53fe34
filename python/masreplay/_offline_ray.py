"""``credit_dump(engine="ray")``: the offline job of :mod:`masreplay.offline` on Ray Data.

The same plan and the same parts as the local engine, in two Ray Data stages, none of them
a ``groupby().map_groups`` shuffle (which sorts about 3x the data in memory and needs a whole
group in one block):

1. The driver reads the key columns (pass 1, as the local engine does: a few dozen bytes per
   trace, and the same errors for a file that cannot be read), makes the plan and broadcasts
   each trace's bucket (``ray.put``) to the workers.
2. ``from_items(row groups)``, ``map_batches(_Spill)``: actors read whole Parquet row groups
   as the local engine does (not ``read_parquet``, which would unify the files' schemas into
   tables the local engine never sees), validate them with masreplay's loader and write each
   trace to its bucket's spill folder under ``DEST/_scratch`` (the destination must be
   storage every node sees).
3. ``from_items(buckets)``, ``map_batches(_Credit)``: actors load one bucket at a time, run
   the in-memory functions and write its part; the driver commits parts to the manifest as
   they come back.

An error raised in an actor (a row group that cannot be read, a table the loader refuses)
comes back as data and is raised in dump order, as the masreplay error the local engine
raises: left to Ray it would be a UserCodeException, its class lost.
"""

from __future__ import annotations

import os
import pathlib
import pickle
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from masreplay import _offline_steps as steps
from masreplay.errors import MasreplayError, TraceValidationError

_REJECTED = pa.schema([("position", pa.int64()), ("trace_id", pa.string()), ("pointer", pa.string()), ("reason", pa.string()),
                       ("raised", pa.binary())])  # fmt: skip
_SIZES = pa.schema([("bucket", pa.int64()), ("traces", pa.int64()), ("events", pa.int64()), ("raised", pa.binary())])


def _raised(error: MasreplayError) -> bytes:
    """A masreplay error raised in an actor, for the driver to raise as it is: one left to Ray
    would reach it as Ray's UserCodeException, its class lost and the worker's traceback for
    a message."""
    return pickle.dumps(error)


def _ray() -> Any:
    try:
        import ray
        import ray.data
    except ImportError as error:
        raise ImportError('credit_dump(engine="ray") needs the ray package: pip install "masreplay[ray]"') from error
    return ray


def _bucket_folder(scratch: pathlib.Path, bucket: int) -> pathlib.Path:
    return scratch / f"bucket-{bucket:05d}"


class _Spill:
    """Stage 2 actor: reads row groups, validates them and spills each trace to its bucket.

    A row group's piece of a bucket has a file named by the row group's first row, written
    under a temporary name and renamed: Ray Data runs a row group again when the actor that
    had it died, and the second run replaces the first's piece (a name per actor would keep
    both, and the bucket would hold its traces twice)."""

    def __init__(self, bucket: Any, scratch: str, done: Sequence[int], on_error: str) -> None:
        self.bucket = _ray().get(bucket) if isinstance(bucket, _ray().ObjectRef) else bucket
        self.scratch = pathlib.Path(scratch)
        self.done = np.asarray(done, dtype=np.int64)
        self.on_error = on_error

    def __call__(self, units: pa.Table) -> pa.Table:
        rejected = []
        for path, index, start in zip(*(units[name].to_pylist() for name in ("path", "index", "start")), strict=True):
            try:
                rejected += self._spill(path, index, start)
            except MasreplayError as error:  # the file or the whole row group refused
                rejected.append({"position": start, "raised": _raised(error)})
        return pa.Table.from_pylist(rejected, schema=_REJECTED)

    def _spill(self, path: str, index: int, start: int) -> list[dict]:
        """One row group spilled; its rejected traces."""
        table = steps.read_row_group(path, index)
        positions = np.arange(start, start + table.num_rows)
        buckets = self.bucket[positions]
        todo = (buckets >= 0) & ~np.isin(buckets, self.done)
        if not todo.any():
            return []
        # Errors go back to the driver, which raises the first one in dump order.
        wanted = table if todo.all() else table.filter(pa.array(todo))
        core, kept, bad = steps.ingest(wanted, positions[todo], "skip", path)
        for bucket, piece in steps.split_by_bucket(core, kept, self.bucket[kept]):
            folder = _bucket_folder(self.scratch, bucket)
            folder.mkdir(parents=True, exist_ok=True)
            target = folder / f"rows-{start:012d}.arrow"
            steps._atomic_write(target, lambda temporary, piece=piece: steps._ipc_write(pathlib.Path(temporary), piece))
        return bad


class _Credit:
    """Stage 3 actor: one whole bucket in, its part written, its sizes out."""

    def __init__(self, destination: str, options: Mapping[str, Any]) -> None:
        self.destination = pathlib.Path(destination)
        self.options = options

    def __call__(self, batch: pa.Table) -> pa.Table:
        sizes = []
        for bucket in batch["bucket"].to_pylist():
            try:
                sizes.append({"bucket": bucket, **self._credit(bucket), "raised": None})
            except MasreplayError as error:  # a spill file refused when read back
                sizes.append({"bucket": bucket, "traces": 0, "events": 0, "raised": _raised(error)})
        return pa.Table.from_pylist(sizes, schema=_SIZES)

    def _credit(self, bucket: int) -> dict[str, int]:
        folder = _bucket_folder(self.destination / steps.SCRATCH, bucket)
        paths = sorted(folder.glob("*.arrow")) if folder.exists() else []
        core = steps.load_bucket([steps.Piece(steps._ipc_read(path), spilled=True) for path in paths])
        traces, events = steps.compute_bucket(core, self.options)
        steps.write_part(self.destination, bucket, traces, events)
        return {"traces": traces.num_rows, "events": events.num_rows}


def run_ray(files: Sequence[str], manifest: steps.Manifest, options: Mapping[str, Any], bucket_events: int,
            limit: int, progress: bool, workers: int | None) -> None:  # fmt: skip
    """The job on the Ray cluster this process is connected to (a local one if none)."""
    ray = _ray()
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = progress
    context.target_max_block_size = max(limit // 8, 1 << 20)
    cpus = int(ray.cluster_resources().get("CPU", 1))
    # Actors ask for half a CPU each, so that Ray Data's own tasks keep a CPU to run on: with
    # actors of one CPU each a 2-CPU cluster has none left for them and the job never progresses.
    size = workers or max(1, cpus // 2)
    pool = {"compute": ray.data.ActorPoolStrategy(size=size), "num_cpus": 0.5, "batch_format": "pyarrow"}

    plan = steps.make_plan(steps.plan_keys(files), options, bucket_events)
    steps._record_null_ids(plan, manifest, options)
    manifest.begin()

    destination = manifest.path.parent
    scratch = destination / steps.SCRATCH
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    done = sorted(manifest.done)
    units = [{"path": path, "index": index, "start": start} for path, index, start in steps.row_groups(files)]
    spilled = ray.data.from_items(units).map_batches(
        _Spill, fn_constructor_args=(ray.put(plan.bucket), os.fspath(scratch), done, options["on_error"]), batch_size=1, **pool
    )
    rejected = sorted(
        (row for table in spilled.iter_batches(batch_format="pyarrow", batch_size=None) for row in table.to_pylist()),
        key=lambda row: row["position"],
    )
    # The first error in dump order, as the local engine meets it: a refused file or row
    # group always, a refused trace with on_error="raise".
    for row in rejected:
        if row["raised"] is not None:
            raise pickle.loads(row["raised"])
        if options["on_error"] == "raise":
            raise TraceValidationError(row["trace_id"], row["pointer"], row["reason"])
    by_bucket: dict[int, list[dict]] = {}
    for row in rejected:
        entry = {name: row[name] for name in ("position", "trace_id", "pointer", "reason")}
        by_bucket.setdefault(int(plan.bucket[row["position"]]), []).append(entry)

    todo = [b for b in range(plan.n_buckets) if b not in manifest.done]
    if todo:
        parts = ray.data.from_items([{"bucket": b} for b in todo]).map_batches(
            _Credit, fn_constructor_args=(os.fspath(destination), dict(options)), batch_size=1, **pool
        )
        for row in parts.iter_rows():
            if row["raised"] is not None:
                raise pickle.loads(row["raised"])
            manifest.commit(int(row["bucket"]), int(row["traces"]), int(row["events"]), by_bucket.get(int(row["bucket"]), []))
    shutil.rmtree(scratch, ignore_errors=True)
    steps._finish(manifest, plan.n_buckets)
