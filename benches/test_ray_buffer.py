"""masreplay.ray against TorchRL's RayReplayBuffer, and staleness-bounded sampling.

* **Adds/s**: 4 writers each add 8 parts of 64 trajectories (lengths uniform 10-200
  tokens, the token workload of replay.md) into a buffer; masreplay: a RayGraphBuffer of 2
  shards fed Arrow tables of traces (one event per token), by ``add`` (waits for the shards
  after each part) and by a ``BufferWriter`` (sends each part without waiting, at most 8
  calls unanswered, and waits for all at the end); anchor: TorchRL's RayReplayBuffer
  (one actor; a LazyTensorStorage of tokens padded to 200 plus the lengths, the TorchRL
  storage that takes a batch of trajectories in one write) fed TensorDicts of the same
  trajectories. The writers are Ray actors started once (rollout workers live across steps;
  a Ray task's worker process may be recycled between rounds and restart with its imports).
  One round: tell each of the 4 writers to add its parts, wait for all. Before the clock
  starts, each writer holds its parts in its own memory (a rollout worker produces its
  trajectories in its process: taking them out of Ray's object store is not an add, and
  costs each side differently), and each round starts from a fresh buffer, built untimed and
  answering (``len``): actors start asynchronously, and the process start and imports of a
  new actor (torch's, masreplay's) are not adds. Before the clock starts too, each side's
  fresh buffer takes one warm-up part of 64 other trajectories from the driver (the first
  call of a new actor process pays one-time costs, 8-10 ms of CPU per masreplay shard for its
  first two adds, measured: imports, codecs, thread pools), as a long-lived buffer has.
  A second group sends 4 parts (256 trajectories) per call on both sides: the writer with
  ``flush_traces=256``, TorchRL extending with the 4 parts concatenated (``torch.cat``).
* **Trainer-side sample(256)**: the same buffers, filled; masreplay returns flat tokens and
  offsets (``sample(256, columns=["tokens"]).flat("tokens")``: the shards send the tokens
  of the drawn traces with the draws), TorchRL its padded TensorDict.
* **Staleness**: GraphBuffer of 10^6 traces (5-10 events), policy versions in order (1,000
  traces per version); sample(256) + flat tokens with ``max_staleness`` (the newest 10%
  eligible) against without. Goal: within 1.2x.

Needs ray (``masreplay[ray]``); the TorchRL side needs torch, torchrl and tensordict
(benches/requirements-anchors.txt) and is skipped without them, the summary naming the
package. Nothing is asserted on times.
"""

from __future__ import annotations

import importlib.util
from functools import partial
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

import buffer_anchors as ba
import masreplay
from masreplay.vocabulary import SAMPLERS

ray = pytest.importorskip("ray", reason="the Ray buffer benchmarks need ray (pip install masreplay[ray])")

WRITERS, PARTS, PART = 4, 8, 64
#: Trajectories per call in the batched group (both sides): 4 parts.
BATCHED = 256
LENGTHS = (10, 200)
BATCH = 256
STALE_TRACES = 10**6
PER_VERSION = 1000


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def work(dataset_type):
    n = WRITERS * PARTS * PART
    # The last part's trajectories are the warm-up part (see module docs).
    workload = ba.token_workload(n + PART, LENGTHS, seed=21, group_size=8)
    events = int(workload.offsets[-1])
    adds = {
        PART: f"ray: {WRITERS} writer tasks add {n:,} trajectories ({LENGTHS[0]}-{LENGTHS[1]} tokens) in parts of {PART}",
        BATCHED: f"ray: {WRITERS} writer tasks add {n:,} trajectories in parts of {PART}, {BATCHED} per call",
    }
    goals = {PART: "goal: >= 2x the anchor", BATCHED: "record (both sides batched alike)"}
    data = {size: dataset_type(name, None, n, events, 0, goals[size], suite="ray buffer") for size, name in adds.items()}
    sample = dataset_type(
        f"ray: trainer-side sample({BATCH}) from {n:,} trajectories",
        None,
        BATCH,
        int(BATCH * sum(LENGTHS) / 2),
        0,
        "goal: <= the anchor",
        suite="ray buffer",
    )
    return workload, data, sample


def _writer_parts(make) -> list[list]:
    """Each writer's parts, already in Ray's object store."""
    per_writer = PARTS * PART
    return [[ray.put(make(first)) for first in range(w * per_writer, (w + 1) * per_writer, PART)] for w in range(WRITERS)]


