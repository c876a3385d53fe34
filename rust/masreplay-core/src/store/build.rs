//! Validated [`Trace`]s -> one canonical record batch. Columns are built flat and then wrapped
//! in their list offsets, so no per-trace arrays are ever allocated. Each column is one pass
//! over all events or edges, independent of the others, so they are built in parallel.

use std::sync::Arc;

use arrow_array::builder::{Float64Builder, Int32Builder, MapBuilder, MapFieldNames, StringBuilder};
use arrow_array::types::{Int8Type, Int32Type};
use arrow_array::{
    Array, ArrayRef, BooleanArray, DictionaryArray, Float64Array, Int8Array, Int32Array, Int64Array, ListArray,
    RecordBatch, StringArray, StructArray,
};
use arrow_buffer::{NullBuffer, OffsetBuffer};
use arrow_schema::{ArrowError, DataType, Fields};
use rayon::prelude::*;

// Each category text is hashed once per row: foldhash, not SipHash.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

use super::schema::{canonical_schema, cost_fields, counterfactual_fields, edge_fields, event_fields, vocabulary};
use crate::graph::{Shape, acyclic_shape};
use crate::parallel::{self, min_piece};
use crate::trace::{CounterfactualKind, EdgeType, EventType, NamedNumbers, Topology, Trace};

/// Builds a map column from optional rows of named numbers.
pub(crate) fn named_numbers_column<'a>(rows: impl Iterator<Item = Option<&'a NamedNumbers>>) -> ArrayRef {
    let names = MapFieldNames { entry: "entries".into(), key: "key".into(), value: "value".into() };
    let mut builder = MapBuilder::new(Some(names), StringBuilder::new(), Float64Builder::new());
    for row in rows {
        match row {
            Some(numbers) => {
                for (key, value) in numbers {
                    builder.keys().append_value(key);
                    builder.values().append_value(*value);
                }
                builder.append(true).expect("keys and values appended together");
            }
            None => builder.append(false).expect("keys and values appended together"),
        }
    }
    Arc::new(builder.finish())
}

/// A dictionary column over a closed vocabulary, sharing its values array.
pub(crate) fn enum_column(codes: Vec<Option<i8>>, names: &'static [&'static str]) -> ArrayRef {
    let keys = Int8Array::from(codes);
    Arc::new(DictionaryArray::<Int8Type>::try_new(keys, vocabulary(names)).expect("codes index the vocabulary"))
}

/// A dictionary column of texts: each distinct text stored once, in the order first seen (as
/// arrow's `StringDictionaryBuilder` stores them), found again through a map of the texts
/// themselves (arrow's builder, hashing and comparing its stored copies, was half of the build
/// of a converted batch).
fn category_column<'a>(values: impl Iterator<Item = Option<&'a str>>) -> ArrayRef {
    let mut keys = Int32Builder::with_capacity(values.size_hint().0);
    let mut texts = StringBuilder::new();
    let mut known: HashMap<&str, i32> = HashMap::default();
    for value in values {
        let Some(value) = value else {
            keys.append_null();
            continue;
        };
        let next = known.len();
        let key = *known.entry(value).or_insert_with(|| {
            texts.append_value(value);
            // A column holds fewer distinct texts than its list offsets (i32) count rows.
            i32::try_from(next).expect("fewer distinct texts than rows")
        });
        keys.append_value(key);
    }
    Arc::new(
        DictionaryArray::<Int32Type>::try_new(keys.finish(), Arc::new(texts.finish())).expect("keys index the texts"),
    )
}

/// A text column, its buffers sized first: megabytes of text copied once, not grown by doubling
/// (each growth a copy, and fresh pages to fault in).
fn text_column<'a>(texts: impl Iterator<Item = Option<&'a str>> + Clone) -> ArrayRef {
    let (count, bytes) =
        texts.clone().fold((0, 0), |(count, bytes), text| (count + 1, bytes + text.map_or(0, str::len)));
    let mut column = StringBuilder::with_capacity(count, bytes);
    for text in texts {
        column.append_option(text);
    }
    array(column.finish())
}

fn json_text_column<'a>(
    values: impl Iterator<Item = Option<&'a serde_json::Map<String, serde_json::Value>>>,
) -> ArrayRef {
    // Each object written straight into the column (a copy of it as a `Value` first was half
    // the column's time); JSON values written into memory are UTF-8 and cannot fail.
    let mut texts = StringBuilder::new();
    let mut text = Vec::new();
    for object in values {
        text.clear();
        let written = object.and_then(|object| serde_json::to_writer(&mut text, object).ok());
        match written.and_then(|()| std::str::from_utf8(&text).ok()) {
            Some(text) => texts.append_value(text),
            None => texts.append_null(),
        }
    }
    Arc::new(texts.finish())
}

fn list_column(
    fields: Fields,
    columns: Vec<ArrayRef>,
    lengths: impl Iterator<Item = usize>,
) -> Result<ArrayRef, ArrowError> {
    let values = StructArray::try_new(fields.clone(), columns, None)?;
    let item = Arc::new(arrow_schema::Field::new("item", DataType::Struct(fields), false));
    Ok(Arc::new(ListArray::try_new(item, OffsetBuffer::from_lengths(lengths), Arc::new(values), None)?))
}

