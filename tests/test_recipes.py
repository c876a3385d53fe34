"""masreplay.recipes: known answers derived by hand from each paper's equations, properties the
methods promise (hypothesis), and transcriptions of the authors' published formulas.

Expected values are written as arithmetic on the numbers of the hand-built traces, never by
calling masreplay. The standard group (``_standard``) is three rollouts of one task, each:

    e0 orch  orchestrator_decision   10 tokens
    e1 orch  spawn -> w1             10
    e2 orch  spawn -> w2             10
    e3 w1    message                 20
    e4 w1    tool_call (search)      20
    e5 search tool_result (tool 1)   30   answers e4: it belongs to w1; an observation
    e6 w2    message                 40
    e7 orch  aggregate               10

with team rewards 1, 0 and 0.5.
"""

from __future__ import annotations

import collections.abc
import inspect
import math
import typing

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import masreplay
from masreplay import recipes
from masreplay.errors import InvalidArgumentError

EPS = 1e-6
REWARDS = (1.0, 0.0, 0.5)
TOKENS = (10, 10, 10, 20, 20, 30, 40, 10)
ACTING = np.array([1, 1, 1, 1, 1, 0, 1, 1], dtype=bool)  # e5 is the tool result


def _trace(trace_id: str, events: list[dict], reward: float, *, group: str = "q", edges=(), **extra) -> dict:
    return {
        "trace_id": trace_id,
        "task_id": group,
        "group_id": group,
        "events": [{"id": f"e{k}", "t": float(k), **event} for k, event in enumerate(events)],
        "edges": [{"src": s, "dst": d, "type": kind} for s, d, kind in edges],
        "rewards": {"team": reward, **extra},
        "costs": {"tokens": 0, "wall_clock_s": 0},
    }


def _standard_events(**per_event: dict) -> list[dict]:
    events = [
        {"type": "orchestrator_decision", "agent": "orch"},
        {"type": "spawn", "agent": "orch", "to": "w1"},
        {"type": "spawn", "agent": "orch", "to": "w2"},
        {"type": "message", "agent": "w1", "from": "w1", "to": "orch"},
        {"type": "tool_call", "agent": "w1", "tool": "search"},
        {"type": "tool_result", "agent": "search", "tool": "search", "reward": {"tool": 1.0}},
        {"type": "message", "agent": "w2", "from": "w2", "to": "orch"},
        {"type": "aggregate", "agent": "orch"},
    ]
    for event, tokens in zip(events, TOKENS, strict=True):
        event["tokens"] = tokens
    for key, extra in per_event.items():
        events[int(key[1:])].update(extra)
    return events


STANDARD_EDGES = [("e1", "e3", "spawn"), ("e2", "e6", "spawn"), ("e4", "e5", "tool_dependency")]


def _standard(per_trace_events: tuple[dict, dict, dict] = ({}, {}, {}), rewards=REWARDS) -> masreplay.TraceBatch:
    return masreplay.load_traces(
        [
            _trace(name, _standard_events(**extra), reward, edges=STANDARD_EDGES)
            for name, extra, reward in zip("abc", per_trace_events, rewards, strict=True)
        ]
    )


def _grid(values_per_trace: list[list[float]]) -> np.ndarray:
    return np.concatenate([np.asarray(v, dtype=np.float64) for v in values_per_trace])


def _same(actual, expected, tol: float = 1e-9) -> None:
    np.testing.assert_allclose(np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64), rtol=0, atol=tol)


# The GRPO numbers of rewards (1, 0, 0.5): mean 0.5, unbiased std 0.5.
GRPO = [(r - 0.5) / (0.5 + EPS) for r in REWARDS]


def _broadcast(per_trace: list[float], mask: np.ndarray = ACTING) -> np.ndarray:
    return _grid([np.where(mask, a, 0.0) for a in per_trace])


# ---- outcome recipes ----------------------------------------------------------------------------


def test_matpo_broadcasts_the_planner_advantage_with_token_mean_weights():
    adv = recipes.matpo(_standard())
    _same(adv.per_event, _broadcast(GRPO))
    acting_tokens = sum(t for t, a in zip(TOKENS, ACTING, strict=True) if a)  # 100 per rollout
    _same(adv.weights, _grid([np.where(ACTING, np.array(TOKENS) / (3 * acting_tokens), 0.0)] * 3))
    _same(adv.per_trace, GRPO)


def test_matpo_seq_mean_divides_by_planner_rollouts_only():
    adv = recipes.matpo(_standard(), loss_agg="seq-mean")
    # sequences: orch (e0,e1,e2,e7: 40 tokens), w1 (e3,e4: 40), w2 (e6: 40); each weighs 1/3
    per_event = [10 / 40, 10 / 40, 10 / 40, 20 / 40, 20 / 40, 0.0, 40 / 40, 10 / 40]
    _same(adv.weights, _grid([np.array(per_event) / 3] * 3))


def test_wideseek_r1_weights_one_over_g_agents_tokens():
    adv = recipes.wideseek_r1(_standard())
    _same(adv.per_event, _broadcast(GRPO))
    # 1/G * 1/N_i (3 agents) * tokens_e / tokens of its agent (orch 40, w1 40, w2 40)
    per_event = [1 / 3 * 1 / 3 * t / 40 if a else 0.0 for t, a in zip(TOKENS, ACTING, strict=True)]
    _same(adv.weights, _grid([per_event] * 3))


def test_agent_lightning_rollout_level_advantage_and_per_rollout_weights():
    adv = recipes.agent_lightning(_standard())
    _same(adv.per_event, _broadcast(GRPO))
    per_event = [1 / 3 * t / 120 if a else 0.0 for t, a in zip(TOKENS, ACTING, strict=True)]
    _same(adv.weights, _grid([per_event] * 3))


def test_dr_mas_normalises_each_agent_over_all_its_invocations():
    invalid = ({}, {"e3": {"invalid": True}}, {})
    adv = recipes.dr_mas(_standard(invalid), invalid="invalid")
    # orch: 4 invocations per rollout, rewards 1 x4, 0 x4, 0.5 x4
    orch_std = math.sqrt((4 * 0.25 + 4 * 0.25 + 4 * 0) / 11)
    # w1: (1, 1), (0 - 0.1, 0), (0.5, 0.5): mean 0.4833...
    w1 = [1.0, 1.0, -0.1, 0.0, 0.5, 0.5]
    w1_mean = sum(w1) / 6
    w1_std = math.sqrt(sum((x - w1_mean) ** 2 for x in w1) / 5)
    w2_std = math.sqrt((0.25 + 0.25 + 0) / 2)
    expected = []
    for k, r in enumerate(REWARDS):
        o = (r - 0.5) / (orch_std + EPS)
        a3, a4 = ((w1[2 * k] - w1_mean) / (w1_std + EPS), (w1[2 * k + 1] - w1_mean) / (w1_std + EPS))
        expected.append([o, o, o, a3, a4, 0.0, (r - 0.5) / (w2_std + EPS), o])
    _same(adv.per_event, _grid(expected))
    _same(adv.weights, _grid([np.where(ACTING, 1 / 21, 0.0)] * 3))  # 7 invocations x 3 rollouts


