"""masreplay.offline: credit_dump over Parquet dumps against the in-memory functions, crash
safety (SIGKILL and resume), refused resumes, invalid traces, the Ray engine, the CLI."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import masreplay
from masreplay import offline
from masreplay.errors import DataFormatError, InvalidArgumentError, StorageError, TraceValidationError

PYTHON_DIR = Path(masreplay.__file__).resolve().parents[1]
#: Small enough that a dump of a few hundred traces makes several buckets and spills.
SMALL_MEMORY = "1MiB"


def _canonical() -> pa.Table:
    """Factual traces with branch rollouts; a third of the branches moved to a group of their
    own, so that branch families join groups into larger components."""
    table = masreplay.sim.branches(60, branches=3, branch_points=2, group_size=4, seed=7).batch.to_arrow()
    rows = table.to_pylist()
    for i, row in enumerate(rows):
        if row["counterfactual_of"] is not None and i % 3 == 0:
            row["group_id"] = "branches-" + row["counterfactual_of"]["trace_id"]
    return pa.Table.from_pylist(rows, schema=table.schema)


CANONICAL = _canonical()


def write_dump(table: pa.Table, folder: Path, *, seed: int, files: int, row_group: int) -> Path:
    """``table`` shuffled, cut into ``files`` Parquet files of ``row_group``-row groups."""
    folder.mkdir(parents=True, exist_ok=True)
    order = np.random.default_rng(seed).permutation(table.num_rows)
    for i, rows in enumerate(np.array_split(order, files)):
        pq.write_table(table.take(pa.array(rows)), folder / f"dump-{i:02d}.parquet", row_group_size=row_group)
    return folder


def by_key(table: pa.Table, keys: list[str]) -> pa.Table:
    return table.take(pc.sort_indices(table, [(k, "ascending") for k in keys]))


def assert_columns_equal(got: pa.Table, want: pa.Table, columns: list[str], exact: bool) -> None:
    for name in columns:
        a, b = got[name].to_numpy(zero_copy_only=False), want[name].to_numpy(zero_copy_only=False)
        if a.dtype.kind == "f" and not exact:
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=0, equal_nan=True, err_msg=name)
        else:
            np.testing.assert_array_equal(a, b, err_msg=name)


def assert_matches_in_memory(destination: Path, dump: Path, advantages: dict | None, counterfactual: bool | dict,
                             metrics: bool, exact: bool = False) -> None:  # fmt: skip
    """The output equals the in-memory functions on the whole dump (valid traces)."""
    traces, events = masreplay.read_credit(destination)
    batch = masreplay.load_traces(dump, on_error="skip")
    assert sorted(traces["trace_id"].to_pylist()) == sorted(batch.trace_ids)
    assert events.num_rows == batch.num_events
    events = by_key(events, ["trace_id", "event_id"])
    traces = by_key(traces, ["trace_id"])
    offsets = batch.event_offsets
    ids = pa.array(batch.trace_ids)
    want_traces = {"trace_id": ids, "group_id": pa.array(batch._core.trace_field("group_id"), pa.string())}
    want_events = {
        "trace_id": ids.take(pa.array(np.repeat(np.arange(len(batch)), np.diff(offsets)))),
        "event_id": pa.array(batch._event_array("id"), pa.string()),
    }
    if advantages is not None:
        result = masreplay.advantages(batch, **{"dtype": "float64", **advantages})
        want_traces["advantage"] = result.per_trace
        want_events["advantage"], want_events["weight"] = result.per_event, result.weights
    if counterfactual:
        credit = masreplay.counterfactual_credit(batch, **({} if counterfactual is True else counterfactual))
        for name in ("credit", "stderr", "n_branches"):
            want_events[name] = credit[name]
    want = pa.table(want_traces)
    if metrics:
        table = masreplay.metrics(batch)
        for name in table.column_names[1:]:
            want = want.append_column(name, table[name])
    want = by_key(want, ["trace_id"])
    want_ev = by_key(pa.table(want_events), ["trace_id", "event_id"])
    assert traces.column_names == want.column_names
    assert events.column_names[:2] == ["trace_id", "event_id"] and "agent" in events.column_names
    assert_columns_equal(traces, want, want.column_names, exact)
    assert_columns_equal(events, want_ev, want_ev.column_names, exact)


OPTION_SETS = [
    ({"normalize_by": "agent"}, True, True, False),
    ({"estimator": "rloo", "normalize_by": ["agent", "role"], "unit": "events"}, False, False, False),
    ({"estimator": "opo", "std": False}, True, False, False),
    ({"compat": "verl"}, False, False, True),
    ({"compat": "trl"}, False, True, True),
    ({"compat": "openrlhf", "dtype": "float32"}, True, False, True),
    (None, True, True, False),
    ({"estimator": "rloo"}, {"baseline": "loo"}, False, False),
]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**16),
    files=st.integers(1, 4),
    row_group=st.integers(3, 120),
    options=st.sampled_from(OPTION_SETS),
)
# Spills of row groups whose agent dictionaries differ (the IPC file format refused them).
@example(seed=127, files=1, row_group=3, options=OPTION_SETS[0])
def test_equals_the_in_memory_functions_whatever_the_layout(tmp_path_factory, seed, files, row_group, options):
    advantages, counterfactual, metrics, exact = options
    root = tmp_path_factory.mktemp("layout")
    dump = write_dump(CANONICAL, root / "dump", seed=seed, files=files, row_group=row_group)
    summary = masreplay.credit_dump(
        dump, root / "out", advantages=advantages, counterfactual=counterfactual, metrics=metrics,
        memory_limit=SMALL_MEMORY, progress=False,
    )  # fmt: skip
    assert summary.traces == CANONICAL.num_rows and summary.rejected == []
    assert summary.parts > 1  # the job really ran in several buckets
    assert_matches_in_memory(root / "out", dump, advantages, counterfactual, metrics, exact)


def test_groups_and_families_straddle_files_and_spill(tmp_path, monkeypatch):
    """Fine row groups of a shuffled dump: every bucket is spread over the whole dump, so
    buffers spill to disk; the numbers do not change."""
    dump = write_dump(CANONICAL, tmp_path / "dump", seed=1, files=5, row_group=4)
    plan = offline.make_plan(offline.plan_keys(offline.source_files(dump)),
                             offline._options({}, True, False, "group_id", "raise"), 512)  # fmt: skip
    files_of_group = {}
    for name in sorted(os.listdir(dump)):
        for group in pq.read_table(dump / name, columns=["group_id"])["group_id"].to_pylist():
            files_of_group.setdefault(group, set()).add(name)
    assert max(len(f) for f in files_of_group.values()) > 1
    assert plan.n_buckets > 3
    spills = []
    write = offline._ipc_write
    monkeypatch.setattr(offline, "_ipc_write", lambda path, table: (spills.append(path), write(path, table)))
    masreplay.credit_dump(dump, tmp_path / "out", advantages={}, counterfactual=True, memory_limit="1MiB", progress=False)
    assert len(spills) > 3  # buffers went past a third of the limit and were spilled
    assert_matches_in_memory(tmp_path / "out", dump, {}, True, False)


def test_output_layout_and_manifest(tmp_path):
    dump = write_dump(CANONICAL, tmp_path / "dump", seed=2, files=2, row_group=50)
    out = tmp_path / "out"
    summary = masreplay.credit_dump(dump, out, advantages={"normalize_by": "agent"}, metrics=True,
                                    memory_limit=SMALL_MEMORY, progress=False)  # fmt: skip
    parts = sorted(p.name for p in (out / "traces").iterdir())
    assert parts == sorted(p.name for p in (out / "events").iterdir()) == [f"part-{i:05d}.parquet" for i in range(summary.parts)]
    manifest = offline.Manifest.read(out).state
    assert manifest["complete"] and manifest["schema_version"] == masreplay.SCHEMA_VERSION
    assert [i["path"] for i in manifest["inputs"]] == [str(p) for p in sorted(dump.iterdir())]
    assert all(i["size"] == os.path.getsize(i["path"]) for i in manifest["inputs"])
    assert manifest["options"]["advantages"]["normalize_by"] == "agent" and manifest["rejected"] == []
    assert summary.events == manifest["events"] == CANONICAL["n_events"].to_numpy().sum()
    assert not (out / offline.SCRATCH).exists()
    # Polars reads the output with no masreplay code.
    pl = pytest.importorskip("polars")
    frame = pl.read_parquet(out / "events" / "*.parquet")
    assert frame.columns == ["trace_id", "event_id", "agent", "advantage", "weight"]
    assert frame.height == summary.events
    assert abs(frame["weight"].sum() - len(set(CANONICAL["group_id"].to_pylist()))) < 1e-9  # each group's weights sum to 1


def test_a_finished_job_is_not_redone(tmp_path):
    dump = write_dump(CANONICAL, tmp_path / "dump", seed=3, files=2, row_group=40)
    first = masreplay.credit_dump(dump, tmp_path / "out", metrics=True, memory_limit=SMALL_MEMORY, progress=False)
    stamp = {p: p.stat().st_mtime_ns for p in (tmp_path / "out" / "traces").iterdir()}
    again = masreplay.credit_dump(dump, tmp_path / "out", metrics=True, memory_limit=SMALL_MEMORY, progress=False)
    assert again.resumed_parts == again.parts == first.parts and again.traces == first.traces
    assert stamp == {p: p.stat().st_mtime_ns for p in (tmp_path / "out" / "traces").iterdir()}


def test_changed_inputs_or_options_are_refused(tmp_path):
    dump = write_dump(CANONICAL, tmp_path / "dump", seed=4, files=2, row_group=40)
    out = tmp_path / "out"
    masreplay.credit_dump(dump, out, advantages={}, memory_limit=SMALL_MEMORY, progress=False)
    with pytest.raises(InvalidArgumentError, match="other options"):
        masreplay.credit_dump(dump, out, advantages={"estimator": "rloo"}, progress=False)
    with pytest.raises(InvalidArgumentError, match="other options"):
        masreplay.credit_dump(dump, out, advantages={}, metrics=True, progress=False)
    victim = sorted(dump.iterdir())[0]
    pq.write_table(pq.read_table(victim).slice(1), victim)
    with pytest.raises(InvalidArgumentError, match="inputs changed"):
        masreplay.credit_dump(dump, out, advantages={}, progress=False)
    # Starting over is allowed, and gives the new dump's numbers.
    masreplay.credit_dump(dump, out, advantages={}, resume=False, memory_limit=SMALL_MEMORY, progress=False)
    assert_matches_in_memory(out, dump, {}, False, False)


def test_arguments_and_destinations_refused(tmp_path):
    dump = write_dump(CANONICAL, tmp_path / "dump", seed=5, files=1, row_group=100)
    for bad in ({"std": "batch"}, {"estimator": "reinforce_pp_baseline"}, {"credit": [1.0]}, {"group_by": "task_id"}):
        with pytest.raises(InvalidArgumentError):
            masreplay.credit_dump(dump, tmp_path / "a", advantages=bad)
    with pytest.raises(InvalidArgumentError, match="group_by"):
        masreplay.credit_dump(dump, tmp_path / "a", advantages={}, group_by=None)
    with pytest.raises(InvalidArgumentError, match="nothing to compute"):
        masreplay.credit_dump(dump, tmp_path / "a")
    with pytest.raises(InvalidArgumentError, match="memory_limit"):
        masreplay.credit_dump(dump, tmp_path / "a", metrics=True, memory_limit="lots")
    with pytest.raises(InvalidArgumentError, match="engine"):
        masreplay.credit_dump(dump, tmp_path / "a", metrics=True, engine="spark")
    with pytest.raises(StorageError):
        masreplay.credit_dump(tmp_path / "nothing-here-*.parquet", tmp_path / "a", metrics=True)
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("mine")
    with pytest.raises(StorageError, match="not empty"):
        masreplay.credit_dump(dump, stranger, metrics=True)
    assert (stranger / "notes.txt").read_text() == "mine"
    with pytest.raises(StorageError, match="no credit_dump output"):
        masreplay.read_credit(stranger)


def test_task_id_grouping_and_a_glob_source(tmp_path):
    dump = write_dump(CANONICAL, tmp_path / "dump", seed=6, files=3, row_group=30)
    masreplay.credit_dump(str(dump / "dump-*.parquet"), tmp_path / "out", advantages={}, group_by="task_id",
                          memory_limit=SMALL_MEMORY, progress=False)  # fmt: skip
    traces, _ = masreplay.read_credit(tmp_path / "out")
    batch = masreplay.load_traces(dump)
    want = dict(zip(batch.trace_ids, masreplay.advantages(batch, group_by="task_id", dtype="float64").per_trace, strict=True))
    got = dict(zip(traces["trace_id"].to_pylist(), traces["advantage"].to_pylist(), strict=True))
    assert got == pytest.approx(want, rel=1e-12, abs=0)


def test_duplicate_trace_ids_are_refused(tmp_path):
    dump = tmp_path / "dump"
    dump.mkdir()
    pq.write_table(CANONICAL.slice(0, 10), dump / "a.parquet")
    pq.write_table(CANONICAL.slice(5, 10), dump / "b.parquet")
    with pytest.raises(DataFormatError, match="more than once"):
        masreplay.credit_dump(dump, tmp_path / "out", metrics=True, progress=False)


# ---- invalid traces -------------------------------------------------------------------------


def _with_bad_traces(table: pa.Table) -> tuple[pa.Table, dict[str, str]]:
    """``table`` with three broken traces (a repeated event id, an edge to nowhere, a
    negative token count); returns the JSON pointer each one should be rejected at."""
    rows = table.to_pylist()
    broken = {}
    rows[3]["events"][1]["id"] = rows[3]["events"][0]["id"]
    broken[rows[3]["trace_id"]] = "/events/1/id"
    rows[40]["edges"][0]["dst"] = 10_000
    broken[rows[40]["trace_id"]] = "/edges/0"
    rows[77]["events"][2]["tokens"] = -5
    broken[rows[77]["trace_id"]] = "/events/2/tokens"
    return pa.Table.from_pylist(rows, schema=table.schema), broken


BAD, BROKEN = _with_bad_traces(CANONICAL)


def test_bad_traces_are_skipped_and_listed(tmp_path):
    dump = write_dump(BAD, tmp_path / "dump", seed=8, files=3, row_group=25)
    summary = masreplay.credit_dump(dump, tmp_path / "out", advantages={}, counterfactual=True, on_error="skip",
                                    memory_limit=SMALL_MEMORY, progress=False)  # fmt: skip
    listed = {r["trace_id"]: r for r in summary.rejected}
    assert set(listed) == set(BROKEN)
    for trace_id, pointer in BROKEN.items():
        assert listed[trace_id]["pointer"].startswith(pointer), listed[trace_id]
        assert listed[trace_id]["reason"]
    in_memory = masreplay.load_traces(dump, on_error="skip").rejected
    assert sorted((t, e.path, e.reason) for _, t, e in in_memory) == sorted(
        (r["trace_id"], r["pointer"], r["reason"]) for r in summary.rejected
    )
    manifest = offline.Manifest.read(tmp_path / "out").state
    assert {r["trace_id"] for r in manifest["rejected"]} == set(BROKEN)
    assert summary.traces == BAD.num_rows - len(BROKEN)
    assert_matches_in_memory(tmp_path / "out", dump, {}, True, False)


def test_a_bad_trace_stops_the_job_with_its_id_and_pointer(tmp_path):
    dump = write_dump(BAD, tmp_path / "dump", seed=9, files=2, row_group=25)
    first_bad = next(t for t in pq.read_table(dump)["trace_id"].to_pylist() if t in BROKEN)
    with pytest.raises(TraceValidationError) as caught:
        masreplay.credit_dump(dump, tmp_path / "out", metrics=True, memory_limit=SMALL_MEMORY, progress=False)
    assert caught.value.trace_id == first_bad and caught.value.path.startswith(BROKEN[first_bad])
    with pytest.raises(DataFormatError, match="unfinished"):
        masreplay.read_credit(tmp_path / "out")


# ---- crash safety ------------------------------------------------------------------------------

JOB_OPTIONS = {"advantages": {"normalize_by": "agent"}, "counterfactual": True, "metrics": True, "on_error": "skip",
               "memory_limit": "1MiB", "progress": False}  # fmt: skip
JOB = textwrap.dedent(
    f"""
    import sys
    import masreplay
    print("ready", flush=True)
    masreplay.credit_dump(sys.argv[1], sys.argv[2], **{JOB_OPTIONS!r})
    """
)


def _committed(out: Path) -> int:
    """Parts the manifest of ``out`` has committed so far (-1: no manifest yet)."""
    try:
        return len(offline.Manifest.read(out).state["parts"])
    except (AttributeError, DataFormatError, OSError):
        return -1


def _run_job(dump: Path, out: Path, kill_at: int | None = None) -> bool:
    """Runs the job in a subprocess, SIGKILLed as soon as its manifest has committed
    ``kill_at`` parts (-2: as soon as it starts; -1: once the manifest exists); whether it
    finished on its own."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PYTHON_DIR), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", JOB, str(dump), str(out)], stdout=subprocess.PIPE, env=env, text=True)
    assert child.stdout.readline().strip() == "ready"
    while kill_at is not None and child.poll() is None:
        if kill_at == -2 or _committed(out) >= kill_at:
            child.send_signal(signal.SIGKILL)
            break
        time.sleep(0.001)
    child.wait()
    assert child.returncode in (0, -signal.SIGKILL), child.returncode
    return child.returncode == 0


