"""The page's data: the traces a view embeds (the viewed trace, its GRPO siblings and the
branch rollouts of any of them), each with its agent lanes in spawn-tree order, its events
and edges in compact columns, its critical path, its credit and its metrics."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from masreplay.event_credit import EventCredit

#: Event types whose author is not an agent: a tool_result's ``agent`` names the tool.
TOOL_EVENT = "tool_result"


def critical_path(n_events: int, edges: list[tuple[int, int]]) -> list[int]:
    """One longest path of the event DAG in events (what ``metrics``' critical_path_steps
    counts: a trace without edges has a path of one event), as event indices in order.
    Among equally long paths it ends at the first event that reaches the length and steps
    back through the first predecessor that does."""
    if n_events == 0:
        return []
    successors: list[list[int]] = [[] for _ in range(n_events)]
    predecessors: list[list[int]] = [[] for _ in range(n_events)]
    in_degree = [0] * n_events
    for source, target in edges:
        successors[source].append(target)
        predecessors[target].append(source)
        in_degree[target] += 1
    order = [v for v in range(n_events) if in_degree[v] == 0]
    steps = [1] * n_events
    for event in order:  # Kahn's order: the list grows while it is walked
        for target in successors[event]:
            steps[target] = max(steps[target], steps[event] + 1)
            in_degree[target] -= 1
            if in_degree[target] == 0:
                order.append(target)
    end = max(range(n_events), key=lambda v: (steps[v], -v))
    path = [end]
    while steps[path[-1]] > 1:
        path.append(next(p for p in predecessors[path[-1]] if steps[p] == steps[path[-1]] - 1))
    return path[::-1]


@dataclass(frozen=True)
class Lanes:
    """A trace's agent lanes: ``order`` (agent, parent lane, depth, whether it is a tool),
    each event's lane, and ``answers``: tool_call -> the tool_result an edge leads it to."""

    order: list[dict[str, Any]]
    of_event: list[int]
    answers: dict[int, int]


def lanes(trace: dict[str, Any]) -> Lanes:
    """One lane per agent: the spawn tree depth-first from the orchestrator (children in the
    order they were spawned), then other agents nobody spawned (a human, a harness). A
    sub-agent's parent is the
    author of its earliest spawn. A tool result sits in the lane of the agent whose call it
    answers (as Shapley's players count it); tools get lanes of their own, last, only for
    results no call leads to."""
    events = trace["events"]
    index = {event["id"]: i for i, event in enumerate(events)}
    answers: dict[int, int] = {}
    for edge in trace["edges"]:
        call, result = index[edge["src"]], index[edge["dst"]]
        if events[call]["type"] == "tool_call" and events[result]["type"] == TOOL_EVENT and result not in answers.values():
            answers.setdefault(call, result)
    answered = {result: call for call, result in answers.items()}
    in_time = sorted(range(len(events)), key=lambda i: events[i]["t"])
    parent: dict[str, str] = {}
    children: dict[str, list[str]] = defaultdict(list)
    first_seen: dict[str, int] = {}
    acts = set()
    for i in in_time:
        event = events[i]
        if i in answered:
            continue
        agent = event["agent"]
        first_seen.setdefault(agent, i)
        if event["type"] != TOOL_EVENT:
            acts.add(agent)
        spawned = event.get("to")
        if event["type"] == "spawn" and spawned and spawned not in parent and spawned != agent:
            parent[spawned] = agent
            children[agent].append(spawned)
            first_seen.setdefault(spawned, i)
    order: list[dict[str, Any]] = []
    placed: dict[str, int] = {}

    def place(agent: str) -> None:
        stack = [(agent, -1, 0)]
        while stack:
            name, above, level = stack.pop()
            if name in placed:
                continue
            placed[name] = len(order)
            order.append({"agent": name, "parent": above, "depth": level, "tool": name not in acts and name not in parent})
            stack.extend((child, placed[name], level + 1) for child in reversed(children[name]))

    # The orchestrator's tree first (a root that spawns or decides: never the human or the
    # harness that merely opened the trace), then other agents, then tools.
    leads = set(children) | {event["agent"] for event in events if event["type"] == "orchestrator_decision"}
    roots = [agent for agent in sorted(first_seen, key=first_seen.__getitem__) if agent not in parent]
    for agent in sorted(roots, key=lambda agent: (agent not in acts, agent not in leads)):
        place(agent)
    of_event = [placed[events[answered[i]]["agent"] if i in answered else event["agent"]] for i, event in enumerate(events)]
    return Lanes(order, of_event, answers)


