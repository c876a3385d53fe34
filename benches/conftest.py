"""Data sets, honesty checks and the summary tables of the benchmarks.

Run with ``pytest benches --benchmark-only``. Every ingest data set is built once per session,
and before anything is timed the anchor's output is compared with masreplay's, value by value
(see ``anchors.assert_same_table``); the replay-buffer suite (test_buffer.py) builds its own
workloads and runs its own checks. At the end of the run (in the terminal summary, so with or
without ``-s``) one table per suite is printed: throughputs or times per call, and the ratio
anchor / masreplay (time, or stored bytes), so above 1 always means masreplay is better.
"""

from __future__ import annotations

import json
import math
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import masreplay
from anchors import arrow_anchor, assert_same_table, json_anchor
from layouts import realistic

# ---- sizes (kept so that the whole suite runs in well under 3 minutes on 2 cores) ----------

#: Traces of 20-200 events: the simulator's default shape, widened, then filtered to the range.
SMALL_SHAPE = {"agents": (3, 16), "events_per_agent": (3, 12)}
SMALL_EVENTS = (20, 200)
#: Kimi scale: 300 sub-agents per trace, about 4,000 events per trace.
KIMI_SHAPE = {"agents": 300, "events_per_agent": (10, 14)}

JSON_SMALL_TRACES = 1000  # about 28 MB of JSON Lines, ~95k events
JSON_KIMI_TRACES = 6  # about 7.7 MB, ~25k events
ARROW_TRACES = 6000  # about 570k events

MB = 1e6


@dataclass
class Dataset:
    """One input of the benchmarks, with the sizes the throughputs are computed from."""

    name: str
    source: object  # bytes, a pa.Table or a path
    n_traces: int
    n_events: int
    n_bytes: int
    goal: str = ""
    notes: dict = field(default_factory=dict)
    #: Which summary table the figures go to: a key of SUITE_TITLES.
    suite: str = "ingest"


def _generate(n_traces: int, seed: int, shape: dict, events: tuple[int, int] | None = None) -> masreplay.TraceBatch:
    batch = masreplay.sim.generate(n_traces, seed=seed, **shape)
    if events is not None:
        sizes = np.diff(batch.event_offsets)
        batch = batch[[int(i) for i in np.flatnonzero((sizes >= events[0]) & (sizes <= events[1]))]]
    return batch


def _json_lines(batch: masreplay.TraceBatch) -> bytes:
    return ("\n".join(json.dumps(batch[i]) for i in range(len(batch))) + "\n").encode()


JSON_GOAL = "goal: masreplay >= 5x the anchor"
ARROW_GOAL = "goal: masreplay >= 5 M events/s"


def _json_dataset(name: str, batch: masreplay.TraceBatch) -> Dataset:
    data = _json_lines(batch)
    ours = masreplay.load_traces(data).to_arrow()
    theirs = json_anchor(data, ours.schema)
    assert_same_table(ours, theirs)  # the anchor builds the very table masreplay builds
    sizes = np.diff(batch.event_offsets)
    return Dataset(
        name,
        data,
        len(batch),
        int(batch.num_events),
        len(data),
        JSON_GOAL,
        {"events per trace": f"{sizes.min()}-{sizes.max()}"},
    )


# ---- the anchor checks what masreplay checks -------------------------------------------------