def _outputs(out: Path) -> dict[str, bytes]:
    files = sorted(p for folder in ("traces", "events") for p in (out / folder).iterdir())
    return {f"{p.parent.name}/{p.name}": p.read_bytes() for p in files}


def test_sigkill_at_any_moment_then_resume_gives_the_uninterrupted_output(tmp_path):
    dump = write_dump(pa.concat_tables([BAD, _renamed(CANONICAL, "copy-")]), tmp_path / "dump", seed=10, files=3, row_group=20)
    reference = tmp_path / "reference"
    assert _run_job(dump, reference)
    want = _outputs(reference)
    want_manifest = offline.Manifest.read(reference).state
    parts = len(want_manifest["parts"])
    assert parts >= 10
    # Kill points: at the start, once the manifest exists, then after 0 .. parts - 1 commits.
    kill_points = [-2, -1, *np.linspace(0, parts - 1, 8).astype(int).tolist()]
    killed_unfinished = 0
    for k, kill_at in enumerate(kill_points):
        out = tmp_path / f"killed-{k}"
        finished = _run_job(dump, out, kill_at)
        if not finished and _committed(out) >= 0:
            killed_unfinished += 1
            with pytest.raises(DataFormatError, match="unfinished"):
                masreplay.read_credit(out)
            if k % 3 == 0:  # killed a second time, while resuming
                _run_job(dump, out, kill_at=_committed(out) + 2)
        summary = masreplay.credit_dump(dump, out, **JOB_OPTIONS)
        assert _outputs(out) == want
        state = offline.Manifest.read(out).state
        assert state["parts"] == want_manifest["parts"] and state["rejected"] == want_manifest["rejected"]
        assert summary.rejected == [{k: r[k] for k in ("trace_id", "pointer", "reason")} for r in state["rejected"]]
        assert not (out / offline.SCRATCH).exists()
        assert not [p for folder in ("traces", "events") for p in (out / folder).iterdir() if p.name.startswith(".")]
    assert killed_unfinished >= 8