def test_dr_mas_singleton_cell_gets_mean_zero_std_one_and_vanilla_averages_first():
    lone = masreplay.load_traces([_trace("z", [{"type": "message", "agent": "solo"}], 0.7, group="alone")])
    _same(recipes.dr_mas(lone).per_event, [0.7 / (1 + EPS)])
    adv = recipes.dr_mas(_standard(({}, {"e3": {"invalid": 1}}, {})), invalid="invalid", group_by_agent=False)
    means = [1.0, (0 * 6 - 0.1) / 7, 0.5]
    mean = sum(means) / 3
    std = math.sqrt(sum((m - mean) ** 2 for m in means) / 2)
    _same(adv.per_event, _broadcast([(m - mean) / (std + EPS) for m in means]))


def test_kimi_parl_trains_only_the_orchestrator_with_mean_baseline():
    adv = recipes.kimi_parl(_standard())
    orch = np.array([1, 1, 1, 0, 0, 0, 0, 1], dtype=bool)
    _same(adv.per_event, _grid([np.where(orch, r - 0.5, 0.0) for r in REWARDS]))
    _same(adv.weights, _grid([np.where(orch, np.array(TOKENS) / 120, 0.0)] * 3))


def test_context_folding_clips_reward_plus_process_penalty():
    process = ({"e3": {"reward": {"process": -0.2}}}, {"e6": {"reward": {"process": -1.0}}}, {"e0": {"reward": {"process": 0.8}}})
    adv = recipes.context_folding(_standard(process))
    a = [(1 - 0.5) / (0.5 + EPS)] * 8
    a[3] = (min(max(1 - 0.2, 0), 1) - 0.5) / (0.5 + EPS)
    b = [(0 - 0.5) / (0.5 + EPS)] * 8
    b[6] = (min(max(0 - 1.0, 0), 1) - 0.5) / (0.5 + EPS)
    c = [0.0] * 8
    c[0] = (min(max(0.5 + 0.8, 0), 1) - 0.5) / (0.5 + EPS)
    _same(adv.per_event, _grid([np.where(ACTING, x, 0.0) for x in (a, b, c)]))


def test_mgrpo_paper_normalises_main_and_sub_levels_separately():
    adv = recipes.mgrpo(_standard(), sub_calls=2)
    main_std = math.sqrt((0.25 + 0.25 + 0) / 3)  # population std over K = 3
    sub = [0.1 * 1 + 0.4 * r + 0.5 * 0 for r in REWARDS]  # b1 format + b2 correct_main + b3 expert
    sub_mean = sum(sub) / 3
    sub_std = math.sqrt(sum(2 * (s - sub_mean) ** 2 for s in sub) / 6)  # D*K = 6 aligned calls
    expected = []
    for r, s in zip(REWARDS, sub, strict=True):
        m, w = (r - 0.5) / (main_std + EPS), (s - sub_mean) / (sub_std + EPS)
        expected.append([m, m, m, w, w, 0.0, w, m])
    _same(adv.per_event, _grid(expected))
    # main: 1/K per rollout over its 4 events (by tokens, all 10); sub: 1/(D K) per call
    _same(adv.weights, _grid([[1 / 12, 1 / 12, 1 / 12, 1 / 12, 1 / 12, 0, 1 / 6, 1 / 12]] * 3))


def test_mgrpo_format_gates_and_alpha_weights():
    formats = ({"e0": {"reward": {"format": 1.0}}, "e6": {"reward": {"format": 0.0}}}, {}, {})
    adv = recipes.mgrpo(_standard(formats), sub_calls=2)
    main = [0.1 * 1 + 0.9 * r for r in REWARDS]  # a1 format + a2 correct (format 1 where unrecorded)
    main_mean = sum(main) / 3
    main_std = math.sqrt(sum((m - main_mean) ** 2 for m in main) / 3)
    w1 = [0.1 + 0.4 * r for r in REWARDS]
    w2 = [0.0, 0.1 + 0.4 * 0.0, 0.1 + 0.4 * 0.5]  # trace a's w2 broke the format: R_S = 0
    calls = w1 + w2
    sub_mean = sum(calls) / 6
    sub_std = math.sqrt(sum((c - sub_mean) ** 2 for c in calls) / 6)
    expected = []
    for k in range(3):
        m = (main[k] - main_mean) / (main_std + EPS)
        a, b = (w1[k] - sub_mean) / (sub_std + EPS), (w2[k] - sub_mean) / (sub_std + EPS)
        expected.append([m, m, m, a, a, 0.0, b, m])
    _same(adv.per_event, _grid(expected))


def test_mgrpo_code_variant_uses_the_released_reward():
    adv = recipes.mgrpo(_standard(), variant="code", sub_calls=2)
    sub = [1.0, 0.1 * 1, 1.0]  # M's reward 0 -> 0.1 * format, else 1
    mean = sum(sub) / 3
    std = math.sqrt(sum(2 * (s - mean) ** 2 for s in sub) / 6)
    _same(adv.per_event[3::8], [(s - mean) / (std + EPS) for s in sub])


def test_mgrpo_alignment_pads_and_drops_to_d_calls():
    adv = recipes.mgrpo(_standard(), sub_calls=1, seed=3)
    sub_weights = adv.weights.reshape(3, 8)[:, [3, 4, 6]]
    # each rollout keeps one of its two calls, weighing 1/(D K) = 1/3; the dropped one 0
    w1_kept = sub_weights[:, 0] > 0
    _same(sub_weights.sum(axis=1), [1 / 3] * 3)
    assert np.all(w1_kept == (sub_weights[:, 2] == 0))
    padded = recipes.mgrpo(_standard(), sub_calls=3, seed=3).weights.reshape(3, 8)[:, [3, 4, 6]]
    _same(padded.sum(axis=1), [1 / 3] * 3)  # 3 aligned calls of 1/9, one counted twice


def test_sharp_adds_marginals_and_tool_rewards_per_agent():
    marginal = _grid([[0, 0, 0, 0.2, 0, 0, -0.1, 0], [0, 0, 0, 0.0, 0, 0, 0.3, 0], [0.1, 0, 0, 0.4, 0, 0, 0.0, 0]])
    adv = recipes.sharp(_standard(), marginal, lambda_shapley=1.0, lambda_tool=0.5)
    orch = [1.0, 0.0, 0.5 + 0.1]
    w1 = [1.0 + 0.2 + 0.5, 0.0 + 0.5, 0.5 + 0.4 + 0.5]  # the tool result's 1 counts for w1
    w2 = [1.0 - 0.1, 0.0 + 0.3, 0.5]

    def norm(values):
        mean = sum(values) / 3
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / 2)
        return [(v - mean) / (std + EPS) for v in values]

    expected = [[o, o, o, a, a, 0.0, b, o] for o, a, b in zip(norm(orch), norm(w1), norm(w2), strict=True)]
    _same(adv.per_event, _grid(expected))


# ---- tree recipes ---------------------------------------------------------------------------------

# Two agents A and B act at every node; paths (x, x1), (x, x2), (y, y1), (y, y2).
PATHS = {"p1": ("x", "x1", 1.0), "p2": ("x", "x2", 0.0), "p3": ("y", "y1", 1.0), "p4": ("y", "y2", 1.0)}


