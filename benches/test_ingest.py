"""Ingest throughput of masreplay against its anchors, measured side by side in one run.

* JSON Lines -> canonical table: ``masreplay.load_traces(bytes)`` against ``json.loads`` per
  line plus ``pa.Table.from_pylist`` with the canonical schema (``anchors.json_anchor``).
* Canonical Arrow table in: ``masreplay.load_traces(table)`` against the same rules checked
  with pyarrow.compute and NumPy (``anchors.arrow_anchor``).
* Parquet file in: ``masreplay.load_traces(path)`` against ``pyarrow.parquet.read_table``
  plus the same vectorised check; ``read_table`` alone is shown as the floor.

The data sets (conftest.py) are checked before timing: each anchor's output equals
masreplay's. No timing is asserted here; the summary table prints the ratios.
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

import masreplay
from anchors import arrow_anchor, json_anchor

SIDES = ["masreplay", "anchor"]


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("dump", ["json_small", "json_kimi"])
def test_json_ingest(dump, side, measure, request):
    """JSON Lines of small traces, and of traces at Kimi's scale (fixtures in conftest.py)."""
    data = request.getfixturevalue(dump)
    if side == "masreplay":
        batch = measure(lambda: masreplay.load_traces(data.source), data=data, side=side, rounds=5, unit="MB/s")
        assert len(batch) == data.n_traces
    else:
        schema = masreplay.load_traces(data.source).to_arrow().schema
        table = measure(
            lambda: json_anchor(data.source, schema),
            data=data,
            side="json.loads + pa.Table.from_pylist",
            rounds=3,
            warmup_rounds=0,
            unit="MB/s",
        )
        assert table.num_rows == data.n_traces


@pytest.mark.parametrize("layout", ["arrow_table_realistic", "arrow_table"])
@pytest.mark.parametrize("side", SIDES)
def test_arrow_ingest(side, layout, measure, request):
    arrow_table = request.getfixturevalue(layout)
    if side == "masreplay":
        batch = measure(
            lambda: masreplay.load_traces(arrow_table.source), data=arrow_table, side=side, rounds=20, warmup_rounds=2
        )
        assert batch.num_events == arrow_table.n_events
    else:
        table = measure(
            lambda: arrow_anchor(arrow_table.source),
            data=arrow_table,
            side="pyarrow.compute + NumPy checks",
            rounds=10,
        )
        assert table.num_rows == arrow_table.n_traces


@pytest.mark.parametrize("side", [*SIDES, "floor"])
def test_parquet_read(side, parquet_file, measure):
    path = parquet_file.source
    if side == "masreplay":
        batch = measure(lambda: masreplay.load_traces(path), data=parquet_file, side=side, rounds=10)
        assert batch.num_events == parquet_file.n_events
    elif side == "anchor":
        table = measure(
            lambda: arrow_anchor(pq.read_table(path)),
            data=parquet_file,
            side="pq.read_table + pyarrow.compute checks",
            rounds=5,
        )
        assert table.num_rows == parquet_file.n_traces
    else:
        table = measure(
            lambda: pq.read_table(path),
            data=parquet_file,
            side="pq.read_table alone (no checks; floor)",
            rounds=10,
        )
        assert table.num_rows == parquet_file.n_traces
