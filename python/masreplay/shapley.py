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
unbiased, and efficient by construction), ``census`` (near-complete enumeration, for a budget
of at least half the 2^n coalitions: the coalitions left out valued by a surrogate with the
interactions, plus a difference estimator over the drawn ones' cross-fitted residuals; unbiased
and efficient by construction), and ``auto``, which picks exact when the budget
covers every feasible coalition, ``census`` when it covers 90% of them or more, ``msr``
from 30 evaluations per player and antithetic permutations below (rules measured on the
benchmark families, see the README), and says which in ``result.method``.

MSR's surrogate (``surrogate=``): ``linear`` is the one above; ``interactions`` adds, per
fold, the odd characters x_i x_j x_k of triples of players screened on the linear
surrogate's residuals (the part of a term of three or more players that no linear surrogate
absorbs), fitted jointly with the linear part; their MSR means are exact, so the estimate
stays unbiased and efficient. On sparse games it cuts MSR's error 4-10x (n = 100, 10,000
evaluations: low-order SOUM 0.0108 -> 0.0020, spawn-tree trace games 0.0145 -> 0.0017) and
leaves dense games as they were, at the price of the fit: about a hundred milliseconds of
CPU at n = 100 and 10,000 evaluations, against a few for the linear fit (choose ``linear``
when an evaluation costs microseconds). ``auto``: ``interactions`` up to 300 players,
``linear`` beyond, and on a game whose evaluations all equal v(empty) or v(N) (a voting game,
a team that succeeds or fails) a step low + (high - low) [u . x_S >= t] with integer
weights where one separates the training coalitions, else a staircase (the share of high
values at each integer score u . x_S), whose MSR terms are exact, kept by a fold only where
it leaves a held-out training fold less than the linear part (voting games, 10,000
evaluations: n = 30 0.00191 -> 0.00021, n = 100 0.00196 -> 0.00157; 0.6-2 s of CPU for the
fits). There a pilot (up to 8 pairs a size, at most 10% of the budget, left out of the
estimate) also finds the sizes where no coalition swings the outcome, and those keep a fifth
of their draws (n = 100: 0.00157 -> 0.00106). ``trace_shapley`` runs MSR without the pilot:
it values the coalitions only once every estimator has announced them.

Players the caller knows about: ``fixed`` players are always present (an orchestrator, the
harness), ``exclude`` players never; the estimators play the game among the rest,
``v'(S) = v(S + fixed)``, so no evaluation goes to a coalition without a fixed player, and
the values sum to ``v(N - exclude) - v(fixed)``. Fixed and excluded players get 0 (stderr 0).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from masreplay import _core
from masreplay._args import (
    I64_MAX,
    U64_MAX,
    checked,
    is_index,
    is_sequence,
    item_of_0d,
    optional_whole,
    refuse_masked,
    whole,
    wrong_type,
)
from masreplay.batch import TraceBatch
from masreplay.errors import InvalidArgumentError
from masreplay.games import FunctionGame, evaluate
from masreplay.io import as_batch
from masreplay.vocabulary import EVENT_CREDIT_SHARES, EventCreditShare, ShapleyMethod, ShapleySurrogate


@dataclass(frozen=True)
class ShapleyResult:
    """Per-player values and standard errors (0 when computed exactly), the coalitions
    valued, whether the result is exact or met ``target_stderr``, and the method that ran.

    Values are projected onto efficiency (they sum to v(N) - v(empty));
    ``efficiency_gap`` is what the projection closed, v(N) - v(empty) minus the sum of the
    estimator's own values: rounding-sized for every method efficient by construction (all
    but ``stratified``), an estimation error for the others. Under noise values are not
    projected and ``efficiency_gap`` is NaN; ``noise`` is then the standard deviation of one
    evaluation (given, or estimated from coalitions valued twice; NaN when none was).
    ``prior_evaluations``: the prior game's evaluations when one was given (free: no rollout)."""

    values: np.ndarray
    stderr: np.ndarray
    evaluations: int
    converged: bool
    method: str
    exact: bool
    efficiency_gap: float
    noise: float | None = None
    prior_evaluations: int = 0

    def __repr__(self) -> str:
        return (
            f"ShapleyResult(method={self.method!r}, exact={self.exact}, evaluations={self.evaluations}, "
            f"values={np.array2string(self.values, precision=4)})"
        )


