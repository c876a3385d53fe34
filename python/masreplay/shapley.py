"""Shapley credit: :func:`shapley` for any game, :func:`trace_shapley` for logged traces.

Methods (``method=``): ``exact`` (all 2^n coalitions, n up to about 25), ``permutation``
(antithetic pairs of random orderings), ``kernel`` (paired KernelSHAP regression, sizes
sampled as Leverage SHAP does, without replacement, exactly efficient), ``precedence`` (the
spawn-tree Shapley value: orderings in which every parent precedes the players it spawned;
exact over the down-sets when they are few), ``permission`` (Shapley of the restricted game
``v'(S) = v(largest down-set in S)``), ``owen`` (nested unions: credit splits exactly level
by level), ``msr`` (regression-adjusted maximum sample reuse, Witter, Liu & Musco 2025:
every valued coalition informs every player; a surrogate fitted on the evaluations, with
per-player slopes that vary with the coalition size, is a control variate; cross-fitted, so
unbiased, and efficient by construction), and ``auto``, which picks exact when the budget
covers every feasible coalition, ``msr`` from 30 evaluations per player and antithetic
permutations below (rules measured on the benchmark families, see the README), and says
which in ``result.method``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from masreplay import _core
from masreplay.batch import TraceBatch
from masreplay.errors import InvalidArgumentError
from masreplay.games import FunctionGame
from masreplay.io import as_batch
from masreplay.vocabulary import ShapleyMethod


@dataclass(frozen=True)
class ShapleyResult:
    """Per-player values and standard errors (0 when computed exactly), the coalitions
    valued, whether the result is exact or met ``target_stderr``, and the method that ran.

    Values are projected onto efficiency (they sum to v(N) - v(empty));
    ``efficiency_gap`` is what the projection closed, v(N) - v(empty) minus the sum of the
    estimator's own values: rounding-sized for every method efficient by construction (all
    but ``stratified``), an estimation error for the others."""

    values: np.ndarray
    stderr: np.ndarray
    evaluations: int
    converged: bool
    method: str
    exact: bool
    efficiency_gap: float

    def __repr__(self) -> str:
        return (
            f"ShapleyResult(method={self.method!r}, exact={self.exact}, evaluations={self.evaluations}, "
            f"values={np.array2string(self.values, precision=4)})"
        )


def _unions(unions: Sequence[Any] | None) -> list[Any] | None:
    """Nested lists of ints, as plain lists (tuples and numpy ints accepted)."""
    if unions is None:
        return None

    def plain(item: Any) -> Any:
        if isinstance(item, (int, np.integer)):
            return int(item)
        if isinstance(item, (list, tuple, np.ndarray)):
            return [plain(child) for child in item]
        raise InvalidArgumentError(f"unions: {item!r} is neither a player index nor a list")

    return [plain(u) for u in unions]


def shapley(
    game: Any,
    n_players: int | None = None,
    *,
    method: ShapleyMethod = "auto",
    budget: int | None = None,
    target_stderr: float | None = None,
    seed: int = 0,
    parents: Sequence[int] | np.ndarray | None = None,
    unions: Sequence[Any] | None = None,
    n_threads: int | None = None,
    antithetic: bool = True,
    chunk_size: int = 1024,
) -> ShapleyResult:
    """Shapley values of ``game``: a native game of :mod:`masreplay.games`, a
    :class:`~masreplay.games.FunctionGame`, or a callable ``f(masks) -> values`` (masks a
    boolean array (m, n_players); give ``n_players``).

    ``budget`` counts coalition evaluations (default 10,000 unless ``target_stderr`` is
    given); sampling stops at the budget or once every standard error is at most
    ``target_stderr``, whichever comes first. ``parents[i]`` is the player that spawned i
    (-1 for a root); ``unions`` nests lists of player indices. The same ``seed`` gives the
    same values at any ``n_threads``. A callable is called with at most ``chunk_size``
    coalitions, each distinct coalition once; ``evaluations`` counts its calls' rows.

    ``stderr`` is calibrated: value +- 1.96 stderr covers the exact value 93-97% of the time
    for every sampled method on the benchmark game families at 10,000 evaluations
    (tests/test_shapley_calibration.py). For ``stratified`` it is the error of the projected
    values.
    """
    if isinstance(game, FunctionGame):
        if n_players is not None and n_players != game.n_players:
            raise InvalidArgumentError(f"n_players={n_players} but the game has {game.n_players} players")
        n_players, chunk_size, game = game.n_players, game.chunk_size, game.f
    elif not isinstance(game, _core.Game) and not callable(game):
        raise InvalidArgumentError(f"game: expected a masreplay game or a callable, got {type(game).__name__}")
    if isinstance(parents, np.ndarray):
        parents = parents.tolist()
    raw = _core.shapley(
        game,
        None if n_players is None else int(n_players),
        method,
        None if budget is None else int(budget),
        None if target_stderr is None else float(target_stderr),
        int(seed),
        None if parents is None else [int(p) for p in parents],
        _unions(unions),
        n_threads,
        bool(antithetic),
        int(chunk_size),
    )
    return ShapleyResult(**raw)


def trace_players(batch: Any, players: str = "agent") -> pa.Table:
    """The players of every trace: ``trace_index``, ``player`` (index within the trace, the
    column a value function's masks use), ``label``, ``parent`` (index of the spawning
    player, -1 for a root) and ``n_events``."""
    batch = as_batch(batch)
    offsets, labels, parents, event_player = _core.trace_players(batch._core, players)
    return _players_table(batch, offsets, labels, parents, event_player)


def _global_player(offsets: np.ndarray, event_player: np.ndarray, event_offsets: np.ndarray) -> np.ndarray:
    """Each event's player as an index into the flat player arrays (-1: none)."""
    trace_of_event = np.repeat(np.arange(len(event_offsets) - 1), np.diff(event_offsets))
    return np.where(event_player >= 0, offsets[trace_of_event] + event_player, -1)


