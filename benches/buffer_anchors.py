"""Workloads and anchors of the replay-buffer benchmarks (test_buffer.py).

* :func:`token_workload` is the workload of ``shared/anchors/replay.md``: trajectories of int32
  tokens with lengths uniform in a range, plus a float reward each.
* :func:`minimal_table` writes the same trajectories as masreplay traces in the canonical Arrow
  layout: trajectory i becomes a trace of ``lengths[i]`` events (one event per token; the token
  is kept in the event's ``tokens`` field), no edges, the reward as the ``team`` reward, and a
  ``group_id`` shared by consecutive runs of ``group_size`` traces.
* :class:`NumpyFlat` is the layout by hand: one flat values array and int64 offsets (the Arrow
  layout without Arrow), gathered with ``np.concatenate`` of slices.
* :mod:`torchrl` anchors are built by the functions ``torchrl_*``; they import torch lazily so
  this module imports without it (the ingest suite runs without torch).
* :func:`raw_bytes` counts the bytes a column's content needs: values and offsets of the
  non-null entries, without validity bitmaps, padding or the placeholders of null entries.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# ---- the token workload of replay.md ---------------------------------------------------------


@dataclass
class TokenWorkload:
    lengths: np.ndarray  # int64, events (tokens) per trajectory
    offsets: np.ndarray  # int64, n+1
    values: np.ndarray  # int32 tokens, all trajectories back to back
    rewards: np.ndarray  # float32, one per trajectory
    group_size: int

    @property
    def n(self) -> int:
        return len(self.lengths)

    def trajectory(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def arrays(self) -> list[np.ndarray]:
        """One int32 array per trajectory (views into ``values``): what a rollout worker hands over."""
        return [self.trajectory(i) for i in range(self.n)]


def token_workload(n: int, lengths: tuple[int, int], *, seed: int, group_size: int = 8) -> TokenWorkload:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(lengths[0], lengths[1] + 1, n).astype(np.int64)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    values = rng.integers(0, 150_000, int(offsets[-1]), dtype=np.int32)
    rewards = rng.random(n, dtype=np.float32)
    return TokenWorkload(sizes, offsets, values, rewards, group_size)


def _prefixed(prefix: str, numbers: np.ndarray) -> pa.Array:
    return pc.binary_join_element_wise(prefix, pc.cast(pa.array(numbers), pa.string()), "")


def minimal_table(work: TokenWorkload, *, prefix: str = "t") -> pa.Table:
    """The workload as masreplay traces: trace ``{prefix}{i}`` holds trajectory i (see module
    docs). Only required columns and ``tokens`` are given; masreplay fills the optional ones
    with nulls and computes the derived columns."""
    n, total = work.n, int(work.offsets[-1])
    local = np.arange(total, dtype=np.int64) - np.repeat(work.offsets[:-1], work.lengths)
    id_pool = _prefixed("e", np.arange(int(work.lengths.max(initial=1)), dtype=np.int64))
    events = pa.StructArray.from_arrays(
        [
            id_pool.take(pa.array(local)),
            pa.array(local.astype(np.float64)),
            pa.DictionaryArray.from_arrays(pa.array(np.zeros(total, np.int8)), pa.array(["message"])),
            pa.DictionaryArray.from_arrays(pa.array(np.zeros(total, np.int32)), pa.array(["policy"])),
            pa.array(work.values.astype(np.int64)),
        ],
        ["id", "t", "type", "agent", "tokens"],
    )
    no_edges = pa.StructArray.from_arrays(
        [
            pa.array([], pa.int32()),
            pa.array([], pa.int32()),
            pa.DictionaryArray.from_arrays(pa.array([], pa.int8()), pa.array(["temporal"])),
        ],
        ["src", "dst", "type"],
    )
    groups = _prefixed(f"{prefix}g", np.arange(n, dtype=np.int64) // work.group_size)
    return pa.table(
        {
            "trace_id": _prefixed(prefix, np.arange(n, dtype=np.int64)),
            "task_id": groups,
            "group_id": groups,
            "events": pa.ListArray.from_arrays(pa.array(work.offsets.astype(np.int32)), events),
            "edges": pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), no_edges),
            "rewards": pa.MapArray.from_arrays(
                pa.array(np.arange(n + 1, dtype=np.int32)),
                pa.array(np.full(n, "team", dtype=object), pa.string()),
                pa.array(work.rewards.astype(np.float64)),
            ),
            "costs": pa.StructArray.from_arrays([pa.array(np.zeros(n)), pa.array(np.zeros(n))], ["tokens", "wall_clock_s"]),
        }
    )


def trace_indices(trace_ids: list[str], prefix: str = "t") -> np.ndarray:
    """Trajectory numbers of the traces named ``{prefix}{i}``."""
    start = len(prefix)
    return np.fromiter((int(t[start:]) for t in trace_ids), dtype=np.int64, count=len(trace_ids))


# ---- the layout by hand ----------------------------------------------------------------------


# Mean events per trace below which a vectorised gather beats slicing trace by trace (measured
# on this machine, 256 traces: of ~37 events the index takes 16 us, the slices 49 us; of ~1,000,
# 291 against 93 us; even at ~150).
SHORT_TRACES = 128


class NumpyFlat:
    """Values + offsets in numpy: the Arrow layout written by hand (replay.md's anchor)."""

    def __init__(self, arrays: list[np.ndarray], seed: int = 0) -> None:
        self.values = np.concatenate(arrays)
        self.offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
        np.cumsum([len(a) for a in arrays], out=self.offsets[1:])
        self.rng = np.random.default_rng(seed)

    @classmethod
    def from_flat(cls, values: np.ndarray, offsets: np.ndarray, seed: int = 0) -> NumpyFlat:
        flat = cls.__new__(cls)
        flat.values, flat.offsets, flat.rng = values, offsets.astype(np.int64), np.random.default_rng(seed)
        return flat

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def gather(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The picked traces' values and offsets, the faster of two ways for the trace length
        (the strongest anchor, as issue 18 asks): short traces by one vectorised index (a
        Python loop would cost more than the copy), long ones slice by slice (an index array
        would cost more than the slices)."""
        starts, ends = self.offsets[index], self.offsets[index + 1]
        lengths = ends - starts
        offsets = np.zeros(len(index) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if offsets[-1] < SHORT_TRACES * len(index):
            values = self.values[np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])]
        else:
            values = np.concatenate([self.values[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)])
        return values, offsets

    def sample(self, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        return self.gather(self.rng.integers(0, len(self), batch_size))

    def sample_padded(self, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """(batch, max length) values padded with 0, and the lengths."""
        index = self.rng.integers(0, len(self), batch_size)
        starts, ends = self.offsets[index], self.offsets[index + 1]
        lengths = ends - starts
        out = np.zeros((batch_size, int(lengths.max())), dtype=self.values.dtype)
        for row, (a, b) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
            out[row, : b - a] = self.values[a:b]
        return out, lengths

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + self.offsets.nbytes


# ---- TorchRL (imported lazily) ---------------------------------------------------------------


def torch_setup():
    """Imports torch with one thread, as replay.md measured it."""
    import torch

    torch.set_num_threads(1)
    return torch


def torchrl_list(work: TokenWorkload, tensors: list, *, sampler=None):
    """ReplayBuffer(ListStorage) of dicts {tokens, reward}; sampling returns the list of dicts
    (``collate_fn`` is the identity: the default one stacks, which ragged tensors cannot)."""
    torch_setup()
    from torchrl.data import ListStorage, ReplayBuffer

    items = [{"tokens": t, "reward": float(r)} for t, r in zip(tensors, work.rewards.tolist(), strict=True)]

    def build():
        kwargs = {} if sampler is None else {"sampler": sampler()}
        return ReplayBuffer(storage=ListStorage(work.n), batch_size=256, collate_fn=lambda x: x, **kwargs)

    return build, items


def torchrl_lazy_stack(work: TokenWorkload, tensors: list, *, sampler=None, group_key: str | None = None):
    """ReplayBuffer(LazyStackStorage) of one TensorDict per trajectory (ragged tokens)."""
    torch = torch_setup()
    from tensordict import LazyStackedTensorDict, TensorDict
    from torchrl.data import LazyStackStorage, ReplayBuffer

    rewards = torch.from_numpy(work.rewards)
    prompts = torch.arange(work.n) // work.group_size
    tds = []
    for i, t in enumerate(tensors):
        fields = {"tokens": t, "reward": rewards[i]}
        if group_key is not None:
            fields[group_key] = prompts[i]
        tds.append(TensorDict(fields, batch_size=[]))
    items = LazyStackedTensorDict(*tds)

    def build():
        kwargs = {} if sampler is None else {"sampler": sampler()}
        return ReplayBuffer(storage=LazyStackStorage(work.n), batch_size=256, **kwargs)

    return build, items


def torchrl_padded(work: TokenWorkload, pad_to: int, *, sampler=None, group_key: str | None = None):
    """ReplayBuffer(LazyTensorStorage) of tokens padded to ``pad_to``, with the lengths."""
    torch = torch_setup()
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    padded = np.zeros((work.n, pad_to), dtype=np.int32)
    rows = np.repeat(np.arange(work.n), work.lengths)
    positions = np.arange(int(work.offsets[-1])) - np.repeat(work.offsets[:-1], work.lengths)
    padded[rows, positions] = work.values
    fields = {
        "tokens": torch.from_numpy(padded),
        "length": torch.from_numpy(work.lengths),
        "reward": torch.from_numpy(work.rewards),
    }
    if group_key is not None:
        fields[group_key] = torch.arange(work.n) // work.group_size
    items = TensorDict(fields, batch_size=[work.n])

    def build():
        kwargs = {} if sampler is None else {"sampler": sampler()}
        return ReplayBuffer(storage=LazyTensorStorage(work.n), batch_size=256, **kwargs)

    return build, items


def tensordict_bytes(td) -> int:
    return sum(t.numel() * t.element_size() for t in td.values(include_nested=True, leaves_only=True))


# ---- pyarrow anchors on the canonical table (the multi-agent workload) ------------------------


def pyarrow_take_flat(table: pa.Table, index: np.ndarray, column: str = "tokens") -> tuple[np.ndarray, np.ndarray]:
    """``Table.take`` of whole trace rows, then one event column flat plus the event offsets:
    the same output as ``GraphBuffer.sample`` + ``event_offsets`` + ``events()[column]``."""
    taken = table.take(pa.array(index)).column("events").combine_chunks()
    offsets = taken.offsets.to_numpy()
    flat = taken.values.field(column).slice(offsets[0], offsets[-1] - offsets[0])
    return flat.to_numpy(zero_copy_only=False), (offsets - offsets[0]).astype(np.int64)


class PyarrowGroups:
    """GRPO groups by hand: group_id dictionary-encoded once, members listed per group; a
    draw picks ``num_groups`` distinct groups with at least ``group_size`` members, then
    ``group_size`` members of each without replacement (the semantics of ``sample_groups``)."""

    def __init__(self, table: pa.Table, seed: int = 0) -> None:
        codes = pc.dictionary_encode(table.column("group_id").combine_chunks()).indices.to_numpy()
        order = np.argsort(codes, kind="stable")
        self.sizes = np.bincount(codes)
        # Members as a (groups, largest) matrix padded with -1: one vectorised draw for all.
        starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])
        column = np.arange(len(order)) - np.repeat(starts, self.sizes)
        self.members = np.full((len(self.sizes), int(self.sizes.max(initial=0))), -1, dtype=np.int64)
        self.members[codes[order], column] = order
        self.table = table
        self.rng = np.random.default_rng(seed)

    def draw(self, num_groups: int, group_size: int) -> np.ndarray:
        """Groups without replacement, then members without replacement within each, both
        vectorised: each chosen group's first ``group_size`` members under random keys."""
        eligible = np.flatnonzero(self.sizes >= group_size)
        chosen = self.rng.choice(eligible, num_groups, replace=False)
        members = self.members[chosen]
        keys = self.rng.random(members.shape)
        keys[members < 0] = np.inf
        picked = np.take_along_axis(members, np.argsort(keys, axis=1)[:, :group_size], axis=1)
        return np.sort(picked, axis=1).ravel()


# ---- bytes -----------------------------------------------------------------------------------


def raw_bytes(array: pa.Array | pa.ChunkedArray) -> int:
    """Bytes of a column's content: fixed-width values and var-length offsets and data of the
    non-null entries (booleans at one bit), dictionaries' codes plus their values once; no
    validity bitmaps and nothing for null entries."""
    if isinstance(array, pa.ChunkedArray):
        return sum(raw_bytes(chunk) for chunk in array.chunks)
    kind = array.type
    valid = len(array) - array.null_count
    if pa.types.is_dictionary(kind):
        return valid * kind.index_type.bit_width // 8 + raw_bytes(array.dictionary)
    if pa.types.is_struct(kind):
        return sum(raw_bytes(child) for child in array.flatten())
    if pa.types.is_map(kind):
        offsets = array.offsets.to_numpy()
        keys = array.keys.slice(offsets[0], offsets[-1] - offsets[0])
        items = array.items.slice(offsets[0], offsets[-1] - offsets[0])
        return 4 * valid + raw_bytes(keys) + raw_bytes(items)
    if pa.types.is_list(kind):
        offsets = array.offsets.to_numpy()
        return 4 * valid + raw_bytes(array.values.slice(offsets[0], offsets[-1] - offsets[0]))
    if pa.types.is_string(kind) or pa.types.is_binary(kind):
        lengths = pc.binary_length(array)
        return 4 * valid + (pc.sum(lengths).as_py() or 0)
    if pa.types.is_boolean(kind):
        return (valid + 7) // 8
    if kind.bit_width and kind.bit_width >= 8:
        return valid * kind.bit_width // 8
    raise TypeError(f"no byte count for {kind}")


def table_raw_bytes(table: pa.Table) -> int:
    return sum(raw_bytes(table.column(name)) for name in table.column_names)
