"""masreplay.metrics: hand-computed answers through the Python surface, length bands, input
kinds, order invariance, and the ``masreplay report`` command."""

from __future__ import annotations

import json
import random
import sys

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import masreplay
from masreplay.cli import main
from masreplay.demo import SEED_EXAMPLE, bundled
from strategies import derived_columns, trace_lists


def _trace(events: list[dict], edges: list[tuple[int, int]], trace_id: str = "t") -> dict:
    for i, event in enumerate(events):
        event.setdefault("id", f"e{i}")
    return {
        "trace_id": trace_id,
        "task_id": "task",
        "events": events,
        "edges": [{"src": events[a]["id"], "dst": events[b]["id"], "type": "causal"} for a, b in edges],
        "rewards": {"team": 1.0},
        "costs": {"tokens": 0, "wall_clock_s": 0},
    }


def _chain(n: int, trace_id: str = "chain") -> dict:
    events = [{"t": i, "type": "orchestrator_decision", "agent": "orch"} for i in range(n)]
    return _trace(events, [(i, i + 1) for i in range(n - 1)], trace_id)


def test_seed_example_by_hand(seed_example):
    row = masreplay.metrics(seed_example).to_pylist()[0]
    # e1 -> e2 -> e4 -> e5 -> e6 -> e7 -> e8; no durations, so every event weighs 1.
    assert (row["critical_path_steps"], row["critical_path_s"], row["total_work_steps"]) == (7, 7.0, 8)
    # One stage: the orchestrator's 4 events (decision, 2 spawns, aggregate) + executor_1's 2.
    assert row["critical_steps"] == 6
    # executor_1 returns to the orchestrator; planner_1 only messages.
    assert (row["finish_rate"], row["idle_agents"], row["utilization"]) == (0.5, 0, 2 / 3)
    # The untrusted browser result feeds the return and the aggregate.
    assert row["error_amplification"] == 2.0
    assert row["protocol_overhead"] is None  # no event records tokens
    assert (row["max_concurrent_agents"], row["spawn_count"], row["spawn_depth"], row["length_band"]) == (3, 2, 1, 10)


def test_fan_out_with_an_unreturned_and_an_idle_worker():
    events = [
        {"t": 0, "type": "orchestrator_decision", "agent": "orch", "tokens": 100},
        *({"t": 1, "type": "spawn", "agent": "orch", "to": w, "tokens": 10} for w in ("w1", "w2", "w3")),
        {"t": 2, "type": "message", "agent": "w1", "to": "orch", "content_ref": "a", "tokens": 20},
        {"t": 2, "type": "message", "agent": "w2", "to": "orch", "content_ref": "a", "tokens": 20},
        {"t": 3, "type": "return", "agent": "w1", "to": "orch", "tokens": 40},
        {"t": 4, "type": "aggregate", "agent": "orch", "tokens": 100},
    ]
    edges = [(0, 1), (0, 2), (0, 3), (1, 4), (2, 5), (4, 6), (6, 7)]
    row = masreplay.metrics(_trace(events, edges)).to_pylist()[0]
    assert row["critical_path_steps"] == 5  # decision, spawn, message, return, aggregate
    assert row["parallelism_efficiency"] == 8 / 5
    assert row["critical_steps"] == 5 + 2  # one stage: 5 orchestrator steps + w1's 2
    assert (row["finish_rate"], row["idle_agents"], row["utilization"]) == (1 / 3, 1, 2 / 3)
    assert row["protocol_overhead"] == (30 + 40) / 310  # spawns and messages of all tokens
    assert row["message_redundancy"] == 0.5
    assert row["error_amplification"] is None
    assert row["spawn_branching"] == 3


def test_length_bands_follow_the_buffer():
    sizes = [1, 10, 11, 100, 101, 10_000, 10_001]
    table = masreplay.metrics([_chain(n, f"c{n}") for n in sizes])
    assert table["length_band"].to_pylist() == [10, 10, 100, 100, 1000, 10_000, None]
    assert table["critical_path_steps"].to_pylist() == sizes
    assert table["parallelism_efficiency"].to_pylist() == [1.0] * len(sizes)


def test_accepts_what_load_traces_accepts(tmp_path):
    path = bundled(SEED_EXAMPLE)
    expected = masreplay.metrics(masreplay.load_traces(path))
    assert masreplay.metrics(path).equals(expected)
    assert masreplay.metrics(str(path)).equals(expected)
    assert masreplay.metrics(masreplay.load_traces(path).to_arrow()).equals(expected)
    assert masreplay.metrics(json.loads(path.read_text())).equals(expected)
    empty = masreplay.metrics([])
    assert empty.num_rows == 0 and "critical_steps" in empty.column_names


