"""An asynchronous RL loop around masreplay.ray on one machine (a local Ray).

Rollout workers (Ray tasks) generate traces with the policy version they were given and add
them to a RayGraphBuffer through a BufferWriter; the trainer samples GRPO groups no more than
MAX_STALENESS versions old, "trains", advances the version and evicts what became too stale.
Run:

    pip install "masreplay[ray]"
    python examples/ray_buffer.py
"""

from __future__ import annotations

import os
import tempfile

# One machine: Ray's single-machine mode keeps it on the loopback address (set before import).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import numpy as np
import pyarrow as pa
import ray

import masreplay
from masreplay.ray import RayGraphBuffer

MAX_STALENESS = 2
STEPS = 4


def replace(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, values)


@ray.remote(num_cpus=0.5)
def rollout(buffer: RayGraphBuffer, worker: int, step: int, policy_version: int) -> int:
    """One worker's rollouts: 4 rounds of 4 prompts x 4 samples, tagged with the policy that
    made them, added through a writer (it sends each shard's traces once 16 wait, without
    waiting for the shards, and its exit waits until every trace has landed)."""
    with buffer.writer(flush_traces=16) as writer:
        for part in range(4):
            table = pa.table(masreplay.sim.generate(16, group_size=4, seed=1000 * step + 10 * worker + part))
            # Ids and groups unique to this worker, step and round (the simulator numbers from 0).
            name = f"w{worker}-s{step}-r{part}"
            table = replace(table, "trace_id", pa.array([f"{name}-{i}" for i in range(16)]))
            table = replace(table, "group_id", pa.array([f"{name}-g{i // 4}" for i in range(16)]))
            writer.add(replace(table, "policy_version", pa.array([policy_version] * 16, pa.int64())))
    return writer.added


def main() -> None:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    buffer = RayGraphBuffer(10_000, shards=2, seed=0, max_staleness=MAX_STALENESS)
    for step in range(STEPS):
        # Rollouts of this step run while the trainer works on what is already stored.
        pending = [rollout.remote(buffer, worker, step, buffer.policy_version) for worker in range(4)]
        ray.get(pending)
        batch = buffer.sample_groups(8, group_size=4)
        rewards = batch.to_arrow()["rewards"].to_pylist()
        team = np.array([dict(r).get("team", 0.0) for r in rewards])
        print(
            f"step {step}: {len(buffer)} traces stored, trained on {len(batch)} traces "
            f"(versions {sorted(set(batch.to_arrow()['policy_version'].to_pylist()))}), mean reward {team.mean():.3f}"
        )
        buffer.advance(step + 1)
        print(f"  policy version {step + 1}: evicted {buffer.evict_stale()} stale traces")
    with tempfile.TemporaryDirectory() as directory:
        buffer.save(directory)
        print(f"saved {len(RayGraphBuffer.load(directory))} traces in {buffer.shards} shard files")
    ray.shutdown()


if __name__ == "__main__":
    main()