def _breakages(rows: list[dict]) -> dict[str, Callable[[list[dict]], object]]:
    """Ways to break the first trace of ``rows`` (canonical row dicts) that both must reject."""
    first = rows[0]
    n = len(first["events"])
    edge = first["edges"][0]

    def set_event(key, value, i=1):
        return lambda r: r[0]["events"][i].__setitem__(key, value)

    return {
        "negative t": set_event("t", -1.0),
        "NaN t": set_event("t", math.nan),
        "unknown event type": set_event("type", "teleport"),
        "empty agent": set_event("agent", ""),
        "positive logprob": set_event("logprob", 0.5),
        "negative tokens": set_event("tokens", -3),
        "duplicate event id": set_event("id", first["events"][0]["id"]),
        "edge out of range": lambda r: r[0]["edges"][0].__setitem__("dst", n),
        "negative edge index": lambda r: r[0]["edges"][0].__setitem__("src", -1),
        "self-loop": lambda r: r[0]["edges"][0].__setitem__("dst", edge["src"]),
        "cycle": lambda r: r[0]["edges"].append({"src": edge["dst"], "dst": edge["src"], "type": "temporal"}),
        "unknown edge type": lambda r: r[0]["edges"][0].__setitem__("type", "wormhole"),
        "empty trace_id": lambda r: r[0].__setitem__("trace_id", ""),
        "NaN reward": lambda r: r[0].__setitem__("rewards", [("team", math.nan)]),
        "negative cost": lambda r: r[0]["costs"].__setitem__("wall_clock_s", -1.0),
        "unknown topology": lambda r: r[0].__setitem__("topology", "ring"),
        "no events": lambda r: (r[0].__setitem__("events", []), r[0].__setitem__("edges", [])),
    }


def _assert_anchor_rejects_what_masreplay_rejects(table: pa.Table) -> None:
    """Breaks one trace in each of the ways masreplay's Arrow ingest checks for, and requires
    both masreplay and the anchor to refuse the table."""
    sample = table.slice(0, 3)
    for name, breakage in _breakages(sample.to_pylist()).items():
        rows = sample.to_pylist()
        breakage(rows)
        broken = pa.Table.from_pylist(rows, schema=table.schema)
        try:
            masreplay.load_traces(broken)
        except masreplay.MasreplayError:  # unknown enum values raise DataFormatError today
            pass
        else:
            raise AssertionError(f"masreplay accepted a table with {name}")
        try:
            arrow_anchor(broken)
        except ValueError as error:
            anchor_error = str(error)
        else:
            raise AssertionError(f"the anchor accepted a table with {name}")
        assert "anchor check failed" in anchor_error, f"{name}: the anchor failed otherwise: {anchor_error}"


# ---- session data sets -----------------------------------------------------------------------


@pytest.fixture(scope="session")
def json_small() -> Dataset:
    batch = _generate(JSON_SMALL_TRACES, 11, SMALL_SHAPE, SMALL_EVENTS)
    return _json_dataset("json, 20-200 events/trace", batch)


@pytest.fixture(scope="session")
def json_kimi() -> Dataset:
    batch = _generate(JSON_KIMI_TRACES, 12, KIMI_SHAPE)
    return _json_dataset("json, Kimi scale (~4k events/trace)", batch)


@pytest.fixture(scope="session")
def arrow_table() -> Dataset:
    batch = _generate(ARROW_TRACES, 13, SMALL_SHAPE, SMALL_EVENTS)
    table = batch.to_arrow()
    ours = masreplay.load_traces(table).to_arrow()
    assert_same_table(ours, arrow_anchor(table))
    # Both recompute the derived columns rather than trusting the input's:
    stripped = table.drop_columns(["n_events", "n_edges", "n_agents", "depth", "max_branching"])
    assert_same_table(masreplay.load_traces(stripped).to_arrow(), ours)
    _assert_anchor_rejects_what_masreplay_rejects(table)
    sizes = np.diff(batch.event_offsets)
    return Dataset(
        "arrow (canonical table), 20-200 events/trace",
        table,
        table.num_rows,
        int(batch.num_events),
        table.nbytes,
        ARROW_GOAL,
        {"events per trace": f"{sizes.min()}-{sizes.max()}"},
    )


