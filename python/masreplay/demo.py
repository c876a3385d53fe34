"""``masreplay demo``: the main job on the bundled data, narrated. It grows as capabilities land."""

from __future__ import annotations

import copy
import tempfile
import time
from importlib import resources
from pathlib import Path

import numpy as np
import pyarrow as pa

from masreplay import rewards
from masreplay._text import print_table, stats_table
from masreplay.advantages import advantages
from masreplay.batch import TraceBatch
from masreplay.buffer import GraphBuffer
from masreplay.counterfactual import counterfactual_credit
from masreplay.errors import TraceValidationError
from masreplay.io import load_traces
from masreplay.orchestration import metrics
from masreplay.report import band_summary
from masreplay.shapley import trace_players, trace_shapley
from masreplay.sim import branches, generate

SEED_EXAMPLE = "seed_example_trace.json"
SIM_GROUPS = "sim_groups.jsonl"


def bundled(name: str) -> Path:
    """Path of a file shipped in masreplay/data."""
    return Path(str(resources.files("masreplay") / "data" / name))


def _step(title: str) -> None:
    print(f"\n== {title}")


def run() -> int:
    """The steps in order; each prints its title, does one thing and says what came out."""
    trace = _seed_example()
    batch = _grpo_groups()
    _arrow_layout(batch)
    _parquet_round_trip(batch)
    _seed_export(batch)
    _precise_errors(trace)
    buffer = _graph_buffer(batch)
    _metrics_per_band(batch)
    _group_advantages(buffer)
    _branch_credit()
    _shapley_credit(buffer)
    return 0


def _seed_example() -> dict:
    _step("1. ingest the seed schema's example trace (JSON parsed and validated in Rust)")
    seed = load_traces(bundled(SEED_EXAMPLE))
    trace = seed[0]
    print(
        f"  {seed!r}: trace {trace['trace_id']!r}, {len(trace['events'])} events, "
        f"{len(trace['edges'])} edges, rewards {trace['rewards']}"
    )
    return trace


def _grpo_groups() -> TraceBatch:
    _step("2. ingest the bundled synthetic GRPO groups (JSON Lines)")
    print("  (a GRPO group: several rollouts of the same task; each is scored against the group's mean reward)")
    started = time.perf_counter()
    batch = load_traces(bundled(SIM_GROUPS))
    print(f"  loaded {batch!r} in {1e3 * (time.perf_counter() - started):.1f} ms")
    print_table(stats_table(batch), values="left")
    return batch


def _arrow_layout(batch: TraceBatch) -> None:
    _step("3. the canonical Arrow layout, shared with pyarrow and Polars without copying")
    table = pa.table(batch)
    print(f"  pyarrow: {table.num_rows} rows x {table.num_columns} columns: {', '.join(table.column_names)}")
    events = batch.events()
    print(f"  events(): {events.num_rows} rows, columns {', '.join(events.column_names[:6])}, ...")
    print(f"  event_offsets[:5] = {batch.event_offsets[:5].tolist()} (CSR: trace i owns rows offsets[i]:offsets[i+1])")
    try:
        frame = batch.to_polars()
        print(f"  polars: DataFrame of shape {frame.shape}")
    except ImportError:
        print("  polars: not installed (pip install polars) - skipped")


def _parquet_round_trip(batch: TraceBatch) -> None:
    _step("4. Parquet round trip")
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "traces.parquet"
        batch.write_parquet(path)
        again = load_traces(path)
        same = again.to_arrow().equals(batch.to_arrow())
        print(f"  wrote {path.stat().st_size / 1024:.1f} KiB, read back {again!r}, identical: {same}")


def _seed_export(batch: TraceBatch) -> None:
    _step("5. export back to the seed schema (strict: top-level additions dropped)")
    exported = batch.to_seed_json(0)
    print(f"  trace {exported['trace_id']!r}: keys {sorted(exported)}")


def _precise_errors(trace: dict) -> None:
    _step("6. bad input gets a precise error, and nothing is half-loaded")
    broken = copy.deepcopy(trace)
    broken["events"][3]["type"] = "telepathy"
    try:
        load_traces(broken)
    except TraceValidationError as error:
        print(f"  TraceValidationError: trace_id={error.trace_id!r} path={error.path!r}")
        print(f"    reason: {error.reason}")


