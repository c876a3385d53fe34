"""MultiAgentBench (MARBLE) result logs -> one trace per episode (one JSON Lines record).

Per iteration: ``task_assignments`` -> an orchestrator_decision by ``planner`` and a message
to each assigned agent; ``communications`` -> messages, parsed from their "From A to B:"
lines; ``task_results`` -> a return by each agent (MARBLE writes an entry either as
``{"agent_id": ..., "result": ...}`` or, in its minecraft and discussion runs, as
``{"<agent>": "<result>"}``); ``summary`` -> an aggregate by the planner. The planner's
events have the role ``orchestrator``, the agents' ``sub-agent``.
Episode scores become reward channels (``planning``, ``communication``: the mean of the
scored rounds; ``task_evaluation.<name>``, ``code_quality.<name>``); a score of -1 means
"not scored" and is left out (listed in the trace's ``missing_scores``). ``agent_kpis`` is
the channel ``milestones.<agent>`` and that agent's ``milestones`` reward on its last return; ``token_usage`` is the trace's token
cost. MARBLE logs have no timestamps: ``t`` is the event's position in the episode and
wall_clock_s is 0.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Any

from masreplay.batch import TraceBatch
from masreplay.conversion_report import ConversionReport
from masreplay.convert._builder import TraceBuilder, load
from masreplay.convert._lines import records
from masreplay.convert._shape import NUMBER, Fail, describe, field, is_number
from masreplay.errors import ConversionError

PLANNER = "planner"
ORCHESTRATOR, SUB_AGENT = "orchestrator", "sub-agent"
MISSING = -1
TOPOLOGY = {"star": "centralized", "tree": "hierarchical", "graph": "swarm"}
EPISODE_KEYS = frozenset(
    {
        "task",
        "coordination_mode",
        "iterations",
        "planning_scores",
        "communication_scores",
        "task_evaluation",
        "code_quality",
        "agent_kpis",
        "total_milestones",
        "token_usage",
    }
)
ITERATION_KEYS = frozenset({"iteration", "task_assignments", "task_results", "summary", "continue_simulation", "communications"})
_SPEAKER = re.compile(r"^From (\S+) to (\S+?): ", re.MULTILINE)
_SESSION_HEADER = re.compile(r"^\s*(In Session \S+\s*)?$")


def _scores(record: dict[str, Any], fail: Fail) -> tuple[dict[str, float], list[str]]:
    """Reward channels of an episode, and the names of the scores that were not given."""
    rewards: dict[str, float] = {}
    missing: list[str] = []
    for key, channel in (("planning_scores", "planning"), ("communication_scores", "communication")):
        values = field(record, key, list, fail) or []
        for i, value in enumerate(values):
            if not is_number(value):
                raise fail(f"/{key}/{i} is {describe(value)}, expected a finite number")
        scored = [v for v in values if v != MISSING]
        missing += [f"{key}/{i}" for i, v in enumerate(values) if v == MISSING]
        if scored:
            rewards[channel] = sum(scored) / len(scored)
    for key in ("task_evaluation", "code_quality"):
        value = record.get(key)
        named = value if isinstance(value, dict) else {} if value is None else {"": value}
        for name, score in named.items():
            channel = f"{key}.{name}" if name else key
            if score == MISSING:
                missing.append(channel)
            elif is_number(score):
                rewards[channel] = float(score)
    return rewards, missing


def _result_agents(result: Any, place: str, fail: Fail) -> list[str]:
    """The agents a task_results entry reports: its ``agent_id``, or the keys of the
    ``{"<agent>": "<result>"}`` form."""
    if not isinstance(result, dict):
        raise fail(f"{place} is {describe(result)}, expected an object")
    if not result:
        raise fail(f"{place} is empty: it names no agent")
    if "agent_id" in result:
        agent = result["agent_id"]
        if not isinstance(agent, str) or not agent:
            raise fail(f"{place}/agent_id is {describe(agent)}, expected an agent name")
        return [agent]
    for agent in result:
        if not isinstance(agent, str) or not agent:
            raise fail(f"{place} has a key that is not an agent name: {agent!r}")
    return list(result)


class _Episode:
    def __init__(self, source: str, number: int, record: dict[str, Any], report: ConversionReport) -> None:
        self.source, self.number, self.record, self.report = source, number, record, report
        self.file = os.path.basename(source)
        task = record.get("task")
        if not isinstance(task, str) or not isinstance(record.get("iterations"), list):
            raise self.fail("a MARBLE episode needs 'task' (text) and 'iterations' (a list)")
        mode = field(record, "coordination_mode", str, self.fail)
        stem = os.path.splitext(os.path.basename(source))[0]
        self.builder = TraceBuilder(
            f"{stem}:{number}",
            "marble-" + hashlib.sha256(task.encode()).hexdigest()[:16],
            system="marble",
            topology=TOPOLOGY.get(mode, "unknown"),
        )
        self.last: dict[str, str] = {}  # agent -> its latest event, for causal edges

    def fail(self, reason: str) -> ConversionError:
        return ConversionError(self.source, self.number, reason)

    def add(self, suffix: str, type: str, agent: str, after: list[str | None], edge: str = "causal", **fields: Any) -> str:
        builder = self.builder
        role = ORCHESTRATOR if agent == PLANNER else SUB_AGENT
        event = builder.event(
            f"e{len(builder.events)}",
            len(builder.events),
            type,
            agent,
            role=role,
            content_ref=f"{self.file}:{self.number}#{suffix}",
            **fields,
        )
        for src in after:
            builder.edge(src, event, edge)
        for name in {agent, fields.get("to")} - {None}:
            self.last[name] = event
        return event

    def iteration(self, index: int, iteration: dict[str, Any], previous: str | None) -> str | None:
        where = f"/iterations/{index}"
        for key in iteration.keys() - ITERATION_KEYS:
            self.report.unknown[f"iteration key {key}"] += 1
        assignments = field(iteration, "task_assignments", dict, self.fail, where) or {}
        decision = self.add(
            f"{where}/task_assignments", "orchestrator_decision", PLANNER, [previous], iteration=iteration.get("iteration")
        )
        for agent in assignments:
            if not isinstance(agent, str) or not agent:
                raise self.fail(f"{where}/task_assignments has a key that is not an agent name: {agent!r}")
            self.add(
                f"{where}/task_assignments/{agent}", "message", PLANNER, [decision], from_=PLANNER, to=agent, kind="assignment"
            )
        for number, text in enumerate(field(iteration, "communications", list, self.fail, where) or []):
            self.communication(f"{where}/communications/{number}", text)
        returns = []
        for number, result in enumerate(field(iteration, "task_results", list, self.fail, where) or []):
            place = f"{where}/task_results/{number}"
            agents = _result_agents(result, place, self.fail)
            for agent in agents:
                suffix = place if len(agents) == 1 else f"{place}/{agent}"
                returns.append(self.add(suffix, "return", agent, [self.last.get(agent)], from_=agent, to=PLANNER))
        if "summary" not in iteration:
            return returns[-1] if returns else decision
        return self.add(
            f"{where}/summary",
            "aggregate",
            PLANNER,
            returns or [decision],
            "aggregate",
            continue_simulation=iteration.get("continue_simulation"),
        )

    def communication(self, where: str, text: Any) -> None:
        if not isinstance(text, str):
            raise self.fail(f"{where} is not text")
        parts = _SPEAKER.split(text)
        if not _SESSION_HEADER.match(parts[0]):
            self.report.unknown["communication text outside 'From A to B:' lines"] += 1
        for turn, (sender, receiver) in enumerate(zip(parts[1::3], parts[2::3], strict=True)):
            self.add(
                f"{where}/{turn}", "message", sender, [self.last.get(sender), self.last.get(receiver)], from_=sender, to=receiver
            )

    def build(self) -> dict[str, Any]:
        record = self.record
        for key in record.keys() - EPISODE_KEYS:
            self.report.unknown[f"episode key {key}"] += 1
        previous = None
        for index, iteration in enumerate(record["iterations"]):
            if not isinstance(iteration, dict):
                raise self.fail(f"/iterations/{index} is not an object")
            previous = self.iteration(index, iteration, previous)
        if not self.builder.events:
            raise self.fail("an episode without iterations has no events")
        rewards, missing = _scores(record, self.fail)
        for agent, milestones in (field(record, "agent_kpis", dict, self.fail) or {}).items():
            if not is_number(milestones):
                raise self.fail(f"/agent_kpis/{agent} is {describe(milestones)}, expected a finite number")
            # Kept per trace for every agent (some never return), and on the agent's last
            # return for credit assignment.
            rewards[f"milestones.{agent}"] = float(milestones)
            last_return = next((e for e in reversed(self.builder.events) if e["type"] == "return" and e["agent"] == agent), None)
            if last_return is not None:
                last_return["reward"] = {"milestones": float(milestones)}
        total = field(record, "total_milestones", NUMBER, self.fail)
        tokens = field(record, "token_usage", NUMBER, self.fail)
        return self.builder.build(
            wall_clock_s=0.0,
            rewards=rewards,
            metrics={"total_milestones": float(total)} if total is not None else None,
            tokens=float(tokens) if tokens is not None else 0.0,
            coordination_mode=record.get("coordination_mode"),
            missing_scores=missing or None,
        )


def marble(source: Any) -> TraceBatch:
    """Converts MARBLE episodes: a path to a result ``.jsonl`` file, one episode dict, or a list."""
    name, numbered = records(source)
    report = ConversionReport("marble", sources=[name], records=len(numbered))
    traces = [_Episode(name, number, record, report).build() for number, record in numbered]
    batch = load(traces, [(name, number) for number, _ in numbered], name)
    report.traces, report.events = len(traces), sum(len(trace["events"]) for trace in traces)
    batch.conversion_report = report
    return batch
