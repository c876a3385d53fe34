"""Orchestration metrics against networkx, measured side by side (issue 7).

Workload: simulated traces of about 50 events (``sim.generate(agents=(4, 8),
events_per_agent=(3, 8))``: 48.6 events on average). Simulating a million traces takes two
minutes on 2 cores, so ``DISTINCT`` distinct traces are simulated and the batch is repeated
to ``TRACES`` (a trace's metrics do not depend on its neighbours; ids repeat, which the
metrics ignore). Set MASREPLAY_BENCH_METRICS_TRACES to change the size.

Each group runs on two layouts: the simulator's (counter ids, events in time order, edges
sorted: the in-order fast path) and the realistic one of ``layouts.realistic`` (UUID ids,
events and edges shuffled within each trace, traces shuffled), where every goal is quoted.

Two groups in the summary:

* the full batch, masreplay only: ``masreplay.metrics`` computes every metric of every trace
  (goal: >= 10 M events/s);
* a subsample of ``ANCHOR_TRACES`` distinct traces, where the networkx loop that an RL
  practitioner would write (a DiGraph per trace and ``dag_longest_path_length``: one metric,
  the critical path) runs beside masreplay computing all of them (goal: >= 100x). The edge
  lists are prepared for networkx before timing. Before timing, networkx's longest paths
  must equal masreplay's ``critical_path_steps - 1`` (edges vs events on the path).

Nothing is asserted on times.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import masreplay
from layouts import realistic

SHAPE = {"agents": (4, 8), "events_per_agent": (3, 8)}
TRACES = int(os.environ.get("MASREPLAY_BENCH_METRICS_TRACES", 1_000_000))
DISTINCT = min(TRACES, 100_000)
ANCHOR_TRACES = 10_000


@pytest.fixture(scope="module", params=["realistic", "simulator"])
def distinct(request) -> tuple[masreplay.TraceBatch, str]:
    batch = masreplay.sim.generate(DISTINCT, seed=21, **SHAPE)
    if request.param == "realistic":
        return masreplay.load_traces(realistic(batch.to_arrow(), seed=21)), "realistic layout: UUID ids, shuffled"
    return batch, "simulator layout: counter ids, in time order"


@pytest.fixture(scope="module")
def full(distinct, dataset_type):
    distinct, layout = distinct
    copies, rest = divmod(TRACES, DISTINCT)
    parts = [distinct] * copies + ([distinct[:rest]] if rest else [])
    batch = masreplay.TraceBatch.concat(parts) if len(parts) > 1 else distinct
    data = dataset_type(
        f"metrics, {TRACES:,} traces (~50 events), {layout}",
        batch,
        len(batch),
        int(batch.num_events),
        0,
        "goal: >= 10 M events/s",
        suite="metrics",
    )
    return data


@pytest.fixture(scope="module")
def sample(distinct, dataset_type):
    distinct, layout = distinct
    batch = distinct[:ANCHOR_TRACES]
    edges = batch.edges()
    src, dst = edges["src"].to_numpy(), edges["dst"].to_numpy()
    offsets, sizes = batch.edge_offsets, np.diff(batch.event_offsets)
    spans = [slice(offsets[i], offsets[i + 1]) for i in range(len(batch))]
    graphs = [
        (int(size), list(zip(src[span].tolist(), dst[span].tolist(), strict=True)))
        for size, span in zip(sizes, spans, strict=True)
    ]
    data = dataset_type(
        f"metrics vs networkx longest path, {len(batch):,} traces (~50 events), {layout}",
        batch,
        len(batch),
        int(batch.num_events),
        0,
        "goal: masreplay >= 100x networkx",
        suite="metrics",
    )
    return data, graphs


def _networkx_longest_paths(graphs) -> list[int]:
    import networkx as nx

    lengths = []
    for n, edges in graphs:
        graph = nx.DiGraph()
        graph.add_nodes_from(range(n))
        graph.add_edges_from(edges)
        lengths.append(nx.dag_longest_path_length(graph))
    return lengths


def test_metrics_full_batch(measure, full):
    table = measure(lambda: masreplay.metrics(full.source), data=full, side="masreplay (all metrics)", rounds=3)
    assert table.num_rows == full.n_traces


def test_metrics_sample(measure, sample):
    data, _ = sample
    # The reference of the group, so that the summary prints networkx's ratio from the medians
    # (its rate alone shows two decimals, +-3% at 0.2 M events/s).
    measure(lambda: masreplay.metrics(data.source), data=data, side="masreplay (all metrics)", rounds=5, ours=True)


def test_networkx_longest_path_sample(measure, sample, missing_anchor):
    data, graphs = sample
    try:
        import networkx  # noqa: F401
    except ImportError:
        missing_anchor("networkx", "pip install -r benches/requirements-anchors.txt")
        pytest.skip("networkx is not installed")
    ours = masreplay.metrics(data.source)["critical_path_steps"].to_numpy()
    assert _networkx_longest_paths(graphs) == (ours - 1).tolist()
    measure(
        lambda: _networkx_longest_paths(graphs),
        data=data,
        side="networkx DiGraph + dag_longest_path_length per trace",
        rounds=3,
        warmup_rounds=0,
    )
