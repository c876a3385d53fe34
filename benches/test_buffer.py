"""GraphBuffer against the replay buffers of shared/anchors/replay.md, measured side by side.

Two workloads:

* **Tokens** (replay.md): 10,000 trajectories, lengths uniform 10-2,000, batch 256. The
  anchors store one int32 token array and a float reward per trajectory. masreplay stores the
  same trajectories as traces of as many events (one event per token, the token in the
  event's ``tokens`` field, the reward as the trace's ``team`` reward, 8 traces per
  ``group_id``); a masreplay event carries every field of the schema (the optional ones
  null), so it stores more bytes per event than the anchors: both are reported.
* **Multi-agent** (``masreplay.sim``): 10,000 traces of ``sim.generate(agents=(2, 8),
  group_size=8)``; the anchor is what one would write with pyarrow on the same canonical table.

Each group of the summary compares the same output: "flat events + offsets" means a flat
numpy array of one per-event column of the drawn traces and their int64 offsets
(``batch.event_offsets`` and ``batch.events()["tokens"]``). TorchRL's outputs are its own
(a jagged nested tensor, a padded tensor, a list of references), as replay.md measured them.

The TorchRL anchors need torch, torchrl and tensordict (``benches/requirements-anchors.txt``);
without them those sides are skipped and the summary names the missing package. Checks run
before timing: the anchor and masreplay draw the same kind of batch (same tokens for the same
trajectories, whole groups, only traces of non-zero priority). Nothing is asserted on times.
"""

from __future__ import annotations

import os
import pickle
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import buffer_anchors as ba
import masreplay
from anchors import arrow_anchor
from layouts import realistic

N_TRAJ = 10_000
LENGTHS = (10, 2000)
PAD_TO = 2000
BATCH = 256
NUM_GROUPS, GROUP_SIZE = 32, 8
#: Sample time against the number of stored traces (5-10 events each). 10^7 takes about
#: 9 GB of memory and a minute: set MASREPLAY_BENCH_1E7=1 to include it.
SMALL_LENGTHS = (5, 10)
SCALES = [10**4, 10**5, 10**6] + ([10**7] if os.environ.get("MASREPLAY_BENCH_1E7") else [])
#: 10^5 traces added 8 at a time (12,500 calls, as rollout workers add): many stored chunks.
CHUNKED = "1e5 in adds of 8"
SIM_TRACES = 10_000
SIM_SHAPE = {"agents": (2, 8), "group_size": GROUP_SIZE}

TORCH_PACKAGES = ("torch", "torchrl", "tensordict")
INSTALL = "pip install -r benches/requirements-anchors.txt, in a separate benchmark environment"


def _flat(batch: masreplay.TraceBatch, column: str = "tokens") -> tuple[np.ndarray, np.ndarray]:
    """A sampled batch as flat events + offsets, as a trainer reads it."""
    return batch.flat(column)


# ---- the token workload -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokens(dataset_type):
    work = ba.token_workload(N_TRAJ, LENGTHS, seed=41, group_size=GROUP_SIZE)
    minimal = ba.minimal_table(work)
    batch = masreplay.load_traces(minimal)
    table = batch.to_arrow()  # the canonical layout, as masreplay itself writes it
    assert np.array_equal(batch.events()["tokens"].to_numpy(), work.values)
    assert np.array_equal(batch.event_offsets, work.offsets)
    n_events = int(work.offsets[-1])
    per_sample = round(BATCH * n_events / N_TRAJ)
    note = {"events per trace": f"{work.lengths.min()}-{work.lengths.max()}"}

    def data(name: str, goal: str = "", n_events: int = n_events, n_traces: int = N_TRAJ, n_bytes: int = 0):
        return dataset_type(name, None, n_traces, n_events, n_bytes, goal, note, suite="buffer")

    return SimpleNamespace(
        work=work,
        minimal=minimal,
        batch=batch,
        table=table,
        arrays=work.arrays(),
        add=data(
            "tokens: add 10,000 trajectories (10-2,000 events)",
            "goal: >= 200,000 traces/s from Arrow input",
            n_bytes=table.nbytes,
        ),
        sample=data(
            "tokens: sample 256 as flat events + offsets",
            "goal: as fast as numpy values+offsets, >= 4x TorchRL jagged",
            n_events=per_sample,
            n_traces=BATCH,
        ),
        padded=data(
            "tokens: sample 256 as a padded batch (values, mask, lengths)",
            n_events=per_sample,
            n_traces=BATCH,
        ),
        groups=data(
            "tokens: sample 32 groups x 8",
            "goal: >= 2x TorchRL PromptGroupSampler",
            n_events=per_sample,
            n_traces=BATCH,
        ),
        prioritized=data(
            "tokens: prioritized sample 256 (priorities U(0.01, 1.01), every 10th 0)",
            n_events=per_sample,
            n_traces=BATCH,
        ),
        update=data("tokens: update_priorities of 256 sampled traces", n_events=0, n_traces=BATCH),
        nbytes=data("tokens: stored bytes", "goal: masreplay <= 1.15x raw column bytes (ratio >= 0.87); padded ~2x"),
    )


