"""What every recipe reads from a batch, as flat numpy columns aligned with ``batch.events()``,
and the grouped statistics and loss weights the recipes share.

Conventions of all recipes:

- an event's *owner* is its agent, except that a tool result belongs to the agent whose call
  it answers (as in :func:`masreplay.trace_players`);
- *acting* events are the policy's outputs: every type but ``tool_result``,
  ``human_intervention`` and ``safety_event``, which are observations: they get advantage 0
  and loss weight 0;
- an owner's *turn* is the rank of its acting event among its acting events in time order;
- the GRPO group of a trace is its ``group_id``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cached_property
from itertools import pairwise
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from masreplay import _core
from masreplay._args import unsummable
from masreplay.advantages import Advantages, _group_keys, event_rewards
from masreplay.batch import EVENT_FIELDS, TraceBatch
from masreplay.errors import InvalidArgumentError
from masreplay.io import as_batch

OBSERVATIONS = ("tool_result", "human_intervention", "safety_event")


class Events:
    """Lazily computed per-event and per-trace columns of one batch."""

    def __init__(self, batch: Any) -> None:
        self.batch: TraceBatch = as_batch(batch)
        self.offsets = np.asarray(self.batch.event_offsets, dtype=np.int64)
        self.n_traces = len(self.batch)
        self.n_events = int(self.offsets[-1])

    # ---- positions ------------------------------------------------------------------------
    @cached_property
    def trace(self) -> np.ndarray:
        """The trace of each event."""
        return np.repeat(np.arange(self.n_traces, dtype=np.int64), np.diff(self.offsets))

    @cached_property
    def trace_group(self) -> np.ndarray:
        """Each trace's group (dense codes of ``group_id``)."""
        return _group_keys(self.batch, "group_id")[1]

    @cached_property
    def group(self) -> np.ndarray:
        return self.trace_group[self.trace]

    @cached_property
    def time_order(self) -> np.ndarray:
        """Event positions sorted by (trace, t), ties in stored order."""
        t = self.batch.flat("t")[0]
        later = np.diff(t) >= 0
        if np.all(later | (np.diff(self.trace) != 0)):  # stored in time order already
            return np.arange(self.n_events)
        return np.lexsort((np.arange(self.n_events), t, self.trace))

    # ---- who ---------------------------------------------------------------------------------
    @cached_property
    def _agent_dictionary(self) -> pa.DictionaryArray:
        return self.batch._event_array("agent")

    @cached_property
    def agent_names(self) -> pa.Array:
        return self._agent_dictionary.dictionary

    @cached_property
    def _players(self) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray]:
        return _core.trace_players(self.batch._core, "agent")

    @cached_property
    def owner(self) -> np.ndarray:
        """Each event's owner as a batch-wide agent code (tool results: the calling agent)."""
        codes = self._agent_dictionary.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        player_offsets, labels, _, event_player = self._players
        attributed = event_player >= 0
        if not attributed.any():
            return codes
        label_codes = self.code_of(labels)
        flat = player_offsets[self.trace[attributed]] + event_player[attributed]
        owners = codes.copy()
        owners[attributed] = label_codes[flat]
        return owners

    @cached_property
    def root(self) -> np.ndarray:
        """True at events whose owner is a root of the spawn tree (the orchestrator)."""
        player_offsets, _, parents, event_player = self._players
        flat = player_offsets[self.trace] + np.maximum(event_player, 0)
        return (event_player >= 0) & (np.asarray(parents)[flat] < 0)

    def code_of(self, names: Sequence[str] | pa.Array) -> np.ndarray:
        """Agent codes of names (-1 for a name no event of the batch has as its agent)."""
        found = pc.index_in(pa.array(names, pa.string()), value_set=self.agent_names.cast(pa.string()))
        return found.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)

    def of_type(self, *types: str) -> np.ndarray:
        """True at events of any of ``types`` (read on the dictionary codes, no strings)."""
        column = self.batch._event_array("type")
        wanted = pc.is_in(column.dictionary, value_set=pa.array(types)).to_numpy(zero_copy_only=False)
        return wanted[column.indices.to_numpy(zero_copy_only=False)]

    @cached_property
    def acting(self) -> np.ndarray:
        return ~self.of_type(*OBSERVATIONS)

    @cached_property
    def turn(self) -> np.ndarray:
        """Each acting event's rank among its owner's acting events of the trace in time order
        (-1 at observations)."""
        order = self.time_order[self.acting[self.time_order]]
        key = self.trace[order] * (int(self.owner.max(initial=0)) + 1) + self.owner[order]
        by_key = np.argsort(key, kind="stable")
        sorted_key = key[by_key]
        starts = np.r_[True, sorted_key[1:] != sorted_key[:-1]]
        first = np.maximum.accumulate(np.where(starts, np.arange(len(by_key)), 0))
        turns = np.full(self.n_events, -1, dtype=np.int64)
        turns[order[by_key]] = np.arange(len(by_key)) - first
        return turns

    # ---- how much -------------------------------------------------------------------------
    @cached_property
    def tokens(self) -> np.ndarray:
        """Tokens of each event; events without a count weigh as one token."""
        values = pa.array(self.batch._source.event_field("tokens")).fill_null(1)
        return values.to_numpy(zero_copy_only=False).astype(np.float64)

    def trace_reward(self, channel: str, fill: float | None = None) -> np.ndarray:
        values = _core.trace_channel(self.batch._core, channel)
        missing = np.isnan(values)
        if missing.any():
            if fill is None:
                first = self.batch.trace_ids[int(np.flatnonzero(missing)[0])]
                raise InvalidArgumentError(f"trace {first!r} has no reward channel {channel!r}")
            if missing.all():
                self._require_carried(channel)
            values = np.where(missing, fill, values)
        return values

    def event_reward(self, channel: str, fill: float = 0.0, *, optional: bool = False) -> np.ndarray:
        """The per-event channel, ``fill`` where an event lacks it; unless ``optional`` (a side
        input that may be absent, such as a format or tool reward), the channel must be
        carried somewhere in the batch."""
        values = event_rewards(self.batch, channel, fill=np.nan)
        missing = np.isnan(values)
        if missing.all() and not optional:
            self._require_carried(channel)
        return np.where(missing, fill, values) if missing.any() else values

    def _require_carried(self, channel: str) -> None:
        """A reward channel that no trace and no event of the batch carries is a misspelt
        name: refused, where reading it as ``fill`` everywhere would train on zeros."""
        if self.n_traces == 0:
            return
        on_traces = not np.isnan(_core.trace_channel(self.batch._core, channel)).all()
        on_events = pc.any(pc.is_valid(pc.map_lookup(pa.array(self.batch._source.event_field("reward")), channel, "first")))
        if not (on_traces or on_events.as_py()):
            raise InvalidArgumentError(f"no reward channel {channel!r}: no trace or event of the batch carries it")

    def column(self, name: str, values: Any) -> np.ndarray:
        """A numeric per-event input as float64 (nulls NaN): an array aligned with
        ``batch.events()``, the name of an event column, or a key of the events' attributes."""
        array = self._input(name, values)
        if not (pa.types.is_floating(array.type) or pa.types.is_integer(array.type) or pa.types.is_boolean(array.type)):
            raise InvalidArgumentError(f"{name} must be numeric, got {array.type}")
        return array.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)

    def amounts(self, name: str, values: Any, needed: np.ndarray | None = None) -> np.ndarray:
        """:meth:`column` for numbers the recipe sums (values, Q values, marginals, process
        rewards): finite and of magnitude below 2^49, as the README bounds every summed input,
        or NaN where an event has none; none is missing at the events ``needed`` (a mask or
        rows), which the recipe reads."""
        array = self.column(name, values)
        beyond = unsummable(array)
        if needed is not None:
            beyond[needed] |= np.isnan(array[needed])
        if beyond.any():
            first = int(np.argmax(beyond))
            raise InvalidArgumentError(
                f"{name}[{first}] is {array[first]:g}: summed inputs must be finite and of magnitude below 2^49 "
                f"(NaN marks an event without one{', which this recipe reads' if needed is not None else ''})"
            )
        return array

    def labels(self, name: str, values: Any) -> np.ndarray:
        """A per-event label input (any values; same sources as :meth:`column`) as int codes,
        equal labels equal codes, -1 where an event has none (None or NaN)."""
        array = self._input(name, values)
        encoded = array if pa.types.is_dictionary(array.type) else pc.dictionary_encode(array)
        return encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)

    def _input(self, name: str, values: Any) -> pa.Array:
        if isinstance(values, str):
            if values in EVENT_FIELDS:
                return pa.array(self.batch._source.event_field(values))
            return self._attribute(values)
        array = np.asarray(values)
        if array.shape != (self.n_events,):
            raise InvalidArgumentError(f"{name} must have one value per event ({self.n_events}), got shape {array.shape}")
        try:
            return pa.array(array, from_pandas=True)  # NaN counts as missing
        except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
            raise InvalidArgumentError(f"{name}: the values must share one type: {error}") from None

    def _attribute(self, key: str) -> pa.Array:
        """The events' attribute ``key``: only the events whose attributes name it are parsed."""
        attributes = self.batch._event_array("attributes")
        named = pc.fill_null(pc.match_substring(attributes, json.dumps(key)), False).to_numpy(zero_copy_only=False)
        values: list[Any] = [None] * self.n_events
        for row in np.flatnonzero(named):
            values[row] = json.loads(attributes[int(row)].as_py()).get(key)
        try:
            return pa.array(values, from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
            raise InvalidArgumentError(f"attribute {key!r}: the values must share one type: {error}") from None


# ---- grouped statistics ------------------------------------------------------------------------


def dense(*keys: np.ndarray) -> np.ndarray:
    """One dense code per distinct tuple of the non-negative integer key arrays (codes in
    the tuples' sorted order)."""
    combined = np.zeros(len(keys[0]), dtype=np.int64)
    span = 1
    for key in keys:
        key = np.asarray(key, dtype=np.int64)
        if len(key) and key.min() < 0:
            key = key - key.min()
        width = int(key.max(initial=0)) + 1
        if span * width >= 2**62:  # compress first so the product cannot overflow
            combined, span = _compress(combined, span)
        combined = combined * width + key
        span *= width
    return _compress(combined, span)[0]


def _compress(codes: np.ndarray, span: int) -> tuple[np.ndarray, int]:
    """Codes renumbered 0..k-1 in order: a table lookup when the range is small, else a sort."""
    if span <= max(4 * len(codes), 1 << 16):
        present = np.zeros(span, dtype=np.int64)
        present[codes] = 1
        remap = np.cumsum(present) - 1
        return remap[codes], int(remap[-1]) + 1 if span else 0
    unique, inverse = np.unique(codes, return_inverse=True)
    return inverse.ravel().astype(np.int64), len(unique)


def first_rows(codes: np.ndarray) -> np.ndarray:
    """The first row of each dense code (0..k-1)."""
    first = np.empty(int(codes.max(initial=-1)) + 1, dtype=np.int64)
    first[codes[::-1]] = np.arange(len(codes) - 1, -1, -1)  # the earliest write lands last
    return first


def cell_stats(values: np.ndarray, cells: np.ndarray, ddof: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-row count, mean and std of the row's cell (``ddof=1``: torch's unbiased std; NaN
    where a cell is too small)."""
    n = np.bincount(cells).astype(np.float64)
    mean = np.bincount(cells, weights=values) / np.maximum(n, 1)
    centered = values - mean[cells]
    with np.errstate(invalid="ignore", divide="ignore"):
        std = np.sqrt(np.bincount(cells, weights=centered * centered) / (n - ddof))
    return n[cells], mean[cells], std[cells]


def grpo(
    values: np.ndarray,
    cells: np.ndarray,
    *,
    eps: float = 1e-6,
    ddof: int = 1,
    scale: bool = True,
    singleton: str = "zero",
) -> np.ndarray:
    """``(r - mean) / (std + eps)`` per cell (``scale=False``: ``r - mean``). A cell of one
    gets 0 (``singleton="zero"``) or verl's mean 0, std 1: ``r / (1 + eps)`` (``"verl"``)."""
    if len(values) == 0:
        return np.zeros(0)
    n, mean, std = cell_stats(values, cells, ddof)
    if scale:
        spread = np.nan_to_num(std) + eps
        out = np.divide(values - mean, spread, out=np.zeros(len(values)), where=spread > 0)
    else:
        out = values - mean
    lone = n < 2
    if singleton == "verl":
        out[lone] = values[lone] / (1.0 + eps) if scale else values[lone]
    else:
        out[lone] = 0.0
    return out


def whiten(values: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """verl's ``masked_whiten`` over all rows: ``(x - mean) / sqrt(var + eps)``, unbiased var."""
    if len(values) < 2:
        return np.zeros_like(values)
    return (values - values.mean()) / np.sqrt(values.var(ddof=1) + eps)


def reverse_discounted(values: np.ndarray, sequence: np.ndarray, gamma: float) -> np.ndarray:
    """``G_k = sum_j gamma^j x_{k+j}`` within each sequence; rows of a sequence are contiguous
    and in order. One vectorised step per position from the end."""
    n = len(values)
    if n == 0:
        return np.zeros(0)
    starts = np.r_[0, np.flatnonzero(sequence[1:] != sequence[:-1]) + 1]
    lengths = np.diff(np.r_[starts, n])
    position = np.arange(n) - np.repeat(starts, lengths)
    from_end = np.repeat(lengths, lengths) - 1 - position
    out = values.astype(np.float64).copy()
    for step in range(1, int(lengths.max())):
        rows = np.flatnonzero(from_end == step)
        out[rows] += gamma * out[rows + 1]
    return out


# ---- loss weights -----------------------------------------------------------------------------


def nested_weights(events: Events, mask: np.ndarray, levels: Sequence[np.ndarray], by_tokens: bool = True) -> np.ndarray:
    """Loss weights of the masked events, each group summing to 1: the group's weight is
    split equally among the distinct units of ``levels[0]`` in it, each of those equally among
    its units of ``levels[1]``, and so on; the finest unit's weight goes to its events in
    proportion to their tokens (``by_tokens``) or equally."""
    weights = np.zeros(events.n_events)
    rows = np.flatnonzero(mask)
    if len(rows) == 0:
        return weights
    chain = [events.group[rows]] + [np.asarray(level)[rows] for level in levels]
    codes = [dense(*chain[: depth + 1]) for depth in range(len(chain))]
    share = events.tokens[rows] if by_tokens else np.ones(len(rows))
    w = share / np.bincount(codes[-1], weights=share)[codes[-1]]
    for parent, child in pairwise(codes):
        # child codes refine parent codes: the first row of each child names its parent
        w /= np.bincount(parent[first_rows(child)], minlength=parent.max() + 1)[parent]
    weights[rows] = w
    return weights


# ---- the result --------------------------------------------------------------------------------


def result(events: Events, name: str, per_event: np.ndarray, weights: np.ndarray, unit: Sequence[str] = ()) -> Advantages:
    """The recipe's :class:`Advantages`: ``per_trace`` is the mean of the trace's trained
    events (weight > 0), 0 for a trace with none."""
    per_event = np.asarray(per_event, dtype=np.float64)
    trained = weights > 0
    totals = np.bincount(events.trace[trained], weights=per_event[trained], minlength=events.n_traces)
    counts = np.bincount(events.trace[trained], minlength=events.n_traces)
    per_trace = np.divide(totals, counts, out=np.zeros(events.n_traces), where=counts > 0)
    return Advantages(
        per_trace=per_trace,
        per_event=per_event,
        weights=np.asarray(weights, dtype=np.float64),
        trace_index=events.trace,
        group_index=events.trace_group,
        estimator=name,
        normalize_by=tuple(unit),
    )
