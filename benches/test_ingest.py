"""Ingest throughput of masreplay against its anchors, measured side by side in one run.

* JSON Lines -> canonical table: ``masreplay.load_traces(bytes)`` against ``json.loads`` per
  line plus ``pa.Table.from_pylist`` with the canonical schema (``anchors.json_anchor``).
* Canonical Arrow table in: ``masreplay.load_traces(table)`` against the same rules checked
  with pyarrow.compute and NumPy (``anchors.arrow_anchor``).
* Parquet file in: ``masreplay.load_traces(path)`` against ``pyarrow.parquet.read_table``
  plus the same vectorised check; ``read_table`` alone is shown as the floor.
* Python dicts in: ``masreplay.load_traces(list_of_dicts)`` against ``json.dumps`` of the same
  dicts followed by masreplay's JSON path, and against the anchor's canonical rows built from
  the dicts plus ``pa.Table.from_pylist`` (``anchors.dicts_anchor``).

The data sets (conftest.py) are checked before timing: each anchor's output equals
masreplay's. No timing is asserted here; the summary table prints the ratios.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

import masreplay
from anchors import arrow_anchor, assert_same_table, dicts_anchor, json_anchor
from layouts import realistic

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


#: Small traces (1-2 agents, 2-12 events, 8 on average), as many as a training step may hand over.
DICT_TRACES = 100_000


@pytest.fixture(scope="module")
def dict_traces(dataset_type):
    """Simulated traces in the realistic layout (layouts.py: UUID ids, events and edges
    shuffled), as the dicts a user holds."""
    batch = masreplay.sim.generate(DICT_TRACES, seed=17, agents=(1, 2), events_per_agent=(1, 3))
    traces = list(masreplay.load_traces(realistic(batch.to_arrow(), seed=17)))
    ours = masreplay.load_traces(traces).to_arrow()
    assert ours.equals(masreplay.load_traces(json.dumps(traces).encode()).to_arrow())
    assert_same_table(ours, dicts_anchor(traces, ours.schema))
    sizes = np.diff(batch.event_offsets)
    return dataset_type(
        "python dicts, realistic layout (UUID ids, shuffled)",
        traces,
        len(traces),
        int(sizes.sum()),
        0,
        "goal: masreplay >= 3x json.dumps + load_traces(JSON)",
        {"events per trace": f"{sizes.min()}-{sizes.max()}"},
    )


@pytest.mark.parametrize("side", ["masreplay", "json.dumps", "from_pylist"])
def test_dict_ingest(side, dict_traces, measure):
    traces = dict_traces.source
    if side == "masreplay":
        batch = measure(lambda: masreplay.load_traces(traces), data=dict_traces, side=side, rounds=5, unit="traces/s")
        assert len(batch) == dict_traces.n_traces
    elif side == "json.dumps":
        batch = measure(
            lambda: masreplay.load_traces(json.dumps(traces).encode()),
            data=dict_traces,
            side="json.dumps + masreplay.load_traces(JSON)",
            rounds=3,
            unit="traces/s",
        )
        assert len(batch) == dict_traces.n_traces
    else:
        schema = masreplay.load_traces(traces).to_arrow().schema
        table = measure(
            lambda: dicts_anchor(traces, schema),
            data=dict_traces,
            side="canonical rows + pa.Table.from_pylist",
            rounds=3,
            warmup_rounds=0,
            unit="traces/s",
        )
        assert table.num_rows == dict_traces.n_traces
