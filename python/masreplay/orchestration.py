"""Orchestration metrics per trace: critical path, PARL critical steps, parallelism, finish
rate, overheads. The figures are computed in Rust on the canonical columns; this module adds
the trace-length band so results can be reported per band. Definitions: README, "Metrics"."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from masreplay import _core
from masreplay.bands import length_bands
from masreplay.io import as_batch


def metrics(source: Any) -> pa.Table:
    """One row per trace of ``source`` (a TraceBatch or anything ``load_traces`` accepts):
    ``trace_id``, ``n_events``, ``length_band``, then the metrics (see the README)."""
    batch = as_batch(source, "source")
    table = pa.table(_core.metrics(batch._core))
    bands = length_bands(table["n_events"].to_numpy())
    return table.add_column(2, pa.field("length_band", pa.int32()), bands)
