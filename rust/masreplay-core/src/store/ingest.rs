//! Arrow in: any table shaped like the canonical layout (columns found by name, types cast,
//! optional columns may be absent) is conformed, checked trace by trace without leaving the
//! columnar form, and given fresh derived columns. Canonical input passes through without copies.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int8Type};
use arrow_array::{
    Array, ArrayRef, BooleanArray, DictionaryArray, Int8Array, LargeListArray, ListArray, MapArray, RecordBatch,
    StringArray, StructArray, new_null_array,
};
use arrow_buffer::{OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, FieldRef, Fields};
use rayon::prelude::*;

use super::build::{Derived, derived_columns};
use super::column_checks::{AgentIndex, CleanColumns, DistinctIds};
use super::concat::concat_polled;
use super::nulls::{Zeros, longest_column, share_null_columns_over};
use super::schema::{EdgeColumns, EventColumns, TraceColumns, canonical_schema, vocabulary};
use super::structure::WellFormed;
use crate::error::{MasreplayError, ValidationError, split_outcomes};
use crate::interrupt::Checkpoint;
use crate::parallel::min_piece;
use crate::trace::{CounterfactualKind, EdgeType, EventType, Topology};
use crate::validate::{
    check_finite, check_graph, check_logprob, check_non_empty, check_non_negative, depth_error, pointer_segment,
    too_deep_attribute,
};

/// The outcome of ingesting Arrow data: the valid traces, and the rejected ones by position.
pub struct Ingested {
    pub batch: RecordBatch,
    pub rejected: Vec<(usize, ValidationError)>,
}

fn schema_error(path: &str, reason: impl Into<String>) -> MasreplayError {
    ValidationError::new(None, path, reason).into()
}

/// Conforms `array` to `target`. With `relaxed`, a non-nullable field that holds nulls is
/// declared nullable instead of failing, so the nulls can be reported per trace later.
fn conform(
    array: &ArrayRef,
    target: &DataType,
    path: &str,
    relaxed: bool,
    zeros: &Zeros,
) -> Result<ArrayRef, MasreplayError> {
    if array.data_type() == target {
        return Ok(array.clone());
    }
    match target {
        DataType::Struct(fields) => conform_struct(array, fields, path, relaxed, zeros),
        DataType::List(item) => conform_list(array, item, path, relaxed, zeros),
        DataType::Map(entries, sorted) => conform_map(array, entries, *sorted, path),
        _ => arrow_cast::cast(array, target).map_err(|e| {
            schema_error(path, format!("column of type {} cannot be read as {target}: {e}", array.data_type()))
        }),
    }
}

/// Fields found by name; a missing one is filled with nulls where that is allowed (optional
/// fields; with `relaxed`, the derived columns and a top-level group_id, both filled in later).
fn conform_struct(
    array: &ArrayRef,
    fields: &Fields,
    path: &str,
    relaxed: bool,
    zeros: &Zeros,
) -> Result<ArrayRef, MasreplayError> {
    let Some(source) = array.as_struct_opt() else {
        return Err(schema_error(path, format!("expected a struct column, got {}", array.data_type())));
    };
    let mut children = Vec::with_capacity(fields.len());
    let mut conformed_fields = Vec::with_capacity(fields.len());
    for field in fields {
        let child_path = format!("{path}/{}", field.name());
        let child = match source.column_by_name(field.name()) {
            Some(child) => conform(child, field.data_type(), &child_path, relaxed, zeros)?,
            None if field.is_nullable() || relaxed && path.is_empty() && field.name() == "group_id" => {
                zeros.null_array(field.data_type(), source.len())
            }
            None if relaxed && super::schema::DERIVED_COLUMNS.contains(&field.name().as_str()) => {
                new_null_array(field.data_type(), source.len())
            }
            None => {
                return Err(schema_error(&child_path, format!("missing required column {:?}", field.name())));
            }
        };
        conformed_fields.push(relax(field, &child, relaxed));
        children.push(child);
    }
    Ok(Arc::new(StructArray::try_new(Fields::from(conformed_fields), children, source.nulls().cloned())?))
}