def _tree_batch(node_extra: dict | None = None) -> masreplay.TraceBatch:
    traces = []
    for name, (first, second, reward) in PATHS.items():
        events = []
        for label in (first, second):
            for agent in ("A", "B"):
                events.append({"type": "message", "agent": agent, "node": label, **(node_extra or {}).get((label, agent), {})})
        traces.append(_trace(name, events, reward))
    return masreplay.load_traces(traces)


def test_magrpo_tree_returns_and_sibling_baselines():
    adv = recipes.magrpo(_tree_batch({("x", "A"): {"reward": {"team": 0.2}}}), node="node", gamma=0.9)
    r_x1, r_x2, r_y1, r_y2 = 1.0, 0.0, 1.0, 1.0
    big_r_x = 0.2 + 0.9 * (r_x1 + r_x2) / 2
    big_r_y = 0.0 + 0.9 * (r_y1 + r_y2) / 2
    a_x, a_y = big_r_x - (big_r_x + big_r_y) / 2, big_r_y - (big_r_x + big_r_y) / 2
    per_node = {"x": a_x, "y": a_y, "x1": r_x1 - 0.5, "x2": r_x2 - 0.5, "y1": 0.0, "y2": 0.0}
    expected = [[per_node[f]] * 2 + [per_node[s]] * 2 for f, s, _ in PATHS.values()]
    _same(adv.per_event, _grid(expected))
    # six nodes, each 1/6 of the group; x and y are copied on two paths (4 events each)
    _same(adv.weights, _grid([[1 / 24, 1 / 24, 1 / 12, 1 / 12]] * 4))
    rloo = recipes.magrpo(_tree_batch(), node="node", advantage_mode="rloo")
    big_r_x, big_r_y = 0.9 * 0.5, 0.9 * 1.0
    _same(rloo.per_event[0], (2 * big_r_x - (big_r_x + big_r_y)) / 1)


def test_tree_nodes_may_come_from_an_event_column():
    traces = []
    for name, (first, second, reward) in PATHS.items():
        events = [{"type": "message", "agent": agent, "content_ref": label} for label in (first, second) for agent in ("A", "B")]
        traces.append(_trace(name, events, reward))
    by_column = recipes.c3(masreplay.load_traces(traces), node="content_ref", alpha=0.0)
    _same(by_column.per_event, recipes.c3(_tree_batch(), node="node", alpha=0.0).per_event)
    labels = np.array([label for first, second, _ in PATHS.values() for label in (first, first, second, second)])
    _same(recipes.c3(_tree_batch(), node=labels, alpha=0.0).per_event, by_column.per_event)


def test_magrpo_without_nodes_is_the_flat_one_turn_group():
    adv = recipes.magrpo(_standard())
    _same(adv.per_event, _broadcast([r - 0.5 for r in REWARDS]))


def test_c3_leave_one_out_with_and_without_the_critic():
    reward_only = recipes.c3(_tree_batch(), node="node", alpha=0.0)
    r = {"x": 0.5, "y": 1.0, "x1": 1.0, "x2": 0.0, "y1": 1.0, "y2": 1.0}  # mean leaf reward below
    loo = {"x": r["y"], "y": r["x"], "x1": r["x2"], "x2": r["x1"], "y1": r["y2"], "y2": r["y1"]}
    expected = [[r[f] - loo[f]] * 2 + [r[s] - loo[s]] * 2 for f, s, _ in PATHS.values()]
    _same(reward_only.per_event, _grid(expected))
    q = {"x": 0.4, "y": 0.7, "x1": 0.9, "x2": 0.2, "y1": 0.6, "y2": 0.8}
    values = _grid([[q[f]] * 2 + [q[s]] * 2 for f, s, _ in PATHS.values()])
    critic = recipes.c3(_tree_batch(), node="node", values=values)
    sibling = {"x": "y", "y": "x", "x1": "x2", "x2": "x1", "y1": "y2", "y2": "y1"}
    expected = [[r[f] - q[sibling[f]]] * 2 + [r[s] - q[sibling[s]]] * 2 for f, s, _ in PATHS.values()]
    _same(critic.per_event, _grid(expected))
    half = recipes.c3(_tree_batch(), node="node", values=values, alpha=0.5)
    _same(half.per_event[0], r["x"] - (0.5 * r["y"] + 0.5 * q["y"]))
    with pytest.raises(InvalidArgumentError, match="Q-critic"):
        recipes.c3(_tree_batch(), node="node")


def test_malt_values_are_means_over_children():
    # n = 2: g1, g2; each with two verifications; each verification with two refinements
    correct = {
        ("g1", "v1", "r1"): 1,
        ("g1", "v1", "r2"): 1,
        ("g1", "v2", "r1"): 0,
        ("g1", "v2", "r2"): 1,
        ("g2", "v1", "r1"): 0,
        ("g2", "v1", "r2"): 0,
        ("g2", "v2", "r1"): 1,
        ("g2", "v2", "r2"): 0,
    }
    traces = []
    for k, ((g, v, r), ok) in enumerate(correct.items()):
        events = [
            {"type": "message", "agent": role, "node": label}
            for role, label in (("generator", g), ("verifier", f"{g}/{v}"), ("refiner", f"{g}/{v}/{r}"))
        ]
        traces.append(_trace(f"t{k}", events, float(ok)))
    adv = recipes.malt(masreplay.load_traces(traces), node="node")
    v_g1v1, v_g1v2, v_g2v1, v_g2v2 = (1 + 1) / 2, (0 + 1) / 2, (0 + 0) / 2, (1 + 0) / 2
    v_g1, v_g2 = (v_g1v1 + v_g1v2) / 2, (v_g2v1 + v_g2v2) / 2
    verifier = {("g1", "v1"): v_g1v1, ("g1", "v2"): v_g1v2, ("g2", "v1"): v_g2v1, ("g2", "v2"): v_g2v2}
    expected = [[{"g1": v_g1, "g2": v_g2}[g], verifier[(g, v)], ok] for (g, v, _), ok in correct.items()]
    _same(adv.per_event, _grid(expected))


def test_marsrl_grpo_among_samples_of_one_input():
    correct = {"s1": 1, "s2": 0, "v11": 1, "v12": 0, "v21": 1, "v22": 1}
    traces = []
    for k, (s, v) in enumerate((("s1", "v11"), ("s1", "v12"), ("s2", "v21"), ("s2", "v22"))):
        events = [
            {"type": "message", "agent": role, "node": label, "reward": {"correct": correct[label]}}
            for role, label in (("solver", s), ("verifier", v))
        ]
        traces.append(_trace(f"t{k}", events, 0.0))
    adv = recipes.marsrl(masreplay.load_traces(traces), node="node")
    half = 0.5 / (math.sqrt(0.5) + EPS)  # (1 - 0.5) / (unbiased std of (1, 0) + eps)
    _same(adv.per_event, _grid([[half, half], [half, -half], [-half, 0.0], [-half, 0.0]]))


def test_tree_labels_that_are_not_a_tree_are_refused():
    traces = [
        _trace("a", [{"type": "message", "agent": "A", "node": n} for n in ("x", "z")], 1.0),
        _trace("b", [{"type": "message", "agent": "A", "node": n} for n in ("y", "z")], 0.0),
    ]
    with pytest.raises(InvalidArgumentError, match="different parents"):
        recipes.magrpo(masreplay.load_traces(traces), node="node")