@pytest.fixture(scope="session")
def arrow_table_realistic(arrow_table: Dataset) -> Dataset:
    """The same traces in the layout users' data have (``layouts.realistic``: UUID ids, events
    and edges shuffled within each trace, groups interleaved): ingest hashes every id and
    checks graphs whose edges come in any order."""
    table = realistic(arrow_table.source, seed=13)
    assert_same_table(masreplay.load_traces(table).to_arrow(), arrow_anchor(table))
    return Dataset(
        "arrow (canonical table), 20-200 events/trace, realistic layout: UUID ids, shuffled",
        table,
        table.num_rows,
        arrow_table.n_events,
        table.nbytes,
        ARROW_GOAL,
        arrow_table.notes,
    )


@pytest.fixture(scope="session")
def parquet_file(arrow_table: Dataset, tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    path = tmp_path_factory.mktemp("parquet") / "traces.parquet"
    masreplay.load_traces(arrow_table.source).write_parquet(path)
    ours = masreplay.load_traces(path).to_arrow()
    assert_same_table(ours, arrow_anchor(pq.read_table(path)))
    return Dataset(
        "parquet (masreplay's zstd file), 20-200 events/trace",
        path,
        arrow_table.n_traces,
        arrow_table.n_events,
        os.path.getsize(path),
    )


# ---- measuring, and the summary table ----------------------------------------------------------

_RESULTS = pytest.StashKey[list]()
_MISSING = pytest.StashKey[dict]()

SUITE_TITLES = {
    "ingest": "masreplay ingest vs anchors",
    "buffer": "masreplay replay buffer vs anchors",
    "convert": "masreplay converters vs anchors",
    "metrics": "masreplay orchestration metrics vs networkx",
    "counterfactual": "masreplay counterfactual credit vs Polars",
}


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_RESULTS] = []
    config.stash[_MISSING] = {}


def _record(
    config: pytest.Config,
    data: Dataset,
    side: str,
    unit: str,
    median: float,
    best: float,
    rounds: int,
    ours: bool | None,
) -> None:
    config.stash[_RESULTS].append(
        {
            "data": data,
            "side": side,
            "unit": unit,
            "median": median,
            "min": best,
            "rounds": rounds,
            "ours": side == "masreplay" if ours is None else ours,
        }
    )


@pytest.fixture
def measure(benchmark, request):
    """Times ``fn`` with pytest-benchmark in pedantic mode and records the figures.

    ``unit`` says how the summary shows them: "events/s", "MB/s", "traces/s" (throughput of
    the data set) or "ms" (time per call; ``data.n_events`` is then the events one call
    handles). ``setup`` runs before every round, untimed, and returns ``(args, kwargs)`` for
    ``fn`` (pytest-benchmark's pedantic setup). The reference line of a group, against which
    ratios are computed, is the side named "masreplay" unless ``ours`` says otherwise.
    """

    def run(
        fn,
        *,
        data: Dataset,
        side: str,
        rounds: int,
        warmup_rounds: int = 1,
        unit: str = "events/s",
        setup=None,
        ours: bool | None = None,
    ):
        benchmark.group = data.name
        benchmark.extra_info.update(
            side=side,
            unit=unit,
            n_traces=data.n_traces,
            n_events=data.n_events,
            n_bytes=data.n_bytes,
            **{k: str(v) for k, v in data.notes.items()},
        )
        result = benchmark.pedantic(fn, setup=setup, rounds=rounds, iterations=1, warmup_rounds=warmup_rounds)
        stats = getattr(benchmark, "stats", None)
        if stats is not None:  # None under --benchmark-disable
            _record(request.config, data, side, unit, stats.stats.median, stats.stats.min, stats.stats.rounds, ours)
        return result

    return run


@pytest.fixture(scope="session")
def record(request):
    """Records a figure that pytest-benchmark does not time: stored bytes (``unit="bytes"``)
    or a one-off timing in seconds (for example the add that fills a large buffer)."""

    def run(value: float, *, data: Dataset, side: str, unit: str, ours: bool | None = None) -> None:
        _record(request.config, data, side, unit, value, value, 1, ours)

    return run