/// A list, or a large list whose offsets fit 32 bits, with its items conformed.
fn conform_list(
    array: &ArrayRef,
    item: &FieldRef,
    path: &str,
    relaxed: bool,
    zeros: &Zeros,
) -> Result<ArrayRef, MasreplayError> {
    let (offsets, values, nulls) = if let Some(list) = array.as_list_opt::<i32>() {
        (list.offsets().clone(), list.values().clone(), list.nulls().cloned())
    } else if let Some(list) = array.as_any().downcast_ref::<LargeListArray>() {
        let narrow: Result<Vec<i32>, _> = list.offsets().iter().map(|&o| i32::try_from(o)).collect();
        let narrow = narrow.map_err(|_| schema_error(path, "list column too long for 32-bit offsets"))?;
        (OffsetBuffer::new(ScalarBuffer::from(narrow)), list.values().clone(), list.nulls().cloned())
    } else {
        return Err(schema_error(path, format!("expected a list column, got {}", array.data_type())));
    };
    let values = conform(&values, item.data_type(), path, relaxed, zeros)?;
    let item = relax(item, &values, relaxed);
    Ok(Arc::new(ListArray::try_new(item, offsets, values, nulls)?))
}

/// A map of names to numbers. Maps also arrive as list<struct<key, value>> (Polars) or with
/// other entry names.
fn conform_map(array: &ArrayRef, entries: &FieldRef, sorted: bool, path: &str) -> Result<ArrayRef, MasreplayError> {
    let (offsets, pairs, nulls) = if let Some(map) = array.as_map_opt() {
        (map.offsets().clone(), map.entries().clone(), map.nulls().cloned())
    } else if let Some(list) = array.as_list_opt::<i32>()
        && let Some(pairs) = list.values().as_struct_opt()
    {
        (list.offsets().clone(), pairs.clone(), list.nulls().cloned())
    } else {
        return Err(schema_error(path, format!("expected a map of names to numbers, got {}", array.data_type())));
    };
    if pairs.num_columns() != 2 {
        return Err(schema_error(path, "map entries must have a key and a value"));
    }
    let DataType::Struct(entry_fields) = entries.data_type() else { unreachable!("map entries are structs") };
    let cast_child = |i: usize| {
        arrow_cast::cast(pairs.column(i), entry_fields[i].data_type()).map_err(|e| {
            schema_error(path, format!("map entry cannot be read as {}: {e}", entry_fields[i].data_type()))
        })
    };
    let entries_array = StructArray::try_new(entry_fields.clone(), vec![cast_child(0)?, cast_child(1)?], None)?;
    Ok(Arc::new(MapArray::try_new(entries.clone(), offsets, entries_array, nulls, sorted)?))
}

fn relax(field: &FieldRef, child: &ArrayRef, relaxed: bool) -> FieldRef {
    let needs_nulls = !field.is_nullable() && child.null_count() > 0;
    let same_type = field.data_type() == child.data_type();
    if !(relaxed && needs_nulls) && same_type {
        return field.clone();
    }
    Arc::new(Field::new(field.name(), child.data_type().clone(), field.is_nullable() || needs_nulls && relaxed))
}

/// Maps a dictionary over any strings to the canonical codes of a closed vocabulary; a value
/// outside the vocabulary maps to `None` (and is reported by the per-trace check).
struct Vocabulary<'a> {
    source: &'a DictionaryArray<Int8Type>,
    codes: Vec<Option<i8>>,
    /// `codes` indexed by every possible key read as a byte (keys outside the dictionary map to
    /// `None`), so whole-column passes look codes up without branches.
    by_key: [Option<i8>; 256],
    names: &'static [&'static str],
}

