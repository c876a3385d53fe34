"""The anchors masreplay is measured against: what a Python user would write without it.

* :func:`json_anchor` reads JSON Lines with the standard library's ``json.loads`` and builds
  the *same* canonical Arrow table masreplay builds (events and edges as ``list<struct>``,
  edges by local event index, dictionary-encoded categoricals, the five derived columns) with
  ``pa.Table.from_pylist`` and an explicit schema. It does less checking than masreplay (only
  what the id -> index mapping, the cycle check and pyarrow's typed conversion catch), so it
  is the cheaper side of the comparison.
* :func:`arrow_anchor` checks a table already in the canonical layout against the same rules
  masreplay's Arrow ingest checks (``rust/masreplay-core/src/store/ingest.rs``), vectorised
  with ``pyarrow.compute`` and NumPy (no per-event Python), and recomputes the derived
  columns (the cycle check and ``depth`` by a level-synchronous Kahn sort over all traces at
  once).
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# The closed vocabularies of the seed schema, in their dictionary-code order.
from masreplay.vocabulary import COUNTERFACTUAL_KINDS, EDGE_TYPES, EVENT_TYPES, TOPOLOGIES

DERIVED_COLUMNS = ("n_events", "n_edges", "n_agents", "depth", "max_branching")

# ---- JSON Lines -> canonical table, in Python ------------------------------------------------

_TOP_LEVEL_KEYS = frozenset(
    (
        "trace_id",
        "task_id",
        "system",
        "topology",
        "events",
        "edges",
        "rewards",
        "costs",
        "metrics",
        "schema_version",
        "group_id",
        "policy_version",
        "counterfactual_of",
    )
)
_NAMED_COSTS = ("tokens", "wall_clock_s", "tool_calls", "messages")


def _json_text(extra: dict) -> str:
    return json.dumps(extra, separators=(",", ":"))


def _canonical_row(trace: dict, event_keys: frozenset[str]) -> dict:
    events = trace["events"]
    n = len(events)
    if n == 0:
        raise ValueError(f"trace {trace['trace_id']!r}: no events")
    index: dict[str, int] = {}
    agents = set()
    for i, event in enumerate(events):
        if event["id"] in index:
            raise ValueError(f"trace {trace['trace_id']!r}: duplicate event id {event['id']!r}")
        index[event["id"]] = i
        if event["type"] != "tool_result":
            agents.add(event["agent"])
        if not event_keys.issuperset(event):  # unknown event keys are kept as JSON text
            extra = {k: v for k, v in event.items() if k not in event_keys}
            events[i] = {k: v for k, v in event.items() if k in event_keys}
            events[i]["attributes"] = _json_text(extra)

    successors: list[list[int]] = [[] for _ in range(n)]
    in_degree = [0] * n
    edges = []
    for edge in trace["edges"]:
        src = index[edge["src"]]
        dst = index[edge["dst"]]
        edges.append({"src": src, "dst": dst, "type": edge["type"]})
        successors[src].append(dst)
        in_degree[dst] += 1

    # Longest path (depth) by Kahn's algorithm, which also proves the edges acyclic.
    level = [0] * n
    stack = [i for i in range(n) if in_degree[i] == 0]
    visited = 0
    while stack:
        v = stack.pop()
        visited += 1
        next_level = level[v] + 1
        for w in successors[v]:
            if level[w] < next_level:
                level[w] = next_level
            in_degree[w] -= 1
            if in_degree[w] == 0:
                stack.append(w)
    if visited != n:
        raise ValueError(f"trace {trace['trace_id']!r}: edges form a cycle")

    costs = trace["costs"]
    other = {k: v for k, v in costs.items() if k not in _NAMED_COSTS}
    extra = {k: v for k, v in trace.items() if k not in _TOP_LEVEL_KEYS}
    return {
        "trace_id": trace["trace_id"],
        "task_id": trace["task_id"],
        "group_id": trace.get("group_id", trace["task_id"]),
        "system": trace.get("system"),
        "topology": trace.get("topology"),
        "policy_version": trace.get("policy_version"),
        "counterfactual_of": trace.get("counterfactual_of"),
        "events": events,
        "edges": edges,
        "rewards": trace["rewards"],
        "costs": {
            "tokens": costs["tokens"],
            "wall_clock_s": costs["wall_clock_s"],
            "tool_calls": costs.get("tool_calls"),
            "messages": costs.get("messages"),
            "other": other or None,
        },
        "metrics": trace.get("metrics"),
        "attributes": _json_text(extra) if extra else None,
        "n_events": n,
        "n_edges": len(edges),
        "n_agents": len(agents),
        "depth": max(level),
        "max_branching": max(map(len, successors)),
    }


def json_anchor(data: bytes, schema: pa.Schema) -> pa.Table:
    """``json.loads`` per line, then ``pa.Table.from_pylist`` with the canonical schema."""
    # The event fields the schema names, but the one that keeps unknown keys as JSON text.
    event_keys = frozenset(schema.field("events").type.value_type.names) - {"attributes"}
    rows = [_canonical_row(json.loads(line), event_keys) for line in data.splitlines() if line.strip()]
    return pa.Table.from_pylist(rows, schema=schema)


def dicts_anchor(traces: list[dict], schema: pa.Schema) -> pa.Table:
    """The rows of trace dicts already in memory, then ``pa.Table.from_pylist`` with the
    canonical schema: ``json_anchor`` without the parse."""
    event_keys = frozenset(schema.field("events").type.value_type.names) - {"attributes"}
    # _canonical_row replaces events that hold unknown keys: it gets its own list of them.
    rows = [_canonical_row({**trace, "events": list(trace["events"])}, event_keys) for trace in traces]
    return pa.Table.from_pylist(rows, schema=schema)


# ---- canonical Arrow table: the same checks, vectorised ----------------------------------------


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"anchor check failed: {what}")


def _all(mask: pa.Array | pa.ChunkedArray) -> bool:
    """True when every non-null entry of a boolean array is true (vacuously for none)."""
    return pc.all(mask).as_py() is not False


def _required_text(array: pa.Array, what: str) -> None:
    _check(array.null_count == 0, f"{what} is null")
    _check(_all(pc.greater(pc.binary_length(array), 0)), f"{what} is empty")


def _in_vocabulary(array: pa.DictionaryArray, names: tuple[str, ...], what: str, required: bool) -> np.ndarray:
    """Checks the values a dictionary column uses; returns its indices as NumPy (nulls as -1)."""
    if required:
        _check(array.null_count == 0, f"{what} is null")
    known = pc.is_in(array.dictionary, value_set=pa.array(names)).to_numpy(zero_copy_only=False)
    codes = array.indices.fill_null(-1).to_numpy()
    used = codes[codes >= 0]
    _check(bool(known[used].all()) if used.size else True, f"{what} holds a value outside the vocabulary")
    return codes


def _finite(array: pa.Array, what: str, *, non_negative: bool = False, non_positive: bool = False) -> None:
    if len(array) == 0 or array.null_count == len(array):
        return
    if pa.types.is_floating(array.type):
        _check(_all(pc.is_finite(array)), f"{what} is not finite")
    if non_negative:
        _check(pc.min(array).as_py() >= 0, f"{what} is negative")
    if non_positive:
        _check(pc.max(array).as_py() <= 0, f"{what} is positive")


def _map_as_list(map_array: pa.MapArray) -> pa.ListArray:
    """The same map as list<struct<key, value>> (pyarrow has no flatten kernel for maps)."""
    entries = pa.StructArray.from_arrays([map_array.keys, map_array.items], names=["key", "value"])
    return pa.ListArray.from_arrays(map_array.offsets, entries, mask=map_array.is_null())


def _numbers(map_array: pa.MapArray, what: str, *, non_negative: bool = False) -> None:
    values = _map_as_list(map_array).flatten().field("value")
    _check(values.null_count == 0, f"{what} holds a null number")
    _finite(values, what, non_negative=non_negative)


def _json_objects(array: pa.Array, what: str) -> None:
    if array.null_count == len(array):
        return
    for text in array.drop_null().to_pylist():
        _check(isinstance(json.loads(text), dict), f"{what} is not a JSON object")


def _distinct(values: np.ndarray) -> np.ndarray:
    """Sorted distinct values (sort-based: NumPy 2's hash-based np.unique is several times
    slower on half a million int64 keys)."""
    values = np.sort(values)
    if values.size < 2:
        return values
    keep = np.empty(values.size, bool)
    keep[0] = True
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


def _distinct_pairs(rows: np.ndarray, codes: np.ndarray, n_rows: int) -> tuple[np.ndarray, int]:
    """Per row, how many distinct codes it holds; and the largest multiplicity of one (row, code)
    pair. A dense count table when it is small, a sort otherwise."""
    n_codes = int(codes.max()) + 1 if codes.size else 1
    keys = rows.astype(np.int64) * n_codes + codes
    if n_rows * n_codes <= 4 * max(keys.size, 1 << 16):
        counts = np.bincount(keys, minlength=n_rows * n_codes).reshape(n_rows, n_codes)
        return (counts > 0).sum(axis=1), int(counts.max(initial=0))
    keys = np.sort(keys)
    first = np.ones(keys.size, bool)
    np.not_equal(keys[1:], keys[:-1], out=first[1:])
    run_starts = np.flatnonzero(first)
    longest = int(np.diff(np.append(run_starts, keys.size)).max(initial=0))
    return np.bincount(keys[first] // n_codes, minlength=n_rows), longest


def _levels(n_nodes: int, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Longest-path level of every node and its out-degree, by a level-synchronous Kahn sort
    over the whole batch (node ids global); raises if the edges hold a cycle."""
    in_degree = np.bincount(dst, minlength=n_nodes)
    out_degree = np.bincount(src, minlength=n_nodes)
    first_edge = np.zeros(n_nodes + 1, np.int64)
    np.cumsum(out_degree, out=first_edge[1:])
    targets_by_source = dst[np.argsort(src, kind="stable")]
    level = np.zeros(n_nodes, np.int32)
    frontier = np.flatnonzero(in_degree == 0)
    removed = 0
    round_ = 0
    while frontier.size:
        removed += frontier.size
        level[frontier] = round_
        counts = out_degree[frontier]
        total = int(counts.sum())
        if total == 0:
            break
        starts = np.repeat(first_edge[frontier] - (np.cumsum(counts) - counts), counts)
        targets = targets_by_source[starts + np.arange(total)]
        np.subtract.at(in_degree, targets, 1)
        frontier = _distinct(targets[in_degree[targets] == 0])
        round_ += 1
    _check(removed == n_nodes, "edges form a cycle")
    return level, out_degree