def test_one_row_per_trace_in_order():
    batch = masreplay.sim.generate(50, depth=2, seed=3)
    table = masreplay.metrics(batch)
    assert table["trace_id"].to_pylist() == batch.trace_ids
    assert table["n_events"].to_pylist() == [int(n) for n in batch.to_arrow()["n_events"].to_pylist()]
    # Depth and branching from the independent derivation, not from masreplay's own column.
    expected = [derived_columns(batch[i]) for i in range(len(batch))]
    assert table["depth"].to_pylist() == [row["depth"] for row in expected]
    assert table["max_branching"].to_pylist() == [row["max_branching"] for row in expected]


def _permuted(trace: dict, rng: random.Random) -> dict:
    shuffled = dict(trace)
    shuffled["events"] = rng.sample(trace["events"], len(trace["events"]))
    shuffled["edges"] = rng.sample(trace["edges"], len(trace["edges"]))
    return shuffled


def test_invariant_to_event_order():
    batch = masreplay.sim.generate(40, depth=3, agents=(2, 12), seed=5)
    rng = random.Random(0)
    shuffled = [_permuted(batch.to_seed_json(i), rng) for i in range(len(batch))]
    assert masreplay.metrics(shuffled).equals(masreplay.metrics(batch))


@settings(max_examples=100, deadline=None)
@given(trace_lists(max_size=3), st.randoms(use_true_random=False))
def test_every_column_ignores_the_stored_order(traces, rng):
    # Generated times tie often and edges point against time as often as along it: the
    # tie-breaking by id, the time order used as topological order and Kahn's order all run.
    shuffled = [_permuted(trace, rng) for trace in traces]
    assert masreplay.metrics(shuffled).equals(masreplay.metrics(traces))


# ---- masreplay report ----------------------------------------------------------------------


def test_report_prints_one_column_per_band(tmp_path, capsys):
    path = tmp_path / "traces.jsonl"
    traces = [_chain(5, "small"), _chain(50, "medium"), _chain(60, "medium2")]
    path.write_text("\n".join(json.dumps(t) for t in traces))
    assert main(["report", str(path), str(bundled(SEED_EXAMPLE))]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "4 traces from 2 file(s); mean per trace-length band:"
    assert lines[1].split() == ["events", "per", "trace", "<=", "10", "<=", "100"]
    assert lines[2].split() == ["traces", "2", "2"]
    assert lines[3].split() == ["critical_path_steps", f"{(5 + 7) / 2:.3f}", f"{55:.3f}"]


def test_report_of_a_missing_file_fails(tmp_path, capsys):
    assert main(["report", str(tmp_path / "missing.jsonl")]) == 1
    assert "masreplay report:" in capsys.readouterr().err


def test_report_plot_without_matplotlib_names_the_package(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert main(["report", str(bundled(SEED_EXAMPLE)), "--plot", str(tmp_path / "out.png")]) == 1
    err = capsys.readouterr().err
    assert "matplotlib" in err and "masreplay[plot]" in err
    assert not (tmp_path / "out.png").exists()


def test_report_plot_writes_a_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "out.png"
    path = tmp_path / "sim.parquet"
    masreplay.sim.generate(30, agents=(2, 40), seed=1).write_parquet(path)
    assert main(["report", str(path), "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"figure written to {out}" in capsys.readouterr().out


def test_report_plot_writes_exactly_the_named_file(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "figure"  # no suffix: still this name, drawn as PNG
    assert main(["report", str(bundled(SEED_EXAMPLE)), "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "figure.png").exists()
    assert f"figure written to {out}" in capsys.readouterr().out


def test_report_plot_titles_and_empty_panels(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from masreplay.report import plot

    table = masreplay.metrics(bundled(SEED_EXAMPLE))
    figures = []
    monkey = pytest.MonkeyPatch()
    monkey.setattr(plt, "close", figures.append)  # keep the figure to look at it
    try:
        plot(table, tmp_path / "one.png", title="seed.json: 1 traces")
    finally:
        monkey.undo()
    (figure,) = figures
    assert figure._suptitle.get_text() == "seed.json: 1 traces"
    texts = [text.get_text() for ax in figure.axes for text in ax.texts]
    # One trace without sub-agent returns: message_redundancy-like empty columns say so.
    empty = [
        column
        for column in ("parallelism_efficiency", "critical_steps", "finish_rate", "protocol_overhead", "utilization")
        if table[column].null_count == len(table)
    ]
    assert texts.count("no data") == len(empty)
    plt.close(figure)


def test_report_errors_name_the_command_once(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["report", str(bundled(SEED_EXAMPLE)), "--plot", str(tmp_path / "out.png")]) == 1
    assert capsys.readouterr().err.count("masreplay report") == 1


def test_metrics_table_is_arrow():
    table = masreplay.metrics(masreplay.sim.generate(3, seed=0))
    assert isinstance(table, pa.Table)
    assert table.schema.field("finish_rate").type == pa.float64()
    assert table.schema.field("critical_steps").type == pa.int32()