# ---- sequence recipes -------------------------------------------------------------------------------


def test_marft_action_level_gae_over_the_step_agent_sequence():
    events = [
        {"type": "message", "agent": agent, "reward": {"team": r}}
        for agent, r in (("A", 0.0), ("B", 0.1), ("A", 0.0), ("B", 0.0))
    ]
    batch = masreplay.load_traces([_trace("a", events, 1.0)])
    values = np.array([0.5, 0.4, 0.6, 0.7])
    gamma, lam = 0.99, 0.95
    rewards = [0.0, 0.1, 0.0, 0.0 + 1.0]  # the last agent also gets the outcome
    deltas = [rewards[k] + gamma * (values[k + 1] if k < 3 else 0.0) - values[k] for k in range(4)]
    a3 = deltas[3]
    a2 = deltas[2] + gamma * lam * a3
    a1 = deltas[1] + gamma * lam * a2
    a0 = deltas[0] + gamma * lam * a1
    raw = recipes.marft(batch, values, normalize=False)
    _same(raw.per_event, [a0, a1, a2, a3])
    normalised = recipes.marft(batch, values)
    kept = np.array([a0, a1, a2, a3])
    _same(normalised.per_event, (kept - kept.mean()) / (kept.std() + 1e-5))


def test_maporl_discounted_score_then_whitened_per_turn_and_agent():
    scores = [{"A": (0.9, 0.2, 0.6), "B": (0.1, 0.8, 0.5)}, {"A": (0.3, 0.4, 0.7), "B": (0.6, 0.2, 0.9)}]
    traces = []
    for k, per_agent in enumerate(scores):
        events = [
            {"type": "message", "agent": agent, "reward": {"verifier": per_agent[agent][t]}}
            for t in range(3)
            for agent in ("A", "B")
        ]
        traces.append(_trace(f"t{k}", events, 0.0))
    rho = 0.3
    raw = []
    for per_agent in scores:
        mean = [(per_agent["A"][t] + per_agent["B"][t]) / 2 for t in range(3)]
        row = []
        for t in range(3):
            for agent in ("A", "B"):
                later = sum(rho ** (u - t) * mean[u] for u in range(t + 1, 3))
                norm = sum(rho ** (u - t) for u in range(t, 3))
                row.append((per_agent[agent][t] + later) / norm)
        raw.append(row)
    raw = np.array(raw)  # (2 traces, 6 responses); cells: the same column in both traces
    mean, var = raw.mean(axis=0), raw.var(axis=0, ddof=1)
    expected = (raw - mean) / np.sqrt(var + 1e-8)
    adv = recipes.maporl(masreplay.load_traces(traces), rho=rho)
    _same(adv.per_event, expected.ravel(), tol=1e-7)


def test_marshal_per_player_turn_returns():
    def game(name, a_rewards, b_rewards, outcome):
        events = []
        for ra, rb in zip(a_rewards, b_rewards, strict=True):
            events += [
                {"type": "message", "agent": "P1", "reward": {"team": ra}},
                {"type": "message", "agent": "P2", "reward": {"team": rb}},
            ]
        return _trace(name, events, outcome)

    batch = masreplay.load_traces([game("g1", (0.0, -0.05), (0.0, 0.0), 1.0), game("g2", (-0.05, 0.0), (0.0, 0.0), 0.0)])
    adv = recipes.marshal(batch)
    # turn rewards, player by player (the outcome on each player's last turn)
    p1 = np.array([[0.0, -0.05 + 1.0], [-0.05, 0.0 + 0.0]])
    p2 = np.array([[0.0, 0.0 + 1.0], [0.0, 0.0 + 0.0]])
    p1, p2 = p1 - p1.mean(), p2 - p2.mean()  # mean per (group, player)
    flat = np.concatenate([p1.ravel(), p2.ravel()])
    flat = (flat - flat.mean()) / np.sqrt(flat.var(ddof=1) + 1e-8)
    p1, p2 = flat[:4].reshape(2, 2), flat[4:].reshape(2, 2)
    g1 = np.stack([p1[:, 0] + p1[:, 1], p1[:, 1]], axis=1)  # reverse cumulative sum, gamma 1
    g2 = np.stack([p2[:, 0] + p2[:, 1], p2[:, 1]], axis=1)
    g1, g2 = g1 - g1.mean(), g2 - g2.mean()
    flat = np.concatenate([g1.ravel(), g2.ravel()])
    flat = (flat - flat.mean()) / np.sqrt(flat.var(ddof=1) + 1e-8)
    g1, g2 = flat[:4].reshape(2, 2), flat[4:].reshape(2, 2)
    expected = [[g1[k, 0], g2[k, 0], g1[k, 1], g2[k, 1]] for k in range(2)]
    _same(adv.per_event, _grid(expected), tol=1e-9)


def test_puppeteer_reinforce_returns_of_agent_selections():
    events = [
        {"type": "spawn", "agent": "orch", "to": "w1", "tokens": 5},
        {"type": "message", "agent": "w1", "tokens": 50_000},
        {"type": "spawn", "agent": "orch", "to": "web", "tokens": 5},
        {"type": "message", "agent": "web", "tokens": 100_000},
    ]
    batch = masreplay.load_traces([_trace("a", events, 1.0, edges=[("e0", "e1", "spawn"), ("e2", "e3", "spawn")])])
    adv = recipes.puppeteer(batch, factors={"web": -1.5})
    c0 = 0.1 * math.log(1 + 1 / 7) / math.log(2)
    c1 = 0.1 * math.log(1 + 2 / 7) / math.log(2)
    r0 = c0 * -1.0 * 50_000 / 100_000
    r1 = c1 * -1.5 * 100_000 / 100_000 + 1.0 + 0.5 * c1
    _same(adv.per_event, [r0 + 0.99 * r1, 0.0, r1, 0.0])
    _same(adv.weights, [0.5, 0.0, 0.5, 0.0])


def test_agent_qmix_td_error_through_the_mixer():
    events = [{"type": "message", "agent": agent} for agent in ("A", "B", "A", "B")]
    batch = masreplay.load_traces([_trace("a", events, 1.0)])
    q = np.array([0.2, 0.4, 0.5, 0.1])
    weights = np.array([2.0, 0.5])

    def mixer(matrix, mask):
        return (matrix * mask) @ weights + 0.1

    adv = recipes.agent_qmix(batch, q, mixer, gamma=0.9)
    q_tot0 = 2.0 * 0.2 + 0.5 * 0.4 + 0.1
    q_tot1 = 2.0 * 0.5 + 0.5 * 0.1 + 0.1
    delta0 = 1.0 + 0.9 * q_tot1 - q_tot0
    delta1 = 1.0 - q_tot1  # done after the last round
    _same(adv.per_event, [delta0 * 2.0, delta0 * 0.5, delta1 * 2.0, delta1 * 0.5], tol=1e-6)


# ---- properties ---------------------------------------------------------------------------------------

SHAPES = st.builds(
    lambda n, seed, group: masreplay.sim.generate(n, seed=seed, group_size=group),
    st.integers(4, 24),
    st.integers(0, 2**31),
    st.integers(2, 4),
)
FEW = settings(max_examples=15, deadline=None)