def _players_table(batch: TraceBatch, offsets, labels, parents, event_player) -> pa.Table:
    sizes = np.diff(offsets)
    trace_index = np.repeat(np.arange(len(sizes), dtype=np.int32), sizes)
    local = np.arange(len(labels)) - np.repeat(offsets[:-1], sizes)
    owners = _global_player(offsets, event_player, batch.event_offsets)
    n_events = np.bincount(owners[owners >= 0], minlength=len(labels))
    return pa.table(
        {
            "trace_index": trace_index,
            "trace_id": pa.array(np.asarray(batch.trace_ids, dtype=object)[trace_index], pa.string()),
            "player": local.astype(np.int32),
            "label": pa.array(labels, pa.string()),
            "parent": parents.astype(np.int32),
            "n_events": n_events.astype(np.int32),
        }
    )


@dataclass(frozen=True)
class TraceCredit:
    """Shapley credit of every trace of a batch.

    ``players``: one row per player (``trace_index``, ``trace_id``, ``player``, ``label``,
    ``parent``, ``n_events``, ``value``, ``stderr``). ``events``: one row per event, aligned
    with ``batch.events()``: ``trace_index``, ``player`` (-1: the event belongs to no
    player), ``player_value`` and ``credit``, the player's value shared equally among its
    events, so a trace's credits sum to v(N) - v(empty). ``credit`` is that column as numpy,
    ready to weight advantages. ``methods`` and ``evaluations`` are per trace.
    """

    players: pa.Table
    events: pa.Table
    methods: list[str | None]
    evaluations: np.ndarray
    total_evaluations: int

    @property
    def credit(self) -> np.ndarray:
        return self.events["credit"].to_numpy()

    def values_of(self, trace_index: int) -> dict[str, float]:
        """The credit of each player of one trace, by label."""
        rows = self.players.filter(pa.compute.equal(self.players["trace_index"], trace_index))
        return dict(zip(rows["label"].to_pylist(), rows["value"].to_pylist(), strict=True))


def trace_shapley(
    batch: Any,
    value_fn: Callable[[np.ndarray, np.ndarray], Any],
    *,
    players: str = "agent",
    respect_spawn_tree: bool = True,
    method: ShapleyMethod = "auto",
    budget: int | None = None,
    seed: int = 0,
    n_threads: int | None = None,
    antithetic: bool = True,
    chunk_size: int = 1 << 16,
) -> TraceCredit:
    """One Shapley vector per trace of ``batch``, as a credit table aligned with its events.

    Players come from each trace: ``players="agent"`` (a tool_result counts for the agent
    whose call it answers), ``"role"``, ``"event"`` or any event column (events where it is
    null belong to no player); :func:`trace_players` lists them. With
    ``respect_spawn_tree`` (default) a sub-agent only ever joins after its spawner: the
    spawn-tree (precedence) Shapley value, exact over the tree's down-sets when they fit the
    budget (``method="permission"`` gives the restricted-game value instead).

    ``value_fn(trace_index, masks)`` values coalitions of many traces at once: ``masks`` is
    boolean (m, max players of a trace), column j the trace's player j, and it returns m
    values. It is called with at most ``chunk_size`` rows, each coalition of a trace once.
    Sampling stops by ``budget`` (per trace, default 10,000 evaluations).
    """
    batch = as_batch(batch)
    raw = _core.trace_shapley(
        batch._core,
        value_fn,
        players,
        bool(respect_spawn_tree),
        method,
        None if budget is None else int(budget),
        int(seed),
        n_threads,
        bool(antithetic),
        int(chunk_size),
    )
    offsets, event_player, values = raw["offsets"], raw["event_player"], raw["values"]
    table = _players_table(batch, offsets, raw["labels"], raw["parents"], event_player)
    table = table.append_column("value", pa.array(values)).append_column("stderr", pa.array(raw["stderr"]))
    owners = _global_player(offsets, event_player, batch.event_offsets)
    events = _event_credit(batch, event_player, owners, values, table["n_events"].to_numpy())
    return TraceCredit(table, events, raw["methods"], raw["evaluations"], int(raw["total_evaluations"]))


def _event_credit(
    batch: TraceBatch, event_player: np.ndarray, owners: np.ndarray, values: np.ndarray, n_events: np.ndarray
) -> pa.Table:
    """One row per event: its player (``event_player`` within the trace, ``owners`` among the
    flat player arrays; -1: none), that player's value, and the event's equal share of it (0
    for an event of no player), so a trace's credits sum to its players' values."""
    has = owners >= 0
    owner = np.maximum(owners, 0)
    player_value = np.where(has, values[owner] if len(values) else 0.0, 0.0)
    share = np.where(has, n_events[owner] if len(values) else 1, 1)
    return pa.table(
        {
            "trace_index": np.repeat(np.arange(len(batch), dtype=np.int32), np.diff(batch.event_offsets)),
            "player": event_player.astype(np.int32),
            "player_value": player_value,
            "credit": np.where(has, player_value / share, 0.0),
        }
    )


__all__ = ["ShapleyResult", "TraceCredit", "shapley", "trace_players", "trace_shapley"]
