"""Offline credit over a Parquet dump (issue 16): ``credit_dump`` against the same job in
Polars' lazy engine, peak resident memory under ``memory_limit="1GB"``, Ray against local.

Dumps: ``DISTINCT`` simulated traces (``sim.generate(agents=(2, 6), group_size=8)``, 27
events per trace on average) repeated with fresh trace and group ids up to each size of
``MASREPLAY_BENCH_OFFLINE_EVENTS`` (default ``1e6,1e7``; the issue's goal is measured at
``1e8``), in files of about a million events and row groups of 4096 traces. A dump is
written once and kept under ``benches/data/offline/`` (ignored by git).

* Speed: ``credit_dump(advantages={"normalize_by": "agent"})`` (the part Polars can do:
  agent-wise GRPO advantages and Dr. MAS loss weights), then with ``metrics=True`` (the issue's
  job; Polars has no equivalent of the graph metrics), against Polars ``scan_parquet`` ->
  ``explode`` -> ``group_by`` -> ``join`` -> ``sink_parquet``. Before timing, Polars' per-trace
  advantages must equal masreplay's (1e-9), and its per-event weights too up to 1e6 events.
* Memory: the whole job (advantages + metrics, ``memory_limit="1GB"``) in a fresh
  subprocess, whose peak RSS (``ru_maxrss`` from ``wait4``) is recorded; Polars' likewise.
* Ray: ``engine="ray"`` with 2 actors on a local 2-CPU Ray, sizes up to
  ``MASREPLAY_BENCH_OFFLINE_RAY_MAX`` events (default 1e7). Polars runs up to
  ``MASREPLAY_BENCH_OFFLINE_POLARS_MAX`` events (default 1e7): its memory grows with the dump.

Nothing is asserted on times or memory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import masreplay

SIZES = [int(float(s)) for s in os.environ.get("MASREPLAY_BENCH_OFFLINE_EVENTS", "1e6,1e7").split(",")]
RAY_MAX = int(float(os.environ.get("MASREPLAY_BENCH_OFFLINE_RAY_MAX", "1e7")))
#: Polars' job holds about 175 bytes per event (1.75 GB at 1e7): above this size it is skipped.
POLARS_MAX = int(float(os.environ.get("MASREPLAY_BENCH_OFFLINE_POLARS_MAX", "1e7")))
DISTINCT = 20_000
WARMUP_MAX = 10_000_000
ROW_GROUP = 4096
FILE_EVENTS = 1_000_000
DATA = Path(__file__).parent / "data" / "offline"
ADVANTAGES = {"normalize_by": "agent"}
EPS = 1e-6  # masreplay's native GRPO eps


def _renamed(table: pa.Table, copy: int) -> pa.Table:
    """A copy of the distinct traces with its own trace and group ids."""
    prefix = f"c{copy:05d}-"
    for name in ("trace_id", "group_id"):
        column = pc.binary_join_element_wise(prefix, table[name], "")
        table = table.set_column(table.schema.get_field_index(name), pa.field(name, pa.string(), nullable=False), column)
    return table


def _write_dump(folder: Path, n_events: int) -> tuple[int, int]:
    distinct = masreplay.sim.generate(DISTINCT, agents=(2, 6), group_size=8, seed=16).to_arrow()
    per_copy = int(pc.sum(distinct["n_events"]).as_py())
    traces = events = 0
    writer, file_events, file_index = None, 0, 0
    copy = 0
    while events < n_events:
        table = _renamed(distinct, copy)
        copy += 1
        if events + per_copy > n_events:  # the last copy cut at whole groups
            cumulative = np.cumsum(table["n_events"].to_numpy())
            keep = int(np.searchsorted(cumulative, n_events - events)) + 1
            keep += (-keep) % 8  # group_size
            table = table.slice(0, keep)
        for start in range(0, table.num_rows, ROW_GROUP):
            chunk = table.slice(start, ROW_GROUP)
            if writer is None:
                writer = pq.ParquetWriter(folder / f"dump-{file_index:04d}.parquet", chunk.schema)
            writer.write_table(chunk, row_group_size=ROW_GROUP)
            file_events += int(pc.sum(chunk["n_events"]).as_py())
            if file_events >= FILE_EVENTS:
                writer.close()
                writer, file_events, file_index = None, 0, file_index + 1
        traces += table.num_rows
        events += int(pc.sum(table["n_events"]).as_py())
    if writer is not None:
        writer.close()
    return traces, events


@pytest.fixture(scope="module", params=SIZES, ids=lambda n: f"{n:.0e}events")
def dump(request, dataset_type):
    size = request.param
    DATA.mkdir(parents=True, exist_ok=True)
    (DATA / ".gitignore").write_text("*\n")
    folder = DATA / f"dump-{size}"
    done = folder / "_sizes.json"
    if not done.exists():
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        traces, events = _write_dump(folder, size)
        done.write_text(json.dumps({"traces": traces, "events": events}))
    sizes = json.loads(done.read_text())
    n_bytes = 0
    for path in folder.glob("*.parquet"):  # every side reads from the page cache
        n_bytes += len(path.read_bytes())
    return dataset_type(
        f"offline credit, {sizes['events']:.0e} events",
        folder,
        sizes["traces"],
        sizes["events"],
        n_bytes,
        "goal: >= 3x Polars; peak RSS <= 1.5 GB at memory_limit=1GB",
        notes={"size": size},
        suite="offline",
    )


def _out(name: str) -> Path:
    return DATA / "out" / name


def _finished(destination: Path) -> bool:
    manifest = destination / "_manifest.json"
    return manifest.exists() and bool(json.loads(manifest.read_text()).get("complete"))


def polars_job(source: Path, out: Path) -> None:
    """Agent-wise GRPO advantages and loss weights, as an RL practitioner would write them in
    Polars' lazy engine (masreplay's native conventions: unbiased std, eps 1e-6, a cell of
    one value or of equal values gets 0; weights 1/traces of the group x 1/agents of the
    trace x the event's token share within its agent)."""
    import polars as pl

    out.mkdir(parents=True, exist_ok=True)
    scan = pl.scan_parquet(source / "*.parquet")
    reward = pl.col("rewards").map.get("team")
    traces = scan.select("trace_id", "group_id", reward.alias("reward"))
    events = (
        scan.select("trace_id", "events")
        .explode("events")
        .select(
            "trace_id",
            pl.col("events").struct.field("id").alias("event_id"),
            pl.col("events").struct.field("agent").cast(pl.String).alias("agent"),
            pl.col("events").struct.field("tokens").fill_null(1).cast(pl.Float64).alias("tokens"),
        )
    )
    rows = events.group_by("trace_id", "agent").agg(pl.col("tokens").sum().alias("row_tokens")).join(traces, on="trace_id")
    cells = rows.group_by("group_id", "agent").agg(
        pl.col("reward").mean().alias("mean"),
        pl.col("reward").std().alias("std"),
        pl.len().alias("n"),
        pl.col("reward").n_unique().alias("distinct"),
    )
    per_trace = traces.group_by("group_id").agg(pl.len().alias("group_traces"))
    agents = rows.group_by("trace_id").agg(pl.len().alias("trace_agents"))
    rows = (
        rows.join(cells, on=["group_id", "agent"])
        .with_columns(
            pl.when((pl.col("n") < 2) | (pl.col("distinct") == 1))
            .then(0.0)
            .otherwise((pl.col("reward") - pl.col("mean")) / (pl.col("std") + EPS))
            .alias("advantage")
        )
        .join(per_trace, on="group_id")
        .join(agents, on="trace_id")
    )
    events_out = events.join(rows, on=["trace_id", "agent"]).select(
        "trace_id",
        "event_id",
        "agent",
        "advantage",
        (pl.col("tokens") / pl.col("row_tokens") / pl.col("group_traces") / pl.col("trace_agents")).alias("weight"),
    )
    traces_out = rows.group_by("trace_id").agg(pl.col("group_id").first(), pl.col("advantage").mean())
    pl.collect_all(
        [
            events_out.sink_parquet(out / "events.parquet", lazy=True),
            traces_out.sink_parquet(out / "traces.parquet", lazy=True),
        ]
    )