def _graph_buffer(batch: TraceBatch) -> GraphBuffer:
    _step("7. a GraphBuffer: fill it, sample traces and whole GRPO groups, save and resume")
    buffer = GraphBuffer(24, seed=0)
    buffer.add(batch)
    print(f"  added {len(batch)} traces to a buffer of capacity 24: {buffer!r} (the 8 oldest evicted whole)")
    sample = buffer.sample(8, seed=1)
    print(f"  sample(8): {sample!r}, flat events + offsets {sample.event_offsets.tolist()}")
    values, mask, _ = sample.padded("tokens")
    print(f"  padded('tokens') for trainers that need it: values {values.shape}, mask {mask.sum()} real events")
    groups = buffer.sample_groups(2, group_size=4, seed=2)
    print(f"  sample_groups(2, group_size=4): group ids {sorted(set(groups.to_arrow()['group_id'].to_pylist()))}")
    trace_id = buffer.to_batch().trace_ids[0]
    buffer.update_priorities([trace_id], [10.0])
    prioritized = buffer.sample(8, sampler="prioritized", seed=3)
    print(f"  prioritized after raising {trace_id!r} to 10: drawn {prioritized.trace_ids.count(trace_id)} of 8 times")
    print(f"  descendants of e1 in {trace_id!r}: {buffer.descendants(trace_id, 'e1')[:6]} ...")
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "buffer.parquet"
        buffer.save(path)
        resumed = GraphBuffer.load(path)
        same = resumed.sample(8).trace_ids == buffer.sample(8).trace_ids
        print(f"  saved and loaded {resumed!r}; the next samples agree: {same}")
    return buffer


def _metrics_per_band(batch: TraceBatch) -> None:
    _step("8. orchestration metrics per trace-length band (critical steps, finish rate, overheads)")
    print("  (critical steps, Kimi PARL's latency measure: per stage, the orchestrator's own steps plus only the")
    print("   slowest of the sub-agents it spawned; finish rate: the share of spawned sub-agents that returned)")
    wider = TraceBatch.concat([batch, generate(8, agents=(20, 80), seed=8)])
    print(f"  the {len(batch)} bundled traces plus 8 larger ones simulated here (masreplay.sim.generate, 20-80 agents)")
    print("  so that more than one trace-length band shows")
    table = metrics(wider)
    print(f"  metrics(): {table.num_rows} rows, columns {', '.join(table.column_names[:8])}, ...")
    print_table(band_summary(table))
    reward = rewards.parl(batch, lambda_parallel=0.3, lambda_finish=0.2)
    print(f"  PARL reward r_perf + 0.3 r_parallel + 0.2 r_finish, first traces: {reward[:4].round(3).tolist()}")


def _group_advantages(buffer: GraphBuffer) -> None:
    _step("9. advantages for a sampled GRPO group: plain GRPO vs agent-wise (Dr. MAS) normalisation")
    print("  (agent-wise: each agent's rewards are normalised against the same agent in the other rollouts")
    print("   of the group, not against the whole team, so a busy agent does not drown a quiet one)")
    group = buffer.sample_groups(1, group_size=4, seed=4)
    plain = advantages(group)
    agent_wise = advantages(group, normalize_by="agent", unit="events")
    team = pa.table(group)["rewards"].to_pylist()
    print(f"  group {group.to_arrow()['group_id'][0].as_py()!r}: {len(group)} traces, {group.num_events} events")
    print(f"  {'trace':<16} {'team':>6} {'grpo':>8} {'agent-wise (mean over events)':>31}")
    for i, trace_id in enumerate(group.trace_ids):
        reward_of = dict(team[i]).get("team", float("nan"))
        print(f"  {trace_id:<16} {reward_of:6.3f} {plain.per_trace[i]:8.3f} {agent_wise.per_trace[i]:31.3f}")
    events = group.events()
    first = slice(int(group.event_offsets[0]), int(group.event_offsets[1]))
    agents = events["agent"].to_pylist()[first]
    per_agent: dict[str, float] = {}
    for agent, value in zip(agents, agent_wise.per_event[first], strict=True):
        per_agent.setdefault(agent, float(value))
    print(
        f"  first trace, agent-wise advantage of each agent's first step: "
        f"{ {agent: round(value, 3) for agent, value in per_agent.items()} }"
    )
    print(f"  loss weights (1/traces x 1/agents x token share) of the first trace sum to {plain.weights[first].sum():.3f}")