@ray.remote(num_cpus=0)
class _Writer:
    """A rollout worker: a process that lives across rounds (a task's worker process may be
    recycled between rounds, and its start and imports are not adds)."""

    def hold(self, parts: list) -> int:
        """Takes this writer's parts out of the object store into its memory (untimed)."""
        self.parts = ray.get(parts)
        return len(self.parts)

    def masreplay(self, buffer, per_call: int) -> int:
        assert per_call == PART
        return sum(buffer.add(part) for part in self.parts)

    def masreplay_writer(self, buffer, per_call: int) -> int:
        # flush_traces=PART: each part is sent as it comes, as the anchor's extend sends it.
        with buffer.writer(flush_traces=per_call) as writer:
            for part in self.parts:
                writer.add(part)
        return writer.added

    def torchrl(self, buffer, per_call: int) -> int:
        import torch

        held = []
        for part in self.parts:
            held.append(part)
            if len(held) * PART >= per_call:
                buffer.extend(held[0] if len(held) == 1 else torch.cat(held))
                held = []
        return len(self.parts)


@pytest.fixture(scope="module")
def writers():
    started = [_Writer.remote() for _ in range(WRITERS)]
    yield started
    for writer in started:
        ray.kill(writer)


@pytest.fixture(scope="module")
def sides(work, missing_anchor):
    """Per side: how to build an empty buffer, its writer task, the writers' parts, and how
    the trainer draws a batch from it."""
    from masreplay.ray import RayGraphBuffer

    workload = work[0]
    table = ba.minimal_table(workload)
    masreplay_side = SimpleNamespace(
        label="masreplay (RayGraphBuffer, 2 shards, Arrow parts): add",
        build=lambda: RayGraphBuffer(workload.n, shards=2, seed=1),
        writer="masreplay",
        handle=lambda buffer: buffer,
        parts=_writer_parts(lambda first: table.take(pa.array(np.arange(first, first + PART)))),
        warm_up=lambda buffer: buffer.add(table.slice(workload.n - PART)),
        draw=lambda buffer: buffer.sample(BATCH, columns=["tokens"]).flat("tokens"),
    )
    writer_label = "masreplay (RayGraphBuffer, 2 shards, Arrow parts): BufferWriter"
    built = {
        "masreplay": masreplay_side,
        "masreplay writer": SimpleNamespace(**{**vars(masreplay_side), "label": writer_label, "writer": "masreplay_writer"}),
    }
    missing = [p for p in ("torch", "torchrl", "tensordict") if importlib.util.find_spec(p) is None]
    for package in missing:
        missing_anchor(package, "TorchRL RayReplayBuffer anchor of benches/test_ray_buffer.py")
    if not missing:
        built["torchrl"] = _torchrl_side(workload)
    return built


def _torchrl_side(workload) -> SimpleNamespace:
    torch = ba.torch_setup()
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, RayReplayBuffer

    padded = np.zeros((workload.n, LENGTHS[1]), dtype=np.int32)
    rows = np.repeat(np.arange(workload.n), workload.lengths)
    positions = np.arange(int(workload.offsets[-1])) - np.repeat(workload.offsets[:-1], workload.lengths)
    padded[rows, positions] = workload.values
    items = TensorDict(
        {
            "tokens": torch.from_numpy(padded),
            "length": torch.from_numpy(workload.lengths),
            "reward": torch.from_numpy(workload.rewards),
        },
        batch_size=[workload.n],
    )
    return SimpleNamespace(
        label=f"TorchRL RayReplayBuffer (1 actor, LazyTensorStorage padded to {LENGTHS[1]})",
        build=lambda: RayReplayBuffer(
            storage=partial(LazyTensorStorage, workload.n), batch_size=BATCH, remote_config={"num_cpus": 0}
        ),
        writer="torchrl",
        # The buffer object itself does not pickle; TorchRL hands writers a client.
        handle=lambda buffer: buffer.client(),
        parts=_writer_parts(lambda first: items[first : first + PART].clone()),
        warm_up=lambda buffer: buffer.extend(items[workload.n - PART :].clone()),
        draw=lambda buffer: buffer.sample(),
    )


def _side(sides, name: str) -> SimpleNamespace:
    if name not in sides:
        pytest.skip("torch, torchrl or tensordict is not installed (benches/requirements-anchors.txt)")
    return sides[name]


