"""The installed ``masreplay`` console script."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys

import pytest

import masreplay
from masreplay.demo import SEED_EXAMPLE, bundled


@pytest.fixture(scope="module")
def script() -> str:
    path = shutil.which("masreplay")
    if path is None:
        pytest.fail("the masreplay console script is not on PATH; install the package (pip install -e .)", pytrace=False)
    return path


def run(script: str, *args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([script, *map(str, args)], capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.fixture
def traces_jsonl(tmp_path, seed_example):
    """Four traces as JSON Lines; the third has an unknown event type."""
    items = [dict(copy.deepcopy(seed_example), trace_id=f"t{i}") for i in range(4)]
    items[2]["events"][3]["type"] = "telepathy"
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in items) + "\n", encoding="utf-8")
    return path


def test_validate_valid_files(script, tmp_path, seed_example):
    many = tmp_path / "many.jsonl"
    many.write_text("\n".join(json.dumps(dict(seed_example, trace_id=f"m{i}")) for i in range(3)), encoding="utf-8")
    seed = bundled(SEED_EXAMPLE)
    result = run(script, "validate", seed, many)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines == [
        f"{seed}: valid trace 'demo-trace-001'",
        f"{many}: valid trace 'm0'",
        f"{many}: valid trace 'm1'",
        f"{many}: valid trace 'm2'",
    ]


def test_validate_reports_the_invalid_trace_among_valid_ones(script, traces_jsonl):
    result = run(script, "validate", traces_jsonl)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert len(lines) == 4, result.stdout
    assert lines[0] == f"{traces_jsonl}: valid trace 't0'"
    assert lines[1] == f"{traces_jsonl}: valid trace 't1'"
    assert lines[3] == f"{traces_jsonl}: valid trace 't3'"
    invalid = lines[2]
    assert invalid.startswith(f"{traces_jsonl}: INVALID")
    assert "'t2'" in invalid
    assert "/events/3/type" in invalid
    assert 'unknown value "telepathy"' in invalid


def test_validate_fails_when_any_file_fails(script, traces_jsonl, seed_example, tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(seed_example), encoding="utf-8")
    result = run(script, "validate", good, traces_jsonl)
    assert result.returncode == 1
    assert result.stdout.splitlines()[0] == f"{good}: valid trace 'demo-trace-001'"


def test_validate_unreadable_inputs(script, tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('{"trace_id": "x", ', encoding="utf-8")
    missing = tmp_path / "missing.json"
    result = run(script, "validate", broken, missing)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"{broken}: INVALID") and "invalid JSON" in lines[0]
    assert lines[1].startswith(f"{missing}: INVALID") and "No such file" in lines[1]
    assert "Traceback" not in result.stderr


def test_validate_strict_seed(script, tmp_path, seed_example):
    path = tmp_path / "grouped.json"
    path.write_text(json.dumps(dict(seed_example, group_id="g")), encoding="utf-8")
    assert run(script, "validate", path).returncode == 0
    strict = run(script, "validate", "--strict-seed", path)
    assert strict.returncode == 1
    assert "/group_id" in strict.stdout and "unknown top-level key" in strict.stdout


def _stats(stdout: str) -> dict[str, str]:
    rows = {}
    for line in stdout.splitlines()[1:]:
        name, _, value = line.strip().partition("  ")
        rows[name.strip()] = value.strip()
    return rows


def test_stats_of_the_seed_example(script):
    path = bundled(SEED_EXAMPLE)
    result = run(script, "stats", path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == f"{path}:"
    rows = _stats(result.stdout)
    assert rows["traces"] == "1"
    assert rows["events"] == "8"
    assert rows["edges"] == "8"
    assert rows["n_agents min/mean/max"] == "3 / 3.0 / 3"
    assert rows["depth min/mean/max"] == "6 / 6.0 / 6"
    assert rows["max_branching min/mean/max"] == "2 / 2.0 / 2"
    types = {name.removeprefix("events of type "): int(v) for name, v in rows.items() if name.startswith("events of")}
    assert types == {
        "orchestrator_decision": 1,
        "spawn": 2,
        "message": 1,
        "tool_call": 1,
        "tool_result": 1,
        "return": 1,
        "aggregate": 1,
    }


def test_stats_of_a_parquet_file_matches_the_batch(script, tmp_path):
    batch = masreplay.sim.generate(10, agents=(2, 6), group_size=5, seed=13)
    path = tmp_path / "sim.parquet"
    batch.write_parquet(path)
    result = run(script, "stats", path)
    assert result.returncode == 0, result.stderr
    rows = _stats(result.stdout)
    assert rows["traces"] == "10"
    assert rows["events"] == str(batch.num_events)
    assert rows["edges"] == str(int(batch.edge_offsets[-1]))
    assert rows["groups"] == "2"
    depth = batch.to_arrow().column("depth").to_pylist()
    low, mean, high = (float(x) for x in rows["depth min/mean/max"].split(" / "))
    assert (low, high) == (min(depth), max(depth))
    assert mean == pytest.approx(sum(depth) / len(depth), abs=0.05)
    counts = {}
    for kind in batch.events().column("type").to_pylist():
        counts[kind] = counts.get(kind, 0) + 1
    types = {name.removeprefix("events of type "): int(v) for name, v in rows.items() if name.startswith("events of")}
    assert types == counts
    assert list(types.values()) == sorted(types.values(), reverse=True)


def test_stats_of_an_invalid_file_fails(script, traces_jsonl):
    result = run(script, "stats", traces_jsonl)
    assert result.returncode == 1
    assert "/events/3/type" in result.stderr
    assert "Traceback" not in result.stderr


def test_demo(script, tmp_path):
    result = run(script, "demo", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    steps = re.findall(r"^== (\d+)\.", result.stdout, flags=re.MULTILINE)
    assert steps[:6] == ["1", "2", "3", "4", "5", "6"]
    assert "identical: True" in result.stdout
    assert "path='/events/3/type'" in result.stdout
    assert "Traceback" not in result.stderr


def test_module_entry_point_matches_the_script(script):
    path = bundled(SEED_EXAMPLE)
    via_module = subprocess.run(
        [sys.executable, "-m", "masreplay.cli", "validate", str(path)], capture_output=True, text=True, timeout=120
    )
    assert via_module.returncode == 0
    assert via_module.stdout == run(script, "validate", path).stdout


def test_usage_errors_exit_2(script):
    assert run(script).returncode == 2
    assert run(script, "validate").returncode == 2
    assert run(script, "frobnicate").returncode == 2


def test_version(script):
    done = run(script, "--version")
    assert done.returncode == 0
    assert re.fullmatch(r"masreplay \d+\.\d+\.\d+\S*\n", done.stdout)


def test_every_command_explains_itself(script):
    top = run(script, "--help").stdout
    assert "``" not in top
    for command in ("validate", "stats", "convert", "report", "demo"):
        assert command in top
        text = run(script, command, "--help").stdout
        _usage, _, rest = text.partition("\n\n")
        assert rest.strip(), f"{command} --help has no description"
        assert "``" not in text
        positional = rest.split("positional arguments:")[-1].split("options:")[0] if "positional arguments:" in rest else ""
        for line in positional.splitlines()[1:]:
            if line.strip() and not line.startswith("      "):
                assert len(line.split()) > 1, f"{command}: argument without help: {line!r}"