#: Largest player index the core takes in ``fixed``, ``exclude`` and ``unions`` (u32).
_PLAYER_MAX = 2**32 - 1


def _unions(unions: Sequence[Any] | None) -> list[Any] | None:
    """Nested lists of player indices, as plain lists (tuples, arrays and numpy ints accepted)."""
    if unions is None:
        return None
    if not is_sequence(unions):
        raise wrong_type("unions", "nested lists of player indices", unions)
    refuse_masked("unions", unions)

    def plain(item: Any) -> Any:
        if isinstance(item, np.ndarray):  # as lists: a matrix's rows are matrices again, endlessly
            item = np.asarray(item).tolist()
        if isinstance(item, (list, tuple)):
            return [plain(child) for child in item]
        if is_index(item):
            return _player(item, "unions")
        raise InvalidArgumentError(f"unions: {item!r} is neither a player index nor a list")

    return [plain(u) for u in unions]


def _indices(players: Any, what: str) -> list[int]:
    """A collection of player indices as a list of ints (None: none)."""
    if players is None:
        return []
    refuse_masked(what, players)
    players = item_of_0d(players)
    if is_index(players):
        players = [players]
    if not is_sequence(players):
        raise wrong_type(what, "a player index or a sequence of them", players)
    if isinstance(players, np.ndarray):
        players = np.asarray(players).ravel().tolist()  # a matrix stays 2-D under ravel
    return [_player(p, what) for p in players]


def _player(index: Any, what: str) -> int:
    if not is_index(index) or not 0 <= index <= _PLAYER_MAX:
        raise InvalidArgumentError(f"{what}: {index!r} is not a player index (0 to {_PLAYER_MAX})")
    return int(index)


def _parents(parents: Sequence[int | None] | np.ndarray | None) -> list[int] | None:
    """Each player's spawner as the core takes it: an index, -1 (or None) for a root."""
    if parents is None:
        return None
    if not is_sequence(parents):
        raise wrong_type("parents", "a sequence of player indices (-1 or None for a root)", parents)
    refuse_masked("parents", parents)
    if isinstance(parents, np.ndarray):
        parents = np.asarray(parents).ravel().tolist()
    return [-1 if p is None else whole(f"parents[{i}]", p, low=-1, high=I64_MAX) for i, p in enumerate(parents)]


