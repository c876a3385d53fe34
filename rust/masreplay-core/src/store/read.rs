//! Reading a canonical batch: one row -> a [`Trace`] (for dict and JSON export), and the
//! per-trace values that estimators read without building traces.

use arrow_array::Array;
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int8Type};
use arrow_array::{DictionaryArray, RecordBatch, StringArray};
use arrow_buffer::NullBuffer;
use foldhash::fast::FixedState;
use hashbrown::HashMap;
use rayon::prelude::*;
use serde_json::{Map, Value};

use super::schema::{TraceColumns, dictionary_text, named_numbers_at};
use crate::error::{MasreplayError, Result};
use crate::parallel::min_piece;
use crate::trace::{Costs, CounterfactualKind, CounterfactualOf, Edge, EdgeType, Event, EventType, Topology, Trace};

/// String equality for short ids and keys compared once per trace: inlined, where `==` calls
/// memcmp, whose call costs more than comparing a dozen bytes; eight bytes at a time.
#[inline]
pub(crate) fn same_text(a: &str, b: &str) -> bool {
    same_bytes(a.as_bytes(), b.as_bytes())
}

/// [`same_text`] on bytes.
#[inline]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let (words_a, words_b) = (a.chunks_exact(8), b.chunks_exact(8));
    let tails_equal = words_a.remainder().iter().zip(words_b.remainder()).all(|(x, y)| x == y);
    let word = |bytes: &[u8]| u64::from_ne_bytes(bytes.try_into().expect("chunks of eight bytes"));
    tails_equal && words_a.zip(words_b).all(|(x, y)| word(x) == word(y))
}

/// Reads one channel of the traces' `rewards` maps, trace by trace, without building traces.
/// It holds the map's buffers as plain slices: read for every trace of a batch, the
/// accessors' checks and calls per entry cost as much as the memory they read.
pub(crate) struct ChannelReader<'a> {
    /// Where each trace's entries start (one more than there are traces).
    offsets: &'a [i32],
    /// Where each entry's key starts among `key_bytes` (one more than there are entries).
    key_offsets: &'a [i32],
    key_bytes: &'a [u8],
    values: &'a [f64],
    value_nulls: Option<&'a NullBuffer>,
    channel: &'a str,
}

impl<'a> ChannelReader<'a> {
    pub(crate) fn new(columns: &TraceColumns<'a>, channel: &'a str) -> Self {
        let rewards = columns.rewards;
        let keys = rewards.keys().as_string::<i32>();
        let values = rewards.values().as_primitive::<Float64Type>();
        ChannelReader {
            offsets: rewards.value_offsets(),
            key_offsets: keys.value_offsets(),
            key_bytes: keys.value_data(),
            values: values.values(),
            value_nulls: values.nulls(),
            channel,
        }
    }

    /// The channel's value on trace `row` (NaN where the trace lacks it or it is null).
    #[inline]
    pub(crate) fn at(&self, row: usize) -> f64 {
        let channel = self.channel.as_bytes();
        for j in self.offsets[row] as usize..self.offsets[row + 1] as usize {
            let key = self.key_bytes.get(self.key_offsets[j] as usize..self.key_offsets[j + 1] as usize);
            if key.is_some_and(|key| same_bytes(key, channel)) {
                return match self.value_nulls {
                    Some(nulls) if nulls.is_null(j) => f64::NAN,
                    _ => self.values.get(j).copied().unwrap_or(f64::NAN),
                };
            }
        }
        f64::NAN
    }
}

/// The named channel of every trace's `rewards` (NaN where a trace lacks it or it is null).
pub fn trace_channel(batch: &super::TraceBatch, channel: &str) -> Vec<f64> {
    let columns = TraceColumns::new(batch.record_batch());
    let reader = ChannelReader::new(&columns, channel);
    (0..batch.len()).into_par_iter().with_min_len(min_piece(batch.len())).map(|row| reader.at(row)).collect()
}

/// Codes of a per-trace text column (`group_id`, `task_id`): `0..` in order of first
/// appearance, equal texts equal codes (Arrow's `dictionary_encode` numbering).
pub fn trace_text_codes(batch: &super::TraceBatch, name: &str) -> Result<Vec<i64>> {
    let column = batch.trace_field(name)?;
    let Some(texts) = column.as_string_opt::<i32>() else {
        return Err(MasreplayError::InvalidArgument(format!("trace field {name:?} is not text")));
    };
    let mut codes: HashMap<&str, i64, FixedState> =
        HashMap::with_capacity_and_hasher(texts.len(), FixedState::default());
    Ok(texts
        .iter()
        .map(|text| {
            let next = codes.len() as i64;
            *codes.entry(text.unwrap_or("")).or_insert(next)
        })
        .collect())
}

