"""Runs one fuzz target for a time budget (``python fuzz_worker.py TARGET SECONDS``); started
by test_fuzz.py in a subprocess, so that a crash is a failed test and not a dead runner.

Each target feeds hypothesis-made inputs to one input form and accepts two outcomes only: a
masreplay error, or a result that is valid Arrow and reads back. Anything else (a builtin
exception, a PanicException, a crash) fails."""

from __future__ import annotations

import copy
import json
import math
import pickle
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import masreplay
from masreplay import GraphBuffer
from masreplay.batch import _from_ipc, _to_ipc
from masreplay.buffer import _buffer_from_ipc
from masreplay.errors import MasreplayError

ROUND = settings(max_examples=20, deadline=None, database=None, derandomize=False, suppress_health_check=list(HealthCheck))
SEED = json.loads((Path(masreplay.__file__).parent / "data" / "seed_example_trace.json").read_text())
SIM = masreplay.sim.generate(4, seed=7)


def sound(batch: masreplay.TraceBatch) -> None:
    """An accepted batch is valid Arrow, reads back, and is accepted again unchanged."""
    table = batch.to_arrow()
    table.validate(full=True)
    for trace in batch:
        json.dumps(trace)
    assert masreplay.load_traces(table).trace_ids == batch.trace_ids


def outcome(read) -> None:
    try:
        result = read()
    except MasreplayError:
        return
    if isinstance(result, GraphBuffer):
        sound(result.to_batch())
        for trace_id in result.to_batch().trace_ids[:1]:
            first_event = result.get(trace_id)["events"][0]["id"]
            result.ancestors(trace_id, first_event)
            result.sample(2, sampler="prioritized", seed=1)
    else:
        sound(result)


# ---- dicts -------------------------------------------------------------------------------------
class Odd:
    """Numbers and containers that run code while masreplay reads them."""

    def __init__(self, owner: dict | None, value: float) -> None:
        self.owner, self.value = owner, value

    def __float__(self) -> float:
        if self.owner is not None:
            self.owner.clear()
        return self.value

    def __index__(self) -> int:
        if self.owner is not None:
            self.owner["added"] = 1
        return int(self.value) if self.value == self.value and abs(self.value) < 1e18 else 0


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=st.characters(), max_size=8),
    st.binary(max_size=4),
    st.sampled_from(["", "centralized", "spawn", "message", "causal", "e1", "e2", "orchestrator"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3) | st.tuples(inner),
    max_leaves=12,
)
paths = st.lists(
    st.one_of(
        st.sampled_from(sorted(SEED)),
        st.sampled_from(["id", "t", "type", "agent", "src", "dst", "reward", "tokens"]),
        st.integers(0, 8),
    ),
    min_size=1,
    max_size=4,
)


def place(trace: dict, path: list, value: object) -> None:
    """Puts `value` at `path` (as far as the path leads), or a self reference or a deep chain."""
    node = trace
    for step in path[:-1]:
        if isinstance(node, dict) and isinstance(step, str) and isinstance(node.get(step), (dict, list)):
            node = node[step]
        elif isinstance(node, list) and isinstance(step, int) and node and isinstance(node[step % len(node)], (dict, list)):
            node = node[step % len(node)]
    last = path[-1]
    if isinstance(node, dict):
        node[str(last)] = value
    elif isinstance(node, list) and node:
        node[last % len(node) if isinstance(last, int) else 0] = value


@given(edits=st.lists(st.tuples(paths, values | st.sampled_from(["SELF", "DEEP", "ODD", "ODD_INDEX"])), max_size=4))
@ROUND
def fuzz_dicts(edits) -> None:
    trace = copy.deepcopy(SEED)
    for path, value in edits:
        if value == "SELF":
            value = trace
        elif value == "DEEP":
            value = 1
            for _ in range(3000):
                value = {"k": [value]}
        elif value in ("ODD", "ODD_INDEX"):
            value = Odd(trace if value == "ODD" else trace.get("rewards"), 1.0)
        place(trace, path, value)
    outcome(lambda: masreplay.load_traces(trace))
    outcome(lambda: masreplay.load_traces([trace, copy.deepcopy(SEED)], on_error="skip"))


# ---- bytes: Arrow IPC, Parquet, pickled state ------------------------------------------------
byte_edits = st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=6)


def edited(data: bytes, edits, start: float = 0.0) -> bytes:
    out = bytearray(data)
    first = int(start * len(out))
    for at, byte in edits:
        out[first + int(at * (len(out) - first))] = byte
    return bytes(out)


def read_ipc(data: bytes) -> pa.Table | None:
    try:
        return pa.ipc.open_stream(data).read_all()
    except (pa.ArrowException, OSError, ValueError):
        return None


TABLE_IPC = _to_ipc(SIM.to_arrow())


def added(table: pa.Table) -> GraphBuffer:
    buffer = GraphBuffer(1000)
    buffer.add(table)
    return buffer