def _renamed(table: pa.Table, prefix: str) -> pa.Table:
    rows = table.to_pylist()
    for row in rows:
        row["trace_id"] = prefix + row["trace_id"]
        row["group_id"] = prefix + row["group_id"]
        if row["counterfactual_of"] is not None:
            row["counterfactual_of"]["trace_id"] = prefix + row["counterfactual_of"]["trace_id"]
    return pa.Table.from_pylist(rows, schema=table.schema)


# ---- Ray ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray", reason="the Ray engine needs ray (pip install 'masreplay[ray]')")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_engine_equals_the_local_engine(local_ray, tmp_path):
    dump = write_dump(BAD, tmp_path / "dump", seed=11, files=3, row_group=30)
    options = {"advantages": {"normalize_by": "agent"}, "counterfactual": True, "metrics": True, "on_error": "skip",
               "memory_limit": SMALL_MEMORY, "progress": False}  # fmt: skip
    local = masreplay.credit_dump(dump, tmp_path / "local", **options)
    distributed = masreplay.credit_dump(dump, tmp_path / "ray", engine="ray", workers=2, **options)
    assert distributed.engine == "ray" and distributed.parts == local.parts > 1
    assert distributed.rejected == local.rejected and len(local.rejected) == len(BROKEN)
    assert _outputs(tmp_path / "ray") == _outputs(tmp_path / "local")


