"""Before/after figures of one change: masreplay's side of every benchmark suite, as CPU time
(``time.process_time``, one Rayon thread: less sensitive to other processes than wall time)
per call, the median of REPS calls. Run it for each build in turn, alternating, several
rounds (a shared machine drifts), with each build's package first on the path:

    PYTHONPATH=/path/to/build/python python benches/compare_builds.py LABEL REPS [NAME_PART ...]

It prints one tab-separated line per operation: label, operation, median ms, best ms. NAME_PART
keeps only the operations whose name contains it. Anchors are not timed (a restructuring does
not change them); the suites themselves compare against them.
"""

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable

os.environ.setdefault("RAYON_NUM_THREADS", "1")

import numpy as np
import pyarrow.parquet as pq

import masreplay
from masreplay import GraphBuffer


def operations(folder: str) -> dict[str, Callable[[], object]]:
    """One call of each suite's masreplay side, on data built once."""
    rng = np.random.default_rng(0)
    batch = masreplay.sim.generate(20_000, seed=21, agents=(4, 8), events_per_agent=(3, 8))
    table = batch.to_arrow()
    pq.write_table(table, f"{folder}/traces.parquet")
    with open(f"{folder}/traces.jsonl", "w") as lines:
        lines.write("\n".join(json.dumps(trace) for trace in masreplay.sim.generate(2_000, seed=5)))
    values = rng.standard_normal(1_000_000)
    groups = np.repeat(np.arange(1_000_000 // 8), 8)
    shuffled = rng.permutation(groups)
    truth = masreplay.sim.branches(5_000, seed=3)
    filled = GraphBuffer(100_000)
    filled.add(batch)
    small_teams = masreplay.sim.generate(300, seed=7, agents=(3, 5))
    return {
        "advantages.group_normalize 1e6 rows": lambda: masreplay.group_normalize(values, groups),
        "advantages.group_normalize 1e6 shuffled": lambda: masreplay.group_normalize(values, shuffled),
        "advantages(batch, normalize_by=agent)": lambda: masreplay.advantages(batch, normalize_by="agent"),
        "metrics(batch)": lambda: masreplay.metrics(batch),
        "ingest load_traces(arrow)": lambda: masreplay.load_traces(table),
        "ingest load_traces(parquet)": lambda: masreplay.load_traces(f"{folder}/traces.parquet"),
        "ingest load_traces(jsonl)": lambda: masreplay.load_traces(f"{folder}/traces.jsonl"),
        "buffer add 20k traces": lambda: GraphBuffer(100_000).add(batch),
        "buffer sample(256) x100": lambda: [filled.sample(256) for _ in range(100)],
        "buffer sample_groups(32, 4) x100": lambda: [filled.sample_groups(32, group_size=4) for _ in range(100)],
        "counterfactual_credit(5k traces)": lambda: masreplay.counterfactual_credit(truth.batch),
        "trace_shapley(300 traces)": lambda: masreplay.trace_shapley(
            small_teams, lambda trace, masks: masks.sum(axis=1).astype(float)
        ),
        "shapley permutation n=30": lambda: masreplay.shapley(
            lambda coalitions: coalitions.sum(axis=1) ** 1.5, 30, method="permutation", budget=20_000, seed=1
        ),
        "trace_players(batch)": lambda: masreplay.trace_players(batch),
    }


def main(label: str, reps: int, only: list[str]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        for name, operation in operations(folder).items():
            if only and not any(part in name for part in only):
                continue
            try:
                operation()
            except Exception as error:  # an API the older build lacks
                print(f"{label}\t{name}\tERROR {type(error).__name__}: {str(error)[:80]}", flush=True)
                continue
            times = []
            for _ in range(reps):
                start = time.process_time()
                operation()
                times.append(time.process_time() - start)
            times.sort()
            print(f"{label}\t{name}\t{times[len(times) // 2] * 1e3:.2f}\t{times[0] * 1e3:.2f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