def _masreplay_job(data, metrics: bool) -> masreplay.DumpSummary:
    name = "masreplay-metrics" if metrics else "masreplay"
    return masreplay.credit_dump(
        data.source, _out(name), advantages=ADVANTAGES, metrics=metrics, resume=False, progress=False, memory_limit="1GB"
    )


def _warmup(data) -> int:
    """One untimed run first on dumps up to WARMUP_MAX events, for every side: the first job
    in a process pays for touching fresh memory (about 2x at 10^6 events), a cost that a
    larger dump amortises, and there a second run would double an hour-long benchmark."""
    return 1 if data.n_events <= WARMUP_MAX else 0


def test_masreplay_advantages(measure, dump):
    summary = measure(lambda: _masreplay_job(dump, False), data=dump, side="masreplay", rounds=1, warmup_rounds=_warmup(dump))
    assert summary.events == dump.n_events


def test_masreplay_advantages_and_metrics(measure, dump):
    measure(
        lambda: _masreplay_job(dump, True), data=dump, side="masreplay, + metrics=True (the issue's job)",
        rounds=1, warmup_rounds=_warmup(dump), ours=False,
    )  # fmt: skip


def test_polars_lazy(measure, dump, missing_anchor):
    if dump.notes["size"] > POLARS_MAX:
        pytest.skip(f"Polars runs up to MASREPLAY_BENCH_OFFLINE_POLARS_MAX={POLARS_MAX:.0e} events")
    try:
        import polars as pl
    except ImportError:
        missing_anchor("polars", "pip install polars")
        pytest.skip("polars is not installed")
    out = _out("polars")
    measure(
        lambda: polars_job(dump.source, out), data=dump,
        side="Polars lazy: scan_parquet, explode, group_by, join, sink_parquet", rounds=1, warmup_rounds=_warmup(dump),
    )  # fmt: skip
    # The check reads masreplay's finished output (test_masreplay_advantages wrote it) with
    # Polars alone, and the events table only where it fits in memory beside the test.
    ours_out = _out("masreplay")
    if not _finished(ours_out):
        _masreplay_job(dump, False)
    theirs = pl.read_parquet(out / "traces.parquet").sort("trace_id")
    ours = pl.read_parquet(ours_out / "traces" / "*.parquet").select("trace_id", "advantage").sort("trace_id")
    assert theirs["trace_id"].to_list() == ours["trace_id"].to_list()
    np.testing.assert_allclose(theirs["advantage"].to_numpy(), ours["advantage"].to_numpy(), rtol=1e-9, atol=1e-9)
    if dump.n_events <= 1_000_000:
        theirs_events = pl.read_parquet(out / "events.parquet").sort("trace_id", "event_id")
        ours_events = pl.read_parquet(ours_out / "events" / "*.parquet").sort("trace_id", "event_id")
        np.testing.assert_allclose(theirs_events["weight"].to_numpy(), ours_events["weight"].to_numpy(), rtol=1e-9)
        np.testing.assert_allclose(
            theirs_events["advantage"].to_numpy(), ours_events["advantage"].to_numpy(), rtol=1e-9, atol=1e-9
        )


