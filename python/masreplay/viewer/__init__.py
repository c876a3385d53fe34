"""The trace viewer: one self-contained HTML page per trace (no network at view time).

Agent lanes over time in spawn-tree order, edges by type, the critical path, events coloured
by credit on a two-sided scale centred on 0, the trace's GRPO siblings as small multiples and
its branch rollouts at their branch points. The drawing is this package's own SVG and
JavaScript (``assets/``), inlined into the page.

The page's contract for other tools: every event mark is one element with
``data-event-id``; marks on the critical path carry ``data-critical="true"``; coloured marks
carry ``data-credit`` (the number they are coloured by).
"""

from __future__ import annotations

import html
import json
import os
import re
from importlib import resources
from typing import Any

import numpy as np
import pyarrow.compute as pc

from masreplay._args import flag
from masreplay.advantages import advantages
from masreplay.batch import TraceBatch
from masreplay.errors import InvalidArgumentError
from masreplay.event_credit import EventCredit, resolve
from masreplay.io import write_text
from masreplay.orchestration import metrics
from masreplay.viewer._model import attach_branches, colour_scale, trace_data

ASSETS = ("viewer.css", "viewer.js")
#: The template's slots, filled in one pass by ``TraceView.to_html``.
_SLOT = re.compile(r"/\*masreplay:(?:css|data|js)\*/|masreplay:title")
#: "<", ">" and "&" of the embedded JSON as JSON escapes, which JSON.parse reads back unchanged:
#: no trace text can then end the data's script element ("</script") or switch the parser
#: into its escaped states ("<!--").
_INERT_IN_SCRIPT = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


def _asset(name: str) -> str:
    return (resources.files("masreplay.viewer") / "assets" / name).read_text(encoding="utf-8")


class TraceView:
    """A rendered trace: ``to_html()`` gives the page, ``save(path)`` writes it, and Jupyter
    shows it inline (``_repr_html_``, in a sandboxed iframe so its scripts run)."""

    def __init__(self, data: dict[str, Any]) -> None:
        #: What the page embeds (traces, colour scale): plain JSON-ready Python.
        self.data = data

    @property
    def trace_id(self) -> str:
        return self.data["current"]

    def to_html(self) -> str:
        payload = json.dumps(self.data, separators=(",", ":"), allow_nan=False).translate(_INERT_IN_SCRIPT)
        slots = {
            "/*masreplay:css*/": _asset("viewer.css"),
            "/*masreplay:data*/": payload,
            "/*masreplay:js*/": _asset("viewer.js"),
            "masreplay:title": html.escape(f"masreplay · {self.trace_id}"),
        }
        # One pass over the template: what fills a slot (a trace's own text) is never searched
        # for other slots.
        return _SLOT.sub(lambda found: slots[found.group(0)], _asset("viewer.html"))

    def save(self, path: str | os.PathLike[str]) -> None:
        write_text(path, self.to_html())

    def _repr_html_(self) -> str:
        return (
            f'<iframe srcdoc="{html.escape(self.to_html(), quote=True)}" sandbox="allow-scripts" '
            'style="width:100%;height:640px;border:1px solid #ddd"></iframe>'
        )

    def __repr__(self) -> str:
        shown = len(self.data["traces"])
        return f"TraceView({self.trace_id!r}, {shown} trace{'s' if shown != 1 else ''} embedded)"


def _position(batch: TraceBatch, trace: int | str) -> int:
    if isinstance(trace, str):
        try:
            return batch.trace_ids.index(trace)
        except ValueError:
            raise InvalidArgumentError(f"no trace {trace!r} in the batch") from None
    if isinstance(trace, (int, np.integer)) and not isinstance(trace, bool):
        n = len(batch)
        if not -n <= int(trace) < n:
            raise InvalidArgumentError(f"trace index {int(trace)} out of range for a batch of {n} traces")
        return int(trace) % n
    raise InvalidArgumentError(f"trace must be an index or a trace id, got {type(trace).__name__}")


def _family(batch: TraceBatch, position: int, group: bool) -> tuple[list[int], list[int]]:
    """The traces a view embeds, in batch order: the viewed one, its GRPO group (with
    ``group``), and the branch rollouts of any of them or the factual trace of a branch.
    Also returns the siblings drawn as small multiples (the group's rollouts, branches aside)."""
    table = batch.to_arrow()
    group_ids = table["group_id"].to_pylist()
    origins = [o["trace_id"] if o else None for o in table["counterfactual_of"].to_pylist()]
    ids = batch.trace_ids
    members = {i for i, g in enumerate(group_ids) if g == group_ids[position]} if group else {position}
    if origins[position] is not None and origins[position] in ids:
        members.add(ids.index(origins[position]))
    named = {ids[i] for i in members}
    members |= {i for i, origin in enumerate(origins) if origin in named}
    family = sorted(members)
    siblings = [i for i in family if origins[i] is None] if group else [i for i in family if i == position]
    return family, siblings


def _rows(batch: TraceBatch, positions: list[int]) -> np.ndarray:
    """Event rows of the traces at ``positions``, in order."""
    offsets = batch.event_offsets
    return np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in positions]) if positions else np.zeros(0, np.int64)


def view(batch: TraceBatch, trace: int | str, *, color: str | None = None, credit: Any = None, group: bool = True) -> TraceView:
    """The viewer page of one trace of ``batch`` (``trace``: an index or a trace id).

    ``color``: ``"advantage"`` (GRPO over the trace's group), ``"shapley"`` (spawn-tree
    Shapley of the agents, valued by the empirical game of the trace's group),
    ``"counterfactual"`` (branch rollouts in the batch, else same-prefix divergence within
    the group), or a numeric event column or per-event reward channel; with ``credit``, the
    name the legend gives it (or the table column to colour by). ``credit``: per-event
    values aligned with ``batch.events()`` (an array, :class:`~masreplay.Advantages`,
    :class:`~masreplay.TraceCredit`) or a table with trace_id, event_id and credit columns
    (stderr optional). Neither: events coloured by type. ``group``: embed the trace's GRPO
    siblings, one click away.
    """
    if not isinstance(batch, TraceBatch):
        raise InvalidArgumentError(f"batch must be a TraceBatch, got {type(batch).__name__}")
    position = _position(batch, trace)
    family, siblings = _family(batch, position, flag("view: group", group))
    shown = batch[family]
    colouring: EventCredit | None = (
        resolve(batch, color, credit).take(_rows(batch, family)) if credit is not None else resolve(shown, color, None)
    )
    sibling_batch = batch[siblings]
    has_team = pc.any(pc.is_valid(pc.map_lookup(sibling_batch.to_arrow()["rewards"], "team", "first"))).as_py()
    sibling_advantage = advantages(sibling_batch, missing="skip", dtype="float64").per_trace if has_team else None
    advantage_of = {} if sibling_advantage is None else {b: float(a) for b, a in zip(siblings, sibling_advantage, strict=True)}
    metric_rows = metrics(shown).to_pylist()
    offsets = shown.event_offsets
    traces = []
    for k, batch_index in enumerate(family):
        rows = slice(int(offsets[k]), int(offsets[k + 1]))
        traces.append(trace_data(shown[k], colouring, rows, metric_rows[k], advantage_of.get(batch_index)))
    attach_branches(traces)
    return TraceView(
        {
            "version": 1,
            "current": batch.trace_ids[position],
            "siblings": [batch.trace_ids[i] for i in siblings],
            "scale": colour_scale(colouring),
            "traces": traces,
        }
    )


__all__ = ["TraceView", "view"]