@pytest.fixture(scope="module")
def filled(tokens):
    buffer = masreplay.GraphBuffer(N_TRAJ, seed=1)
    buffer.add(tokens.table)
    assert len(buffer) == N_TRAJ and buffer.num_groups == N_TRAJ // GROUP_SIZE
    return buffer


@pytest.fixture(scope="module")
def numpy_flat(tokens):
    return ba.NumpyFlat(tokens.arrays, seed=2)


@pytest.fixture(scope="module")
def torchrl(missing_anchor):
    """Skips (naming the package) unless torch, torchrl and tensordict import; then the cache
    of TorchRL buffers that ``rl`` fills."""
    for package in TORCH_PACKAGES:
        try:
            pytest.importorskip(package, reason=f"{package} is not installed: {INSTALL}")
        except pytest.skip.Exception:
            missing_anchor(package, f"not installed; {INSTALL}")
            raise
    return {}


@pytest.fixture(scope="module")
def rl(torchrl, tokens):
    """Lazily built TorchRL objects: ``rl("name")``."""
    torch = ba.torch_setup()
    from torchrl.data import PrioritizedSampler, PromptGroupSampler

    work = tokens.work
    tensors = [torch.from_numpy(a) for a in tokens.arrays]
    groups = lambda: PromptGroupSampler(num_groups=NUM_GROUPS, group_key="prompt")  # noqa: E731
    builders = {
        "list": lambda: ba.torchrl_list(work, tensors),
        "lazy_stack": lambda: ba.torchrl_lazy_stack(work, tensors),
        "padded": lambda: ba.torchrl_padded(work, PAD_TO),
        "groups_lazy_stack": lambda: ba.torchrl_lazy_stack(work, tensors, sampler=groups, group_key="prompt"),
        "groups_padded": lambda: ba.torchrl_padded(work, PAD_TO, sampler=groups, group_key="prompt"),
        "prioritized_list": lambda: ba.torchrl_list(
            work, tensors, sampler=lambda: PrioritizedSampler(N_TRAJ, alpha=1.0, beta=0.4)
        ),
    }

    def get(name: str, filled: bool = True):
        key = (name, filled)
        if key not in torchrl:
            build, items = builders[name]()
            if filled:
                buffer = build()
                buffer.extend(items)
                torchrl[key] = buffer
            else:
                torchrl[key] = (build, items)
        return torchrl[key]

    get.torch = torch
    return get


# ---- add ----------------------------------------------------------------------------------------

ADD_SIDES = [
    "masreplay",
    "masreplay add(TraceBatch), already validated",
    "masreplay add(minimal table: optional columns absent)",
    "masreplay add(realistic layout: UUID ids, events, edges and traces shuffled)",
    "pyarrow.compute + NumPy checks only (ingest anchor)",
    "numpy values+offsets (concatenate + cumsum)",
    "torchrl ListStorage.extend",
    "torchrl LazyStackStorage.extend",
    "torchrl LazyTensorStorage.extend (padded to 2000)",
]


@pytest.mark.parametrize("side", ADD_SIDES)
def test_add(side, tokens, measure, request):
    data = tokens.add
    fresh = lambda: ((masreplay.GraphBuffer(N_TRAJ),), {})  # noqa: E731
    if side == "masreplay":
        added = measure(lambda b: b.add(tokens.table), data=data, side=side, rounds=3, unit="traces/s", setup=fresh)
        assert added == N_TRAJ
    elif side.startswith("masreplay add(TraceBatch"):
        measure(lambda b: b.add(tokens.batch), data=data, side=side, rounds=10, unit="traces/s", setup=fresh)
    elif side.startswith("masreplay add(minimal"):
        measure(lambda b: b.add(tokens.minimal), data=data, side=side, rounds=2, unit="traces/s", setup=fresh)
    elif side.startswith("masreplay add(realistic"):
        table = realistic(tokens.table, seed=3)
        measure(lambda b: b.add(table), data=data, side=side, rounds=3, unit="traces/s", setup=fresh)
    elif side.startswith("pyarrow"):
        measure(lambda: arrow_anchor(tokens.table), data=data, side=side, rounds=3, unit="traces/s")
    elif side.startswith("numpy"):
        flat = measure(lambda: ba.NumpyFlat(tokens.arrays), data=data, side=side, rounds=5, unit="traces/s")
        assert np.array_equal(flat.values, tokens.work.values)
    else:
        rl = request.getfixturevalue("rl")
        storage = side.split()[1].split(".")[0]
        name = {"ListStorage": "list", "LazyStackStorage": "lazy_stack", "LazyTensorStorage": "padded"}[storage]
        build, items = rl(name, filled=False)
        fresh = lambda: ((build(),), {})  # noqa: E731
        measure(lambda b: b.extend(items), data=data, side=side, rounds=5, unit="traces/s", setup=fresh)


