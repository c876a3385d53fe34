"""``credit_dump(engine="ray")``: the offline job of :mod:`masreplay.offline` on Ray Data.

The same plan and the same parts as the local engine, in three Ray Data stages, none of them
a ``groupby().map_groups`` shuffle (which sorts about 3x the data in memory and needs a whole
group in one block):

1. ``read_parquet`` of the key columns, ``map_batches(trace_keys)``: the keys come back to
   the driver (a few dozen bytes per trace), which makes the plan and broadcasts it
   (``ray.put``) to the workers.
2. ``read_parquet`` of the dump, ``map_batches(_Spill)``: actors (each holding the plan)
   validate their Arrow batches with masreplay's loader and write each trace to its bucket's
   spill folder under ``DEST/_scratch`` (the destination must be storage every node sees).
3. ``from_items(buckets)``, ``map_batches(_Credit)``: actors load one bucket at a time, run
   the in-memory functions and write its part; the driver commits parts to the manifest as
   they come back.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from masreplay import _offline_steps as steps
from masreplay.errors import TraceValidationError

_REJECTED = pa.schema([("position", pa.int64()), ("trace_id", pa.string()), ("pointer", pa.string()), ("reason", pa.string())])


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
    """Stage 2 actor: validates streamed batches and spills each trace to its bucket."""

    def __init__(self, plan: Any, scratch: str, done: Sequence[int], on_error: str) -> None:
        trace_ids, self.bucket = _ray().get(plan) if isinstance(plan, _ray().ObjectRef) else plan
        self.position = {trace_id: i for i, trace_id in enumerate(trace_ids) if trace_id is not None}
        self.scratch = pathlib.Path(scratch)
        self.done = np.asarray(done, dtype=np.int64)
        self.on_error = on_error
        self.name = uuid.uuid4().hex
        self.count = 0

    def __call__(self, table: pa.Table) -> pa.Table:
        ids = table["trace_id"].to_pylist()
        positions = np.array([self.position.get(i, -1) if i is not None else -1 for i in ids], dtype=np.int64)
        buckets = np.where(positions >= 0, self.bucket[np.maximum(positions, 0)], -1)
        todo = (buckets >= 0) & ~np.isin(buckets, self.done)
        if not todo.any():
            return _REJECTED.empty_table()
        # Errors go back to the driver, which raises the first one in dump order.
        core, kept, bad = steps.ingest(table.filter(pa.array(todo)), positions[todo], "skip")
        for bucket, piece in steps.split_by_bucket(core, kept, self.bucket[kept]):
            folder = _bucket_folder(self.scratch, bucket)
            folder.mkdir(parents=True, exist_ok=True)
            steps._ipc_write(folder / f"{self.name}-{self.count:06d}.arrow", piece)
            self.count += 1
        return pa.Table.from_pylist(bad, schema=_REJECTED)


class _Credit:
    """Stage 3 actor: one whole bucket in, its part written, its sizes out."""

    def __init__(self, destination: str, options: Mapping[str, Any]) -> None:
        self.destination = pathlib.Path(destination)
        self.options = options

    def __call__(self, batch: pa.Table) -> pa.Table:
        sizes = []
        for bucket in batch["bucket"].to_pylist():
            folder = _bucket_folder(self.destination / steps.SCRATCH, bucket)
            paths = sorted(folder.glob("*.arrow")) if folder.exists() else []
            core = steps.load_bucket([steps.Piece(steps._ipc_read(path), spilled=True) for path in paths])
            traces, events = steps.compute_bucket(core, self.options)
            steps.write_part(self.destination, bucket, traces, events)
            sizes.append({"bucket": bucket, "traces": traces.num_rows, "events": events.num_rows})
        return pa.Table.from_pylist(sizes)


def run_ray(files: Sequence[str], manifest: steps.Manifest, options: Mapping[str, Any], bucket_events: int,
            limit: int, progress: bool, workers: int | None) -> None:  # fmt: skip
    """The job on the Ray cluster this process is connected to (a local one if none)."""
    ray = _ray()
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = progress
    context.target_max_block_size = max(limit // 8, 1 << 20)
    context.execution_options.preserve_order = True  # the keys in dump order, as the local engine reads them
    cpus = int(ray.cluster_resources().get("CPU", 1))
    # Actors ask for half a CPU each, so that read tasks keep a CPU to run on: with actors of
    # one CPU each a 2-CPU cluster has none left for them and the job never progresses.
    size = workers or max(1, cpus // 2)
    pool = {"compute": ray.data.ActorPoolStrategy(size=size), "num_cpus": 0.5, "batch_format": "pyarrow"}

    columns = steps._key_columns(pq.read_schema(files[0]))
    keys_ds = ray.data.read_parquet(list(files), columns=columns).map_batches(steps.trace_keys, batch_format="pyarrow")
    keys = pa.concat_tables(keys_ds.iter_batches(batch_format="pyarrow", batch_size=None))
    plan = steps.make_plan(keys, options, bucket_events)
    steps._record_null_ids(plan, manifest, options)

    destination = manifest.path.parent
    scratch = destination / steps.SCRATCH
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    done = sorted(manifest.done)
    plan_ref = ray.put((plan.trace_ids.to_pylist(), plan.bucket))
    spilled = ray.data.read_parquet(list(files)).map_batches(
        _Spill, fn_constructor_args=(plan_ref, os.fspath(scratch), done, options["on_error"]), **pool
    )
    rejected = sorted(
        (row for table in spilled.iter_batches(batch_format="pyarrow", batch_size=None) for row in table.to_pylist()),
        key=lambda row: row["position"],
    )
    if rejected and options["on_error"] == "raise":
        first = rejected[0]
        raise TraceValidationError(first["trace_id"], first["pointer"], first["reason"])
    by_bucket: dict[int, list[dict]] = {}
    for row in rejected:
        by_bucket.setdefault(int(plan.bucket[row["position"]]), []).append(row)

    todo = [b for b in range(plan.n_buckets) if b not in manifest.done]
    if todo:
        parts = ray.data.from_items([{"bucket": b} for b in todo]).map_batches(
            _Credit, fn_constructor_args=(os.fspath(destination), dict(options)), batch_size=1, **pool
        )
        for row in parts.iter_rows():
            manifest.commit(int(row["bucket"]), int(row["traces"]), int(row["events"]), by_bucket.get(int(row["bucket"]), []))
    shutil.rmtree(scratch, ignore_errors=True)
    steps._finish(manifest, plan.n_buckets)