impl<'a> Vocabulary<'a> {
    fn new(source: &'a DictionaryArray<Int8Type>, names: &'static [&'static str]) -> Self {
        let values = source.values().as_string::<i32>();
        let codes = values
            .iter()
            .map(|value| value.and_then(|text| names.iter().position(|n| *n == text)).map(|i| i as i8))
            .collect::<Vec<_>>();
        // Keys are i8: only 0..=127 can index a dictionary (a longer dictionary is legal Arrow,
        // its tail unreachable), and a negative key read as a byte stays `None`.
        let mut by_key = [None; 256];
        for (key, code) in codes.iter().take(128).enumerate() {
            by_key[key] = *code;
        }
        Vocabulary { source, codes, by_key, names }
    }

    /// `Ok(None)` for a null, `Ok(Some(code))` for a known value, `Err(reason)` otherwise.
    fn code(&self, i: usize) -> Result<Option<i8>, String> {
        if self.source.is_null(i) {
            return Ok(None);
        }
        let key = self.source.keys().value(i);
        let Some(&known) = usize::try_from(key).ok().and_then(|k| self.codes.get(k)) else {
            return Err(format!("dictionary key {key} is outside its dictionary"));
        };
        known.map(Some).ok_or_else(|| {
            let text = self.source.values().as_string::<i32>().value(key as usize);
            let expected: Vec<String> = self.names.iter().map(|n| format!("'{n}'")).collect();
            format!("unknown value {text:?}; expected one of {}", expected.join(", "))
        })
    }

    /// Whether every row holds a value of the vocabulary (no nulls, no unknown text).
    fn all_known(&self) -> bool {
        let keys = self.source.keys().values();
        let known = |key: i8| self.by_key[key as u8 as usize].is_some();
        self.source.null_count() == 0
            && keys.par_chunks(1 << 16).all(|chunk| chunk.iter().fold(true, |ok, &key| ok & known(key)))
    }

    /// The code of a row already checked to hold a known value.
    fn known_code(&self, i: usize) -> i8 {
        self.by_key[self.source.keys().value(i) as u8 as usize].unwrap_or_default()
    }

    /// The column with canonical codes. A value outside the vocabulary gets code 0 as a
    /// placeholder: its trace is rejected by the per-trace check and filtered out, but the
    /// column must stay non-null until then. Rows under a null parent may hold any key.
    fn canonical(&self) -> ArrayRef {
        // Columns built by masreplay share the vocabulary array: their codes are canonical.
        if Arc::ptr_eq(self.source.values(), &vocabulary(self.names)) {
            return Arc::new(self.source.clone());
        }
        // Columns that crossed a process or the C interface spell the vocabulary in its order:
        // their keys are the codes already.
        if self.codes.iter().enumerate().all(|(k, code)| *code == Some(k as i8)) {
            // `try_new` would scan every key again. SAFETY: `source` is a DictionaryArray, so
            // the key of each valid slot indexes its dictionary (its constructors prove it; for
            // Arrow input, `WellFormed::check` proved it before the array was made), and that
            // dictionary is a prefix of the vocabulary: entry k is name k, for every k.
            return Arc::new(unsafe {
                DictionaryArray::<Int8Type>::new_unchecked(self.source.keys().clone(), vocabulary(self.names))
            });
        }
        let keys: Int8Array = (0..self.source.len())
            .map(|i| if self.source.is_null(i) { None } else { Some(self.code(i).unwrap_or(Some(0)).unwrap_or(0)) })
            .collect();
        Arc::new(
            DictionaryArray::<Int8Type>::try_new(keys, vocabulary(self.names)).expect("codes index the vocabulary"),
        )
    }
}

struct Vocabularies<'a> {
    event_type: Vocabulary<'a>,
    edge_type: Vocabulary<'a>,
    topology: Vocabulary<'a>,
    kind: Vocabulary<'a>,
}

impl<'a> Vocabularies<'a> {
    fn of(columns: &TraceColumns<'a>) -> Self {
        let child = |parent: &'a StructArray, name: &str| -> &'a DictionaryArray<Int8Type> {
            parent.column_by_name(name).expect("canonical field").as_dictionary()
        };
        Vocabularies {
            event_type: Vocabulary::new(child(columns.events.values().as_struct(), "type"), EventType::NAMES),
            edge_type: Vocabulary::new(child(columns.edges.values().as_struct(), "type"), EdgeType::NAMES),
            topology: Vocabulary::new(columns.topology, Topology::NAMES),
            kind: Vocabulary::new(child(columns.counterfactual_of, "kind"), CounterfactualKind::NAMES),
        }
    }
}

type Checked<T> = Result<T, ValidationError>;

/// What every trace's check of one batch shares: typed columns, vocabularies, and which
/// per-event rules already hold batch-wide.
struct BatchCheck<'a> {
    events: EventColumns<'a>,
    edges: EdgeColumns<'a>,
    vocabularies: Vocabularies<'a>,
    clean: CleanColumns,
    edges_clean: bool,
    agents: AgentIndex,
}