# ---- sample 256 ---------------------------------------------------------------------------------

SAMPLE_SIDES = [
    "masreplay",
    "masreplay sample() alone (TraceSelection: picks, nothing copied yet)",
    "numpy values+offsets gather",
    "pyarrow Table.take + flatten (same canonical table)",
    "torchrl LazyStackStorage -> jagged nested tensor",
    "torchrl ListStorage + pad_sequence",
    "torchrl ListStorage (list of references, not a batch)",
    "torchrl LazyTensorStorage (padded to 2000)",
]


def _check_same_draw(batch: masreplay.TraceBatch, work: ba.TokenWorkload, flat: ba.NumpyFlat) -> None:
    values, offsets = _flat(batch)
    expected_values, expected_offsets = flat.gather(ba.trace_indices(batch.trace_ids))
    assert np.array_equal(offsets, expected_offsets)
    assert np.array_equal(values, expected_values)


@pytest.mark.parametrize("side", SAMPLE_SIDES)
def test_sample(side, tokens, filled, numpy_flat, measure, request):
    data = tokens.sample
    if side == "masreplay":
        _check_same_draw(filled.sample(BATCH, seed=7), tokens.work, numpy_flat)
        values, offsets = measure(lambda: _flat(filled.sample(BATCH)), data=data, side=side, rounds=40, unit="ms")
        assert len(offsets) == BATCH + 1 and len(values) == offsets[-1]
    elif side.startswith("masreplay"):
        measure(lambda: filled.sample(BATCH), data=data, side=side, rounds=40, unit="ms")
    elif side.startswith("numpy"):
        measure(lambda: numpy_flat.sample(BATCH), data=data, side=side, rounds=200, unit="ms")
    elif side.startswith("pyarrow"):
        rng = np.random.default_rng(16)
        index = rng.integers(0, N_TRAJ, BATCH)
        theirs, expected = ba.pyarrow_take_flat(tokens.table, index), numpy_flat.gather(index)
        assert np.array_equal(theirs[0], expected[0]) and np.array_equal(theirs[1], expected[1])
        draw = lambda: ba.pyarrow_take_flat(tokens.table, rng.integers(0, N_TRAJ, BATCH))  # noqa: E731
        measure(draw, data=data, side=side, rounds=40, unit="ms")
    else:
        rl = request.getfixturevalue("rl")
        torch = rl.torch
        if "LazyStack" in side:
            buffer = rl("lazy_stack")
            jagged = lambda: buffer.sample().get("tokens", as_nested_tensor=True, layout=torch.jagged)  # noqa: E731
            out, info = buffer.sample(return_info=True)
            nested = out.get("tokens", as_nested_tensor=True, layout=torch.jagged)
            assert np.array_equal(np.diff(nested.offsets().numpy()), tokens.work.lengths[info["index"].numpy()])
            measure(jagged, data=data, side=side, rounds=50, unit="ms")
        elif "pad_sequence" in side:
            from torch.nn.utils.rnn import pad_sequence

            buffer = rl("list")
            padded = lambda: pad_sequence([d["tokens"] for d in buffer.sample()], batch_first=True)  # noqa: E731
            assert padded().shape[0] == BATCH
            measure(padded, data=data, side=side, rounds=100, unit="ms")
        elif "ListStorage" in side:
            buffer = rl("list")
            measure(buffer.sample, data=data, side=side, rounds=200, unit="ms")
        else:
            buffer = rl("padded")
            assert buffer.sample()["tokens"].shape == (BATCH, PAD_TO)
            measure(buffer.sample, data=data, side=side, rounds=100, unit="ms")


PADDED_SIDES = [
    "masreplay",
    "numpy values+offsets, padded by hand",
    "torchrl ListStorage + pad_sequence",
    "torchrl LazyTensorStorage (stored padded to 2000)",
]


