"""Hypothesis strategies for orchestration traces, and independent reference computations.

``traces()`` draws VALID trace dicts (valid for masreplay's default, non-strict mode; with
``masreplay_fields=False`` and ``extra_top_level=False`` also valid for the seed JSON Schema
and for ``strict_seed=True``). The helpers below compute what masreplay should give back for a
trace without using masreplay: the exported dict and the derived graph columns.
"""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import strategies as st

EVENT_TYPES = (
    "orchestrator_decision",
    "spawn",
    "despawn",
    "message",
    "tool_call",
    "tool_result",
    "return",
    "aggregate",
    "human_intervention",
    "safety_event",
)
EDGE_TYPES = ("temporal", "causal", "spawn", "message", "tool_dependency", "return", "aggregate", "safety_flow")
TOPOLOGIES = (
    "centralized",
    "planner_executor_critic",
    "debate",
    "swarm",
    "hierarchical",
    "harness",
    "mixed",
    "unknown",
)
COUNTERFACTUAL_KINDS = ("substitute", "ablate", "no_spawn")

# The canonical table's columns in order, and those an Arrow input must bring (the rest are
# optional or derived).
CANONICAL_COLUMNS = [
    "trace_id",
    "task_id",
    "group_id",
    "system",
    "topology",
    "policy_version",
    "counterfactual_of",
    "events",
    "edges",
    "rewards",
    "costs",
    "metrics",
    "attributes",
    "n_events",
    "n_edges",
    "n_agents",
    "depth",
    "max_branching",
]
REQUIRED_COLUMNS = ("trace_id", "task_id", "events", "edges", "rewards", "costs")

SEED_TOP_LEVEL_KEYS = frozenset({"trace_id", "task_id", "system", "topology", "events", "edges", "rewards", "costs", "metrics"})
MASREPLAY_TOP_LEVEL_KEYS = frozenset({"schema_version", "group_id", "policy_version", "counterfactual_of"})
EVENT_KEYS = frozenset(
    {
        "id",
        "t",
        "type",
        "agent",
        "role",
        "from",
        "to",
        "tool",
        "content_ref",
        "trusted",
        "reward",
        "tokens",
        "duration_s",
        "logprob",
    }
)
COST_KEYS = frozenset({"tokens", "wall_clock_s", "tool_calls", "messages"})

# ---- building blocks -------------------------------------------------------------------

# Any Unicode scalar value: lone surrogates cannot be encoded as UTF-8, so they are not text.
_characters = st.characters(exclude_categories=("Cs",))
# Mostly short ASCII-ish names with a good share of arbitrary Unicode (and '/' and '~', which
# JSON pointers must escape).
_name_characters = st.one_of(st.sampled_from("abcxyz_-/~.0123 "), _characters)

non_empty_text = st.text(_name_characters, min_size=1, max_size=10)
any_text = st.text(_name_characters, max_size=10)
map_keys = st.text(_name_characters, max_size=8)

finite_floats = st.floats(allow_nan=False, allow_infinity=False)
non_negative_floats = st.floats(min_value=0.0, allow_nan=False, allow_infinity=False)
non_positive_floats = st.floats(max_value=0.0, allow_nan=False, allow_infinity=False)
# Integers small enough that an f64 holds them exactly.
exact_ints = st.integers(min_value=-(2**52), max_value=2**52)

finite_numbers = st.one_of(finite_floats, exact_ints, st.sampled_from([0, 1, 0.5, 1.0, -1.0, 1e300, 5e-324]))
non_negative_numbers = st.one_of(
    non_negative_floats, st.integers(min_value=0, max_value=2**52), st.sampled_from([0, 0.0, 1, 12000, 0.25])
)


def named_numbers(values: st.SearchStrategy = finite_numbers, *, max_size: int = 4, exclude=()) -> st.SearchStrategy:
    keys = map_keys.filter(lambda key: key not in exclude) if exclude else map_keys
    return st.dictionaries(keys, values, max_size=max_size)


json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        finite_floats,
        any_text,
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(map_keys, children, max_size=3),
    ),
    max_leaves=6,
)

