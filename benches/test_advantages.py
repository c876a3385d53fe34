"""Advantages against verl, TRL and vectorised numpy, measured side by side (issue 4).

Workload: ``ROWS`` rows (1,000,000) in groups of 8 (GRPO rollouts of one prompt, rows of a
group contiguous), rewards ``N(0, 1)`` rounded to fp32, and for the agent-wise case an agent
id in 0..3 per row (Dr. MAS: each row is one agent step carrying the episode reward; cells
are (group, agent)). Every side gets the same arrays: float64 values and int64 group ids
(verl its ``(rows, 1)`` fp32 token rewards built from them, TRL its fp32 tensor).

Sides, per workload:

* masreplay ``group_normalize`` (Rust, both cores; float32 out as trainers take it), and in
  the trainers' own arithmetic (``compat="verl"``, ``compat="trl"``);
* verl's ``compute_grpo_outcome_advantage`` (its Python loop over rows; one round);
* TRL's group normalisation: the ``GRPOTrainer`` lines (``nanmean``/``nanstd`` over
  ``view(-1, 8)``), with TRL's own ``nanstd``; it needs equal, contiguous groups;
* numpy, the best vectorised general version: ``bincount`` group sums and sums of squared
  deviations (any group layout), and, for GRPO, numpy ``reshape(-1, 8)`` (equal contiguous
  groups only, like TRL) as the fastest special case.

Before timing, every side must agree with masreplay to 1e-6 (bit for bit for verl and TRL
in their compat modes). Nothing is asserted on times. Set MASREPLAY_BENCH_ADVANTAGE_ROWS to
change the size.
"""

from __future__ import annotations

import importlib
import os

import numpy as np
import pytest

import masreplay
from layouts import realistic

ROWS = int(os.environ.get("MASREPLAY_BENCH_ADVANTAGE_ROWS", 1_000_000))
GROUP = 8
AGENTS = 4
EPS = 1e-6