@pytest.mark.parametrize("side", PADDED_SIDES)
def test_sample_padded(side, tokens, filled, numpy_flat, measure, request):
    """The same draw as a padded (256, longest) batch: ``TraceBatch.padded("tokens")``."""
    data = tokens.padded
    if side == "masreplay":
        batch = filled.sample(BATCH, seed=17)
        values, mask, lengths = batch.padded("tokens")
        index = ba.trace_indices(batch.trace_ids)
        assert np.array_equal(lengths, tokens.work.lengths[index])
        assert np.array_equal(values[mask], numpy_flat.gather(index)[0])
        measure(lambda: filled.sample(BATCH).padded("tokens"), data=data, side=side, rounds=30, unit="ms")
    elif side.startswith("numpy"):
        measure(lambda: numpy_flat.sample_padded(BATCH), data=data, side=side, rounds=100, unit="ms")
    else:
        rl = request.getfixturevalue("rl")
        if "pad_sequence" in side:
            from torch.nn.utils.rnn import pad_sequence

            buffer = rl("list")
            padded = lambda: pad_sequence([d["tokens"] for d in buffer.sample()], batch_first=True)  # noqa: E731
            measure(padded, data=data, side=side, rounds=100, unit="ms")
        else:
            measure(rl("padded").sample, data=data, side=side, rounds=100, unit="ms")


# ---- sample 32 groups of 8 ---------------------------------------------------------------------

GROUP_SIDES = [
    "masreplay",
    "masreplay sample_groups() alone (TraceSelection)",
    "numpy values+offsets + group index",
    "torchrl PromptGroupSampler, LazyStackStorage -> jagged",
    "torchrl PromptGroupSampler, LazyStackStorage (lazy stack)",
    "torchrl PromptGroupSampler, LazyTensorStorage (padded)",
]


@pytest.mark.parametrize("side", GROUP_SIDES)
def test_sample_groups(side, tokens, filled, numpy_flat, measure, request):
    data = tokens.groups
    if side == "masreplay":
        batch = filled.sample_groups(NUM_GROUPS, group_size=GROUP_SIZE, seed=3)
        _check_same_draw(batch, tokens.work, numpy_flat)
        groups = ba.trace_indices(batch.trace_ids).reshape(NUM_GROUPS, GROUP_SIZE) // GROUP_SIZE
        assert (groups == groups[:, :1]).all() and len(np.unique(groups[:, 0])) == NUM_GROUPS
        draw = lambda: _flat(filled.sample_groups(NUM_GROUPS, group_size=GROUP_SIZE))  # noqa: E731
        measure(draw, data=data, side=side, rounds=40, unit="ms")
    elif side.startswith("masreplay"):
        draw = lambda: filled.sample_groups(NUM_GROUPS, group_size=GROUP_SIZE)  # noqa: E731
        measure(draw, data=data, side=side, rounds=40, unit="ms")
    elif side.startswith("numpy"):
        index = ba.PyarrowGroups(tokens.table.select(["group_id"]), seed=4)
        draw = lambda: numpy_flat.gather(index.draw(NUM_GROUPS, GROUP_SIZE))  # noqa: E731
        measure(draw, data=data, side=side, rounds=100, unit="ms")
    else:
        rl = request.getfixturevalue("rl")
        torch = rl.torch
        buffer = rl("groups_padded" if "LazyTensor" in side else "groups_lazy_stack")
        prompts = buffer.sample()["prompt"].reshape(NUM_GROUPS, GROUP_SIZE)
        assert (prompts == prompts[:, :1]).all() and len(torch.unique(prompts[:, 0])) == NUM_GROUPS
        if "jagged" in side:
            fn = lambda: buffer.sample().get("tokens", as_nested_tensor=True, layout=torch.jagged)  # noqa: E731
        else:
            fn = buffer.sample
        measure(fn, data=data, side=side, rounds=50, unit="ms")


# ---- prioritized ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def priorities(tokens):
    rng = np.random.default_rng(5)
    values = rng.random(N_TRAJ) + 0.01
    values[::10] = 0.0  # every tenth trajectory must never be drawn
    return values


@pytest.fixture(scope="module")
def prioritized(tokens, priorities):
    buffer = masreplay.GraphBuffer(N_TRAJ, seed=6)
    buffer.add(tokens.batch)
    buffer.update_priorities(tokens.batch.trace_ids, priorities)
    return buffer


PRIORITY_SIDES = [
    "masreplay",
    "masreplay sample(prioritized) alone (TraceSelection)",
    "numpy rng.choice(p=...) + values+offsets gather",
    "torchrl PrioritizedSampler, ListStorage (list of refs)",
    "torchrl PrioritizedSampler, ListStorage + torch.cat flat",
]


