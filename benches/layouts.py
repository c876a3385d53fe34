"""The layouts users' data really have, made from simulator tables (issue 18).

The simulator writes counter ids ("e0", "e1", ...), events in time order, edges sorted and
the traces of a group next to each other: the layout that takes masreplay's fast paths
(the hash-free id check, the one-pass graph check, the in-order metrics walk). Trainers and
converters produce something else: random (UUID) ids, events and edges in arbitrary order,
string group ids, groups interleaved. :func:`realistic` rewrites a canonical table into that
layout without changing what it means (the same graphs, times, rewards and branch families),
so every suite can quote its goal on it.
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


def _families(table: pa.Table) -> tuple[np.ndarray, pa.Array]:
    """Each trace's family (the row of the factual trace a branch's ``counterfactual_of``
    names; its own row for every other trace) and, per row, that factual row or null."""
    factual_row = pc.index_in(table["counterfactual_of"].chunk(0).field("trace_id"), table["trace_id"])
    branch = np.asarray(pc.is_valid(factual_row))
    family = np.arange(table.num_rows)
    family[branch] = factual_row.filter(branch).to_numpy()
    return family, factual_row


def _event_codes(old_ids: pa.Array, family: np.ndarray):
    """A code per (family, event id), numbered by first appearance: a branch's copy of an
    event shares its factual trace's. Returns each event's code, how many there are, and
    ``code_of(families, ids)``: the codes of ids named in those families (-1 where none is)."""
    encoded = pc.dictionary_encode(old_ids)
    width = len(encoded.dictionary)
    keys = family.astype(np.int64) * width + encoded.indices.to_numpy()
    unique, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    by_appearance = np.empty_like(first)
    by_appearance[np.argsort(first)] = np.arange(len(first))

    def code_of(families: np.ndarray, ids: pa.Array) -> np.ndarray:
        id_code = pc.index_in(ids, encoded.dictionary).to_numpy(zero_copy_only=False)
        known = ~np.isnan(id_code.astype(float))
        wanted = families.astype(np.int64) * width + np.where(known, id_code, 0).astype(np.int64)
        at = np.minimum(np.searchsorted(unique, wanted), len(unique) - 1)
        return np.where(known & (unique[at] == wanted), by_appearance[at], -1)

    return by_appearance[inverse], len(first), code_of


def _renamed_branches(table: pa.Table, factual_row: pa.Array, trace_ids: pa.Array, event_ids, code_of) -> pa.Array:
    """``counterfactual_of`` naming the factual trace and event by their new ids (a reference
    to a trace or event not in the table keeps its text)."""
    old = table["counterfactual_of"].chunk(0)
    branch = np.asarray(pc.is_valid(factual_row))
    rows = np.flatnonzero(branch)
    factual = factual_row.filter(branch).to_numpy()
    trace_id = old.field("trace_id").to_numpy(zero_copy_only=False).astype(object)
    event_id = old.field("event_id").to_numpy(zero_copy_only=False).astype(object)
    trace_id[rows] = trace_ids.take(factual).to_numpy(zero_copy_only=False)
    codes = code_of(factual, old.field("event_id").filter(branch))
    found = codes >= 0
    event_id[rows[found]] = event_ids.take(codes[found]).to_numpy(zero_copy_only=False)
    missing = np.asarray(pc.is_null(old))
    trace_id[missing] = ""
    event_id[missing] = ""
    children = [pa.array(trace_id, pa.string()), pa.array(event_id, pa.string()), old.field("kind")]
    return pa.StructArray.from_arrays(children, fields=list(old.type), mask=pa.array(missing))


def realistic(table: pa.Table, seed: int = 0) -> pa.Table:
    """``table`` (canonical layout) with UUID trace, group and event ids, each trace's events
    and edges in random order (edge endpoints renumbered to follow their events), and the
    traces in random order (groups interleaved). Branch rollouts keep their families: a
    branch's copy of an event gets its factual trace's event id, and ``counterfactual_of``
    names the factual trace and event by their new ids."""
    rng = np.random.default_rng(seed)
    table = table.combine_chunks()
    family, factual_row = _families(table)
    events = table["events"].chunk(0)
    edges = table["edges"].chunk(0)
    event_offsets = events.offsets.to_numpy()
    edge_offsets = edges.offsets.to_numpy()
    flat_events = events.flatten()
    order = _positions_shuffled(event_offsets, rng)  # new flat row k holds old row order[k]
    new_position = np.empty_like(order)
    new_position[order] = np.arange(len(order))
    fields = {name: flat_events.field(name) for name in flat_events.type.names}
    event_family = np.repeat(family, np.diff(event_offsets))
    codes, distinct, code_of = _event_codes(fields["id"], event_family)
    event_uuids = _uuids(rng, distinct)
    fields["id"] = event_uuids.take(codes)
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
    if factual_row.null_count < len(factual_row):
        columns["counterfactual_of"] = _renamed_branches(table, factual_row, columns["trace_id"], event_uuids, code_of)
    groups = pc.unique(table["group_id"])
    renamed = _uuids(rng, len(groups))
    columns["group_id"] = renamed.take(pc.index_in(table["group_id"], groups))
    out = pa.table(columns, schema=table.schema)
    return out.take(rng.permutation(out.num_rows))
