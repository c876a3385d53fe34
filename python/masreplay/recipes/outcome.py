"""Recipes whose credit is an outcome reward normalised over a group of rollouts, at the level
of the rollout (MATPO, WideSeek-R1, Agent Lightning, Kimi PARL, Context-Folding), of the agent
(Dr. MAS, SHARP) or of the role (M-GRPO)."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from masreplay._args import checked
from masreplay.advantages import Advantages
from masreplay.errors import InvalidArgumentError
from masreplay.recipes._events import Events, cell_stats, dense, first_rows, grpo, nested_weights, result
from masreplay.rewards import parl

EPS = 1e-6  # verl's GRPO epsilon, the trainer these methods' code builds on


@checked
def matpo(
    batch: Any,
    *,
    channel: str = "team",
    eps: float = EPS,
    loss_agg: Literal["token-mean", "seq-mean"] = "token-mean",
) -> Advantages:
    """MATPO (arXiv 2510.04678): GRPO over the planner rollouts of a query; every worker
    rollout copies its planner's advantage.

    ``A_i = (R_i - mean_G R) / (std_G R + eps)`` (unbiased std), broadcast to every acting event
    of rollout ``i``, workers included. Loss weights: ``"token-mean"`` (the default) pools the
    group's planner and worker tokens, ``w_e = tokens_e / tokens of the group``;
    ``"seq-mean"`` reproduces the seq-mean modes, which divide by the number of *planner*
    rollouts only, so each sequence (the planner's or a worker's events) weighs ``1 / G`` and a
    group's weights sum to (1 + workers per rollout). Trace: a ``channel`` reward per trace.
    """
    events = Events(batch)
    advantage = grpo(events.trace_reward(channel), events.trace_group, eps=eps)
    if loss_agg == "token-mean":
        weights = nested_weights(events, events.acting, [])
    elif loss_agg == "seq-mean":
        # Each sequence weighs 1/G: nested_weights splits a rollout's 1/G among its
        # sequences, which the count of sequences per rollout undoes.
        sequence = dense(events.trace, events.owner)
        weights = nested_weights(events, events.acting, [events.trace, sequence])
        rows = np.flatnonzero(events.acting)
        acting_sequence = dense(sequence[rows])
        sequences = np.bincount(events.trace[rows][first_rows(acting_sequence)], minlength=events.n_traces)
        weights *= sequences[events.trace]
    else:
        raise InvalidArgumentError(f"loss_agg must be 'token-mean' or 'seq-mean', got {loss_agg!r}")
    per_event = np.where(events.acting, advantage[events.trace], 0.0)
    return result(events, "matpo", per_event, weights)


@checked
def wideseek_r1(batch: Any, *, channel: str = "team", eps: float = EPS) -> Advantages:
    """WideSeek-R1 (arXiv 2602.04634): one GRPO advantage per rollout for every agent and
    token, ``A_i = (R_i - mean_G R) / (std_G R + eps)``, with the loss weight
    ``1/G * 1/N_i * tokens_e / tokens of agent a`` (RLinf's agent- and turn-level loss
    scales): each rollout weighs ``1/G``, each of its ``N_i`` agents ``1/N_i`` of that, and an
    agent's events share its weight by tokens. A group's weights sum to 1. Trace: a
    ``channel`` reward per trace; ``tokens`` per event (a missing count weighs one token).
    """
    events = Events(batch)
    advantage = grpo(events.trace_reward(channel), events.trace_group, eps=eps)
    weights = nested_weights(events, events.acting, [events.trace, events.owner])
    return result(events, "wideseek_r1", np.where(events.acting, advantage[events.trace], 0.0), weights, ("agent",))


@checked
def agent_lightning(batch: Any, *, channel: str = "team", eps: float = EPS) -> Advantages:
    """Agent Lightning / LightningRL (arXiv 2508.03680): every LLM call (acting event) is a
    transition carrying its rollout's final reward; the rollout-level advantage
    ``A_i = (R_i - mean_G R) / (std_G R + eps)`` is computed once per rollout and broadcast to
    its transitions. The per-rollout-mean loss gives each rollout ``1/G`` of the group however
    many calls it made, shared among its events by tokens. Trace: a ``channel`` reward
    (a trace without it counts 0, as the missing rewards are filled there).
    """
    events = Events(batch)
    advantage = grpo(events.trace_reward(channel, fill=0.0), events.trace_group, eps=eps)
    weights = nested_weights(events, events.acting, [events.trace])
    return result(events, "agent_lightning", np.where(events.acting, advantage[events.trace], 0.0), weights)


@checked
def dr_mas(
    batch: Any,
    *,
    channel: str = "team",
    invalid: Any = None,
    invalid_penalty: float = 0.1,
    group_by_agent: bool = True,
    eps: float = EPS,
) -> Advantages:
    """Dr. MAS (arXiv 2602.08847): agent-wise GRPO. Every invocation (acting event) carries the
    episode's ``channel`` reward minus ``invalid_penalty`` where ``invalid`` (a per-event
    boolean input: array, event column or attribute key) marks an invalid action. Cells are
    (group, agent): all invocations of agent ``k`` in all rollouts of the task are pooled,
    ``A = (R - mean_k) / (std_k + eps)`` (unbiased std); a cell of one gets mean 0, std 1.
    ``group_by_agent=False`` is vanilla GRPO: each rollout's invocations are averaged, then
    normalised over the group's rollouts. Loss weights: each invocation equally within its
    group (GRPO's sample mean).
    """
    events = Events(batch)
    reward = events.trace_reward(channel)[events.trace]
    if invalid is not None:
        flags = np.nan_to_num(events.column("invalid", invalid), nan=0.0) != 0
        reward = reward - invalid_penalty * flags
    rows = np.flatnonzero(events.acting)
    per_event = np.zeros(events.n_events)
    if group_by_agent:
        cells = dense(events.group[rows], events.owner[rows])
        per_event[rows] = grpo(reward[rows], cells, eps=eps, singleton="verl")
        unit: tuple[str, ...] = ("agent",)
    else:
        counts = np.bincount(events.trace[rows], minlength=events.n_traces)
        mean = np.bincount(events.trace[rows], weights=reward[rows], minlength=events.n_traces) / np.maximum(counts, 1)
        has = counts > 0
        trace_adv = np.zeros(events.n_traces)
        trace_adv[has] = grpo(mean[has], events.trace_group[has], eps=eps, singleton="verl")
        per_event[rows] = trace_adv[events.trace[rows]]
        unit = ()
    weights = nested_weights(events, events.acting, [np.arange(events.n_events)], by_tokens=False)
    return result(events, "dr_mas", per_event, weights, unit)


@checked
def kimi_parl(
    batch: Any,
    *,
    lambda_parallel: float = 0.0,
    lambda_finish: float = 0.0,
    perf: str = "team",
) -> Advantages:
    """Kimi K2.5 PARL (arXiv 2602.02276): only the orchestrator is trained.

    ``r = r_perf + lambda_parallel * r_parallel + lambda_finish * r_finish``
    (:func:`masreplay.rewards.parl`), ``A_j = r_j - mean_K r`` (no std division), on the
    orchestrator's acting events (the root of the spawn tree); sub-agents' events get 0 and
    weight 0. Loss weights: ``1/N`` over the trained tokens (here: of the group). The report
    anneals both lambdas to 0 without giving their schedules: the defaults (0, 0) are the end
    of that anneal; pass :class:`masreplay.rewards.Schedule` values evaluated at your step.
    """
    events = Events(batch)
    if lambda_parallel == 0 and lambda_finish == 0:  # the anneal's end: no graph metrics needed
        reward = events.trace_reward(perf, fill=0.0)
    else:
        reward = parl(events.batch, lambda_parallel, lambda_finish, perf=perf)
    advantage = grpo(reward, events.trace_group, scale=False)
    trained = events.acting & events.root
    weights = nested_weights(events, trained, [])
    return result(events, "kimi_parl", np.where(trained, advantage[events.trace], 0.0), weights, ("orchestrator",))


@checked
def context_folding(
    batch: Any,
    *,
    channel: str = "team",
    process: str | Any = "process",
    low: float = 0.0,
    high: float = 1.0,
    eps: float = EPS,
) -> Advantages:
    """Context-Folding / FoldGRPO (arXiv 2510.11967):
    ``A_{i,t} = (clip(R_i + Q_{i,t}, low, high) - mean_G R) / (std_G R + eps)``.

    ``Q`` is the token-level process reward, here per event: the per-event channel
    ``process`` (or an array): -1 on main-thread turns past half the context limit, -0.2 on
    an out-of-scope branch (an LLM judge's call), -1 on a failed tool call, 0 elsewhere. The
    trace cannot compute these: record them as that channel. Unbiased std (verl's). Loss:
    token mean over the group (``1 / sum_i |tau_i|``).
    """
    events = Events(batch)
    outcome = events.trace_reward(channel)
    q = events.event_reward(process, optional=True) if isinstance(process, str) else events.amounts("process", process)
    n, mean, std = cell_stats(outcome, events.trace_group)
    clipped = np.clip(outcome[events.trace] + np.nan_to_num(q), low, high)
    denominator = np.where(n[events.trace] > 1, np.nan_to_num(std[events.trace]), 0.0) + eps
    per_event = np.where(events.acting & (n[events.trace] > 1), (clipped - mean[events.trace]) / denominator, 0.0)
    return result(events, "context_folding", per_event, nested_weights(events, events.acting, []))


@checked
def mgrpo(
    batch: Any,
    *,
    channel: str = "team",
    variant: Literal["paper", "code"] = "paper",
    sub_calls: int | None = 8,
    alignment: Literal["resample", "none"] = "resample",
    alpha: tuple[float, float] = (0.1, 0.9),
    beta: tuple[float, float, float] = (0.1, 0.4, 0.5),
    format_channel: str = "format",
    expert_channel: str = "expert",
    seed: int = 0,
    eps: float = EPS,
) -> Advantages:
    """M-GRPO (arXiv 2511.13288): the main agent M (the root of the spawn tree) and each
    sub-agent invocation S (every spawned agent) are normalised at their own level.

    - ``R_M``: the trace's ``channel`` reward (the paper's ``a1 r_format + a2 r_correct`` once
      composed; ``alpha`` documents the paper's weights and is applied when the trace also has
      ``format_channel``: ``R_M = a1 format + a2 channel``);
      ``A_M = (R_M - mean_K) / (std_K + eps)`` over the K rollouts, population std (the
      paper's; ``eps`` is not in the paper, verl's 1e-6 keeps an all-equal group at 0).
    - ``R_S``, ``variant="paper"`` (default): ``b1 r_format + b2 r_correct_main + b3 r_expert``,
      0 when the format is invalid; ``r_format`` and ``r_expert`` are the sub-agent's
      per-event channels ``format_channel`` (1 where absent) and ``expert_channel`` (an LLM
      rating, 0 where absent; an input a trace only carries if you record it) summed over its
      events, capped at 1; ``r_correct_main`` is ``R_M``. ``variant="code"``: the released
      MrlX reward: 0 if the format is invalid, ``0.1 * format`` if M's reward is 0, else 1.
    - Alignment of a variable number ``d_k`` of sub-calls: ``alignment="resample"`` (the
      paper's, default) pads each rollout to ``D = sub_calls`` by duplicating randomly chosen
      calls or drops calls at random (seeded by ``seed``); ``sub_calls=None`` takes D as the
      99th percentile of ``d_k`` over the batch. ``alignment="none"`` normalises all calls as
      they are. ``A_S = (R_S - mean) / std`` over the group's D*K aligned calls.
    - Weights: M's events ``1/K`` per rollout, S's ``multiplicity/(D*K)`` per call, each
      level summing to 1 per group; a dropped call has weight 0 and advantage 0.
    """
    if variant not in ("paper", "code"):
        raise InvalidArgumentError(f"variant must be 'paper' or 'code', got {variant!r}")
    if alignment not in ("resample", "none"):
        raise InvalidArgumentError(f"alignment must be 'resample' or 'none', got {alignment!r}")
    events = Events(batch)
    correct_main = events.trace_reward(channel)
    fmt = events.event_reward(format_channel, fill=np.nan, optional=True)
    has_format = ~np.isnan(fmt)
    main_reward = _main_reward(events, correct_main, fmt, alpha)
    main_adv = grpo(main_reward, events.trace_group, ddof=0, eps=eps)

    sub_rows = np.flatnonzero(events.acting & ~events.root)
    call = dense(events.trace[sub_rows], events.owner[sub_rows]) if len(sub_rows) else np.zeros(0, np.int64)
    n_calls = int(call.max(initial=-1)) + 1
    call_trace = np.zeros(n_calls, np.int64)
    call_trace[call] = events.trace[sub_rows]
    call_format = np.ones(n_calls)
    formatted = has_format[sub_rows]
    np.minimum.at(call_format, call[formatted], fmt[sub_rows][formatted])
    call_expert = np.minimum(
        np.bincount(call, weights=events.event_reward(expert_channel, optional=True)[sub_rows], minlength=n_calls), 1.0
    )
    if variant == "paper":
        call_reward = beta[0] * call_format + beta[1] * correct_main[call_trace] + beta[2] * call_expert
    else:
        call_reward = np.where(main_reward[call_trace] == 0, 0.1 * call_format, 1.0)
    call_reward = np.where(call_format > 0, call_reward, 0.0)

    multiplicity = _align(call_trace, events.n_traces, sub_calls, alignment, seed)
    kept = multiplicity > 0
    call_adv = np.zeros(n_calls)
    if kept.any():
        repeated = np.repeat(np.flatnonzero(kept), multiplicity[kept])
        adv = grpo(call_reward[repeated], events.trace_group[call_trace[repeated]], ddof=0, eps=eps)
        call_adv[repeated] = adv  # duplicates share their value

    per_event = np.zeros(events.n_events)
    main_rows = np.flatnonzero(events.acting & events.root)
    per_event[main_rows] = main_adv[events.trace[main_rows]]
    per_event[sub_rows] = call_adv[call]
    weights = nested_weights(events, events.acting & events.root, [events.trace])
    sub_weights = _sub_call_weights(events, sub_rows, call, call_trace, multiplicity)
    return result(events, "mgrpo", per_event, weights + sub_weights, ("role",))


def _main_reward(events: Events, correct_main: np.ndarray, fmt: np.ndarray, alpha: tuple[float, float]) -> np.ndarray:
    """M-GRPO's ``R_M``: the channel reward, or ``a1 format + a2 channel`` (0 when the format
    is invalid) where the main agent's events carry a format reward (NaN elsewhere)."""
    has_format = ~np.isnan(fmt)
    if not has_format.any():
        return correct_main
    trace_format = np.ones(events.n_traces)
    formatted_main = np.flatnonzero(events.root & has_format)
    np.minimum.at(trace_format, events.trace[formatted_main], fmt[formatted_main])
    return np.where(trace_format > 0, alpha[0] * trace_format + alpha[1] * correct_main, 0.0)


def _sub_call_weights(
    events: Events, sub_rows: np.ndarray, call: np.ndarray, call_trace: np.ndarray, multiplicity: np.ndarray
) -> np.ndarray:
    """Per-event loss weights of the sub-agents' events: each call ``multiplicity / (D*K)`` of
    its group, shared evenly by the call's events."""
    sub_weights = np.zeros(events.n_events)
    if len(sub_rows):
        per_group = np.bincount(events.trace_group[call_trace], weights=multiplicity, minlength=events.trace_group.max() + 1)
        call_weight = multiplicity / np.maximum(per_group[events.trace_group[call_trace]], 1)
        events_of_call = np.bincount(call, minlength=len(call_trace))
        sub_weights[sub_rows] = (call_weight / events_of_call)[call]
    return sub_weights


def _align(call_trace: np.ndarray, n_traces: int, sub_calls: int | None, alignment: str, seed: int) -> np.ndarray:
    """How many times each sub-call counts after aligning every rollout to D calls."""
    multiplicity = np.ones(len(call_trace), dtype=np.int64)
    if alignment == "none" or len(call_trace) == 0:
        return multiplicity
    d_k = np.bincount(call_trace, minlength=n_traces)
    target = int(np.ceil(np.quantile(d_k[d_k > 0], 0.99))) if sub_calls is None else int(sub_calls)
    if target < 1:
        raise InvalidArgumentError(f"sub_calls must be >= 1, got {sub_calls!r}")
    rng = np.random.default_rng(seed)
    # A random rank per call within its rollout: calls ranked >= D are dropped; a rollout
    # with d_k < D duplicates D - d_k calls drawn with replacement among its own.
    order = np.lexsort((rng.random(len(call_trace)), call_trace))
    starts = np.r_[0, np.cumsum(d_k)[:-1]]
    rank = np.empty(len(call_trace), np.int64)
    rank[order] = np.arange(len(call_trace)) - starts[call_trace[order]]
    multiplicity[rank >= target] = 0
    short = np.flatnonzero((d_k > 0) & (d_k < target))
    if len(short):
        extra = target - d_k[short]
        owner = np.repeat(short, extra)
        picks = starts[owner] + (rng.random(len(owner)) * d_k[owner]).astype(np.int64)
        np.add.at(multiplicity, order[picks], 1)
    return multiplicity


@checked
def sharp(
    batch: Any,
    marginal: Any,
    *,
    channel: str = "team",
    tool: str = "tool",
    lambda_shapley: float = 1.0,
    lambda_tool: float = 1.0,
    eps: float = EPS,
) -> Advantages:
    """SHARP (arXiv 2602.08335): per-agent reward
    ``R_{i,m} = R_acc(tau_i) + lambda_s * Delta_m + lambda_p * R^tool_{i,m}``, normalised per
    agent across the group: ``A_{i,m} = (R_{i,m} - mean_m) / (std_m + eps)``.

    ``marginal`` is the input a trace cannot carry: per-event counterfactual credit (an array
    aligned with ``batch.events()``, e.g. ``counterfactual_credit(...)["credit"]`` of masked
    re-evaluations or ``trace_shapley(...).events["credit"]``; NaN counts 0), summed per
    (trace, agent) into ``Delta_m``. ``R^tool`` is the per-event channel ``tool`` summed over
    the agent's events (tool results count for the calling agent). The paper's ``lambda_s``
    and ``lambda_p`` are not published: both default to 1 (the plain sum). Unbiased std; an
    agent alone in its cell gets 0. Weights: each agent's events share ``1/(G * N_i)``.
    """
    events = Events(batch)
    delta = np.nan_to_num(events.amounts("marginal", marginal))
    unit = dense(events.trace, events.owner)
    n_units = int(unit.max(initial=-1)) + 1
    unit_trace = np.zeros(n_units, np.int64)
    unit_trace[unit] = events.trace
    unit_agent = np.zeros(n_units, np.int64)
    unit_agent[unit] = events.owner
    acts = np.bincount(unit, weights=events.acting, minlength=n_units) > 0
    reward = (
        events.trace_reward(channel)[unit_trace]
        + lambda_shapley * np.bincount(unit, weights=delta, minlength=n_units)
        + lambda_tool * np.bincount(unit, weights=events.event_reward(tool, optional=True), minlength=n_units)
    )
    advantage = np.zeros(n_units)
    cells = dense(events.trace_group[unit_trace[acts]], unit_agent[acts])
    advantage[acts] = grpo(reward[acts], cells, eps=eps)
    weights = nested_weights(events, events.acting, [events.trace, events.owner])
    return result(events, "sharp", np.where(events.acting, advantage[unit], 0.0), weights, ("agent",))