@pytest.mark.parametrize("side", PRIORITY_SIDES)
def test_prioritized_sample(side, tokens, prioritized, priorities, numpy_flat, measure, request):
    data = tokens.prioritized
    if side == "masreplay":
        batch = prioritized.sample(BATCH, sampler="prioritized", seed=8)
        assert (priorities[ba.trace_indices(batch.trace_ids)] > 0).all()
        _check_same_draw(batch, tokens.work, numpy_flat)
        draw = lambda: _flat(prioritized.sample(BATCH, sampler="prioritized"))  # noqa: E731
        measure(draw, data=data, side=side, rounds=40, unit="ms")
    elif side.startswith("masreplay"):
        measure(lambda: prioritized.sample(BATCH, sampler="prioritized"), data=data, side=side, rounds=40, unit="ms")
    elif side.startswith("numpy"):
        p = priorities / priorities.sum()
        rng = np.random.default_rng(9)
        measure(lambda: numpy_flat.gather(rng.choice(N_TRAJ, BATCH, p=p)), data=data, side=side, rounds=100, unit="ms")
    else:
        rl = request.getfixturevalue("rl")
        torch = rl.torch
        buffer = rl("prioritized_list")
        buffer.update_priority(torch.arange(N_TRAJ), torch.from_numpy(priorities.astype(np.float32)))
        _, info = buffer.sample(return_info=True)
        assert (priorities[info["index"].numpy()] > 0).all()

        def flat():
            tensors = [d["tokens"] for d in buffer.sample()]
            offsets = torch.zeros(len(tensors) + 1, dtype=torch.int64)
            torch.cumsum(torch.tensor([len(t) for t in tensors]), 0, out=offsets[1:])
            return torch.cat(tensors), offsets

        measure(flat if "cat" in side else buffer.sample, data=data, side=side, rounds=100, unit="ms")


@pytest.mark.parametrize("side", ["masreplay", "torchrl PrioritizedSampler.update_priority"])
def test_update_priorities(side, tokens, prioritized, priorities, measure, request):
    data = tokens.update
    rng = np.random.default_rng(10)
    new = rng.random(BATCH) + 0.01
    if side == "masreplay":
        ids = prioritized.sample(BATCH, sampler="prioritized", seed=11).trace_ids
        measure(lambda: prioritized.update_priorities(ids, new), data=data, side=side, rounds=200, unit="ms")
        prioritized.update_priorities(tokens.batch.trace_ids, priorities)
    else:
        rl = request.getfixturevalue("rl")
        torch = rl.torch
        buffer = rl("prioritized_list")
        index = torch.from_numpy(rng.integers(0, N_TRAJ, BATCH))
        new_t = torch.from_numpy(new.astype(np.float32))
        measure(lambda: buffer.update_priority(index, new_t), data=data, side=side, rounds=200, unit="ms")


# ---- stored bytes ---------------------------------------------------------------------------------


def test_stored_bytes(tokens, filled, numpy_flat, benchmark, record, request):
    """Bytes of the stored content; the timed part is ``to_arrow()`` of the whole buffer
    (shown in pytest-benchmark's table only)."""
    data = tokens.nbytes
    stored = benchmark.pedantic(filled.to_arrow, rounds=1, iterations=1)
    record(filled.nbytes, data=data, side="masreplay (GraphBuffer.nbytes: its allocations)", unit="bytes")
    record(
        stored.get_total_buffer_size(),
        data=data,
        side="  to_arrow() seen by pyarrow (get_total_buffer_size)",
        unit="bytes",
        ours=False,
    )
    record(ba.table_raw_bytes(stored), data=data, side="raw column bytes of the same content", unit="bytes")
    record(
        numpy_flat.nbytes + tokens.work.rewards.nbytes,
        data=data,
        side="numpy values+offsets (int32 tokens + reward)",
        unit="bytes",
    )
    try:
        rl = request.getfixturevalue("rl")
    except pytest.skip.Exception:
        return
    padded = rl("padded")
    record(
        ba.tensordict_bytes(padded.storage[:]),
        data=data,
        side="torchrl LazyTensorStorage (padded to 2000)",
        unit="bytes",
    )
    stacked = rl("lazy_stack")
    record(
        sum(ba.tensordict_bytes(td) for td in stacked.storage._storage),
        data=data,
        side="torchrl LazyStackStorage (its tensors)",
        unit="bytes",
    )


# ---- sample time against the number of stored traces ---------------------------------------------