@checked
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
    fixed: int | Sequence[int] | np.ndarray | None = None,
    exclude: int | Sequence[int] | np.ndarray | None = None,
    noise: Literal["auto"] | float | None = None,
    repeats: int | None = None,
    prior: Any = None,
    prior_budget: int | None = None,
    surrogate: ShapleySurrogate = "auto",
) -> ShapleyResult:
    """Shapley values of ``game``: a native game of :mod:`masreplay.games`, a
    :class:`~masreplay.games.FunctionGame`, or a callable ``f(masks) -> values`` (masks a
    boolean array (m, n_players); give ``n_players``).

    ``budget`` counts coalition evaluations (default 10,000 unless ``target_stderr`` is
    given); sampling stops at the budget or once every standard error is at most
    ``target_stderr``, whichever comes first. ``parents[i]`` is the player that spawned i
    (-1 or None for a root); ``unions`` nests lists of player indices. The same ``seed`` gives the
    same values at any ``n_threads``. A callable is called with at most ``chunk_size``
    coalitions, each distinct coalition once; ``evaluations`` counts its calls' rows. It is
    called on the calling thread, one chunk at a time; ``msr``, ``kernel`` and ``stratified``
    draw and sum on a second thread meanwhile (the same values as without it).
    ``fixed`` players are always present and ``exclude`` players never (see the module's
    docstring): values then sum to ``v(N - exclude) - v(fixed)``, those players' are 0.

    ``noise`` says the game is random, each call a fresh rollout (a callable; nothing is
    cached): a float is the known standard deviation of one evaluation, ``"auto"`` estimates
    it from coalitions valued more than once. ``stderr`` then holds the evaluation noise
    too, and ``target_stderr`` stops on it. When the budget covers every coalition (twice
    for ``"auto"``) the estimate is exact enumeration with each coalition valued
    ``repeats`` times (default: all the budget allows; with ``target_stderr``, rounds until
    it is met); otherwise, with a budget of at least 10 evaluations a player (times ``repeats``), MSR,
    whose every evaluation informs every player (the noise variance in a value is below
    10 sigma^2 / budget at any n, 2 sigma^2 n / budget for orderings: 3-7x lower error
    than antithetic permutations at n = 30-300 and 10,000 evaluations), with the empty and grand coalitions
    and the smallest and largest sizes drawn repeatedly (Neyman's rule); precedence values
    (``parents``) reuse every evaluated down-set the same way, and ``permission`` runs MSR on
    its restricted game; with ``target_stderr`` these run in independent rounds, each sized
    by how far the combination (weighted by the rounds' budgets) is from the target.
    Otherwise the ordering samplers draw every coalition afresh. Each request is drawn
    ``repeats`` times (default 1: a new sample averages noise as well as a repeat does, and
    samples too). ``kernel`` and ``stratified`` are refused under noise.

    ``prior`` is a cheap game believed close to this one, say the empirical game of logged
    rollouts (:func:`masreplay.games.empirical_from_traces`, its columns ordered as this
    game's players): a control variate. Its values are computed on their own, exactly when
    ``prior_budget`` (default: 20 times ``budget``, at least 2^16) covers every coalition,
    otherwise estimated with that many evaluations of the prior; the live budget is spent on
    the residual game ``v - prior`` only, so phi(v) = phi(prior) + phi(v - prior) stays
    unbiased and the error shrinks as much as the residual is smaller than the game. The
    standard errors of both parts add in quadrature; ``evaluations`` counts the live game's,
    ``prior_evaluations`` the prior's.

    ``stderr`` is calibrated: value +- 1.96 stderr covers the exact value 93-97% of the time
    for every sampled method on the benchmark game families at 10,000 evaluations
    (tests/test_shapley_calibration.py), for the ordering samplers (permutation, precedence,
    Owen) from ten antithetic pairs of orderings on, on sparse games as well (each player's
    variance is pooled with the mean variance of the players whose contributions varied and
    scaled by Student's t; a player whose never varied gets every player's mean as its floor,
    so a null player's stderr is that floor rather than 0), and with a prior of logged
    rollouts (tests/test_shapley_prior.py). With one antithetic pair and a third ordering
    (permutation from 100 players where the budget fits three orderings but not four) it
    covers 93-97% on low-order games and over-covers full-order and voting games (0.98-1.00),
    as three plain orderings did.
    For ``stratified`` it is the error of the projected values.
    """
    if prior is not None:
        options = {"method": method, "budget": budget, "target_stderr": target_stderr, "seed": seed, "parents": parents}
        options.update(unions=unions, n_threads=n_threads, antithetic=antithetic, fixed=fixed, exclude=exclude)
        options.update(surrogate=surrogate)
        return _with_prior(game, n_players, chunk_size, prior, prior_budget, options, noise, repeats)
    canonical = None
    if isinstance(game, FunctionGame):
        if n_players is not None and n_players != game.n_players:
            raise InvalidArgumentError(f"n_players={n_players} but the game has {game.n_players} players")
        n_players, chunk_size, canonical, game = game.n_players, game.chunk_size, game.canonical, game.f
    elif not isinstance(game, _core.Game) and not callable(game):
        raise InvalidArgumentError(f"game: expected a masreplay game or a callable, got {type(game).__name__}")
    raw = _core.shapley(
        game,
        optional_whole("n_players", n_players),
        method,
        optional_whole("budget", budget),
        None if target_stderr is None else float(target_stderr),
        whole("seed", seed),
        _parents(parents),
        _unions(unions),
        optional_whole("n_threads", n_threads),
        bool(antithetic),
        whole("chunk_size", chunk_size),
        _indices(fixed, "fixed"),
        _indices(exclude, "exclude"),
        canonical,
        _noise(noise),
        optional_whole("repeats", repeats),
        surrogate,
    )
    return ShapleyResult(**raw)


#: Methods that estimate another value than Shapley's; a prior gets the same, others "auto".
_STRUCTURED = ("exact", "precedence", "permission", "owen")
#: Keeps the prior's random stream apart from the live game's (independent errors add in
#: quadrature).
_PRIOR_STREAM = 0x5052_494F_52


