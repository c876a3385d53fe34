"""Counterfactual credit: what an event earned, against rollouts that did something else there.

- :func:`counterfactual_credit` reads branch rollouts (traces that declare
  ``counterfactual_of``) and credits each branched event R(factual) - mean R(branches).
- :func:`same_prefix_credit` merges a group's traces into a prefix tree and credits the
  decisions where sibling traces diverge (spawn or not, which tool, which message).
- :func:`difference_rewards` is v(N) - v(N without i) (or with i replaced by a default) on any
  game; :func:`coma_credit` is COMA's counterfactual baseline from user-supplied Q values.

The credit tables are aligned row for row with ``batch.events()``: an event without
alternatives has NaN credit and ``n_branches`` 0, never an invented value. Their ``credit``
column is per-event credit ready for the advantage estimators. With ``aligned=False`` they
hold the credited events only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from masreplay import _core
from masreplay._args import I32_MAX, checked, numbers, unsummable, whole
from masreplay.batch import TraceBatch
from masreplay.buffer import GraphBuffer
from masreplay.errors import InvalidArgumentError
from masreplay.games import FunctionGame, Game, evaluate
from masreplay.vocabulary import Baseline

#: Columns of every credit table, in order.
CREDIT_COLUMNS = ("trace_id", "event_id", "agent", "type", "credit", "stderr", "n_branches")


def _batch_of(data: TraceBatch | GraphBuffer) -> TraceBatch:
    if isinstance(data, GraphBuffer):
        return data.to_batch()
    if isinstance(data, TraceBatch):
        return data
    raise InvalidArgumentError(f"expected a TraceBatch or a GraphBuffer, got {type(data).__name__}")


def _credit_table(batch: TraceBatch, arrays: tuple[np.ndarray, ...], aligned: bool) -> pa.Table:
    """The credit table: every event of the batch (``aligned``), or only the credited ones."""
    events, traces, credit, stderr, n_branches = arrays
    if aligned:
        offsets = batch.event_offsets
        n_events = int(offsets[-1])
        rows = None
        full = np.full(n_events, np.nan), np.full(n_events, np.nan), np.zeros(n_events, dtype=np.uint32)
        for column, values in zip(full, (credit, stderr, n_branches), strict=True):
            column[events] = values
        credit, stderr, n_branches = full
        trace_index = np.repeat(np.arange(len(batch), dtype=np.int32), np.diff(offsets))
    else:
        rows = pa.array(events)
        trace_index = traces.view(np.int32)  # trace rows are below 2**31

    def field(name: str) -> pa.Array:
        values = batch._event_array(name)
        return values if rows is None else values.take(rows)

    # The ids of a few events among millions: gathered by the core, which requests each
    # one's offsets and bytes ahead (a take waits for them one event after the other).
    event_id = field("id") if rows is None else pa.array(batch._core.event_ids_at(events))

    # trace_id as a dictionary over the batch's ids: no string is copied per event.
    trace_id = pa.DictionaryArray.from_arrays(pa.array(trace_index), pa.array(batch._core.trace_field("trace_id")))
    return pa.table(
        {
            "trace_id": trace_id,
            "event_id": event_id,
            "agent": field("agent"),
            "type": field("type"),
            "credit": credit,
            "stderr": stderr,
            "n_branches": n_branches,
        }
    )


@checked
def counterfactual_credit(
    batch_or_buffer: TraceBatch | GraphBuffer,
    *,
    channel: str = "team",
    baseline: Baseline = "mean",
    aligned: bool = True,
) -> pa.Table:
    """Credit of every event that has branch rollouts in the batch (or the whole buffer).

    ``baseline="mean"``: credit = R(factual) - mean R(branches), stderr = s * sqrt(1 + 1/n)
    * t(n - 1) / 1.96 with s the branches' standard deviation (NaN below two branches): the
    Student-t factor makes credit +- 1.96 stderr a 95% interval however few the branches
    (calibrated where branches replicate one intervention, ``ablate``/``no_spawn``;
    conservative for ``substitute``, whose branches' spread includes the alternatives'). ``baseline="loo"`` (C3):
    every alternative at the event is credited against the mean of the others, so a branch's
    own version of the event is credited too (an ablated event has none). Branches whose
    factual trace is not in the batch are left out; a branch naming an event its factual
    trace lacks is an error. Only the traces credit is measured from (factual traces with
    branches, and their branches) need a reward on ``channel``. Every row of a branch is one
    rollout. A factual trace held more than once (a sample drawn with replacement) is one
    trace: every copy gets the credit measured against all the branches of its id, wherever
    they are stored, and copies that differ in reward are an error naming the trace.
    """
    batch = _batch_of(batch_or_buffer)
    arrays = _core.counterfactual_credit(batch._core, channel=channel, baseline=baseline)
    return _credit_table(batch, arrays, aligned)


@checked
def same_prefix_credit(
    batch: TraceBatch,
    *,
    channel: str = "team",
    signature: Sequence[str] | None = None,
    importance_weighting: bool = True,
    aligned: bool = True,
) -> pa.Table:
    """Credit of the decisions where traces of one group diverge after a shared prefix.

    Events are matched by ``signature`` (default ``("type", "agent", "role", "tool",
    "content_ref")``; any of those plus ``from`` and ``to``). At a divergence, the first event
    of each branch gets Q(branch) - V: the mean reward below the branch minus the mean over
    every trace through the node; ``n_branches`` is the number of sibling traces (the others
    through the node). When every diverging event logs ``logprob`` and ``importance_weighting``
    is on, traces are weighted by 1 / p(decision) in V, removing the behaviour policy's
    preference from the baseline. The credit is a weighted sum of the node's rewards,
    sum a_i R_i (without weights a_i = 1/n_branch - 1/n_node inside the branch, -1/n_node
    outside); stderr is s * sqrt(sum a_i^2) * t(dof) / 1.96, with s the reward noise pooled
    within the node's alternatives (dof = traces - alternatives), so credit +- 1.96 stderr is
    a 95% interval. When every alternative was taken once, the spread over the node stands in
    (wider).
    ``aligned=False`` keeps only the credited events.
    """
    batch = _batch_of(batch)
    fields = None if signature is None else [str(field) for field in signature]
    arrays = _core.same_prefix_credit_arrays(
        batch._core, channel=channel, signature=fields, importance_weighting=importance_weighting
    )
    return _credit_table(batch, arrays, aligned)


#: A masreplay game, a games.function wrapper, or a callable on boolean masks.
GameLike = Game | FunctionGame | Callable[[np.ndarray], Any]


@checked
def difference_rewards(
    game: GameLike,
    players: Sequence[int] | None = None,
    *,
    n_players: int | None = None,
    replaced: GameLike | None = None,
) -> np.ndarray:
    """Difference rewards D_i = v(N) - v(N without i) for each of ``players`` (default: all).

    ``game`` is a masreplay game (``masreplay.games``) or any callable mapping boolean masks
    (m, n_players) to m values.
    With ``replaced``, the substitution form: D_i = v(N) - replaced(mask without i), where
    ``replaced`` evaluates a team in which a False player acts with its default instead of
    being absent. One batched evaluation of n + 1 coalitions.
    """
    n = n_players if n_players is not None else getattr(game, "n_players", None)
    if n is None:
        raise InvalidArgumentError("n_players is needed for a game that does not say how many players it has")
    # The masks are (players + 1, n) booleans: a count beyond what a trace can hold would ask
    # for exabytes and fail as a MemoryError.
    n = whole("difference_rewards: n_players", n, high=I32_MAX)
    chosen = np.arange(n) if players is None else numbers("players", players, np.int64)
    if chosen.ndim != 1 or (chosen.size and (chosen.min() < 0 or chosen.max() >= n)):
        raise InvalidArgumentError(f"players must be indices in [0, {n}), got {players!r}")
    without = np.ones((len(chosen), n), dtype=bool)
    without[np.arange(len(chosen)), chosen] = False
    full = evaluate(game, np.ones((1, n), dtype=bool))[0]
    if replaced is None:
        return full - evaluate(game, without)
    return full - evaluate(replaced, without, name="replaced")


def coma_credit(q_values: np.ndarray, probabilities: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """COMA's counterfactual advantage per decision: Q(chosen) - sum_a pi(a) Q(a).

    ``q_values`` and ``probabilities`` are (decisions, alternatives); a decision with fewer
    alternatives pads with probability 0 (its Q may be NaN there). ``chosen`` is the index of
    the alternative taken. Probabilities must be >= 0 and sum to 1 per row.
    """
    q = numbers("q_values", q_values)
    pi = numbers("probabilities", probabilities)
    taken = numbers("chosen", chosen, np.int64)
    if q.ndim != 2 or q.shape != pi.shape or taken.shape != (q.shape[0],):
        raise InvalidArgumentError(
            f"q_values and probabilities must be (decisions, alternatives) and chosen (decisions,); "
            f"got {q.shape}, {pi.shape}, {taken.shape}"
        )
    if taken.size and (taken.min() < 0 or taken.max() >= q.shape[1]):
        raise InvalidArgumentError(f"chosen must index the {q.shape[1]} alternatives")
    if (pi < 0).any() or not np.allclose(pi.sum(axis=1), 1.0, atol=1e-6):
        raise InvalidArgumentError("probabilities must be >= 0 and sum to 1 in every row")
    if np.isnan(q[pi > 0]).any():
        raise InvalidArgumentError("an alternative with probability > 0 has no Q value")
    rows = np.arange(q.shape[0])
    if np.isnan(q[rows, taken]).any():
        raise InvalidArgumentError("a chosen alternative has no Q value")
    # Q values are summed: the README's bound on such numbers keeps the advantage finite.
    read = np.concatenate([q[pi > 0], q[rows, taken]])
    beyond = read[unsummable(read, missing=False)]
    if len(beyond):
        raise InvalidArgumentError(f"q_values must be finite and of magnitude below 2^49 where they are read, got {beyond[0]:g}")
    baseline = np.where(pi > 0, pi * np.nan_to_num(q), 0.0).sum(axis=1)
    return q[rows, taken] - baseline
