"""The closed vocabularies of masreplay, each written once: a ``Literal`` type for signatures
and, from the same list (``typing.get_args``), a tuple of the names at run time, in the
canonical order (for the schema vocabularies: their dictionary codes in the Arrow layout).

The core defines the same names (``named_enum!`` in rust/masreplay-core) and parses every
argument by them; ``tests/test_vocabulary.py`` holds the two lists equal.
"""

from __future__ import annotations

from typing import Literal, get_args

# ---- the trace schema ---------------------------------------------------------------------
EventType = Literal[
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
]
EdgeType = Literal["temporal", "causal", "spawn", "message", "tool_dependency", "return", "aggregate", "safety_flow"]
Topology = Literal["centralized", "planner_executor_critic", "debate", "swarm", "hierarchical", "harness", "mixed", "unknown"]
#: What a branch rollout changed relative to its factual trace (``counterfactual_of.kind``).
CounterfactualKind = Literal["substitute", "ablate", "no_spawn"]

EVENT_TYPES: tuple[str, ...] = get_args(EventType)
EDGE_TYPES: tuple[str, ...] = get_args(EdgeType)
TOPOLOGIES: tuple[str, ...] = get_args(Topology)
COUNTERFACTUAL_KINDS: tuple[str, ...] = get_args(CounterfactualKind)

# ---- arguments ----------------------------------------------------------------------------
Estimator = Literal["grpo", "rloo", "reinforce_pp_baseline", "opo"]
#: What a cell of the advantage normalisation holds apart (``normalize_by``, ``weight_by``).
Stratum = Literal["agent", "role", "depth", "turn", "event_type"]
#: What a count counts: a buffer's capacity, the rows of the advantage statistics.
Unit = Literal["traces", "events"]
ReturnKind = Literal["descendants", "tree", "turns"]
Sampler = Literal["uniform", "prioritized"]
#: What counterfactual credit compares a branch's reward with.
Baseline = Literal["mean", "loo"]
#: How ``trace_shapley`` turns a player's value into its events' credit.
EventCreditShare = Literal["split", "each"]
ShapleyMethod = Literal[
    "auto", "exact", "permutation", "kernel", "precedence", "permission", "owen", "stratified", "msr", "census"
]
#: MSR's surrogate (``masreplay.shapley(surrogate=...)``).
ShapleySurrogate = Literal["auto", "linear", "interactions"]

ESTIMATORS: tuple[str, ...] = get_args(Estimator)
STRATA: tuple[str, ...] = get_args(Stratum)
UNITS: tuple[str, ...] = get_args(Unit)
RETURN_KINDS: tuple[str, ...] = get_args(ReturnKind)
SAMPLERS: tuple[str, ...] = get_args(Sampler)
BASELINES: tuple[str, ...] = get_args(Baseline)
SHAPLEY_METHODS: tuple[str, ...] = get_args(ShapleyMethod)
SHAPLEY_SURROGATES: tuple[str, ...] = get_args(ShapleySurrogate)
EVENT_CREDIT_SHARES: tuple[str, ...] = get_args(EventCreditShare)

__all__ = [
    "BASELINES",
    "COUNTERFACTUAL_KINDS",
    "EDGE_TYPES",
    "ESTIMATORS",
    "EVENT_CREDIT_SHARES",
    "EVENT_TYPES",
    "RETURN_KINDS",
    "SAMPLERS",
    "SHAPLEY_METHODS",
    "SHAPLEY_SURROGATES",
    "STRATA",
    "TOPOLOGIES",
    "UNITS",
    "Baseline",
    "CounterfactualKind",
    "EdgeType",
    "Estimator",
    "EventCreditShare",
    "EventType",
    "ReturnKind",
    "Sampler",
    "ShapleyMethod",
    "ShapleySurrogate",
    "Stratum",
    "Topology",
    "Unit",
]