def _cells_mean(values, cells):
    return np.bincount(cells, weights=values) / np.bincount(cells)


@FEW
@given(SHAPES)
def test_dr_mas_cells_have_mean_zero(batch):
    adv = recipes.dr_mas(batch)
    from masreplay.recipes._events import Events, dense

    events = Events(batch)
    rows = np.flatnonzero(events.acting)
    cells = dense(events.group[rows], events.owner[rows])
    big = np.bincount(cells)[cells] > 1
    means = _cells_mean(adv.per_event[rows][big], dense(cells[big]))
    _same(means, np.zeros(len(means)), tol=1e-9)


@FEW
@given(SHAPES, st.integers(0, 10_000))
def test_c3_leave_one_out_baseline_excludes_the_sample(batch, pick):
    from masreplay.recipes._events import Events

    events = Events(batch)
    rng = np.random.default_rng(pick)
    q_trace = rng.normal(size=len(batch))
    q = q_trace[events.trace]
    before = recipes.c3(batch, values=q)
    target = pick % len(batch)
    changed = q_trace.copy()
    changed[target] += 5.0
    after = recipes.c3(batch, values=changed[events.trace])
    # a node's own Q is not in its baseline: its advantage stays; a sibling's moves by -5/(n-1)
    _same(after.per_trace[target], before.per_trace[target], tol=1e-9)
    group = events.trace_group
    siblings = np.flatnonzero((group == group[target]) & (np.arange(len(batch)) != target))
    if len(siblings):
        _same(after.per_trace[siblings], before.per_trace[siblings] - 5.0 / len(siblings), tol=1e-9)


@FEW
@given(SHAPES)
def test_mgrpo_main_and_sub_levels_are_normalised_separately(batch):
    from masreplay.recipes._events import Events

    events = Events(batch)
    adv = recipes.mgrpo(batch, alignment="none")
    main = events.root & events.acting
    sub = ~events.root & events.acting
    # main level: per group, the rollouts' advantages have mean 0
    main_trace = np.zeros(len(batch))
    main_trace[events.trace[main]] = adv.per_event[main]
    _same(_cells_mean(main_trace, events.trace_group), np.zeros(events.trace_group.max() + 1), tol=1e-9)
    # the sub level's weights sum to 1 per group, as do the main level's
    group = events.group
    _same(np.bincount(group[sub], weights=adv.weights[sub]), 1.0, tol=1e-9)
    _same(np.bincount(group[main], weights=adv.weights[main]), 1.0, tol=1e-9)
    # the sub level's advantages are centred over its own calls
    calls = np.unique(np.stack([events.trace[sub], events.owner[sub]], 1), axis=0, return_index=True)[1]
    sub_rows = np.flatnonzero(sub)[calls]
    _same(_cells_mean(adv.per_event[sub_rows], events.group[sub_rows])[np.bincount(events.group[sub_rows]) > 0], 0.0, tol=1e-9)
    # an expert rating on the sub-agents' events reaches the sub level only
    rated = recipes.mgrpo(
        _with_event_channel(batch, "expert", np.random.default_rng(4).random(batch.num_events)), alignment="none"
    )
    _same(rated.per_event[main], adv.per_event[main])


@FEW
@given(SHAPES)
def test_wideseek_r1_weights_of_a_group_sum_to_one(batch):
    adv = recipes.wideseek_r1(batch)
    sums = np.bincount(adv.group_index[adv.trace_index], weights=adv.weights)
    _same(sums, np.ones(len(sums)), tol=1e-12)
    per_trace = np.bincount(adv.trace_index, weights=adv.weights)
    sizes = np.bincount(adv.group_index)
    _same(per_trace, 1.0 / sizes[adv.group_index], tol=1e-12)


@FEW
@given(SHAPES)
def test_outcome_recipes_share_one_advantage_per_rollout(batch):
    for recipe in (recipes.matpo, recipes.agent_lightning, recipes.wideseek_r1):
        adv = recipe(batch)
        trained = adv.weights > 0
        _same(adv.per_event[trained], adv.per_trace[adv.trace_index[trained]], tol=1e-12)
        _same(np.bincount(adv.group_index, weights=adv.per_trace), 0.0, tol=1e-9)


@FEW
@given(SHAPES)
def test_kimi_parl_leaves_sub_agents_untrained(batch):
    from masreplay.recipes._events import Events

    adv = recipes.kimi_parl(batch)
    events = Events(batch)
    assert np.all(adv.per_event[~events.root] == 0) and np.all(adv.weights[~events.root] == 0)


@FEW
@given(SHAPES)
def test_context_folding_without_penalties_is_grpo(batch):
    adv = recipes.context_folding(batch, process="no-such-channel")
    _same(adv.per_trace, recipes.matpo(batch).per_trace, tol=1e-12)


@FEW
@given(SHAPES)
def test_flat_tree_recipes_centre_their_groups(batch):
    from masreplay.recipes._events import Events, dense

    events = Events(batch)
    magrpo = recipes.magrpo(batch)
    _same(np.bincount(magrpo.group_index, weights=magrpo.per_trace), 0.0, tol=1e-9)
    # a one-node tree's MALT value is the rollout's outcome
    _same(recipes.malt(batch).per_trace, events.trace_reward("team"), tol=1e-12)
    # MarsRL without nodes: each owner's outputs are normalised among the task's rollouts
    marsrl = recipes.marsrl(batch, channel="tool")
    rows = np.flatnonzero(events.acting)
    unit = dense(events.trace[rows], events.owner[rows])
    first = np.unique(unit, return_index=True)[1]
    cells = dense(events.group[rows][first], events.owner[rows][first])
    _same(_cells_mean(marsrl.per_event[rows][first], cells), 0.0, tol=1e-9)


@st.composite
def rollout_trees(draw):
    """A group's full rollout tree (branching b, depth d) as one trace per root-to-leaf path,
    two agents per node, with random leaf rewards: (batch, paths, rewards)."""
    branching, depth = draw(st.integers(2, 3)), draw(st.integers(1, 3))
    rewards = draw(st.lists(st.floats(-1, 1), min_size=branching**depth, max_size=branching**depth))
    paths = [tuple(f"{k // branching ** (depth - 1 - level)}" for level in range(depth)) for k in range(branching**depth)]
    traces = []
    for k, (path, reward) in enumerate(zip(paths, rewards, strict=True)):
        labels = ["/".join(path[: level + 1]) for level in range(depth)]
        events = [{"type": "message", "agent": agent, "node": label} for label in labels for agent in ("A", "B")]
        traces.append(_trace(f"t{k}", events, reward))
    return masreplay.load_traces(traces), paths, rewards