def _without(column: str):
    return lambda table: table.drop_columns([column])


# Found by fuzzing: the Ray engine raised pyarrow's ArrowInvalid for a file it could not read
# (the local engine: a StorageError naming it), Ray's RayTaskError with the worker's
# traceback for a table the loader refused, and failed on files whose columns differ (Ray's
# read_parquet unified their schemas into tables the local engine never sees).
BROKEN_FILES = {
    "truncated": lambda path: path.write_bytes(path.read_bytes()[:200]),
    "not Parquet": lambda path: path.write_text("not Parquet"),
    "no rewards column": lambda path: pq.write_table(_without("rewards")(pq.read_table(path)), path),
    "no n_events column": lambda path: pq.write_table(_without("n_events")(pq.read_table(path)), path),
    "no group_id column": lambda path: pq.write_table(_without("group_id")(pq.read_table(path)), path),
}


def test_ray_engine_raises_what_the_local_engine_raises(local_ray, tmp_path):
    for name, damage in BROKEN_FILES.items():
        dump = write_dump(CANONICAL, tmp_path / name / "dump", seed=18, files=3, row_group=40)
        damage(sorted(dump.iterdir())[1])
        outcomes = []
        for engine in ("local", "ray"):
            try:
                summary = masreplay.credit_dump(dump, tmp_path / name / engine, advantages={}, counterfactual=True,
                                                engine=engine, memory_limit=SMALL_MEMORY, progress=False)  # fmt: skip
                outcomes.append(("ok", summary.traces, _outputs(tmp_path / name / engine)))
            except masreplay.MasreplayError as error:
                outcomes.append((type(error), str(error)))
        assert outcomes[0] == outcomes[1], name
        assert "dump-01.parquet" in str(outcomes[0]) or outcomes[0][0] == "ok", outcomes[0]


