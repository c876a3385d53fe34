"""Per-event credit from whatever the caller holds (an estimator's result, a credit table, an
aligned array, or the name of an estimator to run), aligned with ``batch.events()``, with
standard errors where the estimator gives them and a line saying where it came from. The
viewer colours by it; ``convert.to_otel`` writes it as span attributes."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from masreplay._args import numbers
from masreplay.advantages import Advantages, advantages, event_rewards
from masreplay.batch import TraceBatch
from masreplay.counterfactual import counterfactual_credit, same_prefix_credit
from masreplay.errors import InvalidArgumentError
from masreplay.games import empirical_from_traces
from masreplay.shapley import TraceCredit, trace_players, trace_shapley

NAMED = ("advantage", "shapley", "counterfactual")
#: Event columns that can be coloured by directly (numbers, not labels).
NUMERIC_EVENT_COLUMNS = ("t", "tokens", "duration_s", "logprob")


@dataclass(frozen=True)
class EventCredit:
    """Per-event ``values`` (NaN: uncredited) and ``stderr`` (NaN: unknown), aligned with the
    batch's events; ``name`` is what the legend calls them, ``estimator`` and ``budget`` say
    how they were computed."""

    name: str
    values: np.ndarray
    stderr: np.ndarray
    estimator: str
    budget: str = ""

    def take(self, rows: np.ndarray) -> EventCredit:
        """The values of the events at ``rows`` (say, the traces a view embeds)."""
        return replace(self, values=self.values[rows], stderr=self.stderr[rows])


def resolve(batch: TraceBatch, color: str | None, credit: Any) -> EventCredit | None:
    """The credit ``view(color=, credit=)`` asks for: ``credit`` as given (``color`` then
    names it, or picks a column of a credit table), else what ``color`` names; None when
    neither is given."""
    if color is not None and not isinstance(color, str):
        raise InvalidArgumentError(f"color must be None, one of {list(NAMED)} or a column name, got {type(color).__name__}")
    if credit is not None:
        return _given(batch, color, credit)
    if color is None:
        return None
    if color == "advantage":
        return _advantage(batch, advantages(batch, missing="skip", dtype="float64"), "advantage")
    if color == "shapley":
        return _group_shapley(batch)
    if color == "counterfactual":
        return _counterfactual(batch)
    return _column(batch, color)


def _nan(n: int) -> np.ndarray:
    return np.full(n, np.nan)


def _aligned(batch: TraceBatch, values: Any, what: str) -> np.ndarray:
    array = numbers(what, values)  # text, None, complex refused, not converted
    if array.shape != (batch.num_events,):
        raise InvalidArgumentError(
            f"{what} must have one value per event of the batch ({batch.num_events}), got shape {array.shape}"
        )
    return array


def _given(batch: TraceBatch, color: str | None, credit: Any) -> EventCredit:
    """Credit the caller computed: an estimator's result, a credit table or an aligned array."""
    name = color or "credit"
    if isinstance(credit, Advantages):
        return _advantage(batch, credit, name)
    if isinstance(credit, TraceCredit):
        return _shapley(batch, credit, name, "shapley")
    if hasattr(credit, "__arrow_c_stream__") or hasattr(credit, "to_arrow"):
        return _table(batch, color, credit)
    values = _aligned(batch, credit, "credit")
    return EventCredit(name, values, _nan(batch.num_events), "given per event")


def _advantage(batch: TraceBatch, result: Advantages, name: str) -> EventCredit:
    values = _aligned(batch, result.per_event, "Advantages.per_event")
    by = f", normalised by {', '.join(result.normalize_by)}" if result.normalize_by else ""
    return EventCredit(name, values, _nan(batch.num_events), f"{result.estimator}{by}")


def _shapley(batch: TraceBatch, result: TraceCredit, name: str, game: str) -> EventCredit:
    """An event's credit is its player's value, split over the player's events or whole on
    each, so its stderr is the player's over the same count (or the player's)."""
    values = _aligned(batch, result.credit, "TraceCredit.credit")
    players, events = result.players, result.events
    trace_index = events["trace_index"].to_numpy()
    player = events["player"].to_numpy()
    # Row of each event's player in the players table (players are stored trace by trace).
    first_row = np.searchsorted(players["trace_index"].to_numpy(), trace_index)
    row = np.where(player >= 0, first_row + np.maximum(player, 0), 0)
    shares = players["n_events"].to_numpy() if result.event_credit == "split" else 1
    stderr = players["stderr"].to_numpy() / np.maximum(shares, 1)
    per_event = np.where(player >= 0, stderr[row] if len(stderr) else np.nan, np.nan)
    values = np.where(player >= 0, values, np.nan)
    methods = sorted({m for m in result.methods if m})
    return EventCredit(
        name,
        values,
        per_event,
        f"{game}, {'/'.join(methods) or 'no players'}",
        f"{result.total_evaluations:,} coalition evaluations",
    )


