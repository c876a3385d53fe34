//! The canonical Arrow layout: one row per trace, events and edges as list columns (their
//! offsets are the CSR of the batch), categoricals dictionary-encoded. The same schema is used
//! in memory, in Parquet and in Arrow IPC.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use arrow_array::cast::AsArray;
use arrow_array::types::{Int8Type, Int32Type};
use arrow_array::{
    Array, ArrayRef, BooleanArray, DictionaryArray, Float64Array, Int32Array, Int64Array, ListArray, MapArray,
    RecordBatch, StringArray, StructArray,
};
use arrow_buffer::ArrowNativeType;
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef};

use crate::trace::{CounterfactualKind, EdgeType, EventType, Topology};

pub const SCHEMA_VERSION_KEY: &str = "masreplay.schema_version";

/// The derived per-trace columns, computed at ingest.
pub const DERIVED_COLUMNS: &[&str] = &["n_events", "n_edges", "n_agents", "depth", "max_branching"];

/// Dictionary type of a closed vocabulary (event, edge, topology and counterfactual kinds):
/// int8 codes over the whole vocabulary, so a code is the same in every batch.
pub fn enum_type() -> DataType {
    DataType::Dictionary(Box::new(DataType::Int8), Box::new(DataType::Utf8))
}

/// Dictionary type of an open vocabulary (agents, roles, tools): codes local to a batch.
pub fn category_type() -> DataType {
    DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
}

/// A map from names to numbers (reward channels, costs, metrics), with pyarrow's field names.
pub fn named_numbers_type() -> DataType {
    let entries = Field::new(
        "entries",
        DataType::Struct(Fields::from(vec![
            Field::new("key", DataType::Utf8, false),
            Field::new("value", DataType::Float64, true),
        ])),
        false,
    );
    DataType::Map(Arc::new(entries), false)
}

pub fn event_fields() -> Fields {
    Fields::from(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("t", DataType::Float64, false),
        Field::new("type", enum_type(), false),
        Field::new("agent", category_type(), false),
        Field::new("role", category_type(), true),
        Field::new("from", category_type(), true),
        Field::new("to", category_type(), true),
        Field::new("tool", category_type(), true),
        Field::new("content_ref", DataType::Utf8, true),
        Field::new("trusted", DataType::Boolean, true),
        Field::new("reward", named_numbers_type(), true),
        Field::new("tokens", DataType::Int64, true),
        Field::new("duration_s", DataType::Float64, true),
        Field::new("logprob", DataType::Float64, true),
        Field::new("attributes", DataType::Utf8, true),
    ])
}

pub fn edge_fields() -> Fields {
    Fields::from(vec![
        Field::new("src", DataType::Int32, false),
        Field::new("dst", DataType::Int32, false),
        Field::new("type", enum_type(), false),
    ])
}

pub fn cost_fields() -> Fields {
    Fields::from(vec![
        Field::new("tokens", DataType::Float64, false),
        Field::new("wall_clock_s", DataType::Float64, false),
        Field::new("tool_calls", DataType::Float64, true),
        Field::new("messages", DataType::Float64, true),
        Field::new("other", named_numbers_type(), true),
    ])
}

pub fn counterfactual_fields() -> Fields {
    Fields::from(vec![
        Field::new("trace_id", DataType::Utf8, false),
        Field::new("event_id", DataType::Utf8, false),
        Field::new("kind", enum_type(), false),
    ])
}

fn list_of(fields: Fields) -> DataType {
    DataType::List(Arc::new(Field::new("item", DataType::Struct(fields), false)))
}

/// The canonical schema of a trace table.
pub fn canonical_schema() -> SchemaRef {
    static SCHEMA: OnceLock<SchemaRef> = OnceLock::new();
    SCHEMA
        .get_or_init(|| {
            let mut fields = vec![
                Field::new("trace_id", DataType::Utf8, false),
                Field::new("task_id", DataType::Utf8, false),
                Field::new("group_id", DataType::Utf8, false),
                Field::new("system", DataType::Utf8, true),
                Field::new("topology", enum_type(), true),
                Field::new("policy_version", DataType::Int64, true),
                Field::new("counterfactual_of", DataType::Struct(counterfactual_fields()), true),
                Field::new("events", list_of(event_fields()), false),
                Field::new("edges", list_of(edge_fields()), false),
                Field::new("rewards", named_numbers_type(), false),
                Field::new("costs", DataType::Struct(cost_fields()), false),
                Field::new("metrics", named_numbers_type(), true),
                Field::new("attributes", DataType::Utf8, true),
            ];
            fields.extend(DERIVED_COLUMNS.iter().map(|name| Field::new(*name, DataType::Int32, false)));
            let metadata = HashMap::from([(SCHEMA_VERSION_KEY.to_owned(), crate::trace::SCHEMA_VERSION.to_string())]);
            Arc::new(Schema::new_with_metadata(fields, metadata))
        })
        .clone()
}

/// One shared values array per closed vocabulary: arrays that share it concatenate without
/// merging dictionaries, so codes stay equal to the vocabulary index.
pub fn vocabulary(names: &'static [&'static str]) -> ArrayRef {
    static CACHE: OnceLock<[ArrayRef; 4]> = OnceLock::new();
    let all = CACHE.get_or_init(|| {
        [EventType::NAMES, EdgeType::NAMES, Topology::NAMES, CounterfactualKind::NAMES]
            .map(|names| Arc::new(StringArray::from(names.to_vec())) as ArrayRef)
    });
    let index = [EventType::NAMES, EdgeType::NAMES, Topology::NAMES, CounterfactualKind::NAMES]
        .iter()
        .position(|candidate| *candidate == names)
        .expect("a closed vocabulary of the trace model");
    all[index].clone()
}

