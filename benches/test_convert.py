"""Conversion throughput of the real samples against reading their lines with json.

``masreplay.convert.claude_code`` (read every file of the session, build the trace, validate
it in Rust), ``masreplay.convert.marble`` (both MARBLE result logs) and ``masreplay.convert.otel``
(an OTLP JSON export of simulated traces) against the floor any converter pays: ``json.loads``
on every line of the same files (of the whole document for OTLP). The ratio (json time /
converter time) says how much of a json-only pass the whole conversion costs; below 1 means
slower than the bare parse. Reads the real samples in tests/data; the OTLP export is written by
``masreplay.convert.to_otel`` (no OpenTelemetry sample ships with the repository).

Both sides run with Python's cyclic garbage collector off while timed: json.loads of the 3 MB
OTLP document allocates enough objects to trigger collections whose cost depends on what else
the process holds (its rounds varied 2.5x, and the median ratio rode on them: 2.17x with the
collector, 0.79x without it, on the same build).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from masreplay import convert

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
SESSION = DATA / "claude_code" / "fa812bfe-b295-4cca-9c2f-fdf01028cb46.jsonl"
MARBLE = sorted((DATA / "marble").glob("*.jsonl"))
pytestmark = pytest.mark.benchmark(disable_gc=True)


def _session_files() -> list[Path]:
    if not SESSION.is_file():
        pytest.fail(f"the Claude Code sample is missing: expected it at {SESSION}", pytrace=False)
    return [SESSION, *sorted(SESSION.with_suffix("").joinpath("subagents").glob("*.jsonl"))]


def _json_lines(files: list[Path]) -> int:
    count = 0
    for path in files:
        with path.open("rb") as handle:
            for line in handle:
                json.loads(line)
                count += 1
    return count


@pytest.fixture(scope="module")
def claude_session(dataset_type):
    files = _session_files()
    batch = convert.claude_code(SESSION)
    return dataset_type(
        "claude code session (1 main + 3 sub-agent transcripts)",
        SESSION,
        1,
        batch.num_events,
        sum(path.stat().st_size for path in files),
        notes={"lines": batch.conversion_report.records},
        suite="convert",
    )


@pytest.mark.parametrize("side", ["masreplay", "anchor"])
def test_claude_code_conversion(side, claude_session, measure):
    if side == "masreplay":
        batch = measure(lambda: convert.claude_code(SESSION), data=claude_session, side=side, rounds=10, unit="MB/s")
        assert batch.num_events == claude_session.n_events
    else:
        files = _session_files()
        lines = measure(lambda: _json_lines(files), data=claude_session, side="json.loads per line", rounds=10, unit="MB/s")
        assert lines == claude_session.notes["lines"]


@pytest.fixture(scope="module")
def marble_logs(dataset_type):
    if not MARBLE:
        pytest.fail(f"the MARBLE samples are missing: expected them in {DATA / 'marble'}", pytrace=False)
    events = sum(convert.marble(path).num_events for path in MARBLE)
    lines = _json_lines(MARBLE)
    return dataset_type(
        f"MARBLE result logs ({len(MARBLE)} files)",
        MARBLE,
        lines,
        events,
        sum(path.stat().st_size for path in MARBLE),
        notes={"lines": lines},
        suite="convert",
    )


def _marble_all() -> int:
    return sum(convert.marble(path).num_events for path in MARBLE)


@pytest.mark.parametrize("side", ["masreplay", "anchor"])
def test_marble_conversion(side, marble_logs, measure):
    if side == "masreplay":
        events = measure(_marble_all, data=marble_logs, side=side, rounds=10, unit="MB/s")
        assert events == marble_logs.n_events
    else:
        lines = measure(lambda: _json_lines(MARBLE), data=marble_logs, side="json.loads per line", rounds=10, unit="MB/s")
        assert lines == marble_logs.notes["lines"]


#: Simulated traces written as OTLP JSON by masreplay's own exporter (no OTel sample ships with
#: the repository): agent, tool and chat spans as the GenAI conventions name them.
OTEL_TRACES = 200


@pytest.fixture(scope="module")
def otel_export(dataset_type, tmp_path_factory):
    import masreplay

    path = tmp_path_factory.mktemp("otel") / "spans.json"
    convert.to_otel(masreplay.sim.generate(OTEL_TRACES, seed=8), path)
    batch = convert.otel(path)
    return dataset_type(
        f"OTLP JSON export of {OTEL_TRACES} simulated traces (masreplay.convert.to_otel)",
        path,
        len(batch),
        batch.num_events,
        path.stat().st_size,
        suite="convert",
    )


def _json_document(path: Path) -> int:
    return len(json.loads(path.read_bytes()))


@pytest.mark.parametrize("side", ["masreplay", "anchor"])
def test_otel_conversion(side, otel_export, measure):
    if side == "masreplay":
        batch = measure(lambda: convert.otel(otel_export.source), data=otel_export, side=side, rounds=10, unit="MB/s")
        assert batch.num_events == otel_export.n_events
    else:
        measure(
            lambda: _json_document(otel_export.source),
            data=otel_export,
            side="json.loads of the document",
            rounds=10,
            unit="MB/s",
        )
