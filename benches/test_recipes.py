"""The named recipes (masreplay.recipes) against the hand-assembly a researcher would write
with Polars and numpy from ``batch.events()``, in the same run (issue 20).

Workload: ``TRACES`` (100,000) traces of the simulator's default shape (``sim.generate``: 2-4
sub-agents, 2-6 events each, groups of 4; about 2 million events), plus per-event critic
values, Q-values and marginals drawn from a seeded generator. Every side starts from the
batch: the hand-assemblies read ``batch.events()`` / ``batch.edges()`` / the rewards map
inside the timed call, as the recipes read the batch inside theirs, on integer codes (the
Arrow dictionaries' indices, no strings). The anchors attribute a tool result to its caller
through the ``tool_dependency`` edge and take as orchestrator the agents nobody spawned, the
conventions of the recipes.

Before timing, each anchor must agree with its recipe on every event to 1e-9 (advantages
and, where the method defines them, loss weights). Tree recipes run without ``node`` (one
node per rollout), M-GRPO with ``alignment="none"`` (the paper's random resampling has no
deterministic hand version to compare). MarsRL reads a ``correct`` channel the simulator does
not write (zeros at full size): both sides are also checked on a small batch that has it.
Nothing is asserted on times. Set
MASREPLAY_BENCH_RECIPE_TRACES to change the size.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import masreplay
from masreplay import recipes

TRACES = int(os.environ.get("MASREPLAY_BENCH_RECIPE_TRACES", 100_000))
EPS = 1e-6
ROUNDS = 3


@pytest.fixture(scope="module")
def batch():
    return masreplay.sim.generate(TRACES, seed=21)


@pytest.fixture(scope="module")
def scored():
    """A small batch whose acting events carry a random ``correct`` channel (the simulator
    writes per-event rewards on tool results only): the agreement check of MarsRL."""
    rng = np.random.default_rng(23)
    traces = list(masreplay.sim.generate(400, seed=24))
    for trace in traces:
        for event in trace["events"]:
            event["reward"] = {**(event.get("reward") or {}), "correct": float(rng.integers(0, 2))}
    return masreplay.load_traces(traces)


def _inputs(batch):
    rng = np.random.default_rng(22)
    return {name: rng.normal(size=batch.num_events) for name in ("values", "q", "marginal")}


@pytest.fixture(scope="module")
def inputs(batch):
    return _inputs(batch)


@pytest.fixture(scope="module")
def pl():
    return pytest.importorskip("polars")


def _data(dataset_type, batch, recipe: str):
    return dataset_type(
        f"{recipe}, {len(batch):,} traces (sim default shape)",
        None,
        len(batch),
        int(batch.num_events),
        0,
        "",
        suite="recipes",
    )


# ---- the researcher's frame: one row per event ------------------------------------------------------

OBSERVATIONS = ["tool_result", "human_intervention", "safety_event"]


def event_frame(pl, batch):
    """Events as a Polars frame of integer codes: trace, group, spawn, owner (agent code; tool
    results: their caller's), to (agent code of a spawn's target, -1 for none), acting, root
    (owner spawned by nobody in the trace), tokens, the team reward, and the tool channel."""
    events = batch.events()
    table = batch.to_arrow()
    team = pc.map_lookup(table["rewards"], "team", "first").to_numpy(zero_copy_only=False)
    group = pc.dictionary_encode(table["group_id"]).combine_chunks().indices.to_numpy(zero_copy_only=False)
    trace = events["trace_index"].to_numpy().astype(np.int64)
    kind = events["type"].combine_chunks()
    kind_codes = kind.indices.to_numpy(zero_copy_only=False)
    observed = pc.is_in(kind.dictionary, value_set=pa.array(OBSERVATIONS)).to_numpy(zero_copy_only=False)[kind_codes]
    spawn = pc.equal(kind.dictionary, "spawn").to_numpy(zero_copy_only=False)[kind_codes]
    agent = events["agent"].combine_chunks()
    owner = agent.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    to = events["to"].combine_chunks()
    to_agent = pc.index_in(to.dictionary, value_set=agent.dictionary).fill_null(-1).to_numpy(zero_copy_only=False)
    to_codes = to.indices.fill_null(-1).to_numpy(zero_copy_only=False)
    target = np.where(to_codes >= 0, to_agent[np.maximum(to_codes, 0)], -1)
    edges = batch.edges()
    offsets = batch.event_offsets
    tool = pc.equal(edges["type"].combine_chunks().dictionary, "tool_dependency").to_numpy(zero_copy_only=False)
    tool = tool[edges["type"].combine_chunks().indices.to_numpy(zero_copy_only=False)]
    edge_trace = edges["trace_index"].to_numpy()[tool]
    owner[offsets[edge_trace] + edges["dst"].to_numpy()[tool]] = owner[offsets[edge_trace] + edges["src"].to_numpy()[tool]]
    width = int(max(owner.max(initial=0), target.max(initial=0))) + 1
    spawned = np.unique((trace * width + target)[spawn & (target >= 0)])
    return pl.DataFrame(
        {
            "trace": trace,
            "group": group[trace],
            "spawn": spawn,
            "owner": owner,
            "to": target,
            "acting": ~observed,
            "root": ~np.isin(trace * width + owner, spawned),
            "tokens": events["tokens"].fill_null(1).cast(pa.float64()),
            "team": team[trace],
            "tool": pc.map_lookup(events["reward"], "tool", "first").fill_null(0.0),
            "correct": pc.map_lookup(events["reward"], "correct", "first").fill_null(0.0),
        }
    ).with_row_index("row")


def _grpo_expr(pl, value, over, *, eps=EPS, ddof=1):
    mean = pl.col(value).mean().over(over)
    std = pl.col(value).std(ddof=ddof).over(over).fill_null(0.0)
    count = pl.len().over(over)
    return pl.when(count > 1).then((pl.col(value) - mean) / (std + eps)).otherwise(0.0)


def _numpy(frame, column):
    return frame[column].to_numpy()


def _agree(recipe: str, ours, theirs_events, theirs_weights=None) -> None:
    worst = float(np.max(np.abs(ours.per_event - theirs_events), initial=0.0))
    assert worst <= 1e-9, f"{recipe}: advantages differ by {worst}"
    if theirs_weights is not None:
        worst = float(np.max(np.abs(ours.weights - theirs_weights), initial=0.0))
        assert worst <= 1e-9, f"{recipe}: weights differ by {worst}"


# ---- the hand-assemblies -----------------------------------------------------------------------------


def trace_grpo(pl, batch, *, weights: str):
    """MATPO / Agent Lightning / WideSeek-R1: GRPO per rollout broadcast to acting events."""
    frame = event_frame(pl, batch)
    traces = frame.group_by("trace", maintain_order=True).agg(pl.col("team").first(), pl.col("group").first())
    advantage = traces.select(_grpo_expr(pl, "team", "group").alias("a"))["a"].to_numpy()
    acting = _numpy(frame, "acting")
    per_event = np.where(acting, advantage[_numpy(frame, "trace")], 0.0)
    tok = pl.when(pl.col("acting")).then(pl.col("tokens")).otherwise(0.0)
    if weights == "token-mean":
        w = frame.select(tok / tok.sum().over("group"))
    elif weights == "rollout":
        w = frame.select(tok / tok.sum().over("trace") / pl.col("trace").n_unique().over("group"))
    else:  # agent
        agents = pl.col("owner").filter(pl.col("acting")).n_unique().over("trace")
        w = frame.select(
            tok / tok.sum().over(["trace", "owner"]).fill_nan(1.0) / agents / pl.col("trace").n_unique().over("group")
        )
    return per_event, np.nan_to_num(w.to_series().to_numpy())


def dr_mas_anchor(pl, batch):
    frame = event_frame(pl, batch).filter(pl.col("acting"))
    cell = ["group", "owner"]
    count = pl.len().over(cell)
    advantage = (
        pl.when(count > 1)
        .then((pl.col("team") - pl.col("team").mean().over(cell)) / (pl.col("team").std().over(cell) + EPS))
        .otherwise(pl.col("team") / (1 + EPS))
    )
    out = frame.select("row", advantage.alias("a"))
    per_event = np.zeros(batch.num_events)
    per_event[_numpy(out, "row")] = _numpy(out, "a")
    return per_event


def kimi_anchor(pl, batch, lam):
    frame = event_frame(pl, batch)
    reward = masreplay.rewards.parl(batch, lam, lam)
    traces = pl.DataFrame(
        {"r": reward, "group": frame.group_by("trace", maintain_order=True).agg(pl.col("group").first())["group"]}
    )
    advantage = traces.select(pl.col("r") - pl.col("r").mean().over("group"))["r"].to_numpy()
    trained = _numpy(frame, "acting") & _numpy(frame, "root")
    return np.where(trained, advantage[_numpy(frame, "trace")], 0.0)


def mgrpo_anchor(pl, batch):
    frame = event_frame(pl, batch)
    traces = frame.group_by("trace", maintain_order=True).agg(pl.col("team").first(), pl.col("group").first())
    main = traces.select(_grpo_expr(pl, "team", "group", ddof=0).alias("a"))["a"].to_numpy()
    calls = (
        frame.filter(pl.col("acting") & ~pl.col("root"))
        .group_by(["trace", "owner"], maintain_order=True)
        .agg(pl.col("team").first(), pl.col("group").first())
        .with_columns((0.1 + 0.4 * pl.col("team")).alias("r"))
        .with_columns(_grpo_expr(pl, "r", "group", ddof=0).alias("a"))
    )
    per_event = frame.join(calls.select("trace", "owner", "a"), on=["trace", "owner"], how="left", maintain_order="left")
    sub = per_event["a"].fill_null(0.0).to_numpy()
    acting, root = _numpy(frame, "acting"), _numpy(frame, "root")
    return np.where(acting & root, main[_numpy(frame, "trace")], np.where(acting, sub, 0.0))


def sharp_anchor(pl, batch, marginal):
    frame = event_frame(pl, batch).with_columns(pl.Series("m", marginal))
    units = (
        frame.group_by(["trace", "owner"], maintain_order=True)
        .agg(pl.col("team").first(), pl.col("group").first(), pl.col("m").sum(), pl.col("tool").sum(), pl.col("acting").any())
        .filter(pl.col("acting"))
        .with_columns((pl.col("team") + pl.col("m") + pl.col("tool")).alias("r"))
        .with_columns(_grpo_expr(pl, "r", ["group", "owner"]).alias("a"))
    )
    out = frame.join(units.select("trace", "owner", "a"), on=["trace", "owner"], how="left", maintain_order="left")
    return np.where(_numpy(frame, "acting"), out["a"].fill_null(0.0).to_numpy(), 0.0)


def flat_tree_anchor(pl, batch, recipe, values=None):
    frame = event_frame(pl, batch)
    if values is not None:
        frame = frame.with_columns(pl.Series("v", values))
    traces = frame.group_by("trace", maintain_order=True).agg(
        pl.col("team").first(),
        pl.col("group").first(),
        pl.col("v").filter(pl.col("acting")).mean() if values is not None else pl.lit(0.0).alias("v"),
    )
    n = pl.len().over("group")
    if recipe == "magrpo":
        node = traces.select(pl.col("team") - pl.col("team").mean().over("group"))
    elif recipe == "c3":  # r - LOO(Q)
        node = traces.select(
            pl.when(n > 1).then(pl.col("team") - (pl.col("v").sum().over("group") - pl.col("v")) / (n - 1)).otherwise(0.0)
        )
    else:  # malt
        node = traces.select(pl.col("team"))
    advantage = node.to_series().to_numpy()
    return np.where(_numpy(frame, "acting"), advantage[_numpy(frame, "trace")], 0.0)


def marsrl_anchor(pl, batch):
    frame = event_frame(pl, batch)
    units = (
        frame.filter(pl.col("acting"))
        .group_by(["trace", "owner"], maintain_order=True)
        .agg(pl.col("correct").sum().alias("r"), pl.col("group").first())
        .with_columns(_grpo_expr(pl, "r", ["group", "owner"]).alias("a"))
    )
    out = frame.join(units.select("trace", "owner", "a"), on=["trace", "owner"], how="left", maintain_order="left")
    return np.where(_numpy(frame, "acting"), out["a"].fill_null(0.0).to_numpy(), 0.0)


def _padded(frame, column, acting_only=True):
    """(traces, max_len) matrix of an acting column in time order (the simulator stores events
    in time order), with the mask of real cells."""
    sub = frame.filter(frame["acting"]) if acting_only else frame
    trace = sub["trace"].to_numpy()
    counts = np.bincount(trace, minlength=int(frame["trace"].max()) + 1)
    mask = np.arange(counts.max()) < counts[:, None]
    out = np.zeros(mask.shape)
    out[mask] = sub[column].to_numpy()
    return out, mask, sub["row"].to_numpy()


def marft_anchor(pl, batch, values, gamma=0.99, lam=0.95):
    frame = event_frame(pl, batch).with_columns(pl.Series("v", values))
    v, mask, rows = _padded(frame, "v")
    r, _, _ = _padded(frame, "team")
    lengths = mask.sum(axis=1)
    reward = np.zeros_like(v)
    reward[np.arange(len(v)), lengths - 1] = r[:, 0]  # the outcome on the last action
    advantage = np.zeros_like(v)
    running = np.zeros(len(v))
    for k in range(v.shape[1] - 1, -1, -1):
        next_v = v[:, k + 1] if k + 1 < v.shape[1] else 0.0
        next_v = np.where(k + 1 < lengths, next_v, 0.0)
        delta = reward[:, k] + gamma * next_v - v[:, k]
        running = np.where(mask[:, k], delta + gamma * lam * np.where(k + 1 < lengths, running, 0.0), 0.0)
        advantage[:, k] = running
    flat = advantage[mask]
    counted = flat[flat != 0]
    per_event = np.zeros(batch.num_events)
    per_event[rows] = (flat - counted.mean()) / (counted.std() + 1e-5)
    return per_event


def marshal_anchor(pl, batch):
    frame = event_frame(pl, batch).filter(pl.col("acting"))
    player = ["trace", "owner"]
    cell = ["group", "owner"]
    last = pl.int_range(pl.len()).over(player) == pl.len().over(player) - 1
    whiten = lambda c: (pl.col(c) - pl.col(c).mean()) / (pl.col(c).var() + 1e-8).sqrt()  # noqa: E731
    out = (
        frame.sort(["trace", "owner", "row"])
        .with_columns(pl.when(last).then(pl.col("team")).otherwise(0.0).alias("r"))
        .with_columns((pl.col("r") - pl.col("r").mean().over(cell)).alias("r"))
        .with_columns(whiten("r").alias("r"))
        .with_columns(pl.col("r").cum_sum(reverse=True).over(player).alias("g"))
        .with_columns((pl.col("g") - pl.col("g").mean().over(cell)).alias("g"))
        .with_columns(whiten("g").alias("g"))
    )
    per_event = np.zeros(batch.num_events)
    per_event[_numpy(out, "row")] = _numpy(out, "g")
    return per_event


def puppeteer_anchor(pl, batch, gamma=0.99):
    frame = event_frame(pl, batch)
    tokens = frame.group_by(["trace", "owner"]).agg(pl.col("tokens").sum().alias("selected_tokens"))
    steps = (
        frame.filter(pl.col("spawn") & pl.col("root"))
        .join(tokens.rename({"owner": "to"}), on=["trace", "to"], how="left", maintain_order="left")
        .with_columns(
            pl.int_range(pl.len()).over("trace").alias("s"),
            (pl.int_range(pl.len()).over("trace") == pl.len().over("trace") - 1).alias("last"),
        )
        .with_columns((0.1 * (1 + (pl.col("s") + 1) / 7).log() / np.log(2)).alias("c"))
        .with_columns(
            (
                pl.col("c") * -1.0 * pl.col("selected_tokens").fill_null(0.0) / 100000
                + pl.when(pl.col("last"))
                .then(pl.col("team") + pl.when(pl.col("team") > 0).then(0.5).otherwise(-0.5) * pl.col("c"))
                .otherwise(0.0)
            ).alias("r")
        )
        # G_s = sum_j gamma^(j-s) r_j: a reverse cumulative sum of gamma^j r_j, over gamma^s
        .with_columns(
            ((pl.col("r") * gamma ** pl.col("s")).cum_sum(reverse=True).over("trace") / gamma ** pl.col("s")).alias("g")
        )
    )
    per_event = np.zeros(batch.num_events)
    per_event[_numpy(steps, "row")] = _numpy(steps, "g")
    return per_event


def log_sum_exp(matrix, mask):
    """A monotone, symmetric mixer: Q_tot = log sum_i exp(Q_i) over the agents present."""
    return np.log(np.where(mask, np.exp(matrix), 0.0).sum(axis=1))


def qmix_anchor(pl, batch, q, gamma=0.99, step=1e-4):
    frame = event_frame(pl, batch).with_columns(pl.Series("q", q)).filter(pl.col("acting"))
    frame = frame.with_columns(
        pl.int_range(pl.len()).over(["trace", "owner"]).alias("round"),
        pl.col("owner").rank("dense").over("trace").cast(pl.Int64).alias("column"),
    )
    rows, rounds, column = _numpy(frame, "row"), _numpy(frame, "round"), _numpy(frame, "column") - 1
    trace = _numpy(frame, "trace")
    width = rounds.max() + 1
    keys, slot = np.unique(trace * width + rounds, return_inverse=True)
    matrix = np.zeros((len(keys), column.max() + 1))
    mask = np.zeros(matrix.shape, bool)
    matrix[slot, column], mask[slot, column] = _numpy(frame, "q"), True
    q_tot = log_sum_exp(matrix, mask)
    same_trace_next = np.r_[keys[1:] // width == keys[:-1] // width, False]
    q_next = np.where(same_trace_next, np.r_[q_tot[1:], 0.0], 0.0)
    team = np.zeros(trace.max() + 1)
    team[trace] = _numpy(frame, "team")
    delta = team[keys // width] + gamma * q_next - q_tot
    gradient = np.zeros_like(matrix)
    for k in range(matrix.shape[1]):
        up, down = matrix.copy(), matrix.copy()
        up[:, k] += step
        down[:, k] -= step
        gradient[:, k] = (log_sum_exp(up, mask) - log_sum_exp(down, mask)) / (2 * step)
    per_event = np.zeros(batch.num_events)
    per_event[rows] = delta[slot] * gradient[slot, column]
    return per_event


# ---- the benchmarks ------------------------------------------------------------------------------------

CASES = {
    "matpo": (lambda b, x: recipes.matpo(b), lambda pl, b, x: trace_grpo(pl, b, weights="token-mean")),
    "agent_lightning": (lambda b, x: recipes.agent_lightning(b), lambda pl, b, x: trace_grpo(pl, b, weights="rollout")),
    "wideseek_r1": (lambda b, x: recipes.wideseek_r1(b), lambda pl, b, x: trace_grpo(pl, b, weights="agent")),
    "dr_mas": (lambda b, x: recipes.dr_mas(b), lambda pl, b, x: dr_mas_anchor(pl, b)),
    "kimi_parl": (
        lambda b, x: recipes.kimi_parl(b, lambda_parallel=0.1, lambda_finish=0.1),
        lambda pl, b, x: kimi_anchor(pl, b, 0.1),
    ),
    "mgrpo": (lambda b, x: recipes.mgrpo(b, alignment="none"), lambda pl, b, x: mgrpo_anchor(pl, b)),
    "sharp": (lambda b, x: recipes.sharp(b, x["marginal"]), lambda pl, b, x: sharp_anchor(pl, b, x["marginal"])),
    "magrpo": (lambda b, x: recipes.magrpo(b), lambda pl, b, x: flat_tree_anchor(pl, b, "magrpo")),
    "c3": (lambda b, x: recipes.c3(b, values=x["values"]), lambda pl, b, x: flat_tree_anchor(pl, b, "c3", x["values"])),
    "malt": (lambda b, x: recipes.malt(b), lambda pl, b, x: flat_tree_anchor(pl, b, "malt")),
    "marsrl": (lambda b, x: recipes.marsrl(b, channel="correct"), lambda pl, b, x: marsrl_anchor(pl, b)),
    "marft": (lambda b, x: recipes.marft(b, x["values"]), lambda pl, b, x: marft_anchor(pl, b, x["values"])),
    "marshal": (lambda b, x: recipes.marshal(b), lambda pl, b, x: marshal_anchor(pl, b)),
    "puppeteer": (lambda b, x: recipes.puppeteer(b), lambda pl, b, x: puppeteer_anchor(pl, b)),
    "agent_qmix": (
        lambda b, x: recipes.agent_qmix(b, x["q"], log_sum_exp),
        lambda pl, b, x: qmix_anchor(pl, b, x["q"]),
    ),
}


@pytest.mark.parametrize("recipe", list(CASES))
def test_recipe(recipe, batch, inputs, scored, pl, dataset_type, measure):
    ours, theirs = CASES[recipe]
    _agree(recipe, ours(batch, inputs), *_pair(theirs(pl, batch, inputs)))
    _agree(recipe, ours(scored, _inputs(scored)), *_pair(theirs(pl, scored, _inputs(scored))))
    measure(lambda: ours(batch, inputs), data=_data(dataset_type, batch, recipe), side="masreplay", rounds=3, unit="ms")


@pytest.mark.parametrize("recipe", list(CASES))
def test_hand_assembly(recipe, batch, inputs, pl, dataset_type, measure):
    _, theirs = CASES[recipe]
    data = _data(dataset_type, batch, recipe)
    measure(lambda: theirs(pl, batch, inputs), data=data, side="Polars/numpy hand-assembly", rounds=3, unit="ms")


def _pair(expected):
    """An anchor's (advantages, weights), or its advantages alone."""
    return expected if isinstance(expected, tuple) else (expected, None)