@pytest.fixture(scope="session")
def dataset_type() -> type[Dataset]:
    """The Dataset class, for suites that build their own data sets."""
    return Dataset


@pytest.fixture(scope="session")
def missing_anchor(request):
    """Notes an anchor that could not be measured because a package is not installed (the
    test then skips); the summary names the package."""

    def run(package: str, why: str) -> None:
        request.config.stash[_MISSING].setdefault(package, why)

    return run


def _rate(record: dict, key: str) -> str:
    data, seconds, unit = record["data"], record[key], record["unit"]
    if unit == "MB/s":
        return f"{data.n_bytes / MB / seconds:8.1f} MB/s  ({data.n_events / seconds / 1e6:5.2f} M ev/s)"
    if unit == "traces/s":
        return f"{data.n_traces / seconds:10,.0f} traces/s  ({data.n_events / seconds / 1e6:6.2f} M ev/s)"
    if unit == "ms":
        text = f"{seconds * 1e3:9.3f} ms/call"
        return text + (f"  ({data.n_events / seconds / 1e6:6.1f} M ev/s)" if data.n_events else "")
    if unit == "bytes":
        text = f"{seconds / MB:9.1f} MB"
        return text + (f"  ({seconds / data.n_events:5.1f} B/event)" if data.n_events else "")
    return f"{data.n_events / seconds / 1e6:8.2f} M events/s"


def _line(record: dict, ours: dict | None) -> str:
    line = f"  {record['side']:<58} {_rate(record, 'median')}"
    if record["rounds"] > 1:
        line += f"   [best {_rate(record, 'min').strip()}]   {record['rounds']} rounds"
    if ours is not None and record is not ours and record["unit"] == ours["unit"]:
        ratio, best = record["median"] / ours["median"], record["min"] / ours["min"]
        if record["unit"] == "bytes":
            line += f"   ratio {ratio:.2f}x (its bytes / masreplay's)"
        else:
            line += f"   ratio {ratio:.2f}x"
            if record["rounds"] > 1 and ours["rounds"] > 1:
                line += f" (best/best {best:.2f}x)"
    return line


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    results = config.stash.get(_RESULTS, [])
    missing = config.stash.get(_MISSING, {})
    if not results and not missing:
        return
    write = terminalreporter.write_line
    suites = list(SUITE_TITLES) + sorted({r["data"].suite for r in results} - set(SUITE_TITLES))
    for suite in suites:
        records_of_suite = [r for r in results if r["data"].suite == suite]
        if not records_of_suite:
            continue
        terminalreporter.section(SUITE_TITLES.get(suite, f"masreplay {suite} vs anchors"))
        write(
            f"python {platform.python_version()}, pyarrow {pa.__version__}, numpy {np.__version__}, "
            f"masreplay {getattr(masreplay, '__version__', '(editable)')}, {os.cpu_count()} CPUs"
            + (f", load average {os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "")
        )
        write(
            "figure of the median round [best round]; ratio = anchor time / masreplay time "
            "(for stored bytes: anchor bytes / masreplay bytes); > 1: masreplay better"
        )
        by_data: dict[str, list[dict]] = {}
        for record in records_of_suite:
            by_data.setdefault(record["data"].name, []).append(record)
        for name, records in by_data.items():
            data = records[0]["data"]
            write("")
            size = f"{data.n_traces:,} traces, {data.n_events:,} events"
            if data.n_bytes:
                size += f", {data.n_bytes / MB:.1f} MB"
            write(f"{name}: {size}" + (f"  ({data.goal})" if data.goal else ""))
            ours = next((r for r in records if r["ours"]), None)
            for record in records:
                write(_line(record, ours))
    if missing:
        terminalreporter.section("anchors not measured")
        for package, why in missing.items():
            write(f"NOT MEASURED: the anchors that need {package} ({why})")