_extra_event_keys = map_keys.filter(lambda key: key not in EVENT_KEYS)
_extra_top_level_keys = non_empty_text.filter(lambda key: key not in SEED_TOP_LEVEL_KEYS and key not in MASREPLAY_TOP_LEVEL_KEYS)

_event_optional = {
    "role": any_text,
    "from": any_text,
    "to": any_text,
    "tool": any_text,
    "content_ref": any_text,
    "trusted": st.booleans(),
    "reward": named_numbers(max_size=3),
    "tokens": st.integers(min_value=0, max_value=2**40),
    "duration_s": non_negative_numbers,
    "logprob": non_positive_floats,
}


@st.composite
def _event(draw, event_id: str, agents: list[str]) -> dict[str, Any]:
    event: dict[str, Any] = {
        "id": event_id,
        "t": draw(non_negative_numbers),
        "type": draw(st.sampled_from(EVENT_TYPES)),
        "agent": draw(st.sampled_from(agents)),
    }
    # Each optional field is present in about a third of the events.
    for key, strategy in _event_optional.items():
        if draw(st.integers(0, 2)) == 0:
            event[key] = draw(strategy)
    if draw(st.integers(0, 5)) == 0:
        event.update(draw(st.dictionaries(_extra_event_keys, json_values, min_size=1, max_size=2)))
    return event


@st.composite
def traces(
    draw,
    *,
    min_events: int = 1,
    max_events: int = 40,
    masreplay_fields: bool = True,
    extra_top_level: bool = False,
) -> dict[str, Any]:
    """A valid trace dict: 1..40 events with unique Unicode ids, edges in any stored order that
    form a DAG without self-loops, every event and edge type, optional fields,
    per-event rewards and attributes, and the top-level maps. ``masreplay_fields`` adds
    masreplay's optional top-level keys; ``extra_top_level`` adds unknown top-level keys."""
    n = draw(st.integers(min_value=min_events, max_value=max_events))
    ids = draw(st.lists(non_empty_text, min_size=n, max_size=n, unique=True))
    agents = draw(st.lists(non_empty_text, min_size=1, max_size=6, unique=True))
    events = [draw(_event(event_id, agents)) for event_id in ids]

    edges = []
    if n >= 2:
        # Edges go forward in a random order of the events, so they point backward in stored
        # order as often as forward: the graph is a DAG, but not sorted.
        order = list(range(n))
        draw(st.randoms(use_true_random=False)).shuffle(order)  # one draw, not n: keeps examples small
        for _ in range(draw(st.integers(min_value=0, max_value=min(2 * n, 60)))):
            src = draw(st.integers(min_value=0, max_value=n - 2))
            dst = draw(st.integers(min_value=src + 1, max_value=n - 1))
            edges.append({"src": ids[order[src]], "dst": ids[order[dst]], "type": draw(st.sampled_from(EDGE_TYPES))})

    costs = {"tokens": draw(non_negative_numbers), "wall_clock_s": draw(non_negative_numbers)}
    for key in ("tool_calls", "messages"):
        if draw(st.booleans()):
            costs[key] = draw(non_negative_numbers)
    costs.update(draw(named_numbers(non_negative_numbers, max_size=2, exclude=COST_KEYS)))

    trace: dict[str, Any] = {
        "trace_id": draw(non_empty_text),
        "task_id": draw(non_empty_text),
        "events": events,
        "edges": edges,
        "rewards": draw(named_numbers()),
        "costs": costs,
    }
    optional: dict[str, st.SearchStrategy] = {
        "system": any_text,
        "topology": st.sampled_from(TOPOLOGIES),
        "metrics": named_numbers(),
    }
    if masreplay_fields:
        optional.update(
            {
                "schema_version": st.just(1),
                "group_id": non_empty_text,
                "policy_version": st.integers(min_value=0, max_value=2**40),
                "counterfactual_of": st.fixed_dictionaries(
                    {
                        "trace_id": non_empty_text,
                        "event_id": st.sampled_from(ids),
                        "kind": st.sampled_from(COUNTERFACTUAL_KINDS),
                    }
                ),
            }
        )
    for key, strategy in optional.items():
        if draw(st.booleans()):
            trace[key] = draw(strategy)
    if extra_top_level and draw(st.booleans()):
        trace.update(draw(st.dictionaries(_extra_top_level_keys, json_values, min_size=1, max_size=2)))
    # Key order carries no meaning; shuffle so that nothing depends on it.
    keys = draw(st.permutations(list(trace)))
    return {key: trace[key] for key in keys}


