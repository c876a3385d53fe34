"""masreplay.sim: seeded synthetic traces that are valid, grouped, deterministic, and scale."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import masreplay
from masreplay.demo import SIM_GROUPS, bundled
from masreplay.sim import generate
from strategies import derived_columns

DERIVED = ("n_events", "n_edges", "n_agents", "depth", "max_branching")


def content(batch: masreplay.TraceBatch) -> list[tuple]:
    """What the traces are, leaving out their names (trace and task ids carry the seed)."""
    return [
        (
            [(e["t"], e["type"], e["agent"], e.get("tokens")) for e in trace["events"]],
            [(e["src"], e["dst"], e["type"]) for e in trace["edges"]],
            trace["rewards"],
        )
        for trace in batch
    ]


def test_same_seed_same_traces():
    first = generate(8, agents=(2, 6), seed=3)
    second = generate(8, agents=(2, 6), seed=3)
    assert first.to_arrow().equals(second.to_arrow())
    assert list(first) == list(second)


def test_different_seeds_differ():
    first, second = generate(8, seed=3), generate(8, seed=4)
    assert first.trace_ids != second.trace_ids
    assert content(first) != content(second)


def test_traces_do_not_depend_on_how_many_are_generated():
    """Each trace has its own random stream, so a longer run starts with the shorter one."""
    short, long = generate(5, seed=21), generate(11, seed=21)
    assert list(short) == list(long[:5])


def test_same_traces_at_any_thread_count():
    script = (
        "import hashlib, masreplay;"
        "t = masreplay.sim.generate(24, agents=(3, 9), depth=2, seed=5);"
        "print(hashlib.sha256(repr(list(t)).encode()).hexdigest())"
    )
    digests = set()
    for threads in ("1", "2", "4"):
        env = dict(os.environ, RAYON_NUM_THREADS=threads)
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        digests.add(out.stdout.strip())
    assert len(digests) == 1


@pytest.mark.parametrize(("n_traces", "group_size"), [(10, 4), (8, 1), (6, 6), (5, 8)])
def test_group_structure(n_traces, group_size):
    batch = generate(n_traces, group_size=group_size, seed=1)
    table = batch.to_arrow()
    task_ids = table.column("task_id").to_pylist()
    group_ids = table.column("group_id").to_pylist()
    assert group_ids == task_ids
    groups = [task_ids[start : start + group_size] for start in range(0, n_traces, group_size)]
    for group in groups:
        assert len(set(group)) == 1
    firsts = [group[0] for group in groups]
    assert len(set(firsts)) == len(firsts)
    assert Counter(task_ids) == Counter({g[0]: len(g) for g in groups})
    assert len(set(batch.trace_ids)) == n_traces


@settings(max_examples=15)
@given(
    n_traces=st.integers(min_value=1, max_value=6),
    agents=st.tuples(st.integers(1, 6), st.integers(0, 6)).map(lambda p: (p[0], p[0] + p[1])),
    depth=st.integers(min_value=1, max_value=4),
    fan_out=st.tuples(st.integers(1, 3), st.integers(0, 3)).map(lambda p: (p[0], p[0] + p[1])),
    events_per_agent=st.tuples(st.integers(0, 5), st.integers(0, 5)).map(lambda p: (p[0], p[0] + p[1])),
    seed=st.integers(min_value=0, max_value=2**64 - 1),
)
def test_every_simulated_trace_is_valid(n_traces, agents, depth, fan_out, events_per_agent, seed):
    batch = generate(n_traces, agents=agents, depth=depth, fan_out=fan_out, events_per_agent=events_per_agent, seed=seed)
    assert len(batch) == n_traces
    again = masreplay.load_traces(batch.to_arrow())
    assert again.rejected == []
    assert again.to_arrow().equals(batch.to_arrow())
    # The JSON rules accept them too, and the derived columns match an independent count.
    dicts = list(batch)
    assert list(masreplay.load_traces(dicts, strict_seed=False)) == dicts
    assert batch.to_arrow().select(list(DERIVED)).to_pylist() == [derived_columns(t) for t in dicts]
    for trace in dicts:
        spawns = [e for e in trace["events"] if e["type"] == "spawn"]
        assert agents[0] <= len(spawns) <= agents[1]
        times = [e["t"] for e in trace["events"]]
        assert times == sorted(times)


def test_simulated_traces_satisfy_the_seed_schema(seed_validator):
    batch = generate(6, agents=(2, 8), depth=2, seed=9)
    for i in range(len(batch)):
        seed_validator.validate(batch.to_seed_json(i))


def test_kimi_scale():
    batch = generate(1, agents=300, events_per_agent=(10, 14), seed=0)
    [trace] = list(batch)
    spawned = {e["to"] for e in trace["events"] if e["type"] == "spawn"}
    assert len(spawned) == 300
    n_events = batch.to_arrow().column("n_events")[0].as_py()
    assert n_events >= 3000
    assert n_events == len(trace["events"]) == batch.num_events
    n_agents = batch.to_arrow().column("n_agents")[0].as_py()
    assert 250 <= n_agents <= 301  # idle workers never act; the orchestrator does
    assert masreplay.load_traces(batch.to_arrow()).rejected == []


def test_depth_one_is_centralised():
    for trace in generate(6, agents=(3, 8), depth=1, seed=2):
        assert trace["topology"] == "centralized"
        spawners = {e["agent"] for e in trace["events"] if e["type"] == "spawn"}
        assert spawners == {"orchestrator"}


def test_deeper_runs_nest_their_spawns():
    batch = generate(8, agents=(10, 16), depth=3, fan_out=(1, 3), seed=4)
    nested = 0
    for trace in batch:
        assert trace["topology"] == "hierarchical"
        spawn_by = {e["to"]: e["agent"] for e in trace["events"] if e["type"] == "spawn"}
        for parent in spawn_by.values():
            level = 1
            while parent != "orchestrator":
                parent = spawn_by[parent]
                level += 1
            assert level <= 3
            nested += level > 1
    assert nested > 0, "depth=3 never produced a sub-agent spawned by a worker"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"agents": 0},
        {"agents": (4, 2)},
        {"fan_out": 0},
        {"fan_out": (3, 1)},
        {"events_per_agent": (5, 2)},
        {"depth": 0},
        {"group_size": 0},
        {"n_traces": -1},
        {"seed": -1},
        {"agents": (-1, 3)},
        {"seed": 2**64},
    ],
    ids=repr,
)
def test_bad_arguments_raise_invalid_argument_error(kwargs):
    arguments = {"n_traces": 2, **kwargs}
    with pytest.raises(masreplay.InvalidArgumentError) as info:
        generate(**arguments)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, masreplay.MasreplayError)
    name = next(iter(kwargs))
    assert name in str(info.value)


def test_degenerate_but_valid_arguments():
    assert len(generate(0)) == 0
    quiet = generate(3, agents=1, events_per_agent=0, fan_out=1, seed=8)
    assert len(quiet) == 3
    assert masreplay.load_traces(quiet.to_arrow()).rejected == []


def test_bundled_sim_groups_match_the_generator():
    path = bundled(SIM_GROUPS)
    if not path.is_file():
        pytest.fail(
            f"the bundled dataset {path} is missing: it must hold masreplay.sim.generate(32, group_size=4, seed=7) as JSON Lines",
            pytrace=False,
        )
    loaded = masreplay.load_traces(path)
    expected = generate(32, group_size=4, seed=7)
    assert loaded.rejected == []
    assert loaded.trace_ids == expected.trace_ids
    assert list(loaded) == list(expected)
    for name in (*DERIVED, "task_id", "group_id"):
        assert loaded.to_arrow().column(name).to_pylist() == expected.to_arrow().column(name).to_pylist(), name
    # It is JSON Lines: one trace per line.
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(lines) == 32


def test_generate_tags_the_policy_version():
    plain = masreplay.sim.generate(6, seed=4)
    tagged = masreplay.sim.generate(6, seed=4, policy_version=7)
    assert tagged.to_arrow()["policy_version"].to_pylist() == [7] * 6
    assert plain.to_arrow()["policy_version"].to_pylist() == [0] * 6
    assert tagged.to_arrow().drop_columns(["policy_version"]).equals(plain.to_arrow().drop_columns(["policy_version"]))
    with pytest.raises(masreplay.InvalidArgumentError, match="policy_version"):
        masreplay.sim.generate(2, policy_version=-1)


def in_four_gigabytes(code: str) -> subprocess.CompletedProcess:
    """Runs `code` (with masreplay imported) in a child held to 4 GB of address space, so that
    a request for terabytes fails there, quickly, and not on the machine."""
    limit = "import resource, masreplay\nresource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))\n"
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(masreplay.__file__))}
    return subprocess.run([sys.executable, "-c", limit + code], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize(
    "call",
    [
        "generate(1, events_per_agent=2**40)",
        "generate(1, agents=2**40)",
        "generate(1, agents=100_000, events_per_agent=100_000)",
        "branches(1, branches=2**31 - 1)",
    ],
)
def test_a_request_for_more_events_than_a_batch_holds_is_refused(call):
    # Found by fuzzing: a small input asked for terabytes, and the process aborted (or ran
    # for ever).
    done = in_four_gigabytes(
        f"try:\n    masreplay.sim.{call}\nexcept masreplay.InvalidArgumentError as error:\n    print(error)\n"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "beyond the 2^31 - 1 one batch holds" in done.stdout


def test_more_branch_points_than_events_give_one_per_event():
    # Found by fuzzing: branch_points=2**31 - 1 reserved room for that many points (34 GB).
    done = in_four_gigabytes(
        "truth = masreplay.sim.branches(1, agents=(1, 3), branches=1, branch_points=2**31 - 1)\n"
        "print(len(truth.effects), truth.batch.num_events)\n"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    points, events = map(int, done.stdout.split())
    assert 1 <= points <= events