@given(edits=byte_edits, as_stream=st.booleans())
@ROUND
def fuzz_arrow(edits, as_stream) -> None:
    table = read_ipc(edited(TABLE_IPC, edits, start=0.3))  # mostly the buffers, after the schema
    if table is None:
        return
    if as_stream:
        source = pa.RecordBatchReader.from_batches(table.schema, table.to_batches())
        outcome(lambda: masreplay.load_traces(source))
    else:
        outcome(lambda: masreplay.load_traces(table))
        outcome(lambda: added(table))


FOLDER = Path(tempfile.mkdtemp(prefix="masreplay-fuzz-"))
SIM.write_parquet(FOLDER / "batch.parquet")
_buffer = GraphBuffer(1000)
_buffer.add(SIM)
_buffer.save(FOLDER / "buffer.parquet")
PARQUET = {name: (FOLDER / f"{name}.parquet").read_bytes() for name in ("batch", "buffer")}


@given(edits=byte_edits, which=st.sampled_from(sorted(PARQUET)), footer=st.booleans())
@ROUND
def fuzz_parquet(edits, which, footer) -> None:
    path = FOLDER / "edited.parquet"
    path.write_bytes(edited(PARQUET[which], edits, start=0.75 if footer else 0.0))
    outcome(lambda: masreplay.load_traces(path))
    outcome(lambda: GraphBuffer.load(path))


BUFFER_IPC = _to_ipc(pa.table(_buffer._core.persisted()))


@given(edits=byte_edits, which=st.sampled_from(["batch", "buffer", "pickle"]))
@ROUND
def fuzz_pickled_state(edits, which) -> None:
    if which == "batch":
        outcome(lambda: _from_ipc(edited(TABLE_IPC, edits)))
    elif which == "buffer":
        outcome(lambda: _buffer_from_ipc(edited(BUFFER_IPC, edits)))
    else:
        data = edited(pickle.dumps(SIM), edits, start=0.1)
        try:
            loaded = pickle.loads(data)
        except MasreplayError:
            return
        except Exception:
            return
        if isinstance(loaded, masreplay.TraceBatch):
            sound(loaded)


# ---- recipes: per-event inputs and keywords at their edges -----------------------------------
RECIPE_BATCH = masreplay.sim.generate(4, seed=4, depth=3, agents=(3, 8))
#: Each recipe with its per-event input (None: it takes none) and a float keyword.
RECIPES = {
    "marft": ("values", "gamma"),
    "maporl": ("values", "rho"),
    "c3": ("values", "alpha"),
    "sharp": ("marginal", "lambda_shapley"),
    "agent_qmix": ("q_values", "gamma"),
    "context_folding": ("process", "high"),
    "magrpo": (None, "gamma"),
    "marshal": (None, "gamma"),
    "dr_mas": (None, "invalid_penalty"),
    "puppeteer": (None, "default_factor"),
}
edge_floats = st.sampled_from([0.0, -0.0, 1.0, -1.0, 1e-300, 1e300, 2.0**49, math.nan, math.inf, -math.inf])


@given(
    name=st.sampled_from(sorted(RECIPES)),
    edits=st.lists(st.tuples(st.integers(0, RECIPE_BATCH.num_events - 1), edge_floats), max_size=3),
    setting=st.none() | edge_floats,
)
@ROUND
def fuzz_recipes(name, edits, setting) -> None:
    """An accepted call gives finite advantages and weights of the batch's shape."""
    array_name, float_name = RECIPES[name]
    kwargs = {} if setting is None else {float_name: setting}
    if array_name is not None:
        values = np.linspace(-1.0, 1.0, RECIPE_BATCH.num_events)
        for at, value in edits:
            values[at] = value
        kwargs[array_name] = values
    if name == "agent_qmix":
        kwargs["mixer"] = lambda q, mask: (q * mask).sum(axis=1)
    try:
        result = getattr(masreplay.recipes, name)(RECIPE_BATCH, **kwargs)
    except MasreplayError:
        return
    assert result.per_event.shape == result.weights.shape == (RECIPE_BATCH.num_events,)
    assert result.per_trace.shape == (len(RECIPE_BATCH),)
    for part in (result.per_trace, result.per_event, result.weights):
        assert np.isfinite(part).all(), (name, kwargs, part)


TARGETS = {
    "dicts": fuzz_dicts,
    "arrow": fuzz_arrow,
    "parquet": fuzz_parquet,
    "pickled_state": fuzz_pickled_state,
    "recipes": fuzz_recipes,
}

if __name__ == "__main__":
    target, seconds = TARGETS[sys.argv[1]], float(sys.argv[2])
    end, rounds = time.monotonic() + seconds, 0
    while rounds == 0 or time.monotonic() < end:
        target()
        rounds += 1
    print(f"{sys.argv[1]}: {rounds * ROUND.max_examples} inputs")