/// Typed views of a canonical batch's columns, downcast once.
pub struct TraceColumns<'a> {
    pub trace_id: &'a StringArray,
    pub task_id: &'a StringArray,
    pub group_id: &'a StringArray,
    pub system: &'a StringArray,
    pub topology: &'a DictionaryArray<Int8Type>,
    pub policy_version: &'a Int64Array,
    pub counterfactual_of: &'a StructArray,
    pub events: &'a ListArray,
    pub edges: &'a ListArray,
    pub rewards: &'a MapArray,
    pub costs: &'a StructArray,
    pub metrics: &'a MapArray,
    pub attributes: &'a StringArray,
}

pub struct EventColumns<'a> {
    pub id: &'a StringArray,
    pub t: &'a Float64Array,
    pub event_type: &'a DictionaryArray<Int8Type>,
    pub agent: &'a DictionaryArray<Int32Type>,
    pub role: &'a DictionaryArray<Int32Type>,
    pub from: &'a DictionaryArray<Int32Type>,
    pub to: &'a DictionaryArray<Int32Type>,
    pub tool: &'a DictionaryArray<Int32Type>,
    pub content_ref: &'a StringArray,
    pub trusted: &'a BooleanArray,
    pub reward: &'a MapArray,
    pub tokens: &'a Int64Array,
    pub duration_s: &'a Float64Array,
    pub logprob: &'a Float64Array,
    pub attributes: &'a StringArray,
}

pub struct EdgeColumns<'a> {
    pub src: &'a Int32Array,
    pub dst: &'a Int32Array,
    pub edge_type: &'a DictionaryArray<Int8Type>,
}

pub struct CostColumns<'a> {
    pub tokens: &'a Float64Array,
    pub wall_clock_s: &'a Float64Array,
    pub tool_calls: &'a Float64Array,
    pub messages: &'a Float64Array,
    pub other: &'a MapArray,
}

impl<'a> TraceColumns<'a> {
    /// The batch must have the canonical schema (as every batch built or conformed here has).
    pub fn new(batch: &'a RecordBatch) -> Self {
        let column = |name: &str| batch.column_by_name(name).expect("canonical column").as_ref();
        TraceColumns {
            trace_id: column("trace_id").as_string(),
            task_id: column("task_id").as_string(),
            group_id: column("group_id").as_string(),
            system: column("system").as_string(),
            topology: column("topology").as_dictionary(),
            policy_version: column("policy_version").as_primitive(),
            counterfactual_of: column("counterfactual_of").as_struct(),
            events: column("events").as_list(),
            edges: column("edges").as_list(),
            rewards: column("rewards").as_map(),
            costs: column("costs").as_struct(),
            metrics: column("metrics").as_map(),
            attributes: column("attributes").as_string(),
        }
    }

    pub fn event_columns(&self) -> EventColumns<'a> {
        let events = self.events.values().as_struct();
        let column = |name: &str| events.column_by_name(name).expect("canonical event field").as_ref();
        EventColumns {
            id: column("id").as_string(),
            t: column("t").as_primitive(),
            event_type: column("type").as_dictionary(),
            agent: column("agent").as_dictionary(),
            role: column("role").as_dictionary(),
            from: column("from").as_dictionary(),
            to: column("to").as_dictionary(),
            tool: column("tool").as_dictionary(),
            content_ref: column("content_ref").as_string(),
            trusted: column("trusted").as_boolean(),
            reward: column("reward").as_map(),
            tokens: column("tokens").as_primitive(),
            duration_s: column("duration_s").as_primitive(),
            logprob: column("logprob").as_primitive(),
            attributes: column("attributes").as_string(),
        }
    }

    pub fn edge_columns(&self) -> EdgeColumns<'a> {
        let edges = self.edges.values().as_struct();
        let column = |name: &str| edges.column_by_name(name).expect("canonical edge field").as_ref();
        EdgeColumns {
            src: column("src").as_primitive(),
            dst: column("dst").as_primitive(),
            edge_type: column("type").as_dictionary(),
        }
    }

    pub fn cost_columns(&self) -> CostColumns<'a> {
        let column = |name: &str| self.costs.column_by_name(name).expect("canonical cost field").as_ref();
        CostColumns {
            tokens: column("tokens").as_primitive(),
            wall_clock_s: column("wall_clock_s").as_primitive(),
            tool_calls: column("tool_calls").as_primitive(),
            messages: column("messages").as_primitive(),
            other: column("other").as_map(),
        }
    }
}

/// The string behind row `i` of a string dictionary, or `None` where the row is null.
pub fn dictionary_text<K: arrow_array::types::ArrowDictionaryKeyType>(
    array: &DictionaryArray<K>,
    i: usize,
) -> Option<&str> {
    if array.is_null(i) {
        return None;
    }
    let key = array.keys().value(i).as_usize();
    Some(array.values().as_string::<i32>().value(key))
}

/// Entries of row `i` of a name -> number map, or `None` where the row is null.
pub fn named_numbers_at(map: &MapArray, i: usize) -> Option<Vec<(String, f64)>> {
    if map.is_null(i) {
        return None;
    }
    let range = map.value_offsets()[i] as usize..map.value_offsets()[i + 1] as usize;
    let keys = map.keys().as_string::<i32>();
    let values = map.values().as_primitive::<arrow_array::types::Float64Type>();
    Some(range.map(|j| (keys.value(j).to_owned(), values.value(j))).collect())
}
