"""``masreplay report``: orchestration metrics of trace files, summarised per trace-length
band in the terminal and, optionally, drawn to a figure (needs matplotlib: the ``plot`` extra)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from masreplay.buffer import LENGTH_BANDS
from masreplay.io import load_traces
from masreplay.orchestration import metrics

#: The metrics the per-band table shows (the mean over the band's traces, nulls skipped).
SUMMARY_COLUMNS = (
    "critical_path_steps",
    "critical_path_s",
    "total_work_steps",
    "parallelism_efficiency",
    "critical_steps",
    "finish_rate",
    "idle_agents",
    "utilization",
    "protocol_overhead",
    "message_redundancy",
    "error_amplification",
    "max_concurrent_agents",
    "spawn_count",
    "spawn_depth",
)

#: Traces measured per progress update.
CHUNK = 100_000


def _band_name(band: int | None) -> str:
    return f"<= {band:,}" if band is not None else f"> {LENGTH_BANDS[-1]:,}"


def band_summary(table: pa.Table) -> list[list[str]]:
    """Rows of text: a header of bands, the trace count, then one mean per metric and band.
    Only bands that hold traces get a column."""
    masks = _band_masks(table)
    rows = [["events per trace", *(_band_name(b) for b in masks)]]
    rows.append(["traces", *(f"{pc.sum(mask).as_py():,}" for mask in masks.values())])
    for column in SUMMARY_COLUMNS:
        means = [pc.mean(table[column].filter(mask)).as_py() for mask in masks.values()]
        rows.append([column, *("-" if m is None else f"{m:.3f}" for m in means)])
    return rows


def _band_masks(table: pa.Table) -> dict[int | None, pa.ChunkedArray]:
    """Band (None: above the largest) -> which rows of the metrics table are in it; only
    bands that hold traces."""
    bands = table["length_band"]
    masks = {b: pc.fill_null(pc.equal(bands, b), False) for b in LENGTH_BANDS}
    masks[None] = pc.is_null(bands)
    return {band: mask for band, mask in masks.items() if pc.any(mask).as_py()}


def print_table(rows: Sequence[Sequence[str]], indent: str = "  ") -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        print(indent + "  ".join(cells))


def collect(paths: Sequence[str]) -> pa.Table:
    """The metrics of every trace of every file, with a progress line on a terminal."""
    show = sys.stderr.isatty()
    tables, done = [], 0
    for index, path in enumerate(paths, 1):
        batch = load_traces(path)
        chunks = [batch] if len(batch) <= CHUNK else [batch[s : s + CHUNK] for s in range(0, len(batch), CHUNK)]
        for chunk in chunks:
            tables.append(metrics(chunk))
            done += len(chunk)
            if show:
                print(f"\r  metrics: file {index}/{len(paths)}, {done:,} traces", end="", file=sys.stderr, flush=True)
    if show:
        print(file=sys.stderr)
    return pa.concat_tables(tables) if tables else metrics([])


def plot(table: pa.Table, path: str | os.PathLike[str]) -> None:
    """Distributions of the main metrics per band, and critical path against total work."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError(
            "masreplay report --plot needs matplotlib: pip install 'masreplay[plot]' (or pip install matplotlib)"
        ) from error
    shown = ("parallelism_efficiency", "critical_steps", "finish_rate", "protocol_overhead", "utilization")
    masks = _band_masks(table)
    figure, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax, column in zip(axes.flat, shown, strict=False):
        data = [table[column].filter(mask).drop_null().to_numpy() for mask in masks.values()]
        ax.boxplot(data, tick_labels=[_band_name(b) for b in masks], showfliers=False)
        ax.set_title(column)
        ax.set_xlabel("events per trace")
    scatter = axes.flat[-1]
    for band, mask in masks.items():
        rows = table.filter(mask)
        scatter.scatter(rows["total_work_steps"], rows["critical_path_steps"], s=4, alpha=0.5, label=_band_name(band))
    scatter.set_xscale("log")
    scatter.set_yscale("log")
    scatter.set_xlabel("total work (events)")
    scatter.set_ylabel("critical path (events)")
    scatter.legend(title="events per trace")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def run(paths: Sequence[str], plot_path: str | None = None) -> int:
    table = collect(paths)
    print(f"{len(table):,} traces from {len(paths)} file(s); mean per trace-length band:")
    print_table(band_summary(table))
    if plot_path is not None:
        plot(table, plot_path)
        print(f"figure written to {plot_path}")
    return 0