@pytest.mark.parametrize("engine", ["local", "ray"])
def test_a_dump_of_no_trace_still_has_the_columns(request, tmp_path, engine):
    # Found by fuzzing: no part was written, and read_credit gave two tables of no columns.
    if engine == "ray":
        request.getfixturevalue("local_ray")
    options = {"advantages": {}, "counterfactual": True, "metrics": True, "progress": False}
    full = write_dump(CANONICAL, tmp_path / "full", seed=21, files=1, row_group=100)
    masreplay.credit_dump(full, tmp_path / "full-out", **options)
    empty = tmp_path / "empty"
    empty.mkdir()
    pq.write_table(CANONICAL.slice(0, 0), empty / "a.parquet")
    summary = masreplay.credit_dump(empty, tmp_path / "out", engine=engine, **options)
    assert summary.traces == 0 and summary.parts == 1
    for got, want in zip(masreplay.read_credit(tmp_path / "out"), masreplay.read_credit(tmp_path / "full-out"), strict=True):
        assert got.num_rows == 0 and got.schema == want.schema


def test_a_row_group_spilled_twice_is_in_its_bucket_once(local_ray, tmp_path):
    # Found by reading the Ray engine while fuzzing it: Ray Data runs a row group again when
    # the actor that had it dies, and the spill files were named by actor, so the second run
    # added a second copy of the row group's traces to their buckets (credit over doubled
    # groups, silently). Called here in one process, twice, as a retry would.
    from masreplay import _offline_ray
    from masreplay import _offline_steps as steps

    dump = write_dump(CANONICAL, tmp_path / "dump", seed=23, files=1, row_group=50)
    files = offline.source_files(dump)
    options = offline._options({}, True, False, "group_id", "raise")
    plan = steps.make_plan(steps.plan_keys(files), options, 10**6)
    assert plan.n_buckets == 1
    out = tmp_path / "out"
    for folder in (steps.SCRATCH, "traces", "events"):
        (out / folder).mkdir(parents=True)
    units = pa.Table.from_pylist([{"path": p, "index": i, "start": s} for p, i, s in steps.row_groups(files)])
    spill = _offline_ray._Spill(plan.bucket, str(out / steps.SCRATCH), [], "raise")
    spill(units)
    _offline_ray._Spill(plan.bucket, str(out / steps.SCRATCH), [], "raise")(units.slice(0, 1))  # the retry
    sizes = _offline_ray._Credit(str(out), options)(pa.table({"bucket": [0]}))
    assert sizes["traces"].to_pylist() == [CANONICAL.num_rows] and sizes["raised"].to_pylist() == [None]


