"""The published multi-agent credit schemes side by side on one simulated batch.

``masreplay.sim.branches`` draws traces whose team reward is a sum of per-event contributions
plus noise, so every agent's true Shapley value (the sum of its events' contributions) is
known, and adds branch rollouts (an event substituted or ablated, a spawn skipped) that the
counterfactual methods can read. Every recipe runs on the factual traces (groups of 4
rollouts of a task); for each we print how its per-agent credit (the mean advantage of the
agent's acting events) correlates with the agents' true values, and how much the credit's
scale varies between groups (the variance across groups of the mean |credit|). Context-Folding
clips R + Q to [0, 1], for the paper's binary rewards: the simulator's rewards are not in [0, 1].

Run: python examples/compare_methods.py  (a few seconds)
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import masreplay
from masreplay import recipes
from masreplay.recipes._events import Events, dense


def main(n_traces: int = 400, seed: int = 0) -> None:
    truth = masreplay.sim.branches(n_traces, branches=4, branch_points=3, noise=0.1, seed=seed)
    table = truth.batch.to_arrow()
    factual = np.flatnonzero(pc.is_null(table["counterfactual_of"]).to_numpy(zero_copy_only=False))
    batch = truth.batch[[int(i) for i in factual]]

    # SHARP's marginals: counterfactual credit from the branch rollouts, on the factual events.
    credit = masreplay.counterfactual_credit(truth.batch)["credit"].to_numpy(zero_copy_only=False)
    keep = np.isin(np.repeat(np.arange(len(truth.batch)), np.diff(truth.batch.event_offsets)), factual)
    marginal = np.nan_to_num(credit[keep])

    events = Events(batch)
    no_critic = np.zeros(batch.num_events)
    runs = {
        "matpo": lambda: recipes.matpo(batch),
        "wideseek_r1": lambda: recipes.wideseek_r1(batch),
        "agent_lightning": lambda: recipes.agent_lightning(batch),
        "dr_mas": lambda: recipes.dr_mas(batch),
        "kimi_parl": lambda: recipes.kimi_parl(batch),
        "context_folding": lambda: recipes.context_folding(batch),
        "mgrpo": lambda: recipes.mgrpo(batch),
        "sharp (counterfactual marginals)": lambda: recipes.sharp(batch, marginal),
        "magrpo (flat group)": lambda: recipes.magrpo(batch),
        "c3 (reward_only)": lambda: recipes.c3(batch, alpha=0.0),
        "malt (values)": lambda: recipes.malt(batch),
        "marft (V = 0)": lambda: recipes.marft(batch, no_critic),
        "marshal": lambda: recipes.marshal(batch),
        "puppeteer": lambda: recipes.puppeteer(batch),
    }
    skipped = {
        "maporl": "needs verifier scores per response",
        "marsrl": "needs per-output correctness",
        "agent_qmix": "needs Q-networks and a mixer",
    }

    # The truth per (trace, agent); tools are players of the simulator's game, not agents here.
    values = truth.agent_values
    names = events.agent_names.cast(pa.string()).to_pylist()
    position = {trace_id: i for i, trace_id in enumerate(batch.trace_ids)}
    code = {name: k for k, name in enumerate(names)}
    width = len(names)
    true_key = np.array(
        [position[t] * width + code[a] for t, a in zip(values["trace_id"].to_pylist(), values["agent"].to_pylist(), strict=True)]
    )
    true_value = dict(zip(true_key.tolist(), values["value"].to_numpy().tolist(), strict=True))

    rows = np.flatnonzero(events.acting)
    unit_key = events.trace[rows] * width + events.owner[rows]
    units, inverse = np.unique(unit_key, return_inverse=True)
    known = np.array([k in true_value for k in units.tolist()])
    target = np.array([true_value.get(k, np.nan) for k in units.tolist()])
    unit_group = events.trace_group[units // width]

    print(f"{len(batch)} factual traces in groups of 4, {len(units)} (trace, agent) pairs with a known value")
    print(f"{'recipe':36s} {'corr(credit, truth)':>20s} {'var across groups':>18s}")
    for name, run in runs.items():
        adv = run()
        mean_credit = np.bincount(inverse, weights=adv.per_event[rows]) / np.bincount(inverse)
        corr = np.corrcoef(mean_credit[known], target[known])[0, 1] if np.ptp(mean_credit[known]) > 0 else float("nan")
        groups = dense(unit_group)
        scale = np.bincount(groups, weights=np.abs(mean_credit)) / np.bincount(groups)
        print(f"{name:36s} {corr:20.3f} {scale.var():18.4f}")
    for name, why in skipped.items():
        print(f"{name:36s} {'-':>20s} {'-':>18s}   ({why})")


if __name__ == "__main__":
    main()