def _table(batch: TraceBatch, color: str | None, credit: Any) -> EventCredit:
    """A table with trace_id, event_id and credit (and optionally stderr) columns, joined to
    the batch's events by (trace_id, event_id); ``color`` may name another of its columns."""
    table = credit.to_arrow() if hasattr(credit, "to_arrow") and not isinstance(credit, pa.Table) else pa.table(credit)
    column = color if color is not None and color in table.column_names else "credit"
    missing = [c for c in ("trace_id", "event_id", column) if c not in table.column_names]
    if missing:
        raise InvalidArgumentError(f"a credit table needs columns trace_id, event_id and {column}; it lacks {missing}")
    events = batch.events()

    def key(trace_ids: pa.ChunkedArray, event_ids: pa.ChunkedArray) -> list[str]:
        # \x1f cannot occur in an id that matters: it only separates the two halves.
        if pa.types.is_dictionary(trace_ids.type):
            trace_ids = trace_ids.combine_chunks().dictionary_decode()
        trace_ids = pc.cast(trace_ids, pa.string())
        return pc.binary_join_element_wise(trace_ids, pc.cast(event_ids, pa.string()), "\x1f").to_pylist()

    row_of = {k: i for i, k in enumerate(key(events["trace_id"], events["id"]))}
    rows = np.array([row_of.get(k, -1) for k in key(table["trace_id"], table["event_id"])], dtype=np.int64)
    found = rows >= 0
    values, stderr = _nan(batch.num_events), _nan(batch.num_events)
    values[rows[found]] = pc.cast(table[column], pa.float64()).to_numpy(zero_copy_only=False)[found]
    if "stderr" in table.column_names:
        stderr[rows[found]] = pc.cast(table["stderr"], pa.float64()).to_numpy(zero_copy_only=False)[found]
    return EventCredit(color or column, values, stderr, f"credit table, column {column!r}")


def _group_shapley(batch: TraceBatch) -> EventCredit:
    """Shapley credit with no value function given: each trace's agents are valued by the
    empirical game of its GRPO group (a coalition is worth the mean team reward of the
    sibling rollouts it ran as, ridge-predicted when never observed), spawn tree respected."""
    group_ids = batch.to_arrow()["group_id"].to_pylist()
    games = {}
    for group in dict.fromkeys(group_ids):
        members = [i for i, g in enumerate(group_ids) if g == group]
        games[group] = empirical_from_traces(batch[members])
    players = _player_labels(batch)

    def value(trace_index: np.ndarray, masks: np.ndarray) -> np.ndarray:
        out = np.empty(len(masks))
        for t in np.unique(trace_index):
            game, labels = games[group_ids[t]]
            column = {label: j for j, label in enumerate(labels)}
            picked = trace_index == t
            coalitions = np.zeros((int(picked.sum()), len(labels)), dtype=bool)
            for j, label in enumerate(players[t]):
                coalitions[:, column[label]] = masks[picked, j]
            out[picked] = game.values(coalitions)
        return out

    return _shapley(batch, trace_shapley(batch, value), "shapley", "group's empirical game")


def _player_labels(batch: TraceBatch) -> list[list[str]]:
    """Each trace's player labels (agents), in the order trace_shapley's masks use."""
    table = trace_players(batch)
    labels: list[list[str]] = [[] for _ in range(len(batch))]
    for t, label in zip(table["trace_index"].to_pylist(), table["label"].to_pylist(), strict=True):
        labels[t].append(label)
    return labels


def _counterfactual(batch: TraceBatch) -> EventCredit:
    """Branch-rollout credit when the batch holds branch rollouts; otherwise the credit of
    the decisions where a GRPO group's traces diverge after a shared prefix."""
    has_branches = pc.any(pc.is_valid(batch.to_arrow()["counterfactual_of"])).as_py()
    table = counterfactual_credit(batch) if has_branches else same_prefix_credit(batch)
    estimator = "branch rollouts, R(factual) - mean R(branches)" if has_branches else "same-prefix divergence, Q(branch) - V"
    found = _table(batch, None, table)
    return EventCredit("counterfactual", found.values, found.stderr, estimator)


def _column(batch: TraceBatch, column: str) -> EventCredit:
    """A numeric event column, or a per-event reward channel by its name."""
    n = batch.num_events
    events = batch.events()
    if column in NUMERIC_EVENT_COLUMNS:
        values = pc.cast(events[column], pa.float64()).to_numpy(zero_copy_only=False)
        return EventCredit(column, values, _nan(n), f"event column {column!r}")
    rewards = events["reward"].combine_chunks()
    channels = sorted(set(rewards.keys.unique().to_pylist())) if n else []
    if column in channels:
        return EventCredit(column, event_rewards(batch, column, fill=np.nan), _nan(n), f"event reward channel {column!r}")
    known = list(NUMERIC_EVENT_COLUMNS) + channels
    raise InvalidArgumentError(
        f"color {column!r} is none of {list(NAMED)}, nor a numeric event column or reward channel: {known}"
    )


__all__ = ["NAMED", "EventCredit", "resolve"]