def _with_prior(game, n_players, chunk_size, prior, prior_budget, options, noise, repeats) -> ShapleyResult:
    """phi(game) = phi(prior) + phi(game - prior): the live evaluations go to the residual."""
    if isinstance(game, FunctionGame):
        live = game
    elif isinstance(game, _core.Game) and noise is not None:
        raise InvalidArgumentError("noise: a native game is deterministic; noise applies to a callable")
    elif isinstance(game, _core.Game) or callable(game):
        n = n_players if n_players is not None else getattr(game, "n_players", None)
        if n is None:
            raise InvalidArgumentError("n_players is needed for a callable game")
        live = FunctionGame(lambda masks: evaluate(game, masks), whole("n_players", n), whole("chunk_size", chunk_size))
    else:
        raise InvalidArgumentError(f"game: expected a masreplay game or a callable, got {type(game).__name__}")
    if n_players is not None and n_players != live.n_players:
        raise InvalidArgumentError(f"n_players={n_players} but the game has {live.n_players} players")
    prior_players = prior.n_players if isinstance(prior, (FunctionGame, _core.Game)) else live.n_players
    if prior_players != live.n_players:
        raise InvalidArgumentError(f"prior: {prior_players} players, but the game has {live.n_players}")
    evaluate(prior, np.zeros((1, live.n_players), dtype=bool), name="prior")  # a clear error now, not mid-run

    def residual(masks: np.ndarray) -> np.ndarray:
        return evaluate(live.f, masks) - evaluate(prior, masks)

    # Coalitions that play as others (``canonical``) play so in the prior too, or the two
    # parts would value different games.
    if live.canonical is None and isinstance(prior, _core.Game):
        prior_game = prior  # valued in Rust
    else:
        prior_game = FunctionGame(lambda masks: evaluate(prior, masks), live.n_players, live.chunk_size, live.canonical)
    if prior_budget is None:
        budget = optional_whole("budget", options["budget"])
        prior_budget = min(max(20 * (10_000 if budget is None else budget), 1 << 16), U64_MAX)
    prior_budget = whole("prior_budget", prior_budget)  # refused before any live evaluation
    rest = shapley(
        FunctionGame(residual, live.n_players, live.chunk_size, live.canonical), noise=noise, repeats=repeats, **options
    )
    method = options["method"] if options["method"] in _STRUCTURED else "auto"
    prior_seed = (whole("seed", options["seed"]) + _PRIOR_STREAM) % (1 << 64)
    prior_options = {
        **options,
        "method": method,
        "budget": prior_budget,
        "target_stderr": None,
        "seed": prior_seed,
    }
    known = shapley(prior_game, **prior_options)
    stderr = np.hypot(rest.stderr, known.stderr)
    target = options["target_stderr"]
    return ShapleyResult(
        values=known.values + rest.values,
        stderr=stderr,
        evaluations=rest.evaluations,
        converged=rest.converged and (target is None or bool((stderr <= target).all())),
        method=rest.method,
        exact=rest.exact and known.exact,
        efficiency_gap=rest.efficiency_gap + known.efficiency_gap,
        noise=rest.noise,
        prior_evaluations=known.evaluations,
    )


def _noise(noise: Any) -> float | None:
    """The core's form of ``noise``: None, a sigma, or NaN for "auto"."""
    if noise is None:
        return None
    if isinstance(noise, str):
        if noise != "auto":
            raise InvalidArgumentError(f"noise must be None, 'auto' or a standard deviation, got {noise!r}")
        return float("nan")
    if isinstance(noise, bool) or not isinstance(noise, (int, float, np.floating, np.integer)) or not noise >= 0:
        raise InvalidArgumentError(f"noise must be None, 'auto' or a standard deviation >= 0, got {noise!r}")
    return float(noise)