def _branch_credit() -> None:
    _step("10. counterfactual credit from branch rollouts, checked against the simulator's ground truth")
    truth = branches(50, branches=8, branch_points=3, noise=0.1, seed=9)
    credit = counterfactual_credit(truth.batch, aligned=False)
    print(f"  {truth.batch!r}: 50 factual traces, {credit.num_rows} branched events, 8 rollouts each")
    effects = {(r["trace_id"], r["event_id"]): r for r in truth.effects.to_pylist()}
    for row in credit.slice(0, 3).to_pylist():
        true = effects[(str(row["trace_id"]), row["event_id"])]
        print(
            f"  {row['event_id']} ({true['kind']}) of {str(row['trace_id'])!r}: credit {row['credit']:+.3f} "
            f"+- {row['stderr']:.3f}, true effect {true['effect']:+.3f}"
        )
    errors = np.array([row["credit"] - effects[(str(row["trace_id"]), row["event_id"])]["effect"] for row in credit.to_pylist()])
    within = np.mean(np.abs(errors) <= 3 * credit["stderr"].to_numpy())
    print(f"  {within:.0%} of the estimates lie within 3 standard errors of the true effects")


def _shapley_credit(buffer: GraphBuffer) -> None:
    _step("11. Shapley credit per agent on a sampled trace (spawn-tree aware)")
    print("  (Shapley value: an agent's average marginal contribution over orders of joining the team;")
    print("   precedence Shapley only counts orders where a sub-agent joins after the agent that spawned it)")
    _shapley_demo(buffer.sample(1, seed=5))


def _shapley_demo(picked: TraceBatch) -> None:
    """Credits the agents of one trace under a value with synergy: the team reward is earned
    only with the orchestrator, in proportion to the process reward of the agents present."""
    trace = picked[0]
    players = trace_players(picked).to_pylist()
    labels = [p["label"] for p in players]
    worth = np.zeros(len(labels))
    for event in trace["events"]:
        if event["agent"] in labels and event.get("reward"):
            worth[labels.index(event["agent"])] += event["reward"].get("process", 0.0)
    team = trace["rewards"].get("team", 1.0)
    worth = worth if worth.sum() > 0 else np.ones(len(labels))

    def value(trace_index, masks):
        present = masks[:, : len(labels)]
        return present[:, 0] * team * (present @ worth) / worth.sum()

    print(
        f"  trace {trace['trace_id']!r}: {len(labels)} agents, team reward {team:.3f}; "
        "v(S) = team * [orchestrator in S] * process share of S"
    )
    started = time.perf_counter()
    kinds = {
        "precedence": trace_shapley(picked, value),
        "permission": trace_shapley(picked, value, method="permission"),
        "plain": trace_shapley(picked, value, respect_spawn_tree=False),
    }
    elapsed = time.perf_counter() - started
    # Rounding-size residues of the efficiency projection would print as -0.000.
    values = {name: np.round(credit.players["value"].to_numpy(), 12) + 0.0 for name, credit in kinds.items()}
    print(f"  {'agent':<14} {'spawned by':<14} {'events':>6} {'precedence':>11} {'permission':>11} {'plain':>8}")
    for i, player in enumerate(players):
        parent = labels[player["parent"]] if player["parent"] >= 0 else "-"
        print(
            f"  {player['label']:<14} {parent:<14} {player['n_events']:>6} "
            + " ".join(f"{values[name][i]:>{w}.3f}" for name, w in (("precedence", 11), ("permission", 11), ("plain", 8)))
        )
    print(
        f"  each column sums to v(N) - v(empty) = {values['precedence'].sum():.3f}; "
        f"method {kinds['precedence'].methods[0]!r} (exact: every coalition respecting the spawn tree), "
        f"3 runs in {1e3 * elapsed:.1f} ms"
    )
    credit = kinds["precedence"].credit
    print(f"  per-event credit aligned with batch.events(): {len(credit)} rows, first {(np.round(credit[:5], 3) + 0.0).tolist()}")
