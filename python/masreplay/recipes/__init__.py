"""The published multi-agent credit schemes as named recipes over masreplay traces.

Each function takes a batch (or anything :func:`masreplay.load_traces` accepts) and returns
:class:`masreplay.Advantages` (``per_trace``, ``per_event`` aligned with ``batch.events()``,
``weights``) with the method's published defaults; its docstring gives the formula, the
paper's arXiv id, the inputs a trace cannot carry (critic values, a mixing network, judged
scores, tree node labels) and the choices made where the paper leaves one open.
:func:`table` lists them, and the methods that define no numeric credit rule.

Shared conventions (see ``_events``): tool results, human interventions and safety events
are observations (advantage 0, weight 0); a tool result belongs to the agent that made the
call; a turn is an agent's k-th acting event in time order; groups are ``group_id``;
``weights`` are the method's loss weights, each group summing to 1 (per level for M-GRPO);
arrays are float64 (``astype(np.float32)`` for a trainer).
"""

from __future__ import annotations

import pyarrow as pa

from masreplay.recipes.outcome import agent_lightning, context_folding, dr_mas, kimi_parl, matpo, mgrpo, sharp, wideseek_r1
from masreplay.recipes.sequence import agent_qmix, maporl, marft, marshal, puppeteer
from masreplay.recipes.tree import c3, magrpo, malt, marsrl

#: (method, function, arXiv id, credit unit, inputs beyond the trace, what the trace must hold)
_ROWS: tuple[tuple[str, str | None, str, str, str, str], ...] = (
    (
        "MAGRPO",
        "magrpo",
        "2508.04652",
        "joint action (tree node)",
        "node labels (tree)",
        "team reward per trace; optional per-event team rewards per turn",
    ),
    (
        "MARFT",
        "marft",
        "2504.16129",
        "agent action",
        "critic values per event",
        "acting events in (step, agent) order; team reward",
    ),
    (
        "MAPoRL",
        "maporl",
        "2502.18439",
        "agent x turn",
        "verifier scores (verifier channel); optional values; correct channel for the incentive bonus",
        "per-event verifier channel on responses",
    ),
    (
        "M-GRPO",
        "mgrpo",
        "2511.13288",
        "role: main agent; each sub-agent call",
        "optional format / expert channels",
        "spawn tree (main = root); team reward",
    ),
    ("MATPO", "matpo", "2510.04678", "planner rollout (workers inherit)", "-", "team reward"),
    (
        "MALT",
        "malt",
        "2412.01928",
        "role output (tree node), a value",
        "node labels (G -> V -> R tree)",
        "team reward = correctness (0/1) per leaf trace",
    ),
    (
        "Context-Folding",
        "context_folding",
        "2510.11967",
        "event (token process reward)",
        "process penalties (process channel)",
        "team reward in [0, 1]; per-event process channel",
    ),
    (
        "MarsRL",
        "marsrl",
        "2511.11373",
        "role output",
        "per-output correctness (correct channel); node labels",
        "per-event correct channel",
    ),
    (
        "Kimi K2.5 PARL",
        "kimi_parl",
        "2602.02276",
        "orchestrator",
        "lambda schedules",
        "spawn / return events (critical steps, finish rate); team reward",
    ),
    (
        "Dr. MAS",
        "dr_mas",
        "2602.08847",
        "agent (pooled invocations)",
        "optional invalid-action flags",
        "agent per event; team reward",
    ),
    (
        "C3",
        "c3",
        "2603.06859",
        "message (replayed sibling)",
        "node labels (prefix tree); Q-critic values",
        "team reward per leaf trace",
    ),
    (
        "SHARP",
        "sharp",
        "2602.08335",
        "agent",
        "counterfactual / Shapley marginals per event",
        "team reward; per-event tool channel",
    ),
    ("WideSeek-R1", "wideseek_r1", "2602.04634", "rollout, agent/token loss weights", "-", "team reward; tokens per event"),
    (
        "MARSHAL",
        "marshal",
        "2510.15414",
        "turn per player",
        "-",
        "per-event team rewards per turn, or an outcome; player = agent",
    ),
    (
        "Agent Lightning",
        "agent_lightning",
        "2508.03680",
        "transition (rollout-level advantage)",
        "-",
        "team reward; tokens per event",
    ),
    (
        "Puppeteer",
        "puppeteer",
        "2505.19591",
        "orchestrator step",
        "agent factors (pool)",
        "orchestrator spawn events; tokens of the selected agents; team reward",
    ),
    (
        "Agent Q-Mix",
        "agent_qmix",
        "2604.00344",
        "agent x round action",
        "per-agent Q-values; mixing callable",
        "acting events per round; team reward",
    ),
    ("HALO", None, "2505.13516", "-", "-", "no numeric credit rule: inference-time MCTS over roles with an LLM judge"),
    ("HERA", None, "2604.00901", "-", "-", "no numeric credit rule: prompt evolution from judged experience"),
    ("LangMARL", None, "2604.00722", "-", "-", "no numeric credit rule: an LLM critic writes textual per-agent credit"),
    ("ParaManager", None, "2604.17009", "-", "-", "no published formula (abstract only)"),
)


def table() -> pa.Table:
    """One row per method of the survey's cluster: ``method``, ``function`` (the recipe's name
    in this module, null where the method defines no numeric credit rule), ``paper`` (arXiv
    id), ``credit_unit``, ``inputs`` (what a trace cannot carry), ``trace`` (what the recipe
    reads from the trace, or why there is no recipe)."""
    columns = list(zip(*_ROWS, strict=True))
    names = ("method", "function", "paper", "credit_unit", "inputs", "trace")
    return pa.table({name: pa.array(values, pa.string()) for name, values in zip(names, columns, strict=True)})


__all__ = [
    "agent_lightning",
    "agent_qmix",
    "c3",
    "context_folding",
    "dr_mas",
    "kimi_parl",
    "magrpo",
    "malt",
    "maporl",
    "marft",
    "marshal",
    "marsrl",
    "matpo",
    "mgrpo",
    "puppeteer",
    "sharp",
    "table",
    "wideseek_r1",
]