/// Counts distinct agents that act in a trace; a tool_result's `agent` names the tool that
/// answered (as in the seed example), not a member of the team.
pub(crate) fn count_agents<'a>(agents: impl Iterator<Item = (EventTypeCode, &'a str)>) -> usize {
    let mut acting: Vec<&str> =
        agents.filter(|(code, _)| *code != EventType::ToolResult as i8).map(|(_, agent)| agent).collect();
    acting.sort_unstable();
    acting.dedup();
    acting.len()
}

pub(crate) type EventTypeCode = i8;

/// The derived graph columns of one trace.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Derived {
    pub n_events: i32,
    pub n_edges: i32,
    pub n_agents: i32,
    pub shape: Shape,
}

pub(crate) fn derived_columns(derived: &[Derived]) -> Vec<ArrayRef> {
    let column = |f: fn(&Derived) -> i32| Arc::new(derived.iter().map(f).collect::<Int32Array>()) as ArrayRef;
    vec![
        column(|d| d.n_events),
        column(|d| d.n_edges),
        column(|d| d.n_agents),
        column(|d| d.shape.depth as i32),
        column(|d| d.shape.max_branching as i32),
    ]
}

fn derive(trace: &Trace) -> Derived {
    let pairs: Vec<(u32, u32)> = trace.edges.iter().map(|e| (e.src, e.dst)).collect();
    Derived {
        n_events: trace.events.len() as i32,
        n_edges: trace.edges.len() as i32,
        n_agents: count_agents(trace.events.iter().map(|e| (e.event_type as i8, e.agent.as_str()))) as i32,
        // Validated traces are acyclic.
        shape: acyclic_shape(trace.events.len(), &pairs).unwrap_or_default(),
    }
}

fn array(array: impl Array + 'static) -> ArrayRef {
    Arc::new(array)
}

/// Runs independent column builders on the rayon pool, keeping their order.
fn in_parallel(values: usize, columns: &[&(dyn Fn() -> ArrayRef + Sync)]) -> Vec<ArrayRef> {
    columns.par_iter().with_min_len(min_piece(values)).map(|column| column()).collect()
}

/// Builds the canonical batch of already-validated traces.
pub fn batch_from_traces(traces: &[Trace]) -> Result<RecordBatch, ArrowError> {
    batch(traces, &|| json_text_column(traces.iter().flat_map(|t| t.events.iter()).map(|e| e.attributes.as_ref())))
}

/// The attributes of a trace's events as the JSON text of one object each (or none), written
/// one after the other into one text: no text of its own to make and free per event.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AttributeTexts {
    text: String,
    /// Where each event's text is in `text` (`None`: the event has no attributes).
    ranges: Vec<Option<(usize, usize)>>,
}

impl AttributeTexts {
    /// The texts of `ranges` of `text`, one per event.
    pub fn new(text: String, ranges: Vec<Option<(usize, usize)>>) -> Self {
        AttributeTexts { text, ranges }
    }

    /// How many events the texts are of.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Each event's text, in the order of the events (`None`: it has none).
    pub fn texts(&self) -> impl Iterator<Item = Option<&str>> + Clone {
        self.ranges.iter().map(|range| range.and_then(|(start, end)| self.text.get(start..end)))
    }
}

/// [`batch_from_traces`] of traces whose events' attributes are given apart, as the JSON text
/// of one object each (`attributes[trace]`), and stored as given.
pub(crate) fn batch_from_traces_and_attributes(
    traces: &[Trace],
    attributes: &[AttributeTexts],
) -> Result<RecordBatch, ArrowError> {
    let given: usize = attributes.iter().map(AttributeTexts::len).sum();
    let events: usize = traces.iter().map(|t| t.events.len()).sum();
    if attributes.len() != traces.len() || given != events {
        return Err(ArrowError::InvalidArgumentError(format!(
            "attributes given for {given} events of {} traces, the traces have {events} events in {}",
            attributes.len(),
            traces.len()
        )));
    }
    batch(traces, &|| text_column(attributes.iter().flat_map(AttributeTexts::texts)))
}