def _number(value: Any) -> float | None:
    """A JSON-safe number: NaN and infinities (no JSON spelling) become null."""
    return float(value) if value is not None and math.isfinite(value) else None


def trace_data(
    trace: dict[str, Any],
    colouring: EventCredit | None,
    rows: slice,
    metrics: dict[str, Any],
    advantage: float | None,
) -> dict[str, Any]:
    """One trace as the page reads it. ``rows`` are the trace's rows of the colouring."""
    events = trace["events"]
    lanes_of_trace = lanes(trace)
    index = {event["id"]: i for i, event in enumerate(events)}
    types = sorted({event["type"] for event in events})
    roles = sorted({event.get("role") for event in events if event.get("role")})
    edges = [(index[edge["src"]], index[edge["dst"]], edge["type"]) for edge in trace["edges"]]
    edge_types = sorted({kind for _, _, kind in edges})
    data: dict[str, Any] = {
        "id": trace["trace_id"],
        "group_id": trace.get("group_id"),
        "rewards": trace.get("rewards") or {},
        "advantage": _number(advantage),
        "counterfactual_of": trace.get("counterfactual_of"),
        "metrics": {key: (_number(value) if isinstance(value, float) else value) for key, value in metrics.items()},
        "lanes": lanes_of_trace.order,
        "types": types,
        "roles": roles,
        "edge_types": edge_types,
        "events": {
            "id": [event["id"] for event in events],
            "t": [event["t"] for event in events],
            "d": [event.get("duration_s") or 0 for event in events],
            "lane": lanes_of_trace.of_event,
            "type": [types.index(event["type"]) for event in events],
            "role": [roles.index(event["role"]) if event.get("role") else -1 for event in events],
            "tokens": [event.get("tokens") for event in events],
        },
        "details": events,
        "edges": [[s for s, _, _ in edges], [d for _, d, _ in edges], [edge_types.index(k) for _, _, k in edges]],
        "critical": critical_path(len(events), [(s, d) for s, d, _ in edges]),
        "branches": [],
    }
    if colouring is not None:
        data["credit"] = [_number(v) for v in colouring.values[rows]]
        data["stderr"] = [_number(v) for v in colouring.stderr[rows]]
    return data


def attach_branches(traces: list[dict[str, Any]]) -> None:
    """Lists each branch rollout at its factual trace's branch point (event index), with the
    branch's kind and rewards."""
    by_id = {trace["id"]: trace for trace in traces}
    for trace in traces:
        origin = trace["counterfactual_of"]
        factual = by_id.get(origin["trace_id"]) if origin else None
        if factual is None:
            continue
        ids = factual["events"]["id"]
        if origin["event_id"] in ids:
            factual["branches"].append(
                {
                    "event": ids.index(origin["event_id"]),
                    "trace_id": trace["id"],
                    "kind": origin.get("kind"),
                    "rewards": trace["rewards"],
                }
            )


def colour_scale(colouring: EventCredit | None) -> dict[str, Any] | None:
    """The legend: the symmetric range (the largest |value| of the embedded traces), the
    estimator, budget and typical standard error."""
    if colouring is None:
        return None
    values, stderr = colouring.values, colouring.stderr
    finite = values[np.isfinite(values)]
    errors = stderr[np.isfinite(stderr)]
    return {
        "name": colouring.name,
        "estimator": colouring.estimator,
        "budget": colouring.budget,
        "max": float(np.abs(finite).max()) if finite.size else 0.0,
        "credited": int(finite.size),
        "median_stderr": float(np.median(errors)) if errors.size else None,
    }
