"""Branch-rollout credit against the same computation written as a Polars group-by (issues 6, 18).

Traces: ``sim.branches(FACTUAL, branches=8, branch_points=1)``: every factual trace gets 8
branch rollouts at one of its events (900,000 traces for 100,000 factual ones; small traces,
``agents=(1, 2), events_per_agent=(1, 3)``, so the batch fits comfortably in memory).
Set MASREPLAY_BENCH_CF_FACTUAL to change the size. The same traces in four layouts:

- ``shuffled``: the traces in a random order, so a factual trace and its branches are
  scattered through the batch (what a sampled or merged batch looks like): the goal's layout;
- ``realistic``: shuffled as well, with the ids users' data has (``layouts.realistic``: UUID
  trace and event ids, a branch's copy of an event sharing its factual trace's id, each
  trace's events and edges in random order); the simulator's trace ids are 13-byte counters
  that a lookup tells apart without reading their text, a UUID is compared by its text;
- ``two-pass buffer``: a GraphBuffer filled in two adds, every factual trace first and the
  branches later (what a rollout service that branches after the fact stores), read back with
  ``to_batch()`` before timing;
- ``adjacent``: sim.branches' own order, every factual trace directly followed by its
  branches (the layout with a special fast path), kept as an extra row.

The Polars side is what a user would write: the team reward out of the rewards map, the
branches grouped by (factual trace, event) for mean, std and count, joined to the factual
rewards, the stderr's Student-t factor looked up by branch count (scipy's quantiles, computed
before timing); it starts from a ``polars.DataFrame`` of the batch built before timing (its
best case). masreplay is timed three ways: the table of the credited events
(``aligned=False``, the same output as the Polars query: the comparison), the table aligned
with every event of ``batch.events()`` (the default), and the core call alone. Before
timing, both sides must agree on every credited event: credit to 1e-9, stderr to 1e-6
relative (masreplay's t quantiles are tabled to 6 decimals). Nothing is asserted on times.

Single-threaded ratios: run with ``RAYON_NUM_THREADS=1 POLARS_MAX_THREADS=1``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import masreplay
from layouts import realistic
from masreplay import _core

FACTUAL = int(os.environ.get("MASREPLAY_BENCH_CF_FACTUAL", 100_000))
BRANCHES = 8
LAYOUTS = {
    "shuffled": "shuffled: families scattered in random order",
    "realistic": "realistic layout: UUID trace and event ids, families scattered",
    "two-pass buffer": "GraphBuffer filled in two passes (factual traces, then branches)",
    "adjacent": "adjacent: each factual trace directly followed by its branches (sim.branches' layout)",
}


@pytest.fixture(scope="module")
def traces():
    truth = masreplay.sim.branches(FACTUAL, branches=BRANCHES, branch_points=1, agents=(1, 2), events_per_agent=(1, 3), seed=61)
    return truth.batch


def arranged(batch: masreplay.TraceBatch, layout: str) -> masreplay.TraceBatch:
    """The traces of ``batch`` (sim.branches' order) in ``layout``."""
    if layout == "adjacent":
        return batch
    if layout == "shuffled":
        return batch[np.random.default_rng(18).permutation(len(batch)).tolist()]
    if layout == "realistic":
        return masreplay.load_traces(realistic(batch.to_arrow(), seed=19))
    factual = batch.to_arrow()["counterfactual_of"].is_null().to_numpy(zero_copy_only=False)
    buffer = masreplay.GraphBuffer(len(batch))
    buffer.add(batch[np.flatnonzero(factual).tolist()])
    buffer.add(batch[np.flatnonzero(~factual).tolist()])
    return buffer.to_batch()


@pytest.fixture(scope="module", params=list(LAYOUTS))
def workload(request, traces, dataset_type):
    batch = arranged(traces, request.param)
    return dataset_type(
        f"branch credit, {FACTUAL:,} factual traces x {BRANCHES} branches, {LAYOUTS[request.param]}",
        batch,
        len(batch),
        int(batch.num_events),
        0,
        "goal: masreplay >= 5x the Polars group-by" if request.param != "adjacent" else "extra row: the special layout",
        suite="counterfactual",
    )


def _t_over_z(most: int) -> dict[int, float]:
    """masreplay's stderr factor t_0.975(n - 1) / z_0.975 for n = 2..most branches (scipy)."""
    from scipy import stats

    return {n: float(stats.t.ppf(0.975, n - 1) / stats.norm.ppf(0.975)) for n in range(2, most + 1)}


def _polars_credit(frame, t_over_z):
    import polars as pl

    team = pl.col("rewards").map.get("team")
    rewards = frame.select(pl.col("trace_id"), team.alias("reward"), pl.col("counterfactual_of"))
    branches = (
        rewards.filter(pl.col("counterfactual_of").is_not_null())
        .select(
            pl.col("counterfactual_of").struct.field("trace_id").alias("factual"),
            pl.col("counterfactual_of").struct.field("event_id").alias("event_id"),
            pl.col("reward"),
        )
        .group_by("factual", "event_id")
        .agg(pl.col("reward").mean().alias("mean"), pl.col("reward").std().alias("std"), pl.len().alias("n"))
    )
    factual = rewards.filter(pl.col("counterfactual_of").is_null()).select("trace_id", "reward")
    # The Student-t factor of masreplay's stderr (see counterfactual_credit), looked up by n.
    factor = pl.col("n").replace_strict(list(t_over_z), list(t_over_z.values()), default=None, return_dtype=pl.Float64)
    return branches.join(factual, left_on="factual", right_on="trace_id").select(
        pl.col("factual").alias("trace_id"),
        "event_id",
        (pl.col("reward") - pl.col("mean")).alias("credit"),
        (pl.col("std") * (1 + 1 / pl.col("n")).sqrt() * factor).alias("stderr"),
        pl.col("n").alias("n_branches"),
    )


def test_counterfactual_credit_table(measure, workload):
    table = measure(
        lambda: masreplay.counterfactual_credit(workload.source),
        data=workload,
        side="  counterfactual_credit (table aligned with every event)",
        rounds=5,
        ours=False,
    )
    assert table.num_rows == workload.n_events


def test_counterfactual_credit_compact(measure, workload):
    measure(
        lambda: masreplay.counterfactual_credit(workload.source, aligned=False),
        data=workload,
        side="masreplay counterfactual_credit(aligned=False)",
        rounds=5,
        ours=True,
    )


def test_counterfactual_credit_arrays(measure, workload):
    core = workload.source._core
    measure(
        lambda: _core.counterfactual_credit(core, channel="team", baseline="mean"),
        data=workload,
        side="  core call alone (credit, stderr, n_branches arrays)",
        rounds=5,
        ours=False,
    )


def test_polars_group_by(measure, workload, missing_anchor):
    try:
        import polars as pl
    except ImportError:
        missing_anchor("polars", "pip install polars")
        pytest.skip("polars is not installed")
    try:
        t_over_z = _t_over_z(BRANCHES)
    except ImportError:
        missing_anchor("scipy", "pip install scipy (the Polars query's Student-t factor)")
        pytest.skip("scipy is not installed")
    frame = pl.DataFrame(workload.source.to_arrow())
    theirs = _polars_credit(frame, t_over_z).sort("trace_id", "event_id")
    credited = masreplay.counterfactual_credit(workload.source, aligned=False)
    mine = pl.from_arrow(credited.select(["trace_id", "event_id", "credit", "stderr", "n_branches"])).with_columns(
        pl.col("trace_id").cast(pl.String)
    )
    mine = mine.sort("trace_id", "event_id")
    assert mine["trace_id"].to_list() == theirs["trace_id"].to_list()
    assert mine["event_id"].to_list() == theirs["event_id"].to_list()
    assert np.allclose(mine["credit"].to_numpy(), theirs["credit"].to_numpy(), atol=1e-9, rtol=0)
    assert np.allclose(mine["stderr"].to_numpy(), theirs["stderr"].to_numpy(), atol=1e-9, rtol=1e-6)
    assert (mine["n_branches"].to_numpy() == theirs["n_branches"].to_numpy()).all()
    measure(lambda: _polars_credit(frame, t_over_z), data=workload, side="polars group-by + join (same credit)", rounds=5)
