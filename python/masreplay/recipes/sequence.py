"""Recipes that credit each step of a sequence: MARFT (GAE over the (step, agent) sequence),
MAPoRL (discounted verifier scores per agent and turn), MARSHAL (per-player turn returns),
Puppeteer (REINFORCE returns of orchestrator steps) and Agent Q-Mix (TD errors through a
monotone mixer)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from masreplay._args import checked, numbers, unsummable
from masreplay.advantages import Advantages
from masreplay.errors import InvalidArgumentError
from masreplay.recipes._events import Events, cell_stats, dense, grpo, nested_weights, result, reverse_discounted, whiten


def _per_action(
    events: Events, name: str, rows: np.ndarray, values: np.ndarray, unit: tuple[str, ...], trained: np.ndarray
) -> Advantages:
    """The result of per-action credit ``values`` at ``rows``: each ``trained`` event of a
    group weighs the same (a sample mean over actions)."""
    per_event = np.zeros(events.n_events)
    per_event[rows] = values
    weights = nested_weights(events, trained, [np.arange(events.n_events)], by_tokens=False)
    return result(events, name, per_event, weights, unit)


def _acting_in_time(events: Events) -> np.ndarray:
    """Acting events of every trace in time order (traces contiguous)."""
    return events.time_order[events.acting[events.time_order]]


def _with_outcome(events: Events, rows: np.ndarray, channel: str, at: np.ndarray) -> np.ndarray:
    """Per-event ``channel`` rewards of ``rows`` plus the trace's ``channel`` reward on the rows
    where ``at`` is True (the step the outcome is paid at); a trace without one adds 0, its
    rewards being all on its events."""
    reward = events.event_reward(channel)[rows]
    outcome = events.trace_reward(channel, fill=0.0)[events.trace[rows]]
    return reward + np.where(at, outcome, 0.0)


def _last_of(keys: np.ndarray) -> np.ndarray:
    """True at the last row of each run of equal keys."""
    return np.r_[keys[1:] != keys[:-1], True] if len(keys) else np.zeros(0, bool)


@checked
def marft(
    batch: Any,
    values: Any,
    *,
    channel: str = "team",
    gamma: float = 0.99,
    lam: float = 0.95,
    normalize: bool = True,
) -> Advantages:
    """MARFT (arXiv 2504.16129), action-level: GAE over the flattened (step, agent) sequence.

    The acting events of a trace in time order are the sequence (agent k of step t, then
    agent k+1, ...); an action's reward is its per-event ``channel`` reward, and the last
    action also gets the trace's ``channel`` reward (MARFT pays the score to the last agent).
    ``delta_k = r_k + gamma V_{k+1} - V_k`` (V past the end: 0), ``A_k = delta_k + gamma lam
    A_{k+1}``. ``values`` is the learned critic V per event (an input: array, event column or
    attribute key). With ``normalize`` (MARFT's, from MAPPO), advantages are standardised over
    the batch ignoring exact zeros: ``(A - mean) / (std + 1e-5)``, population std. Weights:
    each action of a group equally.
    """
    events = Events(batch)
    v = events.amounts("values", values, needed=events.acting)
    rows = _acting_in_time(events)
    traces = events.trace[rows]
    last = _last_of(traces)
    reward = _with_outcome(events, rows, channel, last)
    value = v[rows]
    next_value = np.where(last, 0.0, np.r_[value[1:], 0.0])
    delta = reward + gamma * next_value - value
    advantage = reverse_discounted(delta, traces, gamma * lam)
    if normalize:
        counted = advantage[advantage != 0]
        if len(counted):
            advantage = (advantage - counted.mean()) / (counted.std() + 1e-5)
    return _per_action(events, "marft", rows, advantage, ("agent", "step"), events.acting)


@checked
def maporl(
    batch: Any,
    *,
    channel: str = "verifier",
    rho: float = 0.3,
    values: Any = None,
    alpha: Sequence[float] = (0.0, 0.0, 0.0, 0.0),
    correct: str = "correct",
) -> Advantages:
    """MAPoRL (arXiv 2502.18439), default rule (``discounted_sum``, ``all`` agents):

    ``score_{i,t} = [v_{i,t} + sum_{t'>t} rho^(t'-t) mean_j v_{j,t'}] / sum_{t'=t..T} rho^(t'-t)``

    with ``v_{i,t}`` the verifier's score of agent i's turn-t response: the per-event
    ``channel`` (a learned verifier's output, recorded on the events; 0 where absent), a turn
    being an agent's k-th acting event and T the trace's last turn. The PPO step uses a value
    head: ``A = score - V`` with ``values`` per event (an input; default 0), whitened per
    (turn, agent) over the batch (TRL's whitening, unbiased var + 1e-8). Weights: each
    response of a group equally.

    The incentive bonus (``bonus_rule``; ``alpha = (a0, a1, a2, a3)`` is given on the
    authors' command line and has no published default, so the default here is off) reads a
    per-event ``correct`` channel (a correctness label; >= 0.5 is correct, the code's
    threshold). "The others" of agent i at a turn are correct when the mean of their labels
    is >= 0.5 (with two agents: the other agent). Added to ``score_{i,t}`` before the critic:
    - the agent's own label flips from turn t-1 to t: +a when it becomes correct, -a when it
      becomes wrong, with a = a0 when the others stood opposite to the agent at t-1 (it was
      corrected, or persuaded wrongly) and a1 when they stood with it;
    - the others' label flips from t to t+1: +a when they become correct, -a when they become
      wrong, with a = a2 when the agent is correct at t and a3 when it is wrong.
    The signs and the "mean of the others" rule for more than two agents are choices made
    here; the paper's notes leave them open.
    """
    events = Events(batch)
    rows = np.flatnonzero(events.acting)
    turn = events.turn[rows]
    trace = events.trace[rows]
    score = events.event_reward(channel)[rows]
    turns = int(turn.max(initial=-1)) + 1
    slot = trace * turns + turn
    per_slot = np.bincount(slot, weights=score, minlength=events.n_traces * turns)
    agents = np.bincount(slot, minlength=events.n_traces * turns)
    mean = np.divide(per_slot, agents, out=np.zeros(len(per_slot)), where=agents > 0).reshape(events.n_traces, turns)
    last_turn = np.full(events.n_traces, -1, np.int64)
    np.maximum.at(last_turn, trace, turn)
    # S_t = sum_{t' >= t} rho^(t'-t) mean_{t'}, by a backward pass over turns.
    suffix = np.zeros((events.n_traces, turns + 1))
    for t in range(turns - 1, -1, -1):
        suffix[:, t] = mean[:, t] + rho * suffix[:, t + 1]
    remaining = last_turn[trace] - turn + 1  # T - t + 1 turns from t to T
    norm = remaining.astype(np.float64) if rho == 1.0 else (1.0 - rho**remaining) / (1.0 - rho)
    score = (score + rho * suffix[trace, turn + 1]) / norm
    if any(alpha):
        score = score + _maporl_bonus(events.event_reward(correct)[rows] >= 0.5, trace, turn, events.owner[rows], turns, alpha)
    if values is not None:
        score = score - events.amounts("values", values, needed=rows)[rows]
    n, mean_cell, std_cell = cell_stats(score, dense(turn, events.owner[rows]))
    advantage = np.where(n > 1, (score - mean_cell) / np.sqrt(np.nan_to_num(std_cell) ** 2 + 1e-8), 0.0)
    return _per_action(events, "maporl", rows, advantage, ("agent", "turn"), events.acting)


def _maporl_bonus(
    right: np.ndarray, trace: np.ndarray, turn: np.ndarray, owner: np.ndarray, turns: int, alpha: Sequence[float]
) -> np.ndarray:
    """MAPoRL's incentive bonus per response (see :func:`maporl`)."""
    if len(alpha) != 4:
        raise InvalidArgumentError(f"alpha must be four numbers (a0, a1, a2, a3), got {alpha!r}")
    a0, a1, a2, a3 = (float(a) for a in alpha)
    slot = trace * turns + turn
    size = int(trace.max(initial=-1) + 1) * turns + 1  # one spare slot past the last turn
    right_sum = np.bincount(slot, weights=right, minlength=size)
    count = np.bincount(slot, minlength=size)
    # The same agent's response one turn earlier and later (turns are consecutive per agent).
    order = np.lexsort((turn, owner, trace))
    same_before = np.zeros(len(order), bool)
    same_before[1:] = (trace[order][1:] == trace[order][:-1]) & (owner[order][1:] == owner[order][:-1])
    previous = np.full(len(right), -1)
    previous[order[1:][same_before[1:]]] = order[:-1][same_before[1:]]
    following = np.full(len(right), -1)
    following[order[:-1][same_before[1:]]] = order[1:][same_before[1:]]

    def others_right(at_slot: np.ndarray, own: np.ndarray, own_present: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Whether the other agents of a slot are correct (mean label >= 0.5), and whether there are any."""
        total = right_sum[at_slot] - np.where(own_present, own, 0.0)
        n = count[at_slot] - own_present
        return np.divide(total, n, out=np.zeros(len(n)), where=n > 0) >= 0.5, n > 0

    bonus = np.zeros(len(right))
    has_previous = previous >= 0
    before = previous[has_previous]
    rows = np.flatnonzero(has_previous)
    was_right = right[before]
    others_then, any_then = others_right(slot[before], was_right, np.ones(len(before), bool))
    flipped = (right[rows] != was_right) & any_then
    size_of = np.where(others_then != was_right, a0, a1)
    bonus[rows] += np.where(flipped, np.where(right[rows], size_of, -size_of), 0.0)

    later = turn < turns - 1
    rows = np.flatnonzero(later)
    own_next = following[rows]
    others_now, any_now = others_right(slot[rows], right[rows], np.ones(len(rows), bool))
    others_next, any_next = others_right(slot[rows] + 1, right[np.maximum(own_next, 0)], own_next >= 0)
    flipped = (others_now != others_next) & any_now & any_next
    size_of = np.where(right[rows], a2, a3)
    bonus[rows] += np.where(flipped, np.where(others_next, size_of, -size_of), 0.0)
    return bonus


@checked
def marshal(
    batch: Any,
    *,
    channel: str = "team",
    gamma: float = 1.0,
    reward_norm: str = "mean",
) -> Advantages:
    """MARSHAL / MARS (arXiv 2510.15414): turn-level returns with agent-specific normalisation.

    1. A player's turn reward is its acting event's ``channel`` reward, plus the trace's
       ``channel`` reward on the player's last turn (the game score where only the outcome is
       logged). Rewards are normalised per (group, player): ``reward_norm="mean"`` subtracts
       the cell mean, ``"mean_std"`` also divides by the cell std + 1e-6; then whitened over
       the batch.
    2. ``G_t = sum_k gamma^k r_{t+k}`` over the player's own later turns (gamma 1: ROLL's
       ``compute_reinforce_return``, "sum then normalise").
    3. The returns are mean-centred per (group, player), then whitened over the batch.

    Players are the events' owners; the group (``group_id``) plays the environment tag.
    Weights: each turn of a group equally.
    """
    if reward_norm not in ("mean", "mean_std"):
        raise InvalidArgumentError(f"reward_norm must be 'mean' or 'mean_std', got {reward_norm!r}")
    events = Events(batch)
    rows = _acting_in_time(events)
    player = dense(events.trace[rows], events.owner[rows])
    by_player = np.argsort(player, kind="stable")  # each player's turns contiguous, in time order
    rows, player = rows[by_player], player[by_player]
    reward = _with_outcome(events, rows, channel, _last_of(player))
    cells = dense(events.group[rows], events.owner[rows])
    reward = whiten(grpo(reward, cells, scale=reward_norm == "mean_std"))
    returns = reverse_discounted(reward, player, gamma)
    advantage = whiten(grpo(returns, cells, scale=False))
    return _per_action(events, "marshal", rows, advantage, ("agent", "turn"), events.acting)


@checked
def puppeteer(
    batch: Any,
    *,
    channel: str = "team",
    gamma: float = 0.99,
    max_path: int = 6,
    factors: Mapping[str, float] | None = None,
    default_factor: float = -1.0,
    steps: Any = None,
) -> Advantages:
    """Puppeteer (arXiv 2505.19591): REINFORCE returns of the orchestrator's agent selections.

    Steps are the orchestrator's ``spawn`` events in time order (or the events ``steps``
    marks). Step s costs ``c(s) = 0.1 log(1 + (s+1)/(max_path+1)) / log 2`` and earns
    ``r_s = c(s) * f(agent) * tokens_s / 100000``, with ``tokens_s`` the tokens of the selected
    agent's events and ``f`` from ``factors`` (agent name -> factor; the paper's pool: -1 for an
    ordinary agent, -1.5 for web search, +0.5 for the terminator; names absent from
    ``factors`` get ``default_factor``). The last step adds ``R_task + 0.5 c(T)`` if
    ``R_task > 0`` else ``R_task - 0.5 c(T)``, T its index. ``G_s = sum_k gamma^k r_{s+k}``,
    no baseline. Weights: each step of a group equally (``sample_size`` 1).
    """
    events = Events(batch)
    if steps is None:
        marked = events.of_type("spawn") & events.root
    else:
        marked = np.nan_to_num(events.column("steps", steps), nan=0.0) != 0
    rows = events.time_order[marked[events.time_order]]
    traces = events.trace[rows]
    starts = np.r_[True, traces[1:] != traces[:-1]] if len(rows) else np.zeros(0, bool)
    index = np.arange(len(rows)) - np.maximum.accumulate(np.where(starts, np.arange(len(rows)), 0))
    cost = 0.1 * np.log1p((index + 1) / (max_path + 1)) / np.log(2.0)
    selected = _selected_agent(events, rows)
    # Tokens of each (trace, agent), looked up for (trace, selected agent).
    width = int(events.owner.max(initial=0)) + 1
    keys, inverse = np.unique(events.trace * width + events.owner, return_inverse=True)
    agent_tokens = np.bincount(inverse.ravel(), weights=events.tokens)
    wanted = traces * width + selected
    found = np.minimum(np.searchsorted(keys, wanted), max(len(keys) - 1, 0))
    tokens = np.where((selected >= 0) & (keys[found] == wanted), agent_tokens[found], 0.0) if len(keys) else np.zeros(len(rows))
    names = events.agent_names.cast(pa.string()).to_pylist()
    chosen = dict(factors or {})
    by_code = np.array([chosen.get(name, default_factor) for name in names] + [default_factor])
    factor = by_code[selected]  # -1 (no agent) picks the default at the end
    reward = cost * factor * tokens / 100000.0
    last = _last_of(traces)
    outcome = events.trace_reward(channel)[traces]
    reward = reward + np.where(last, outcome + np.where(outcome > 0, 0.5, -0.5) * cost, 0.0)
    returns = reverse_discounted(reward, traces, gamma)
    return _per_action(events, "puppeteer", rows, returns, ("orchestrator_step",), marked)


def _selected_agent(events: Events, rows: np.ndarray) -> np.ndarray:
    """Agent code of each step's ``to`` (-1 where it names no agent)."""
    to = events.batch._event_array("to")
    names = to.dictionary.cast(pa.string())
    codes = events.code_of(names)
    indices = to.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)[rows]
    return np.where(indices >= 0, codes[np.maximum(indices, 0)], -1)


@checked
def agent_qmix(
    batch: Any,
    q_values: Any,
    mixer: Callable[[np.ndarray, np.ndarray], np.ndarray],
    *,
    target_q: Any = None,
    target_mixer: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
    channel: str = "team",
    gamma: float = 0.99,
    step: float = 1e-4,
) -> Advantages:
    """Agent Q-Mix (arXiv 2604.00344): QMIX value factorisation of per-round agent actions.

    Round r of a trace holds each agent's r-th acting event. Inputs a trace cannot carry:
    ``q_values`` (per event, the agent's Q of its chosen action), ``target_q`` (per event,
    ``max_u Q_i^target`` of the target network; default ``q_values``), and ``mixer(q, mask)``
    mapping ``(rounds, agents)`` Q matrices (``mask`` True where the agent acted; absent
    agents hold 0) to ``Q_tot`` per round (``target_mixer`` defaults to ``mixer``). With the
    team reward R (``channel``, copied to every round):
    ``y_r = R + gamma (1 - done_r) Q_tot^target(r + 1)``, ``delta_r = y_r - Q_tot(r)``, and
    each agent's credit is the TD error its Q-head receives, ``delta_r * dQ_tot/dQ_i``
    (central differences of ``mixer`` with ``step``). Agents are ordered within a trace by
    their agent code. Weights: each (round, agent) of a group equally.
    """
    events = Events(batch)
    q = events.amounts("q_values", q_values, needed=events.acting)
    tq = q if target_q is None else events.amounts("target_q", target_q, needed=events.acting)
    target_mixer = mixer if target_mixer is None else target_mixer
    rows = np.flatnonzero(events.acting)
    trace, turn = events.trace[rows], events.turn[rows]
    column = dense(trace, events.owner[rows])
    first_column = np.full(events.n_traces, np.iinfo(np.int64).max)
    np.minimum.at(first_column, trace, column)
    column = column - first_column[trace]
    n_agents = int(column.max(initial=-1)) + 1
    rounds = int(turn.max(initial=-1)) + 1
    # One row per (trace, round) that has an action: (rounds, agents) matrices for the mixer.
    slot_of_row = trace * rounds + turn
    slot = dense(slot_of_row)
    n_slots = int(slot.max(initial=-1)) + 1
    matrix, target, mask = np.zeros((n_slots, n_agents)), np.zeros((n_slots, n_agents)), np.zeros((n_slots, n_agents), bool)
    matrix[slot, column], target[slot, column], mask[slot, column] = q[rows], tq[rows], True
    q_tot = _mix(mixer, matrix, mask)
    # Q_tot^target of the next round of the same trace; 0 after the last (done).
    slot_key = np.zeros(n_slots, np.int64)
    slot_key[slot] = slot_of_row
    q_next = np.r_[_mix(target_mixer, target, mask)[1:], 0.0]
    q_next[np.r_[slot_key[1:] // rounds != slot_key[:-1] // rounds, True]] = 0.0
    reward = events.trace_reward(channel)[slot_key // rounds]
    delta = reward + gamma * q_next - q_tot
    credit = delta[slot] * _gradient(mixer, matrix, mask, step)[slot, column]
    return _per_action(events, "agent_qmix", rows, credit, ("agent", "round"), events.acting)


def _mix(mixer: Callable, matrix: np.ndarray, mask: np.ndarray) -> np.ndarray:
    out = numbers("the mixer's Q_tot", mixer(matrix, mask))
    if out.shape != (len(matrix),):
        raise InvalidArgumentError(f"the mixer returned shape {out.shape} for {len(matrix)} rounds")
    beyond = out[unsummable(out, missing=False)]  # what a value function returns is summed
    if len(beyond):
        raise InvalidArgumentError(f"the mixer returned {beyond[0]:g}: Q_tot must be finite, below 2^49")
    return out


def _gradient(mixer: Callable, matrix: np.ndarray, mask: np.ndarray, step: float) -> np.ndarray:
    """dQ_tot/dQ_i per round and agent, by central differences (two mixer calls per agent)."""
    gradient = np.zeros(matrix.shape)
    for agent in range(matrix.shape[1]):
        shifted = matrix.copy()
        shifted[:, agent] += step
        up = _mix(mixer, shifted, mask)
        shifted[:, agent] -= 2 * step
        gradient[:, agent] = (up - _mix(mixer, shifted, mask)) / (2 * step)
    return gradient