def trace_lists(min_size: int = 1, max_size: int = 4, **kwargs) -> st.SearchStrategy:
    return st.lists(traces(**kwargs), min_size=min_size, max_size=max_size)


# ---- independent reference computations ------------------------------------------------


def model_number(value: float | int) -> float | int:
    """How masreplay gives back a number it stores as f64: whole numbers below 9e15 as int."""
    as_float = float(value)
    if as_float.is_integer() and abs(as_float) < 9.0e15:
        return int(as_float)
    return as_float


def _numbers(mapping: dict[str, Any]) -> dict[str, Any]:
    return {key: model_number(value) for key, value in mapping.items()}


def expected_event(event: dict[str, Any]) -> dict[str, Any]:
    out = dict(event)
    out["t"] = model_number(event["t"])
    for key in ("duration_s", "logprob"):
        if key in event:
            out[key] = model_number(event[key])
    if "reward" in event:
        out["reward"] = _numbers(event["reward"])
    return out


def expected_export(trace: dict[str, Any], *, strict_seed: bool = False) -> dict[str, Any]:
    """What ``batch[i]`` (or, with strict_seed, ``batch.to_seed_json(i)``) must equal."""
    out: dict[str, Any] = {}
    for key, value in trace.items():
        if key in ("events", "edges", "rewards", "costs", "metrics"):
            continue
        if strict_seed and key not in SEED_TOP_LEVEL_KEYS:
            continue
        out[key] = value
    out["events"] = [expected_event(event) for event in trace["events"]]
    out["edges"] = [dict(edge) for edge in trace["edges"]]
    out["rewards"] = _numbers(trace["rewards"])
    out["costs"] = _numbers(trace["costs"])
    if "metrics" in trace:
        out["metrics"] = _numbers(trace["metrics"])
    if not strict_seed:
        out["schema_version"] = 1
        out.setdefault("group_id", trace["task_id"])
    return out


def typed(value: Any) -> str:
    """A text form that tells 1 from 1.0 and True from 1 (== does not), keys sorted."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False)


def derived_columns(trace: dict[str, Any]) -> dict[str, int]:
    """n_events, n_edges, n_agents, depth (edges on the longest path), max_branching."""
    index = {event["id"]: i for i, event in enumerate(trace["events"])}
    n = len(trace["events"])
    successors: list[list[int]] = [[] for _ in range(n)]
    in_degree = [0] * n
    for edge in trace["edges"]:
        src, dst = index[edge["src"]], index[edge["dst"]]
        successors[src].append(dst)
        in_degree[dst] += 1
    # Longest path by dynamic programming over a topological order (Kahn).
    order = [v for v in range(n) if in_degree[v] == 0]
    remaining = list(in_degree)
    for v in order:
        for w in successors[v]:
            remaining[w] -= 1
            if remaining[w] == 0:
                order.append(w)
    assert len(order) == n, "reference computation needs a DAG"
    level = [0] * n
    for v in order:
        for w in successors[v]:
            level[w] = max(level[w], level[v] + 1)
    return {
        "n_events": n,
        "n_edges": len(trace["edges"]),
        "n_agents": len({e["agent"] for e in trace["events"] if e["type"] != "tool_result"}),
        "depth": max(level, default=0),
        "max_branching": max((len(s) for s in successors), default=0),
    }


def is_finite_json(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(is_finite_json(v) for v in value.values())
    if isinstance(value, list):
        return all(is_finite_json(v) for v in value)
    return True
