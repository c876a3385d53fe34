"""Advantages for RL on orchestration traces, normalised over the shape of the trace.

:func:`advantages` turns a batch's rewards into per-trace and per-event advantages (and loss
weights) for a trainer; :func:`group_normalize` is the same kernel on plain arrays (one row
per sample, as verl and TRL hold them). :func:`event_rewards`, :func:`graph_returns` and
:func:`graph_gae` turn per-event reward channels into per-event credit over the event graph.
The arithmetic runs in Rust (``masreplay._core``); the formulas are in the README.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from masreplay import _core
from masreplay._args import aligned, checked, numbers, refuse_masked
from masreplay.batch import TraceBatch
from masreplay.errors import InvalidArgumentError
from masreplay.io import as_batch
from masreplay.vocabulary import STRATA, Estimator, ReturnKind, Stratum, Unit

Compat = Literal["verl", "trl", "openrlhf"]
#: What the core returns for a batch: per-trace and per-event advantages, loss weights, and
#: the trace of each event.
Parts = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
CHANNEL_MODES = ("sum_then_normalize", "normalize_then_sum")


@dataclass(frozen=True)
class Advantages:
    """What :func:`advantages` returns.

    - ``per_trace``: one advantage per trace (the mean of its rows' advantages when a trace
      has several: strata, or per-event credit);
    - ``per_event``: one per event, aligned row for row with ``batch.events()``;
    - ``weights``: per-event loss weights (1/traces of the group x 1/strata of the trace x the
      event's share of its stratum, by tokens where recorded); each group's weights sum to 1;
    - ``trace_index``: the trace of each event; ``group_index``: each trace's group, numbered
      0..k-1 in order of first appearance for ``group_id``, ``task_id`` and text labels, in
      ascending order for numeric labels (integer group ids keep their order).
    """

    per_trace: np.ndarray
    per_event: np.ndarray
    weights: np.ndarray
    trace_index: np.ndarray
    group_index: np.ndarray
    estimator: str
    normalize_by: tuple[str, ...]

    def __repr__(self) -> str:
        by = f", normalize_by={list(self.normalize_by)}" if self.normalize_by else ""
        return (
            f"Advantages({self.estimator}{by}: {len(self.per_trace)} traces, {len(self.per_event)} events, "
            f"{self.per_event.dtype})"
        )


def _scale(std: bool | str) -> str:
    if std is True:
        return "group"
    if std is False:
        return "none"
    if std in ("group", "batch", "none"):
        return str(std)
    raise InvalidArgumentError(f"std must be True, False, 'group', 'batch' or 'none', got {std!r}")


def _dtype(dtype: Any) -> np.dtype:
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        raise InvalidArgumentError(f"dtype must be float32 or float64, got {dtype!r}") from None
    if resolved not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise InvalidArgumentError(f"dtype must be float32 or float64, got {dtype!r}")
    return resolved


def _strata(name: str, value: str | Sequence[str] | None) -> list[str]:
    if value is None:
        return []
    names = [value] if isinstance(value, str) else list(value)
    for entry in names:
        if entry not in STRATA:
            raise InvalidArgumentError(f"{name} entries must be among {list(STRATA)}, got {entry!r}")
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"{name} names a stratum twice: {names}")
    return names


def _keys(name: str, values: Any, length: int) -> np.ndarray:
    """Any per-row labels -> int64 keys (integers kept, anything else numbered by value).

    Strings (verl's uids, Arrow columns) are numbered by Arrow's hash-based dictionary
    encoding in order of first appearance: np.unique would sort Python objects (seconds at
    10^6 rows), and first-appearance numbers keep contiguous groups in ascending runs."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return _dictionary_keys(name, values, length)
    refuse_masked(name, values)
    try:
        array = np.asarray(values)
    except ValueError:  # labels that are sequences themselves (tuples): one object each
        array = np.empty(len(values), dtype=object)
        for i, value in enumerate(values):
            array[i] = value
    if array.ndim != 1 or len(array) != length:
        raise InvalidArgumentError(f"{name} must be 1-D with {length} entries, got shape {array.shape}")
    if array.dtype.kind in "iub":
        return aligned(np.ascontiguousarray(array, dtype=np.int64))
    if array.dtype.kind in "OUS":
        try:
            return _dictionary_keys(name, pa.array(array), length)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
            # Mixed or unusual Python objects (ints beyond 64 bits too): number them by
            # value, hashing each once.
            numbers: dict[Any, int] = {}
            try:
                return np.fromiter((numbers.setdefault(v, len(numbers)) for v in array.tolist()), np.int64, length)
            except TypeError as error:  # unhashable labels
                raise InvalidArgumentError(f"{name}: every label must be hashable ({error})") from None
    return np.unique(array, return_inverse=True)[1].astype(np.int64)


def _dictionary_keys(name: str, values: pa.Array | pa.ChunkedArray, length: int) -> np.ndarray:
    if len(values) != length:
        raise InvalidArgumentError(f"{name} must have {length} entries, got {len(values)}")
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()  # one dictionary for every row, not one per chunk
    encoded = pc.dictionary_encode(values, null_encoding="encode")
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)


def _group_keys(batch: TraceBatch, group_by: Any) -> tuple[np.ndarray, np.ndarray]:
    """Each trace's group key (for the core) and its dense group index: the rank of its key."""
    n = len(batch)
    if group_by is None:
        zeros = np.zeros(n, dtype=np.int64)
        return zeros, zeros
    if isinstance(group_by, str):
        if group_by not in ("group_id", "task_id"):
            raise InvalidArgumentError(f"group_by must be 'group_id', 'task_id', None or one label per trace, got {group_by!r}")
        # Numbered in the core where the column is stored; codes 0..k-1, every one used, are
        # their own ranks.
        codes = _core.trace_text_codes(batch._core, group_by)
        return codes, codes
    keys = _keys("group_by", group_by, n)
    return keys, np.unique(keys, return_inverse=True)[1].astype(np.int64) if n else keys


def _channel_weights(channel: str | Mapping[str, float], channels: Mapping[str, float] | None) -> dict[str, float]:
    chosen = channels if channels is not None else channel
    if isinstance(chosen, str):
        return {chosen: 1.0}
    if not isinstance(chosen, Mapping) or not chosen:
        raise InvalidArgumentError(f"channel must be a channel name or a non-empty {{name: weight}} dict, got {chosen!r}")
    weights = {str(k): float(v) for k, v in chosen.items()}
    if not all(np.isfinite(list(weights.values()))):
        raise InvalidArgumentError(f"channel weights must be finite, got {weights}")
    return weights


def _trace_rewards(batch: TraceBatch, name: str, missing: str) -> np.ndarray:
    values = _core.trace_channel(batch._core, name)
    absent = np.isnan(values)
    if absent.any() and missing == "raise":
        first = batch.trace_ids[int(np.flatnonzero(absent)[0])]
        raise InvalidArgumentError(
            f"{int(absent.sum())} traces have no reward channel {name!r} (first: trace {first!r}); "
            "pass missing='skip' to leave them out (advantage 0)"
        )
    return values


@checked
def advantages(
    batch: Any,
    estimator: Estimator = "grpo",
    *,
    channel: str | Mapping[str, float] = "team",
    group_by: str | Sequence[Any] | np.ndarray | None = "group_id",
    normalize_by: Stratum | Sequence[Stratum] | None = None,
    std: bool | Literal["group", "batch", "none"] = True,
    eps: float | None = None,
    dtype: Any = "float32",
    compat: Compat | None = None,
    channels: Mapping[str, float] | None = None,
    channel_mode: Literal["sum_then_normalize", "normalize_then_sum"] = "sum_then_normalize",
    credit: np.ndarray | Sequence[float] | None = None,
    unit: Unit = "traces",
    weight_by: Stratum | Sequence[Stratum] | None = None,
    missing: Literal["raise", "skip"] = "raise",
) -> Advantages:
    """Advantages of every trace and event of ``batch``.

    - ``estimator``: ``"grpo"`` ``(r - mean) / (std + eps)`` (``std=False``: Dr.GRPO's ``r -
      mean``; ``std="batch"``: TRL's batch std), ``"rloo"`` ``r - mean of the others``,
      ``"reinforce_pp_baseline"`` ``r - mean`` then whitened over the batch (token-weighted),
      ``"opo"`` ``r - sum(len r) / sum(len)`` with token counts as lengths.
    - ``channel``: the trace-level reward channel, or ``{name: weight}`` (also as
      ``channels=``); with several, ``channel_mode="sum_then_normalize"`` normalises the
      weighted sum, ``"normalize_then_sum"`` normalises each channel and sums the weighted
      advantages (TRL's two ``multi_objective_aggregation`` modes).
    - ``group_by``: ``"group_id"`` (GRPO rollouts of one prompt), ``"task_id"``, ``None`` (the
      whole batch), or one label per trace; grouping is by value, not position.
    - ``normalize_by``: ``"agent"``, ``"role"``, ``"depth"``, ``"turn"``, ``"event_type"`` or a
      list (joint strata): statistics per (group, stratum) cell instead of per group.
    - ``unit``: what the statistics count: ``"traces"`` (a trace counts once per cell it
      appears in) or ``"events"`` (every event counts: Dr. MAS's agent-wise normalisation).
    - ``credit``: per-event values (aligned with ``batch.events()``) in place of the broadcast
      trace reward, e.g. :func:`graph_returns` of a process channel.
    - ``compat``: ``"verl"``, ``"trl"`` or ``"openrlhf"`` reproduce that trainer's fp32 numbers
      and edge cases in the single-agent case; ``eps`` defaults to the trainer's (1e-6, 1e-4,
      1e-9; 1e-6 natively). Natively, a cell of one sample gets 0.
    - ``weight_by``: strata of the loss weights (default: ``normalize_by``, else ``"agent"``).
    - ``missing``: a trace without the channel raises, or with ``"skip"`` is left out of the
      statistics and gets 0 (TRL's unscorable rows).
    """
    batch = as_batch(batch)
    out_dtype = _dtype(dtype)
    if channel_mode not in CHANNEL_MODES:
        raise InvalidArgumentError(f"channel_mode must be one of {CHANNEL_MODES}, got {channel_mode!r}")
    if missing not in ("raise", "skip"):
        raise InvalidArgumentError(f"missing must be 'raise' or 'skip', got {missing!r}")
    by = _strata("normalize_by", normalize_by)
    weights_by = _strata("weight_by", weight_by) or by
    groups, group_index = _group_keys(batch, group_by)
    weights = _channel_weights(channel, channels)
    credit_array = None if credit is None else _event_values(batch, "credit", credit)
    if credit_array is not None:
        rewards = {"credit": np.zeros(len(batch))}
    else:
        rewards = {name: _trace_rewards(batch, name, missing) for name in weights}

    def run(values: np.ndarray) -> Parts:
        return _core.batch_advantages(
            batch._core,
            np.ascontiguousarray(values, dtype=np.float64),
            groups,
            credit=credit_array,
            normalize_by=by,
            unit=unit,
            estimator=estimator,
            std=_scale(std),
            eps=eps,
            compat=compat,
            weight_by=weights_by,
        )

    if credit_array is not None or channel_mode == "sum_then_normalize" or len(weights) == 1:
        total = sum(weights.get(name, 1.0) * values for name, values in rewards.items())
        per_trace, per_event, loss_weights, trace_index = run(total)
    else:
        per_trace, per_event, loss_weights, trace_index = _normalize_then_sum(batch, weights, rewards, run, compat)
    return Advantages(
        per_trace=per_trace.astype(out_dtype, copy=False),
        per_event=per_event.astype(out_dtype, copy=False),
        weights=loss_weights.astype(out_dtype, copy=False),
        trace_index=trace_index,
        group_index=group_index,
        estimator=estimator,
        normalize_by=tuple(by),
    )


def _normalize_then_sum(
    batch: TraceBatch,
    weights: Mapping[str, float],
    rewards: Mapping[str, np.ndarray],
    run: Callable[[np.ndarray], Parts],
    compat: Compat | None,
) -> Parts:
    """Each channel normalised on its own (``run``), then the weighted advantages summed;
    the loss weights and the events' traces do not depend on the rewards, so the first
    channel's serve."""
    parts = [(weights[name], run(values)) for name, values in rewards.items()]
    loss_weights, trace_index = parts[0][1][2:]
    if compat == "trl":
        # TRL sums the weighted channel advantages in fp32, then whitens the sum over the
        # whole batch (its normalize_then_sum).
        total32 = np.zeros(len(batch), dtype=np.float32)
        for w, part in parts:
            total32 += np.float32(w) * part[0].astype(np.float32)
        zeros = np.zeros(len(batch), np.int64)
        per_trace = _core.group_normalize(total32.astype(np.float64), zeros, compat="trl").astype(np.float64)
        per_event = np.repeat(per_trace, np.diff(batch.event_offsets))
    else:
        per_trace = sum(w * part[0] for w, part in parts)
        per_event = sum(w * part[1] for w, part in parts)
    return per_trace, per_event, loss_weights, trace_index


def _rows(name: str, values: Any, n: int) -> np.ndarray:
    """One number per row of ``values``, as float64."""
    array = numbers(name, values)
    if array.shape != (n,):
        raise InvalidArgumentError(f"{name} must hold one value per row ({n}), got shape {array.shape}")
    return array


def _mask(mask: Any, n: int) -> np.ndarray:
    array = numbers("mask", mask, np.float32)
    if array.ndim != 2 or array.shape[0] != n:
        raise InvalidArgumentError(f"mask must have shape (rows={n}, tokens), got {array.shape}")
    return array


@checked
def group_normalize(
    values: Any,
    groups: Any,
    *,
    strata: Any = None,
    lengths: Any = None,
    mask: Any = None,
    estimator: Estimator = "grpo",
    std: bool | Literal["group", "batch", "none"] = True,
    eps: float | None = None,
    compat: Compat | None = None,
    dtype: Any = "float32",
    torch_threads: int = 1,
) -> np.ndarray:
    """Advantages of plain rows: ``values[i]`` belongs to group ``groups[i]`` (and, for
    stratified normalisation, to stratum ``strata[i]``, e.g. its agent: Dr. MAS's (uid,
    agent) cells). Labels may be any values; rows are grouped by value. ``lengths`` are OPO's
    and REINFORCE++'s per-row token counts. Same estimators and ``compat`` modes as
    :func:`advantages`; NaN values are left out and get 0. Values and lengths are below
    2^49 in magnitude (README, Guarantees).

    Two inputs only the trainer modes read, where torch's rounding depends on them:
    ``mask`` is verl's (rows, L) response mask, over whose tokens ``compat="verl"`` whitens
    REINFORCE++ (default: each row's ``lengths`` tokens first, L the longest);
    ``torch_threads`` is the trainer's ``torch.get_num_threads()``, between which ATen splits
    a sum over a whole tensor of 32768 values or more (verl's whitening, TRL's
    ``std="batch"``).
    """
    out_dtype = _dtype(dtype)
    array = numbers("values", values)
    if array.ndim != 1:
        raise InvalidArgumentError(f"values must be 1-D, got shape {array.shape}")
    n = len(array)
    result = _core.group_normalize(
        array,
        _keys("groups", groups, n),
        strata=None if strata is None else _keys("strata", strata, n),
        lengths=None if lengths is None else _rows("lengths", lengths, n),
        mask=None if mask is None else _mask(mask, n),
        estimator=estimator,
        std=_scale(std),
        eps=eps,
        compat=compat,
        float32=out_dtype == np.float32,
        torch_threads=int(torch_threads),
    )
    return result


@checked
def event_rewards(batch: Any, channel: str, *, fill: float = 0.0) -> np.ndarray:
    """The per-event reward channel ``channel`` (e.g. ``"process"``, ``"tool"``) as float64,
    aligned with ``batch.events()``; ``fill`` where an event lacks it."""
    batch = as_batch(batch)
    rewards = pa.array(batch._source.event_field("reward"))
    values = pc.map_lookup(rewards, channel, "first")
    return values.fill_null(float(fill)).to_numpy(zero_copy_only=False).astype(np.float64)


def _per_event(batch: TraceBatch, name: str, values: Any) -> np.ndarray:
    if isinstance(values, str):
        return event_rewards(batch, values)
    return _event_values(batch, name, values)


def _event_values(batch: TraceBatch, name: str, values: Any) -> np.ndarray:
    """``values`` as float64, checked to hold one value per event of ``batch``."""
    array = numbers(name, values)
    if array.shape != (batch.num_events,):
        raise InvalidArgumentError(f"{name} must have one value per event ({batch.num_events}), got shape {array.shape}")
    return array


@checked
def graph_returns(
    batch: Any,
    rewards: str | np.ndarray | Sequence[float],
    *,
    gamma: float = 1.0,
    kind: ReturnKind = "descendants",
) -> np.ndarray:
    """Per-event returns of per-event rewards (a channel name or an array aligned with
    ``batch.events()``):

    - ``"descendants"``: ``G_e = sum of gamma^dist(e, d) * r_d`` over ``e`` and everything
      reachable from it, each event counted once (at its shortest distance) even where
      paths join;
    - ``"tree"``: MAGRPO's ``R_e = r_e + gamma * mean(R_c)`` over the children ``c``;
    - ``"turns"``: MARSHAL's discounted reverse cumulative sum over each agent's own events
      in time order.
    """
    batch = as_batch(batch)
    return _core.graph_returns(batch._core, _per_event(batch, "rewards", rewards), gamma=float(gamma), kind=kind)


@checked
def graph_gae(
    batch: Any,
    rewards: str | np.ndarray | Sequence[float],
    values: np.ndarray | Sequence[float],
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """GAE over each trace's event graph, given per-event values: ``delta_e = r_e + gamma *
    mean(V_c) - V_e`` and ``A_e = delta_e + gamma * lam * mean(A_c)`` over the children ``c``
    (0 past a leaf). Returns ``(advantages, returns = advantages + values)``; on a chain this
    is verl's GAE before whitening."""
    batch = as_batch(batch)
    return _core.graph_gae(
        batch._core,
        _per_event(batch, "rewards", rewards),
        _per_event(batch, "values", values),
        gamma=float(gamma),
        lam=float(lam),
    )