def arrow_anchor(table: pa.Table) -> pa.Table:
    """Checks a canonical table with pyarrow.compute/NumPy and returns it with group_id filled
    and the derived columns recomputed (as masreplay's Arrow ingest does)."""
    table = table.combine_chunks()
    column = {name: table.column(name).chunk(0) for name in table.column_names}
    n_rows = table.num_rows

    # ---- trace-level fields
    _required_text(column["trace_id"], "trace_id")
    _required_text(column["task_id"], "task_id")
    _check(_all(pc.greater(pc.binary_length(column["group_id"]), 0)), "group_id is empty")
    _in_vocabulary(column["topology"], TOPOLOGIES, "topology", required=False)
    _finite(column["policy_version"], "policy_version", non_negative=True)
    counterfactual = column["counterfactual_of"]
    if counterfactual.null_count < n_rows:
        present = counterfactual.filter(counterfactual.is_valid())
        _required_text(present.field("trace_id"), "counterfactual_of/trace_id")
        _required_text(present.field("event_id"), "counterfactual_of/event_id")
        _in_vocabulary(present.field("kind"), COUNTERFACTUAL_KINDS, "counterfactual_of/kind", required=True)
    _check(column["rewards"].null_count == 0, "rewards is null")
    _numbers(column["rewards"], "rewards")
    costs = column["costs"]
    _check(costs.null_count == 0, "costs is null")
    for name in ("tokens", "wall_clock_s"):
        _check(costs.field(name).null_count == 0, f"costs/{name} is null")
    for name in _NAMED_COSTS:
        _finite(costs.field(name), f"costs/{name}", non_negative=True)
    _numbers(costs.field("other"), "costs", non_negative=True)
    _numbers(column["metrics"], "metrics")
    _json_objects(column["attributes"], "attributes")

    # ---- events
    events = column["events"]
    _check(events.null_count == 0, "events is null")
    n_events = pc.list_value_length(events).to_numpy()
    _check(bool((n_events > 0).all()), "a trace has no events")
    event_start = np.zeros(n_rows + 1, np.int64)
    np.cumsum(n_events, out=event_start[1:])
    flat = events.flatten()
    _check(flat.null_count == 0, "an event is null")
    ids = flat.field("id")
    _required_text(ids, "event id")
    t = flat.field("t")
    _check(t.null_count == 0, "event t is null")
    _finite(t, "event t", non_negative=True)
    event_type = _in_vocabulary(flat.field("type"), EVENT_TYPES, "event type", required=True)
    agent = flat.field("agent")
    _check(agent.null_count == 0, "event agent is null")
    agent_codes = agent.indices.to_numpy()
    _check(bool((pc.binary_length(agent.dictionary).to_numpy()[agent_codes] > 0).all()), "event agent is empty")
    _numbers(flat.field("reward"), "event reward")
    _finite(flat.field("tokens"), "event tokens", non_negative=True)
    _finite(flat.field("duration_s"), "event duration_s", non_negative=True)
    _finite(flat.field("logprob"), "event logprob", non_positive=True)
    _json_objects(flat.field("attributes"), "event attributes")
    event_trace = np.repeat(np.arange(n_rows, dtype=np.int64), n_events)
    id_codes = pc.dictionary_encode(ids).indices.to_numpy()
    distinct_ids, _ = _distinct_pairs(event_trace, id_codes, n_rows)
    _check(distinct_ids.sum() == len(ids), "duplicate event id in a trace")

    # ---- edges
    edges = column["edges"]
    _check(edges.null_count == 0, "edges is null")
    n_edges = pc.list_value_length(edges).to_numpy()
    flat_edges = edges.flatten()
    _check(flat_edges.null_count == 0, "an edge is null")
    src_array, dst_array = flat_edges.field("src"), flat_edges.field("dst")
    _check(src_array.null_count == 0 and dst_array.null_count == 0, "edge src/dst is null")
    _in_vocabulary(flat_edges.field("type"), EDGE_TYPES, "edge type", required=True)
    src = src_array.to_numpy().astype(np.int64)
    dst = dst_array.to_numpy().astype(np.int64)
    edge_events = np.repeat(n_events, n_edges)
    _check(bool((src >= 0).all() and (dst >= 0).all()), "negative event index")
    _check(bool((src < edge_events).all() and (dst < edge_events).all()), "event index out of range")
    _check(bool((src != dst).all()), "self-loop")
    edge_offset = np.repeat(event_start[:-1], n_edges)
    level, out_degree = _levels(int(event_start[-1]), src + edge_offset, dst + edge_offset)

    # ---- derived columns
    starts = event_start[:-1]
    depth = np.maximum.reduceat(level, starts)
    max_branching = np.maximum.reduceat(out_degree, starts)
    tool_result = pc.equal(flat.field("type").dictionary, "tool_result").to_numpy(zero_copy_only=False)
    acting = ~tool_result[event_type]  # a tool_result's agent is the tool, not an agent
    if pc.count_distinct(agent.dictionary).as_py() != len(agent.dictionary):  # repeated values
        agent_codes = pc.index_in(agent.dictionary, value_set=pc.unique(agent.dictionary)).to_numpy()[agent_codes]
    n_agents, _ = _distinct_pairs(event_trace[acting], agent_codes[acting], n_rows)

    derived = {
        "n_events": n_events,
        "n_edges": n_edges,
        "n_agents": n_agents,
        "depth": depth,
        "max_branching": max_branching,
    }
    schema = table.schema
    out = table.set_column(
        schema.get_field_index("group_id"),
        schema.field("group_id"),
        pc.coalesce(column["group_id"], column["task_id"]),
    )
    for name, values in derived.items():
        out = out.set_column(schema.get_field_index(name), schema.field(name), pa.array(values, pa.int32()))
    return out