def _hold(side, writers) -> None:
    """Each writer takes its parts into its memory (before the clock starts)."""
    ray.get([w.hold.remote(parts) for w, parts in zip(writers, side.parts, strict=True)])


def _fill(side, buffer, writers, per_call: int = PART) -> None:
    """The timed part: every writer adds the parts it holds."""
    handle = side.handle(buffer)
    ray.get([getattr(w, side.writer).remote(handle, per_call) for w in writers])


@pytest.mark.parametrize(
    ("name", "per_call"),
    [("masreplay", PART), ("masreplay writer", PART), ("torchrl", PART), ("masreplay writer", BATCHED), ("torchrl", BATCHED)],
)
def test_ray_adds(name, per_call, sides, work, writers, measure):
    """Launch the 4 writers until all are done, on a fresh buffer each round."""
    side = _side(sides, name)
    state = {}

    def setup():
        if "buffer" in state:
            state.pop("buffer").shutdown()
        state["buffer"] = side.build()
        assert len(state["buffer"]) == 0  # every actor is up
        side.warm_up(state["buffer"])
        _hold(side, writers)
        return (), {}

    measure(
        lambda: _fill(side, state["buffer"], writers, per_call),
        data=work[1][per_call],
        side=side.label,
        rounds=5,
        unit="traces/s",
        setup=setup,
        ours=name == "masreplay writer",
    )
    assert len(state["buffer"]) == work[0].n
    state.pop("buffer").shutdown()


@pytest.mark.parametrize("name", ["masreplay", "torchrl"])
def test_ray_sample(name, sides, work, writers, measure):
    workload = work[0]
    side = _side(sides, name)
    buffer = side.build()
    _hold(side, writers)
    _fill(side, buffer, writers)
    if name == "masreplay":
        drawn = buffer.sample(BATCH, seed=3, columns=["tokens"])
        tokens, offsets = drawn.flat("tokens")
        index = ba.trace_indices(drawn.trace_ids)
        assert np.array_equal(np.diff(offsets), workload.lengths[index])
        assert np.array_equal(tokens[: offsets[1]], workload.trajectory(int(index[0])))
    else:
        drawn = side.draw(buffer)
        assert drawn["tokens"].shape == (BATCH, LENGTHS[1]) and int(drawn["length"].min()) >= LENGTHS[0]
    label = "masreplay" if name == "masreplay" else "TorchRL RayReplayBuffer.sample (padded TensorDict)"
    measure(lambda: side.draw(buffer), data=work[2], side=label, rounds=100, unit="ms")
    buffer.shutdown()


# ---- staleness-bounded sampling on 10^6 traces ---------------------------------------------------


@pytest.fixture(scope="module")
def versioned(dataset_type):
    workload = ba.token_workload(STALE_TRACES, (5, 10), seed=31, group_size=8)
    table = ba.minimal_table(workload)
    versions = pa.array(np.arange(STALE_TRACES, dtype=np.int64) // PER_VERSION)
    table = table.append_column("policy_version", versions)
    buffer = masreplay.GraphBuffer(STALE_TRACES, seed=32)
    buffer.add(table)
    newest = STALE_TRACES // PER_VERSION - 1
    buffer.advance(newest)
    staleness = newest // 10
    # One summary group per sampler: each bounded line is compared with its unbounded one.
    data = {
        sampler: dataset_type(
            f"staleness: sample({BATCH}, {sampler}) + flat tokens from 10^6 traces, newest 10% eligible",
            None,
            BATCH,
            int(BATCH * 7.5),
            0,
            "goal: bounded within 1.2x of unbounded",
            suite="ray buffer",
        )
        for sampler in SAMPLERS
    }
    return buffer, staleness, data


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("bounded", [False, True], ids=["unbounded", "bounded"])
def test_staleness_bounded_sampling(versioned, sampler, bounded, measure):
    buffer, staleness, data = versioned
    limit = staleness if bounded else None
    drawn = buffer.sample(BATCH, sampler=sampler, max_staleness=limit, seed=1)
    if bounded:
        oldest = buffer.policy_version - staleness
        assert min(drawn.to_arrow()["policy_version"].to_pylist()) >= oldest
    side = "masreplay" if not bounded else f"masreplay, max_staleness={staleness}"
    measure(
        lambda: buffer.sample(BATCH, sampler=sampler, max_staleness=limit).flat("tokens"),
        data=data[sampler],
        side=side,
        rounds=200,
        unit="ms",
        ours=not bounded,
    )