impl<'a> BatchCheck<'a> {
    fn new(columns: &'a TraceColumns<'a>) -> Self {
        let (events, edges) = (columns.event_columns(), columns.edge_columns());
        let vocabularies = Vocabularies::of(columns);
        let edges_clean = columns.edges.values().null_count() == 0
            && edges.src.null_count() == 0
            && edges.dst.null_count() == 0
            && vocabularies.edge_type.all_known();
        BatchCheck {
            clean: CleanColumns {
                types: vocabularies.event_type.all_known(),
                ..CleanColumns::of(columns.events.values().as_ref(), &events)
            },
            agents: AgentIndex::new(events.agent),
            edges_clean,
            events,
            edges,
            vocabularies,
        }
    }
}

/// Per-thread memory reused from trace to trace.
#[derive(Default)]
struct Scratch {
    ids: DistinctIds,
    agents_seen: Vec<u32>,
}

struct RowCheck<'a, 'b> {
    batch: &'b BatchCheck<'a>,
    columns: &'a TraceColumns<'a>,
    trace_id: Option<&'a str>,
}

impl<'a> RowCheck<'a, '_> {
    fn fail<T>(&self, path: impl Into<String>, reason: impl Into<String>) -> Checked<T> {
        Err(ValidationError::new(self.trace_id, path, reason))
    }

    fn rule<T>(&self, path: impl Fn() -> String, outcome: Result<T, String>) -> Checked<T> {
        outcome.or_else(|reason| self.fail(path(), reason))
    }

    fn required(&self, array: &dyn Array, i: usize, path: impl Fn() -> String) -> Checked<()> {
        if array.is_null(i) { self.fail(path(), "missing required field (null)") } else { Ok(()) }
    }

    fn required_text(&self, array: &StringArray, i: usize, path: impl Fn() -> String) -> Checked<()> {
        self.required(array, i, &path)?;
        self.rule(&path, check_non_empty(array.value(i)))
    }

    fn numbers(
        &self,
        map: &MapArray,
        i: usize,
        path: impl Fn() -> String,
        rule: fn(f64) -> Result<(), String>,
    ) -> Checked<()> {
        if map.is_null(i) {
            return Ok(());
        }
        let keys = map.keys().as_string::<i32>();
        let values = map.values().as_primitive::<Float64Type>();
        for j in map.value_offsets()[i] as usize..map.value_offsets()[i + 1] as usize {
            let entry_path = || format!("{}/{}", path(), pointer_segment(keys.value(j)));
            self.required(values, j, entry_path)?;
            self.rule(entry_path, rule(values.value(j)))?;
        }
        Ok(())
    }

    /// Attributes of the object at `level` (1: the trace, 3: an event), held as JSON text,
    /// nest within [`crate::validate::MAX_DEPTH`] as they would in the trace's JSON.
    fn json_object(&self, array: &StringArray, i: usize, level: usize, path: impl Fn() -> String) -> Checked<()> {
        if array.is_null(i) {
            return Ok(());
        }
        match serde_json::from_str::<serde_json::Value>(array.value(i)) {
            Ok(serde_json::Value::Object(attributes)) => match too_deep_attribute(&attributes, level) {
                None => Ok(()),
                Some(key) => self.fail(format!("{}/{}", path(), pointer_segment(key)), depth_error()),
            },
            _ => self.fail(path(), "attributes must hold the JSON text of an object"),
        }
    }

    fn optional_non_negative(
        &self,
        array: &arrow_array::Float64Array,
        i: usize,
        path: impl Fn() -> String,
    ) -> Checked<()> {
        if array.is_null(i) { Ok(()) } else { self.rule(path, check_non_negative(array.value(i))) }
    }

    fn trace(&self, row: usize, scratch: &mut Scratch) -> Checked<Derived> {
        let c = self.columns;
        self.required_text(c.trace_id, row, || "/trace_id".into())?;
        self.required_text(c.task_id, row, || "/task_id".into())?;
        if c.group_id.is_valid(row) {
            self.rule(|| "/group_id".into(), check_non_empty(c.group_id.value(row)))?;
        }
        self.rule(|| "/topology".into(), self.batch.vocabularies.topology.code(row))?;
        if c.policy_version.is_valid(row) {
            self.rule(|| "/policy_version".into(), check_non_negative(c.policy_version.value(row) as f64))?;
        }
        if c.counterfactual_of.is_valid(row) {
            for (k, name) in ["trace_id", "event_id"].iter().enumerate() {
                let path = || format!("/counterfactual_of/{name}");
                self.required_text(c.counterfactual_of.column(k).as_string(), row, path)?;
            }
            let code = self.rule(|| "/counterfactual_of/kind".into(), self.batch.vocabularies.kind.code(row))?;
            if code.is_none() {
                return self.fail("/counterfactual_of/kind", "missing required field (null)");
            }
        }
        self.required(c.rewards, row, || "/rewards".into())?;
        self.numbers(c.rewards, row, || "/rewards".into(), check_finite)?;
        self.required(c.costs, row, || "/costs".into())?;
        let costs = c.cost_columns();
        for (name, array) in [("tokens", costs.tokens), ("wall_clock_s", costs.wall_clock_s)] {
            self.required(array, row, || format!("/costs/{name}"))?;
        }
        for (name, array) in [
            ("tokens", costs.tokens),
            ("wall_clock_s", costs.wall_clock_s),
            ("tool_calls", costs.tool_calls),
            ("messages", costs.messages),
        ] {
            self.optional_non_negative(array, row, || format!("/costs/{name}"))?;
        }
        self.numbers(costs.other, row, || "/costs".into(), check_non_negative)?;
        self.numbers(c.metrics, row, || "/metrics".into(), check_finite)?;
        self.json_object(c.attributes, row, 1, || "/attributes".into())?;
        self.graph(row, scratch)
    }

    fn graph(&self, row: usize, scratch: &mut Scratch) -> Checked<Derived> {
        let c = self.columns;
        self.required(c.events, row, || "/events".into())?;
        self.required(c.edges, row, || "/edges".into())?;
        let start = c.events.value_offsets()[row] as usize;
        let end = c.events.value_offsets()[row + 1] as usize;
        if start == end {
            return self.fail("/events", "a trace needs at least one event");
        }
        self.event_fields(start..end)?;
        let ev = &self.batch.events;
        if let Some((second, first)) = scratch.ids.first_repeat(ev.id, start..end) {
            return self.fail(
                format!("/events/{second}/id"),
                format!("duplicate event id {:?} (first used by /events/{first})", ev.id.value(start + second)),
            );
        }
        let pairs = self.edge_pairs(row)?;
        let n = end - start;
        let shape = check_graph(self.trace_id, &|i| ev.id.value(start + i).to_owned(), n, &pairs)?;
        let types = &self.batch.vocabularies.event_type;
        let acting = (start..end).filter(|&j| types.known_code(j) != EventType::ToolResult as i8);
        let agent_keys = ev.agent.keys().values();
        // Stamps only need to differ between the traces one thread checks.
        let stamp = row as u32 + 1;
        let n_agents = self.batch.agents.count(acting.map(|j| agent_keys[j] as usize), &mut scratch.agents_seen, stamp);
        Ok(Derived { n_events: n as i32, n_edges: pairs.len() as i32, n_agents: n_agents as i32, shape })
    }

    /// The per-event rules that do not already hold batch-wide, event by event.
    fn event_fields(&self, events: std::ops::Range<usize>) -> Checked<()> {
        let (clean, start) = (&self.batch.clean, events.start);
        let ev = &self.batch.events;
        if clean.everywhere() {
            return Ok(());
        }
        let event_structs = self.columns.events.values();
        for j in events {
            let local = j - start;
            let at = |field: &str| format!("/events/{local}/{field}");
            if !clean.events_present {
                self.required(event_structs.as_ref(), j, || format!("/events/{local}"))?;
            }
            if !clean.ids {
                self.required_text(ev.id, j, || at("id"))?;
            }
            if !clean.t {
                self.required(ev.t, j, || at("t"))?;
                self.rule(|| at("t"), check_non_negative(ev.t.value(j)))?;
            }
            if !clean.types && self.rule(|| at("type"), self.batch.vocabularies.event_type.code(j))?.is_none() {
                return self.fail(at("type"), "missing required field (null)");
            }
            if !clean.agents {
                self.required(ev.agent, j, || at("agent"))?;
                let agent = super::schema::dictionary_text(ev.agent, j).unwrap_or_default();
                self.rule(|| at("agent"), check_non_empty(agent))?;
            }
            if !clean.reward {
                self.numbers(ev.reward, j, || at("reward"), check_finite)?;
            }
            if !clean.tokens && ev.tokens.is_valid(j) {
                self.rule(|| at("tokens"), check_non_negative(ev.tokens.value(j) as f64))?;
            }
            if !clean.duration_s {
                self.optional_non_negative(ev.duration_s, j, || at("duration_s"))?;
            }
            if !clean.logprob && ev.logprob.is_valid(j) {
                self.rule(|| at("logprob"), check_logprob(ev.logprob.value(j)))?;
            }
            if !clean.attributes {
                self.json_object(ev.attributes, j, 3, || at("attributes"))?;
            }
        }
        Ok(())
    }

    /// The trace's edges as (src, dst) local indices, each checked for presence and sign.
    fn edge_pairs(&self, row: usize) -> Checked<Vec<(u32, u32)>> {
        let (edges, ed) = (self.columns.edges, &self.batch.edges);
        let edge_start = edges.value_offsets()[row] as usize;
        let edge_end = edges.value_offsets()[row + 1] as usize;
        let mut pairs = Vec::with_capacity(edge_end - edge_start);
        for k in edge_start..edge_end {
            let local = k - edge_start;
            let at = |field: &str| format!("/edges/{local}/{field}");
            if !self.batch.edges_clean {
                self.required(edges.values().as_ref(), k, || format!("/edges/{local}"))?;
                self.required(ed.src, k, || at("src"))?;
                self.required(ed.dst, k, || at("dst"))?;
                if self.rule(|| at("type"), self.batch.vocabularies.edge_type.code(k))?.is_none() {
                    return self.fail(at("type"), "missing required field (null)");
                }
            }
            let (src, dst) = (ed.src.value(k), ed.dst.value(k));
            for (name, end) in [("src", src), ("dst", dst)] {
                if end < 0 {
                    return self.fail(at(name), format!("event index {end} is negative"));
                }
            }
            pairs.push((src as u32, dst as u32));
        }
        Ok(pairs)
    }
}

