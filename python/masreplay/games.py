"""Games for :func:`masreplay.shapley`: the value of every coalition of players.

Native games are valued in Rust, so the estimators run at full speed on them: ``soum`` (sum
of unanimity models, with closed-form Shapley and Banzhaf values, the usual ground truth),
``table``, ``additive``, ``weighted_voting`` and ``empirical`` (the game of logged rollouts,
each a coalition with its reward). ``function`` wraps a batched Python callable
``f(masks) -> values``: masks is a boolean array (m, n_players), called in chunks, each
distinct coalition valued once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from masreplay import _core
from masreplay._args import aligned, checked, is_sequence, numbers, optional_whole, real, refuse_masked, whole, wrong_type
from masreplay.errors import InvalidArgumentError

Game = _core.Game


def soum(
    n: int,
    terms: int | Sequence[tuple[Sequence[int], float]] = 100,
    max_order: int | None = None,
    seed: int = 0,
) -> Game:
    """Sum of unanimity models ``v(S) = sum_T c_T [T subset of S]`` over ``n`` players.

    ``terms`` is a number of random terms (sizes uniform in 1..max_order, default n; members
    uniform; coefficients uniform in [-1, 1], as shapiq's SOUM) or explicit
    ``(players, coefficient)`` pairs. ``game.shapley_values()`` and ``game.banzhaf_values()``
    give the closed forms.
    """
    terms = [_term(i, term) for i, term in enumerate(terms)] if is_sequence(terms) else whole("terms", terms)
    return _core.soum_game(whole("n", n), terms, optional_whole("max_order", max_order), whole("seed", seed))


def _term(i: int, term: Any) -> tuple[list[int], float]:
    """An explicit SOUM term: (player indices, coefficient)."""
    if not (is_sequence(term) and len(term) == 2 and is_sequence(term[0])):
        raise InvalidArgumentError(f"terms[{i}] must be a (players, coefficient) pair, got {term!r}")
    players, coefficient = term
    return [whole(f"terms[{i}]: a player index", p) for p in players], real(f"terms[{i}]: coefficient", coefficient)


def _players_of(key: Any) -> list[int]:
    """A coalition key of a sparse table: a bitmask int or an iterable of player indices."""
    if isinstance(key, (int, np.integer)):
        key = int(key)
        if key < 0:
            raise InvalidArgumentError(f"table: coalition bitmask {key} is negative")
        return [p for p in range(key.bit_length()) if key >> p & 1]
    return [whole("table: a player index", p) for p in key]


@checked
def table(
    values: Sequence[float] | np.ndarray | Mapping[Any, float],
    n_players: int | None = None,
    *,
    default: float = 0.0,
) -> Game:
    """A game given by its values.

    Dense: a sequence of 2^n values, ``values[mask]`` the worth of the coalition whose
    players are the set bits of ``mask``. Sparse: a dict from coalitions (a bitmask int, or
    an iterable of player indices) to values; coalitions not listed are worth ``default``,
    and ``n_players`` is then required.
    """
    if isinstance(values, Mapping):
        if n_players is None:
            raise InvalidArgumentError("table: n_players is required for a sparse table")
        entries = [(_players_of(key), float(value)) for key, value in values.items()]
        return _core.sparse_table_game(whole("n_players", n_players), entries, float(default))
    dense = numbers("table: values", values).ravel()
    game = _core.dense_table_game(dense)
    if n_players is not None and game.n_players != n_players:
        raise InvalidArgumentError(f"table: {len(dense)} values make {game.n_players} players, not {n_players}")
    return game


def additive(weights: Sequence[float] | np.ndarray) -> Game:
    """``v(S) = sum of the weights of S``: each player's Shapley value is its weight."""
    return _core.additive_game(numbers("additive: weights", weights).ravel().tolist())


@checked
def weighted_voting(weights: Sequence[float] | np.ndarray, quota: float) -> Game:
    """``v(S) = 1`` when the weights of S reach ``quota``, else 0."""
    return _core.weighted_voting_game(numbers("weighted_voting: weights", weights).ravel().tolist(), float(quota))


@checked
def empirical(coalitions: np.ndarray, rewards: Sequence[float] | np.ndarray, *, order: int = 1) -> Game:
    """The game of logged rollouts: row i of ``coalitions`` (bool, (m, n_players)) is the set
    of players that took part in rollout i, ``rewards[i]`` its reward. An observed coalition
    is worth its mean reward; one never observed is predicted by a ridge regression on the
    observed means over each player's presence (``order=2``: and each pair's)."""
    masks = _coalition_masks("empirical: coalitions", coalitions)
    if masks.ndim != 2:
        raise InvalidArgumentError(f"empirical: coalitions must be 2-D (m, n_players), got shape {masks.shape}")
    return _core.empirical_game(masks, numbers("empirical: rewards", rewards).ravel().tolist(), whole("order", order))


def _coalition_masks(name: str, value: Any) -> np.ndarray:
    """Coalitions as a contiguous boolean array: booleans, or numbers that are all 0 or 1.
    NumPy's cast to bool would take any nonzero number, any non-empty text and a ragged list's
    rows as True, making up coalitions the caller never logged."""
    refuse_masked(name, value)
    try:
        raw = np.asarray(value)
    except (TypeError, ValueError) as error:
        raise InvalidArgumentError(f"{name} must be a boolean array (m, n_players): {error}") from None
    if raw.dtype != bool and not (raw.dtype.kind in "iuf" and np.isin(raw, (0, 1)).all()):
        raise InvalidArgumentError(f"{name} must be a boolean array (m, n_players) or one of 0s and 1s, got {raw.dtype}")
    return aligned(np.asarray(raw, dtype=bool, order="C"))


@checked
def empirical_from_traces(batch: Any, *, players: str = "agent", reward: str = "team", order: int = 1) -> tuple[Game, list[str]]:
    """The empirical game of a group of logged traces (say one GRPO group): each trace is the
    coalition of the players that took part (by ``players``: "agent", "role" or an event
    column), its ``reward`` channel the value. Returns the game and the player labels."""
    import pyarrow.compute as pc

    from masreplay.io import as_batch

    batch = as_batch(batch)
    offsets, labels, _, _ = _core.trace_players(batch._core, players)
    names = sorted(set(labels))
    column = {name: i for i, name in enumerate(names)}
    masks = np.zeros((len(batch), len(names)), dtype=bool)
    for t in range(len(batch)):
        for label in labels[offsets[t] : offsets[t + 1]]:
            masks[t, column[label]] = True
    values = pc.map_lookup(batch.to_arrow()["rewards"], reward, "first")
    if values.null_count:
        raise InvalidArgumentError(f"empirical_from_traces: {values.null_count} traces lack the reward channel {reward!r}")
    return empirical(masks, values.to_numpy(zero_copy_only=False), order=order), names


@dataclass(frozen=True)
class FunctionGame:
    """A batched Python callable as a game: ``f(masks) -> values`` with masks a boolean array
    (m, n_players); called with at most ``chunk_size`` distinct, not yet valued coalitions.
    ``canonical(masks) -> masks``, when given, declares which coalitions play the same: it
    maps each to the coalition it plays as, and coalitions with the same image are valued
    once."""

    f: Callable[[np.ndarray], Iterable[float]]
    n_players: int
    chunk_size: int = 1024
    canonical: Callable[[np.ndarray], np.ndarray] | None = None


def function(
    f: Callable[[np.ndarray], Iterable[float]],
    n_players: int,
    *,
    chunk_size: int = 1024,
    canonical: Callable[[np.ndarray], np.ndarray] | None = None,
) -> FunctionGame:
    """Wraps a batched callable for :func:`masreplay.shapley` (a plain callable works too,
    with ``n_players`` given to ``shapley``).

    ``canonical`` declares that absent players fall back to a default, so that some
    coalitions play as others: say player 0 orchestrates workers 1..n-1 and, without any
    worker, the team does what the empty team does; then
    ``canonical=lambda m: m & m[:, 1:].any(axis=1, keepdims=True)`` (keep player 0 only
    alongside a worker) makes the orchestrator-only coalition one evaluation with the empty one.
    """
    return FunctionGame(f, whole("n_players", n_players), whole("chunk_size", chunk_size), canonical)


def evaluate(game: Any, masks: np.ndarray, *, name: str = "game") -> np.ndarray:
    """Values of coalitions (boolean masks (m, n_players)) under a native game, a
    :class:`FunctionGame` or a plain callable on masks, checked to be m numbers; ``name``
    is the argument the game came as, for the refusal of something else."""
    if not (isinstance(masks, np.ndarray) and masks.dtype == bool and masks.ndim == 2):
        raise InvalidArgumentError(f"masks must be a boolean array (coalitions, players), got {type(masks).__name__} {masks!r}")
    refuse_masked("masks", masks)
    if isinstance(game, FunctionGame):
        f = game.f
    elif isinstance(game, Game):
        f = game.values
    elif callable(game):
        f = game
    else:
        raise wrong_type(name, "a masreplay game or a callable on boolean masks", game)
    returned = f(masks)
    if np.iscomplexobj(returned):
        raise InvalidArgumentError(f"the game returned complex values for {len(masks)} coalitions: a value is a real number")
    try:
        values = np.asarray(returned, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise InvalidArgumentError(
            f"the game returned a {type(returned).__name__} that is not an array of numbers: {error}"
        ) from None
    if values.shape != (len(masks),):
        raise InvalidArgumentError(f"the game returned shape {values.shape} for {len(masks)} coalitions")
    _core.check_game_values(values, "the game" if name == "game" else name, "a coalition")
    return values


@checked
def noisy(game: Game, sigma: float, *, seed: int = 0, chunk_size: int = 1 << 16) -> FunctionGame:
    """``game`` plus Gaussian evaluation noise of standard deviation ``sigma``, each call a
    fresh draw (the way a live rollout or a judge behaves): a test bed for
    ``shapley(..., noise=...)``. Deterministic given ``seed`` and the calls made."""
    if not isinstance(game, Game):
        raise wrong_type("noisy: game", "a masreplay game (masreplay.games)", game)
    if not (isinstance(sigma, (int, float)) and sigma >= 0):
        raise InvalidArgumentError(f"noisy: sigma must be a number >= 0, got {sigma!r}")
    rng = np.random.default_rng(whole("seed", seed))

    def draw(masks: np.ndarray) -> np.ndarray:
        return game.values(masks) + rng.normal(0.0, sigma, len(masks))

    return FunctionGame(draw, game.n_players, whole("chunk_size", chunk_size))


__all__ = [
    "FunctionGame",
    "Game",
    "additive",
    "empirical",
    "empirical_from_traces",
    "evaluate",
    "function",
    "noisy",
    "soum",
    "table",
    "weighted_voting",
]