def test_ray_engine_without_ray_names_the_package(tmp_path, monkeypatch):
    dump = write_dump(CANONICAL, tmp_path / "dump", seed=12, files=1, row_group=100)
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r"ray.*masreplay\[ray\]"):
        masreplay.credit_dump(dump, tmp_path / "out", metrics=True, engine="ray", progress=False)


# ---- command line ---------------------------------------------------------------------------------


def test_cli_end_to_end(tmp_path):
    dump = write_dump(BAD, tmp_path / "dump", seed=13, files=2, row_group=40)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PYTHON_DIR), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "masreplay.cli", "credit", str(dump), str(tmp_path / "out")]
    flags = ["--estimator", "rloo", "--normalize-by", "agent", "role", "--counterfactual", "--metrics",
             "--memory-limit", "1MiB", "--on-error", "skip", "--quiet"]  # fmt: skip
    done = subprocess.run(command + flags, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    lines: dict[str, str] = {}
    for line in done.stdout.splitlines()[1:]:
        lines.setdefault(line.split()[0], line)  # the summary rows, before the rejected traces
    assert lines["traces"].split()[-1] == str(BAD.num_rows - len(BROKEN))
    assert lines["rejected"].split()[-1] == str(len(BROKEN))
    assert {"seconds", "events/s", "peak"} <= set(lines)
    assert sum(f"rejected trace {t!r}" in done.stdout for t in BROKEN) == len(BROKEN)
    assert done.stderr == ""  # no progress bar when stderr is not a terminal
    assert_matches_in_memory(tmp_path / "out", dump, {"estimator": "rloo", "normalize_by": ["agent", "role"]}, True, True)
    # Another estimator on the same destination is refused; --no-resume starts over.
    refused = subprocess.run([*command, "--quiet"], capture_output=True, text=True, env=env, check=False)
    assert refused.returncode == 1 and "other options" in refused.stderr
    again = subprocess.run(
        [*command, "--no-resume", "--quiet", "--on-error", "skip"], capture_output=True, text=True, env=env, check=False
    )
    assert again.returncode == 0, again.stderr
    assert_matches_in_memory(tmp_path / "out", dump, {}, False, False)


def test_progress_bar_on_a_terminal_only(tmp_path, monkeypatch):
    import io

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    dump = write_dump(CANONICAL, tmp_path / "dump", seed=14, files=2, row_group=40)
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    summary = masreplay.credit_dump(dump, tmp_path / "bar", metrics=True, memory_limit=SMALL_MEMORY)
    assert f"{CANONICAL.num_rows}/{CANONICAL.num_rows}" in terminal.getvalue()
    assert f"{summary.parts}/{summary.parts} parts" in terminal.getvalue() and "events/s" in terminal.getvalue()
    quiet = Terminal()
    monkeypatch.setattr(sys, "stderr", quiet)
    masreplay.credit_dump(dump, tmp_path / "quiet", metrics=True, memory_limit=SMALL_MEMORY, progress=False)
    assert quiet.getvalue() == ""


def test_duckdb_reads_the_output(tmp_path):
    duckdb = pytest.importorskip("duckdb")
    dump = write_dump(CANONICAL, tmp_path / "dump", seed=15, files=2, row_group=40)
    summary = masreplay.credit_dump(
        dump, tmp_path / "out", advantages={}, counterfactual=True, memory_limit=SMALL_MEMORY, progress=False
    )
    events = str(tmp_path / "out" / "events" / "*.parquet")
    credited = "n_branches > 0"
    columns = f"count(*), count(*) FILTER (WHERE {credited}), sum(credit) FILTER (WHERE {credited})"
    query = f"SELECT {columns} FROM read_parquet('{events}')"
    ((count, credited, total),) = duckdb.sql(query).fetchall()
    want = masreplay.counterfactual_credit(masreplay.load_traces(dump))
    mask = want["n_branches"].to_numpy() > 0
    assert count == summary.events and credited == mask.sum() > 0
    assert total == pytest.approx(want["credit"].to_numpy()[mask].sum(), rel=1e-9)


def test_a_trace_without_an_id_is_rejected_before_the_stream(tmp_path):
    schema = CANONICAL.schema.set(0, pa.field("trace_id", pa.string(), nullable=True))
    table = CANONICAL.slice(0, 30).cast(schema)
    table = table.set_column(0, schema.field(0), pa.array([None, *table["trace_id"].to_pylist()[1:]], pa.string()))
    dump = tmp_path / "dump"
    dump.mkdir()
    pq.write_table(table, dump / "a.parquet")
    with pytest.raises(TraceValidationError) as caught:
        masreplay.credit_dump(dump, tmp_path / "raised", metrics=True, progress=False)
    assert caught.value.trace_id is None and caught.value.path == "/trace_id"
    summary = masreplay.credit_dump(dump, tmp_path / "skipped", metrics=True, on_error="skip", progress=False)
    assert summary.rejected == [{"trace_id": None, "pointer": "/trace_id", "reason": "the trace has no trace_id"}]
    assert summary.traces == 29


@pytest.mark.parametrize(
    "stranger",
    [
        pa.table({"trace_id": ["a", "b"], "events": [1, 2]}),  # events that are no list
        pa.table({"trace_id": ["a"], "x": [1]}),  # no events at all
        pa.table({"trace_id": ["a"], "n_events": ["3"]}),  # a text n_events and no events
    ],
)
def test_a_parquet_file_without_an_events_list_in_the_dump_is_named(tmp_path, stranger):
    # Found by fuzzing: pass 1 raised pyarrow's KeyError or ArrowNotImplementedError (a
    # credit_dump output left inside the source folder is such a file).
    dump = write_dump(CANONICAL, tmp_path / "dump", seed=5, files=1, row_group=100)
    pq.write_table(stranger, dump / "stranger.parquet")
    with pytest.raises(DataFormatError, match=r"stranger\.parquet: the dump has no events column"):
        masreplay.credit_dump(dump, tmp_path / "out", metrics=True, progress=False)


def test_a_corrupted_file_is_named_on_one_line(tmp_path):
    # Found by fuzzing: Arrow's thrift error ends in a newline, which split the CLI's one line.
    dump = write_dump(CANONICAL, tmp_path / "dump", seed=20, files=2, row_group=40)
    victim = sorted(dump.iterdir())[0]
    data = bytearray(victim.read_bytes())
    for i in np.random.default_rng(0).integers(100, len(data) - 2000, 40):
        data[i] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(StorageError, match="not a readable Parquet file") as caught:
        masreplay.credit_dump(dump, tmp_path / "out", metrics=True, progress=False)
    assert caught.value.filename == str(victim) and "\n" not in str(caught.value)


def _open_files_under(folder: Path) -> list[str]:
    """Files of ``folder`` this process holds open (Linux)."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed since
            held.append(os.readlink(f"/proc/self/fd/{fd}"))
    return [path for path in held if path.startswith(str(folder))]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files through /proc")
def test_a_failed_run_keeps_no_file_open_through_its_error(tmp_path):
    # A long job that keeps its failures (a report, a logger) held two open files per failed
    # run: the last file read and the one that failed, through the error's traceback.
    dump = write_dump(CANONICAL, tmp_path / "dump", seed=21, files=2, row_group=40)
    (dump / "dump-99.parquet").write_bytes(b"PAR1" + bytes(100) + b"PAR1")
    failures = []
    for _ in range(3):
        with pytest.raises(StorageError, match="not a readable Parquet file") as caught:
            masreplay.credit_dump(dump, tmp_path / "out", metrics=True, progress=False)
        failures.append(caught.value)
    assert _open_files_under(tmp_path) == []


def test_a_file_the_loader_refuses_whole_is_named(tmp_path):
    # Found by fuzzing: a column missing from one file of a dump was "trace None at /rewards:
    # missing required column" with no word of which file.
    dump = write_dump(CANONICAL, tmp_path / "dump", seed=19, files=3, row_group=40)
    victim = sorted(dump.iterdir())[2]
    pq.write_table(pq.read_table(victim).drop_columns(["rewards"]), victim)
    with pytest.raises(TraceValidationError, match=r"missing required column.*dump-02\.parquet") as caught:
        masreplay.credit_dump(dump, tmp_path / "out", metrics=True, on_error="skip", progress=False)
    assert caught.value.trace_id is None and caught.value.path == "/rewards"


@pytest.mark.parametrize("limit", ["1e400", "1e400GB", "9" * 400, 1, 2**20 - 1, 2**63])
def test_a_memory_limit_out_of_range_is_refused_by_name(tmp_path, limit):
    # Found by fuzzing: "1e400" was an OverflowError, and a bare int skipped the 1 MiB floor.
    dump = write_dump(CANONICAL, tmp_path / "dump", seed=5, files=1, row_group=100)
    with pytest.raises(InvalidArgumentError, match="memory_limit"):
        masreplay.credit_dump(dump, tmp_path / "out", metrics=True, memory_limit=limit, progress=False)


# ---- destinations that already hold something ------------------------------------------------


def test_starting_over_on_an_unreadable_input_keeps_the_previous_output(tmp_path):
    # Found by fuzzing: resume=False cleared the finished output before reading the inputs,
    # so a truncated file in the dump lost it. Pass 1 now reads every input first.
    dump = write_dump(CANONICAL, tmp_path / "dump", seed=14, files=2, row_group=50)
    out = tmp_path / "out"
    masreplay.credit_dump(dump, out, metrics=True, memory_limit=SMALL_MEMORY, progress=False)
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    (dump / "zz-truncated.parquet").write_bytes(sorted(dump.iterdir())[0].read_bytes()[:100])
    with pytest.raises(StorageError, match=r"zz-truncated\.parquet"):
        masreplay.credit_dump(dump, out, metrics=True, resume=False, progress=False)
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before
    assert masreplay.read_credit(out)[0].num_rows == CANONICAL.num_rows


@pytest.mark.parametrize(
    ("edit", "pointer"),
    [
        (lambda state: state.pop("inputs"), "/inputs"),
        (lambda state: state["parts"][0].update(part="zero"), "/parts/0/part"),
        (lambda state: state["parts"][1].update(traces=-1), "/parts/1/traces"),
        (lambda state: state["parts"].append(dict(state["parts"][0])), "/parts"),
        (lambda state: state["parts"][0].update(rejected=[{"trace_id": "x"}]), "/parts/0/rejected/0/position"),
        (lambda state: state.update(rejected=None), "/rejected"),
        (lambda state: state.update(complete="yes"), "/complete"),
    ],
)
def test_an_edited_manifest_is_refused_by_its_field(tmp_path, edit, pointer):
    # Found by fuzzing: a manifest missing a key or holding a value of another type raised
    # KeyError or TypeError from deep inside a resume or read_credit.
    dump = write_dump(CANONICAL, tmp_path / "dump", seed=15, files=1, row_group=100)
    out = tmp_path / "out"
    masreplay.credit_dump(dump, out, metrics=True, memory_limit=SMALL_MEMORY, progress=False)
    state = offline.Manifest.read(out).state
    edit(state)
    (out / "_manifest.json").write_text(json.dumps(state))
    for call in (lambda: masreplay.credit_dump(dump, out, metrics=True, progress=False), lambda: masreplay.read_credit(out)):
        with pytest.raises(DataFormatError, match=f"_manifest.json: {pointer}"):
            call()
    # It is still ours: starting over is allowed.
    masreplay.credit_dump(dump, out, metrics=True, resume=False, progress=False)
    assert masreplay.read_credit(out)[0].num_rows == CANONICAL.num_rows


def test_a_file_where_a_folder_of_parts_goes_is_a_storage_error(tmp_path):
    # Found by fuzzing: FileExistsError from pathlib's mkdir.
    dump = write_dump(CANONICAL, tmp_path / "dump", seed=16, files=1, row_group=100)
    out = tmp_path / "out"
    masreplay.credit_dump(dump, out, metrics=True, memory_limit=SMALL_MEMORY, progress=False)
    state = offline.Manifest.read(out).state
    state["complete"], state["parts"] = False, []
    (out / "_manifest.json").write_text(json.dumps(state))
    shutil.rmtree(out / "traces")
    (out / "traces").write_text("in the way")
    with pytest.raises(StorageError, match="cannot prepare the output") as caught:
        masreplay.credit_dump(dump, out, metrics=True, progress=False)
    assert caught.value.filename.endswith("traces")


def test_a_full_disk_is_a_storage_error_and_the_run_resumes(tmp_path, monkeypatch):
    # Seen while fuzzing (a full disk, simulated): pyarrow's OSError came out as it was.
    dump = write_dump(CANONICAL, tmp_path / "dump", seed=22, files=2, row_group=30)
    options = {"metrics": True, "memory_limit": SMALL_MEMORY, "progress": False}
    masreplay.credit_dump(dump, tmp_path / "reference", **options)
    write, calls = pq.write_table, []

    def full_disk(table, where, **kwargs):
        calls.append(where)
        if len(calls) == 5:
            raise OSError(28, "No space left on device")
        write(table, where, **kwargs)

    monkeypatch.setattr(pq, "write_table", full_disk)
    with pytest.raises(StorageError, match=r"cannot write the output \(No space left on device\)") as caught:
        masreplay.credit_dump(dump, tmp_path / "out", **options)
    assert caught.value.errno == 28 and "part-" in caught.value.filename
    assert not list((tmp_path / "out").rglob(".*.tmp"))
    monkeypatch.undo()
    masreplay.credit_dump(dump, tmp_path / "out", **options)
    assert _outputs(tmp_path / "out") == _outputs(tmp_path / "reference")


@pytest.mark.parametrize("resume", [True, False])
def test_an_output_inside_the_folder_it_reads_is_not_read_back(tmp_path, resume):
    # Found by fuzzing: the second run read the first run's parts as part of the dump ("the
    # inputs changed" on a resume; an unreadable part when starting over).
    dump = write_dump(CANONICAL, tmp_path / "dump", seed=17, files=2, row_group=50)
    out = dump / "credit"
    first = masreplay.credit_dump(dump, out, metrics=True, memory_limit=SMALL_MEMORY, progress=False)
    again = masreplay.credit_dump(dump, out, metrics=True, memory_limit=SMALL_MEMORY, resume=resume, progress=False)
    assert again.traces == first.traces == CANONICAL.num_rows
    assert again.resumed_parts == (first.parts if resume else 0)