/// A slice of a table keeps its list columns' whole child arrays; cut them to the rows in
/// view so that nothing built from them (missing columns, re-encoded codes) is sized by, and
/// nothing stored keeps alive, the rest of the parent table.
pub(crate) fn trim_lists(batch: &RecordBatch) -> Result<RecordBatch, MasreplayError> {
    let mut columns = batch.columns().to_vec();
    for column in columns.iter_mut() {
        let Some(list) = column.as_list_opt::<i32>() else { continue };
        let offsets = list.value_offsets();
        let (first, last) = (offsets[0], offsets[offsets.len() - 1]);
        if first == 0 && last as usize == list.values().len() {
            continue;
        }
        let rebased = OffsetBuffer::new(ScalarBuffer::from(offsets.iter().map(|o| o - first).collect::<Vec<i32>>()));
        let values = list.values().slice(first as usize, (last - first) as usize);
        let field = match list.data_type() {
            DataType::List(field) => field.clone(),
            _ => unreachable!("a list array has a list type"),
        };
        *column = Arc::new(ListArray::try_new(field, rebased, values, list.nulls().cloned())?);
    }
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

/// Conforms, checks and completes Arrow data in the canonical layout (see module docs).
pub fn ingest_batches(batches: &[RecordBatch]) -> Result<Ingested, MasreplayError> {
    ingest_well_formed(&WellFormed::check(batches)?)
}

/// [`ingest_batches`] for data already proven well-formed.
pub fn ingest_well_formed(batches: &WellFormed) -> Result<Ingested, MasreplayError> {
    let schema = canonical_schema();
    let target = DataType::Struct(schema.fields().clone());
    // One zero buffer for every batch and the result (trimmed lists are no longer).
    let zeros = batches.zeros();
    let mut conformed = Vec::with_capacity(batches.len());
    for batch in batches.iter() {
        crate::interrupt::checkpoint()?;
        let trimmed = trim_lists(batch)?;
        let whole: ArrayRef = Arc::new(StructArray::from(trimmed));
        conformed.push(conform(&whole, &target, "", true, &zeros)?);
    }
    let refs: Vec<&dyn Array> = conformed.iter().map(|a| a.as_ref()).collect();
    let whole = if refs.is_empty() { new_null_array(&target, 0) } else { concat_polled(&refs)? };
    let relaxed = RecordBatch::from(whole.as_struct().clone());
    let columns = TraceColumns::new(&relaxed);
    let check = BatchCheck::new(&columns);
    let checkpoint = Checkpoint::here();
    checkpoint.check()?;
    let outcomes: Vec<Checked<Derived>> = (0..relaxed.num_rows())
        .into_par_iter()
        .with_min_len(min_piece(longest_column(&relaxed)))
        .map_init(Scratch::default, |scratch, row| {
            checkpoint.check()?;
            let trace_id =
                columns.trace_id.is_valid(row).then(|| columns.trace_id.value(row)).filter(|s| !s.is_empty());
            Ok(RowCheck { batch: &check, columns: &columns, trace_id }.trace(row, scratch))
        })
        .collect::<Result<_, MasreplayError>>()?;

    checkpoint.check()?;
    let with_codes = replace_vocabularies(&relaxed, &check.vocabularies)?;
    let (derived, rejected) = split_outcomes(outcomes);
    let kept = if rejected.is_empty() {
        with_codes
    } else {
        let keep: BooleanArray =
            (0..relaxed.num_rows()).map(|row| Some(rejected.binary_search_by_key(&row, |r| r.0).is_err())).collect();
        arrow_select::filter::filter_record_batch(&with_codes, &keep)?
    };
    let batch = share_null_columns_over(&complete(&kept, &derived)?, &zeros);
    Ok(Ingested { batch, rejected })
}

/// Re-encodes the closed vocabularies of a batch that has the canonical schema (kernels such
/// as interleave rebuild dictionaries, which moves the codes).
pub(crate) fn with_canonical_codes(batch: &RecordBatch) -> Result<RecordBatch, MasreplayError> {
    let columns = TraceColumns::new(batch);
    let vocabularies = Vocabularies::of(&columns);
    let recoded = replace_vocabularies(batch, &vocabularies)?;
    Ok(RecordBatch::try_new(canonical_schema(), recoded.columns().to_vec())?)
}

/// Swaps every closed-vocabulary column for one with canonical codes.
fn replace_vocabularies(batch: &RecordBatch, vocabularies: &Vocabularies) -> Result<RecordBatch, MasreplayError> {
    let replace_child = |parent: &StructArray, name: &str, replacement: ArrayRef| -> Result<ArrayRef, MasreplayError> {
        let (fields, mut children, nulls) = parent.clone().into_parts();
        let index = fields.find(name).expect("canonical field").0;
        children[index] = replacement;
        let fields: Fields = fields
            .iter()
            .zip(&children)
            .map(|(f, c)| Arc::new(Field::new(f.name(), c.data_type().clone(), f.is_nullable())))
            .collect();
        Ok(Arc::new(StructArray::try_new(fields, children, nulls)?))
    };
    let replace_list = |list: &ListArray, name: &str, replacement: ArrayRef| -> Result<ArrayRef, MasreplayError> {
        let values = replace_child(list.values().as_struct(), name, replacement)?;
        let item = Arc::new(Field::new("item", values.data_type().clone(), list.values().null_count() > 0));
        Ok(Arc::new(ListArray::try_new(item, list.offsets().clone(), values, list.nulls().cloned())?))
    };
    let columns = TraceColumns::new(batch);
    let mut arrays = batch.columns().to_vec();
    let position = |name: &str| batch.schema().index_of(name).expect("canonical column");
    arrays[position("events")] = replace_list(columns.events, "type", vocabularies.event_type.canonical())?;
    arrays[position("edges")] = replace_list(columns.edges, "type", vocabularies.edge_type.canonical())?;
    arrays[position("topology")] = vocabularies.topology.canonical();
    arrays[position("counterfactual_of")] =
        replace_child(columns.counterfactual_of, "kind", vocabularies.kind.canonical())?;
    let fields: Vec<Field> = batch
        .schema()
        .fields()
        .iter()
        .zip(&arrays)
        .map(|(f, a)| Field::new(f.name(), a.data_type().clone(), f.is_nullable()))
        .collect();
    Ok(RecordBatch::try_new(Arc::new(arrow_schema::Schema::new(fields)), arrays)?)
}

/// Fills group_id from task_id, sets the derived columns and declares the canonical schema
/// (which also proves no required field is left null).
fn complete(batch: &RecordBatch, derived: &[Derived]) -> Result<RecordBatch, MasreplayError> {
    let columns = TraceColumns::new(batch);
    let group_id: StringArray = (0..batch.num_rows())
        .map(|row| {
            Some(if columns.group_id.is_valid(row) { columns.group_id.value(row) } else { columns.task_id.value(row) })
        })
        .collect();
    let mut arrays = batch.columns().to_vec();
    arrays[batch.schema().index_of("group_id").expect("canonical column")] = Arc::new(group_id);
    let counterfactual_of = batch.schema().index_of("counterfactual_of").expect("canonical column");
    arrays[counterfactual_of] = without_child_nulls(columns.counterfactual_of)?;
    let first_derived = batch.schema().index_of(super::schema::DERIVED_COLUMNS[0]).expect("canonical column");
    for (offset, column) in derived_columns(derived).into_iter().enumerate() {
        arrays[first_derived + offset] = column;
    }
    let schema = canonical_schema();
    let whole: ArrayRef = Arc::new(StructArray::try_new(
        Fields::from(
            batch
                .schema()
                .fields()
                .iter()
                .zip(&arrays)
                .map(|(f, a)| Field::new(f.name(), a.data_type().clone(), f.is_nullable()))
                .collect::<Vec<_>>(),
        ),
        arrays,
        None,
    )?);
    // Every column is present by now: nothing is filled with nulls.
    let strict = conform(&whole, &DataType::Struct(schema.fields().clone()), "", false, &Zeros::new(0))?;
    let (_, arrays, _) = strict.as_struct().clone().into_parts();
    Ok(RecordBatch::try_new(schema, arrays)?)
}

/// `counterfactual_of` as the builder writes it: where the struct is null, its required
/// children hold "" and the first kind instead of nulls of their own. A Parquet reader gives
/// them nulls there, which the schema allows but pyarrow's Parquet writer refuses in a
/// non-nullable field: a batch read from a file could not be written again with pyarrow.
fn without_child_nulls(parent: &StructArray) -> Result<ArrayRef, MasreplayError> {
    let (fields, children, nulls) = parent.clone().into_parts();
    let children = children
        .into_iter()
        .map(|child| -> Result<ArrayRef, MasreplayError> {
            if child.null_count() == 0 {
                return Ok(child);
            }
            Ok(match child.data_type() {
                DataType::Utf8 => {
                    Arc::new(child.as_string::<i32>().iter().map(|v| Some(v.unwrap_or(""))).collect::<StringArray>())
                }
                DataType::Dictionary(key, _) if **key == DataType::Int8 => {
                    let kinds = child.as_dictionary::<Int8Type>();
                    let keys: Int8Array = kinds.keys().iter().map(|key| Some(key.unwrap_or(0))).collect();
                    Arc::new(DictionaryArray::<Int8Type>::try_new(keys, kinds.values().clone())?)
                }
                _ => child,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Arc::new(StructArray::try_new(fields, children, nulls)?))
}

#[cfg(test)]
mod tests {
    use arrow_array::types::Int8Type;

    use super::*;

    fn canonical_of(names: Vec<Option<&str>>, keys: Vec<Option<i8>>) -> ArrayRef {
        let source = DictionaryArray::<Int8Type>::try_new(Int8Array::from(keys), Arc::new(StringArray::from(names)))
            .expect("keys index the dictionary");
        Vocabulary::new(&source, EdgeType::NAMES).canonical()
    }

    #[test]
    fn keys_are_kept_only_where_the_dictionary_spells_the_vocabulary_in_order() {
        let (first, second) = (EdgeType::NAMES[0], EdgeType::NAMES[1]);
        // A prefix of the vocabulary, with a null slot: the keys are the codes, kept as they are.
        let keys = vec![Some(1), None, Some(0), Some(1)];
        let kept = canonical_of(vec![Some(first), Some(second)], keys.clone());
        kept.to_data().validate_full().expect("a valid dictionary");
        let kept = kept.as_dictionary::<Int8Type>();
        assert!(Arc::ptr_eq(kept.values(), &vocabulary(EdgeType::NAMES)));
        assert_eq!(kept.keys(), &Int8Array::from(keys));
        // Out of order, or with a value outside the vocabulary: recoded (the unknown value gets
        // the placeholder 0, its trace is rejected by the per-trace check).
        for (names, codes) in [
            (vec![Some(second), Some(first)], vec![Some(0), None, Some(1), Some(0)]),
            (vec![Some(first), Some("no such type")], vec![Some(0), None, Some(0), Some(0)]),
            (vec![Some(first), None], vec![Some(0), None, Some(0), Some(0)]),
        ] {
            let recoded = canonical_of(names, vec![Some(1), None, Some(0), Some(1)]);
            recoded.to_data().validate_full().expect("a valid dictionary");
            assert_eq!(recoded.as_dictionary::<Int8Type>().keys(), &Int8Array::from(codes));
        }
    }
}