/// The canonical batch of `traces`, the events' attributes column made by `event_attributes`.
fn batch(traces: &[Trace], event_attributes: &(dyn Fn() -> ArrayRef + Sync)) -> Result<RecordBatch, ArrowError> {
    let events: Vec<_> = traces.iter().flat_map(|t| t.events.iter()).collect();
    let edges: Vec<_> = traces.iter().flat_map(|t| t.edges.iter()).collect();

    let event_columns = || {
        in_parallel(
            events.len(),
            &[
                &|| text_column(events.iter().map(|e| Some(e.id.as_str()))),
                &|| array(events.iter().map(|e| e.t).collect::<Float64Array>()),
                &|| enum_column(events.iter().map(|e| Some(e.event_type as i8)).collect(), EventType::NAMES),
                &|| category_column(events.iter().map(|e| Some(e.agent.as_str()))),
                &|| category_column(events.iter().map(|e| e.role.as_deref())),
                &|| category_column(events.iter().map(|e| e.from.as_deref())),
                &|| category_column(events.iter().map(|e| e.to.as_deref())),
                &|| category_column(events.iter().map(|e| e.tool.as_deref())),
                &|| text_column(events.iter().map(|e| e.content_ref.as_deref())),
                &|| array(events.iter().map(|e| e.trusted).collect::<BooleanArray>()),
                &|| named_numbers_column(events.iter().map(|e| e.reward.as_ref())),
                &|| array(events.iter().map(|e| e.tokens).collect::<Int64Array>()),
                &|| array(events.iter().map(|e| e.duration_s).collect::<Float64Array>()),
                &|| array(events.iter().map(|e| e.logprob).collect::<Float64Array>()),
                event_attributes,
            ],
        )
    };
    let edge_columns = || {
        in_parallel(
            edges.len(),
            &[
                &|| array(edges.iter().map(|e| e.src as i32).collect::<Int32Array>()),
                &|| array(edges.iter().map(|e| e.dst as i32).collect::<Int32Array>()),
                &|| enum_column(edges.iter().map(|e| Some(e.edge_type as i8)).collect(), EdgeType::NAMES),
            ],
        )
    };
    let derived = || traces.par_iter().with_min_len(min_piece(events.len())).map(derive).collect::<Vec<Derived>>();
    let values = events.len() + edges.len();
    let (event_columns, (edge_columns, derived)) =
        parallel::join(values, event_columns, || parallel::join(values, edge_columns, derived));

    let counterfactual = {
        let present: Vec<bool> = traces.iter().map(|t| t.counterfactual_of.is_some()).collect();
        fn of(t: &Trace) -> Option<&crate::trace::CounterfactualOf> {
            t.counterfactual_of.as_ref()
        }
        let columns: Vec<ArrayRef> = vec![
            Arc::new(traces.iter().map(|t| Some(of(t).map_or("", |c| c.trace_id.as_str()))).collect::<StringArray>()),
            Arc::new(traces.iter().map(|t| Some(of(t).map_or("", |c| c.event_id.as_str()))).collect::<StringArray>()),
            enum_column(
                traces.iter().map(|t| Some(of(t).map_or(CounterfactualKind::Substitute, |c| c.kind) as i8)).collect(),
                CounterfactualKind::NAMES,
            ),
        ];
        StructArray::try_new(counterfactual_fields(), columns, Some(NullBuffer::from(present)))?
    };
    let costs = {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(traces.iter().map(|t| t.costs.tokens).collect::<Float64Array>()),
            Arc::new(traces.iter().map(|t| t.costs.wall_clock_s).collect::<Float64Array>()),
            Arc::new(traces.iter().map(|t| t.costs.tool_calls).collect::<Float64Array>()),
            Arc::new(traces.iter().map(|t| t.costs.messages).collect::<Float64Array>()),
            named_numbers_column(traces.iter().map(|t| (!t.costs.other.is_empty()).then_some(&t.costs.other))),
        ];
        StructArray::try_new(cost_fields(), columns, None)?
    };

    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(traces.iter().map(|t| Some(t.trace_id.as_str())).collect::<StringArray>()),
        Arc::new(traces.iter().map(|t| Some(t.task_id.as_str())).collect::<StringArray>()),
        Arc::new(traces.iter().map(|t| Some(t.group_id())).collect::<StringArray>()),
        Arc::new(traces.iter().map(|t| t.system.as_deref()).collect::<StringArray>()),
        enum_column(traces.iter().map(|t| t.topology.map(|x| x as i8)).collect(), Topology::NAMES),
        Arc::new(traces.iter().map(|t| t.policy_version).collect::<Int64Array>()),
        Arc::new(counterfactual),
        list_column(event_fields(), event_columns, traces.iter().map(|t| t.events.len()))?,
        list_column(edge_fields(), edge_columns, traces.iter().map(|t| t.edges.len()))?,
        named_numbers_column(traces.iter().map(|t| Some(&t.rewards))),
        Arc::new(costs),
        named_numbers_column(traces.iter().map(|t| t.metrics.as_ref())),
        json_text_column(traces.iter().map(|t| t.attributes.as_ref())),
    ];
    columns.extend(derived_columns(&derived));
    RecordBatch::try_new(canonical_schema(), columns)
}

#[cfg(test)]
mod tests {
    use arrow_array::builder::StringDictionaryBuilder;
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Texts from a small alphabet (repeats, the empty text, nulls): the column arrow's
        /// dictionary builder makes, key for key and text for text.
        #[test]
        fn category_columns_are_arrow_dictionary_columns(
            values in proptest::collection::vec(proptest::option::of("[ab\u{e9}]{0,3}"), 0..200)
        ) {
            let ours = category_column(values.iter().map(Option::as_deref));
            let mut arrow = StringDictionaryBuilder::<Int32Type>::new();
            for value in &values {
                arrow.append_option(value.as_deref());
            }
            let arrow: ArrayRef = Arc::new(arrow.finish());
            ours.to_data().validate_full().expect("a valid column");
            prop_assert_eq!(ours.to_data(), arrow.to_data());
        }
    }
}
