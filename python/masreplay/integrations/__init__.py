"""Trainer integrations: masreplay's advantages handed to verl, TRL or a plain PyTorch loop.

- :mod:`masreplay.integrations.torch`: ``expand_to_tokens`` (per-row advantages -> (rows, L)
  token advantages, zero where the mask is 0);
- :mod:`masreplay.integrations.verl`: an estimator in verl's registry (uid-only use) and a
  compute-advantage step for full traces, rows matched by the trace/event ids the agent
  loop carries;
- :mod:`masreplay.integrations.trl`: a ``GRPOTrainer`` subclass that replaces the advantages.

torch, verl and TRL stay optional: each module imports its package when used and says which
one is missing. :func:`align_rows` is the trainer-independent part.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from masreplay.errors import InvalidArgumentError


def align_rows(
    advantages: Any,
    trace_ids: Sequence[str],
    event_ids: Sequence[str | None] | None = None,
    *,
    batch: Any,
) -> np.ndarray:
    """The advantage of each trainer row: a row is a trace (``event_ids`` None: its
    ``per_trace`` value) or one event of a trace, e.g. one agent step the policy generated
    (its ``per_event`` value). ``advantages`` is what :func:`masreplay.advantages` returned
    for ``batch``. Unknown ids raise :class:`~masreplay.InvalidArgumentError`.
    """
    ids = batch.trace_ids
    trace_position = {trace_id: i for i, trace_id in enumerate(ids)}
    missing = [t for t in trace_ids if t not in trace_position]
    if missing:
        raise InvalidArgumentError(f"{len(missing)} rows name traces not in the batch (first: {missing[0]!r})")
    traces = np.fromiter((trace_position[t] for t in trace_ids), dtype=np.int64, count=len(trace_ids))
    if event_ids is None:
        return advantages.per_trace[traces]
    if len(event_ids) != len(trace_ids):
        raise InvalidArgumentError(f"{len(event_ids)} event ids for {len(trace_ids)} rows")
    events = batch.events()
    event_position = {
        (int(t), e): k for k, (t, e) in enumerate(zip(events["trace_index"].to_numpy(), events["id"].to_pylist(), strict=True))
    }
    out = np.empty(len(trace_ids), dtype=advantages.per_event.dtype)
    for row, (trace, event) in enumerate(zip(traces, event_ids, strict=True)):
        if event is None:
            out[row] = advantages.per_trace[trace]
            continue
        position = event_position.get((int(trace), event))
        if position is None:
            raise InvalidArgumentError(f"trace {ids[trace]!r} has no event {event!r}")
        out[row] = advantages.per_event[position]
    return out
