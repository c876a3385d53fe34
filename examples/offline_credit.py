"""Offline credit over a Parquet dump: generate rollouts with branch rollouts, write them as a
dump of several files (groups cut across files), compute agent-wise GRPO advantages, branch
credit and orchestration metrics with ``masreplay.credit_dump`` in bounded memory, and read
the result back with Polars (no masreplay code needed to read it). Needs polars.

    python examples/offline_credit.py [WORKDIR]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq

import masreplay


def main(workdir: Path) -> None:
    try:
        import polars as pl
    except ImportError:
        raise SystemExit("this example needs the 'polars' package (pip install polars)") from None
    dump = workdir / "dump"
    dump.mkdir(parents=True, exist_ok=True)
    rollouts = masreplay.sim.branches(200, branches=4, branch_points=2, group_size=8, seed=0).batch.to_arrow()
    third = rollouts.num_rows // 3
    for i in range(3):  # a dump as a trainer writes it: several files, small row groups
        pq.write_table(rollouts.slice(i * third, third if i < 2 else None), dump / f"step-{i}.parquet", row_group_size=64)

    summary = masreplay.credit_dump(
        dump,
        workdir / "credit",
        advantages={"normalize_by": "agent"},
        counterfactual=True,
        metrics=True,
        memory_limit="256MB",
    )
    print(summary)

    events = pl.read_parquet(workdir / "credit" / "events" / "*.parquet")
    traces = pl.read_parquet(workdir / "credit" / "traces" / "*.parquet")
    print(events.group_by("agent").agg(pl.col("advantage").mean(), pl.col("weight").sum(), pl.len()).sort("agent").head(5))
    print(events.filter(pl.col("n_branches") > 0).select("trace_id", "event_id", "credit", "stderr").head(5))
    print(traces.select("trace_id", "advantage", "critical_path_steps", "parallelism_efficiency").head(5))


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as folder:
            main(Path(folder))