@pytest.fixture(scope="module", params=[*SCALES, CHUNKED], ids=lambda p: p if isinstance(p, str) else f"{p:.0e}")
def scaled(request, dataset_type, record):
    import time

    n = 10**5 if request.param == CHUNKED else request.param
    work = ba.token_workload(n, SMALL_LENGTHS, seed=12, group_size=GROUP_SIZE)
    table = ba.minimal_table(work)
    label = f"{n:,} stored traces" + (", added 8 at a time" if request.param == CHUNKED else "")
    data = dataset_type(
        f"tokens: sample 256 from {label} (5-10 events each)",
        None,
        BATCH,
        round(BATCH * SMALL_LENGTHS[0] / 2 + BATCH * SMALL_LENGTHS[1] / 2),
        0,
        "goal: flat in the number stored",
        suite="buffer",
    )
    fill = dataset_type(data.name, None, n, int(work.offsets[-1]), 0, suite="buffer")
    if request.param == CHUNKED:
        # Separate small tables, as rollout workers produce them. Not table.slice(): a slice
        # keeps the parent's list children, and masreplay's Arrow ingest then allocates the
        # missing event columns for all of the parent's events at every add (RESULTS.md).
        parts = [table.take(pa.array(np.arange(first, first + GROUP_SIZE))) for first in range(0, n, GROUP_SIZE)]
    else:
        parts = [table]
    buffer = masreplay.GraphBuffer(n, seed=13)
    start = time.perf_counter()
    for part in parts:
        buffer.add(part)
    seconds = time.perf_counter() - start
    del parts
    how = "12,500 x add(8-row Arrow table)" if request.param == CHUNKED else "add(one Arrow table)"
    record(seconds, data=fill, side=f"  fill, once: {how}", unit="traces/s", ours=False)
    flat = ba.NumpyFlat.from_flat(work.values, work.offsets, seed=14)
    yield SimpleNamespace(work=work, buffer=buffer, flat=flat, data=data)
    del buffer, table


@pytest.mark.parametrize("side", ["masreplay", "numpy values+offsets gather"])
def test_sample_scale(side, scaled, measure):
    if side == "masreplay":
        _check_same_draw(scaled.buffer.sample(BATCH, seed=15), scaled.work, scaled.flat)
        draw = lambda: _flat(scaled.buffer.sample(BATCH))  # noqa: E731
        measure(draw, data=scaled.data, side=side, rounds=100, warmup_rounds=3, unit="ms")
    else:
        measure(lambda: scaled.flat.sample(BATCH), data=scaled.data, side=side, rounds=200, unit="ms")


# ---- the multi-agent workload ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def sim(dataset_type):
    batch = masreplay.sim.generate(SIM_TRACES, seed=51, **SIM_SHAPE)
    table = batch.to_arrow()
    n_events = int(batch.num_events)
    per_sample = round(BATCH * n_events / SIM_TRACES)
    sizes = np.diff(batch.event_offsets)
    note = {"events per trace": f"{sizes.min()}-{sizes.max()}"}
    buffer = masreplay.GraphBuffer(SIM_TRACES, seed=52)
    buffer.add(table)

    def data(name: str, goal: str = "", n_events: int = n_events, n_traces: int = SIM_TRACES, n_bytes: int = 0):
        return dataset_type(name, None, n_traces, n_events, n_bytes, goal, note, suite="buffer")

    shape = f"sim agents=(2,8), {sizes.min()}-{sizes.max()} events"
    return SimpleNamespace(
        batch=batch,
        table=table,
        buffer=buffer,
        rows={trace_id: i for i, trace_id in enumerate(batch.trace_ids)},
        add=data(f"multi-agent ({shape}): add 10,000 traces", n_bytes=table.nbytes),
        sample=data("multi-agent: sample 256 as flat events + offsets", n_events=per_sample, n_traces=BATCH),
        groups=data("multi-agent: sample 32 groups x 8", n_events=per_sample, n_traces=BATCH),
        save=data("multi-agent: save + load (Parquet file)", n_bytes=table.nbytes),
        pickle=data("multi-agent: pickle round trip (dumps + loads)", n_bytes=table.nbytes),
        nbytes=data("multi-agent: stored bytes", "goal: masreplay <= 1.15x raw column bytes (ratio >= 0.87)"),
    )


SIM_ADD_SIDES = [
    "masreplay",
    "masreplay add(realistic layout: UUID ids, events, edges and traces shuffled)",
    "masreplay add(TraceBatch), already validated",
    "pyarrow.compute + NumPy checks only (ingest anchor)",
]