@FEW
@given(rollout_trees(), st.floats(0.0, 1.0))
def test_tree_recipes_on_random_rollout_trees(tree, gamma):
    batch, paths, rewards = tree
    depth = len(paths[0])
    magrpo = recipes.magrpo(batch, node="node", gamma=gamma)
    malt = recipes.malt(batch, node="node")
    c3 = recipes.c3(batch, node="node", alpha=0.0)
    per_node_magrpo, per_node_malt, per_node_c3 = {}, {}, {}
    for k, path in enumerate(paths):
        for level in range(depth):
            label = "/".join(path[: level + 1])
            per_node_magrpo[label] = magrpo.per_event[k * 2 * depth + 2 * level]
            per_node_malt[label] = malt.per_event[k * 2 * depth + 2 * level]
            per_node_c3[label] = c3.per_event[k * 2 * depth + 2 * level]
    siblings: dict[str, list[str]] = {}
    for label in per_node_magrpo:
        siblings.setdefault(label.rpartition("/")[0], []).append(label)
    for members in siblings.values():
        # MAGRPO's sibling baseline centres each sibling set
        _same(sum(per_node_magrpo[m] for m in members) / len(members), 0.0, tol=1e-9)
    for label, value in per_node_malt.items():
        # a full tree: V(n) is the mean of the leaves below n, as is C3's r(n)
        below = [
            r for path, r in zip(paths, rewards, strict=True) if "/".join(path).startswith(label + "/") or "/".join(path) == label
        ]
        _same(value, sum(below) / len(below), tol=1e-9)
    for members in siblings.values():
        values = [per_node_malt[m] for m in members]
        for m in members:
            loo = (sum(values) - per_node_malt[m]) / (len(values) - 1)
            _same(per_node_c3[m], per_node_malt[m] - loo, tol=1e-9)


@FEW
@given(SHAPES, st.floats(0.5, 1.0))
def test_marft_with_lambda_one_is_reward_to_go_minus_value(batch, gamma):
    from masreplay.recipes._events import Events

    events = Events(batch)
    values = np.random.default_rng(0).normal(size=batch.num_events)
    adv = recipes.marft(batch, values, gamma=gamma, lam=1.0, normalize=False)
    rows = events.time_order[events.acting[events.time_order]]
    for trace in range(len(batch)):
        mine = rows[events.trace[rows] == trace]
        rewards = events.event_reward("team")[mine]
        rewards[-1] += events.trace_reward("team")[trace]
        to_go = [sum(gamma**j * r for j, r in enumerate(rewards[k:])) for k in range(len(mine))]
        _same(adv.per_event[mine], np.array(to_go) - values[mine], tol=1e-9)


@FEW
@given(SHAPES)
def test_maporl_with_rho_zero_scores_each_response_by_itself(batch):
    from masreplay.recipes._events import Events, cell_stats, dense

    events = Events(batch)
    rows = np.flatnonzero(events.acting)
    scores = np.random.default_rng(1).random(batch.num_events)
    # rho = 0: score = v itself; whitening per (turn, agent) then centres each cell
    adv = recipes.maporl(_with_event_channel(batch, "verifier", scores), rho=0.0)
    cells = dense(events.turn[rows], events.owner[rows])
    n, mean, std = cell_stats(scores[rows], cells)
    expected = np.where(n > 1, (scores[rows] - mean) / np.sqrt(np.nan_to_num(std) ** 2 + 1e-8), 0.0)
    _same(adv.per_event[rows], expected, tol=1e-9)


def _with_event_channel(batch, channel, values):
    traces = [batch[i] for i in range(len(batch))]
    k = 0
    for trace in traces:
        for event in trace["events"]:
            event["reward"] = {**(event.get("reward") or {}), channel: float(values[k])}
            k += 1
    return masreplay.load_traces(traces)


@FEW
@given(SHAPES)
def test_marshal_advantages_are_whitened(batch):
    adv = recipes.marshal(batch)
    trained = adv.weights > 0
    values = adv.per_event[trained]
    assert abs(values.mean()) < 1e-9
    if np.ptp(values) > 0:
        assert abs(values.std(ddof=1) - 1.0) < 1e-4


@FEW
@given(SHAPES)
def test_agent_qmix_with_an_additive_mixer_credits_each_agent_the_td_error(batch):
    from masreplay.recipes._events import Events

    events = Events(batch)
    q = np.random.default_rng(2).normal(size=batch.num_events)
    adv = recipes.agent_qmix(batch, q, lambda m, mask: (m * mask).sum(axis=1))
    rows = np.flatnonzero(events.acting)
    # VDN: dQ_tot/dQ_i = 1, so all agents of a round share delta
    key = events.trace[rows] * 1000 + events.turn[rows]
    for value in np.unique(key)[:20]:
        same_round = adv.per_event[rows][key == value]
        _same(same_round, np.full(len(same_round), same_round[0]), tol=1e-6)


@FEW
@given(SHAPES)
def test_sharp_agent_cells_have_mean_zero(batch):
    from masreplay.recipes._events import Events, dense

    events = Events(batch)
    adv = recipes.sharp(batch, np.random.default_rng(3).normal(size=batch.num_events))
    rows = np.flatnonzero(events.acting)
    unit = dense(events.trace[rows], events.owner[rows])
    first = np.unique(unit, return_index=True)[1]
    cells = dense(events.group[rows][first], events.owner[rows][first])
    big = np.bincount(cells)[cells] > 1
    _same(_cells_mean(adv.per_event[rows][first][big], dense(cells[big])), 0.0, tol=1e-9)


@FEW
@given(SHAPES)
def test_puppeteer_credits_only_orchestrator_steps(batch):
    from masreplay.recipes._events import Events

    events = Events(batch)
    adv = recipes.puppeteer(batch)
    assert np.all(adv.weights[~events.root] == 0)
    _same(np.bincount(adv.group_index[adv.trace_index], weights=adv.weights), 1.0, tol=1e-12)


# ---- transcriptions of the authors' formulas (facts from their code, written as loops) -------------


def test_dr_mas_matches_a_transcription_of_its_agent_wise_grpo():
    """DrMAS verl/trainer/ppo/core_algos.py L497-566 @19c632bc: scores grouped by (uid,
    agent_id) in Python lists; a group of one gets mean 0, std 1; else torch.mean and
    torch.std (unbiased); A = (s - mean) / (std + eps)."""
    from masreplay.recipes._events import Events

    batch = masreplay.sim.generate(40, seed=5)
    events = Events(batch)
    adv = recipes.dr_mas(batch)
    rows = np.flatnonzero(events.acting)
    scores = events.trace_reward("team")[events.trace[rows]]
    keys = list(zip(events.group[rows].tolist(), events.owner[rows].tolist(), strict=True))
    id2score: dict = {}
    for key, score in zip(keys, scores, strict=True):
        id2score.setdefault(key, []).append(score)
    id2mean, id2std = {}, {}
    for key, values in id2score.items():
        if len(values) == 1:
            id2mean[key], id2std[key] = 0.0, 1.0
        else:
            id2mean[key], id2std[key] = float(np.mean(values)), float(np.std(values, ddof=1))
    expected = [(s - id2mean[k]) / (id2std[k] + 1e-6) for k, s in zip(keys, scores, strict=True)]
    _same(adv.per_event[rows], expected, tol=1e-9)