fn text(array: &StringArray, i: usize) -> Option<String> {
    array.is_valid(i).then(|| array.value(i).to_owned())
}

fn json_object(array: &StringArray, i: usize) -> Option<Map<String, Value>> {
    if array.is_null(i) {
        return None;
    }
    match serde_json::from_str(array.value(i)) {
        Ok(Value::Object(object)) => Some(object),
        _ => None,
    }
}

/// Decodes a closed-vocabulary value by its text, so reading never depends on code order.
fn closed<E>(array: &DictionaryArray<Int8Type>, i: usize, parse: fn(&str) -> Option<E>) -> Option<E> {
    dictionary_text(array, i).and_then(parse)
}

fn optional<T: arrow_array::ArrowPrimitiveType>(array: &arrow_array::PrimitiveArray<T>, i: usize) -> Option<T::Native> {
    array.is_valid(i).then(|| array.value(i))
}

/// Reads trace `row` of a validated canonical batch (closed vocabularies use their canonical
/// codes there, which ingest guarantees).
pub fn trace_at(batch: &RecordBatch, row: usize) -> Trace {
    let columns = TraceColumns::new(batch);
    let ev = columns.event_columns();
    let ed = columns.edge_columns();
    let costs = columns.cost_columns();

    let event_range = columns.events.value_offsets()[row] as usize..columns.events.value_offsets()[row + 1] as usize;
    let events = event_range
        .map(|j| {
            let event_type = closed(ev.event_type, j, EventType::from_name).expect("validated event type");
            let agent = dictionary_text(ev.agent, j).unwrap_or_default();
            let mut event = Event::new(ev.id.value(j), ev.t.value(j), event_type, agent);
            let owned = |array, j| dictionary_text(array, j).map(str::to_owned);
            event.role = owned(ev.role, j);
            event.from = owned(ev.from, j);
            event.to = owned(ev.to, j);
            event.tool = owned(ev.tool, j);
            event.content_ref = text(ev.content_ref, j);
            event.trusted = ev.trusted.is_valid(j).then(|| ev.trusted.value(j));
            event.reward = named_numbers_at(ev.reward, j);
            event.tokens = optional(ev.tokens, j);
            event.duration_s = optional(ev.duration_s, j);
            event.logprob = optional(ev.logprob, j);
            event.attributes = json_object(ev.attributes, j);
            event
        })
        .collect();
    let edge_range = columns.edges.value_offsets()[row] as usize..columns.edges.value_offsets()[row + 1] as usize;
    let edges = edge_range
        .map(|k| Edge {
            src: ed.src.value(k) as u32,
            dst: ed.dst.value(k) as u32,
            edge_type: closed(ed.edge_type, k, EdgeType::from_name).expect("validated edge type"),
        })
        .collect();
    let counterfactual_of = columns.counterfactual_of.is_valid(row).then(|| {
        let of = columns.counterfactual_of;
        CounterfactualOf {
            trace_id: of.column(0).as_string::<i32>().value(row).to_owned(),
            event_id: of.column(1).as_string::<i32>().value(row).to_owned(),
            kind: closed(of.column(2).as_dictionary::<Int8Type>(), row, CounterfactualKind::from_name)
                .expect("validated counterfactual kind"),
        }
    });
    let task_id = columns.task_id.value(row).to_owned();
    let group_id = columns.group_id.value(row);
    Trace {
        trace_id: columns.trace_id.value(row).to_owned(),
        group_id: (group_id != task_id).then(|| group_id.to_owned()),
        task_id,
        system: text(columns.system, row),
        topology: closed(columns.topology, row, Topology::from_name),
        policy_version: optional(columns.policy_version, row),
        counterfactual_of,
        events,
        edges,
        rewards: named_numbers_at(columns.rewards, row).unwrap_or_default(),
        costs: Costs {
            tokens: costs.tokens.value(row),
            wall_clock_s: costs.wall_clock_s.value(row),
            tool_calls: optional(costs.tool_calls, row),
            messages: optional(costs.messages, row),
            other: named_numbers_at(costs.other, row).unwrap_or_default(),
        },
        metrics: named_numbers_at(columns.metrics, row),
        attributes: json_object(columns.attributes, row),
    }
}