@pytest.mark.parametrize("side", SIM_ADD_SIDES)
def test_sim_add(side, sim, measure):
    fresh = lambda: ((masreplay.GraphBuffer(SIM_TRACES),), {})  # noqa: E731
    if side == "masreplay":
        measure(lambda b: b.add(sim.table), data=sim.add, side=side, rounds=5, unit="traces/s", setup=fresh)
    elif side.startswith("masreplay add(realistic"):
        table = realistic(sim.table, seed=53)
        measure(lambda b: b.add(table), data=sim.add, side=side, rounds=5, unit="traces/s", setup=fresh)
    elif side.startswith("masreplay"):
        measure(lambda b: b.add(sim.batch), data=sim.add, side=side, rounds=20, unit="traces/s", setup=fresh)
    else:
        measure(lambda: arrow_anchor(sim.table), data=sim.add, side=side, rounds=5, unit="traces/s")


@pytest.mark.parametrize("side", ["masreplay", "pyarrow Table.take + flatten"])
def test_sim_sample(side, sim, measure):
    if side == "masreplay":
        batch = sim.buffer.sample(BATCH, seed=53)
        index = np.array([sim.rows[t] for t in batch.trace_ids])
        ours, theirs = _flat(batch), ba.pyarrow_take_flat(sim.table, index)
        assert np.array_equal(ours[1], theirs[1]) and np.array_equal(ours[0], theirs[0])
        measure(lambda: _flat(sim.buffer.sample(BATCH)), data=sim.sample, side=side, rounds=100, unit="ms")
    else:
        rng = np.random.default_rng(54)
        measure(
            lambda: ba.pyarrow_take_flat(sim.table, rng.integers(0, SIM_TRACES, BATCH)),
            data=sim.sample,
            side=side,
            rounds=100,
            unit="ms",
        )


@pytest.mark.parametrize("side", ["masreplay", "numpy group index + pyarrow Table.take + flatten"])
def test_sim_sample_groups(side, sim, measure):
    if side == "masreplay":
        batch = sim.buffer.sample_groups(NUM_GROUPS, group_size=GROUP_SIZE, seed=55)
        groups = np.array(batch.to_arrow().column("group_id").to_pylist()).reshape(NUM_GROUPS, GROUP_SIZE)
        assert (groups == groups[:, :1]).all() and len(set(groups[:, 0])) == NUM_GROUPS
        measure(
            lambda: _flat(sim.buffer.sample_groups(NUM_GROUPS, group_size=GROUP_SIZE)),
            data=sim.groups,
            side=side,
            rounds=100,
            unit="ms",
        )
    else:
        index = ba.PyarrowGroups(sim.table, seed=56)
        measure(
            lambda: ba.pyarrow_take_flat(sim.table, index.draw(NUM_GROUPS, GROUP_SIZE)),
            data=sim.groups,
            side=side,
            rounds=100,
            unit="ms",
        )


@pytest.mark.parametrize("side", ["masreplay", "pq.write_table (zstd) + pq.read_table, no checks"])
def test_sim_save_load(side, sim, measure, tmp_path):
    path = tmp_path / "buffer.parquet"
    if side == "masreplay":

        def round_trip():
            sim.buffer.save(path)
            return masreplay.GraphBuffer.load(path)

        loaded = measure(round_trip, data=sim.save, side=side, rounds=5, unit="ms")
        assert len(loaded) == SIM_TRACES and np.array_equal(loaded.priorities(), sim.buffer.priorities())
    else:

        def round_trip():
            pq.write_table(sim.table, path, compression="zstd")
            return pq.read_table(path)

        loaded = measure(round_trip, data=sim.save, side=side, rounds=5, unit="ms")
        assert loaded.num_rows == SIM_TRACES


@pytest.mark.parametrize("side", ["masreplay", "pickle of the pa.Table (Arrow IPC), no checks"])
def test_sim_pickle(side, sim, measure):
    if side == "masreplay":
        round_trip = lambda: pickle.loads(pickle.dumps(sim.buffer))  # noqa: E731
        loaded = measure(round_trip, data=sim.pickle, side=side, rounds=5, unit="ms")
        assert len(loaded) == SIM_TRACES
    else:
        loaded = measure(lambda: pickle.loads(pickle.dumps(sim.table)), data=sim.pickle, side=side, rounds=5, unit="ms")
        assert loaded.num_rows == SIM_TRACES


def test_sim_stored_bytes(sim, benchmark, record, tmp_path):
    stored = benchmark.pedantic(sim.buffer.to_arrow, rounds=1, iterations=1)
    record(sim.buffer.nbytes, data=sim.nbytes, side="masreplay (GraphBuffer.nbytes: its allocations)", unit="bytes")
    side = "  to_arrow() seen by pyarrow (get_total_buffer_size)"
    record(stored.get_total_buffer_size(), data=sim.nbytes, side=side, unit="bytes", ours=False)
    record(ba.table_raw_bytes(stored), data=sim.nbytes, side="raw column bytes of the same content", unit="bytes")
    path = tmp_path / "buffer.parquet"
    sim.buffer.save(path)
    record(os.path.getsize(path), data=sim.nbytes, side="  GraphBuffer.save Parquet file", unit="bytes", ours=False)