# ---- equality of two tables, value by value ----------------------------------------------------


def _assert_same_array(a: pa.Array, b: pa.Array, path: str) -> None:
    assert a.type.equals(b.type), f"{path}: type {a.type} != {b.type}"
    assert len(a) == len(b), f"{path}: length {len(a)} != {len(b)}"
    if pa.types.is_dictionary(a.type):  # codes may differ; the values they stand for may not
        _assert_same_array(a.dictionary_decode(), b.dictionary_decode(), path)
        return
    assert a.is_valid().equals(b.is_valid()), f"{path}: nulls differ"
    if pa.types.is_map(a.type):
        a, b = _map_as_list(a), _map_as_list(b)
    if pa.types.is_list(a.type) or pa.types.is_map(a.type):
        lengths_a = np.diff(a.offsets.to_numpy()) * a.is_valid().to_numpy(zero_copy_only=False)
        lengths_b = np.diff(b.offsets.to_numpy()) * b.is_valid().to_numpy(zero_copy_only=False)
        assert np.array_equal(lengths_a, lengths_b), f"{path}: list lengths differ"
        _assert_same_array(a.flatten(), b.flatten(), f"{path}[]")
    elif pa.types.is_struct(a.type):
        for field, child_a, child_b in zip(a.type, a.flatten(), b.flatten(), strict=True):
            _assert_same_array(child_a, child_b, f"{path}/{field.name}")
    else:
        assert a.equals(b), f"{path}: values differ"


def assert_same_table(ours: pa.Table, theirs: pa.Table) -> None:
    """Same schema (types and nullability) and the same values in every column."""
    assert ours.schema.equals(theirs.schema), f"schemas differ:\n{ours.schema}\n---\n{theirs.schema}"
    assert ours.num_rows == theirs.num_rows, f"{ours.num_rows} rows != {theirs.num_rows} rows"
    for name in ours.column_names:
        a = ours.column(name).combine_chunks()
        b = theirs.column(name).combine_chunks()
        _assert_same_array(a, b, name)