@pytest.fixture(scope="module")
def rows():
    rng = np.random.default_rng(4)
    values = rng.normal(size=ROWS).astype(np.float32).astype(np.float64)
    groups = np.repeat(np.arange(ROWS // GROUP, dtype=np.int64), GROUP)
    agents = rng.integers(0, AGENTS, size=ROWS).astype(np.int64)
    return values, groups, agents


def _data(dataset_type, name: str, goal: str):
    return dataset_type(name, None, ROWS, ROWS, 0, goal, {"group size": GROUP}, suite="advantages")


@pytest.fixture(scope="module")
def grpo_data(dataset_type):
    return _data(dataset_type, f"GRPO, {ROWS:,} rows in groups of {GROUP}", "goal: >= 1000x verl, >= 3x numpy bincount")


@pytest.fixture(scope="module")
def agent_data(dataset_type):
    return _data(
        dataset_type,
        f"agent-wise (Dr. MAS), {ROWS:,} rows, groups of {GROUP} x {AGENTS} agents",
        "goal: >= 3x numpy group-by over (group, agent)",
    )


# ---- numpy: the vectorised versions a practitioner would write -------------------------------


def numpy_bincount(values: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """GRPO per dense key with bincount sums (any layout): unbiased std, 0 for a key of one."""
    counts = np.bincount(keys)
    mean = np.bincount(keys, weights=values) / np.maximum(counts, 1)
    centered = values - mean[keys]
    var = np.bincount(keys, weights=centered * centered) / np.maximum(counts - 1, 1)
    out = centered / (np.sqrt(var)[keys] + EPS)
    out[counts[keys] < 2] = 0.0
    return out.astype(np.float32)


def numpy_reshape(values: np.ndarray) -> np.ndarray:
    grouped = values.reshape(-1, GROUP)
    centered = grouped - grouped.mean(axis=1, keepdims=True)
    return (centered / (grouped.std(axis=1, ddof=1, keepdims=True) + EPS)).astype(np.float32).ravel()


def _agree(name: str, ours: np.ndarray, theirs: np.ndarray, exact: bool = False) -> None:
    ours, theirs = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    if exact:
        assert np.array_equal(ours, theirs), f"{name}: not bit for bit"
    else:
        worst = float(np.max(np.abs(ours - theirs)))
        assert worst <= 1e-6, f"{name}: differs by {worst}"


def _optional(module: str, package: str, missing_anchor):
    try:
        return importlib.import_module(module)
    except ImportError as error:
        missing_anchor(package, str(error))
        pytest.skip(f"{package} is not installed: {error}")


# ---- GRPO ------------------------------------------------------------------------------------------


def _masreplay_group_normalize(rows, data, measure, rounds: int) -> None:
    """Checks masreplay against numpy's bincount on these rows, then times it."""
    values, groups, _ = rows
    _agree("numpy bincount", masreplay.group_normalize(values, groups), numpy_bincount(values, groups))
    measure(lambda: masreplay.group_normalize(values, groups), data=data, side="masreplay", rounds=rounds, unit="ms")


def test_grpo_masreplay(rows, grpo_data, measure):
    _masreplay_group_normalize(rows, grpo_data, measure, rounds=30)


def test_grpo_masreplay_verl_arithmetic(rows, grpo_data, measure):
    values, groups, _ = rows
    fn = lambda: masreplay.group_normalize(values, groups, compat="verl")  # noqa: E731
    measure(fn, data=grpo_data, side="masreplay compat='verl' (fp32, bit for bit)", rounds=30, unit="ms", ours=False)


def test_grpo_numpy_bincount(rows, grpo_data, measure):
    values, groups, _ = rows
    measure(lambda: numpy_bincount(values, groups), data=grpo_data, side="numpy bincount (any layout)", rounds=15, unit="ms")


def test_grpo_numpy_reshape(rows, grpo_data, measure):
    values, groups, _ = rows
    _agree("numpy reshape", masreplay.group_normalize(values, groups), numpy_reshape(values))
    measure(
        lambda: numpy_reshape(values), data=grpo_data, side="numpy reshape(-1, 8) (equal contiguous groups)", rounds=15, unit="ms"
    )


def test_grpo_trl(rows, grpo_data, measure, missing_anchor):
    torch = _optional("torch", "torch", missing_anchor)
    utils = _optional("trl.trainer.utils", "trl", missing_anchor)
    torch.set_num_threads(1)
    values, groups, _ = rows
    rewards = torch.from_numpy(values.astype(np.float32))

    def trl_group_normalisation():
        mean = torch.nanmean(rewards.view(-1, GROUP), dim=1).repeat_interleave(GROUP, dim=0)
        std = utils.nanstd(rewards.view(-1, GROUP), dim=1).repeat_interleave(GROUP, dim=0)
        return torch.nan_to_num((rewards - mean) / (std + 1e-4), nan=0.0)

    # bit for bit but for torch's fp32 sqrt (MKL, not correctly rounded: 1 ulp on some values)
    _agree("TRL", masreplay.group_normalize(values, groups, compat="trl"), trl_group_normalisation().numpy())
    measure(trl_group_normalisation, data=grpo_data, side="TRL GRPOTrainer lines (torch, 1 thread)", rounds=10, unit="ms")


def test_grpo_verl(rows, grpo_data, measure, missing_anchor):
    torch = _optional("torch", "torch", missing_anchor)
    core_algos = _optional("verl.trainer.ppo.core_algos", "verl", missing_anchor)
    torch.set_num_threads(1)
    values, groups, _ = rows
    rewards = torch.from_numpy(values.astype(np.float32)).unsqueeze(-1)
    mask = torch.ones_like(rewards)

    def verl_grpo():
        return core_algos.compute_grpo_outcome_advantage(rewards.clone(), mask, groups)[0]

    if os.environ.get("MASREPLAY_BENCH_VERL_CHECK", "1") == "1":
        sub = slice(0, 80_000)  # the full check would double verl's minutes
        theirs = core_algos.compute_grpo_outcome_advantage(rewards[sub].clone(), mask[sub], groups[sub])[0]
        _agree("verl", masreplay.group_normalize(values[sub], groups[sub], compat="verl"), theirs.squeeze(-1).numpy(), exact=True)
    measure(verl_grpo, data=grpo_data, side="verl compute_grpo_outcome_advantage", rounds=1, warmup_rounds=0, unit="ms")


# ---- agent-wise (group, agent) cells ----------------------------------------------------------------


def test_agent_wise_masreplay(rows, agent_data, measure):
    values, groups, agents = rows
    ours = masreplay.group_normalize(values, groups, strata=agents)
    _agree("numpy bincount (group, agent)", ours, numpy_bincount(values, groups * AGENTS + agents))
    measure(
        lambda: masreplay.group_normalize(values, groups, strata=agents), data=agent_data, side="masreplay", rounds=30, unit="ms"
    )


def test_agent_wise_numpy(rows, agent_data, measure):
    values, groups, agents = rows

    def numpy_group_by():
        return numpy_bincount(values, groups * AGENTS + agents)

    measure(numpy_group_by, data=agent_data, side="numpy bincount over (group, agent)", rounds=15, unit="ms")


def test_agent_wise_numpy_unique(rows, agent_data, measure):
    """The general group-by when keys are not small dense integers: np.unique on the pairs."""
    values, groups, agents = rows

    def numpy_unique_group_by():
        _, keys = np.unique(np.stack([groups, agents], axis=1), axis=0, return_inverse=True)
        return numpy_bincount(values, keys.ravel())

    _agree("numpy unique", masreplay.group_normalize(values, groups, strata=agents), numpy_unique_group_by())
    measure(numpy_unique_group_by, data=agent_data, side="numpy unique + bincount (general keys)", rounds=3, unit="ms")


def test_agent_wise_trl_style_torch(rows, agent_data, measure, missing_anchor):
    """Stratified normalisation written with torch scatter ops, TRL's building blocks."""
    torch = _optional("torch", "torch", missing_anchor)
    torch.set_num_threads(1)
    values, groups, agents = rows
    x = torch.from_numpy(values)
    keys = torch.from_numpy(groups * AGENTS + agents)
    n_keys = int(keys.max()) + 1

    def torch_scatter():
        counts = torch.zeros(n_keys, dtype=torch.float64).index_add_(0, keys, torch.ones_like(x))
        mean = torch.zeros(n_keys, dtype=torch.float64).index_add_(0, keys, x) / counts.clamp(min=1)
        centered = x - mean[keys]
        var = torch.zeros(n_keys, dtype=torch.float64).index_add_(0, keys, centered * centered) / (counts - 1).clamp(min=1)
        out = centered / (var.sqrt()[keys] + EPS)
        return torch.where(counts[keys] < 2, torch.zeros_like(out), out).float()

    _agree("torch scatter", masreplay.group_normalize(values, groups, strata=agents), torch_scatter().numpy())
    measure(torch_scatter, data=agent_data, side="torch index_add over (group, agent) (1 thread)", rounds=10, unit="ms")


# ---- the layouts users have: interleaved groups, string uids ----------------------------------------


@pytest.fixture(scope="module")
def shuffled_rows():
    """Groups of 1-64 rows in random order (after a shuffle or a buffer sample), as int64 ids
    and as the string uids verl carries in ``non_tensor_batch["uid"]`` (an object array)."""
    rng = np.random.default_rng(5)
    sizes = rng.integers(1, 65, size=ROWS // 32 + 1)
    groups = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)[:ROWS]
    rng.shuffle(groups)
    values = rng.normal(size=len(groups)).astype(np.float32).astype(np.float64)
    uids = np.array([f"{g:08x}-uid" for g in groups], dtype=object)
    return values, groups, uids


@pytest.fixture(scope="module")
def wide_rows():
    """Groups of 1-64 rows contiguous (each group's rows together, groups in no order),
    labelled by random 62-bit integers (hashes, packed ids), and the dense codes of the same
    groups (what bincount needs)."""
    rng = np.random.default_rng(6)
    sizes = rng.integers(1, 65, size=ROWS // 32 + 1)
    codes = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)[:ROWS]
    labels = rng.integers(0, 2**62, size=len(sizes), dtype=np.int64)[codes]
    values = rng.normal(size=len(codes)).astype(np.float32).astype(np.float64)
    return values, labels, codes


@pytest.fixture(scope="module")
def wide_data(dataset_type):
    name = f"GRPO, {ROWS:,} rows, groups of 1-64 contiguous, random 62-bit labels"
    goal = "goal: >= 3x numpy factorise + bincount"
    return dataset_type(name, None, ROWS, ROWS, 0, goal, {}, suite="advantages")


@pytest.fixture(scope="module")
def compat_data(dataset_type):
    name = f"GRPO trainer modes, {ROWS:,} rows, groups of 1-64 interleaved"
    return dataset_type(name, None, ROWS, ROWS, 0, "goal: compat modes <= 2x native", {}, suite="advantages")


@pytest.fixture(scope="module")
def shuffled_data(dataset_type):
    name = f"GRPO, {ROWS:,} rows, groups of 1-64 interleaved (realistic layout)"
    return dataset_type(name, None, ROWS, ROWS, 0, "goal: >= 3x numpy bincount", {}, suite="advantages")


@pytest.fixture(scope="module")
def uid_data(dataset_type):
    name = f"GRPO, {ROWS:,} rows, string uids interleaved (verl's object array)"
    return dataset_type(name, None, ROWS, ROWS, 0, "goal: >= 3x numpy factorise + bincount", {}, suite="advantages")


def test_shuffled_masreplay(shuffled_rows, shuffled_data, measure):
    _masreplay_group_normalize(shuffled_rows, shuffled_data, measure, rounds=10)


def test_shuffled_numpy_bincount(shuffled_rows, shuffled_data, measure):
    """The anchor is single-threaded: run the suite with RAYON_NUM_THREADS=1 for the 1-thread ratio."""
    values, groups, _ = shuffled_rows
    measure(lambda: numpy_bincount(values, groups), data=shuffled_data, side="numpy bincount", rounds=10, unit="ms")


@pytest.mark.parametrize("compat", [None, "verl", "trl", "openrlhf"], ids=["native", "verl", "trl", "openrlhf"])
def test_compat_modes(shuffled_rows, compat_data, measure, compat):
    """Each trainer mode against native (the group's reference) on the interleaved layout."""
    values, groups, _ = shuffled_rows
    measure(
        lambda: masreplay.group_normalize(values, groups, compat=compat),
        data=compat_data,
        side="masreplay native" if compat is None else f"masreplay compat={compat!r}",
        rounds=10,
        unit="ms",
        ours=compat is None,
    )


def test_wide_labels_masreplay(wide_rows, wide_data, measure):
    values, labels, codes = wide_rows
    _agree("numpy bincount", masreplay.group_normalize(values, labels), numpy_bincount(values, codes))
    measure(lambda: masreplay.group_normalize(values, labels), data=wide_data, side="masreplay", rounds=10, unit="ms")


def test_wide_labels_numpy_factorise_bincount(wide_rows, wide_data, measure):
    values, labels, _ = wide_rows
    measure(
        lambda: numpy_bincount(values, np.unique(labels, return_inverse=True)[1].ravel()),
        data=wide_data,
        side="numpy unique(return_inverse) + bincount",
        rounds=5,
        unit="ms",
    )


def test_wide_labels_numpy_bincount_on_codes(wide_rows, wide_data, measure):
    """bincount given the groups' dense codes already (the labels' factorisation for free)."""
    values, _, codes = wide_rows
    measure(lambda: numpy_bincount(values, codes), data=wide_data, side="numpy bincount on dense codes", rounds=10, unit="ms")


def test_uids_masreplay(shuffled_rows, uid_data, measure):
    values, _, uids = shuffled_rows
    measure(
        lambda: masreplay.group_normalize(values, uids),
        data=uid_data,
        side="masreplay (uids as given)",
        rounds=3,
        unit="ms",
        ours=True,
    )


def test_uids_numpy_factorise_bincount(shuffled_rows, uid_data, measure):
    values, _groups, uids = shuffled_rows

    def numpy_side():
        keys = np.unique(uids, return_inverse=True)[1]
        return numpy_bincount(values, keys)

    _agree("numpy factorise + bincount", masreplay.group_normalize(values, uids), numpy_side())
    measure(numpy_side, data=uid_data, side="numpy unique(return_inverse) + bincount", rounds=3, unit="ms")


# ---- one trainer step: a small batch, called once per step ------------------------------------

STEP_TRACES = 256  # 32 prompts x 8 rollouts, the size of a GRPO step


@pytest.fixture(scope="module")
def step_batch():
    """A step's traces in the realistic layout (UUID ids, string group ids, groups interleaved),
    and what a hand-written version is given, extracted once outside the timing: each trace's
    team reward, its group id and its number of events."""
    table = realistic(masreplay.sim.generate(STEP_TRACES, agents=(2, 4), group_size=GROUP, seed=7).to_arrow(), seed=7)
    batch = masreplay.load_traces(table)
    rewards = np.array([dict(r)["team"] for r in table.column("rewards").to_pylist()], dtype=np.float64)
    groups = np.array(table.column("group_id").to_pylist(), dtype=object)
    lengths = np.diff(batch.event_offsets)
    return batch, rewards, groups, lengths


@pytest.fixture(scope="module")
def step_data(dataset_type, step_batch):
    batch = step_batch[0]
    name = f"one trainer step: advantages of {len(batch)} traces ({batch.num_events:,} events), string group ids interleaved"
    goal = "per-call latency (no goal set): masreplay from the batch, numpy from arrays handed over"
    return dataset_type(name, None, len(batch), batch.num_events, 0, goal, {}, suite="advantages")


def numpy_step(rewards: np.ndarray, groups: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GRPO by hand for one step: factorise the group ids, normalise, broadcast to the events."""
    per_trace = numpy_bincount(rewards, np.unique(groups, return_inverse=True)[1].ravel())
    return per_trace, np.repeat(per_trace, lengths)


def test_step_masreplay(step_batch, step_data, measure):
    batch, rewards, groups, lengths = step_batch
    ours = masreplay.advantages(batch)
    per_trace, per_event = numpy_step(rewards, groups, lengths)
    _agree("numpy by hand (per trace)", ours.per_trace, per_trace)
    _agree("numpy by hand (per event)", ours.per_event, per_event)
    measure(lambda: masreplay.advantages(batch), data=step_data, side="masreplay", rounds=300, warmup_rounds=20, unit="ms")


def test_step_numpy(step_batch, step_data, measure):
    _, rewards, groups, lengths = step_batch
    measure(
        lambda: numpy_step(rewards, groups, lengths),
        data=step_data,
        side="numpy unique + bincount + repeat (arrays handed over)",
        rounds=300,
        warmup_rounds=20,
        unit="ms",
    )