def test_marft_matches_a_transcription_of_its_action_level_buffer():
    """MARFT marft/buffers/action_level_buffer.py L36-54 @1beacdb5: a backward loop over
    steps and agents; for agent k < N-1 the next value is V(t, k+1), for the last agent
    V(t+1, 0); gae = delta + gamma * lambda * mask * gae."""
    steps, agents = 3, 2
    rng = np.random.default_rng(7)
    values = rng.normal(size=(steps, agents))
    rewards = np.zeros((steps, agents))
    rewards[:, agents - 1] = rng.random(steps)
    gamma, lam = 0.99, 0.95
    advantages = np.zeros((steps, agents))
    gae = 0.0
    for t in reversed(range(steps)):
        for k in reversed(range(agents)):
            if k < agents - 1:
                delta = rewards[t, k] + gamma * values[t, k + 1] - values[t, k]
            else:
                next_value = values[t + 1, 0] if t + 1 < steps else 0.0
                delta = rewards[t, k] + gamma * next_value - values[t, k]
            gae = delta + gamma * lam * gae
            advantages[t, k] = gae
    events = [
        {"type": "message", "agent": f"agent{k}", "reward": {"team": float(rewards[t, k])}}
        for t in range(steps)
        for k in range(agents)
    ]
    batch = masreplay.load_traces([_trace("a", events, 0.0)])
    adv = recipes.marft(batch, values.ravel(), gamma=gamma, lam=lam, normalize=False)
    _same(adv.per_event, advantages.ravel(), tol=1e-12)


def test_puppeteer_matches_a_transcription_of_its_returns():
    """Puppeteer REINFORCE_continuous.py @b24e6e6b: ``calculate_returns`` walks the rewards
    backwards, R = r + gamma * R, inserting at the front; ``logarithmic_cost`` as above."""
    batch = masreplay.sim.generate(12, seed=9)
    adv = recipes.puppeteer(batch, gamma=0.99)
    from masreplay.recipes._events import Events

    events = Events(batch)
    tokens_of = {}
    agents = events.agent_names.to_pylist()
    for e in range(batch.num_events):
        key = (int(events.trace[e]), agents[events.owner[e]])
        tokens_of[key] = tokens_of.get(key, 0.0) + events.tokens[e]
    for i in range(len(batch)):
        trace = batch[i]
        steps = sorted(
            (e["t"], k, e.get("to"))
            for k, e in enumerate(trace["events"])
            if e["type"] == "spawn" and e["agent"] == "orchestrator"
        )
        rewards = []
        for s, (_, _, to) in enumerate(steps):
            cost = 0.1 * math.log(1 + (s + 1) / 7) / math.log(2)
            rewards.append(cost * -1.0 * tokens_of.get((i, to), 0.0) / 100000)
        if not rewards:
            continue
        final = trace["rewards"]["team"]
        last_cost = 0.1 * math.log(1 + len(steps) / 7) / math.log(2)
        rewards[-1] += final + (0.5 if final > 0 else -0.5) * last_cost
        returns, running = [], 0.0
        for r in reversed(rewards):
            running = r + 0.99 * running
            returns.insert(0, running)
        offset = int(batch.event_offsets[i])
        _same(adv.per_event[[offset + k for _, k, _ in steps]], returns, tol=1e-9)


def test_magrpo_matches_a_transcription_of_its_advantage_modes():
    """CoMLRL comlrl/trainers/reinforce/magrpo.py ``_compute_advantages`` @1665784: over the
    returns of one node's G joint actions, ``mean``: R - mean R; ``max``: R - max R; ``rloo``:
    (G R - sum R) / (G - 1); ``raw``: R."""
    batch = masreplay.sim.generate(40, seed=13, group_size=4)
    rewards = np.array([trace["rewards"]["team"] for trace in batch])
    groups = [list(range(k, k + 4)) for k in range(0, 40, 4)]
    modes = {"mean": [], "max": [], "rloo": [], "raw": []}
    for members in groups:
        returns = [float(rewards[i]) for i in members]
        total, top, size = sum(returns), max(returns), len(returns)
        for r in returns:
            modes["mean"].append(r - total / size)
            modes["max"].append(r - top)
            modes["rloo"].append((size * r - total) / (size - 1))
            modes["raw"].append(r)
    for mode, expected in modes.items():
        _same(recipes.magrpo(batch, advantage_mode=mode).per_trace, expected, tol=1e-9)


# ---- the table ---------------------------------------------------------------------------------------


def test_table_lists_every_recipe_and_the_methods_without_one():
    table = recipes.table().to_pylist()
    functions = {row["function"] for row in table if row["function"]}
    assert functions == {name for name in recipes.__all__ if name != "table"}
    for row in table:
        assert row["paper"] and row["credit_unit"] and row["trace"]
        if row["function"]:
            assert row["paper"] in getattr(recipes, row["function"]).__doc__
    assert {row["method"] for row in table if not row["function"]} == {"HALO", "HERA", "LangMARL", "ParaManager"}