@checked
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
    ``parent``, ``n_events``, ``value``, ``stderr``, ``in_game``: False for a fixed or
    excluded player, whose value is 0). ``events``: one row per event, aligned with
    ``batch.events()``: ``trace_index``, ``player`` (-1: the event belongs to no player),
    ``player_value`` and ``credit``: with ``event_credit="split"`` the player's value shared
    equally among its events, so a trace's credits sum to its players' values (v(N) -
    v(empty) without fixed players); with ``"each"`` the player's whole value on each of its
    events. ``credit`` is that column as numpy, ready to weight advantages. ``methods`` and
    ``evaluations`` are per trace; ``event_credit`` says how events were credited; ``noise``
    (under noise only) the standard deviation of one evaluation per trace.
    """

    players: pa.Table
    events: pa.Table
    methods: list[str | None]
    evaluations: np.ndarray
    total_evaluations: int
    event_credit: EventCreditShare = "split"
    noise: np.ndarray | None = None

    @property
    def credit(self) -> np.ndarray:
        return self.events["credit"].to_numpy()

    def values_of(self, trace_index: int) -> dict[str, float]:
        """The credit of each player of one trace, by label."""
        rows = self.players.filter(pa.compute.equal(self.players["trace_index"], trace_index))
        return dict(zip(rows["label"].to_pylist(), rows["value"].to_pylist(), strict=True))


@checked
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
    fixed: Sequence[str] | None = None,
    exclude: Sequence[str] | None = None,
    canonical: Callable[[np.ndarray, np.ndarray], Any] | None = None,
    event_credit: EventCreditShare = "split",
    noise: Literal["auto"] | float | None = None,
    repeats: int | None = None,
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

    ``fixed`` and ``exclude`` name players by label (say ``fixed=["orchestrator"]``; a label
    a trace lacks is ignored there): fixed players are in every coalition the value function
    sees and excluded ones in none, and both get no credit. ``canonical(trace_index, masks)
    -> masks`` declares that absent players fall back to a default, mapping each coalition
    to the one it plays as (the orchestrator without any worker plays as the empty team);
    coalitions of a trace with the same image are valued once, and ``evaluations`` counts
    them once. ``event_credit`` turns a player's value into its events' credit: ``"split"``
    (default) shares it equally among them, so credits add up to the trace's total;
    ``"each"`` gives every event the player's whole value, what one decision reads as its
    agent's worth.

    ``noise`` and ``repeats`` work as in :func:`shapley`: with noise, ``value_fn`` draws a
    fresh rollout per row, a coalition asked for twice is sent twice (each a draw), the
    stderr column holds the evaluation noise, and ``noise`` per trace is the standard
    deviation used (given, or estimated from the repeats with ``"auto"``).
    """
    if event_credit not in EVENT_CREDIT_SHARES:
        raise InvalidArgumentError(f"event_credit must be one of {list(EVENT_CREDIT_SHARES)}, got {event_credit!r}")
    batch = as_batch(batch)
    raw = _core.trace_shapley(
        batch._core,
        value_fn,
        players,
        bool(respect_spawn_tree),
        method,
        optional_whole("budget", budget),
        whole("seed", seed),
        optional_whole("n_threads", n_threads),
        bool(antithetic),
        whole("chunk_size", chunk_size),
        list(fixed or []),
        list(exclude or []),
        canonical,
        _noise(noise),
        optional_whole("repeats", repeats),
    )
    offsets, event_player, values = raw["offsets"], raw["event_player"], raw["values"]
    table = _players_table(batch, offsets, raw["labels"], raw["parents"], event_player)
    out_of_game = np.isin(table["label"].to_numpy(zero_copy_only=False), list(fixed or []) + list(exclude or []))
    table = (
        table.append_column("value", pa.array(values))
        .append_column("stderr", pa.array(raw["stderr"]))
        .append_column("in_game", pa.array(~out_of_game, pa.bool_()))
    )
    owners = _global_player(offsets, event_player, batch.event_offsets)
    shares = table["n_events"].to_numpy() if event_credit == "split" else np.ones(len(values), dtype=np.int32)
    events = _event_credit(batch, event_player, owners, values, shares)
    noisy = raw["noise"] if noise is not None else None
    return TraceCredit(table, events, raw["methods"], raw["evaluations"], int(raw["total_evaluations"]), event_credit, noisy)


def _event_credit(
    batch: TraceBatch, event_player: np.ndarray, owners: np.ndarray, values: np.ndarray, shares: np.ndarray
) -> pa.Table:
    """One row per event: its player (``event_player`` within the trace, ``owners`` among the
    flat player arrays; -1: none), that player's value, and the event's credit, the value
    over the player's ``shares`` (its event count to split, 1 to credit each event in full;
    0 for an event of no player)."""
    has = owners >= 0
    owner = np.maximum(owners, 0)
    player_value = np.where(has, values[owner] if len(values) else 0.0, 0.0)
    share = np.where(has, shares[owner] if len(values) else 1, 1)
    return pa.table(
        {
            "trace_index": np.repeat(np.arange(len(batch), dtype=np.int32), np.diff(batch.event_offsets)),
            "player": event_player.astype(np.int32),
            "player_value": player_value,
            "credit": np.where(has, player_value / share, 0.0),
        }
    )


__all__ = ["ShapleyResult", "TraceCredit", "shapley", "trace_players", "trace_shapley"]