PEAK = textwrap.dedent(
    """
    import os, resource, sys
    sys.path.insert(0, os.path.dirname(sys.argv[1]))
    job, source, out = sys.argv[2], sys.argv[3], sys.argv[4]
    if job == "polars":
        import test_offline
        test_offline.polars_job(__import__("pathlib").Path(source), __import__("pathlib").Path(out))
    else:
        import masreplay
        masreplay.credit_dump(source, out, advantages={"normalize_by": "agent"}, metrics=True, resume=False,
                              progress=False, memory_limit="1GB")
    from masreplay.offline import peak_memory
    print(peak_memory())
    """
)


def _peak_rss(job: str, source: Path, out: Path) -> int:
    """Peak resident memory (bytes) of the job run alone in a fresh process (its VmHWM:
    the ru_maxrss that wait4 reports would count the pytest process it was forked from)."""
    done = subprocess.run(
        [sys.executable, "-c", PEAK, __file__, job, str(source), str(out)], capture_output=True, text=True, check=True
    )
    return int(done.stdout.split()[-1])


def test_peak_memory(record, dump):
    value = _peak_rss("masreplay", dump.source, _out("peak-masreplay"))
    record(value, data=dump, side="peak RSS, masreplay advantages + metrics, memory_limit=1GB", unit="bytes")
    try:
        import polars  # noqa: F401
    except ImportError:
        return
    if dump.notes["size"] > POLARS_MAX:
        return
    polars_value = _peak_rss("polars", dump.source, _out("peak-polars"))
    record(polars_value, data=dump, side="peak RSS, Polars lazy job (advantages only)", unit="bytes", ours=False)


def test_ray_two_workers(measure, dump):
    if dump.notes["size"] > RAY_MAX:
        pytest.skip(f"Ray runs up to MASREPLAY_BENCH_OFFLINE_RAY_MAX={RAY_MAX:.0e} events")
    ray = pytest.importorskip("ray", reason="the Ray engine needs ray (pip install 'masreplay[ray]')")

    def job() -> masreplay.DumpSummary:
        return masreplay.credit_dump(dump.source, _out("ray"), advantages=ADVANTAGES, engine="ray", workers=2,
                                     resume=False, progress=False, memory_limit="1GB")  # fmt: skip

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)  # a local 2-CPU cluster, started untimed
    try:
        measure(job, data=dump, side="masreplay engine='ray', 2 actors, local 2-CPU Ray", rounds=1, warmup_rounds=0, ours=False)
    finally:
        ray.shutdown()
    local = _out("masreplay")
    if (local / "_manifest.json").exists():
        assert masreplay.read_credit(_out("ray"))[0].equals(masreplay.read_credit(local)[0])