def test_bad_inputs_raise_masreplay_errors():
    batch = _standard()
    with pytest.raises(InvalidArgumentError):
        recipes.marft(batch, np.zeros(3))
    with pytest.raises(InvalidArgumentError):
        recipes.mgrpo(batch, variant="blog")
    with pytest.raises(InvalidArgumentError):
        recipes.agent_qmix(batch, np.zeros(batch.num_events), lambda m, mask: np.zeros(2))
    with pytest.raises(InvalidArgumentError):
        recipes.magrpo(batch, advantage_mode="median")
    with pytest.raises(InvalidArgumentError):
        recipes.matpo(batch, loss_agg="sum")
    with pytest.raises(InvalidArgumentError, match="agent_qmix: mixer must be a callable, got str 'vdn'"):
        recipes.agent_qmix(batch, np.zeros(batch.num_events), "vdn")
    with pytest.raises(InvalidArgumentError, match="sub_calls"):
        recipes.mgrpo(batch, sub_calls=0)
    with pytest.raises(InvalidArgumentError, match="no reward channel"):
        recipes.magrpo(batch, channel="absent")
    with pytest.raises(InvalidArgumentError, match="one value per event"):
        recipes.sharp(batch, [0.0])
    with pytest.raises(InvalidArgumentError, match="numeric"):
        recipes.sharp(batch, np.array(["high"] * batch.num_events))
    mixed = np.array([1, "a"] * (batch.num_events // 2), dtype=object)
    with pytest.raises(InvalidArgumentError, match="one type"):
        recipes.magrpo(batch, node=mixed)


def test_maporl_incentive_bonus_by_hand():
    """Two agents, three turns; correctness A: wrong, right, right; B: right, right, wrong.
    alpha = (1, 10, 100, 1000) so each rule's share is visible in the digits:
    A t1 became right while B stood opposite at t0 (+a0); B turns wrong at t2 while A is
    right at t1 (-a2); B t0 sees A become right while B is right (+a2); B t2 turns wrong
    while A stood with it at t1 (-a1)."""
    from masreplay.recipes.sequence import _maporl_bonus

    right = np.array([0, 1, 1, 1, 1, 0], bool)  # rows: (t0 A, t0 B, t1 A, t1 B, t2 A, t2 B)
    trace = np.zeros(6, np.int64)
    turn = np.array([0, 0, 1, 1, 2, 2])
    owner = np.array([0, 1, 0, 1, 0, 1])
    bonus = _maporl_bonus(right, trace, turn, owner, 3, (1.0, 10.0, 100.0, 1000.0))
    np.testing.assert_array_equal(bonus, [0.0, 100.0, 1.0 - 100.0, 0.0, 0.0, -10.0])
    # A wrong throughout, B right then wrong: A pays a3 for B turning wrong; B was persuaded
    # wrongly by A, who stood opposite at t0 (-a0)
    bonus = _maporl_bonus(
        np.array([0, 1, 0, 0], bool),
        np.zeros(4, np.int64),
        np.array([0, 0, 1, 1]),
        np.array([0, 1, 0, 1]),
        2,
        (1.0, 10.0, 100.0, 1000.0),
    )
    np.testing.assert_array_equal(bonus, [-1000.0, 0.0, 0.0, -1.0])
    with pytest.raises(masreplay.InvalidArgumentError, match="four numbers"):
        _maporl_bonus(right, trace, turn, owner, 3, (1.0, 2.0))


def test_maporl_bonus_off_by_default_and_moves_the_advantages():
    def trace(name, labels):
        events = [
            {"type": "message", "agent": agent, "reward": {"verifier": 0.5, "correct": labels[agent][t]}}
            for t in range(3)
            for agent in ("A", "B")
        ]
        return _trace(name, events, 0.0)

    batch = masreplay.load_traces([trace("t0", {"A": (0, 1, 1), "B": (1, 1, 0)}), trace("t1", {"A": (1, 1, 1), "B": (1, 1, 1)})])
    plain = recipes.maporl(batch)
    np.testing.assert_array_equal(recipes.maporl(batch, alpha=(0, 0, 0, 0)).per_event, plain.per_event)
    moved = recipes.maporl(batch, alpha=(1.0, 1.0, 1.0, 1.0), rho=0.0)
    # t0's A at turn 1 gains (+1 - 1 = 0), t0's B at turn 0 gains +1, at turn 2 loses 1
    assert moved.per_event[1] > 0 > moved.per_event[5]


def _bad_values(hint) -> list:
    """Values outside what an annotation admits (each recipe's signature is its contract)."""
    if hint is float:
        return [float("nan"), float("inf"), "0.5", None]
    if hint is int:
        return [2.5, -1, "3"]
    if hint is bool:
        return ["yes", 2]
    if hint is str:
        return [5, None]
    if typing.get_origin(hint) is tuple:
        return [[float("nan")] * len(typing.get_args(hint)), "ab"]
    return []


def _placeholder(hint):
    """A stand-in of an input's type: a function for a callable (its type is checked on
    entry), None for anything else."""
    return (lambda *inputs: None) if collections.abc.Callable in (hint, typing.get_origin(hint)) else None


@pytest.mark.parametrize("name", [row["function"] for row in recipes.table().to_pylist() if row["function"]])
def test_every_numeric_flag_and_name_setting_is_checked_by_name(name):
    recipe = getattr(recipes, name)
    hints = typing.get_type_hints(recipe)
    parameters = inspect.signature(recipe).parameters.values()
    # Inputs beyond the batch (critic values, a mixer) as placeholders of their type:
    # settings are checked before any work, so a bad one is refused whatever the inputs.
    required = [p for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty]
    inputs = [_placeholder(hints.get(p.name)) for p in required]
    inputs[0] = _standard()
    checked = 0
    for parameter in parameters:
        if parameter.kind is not parameter.KEYWORD_ONLY:
            continue
        for bad in _bad_values(hints[parameter.name]):
            with pytest.raises(InvalidArgumentError, match=f"{name}: {parameter.name}"):
                recipe(*inputs, **{parameter.name: bad})
            checked += 1
    assert checked or name in ("malt",)  # malt's only setting is a node column


@pytest.mark.parametrize(
    ("name", "setting"),
    [
        ("agent_lightning", "channel"),
        ("kimi_parl", "perf"),
        ("marshal", "channel"),
        ("maporl", "channel"),
        ("marsrl", "channel"),
        ("wideseek_r1", "channel"),
    ],
)
def test_a_misspelt_reward_channel_is_refused_not_read_as_zeros(name, setting):
    with pytest.raises(InvalidArgumentError, match="no reward channel 'teem'"):
        getattr(recipes, name)(_standard(), **{setting: "teem"})


@pytest.mark.parametrize(("name", "setting"), [("gamma", 1.5), ("gamma", -0.1), ("eps", -1e-6)])
def test_discounts_and_floors_keep_their_ranges(name, setting):
    recipe = {"gamma": recipes.marshal, "eps": recipes.matpo}[name]
    with pytest.raises(InvalidArgumentError, match=f"{recipe.__name__}: {name} must be a number (in|>=)"):
        recipe(_standard(), **{name: setting})


@pytest.mark.parametrize("bad", [math.inf, 1e300, 2.0**49])
@pytest.mark.parametrize("recipe", ["marft", "sharp", "c3", "agent_qmix"])
def test_a_summed_per_event_input_beyond_the_bound_is_refused(recipe, bad):
    # Found by fuzzing: an infinite or huge value, Q value or marginal gave NaN advantages
    # (or, over 2^49, silently rounded ones).
    batch = masreplay.sim.generate(4, seed=4, depth=3, agents=(3, 8))
    values = np.linspace(-1.0, 1.0, batch.num_events)
    values[3] = bad
    call = {
        "marft": lambda: recipes.marft(batch, values),
        "sharp": lambda: recipes.sharp(batch, values),
        "c3": lambda: recipes.c3(batch, values=values),
        "agent_qmix": lambda: recipes.agent_qmix(batch, values, lambda q, mask: (q * mask).sum(axis=1)),
    }[recipe]
    with pytest.raises(InvalidArgumentError, match=r"\[3\] is .*below 2\^49"):
        call()


@pytest.mark.parametrize("recipe", ["marft", "agent_qmix"])
def test_a_missing_value_where_the_recipe_reads_one_is_refused(recipe):
    # Found by fuzzing: a NaN value at an acting event made every advantage of the batch NaN.
    batch = masreplay.sim.generate(4, seed=4)
    values = np.linspace(-1.0, 1.0, batch.num_events)
    acting = batch.events()["type"].to_pylist().index("message")
    values[acting] = np.nan
    mixer = lambda q, mask: (q * mask).sum(axis=1)  # noqa: E731
    with pytest.raises(InvalidArgumentError, match="which this recipe reads"):
        recipes.marft(batch, values) if recipe == "marft" else recipes.agent_qmix(batch, values, mixer)


def test_a_mixer_that_returns_no_finite_q_tot_is_refused():
    batch = masreplay.sim.generate(4, seed=4)
    q = np.linspace(-1.0, 1.0, batch.num_events)
    with pytest.raises(InvalidArgumentError, match="the mixer returned nan"):
        recipes.agent_qmix(batch, q, lambda q, mask: np.full(len(q), np.nan))


@pytest.mark.parametrize(
    ("recipe", "weight"),
    [("sharp", "lambda_shapley"), ("sharp", "lambda_tool"), ("kimi_parl", "lambda_parallel"), ("kimi_parl", "lambda_finish")],
)
def test_a_reward_term_weight_beyond_the_bound_is_refused(recipe, weight):
    # Found by fuzzing: sharp(lambda_shapley=1e300) overflowed the group std and returned
    # advantages of about 1e-8 without a word.
    batch = masreplay.sim.generate(4, seed=4)
    inputs = (np.linspace(-1.0, 1.0, batch.num_events),) if recipe == "sharp" else ()
    with pytest.raises(InvalidArgumentError, match=weight):
        getattr(recipes, recipe)(batch, *inputs, **{weight: 1e300})