# ---- small adds: a rollout worker's group of 8 traces per call -----------------------------------

#: Calls timed per side: each adds the next group of 8 traces (``sim.generate(8)``, about 170
#: events a call) to one buffer, as rollout workers add one GRPO group at a time.
SMALL_ADD_CALLS = 2_000


@pytest.fixture(scope="module")
def small_adds(dataset_type):
    """The groups in each form a rollout worker may hand over (Arrow table, TraceBatch, list of
    dicts), and the same trajectories as the TorchRL anchors store them (a dict of the events'
    tokens and the team reward per trace, as ``buffer_anchors.torchrl_list`` builds them)."""
    batches = [masreplay.sim.generate(GROUP_SIZE, seed=s) for s in range(SMALL_ADD_CALLS)]
    tables = [batch.to_arrow() for batch in batches]
    n_events = sum(int(batch.num_events) for batch in batches)

    def trajectories(batch, table):
        values, offsets = batch.flat("tokens")
        rewards = [dict(r)["team"] for r in table.column("rewards").to_pylist()]
        lengths = np.diff(offsets)
        return ba.TokenWorkload(lengths, offsets, values.astype(np.int32), np.array(rewards, np.float32), GROUP_SIZE)

    return SimpleNamespace(
        batches=batches,
        tables=tables,
        dicts=[[batch[i] for i in range(len(batch))] for batch in batches],
        trajectories=[trajectories(b, t) for b, t in zip(batches, tables, strict=True)],
        data=dataset_type(
            f"multi-agent: add 8 traces per call ({SMALL_ADD_CALLS:,} calls into one buffer)",
            None,
            GROUP_SIZE,
            round(n_events / SMALL_ADD_CALLS),
            0,
            "goal: per-call CPU 2x below 2026-11-27 main",
            suite="buffer",
        ),
    )


SMALL_ADD_SIDES = [
    "masreplay",
    "masreplay add(TraceBatch of 8), already validated",
    "masreplay add(list of 8 dicts)",
    "pa.Table.validate + pa.concat_tables (floor: layout checks, no trace rules)",
    "torchrl ListStorage.extend (same 8 trajectories)",
]


@pytest.mark.parametrize("side", SMALL_ADD_SIDES)
def test_add_small(side, small_adds, measure, request):
    """One round is one call; every call adds the next group to the same buffer, so the merges
    of small chunks are paid for as they come."""
    calls = iter(range(SMALL_ADD_CALLS))
    timed = {"data": small_adds.data, "side": side, "rounds": SMALL_ADD_CALLS, "warmup_rounds": 0, "unit": "ms"}
    if side.startswith("torchrl"):
        request.getfixturevalue("torchrl")  # skips, naming the missing package
        torch = ba.torch_setup()
        from torchrl.data import ListStorage, ReplayBuffer

        groups = [ba.torchrl_list(w, [torch.from_numpy(a) for a in w.arrays()])[1] for w in small_adds.trajectories]
        buffer = ReplayBuffer(storage=ListStorage(SMALL_ADD_CALLS * GROUP_SIZE), collate_fn=lambda x: x)
        measure(buffer.extend, setup=lambda: ((groups[next(calls)],), {}), **timed)
        assert len(buffer) == SMALL_ADD_CALLS * GROUP_SIZE
    elif side.startswith("pa."):
        # The previous group and this one: a concatenation of constant cost (a table that grew
        # call by call would cost more with every call, as a growing list of chunks).
        tables = small_adds.tables

        def floor(i: int) -> pa.Table:
            tables[i].validate()
            return pa.concat_tables([tables[i - 1], tables[i]])

        measure(floor, setup=lambda: ((next(calls),), {}), **timed)
    else:
        if side == "masreplay":
            inputs = small_adds.tables
        elif "TraceBatch" in side:
            inputs = small_adds.batches
        else:
            inputs = small_adds.dicts
        buffer = masreplay.GraphBuffer(SMALL_ADD_CALLS * GROUP_SIZE, seed=57)
        measure(buffer.add, setup=lambda: ((inputs[next(calls)],), {}), **timed)
        stored, added = buffer.to_batch(), masreplay.load_traces(pa.concat_tables(small_adds.tables))
        assert stored.trace_ids == added.trace_ids
        assert all(np.array_equal(a, b) for a, b in zip(stored.flat("tokens"), added.flat("tokens"), strict=True))
