"""The layouts users' data really have, made from simulator tables (issue 18).

The simulator writes counter ids ("e0", "e1", ...), events in time order, edges sorted and
the traces of a group next to each other: the layout that takes masreplay's fast paths
(the hash-free id check, the one-pass graph check, the in-order metrics walk). Trainers and
converters produce something else: random (UUID) ids, events and edges in arbitrary order,
string group ids, groups interleaved. :func:`realistic` rewrites a canonical table into that
layout without changing what it means (the same graphs, times and rewards), so every suite
can quote its goal on it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def _uuids(rng: np.random.Generator, count: int) -> pa.Array:
    """``count`` random version-4-shaped UUID strings (36 characters)."""
    raw = rng.integers(0, 256, size=(count, 16), dtype=np.uint8)
    text = [bytes(row).hex() for row in raw]
    return pa.array([f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{h[16:20]}-{h[20:]}" for h in text], pa.string())


def _positions_shuffled(offsets: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A permutation of the flat rows that shuffles each list's rows among themselves."""
    owner = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    return np.lexsort((rng.random(len(owner)), owner))


def realistic(table: pa.Table, seed: int = 0) -> pa.Table:
    """``table`` (canonical layout) with UUID trace, group and event ids, each trace's events
    and edges in random order (edge endpoints renumbered to follow their events), and the
    traces in random order (groups interleaved)."""
    rng = np.random.default_rng(seed)
    table = table.combine_chunks()
    events = table["events"].chunk(0)
    edges = table["edges"].chunk(0)
    event_offsets = events.offsets.to_numpy()
    edge_offsets = edges.offsets.to_numpy()
    flat_events = events.flatten()
    order = _positions_shuffled(event_offsets, rng)  # new flat row k holds old row order[k]
    new_position = np.empty_like(order)
    new_position[order] = np.arange(len(order))
    fields = {name: flat_events.field(name) for name in flat_events.type.names}
    fields["id"] = _uuids(rng, len(flat_events))
    shuffled_events = pa.StructArray.from_arrays(
        [fields[f.name].take(order) for f in flat_events.type], fields=list(flat_events.type)
    )
    flat_edges = edges.flatten()
    edge_owner = np.repeat(np.arange(len(edge_offsets) - 1), np.diff(edge_offsets))
    base = event_offsets[:-1][edge_owner]
    remap = {}
    for name in ("src", "dst"):
        old = flat_edges.field(name).to_numpy().astype(np.int64) + base
        remap[name] = pa.array((new_position[old] - base).astype(np.int32))
    edge_order = _positions_shuffled(edge_offsets, rng)
    edge_fields = [remap.get(f.name, flat_edges.field(f.name)).take(edge_order) for f in flat_edges.type]
    shuffled_edges = pa.StructArray.from_arrays(edge_fields, fields=list(flat_edges.type))
    columns = dict(zip(table.column_names, table.columns, strict=True))
    columns["events"] = pa.ListArray.from_arrays(pa.array(event_offsets, pa.int32()), shuffled_events, type=events.type)
    columns["edges"] = pa.ListArray.from_arrays(pa.array(edge_offsets, pa.int32()), shuffled_edges, type=edges.type)
    columns["trace_id"] = _uuids(rng, table.num_rows)
    groups = pc.unique(table["group_id"])
    renamed = _uuids(rng, len(groups))
    columns["group_id"] = renamed.take(pc.index_in(table["group_id"], groups))
    out = pa.table(columns, schema=table.schema)
    return out.take(rng.permutation(out.num_rows))
