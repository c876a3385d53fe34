"""Plain-text output for the terminal, shared by the masreplay command, its demo and its
report: a batch's shape statistics as rows, and the printer of rows as aligned columns."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import pyarrow.compute as pc

from masreplay.batch import TraceBatch


def stats_table(batch: TraceBatch) -> list[tuple[str, str]]:
    """Shape statistics of a batch as (name, value) rows."""
    table = batch.to_arrow()
    rows: list[tuple[str, str]] = [("traces", str(len(batch))), ("events", str(batch.num_events))]
    rows.append(("edges", str(int(batch.edge_offsets[-1]))))
    rows.append(("groups", str(len(pc.unique(table["group_id"])))))
    for column in ("n_events", "n_agents", "depth", "max_branching"):
        values = table[column]
        if len(values) == 0:
            continue
        low, high = pc.min(values).as_py(), pc.max(values).as_py()
        mean = pc.mean(values).as_py()
        rows.append((f"{column} min/mean/max", f"{low} / {mean:.1f} / {high}"))
    counts = pc.value_counts(pc.dictionary_decode(batch.events()["type"].combine_chunks())) if batch.num_events else []
    for entry in sorted(counts.to_pylist() if counts else [], key=lambda e: -e["counts"]):
        rows.append((f"events of type {entry['values']}", str(entry["counts"])))
    return rows


def print_table(rows: Sequence[Sequence[str]], *, values: Literal["right", "left"] = "right", indent: str = "  ") -> None:
    """Prints rows of text cells as columns, names (the first cell) left-aligned.

    ``values="right"`` right-aligns the other cells so that numbers line up; ``"left"``
    suits free text (the last cell is not padded, so no line ends in spaces)."""
    if not rows:
        return
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        if values == "right":
            cells = [row[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        else:
            cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths[:-1], strict=True)] + [row[-1]]
        print(indent + "  ".join(cells))
