"""``masreplay report``: orchestration metrics of trace files, summarised per trace-length
band in the terminal and, optionally, drawn to a figure (needs matplotlib: the ``plot`` extra)."""

from __future__ import annotations

import os
import pathlib
import sys
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from masreplay._text import print_table
from masreplay.bands import LENGTH_BANDS
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


def plot(table: pa.Table, path: str | os.PathLike[str], title: str = "") -> pathlib.Path:
    """Distributions of the main metrics per band, and critical path against total work.
    Writes exactly ``path`` (PNG unless its suffix names another format) and returns it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import LogLocator, ScalarFormatter
    except ImportError as error:
        raise ImportError("--plot needs matplotlib: pip install 'masreplay[plot]' (or pip install matplotlib)") from error
    target = pathlib.Path(path)
    shown = ("parallelism_efficiency", "critical_steps", "finish_rate", "protocol_overhead", "utilization")
    masks = _band_masks(table)
    names = [_band_name(b) for b in masks]
    figure, axes = plt.subplots(2, 3, figsize=(15, 8))
    figure.suptitle(title or f"{len(table):,} traces")
    for ax, column in zip(axes.flat, shown, strict=False):  # the sixth axis holds the scatter below
        ax.set_title(column)
        data = [table[column].filter(mask).drop_null().to_numpy() for mask in masks.values()]
        _no_data_if_empty(ax, data, names)
    scatter = axes.flat[-1]
    for band, mask in masks.items():
        rows = table.filter(mask)
        scatter.scatter(rows["total_work_steps"], rows["critical_path_steps"], s=4, alpha=0.5, label=_band_name(band))
    if len(table):
        scatter.set_xscale("log")
        scatter.set_yscale("log")
        for axis in (scatter.xaxis, scatter.yaxis):
            # Plain numbers at 1-2-5 steps: the default labels every minor tick with a power of ten,
            # which overlaps when the data spans less than a decade.
            axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(ScalarFormatter())
            axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        scatter.legend(title="events per trace")
    else:
        scatter.text(0.5, 0.5, "no data", ha="center", va="center", transform=scatter.transAxes, color="grey")
    scatter.set_xlabel("total work (events)")
    scatter.set_ylabel("critical path (events)")
    figure.tight_layout()
    figure.savefig(target, dpi=100, format=target.suffix[1:].lower() or "png")
    plt.close(figure)
    return target


def _no_data_if_empty(ax, data: list, names: list[str]) -> None:
    """A box per band; a band (or the whole panel) without values says "no data" instead of
    staying silently empty. Band names are turned when there are many, so they never overlap."""
    if not any(len(values) for values in data):
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")
        ax.set_xticks([])
        return
    ax.boxplot([values if len(values) else [float("nan")] for values in data], showfliers=False)
    ax.set_xticks(
        range(1, len(names) + 1), names, rotation=30 if len(names) > 3 else 0, ha="right" if len(names) > 3 else "center"
    )
    low, _ = ax.get_ylim()
    for position, values in enumerate(data, 1):
        if not len(values):
            ax.text(position, low, "no data", ha="center", va="bottom", color="grey", fontsize=8)
    ax.set_xlabel("events per trace")


def run(paths: Sequence[str], plot_path: str | None = None) -> int:
    table = collect(paths)
    print(f"{len(table):,} traces from {len(paths)} file(s); mean per trace-length band:")
    print_table(band_summary(table))
    if plot_path is not None:
        inputs = ", ".join(pathlib.Path(path).name for path in paths[:3]) + (
            f" and {len(paths) - 3} more" if len(paths) > 3 else ""
        )
        written = plot(table, plot_path, title=f"{inputs}: {len(table):,} traces")
        print(f"figure written to {written}")
    return 0
