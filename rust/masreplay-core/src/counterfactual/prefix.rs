//! Same-prefix credit inside a GRPO group. The group's traces are merged into a prefix tree by
//! event signature (by default type, agent, role, tool and content_ref of each event, in stored
//! order). Where the traces through a node diverge, the first event of each child is credited
//! Q(child) - V: the mean reward of the traces below the child minus the node's baseline V, the
//! mean reward of every trace through the node (a trace that ends at the node is one more
//! alternative: stopping). This is the effect of that decision estimated from realised sibling
//! rollouts, e.g. spawning against not spawning.
//!
//! Behaviour policies favour some alternatives, so the plain mean V leans toward them. When
//! every diverging event logs its behaviour `logprob`, each trace is weighted by
//! 1 / p(its decision) (self-normalised), which makes V the mean over the alternatives as if
//! each had been chosen equally often.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};

use arrow_array::cast::AsArray;
use arrow_array::types::{Int8Type, Int32Type};
use arrow_array::{Array, ArrayRef, PrimitiveArray, StringArray};
use arrow_schema::DataType;
use foldhash::fast::FixedState;

use super::{Credit, Entry, mean_and_variance, trace_rewards};
use crate::error::{MasreplayError, Result};
use crate::store::TraceBatch;
use crate::store::schema::TraceColumns;

/// The event fields that make two events "the same step" when building the prefix tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    pub fields: Vec<String>,
}

impl Default for Signature {
    fn default() -> Self {
        Signature { fields: ["type", "agent", "role", "tool", "content_ref"].map(str::to_owned).to_vec() }
    }
}

const SIGNATURE_FIELDS: &[&str] = &["type", "agent", "role", "from", "to", "tool", "content_ref"];

impl Signature {
    pub fn new(fields: Vec<String>) -> Result<Self> {
        if fields.is_empty() {
            return Err(MasreplayError::InvalidArgument("signature needs at least one event field".into()));
        }
        if let Some(unknown) = fields.iter().find(|f| !SIGNATURE_FIELDS.contains(&f.as_str())) {
            return Err(MasreplayError::InvalidArgument(format!(
                "signature field {unknown:?} is not one of {SIGNATURE_FIELDS:?}"
            )));
        }
        Ok(Signature { fields })
    }

    /// One hash per event of the batch. Dictionary codes are shared by all rows of a batch,
    /// so equal codes mean equal text; nulls hash apart from every value.
    fn hashes(&self, batch: &TraceBatch) -> Vec<u64> {
        let columns = TraceColumns::new(batch.record_batch());
        let events = columns.events.values().as_struct();
        // Each field's kind is found once here, not per event.
        let fields: Vec<Field> =
            self.fields.iter().map(|f| Field::of(events.column_by_name(f).expect("event field"))).collect();
        let state = FixedState::with_seed(0x5eed);
        (0..events.len())
            .map(|k| {
                let mut hasher = state.build_hasher();
                for field in &fields {
                    field.hash_value(k, &mut hasher);
                }
                hasher.finish()
            })
            .collect()
    }
}

/// A signature field as the hashing reads it: dictionary codes or text.
enum Field<'a> {
    Codes(&'a PrimitiveArray<Int32Type>),
    ClosedCodes(&'a PrimitiveArray<Int8Type>),
    Text(&'a StringArray),
}

impl<'a> Field<'a> {
    fn of(array: &'a ArrayRef) -> Self {
        match array.data_type() {
            DataType::Dictionary(key, _) if **key == DataType::Int8 => {
                Field::ClosedCodes(array.as_dictionary::<Int8Type>().keys())
            }
            DataType::Dictionary(_, _) => Field::Codes(array.as_dictionary::<Int32Type>().keys()),
            _ => Field::Text(array.as_string::<i32>()),
        }
    }

    fn hash_value(&self, k: usize, hasher: &mut impl Hasher) {
        let valid = match self {
            Field::Codes(codes) => codes.is_valid(k),
            Field::ClosedCodes(codes) => codes.is_valid(k),
            Field::Text(text) => text.is_valid(k),
        };
        valid.hash(hasher);
        if valid {
            match self {
                Field::Codes(codes) => codes.value(k).hash(hasher),
                Field::ClosedCodes(codes) => codes.value(k).hash(hasher),
                Field::Text(text) => text.value(k).hash(hasher),
            }
        }
    }
}

pub fn same_prefix_credit(
    batch: &TraceBatch,
    channel: &str,
    signature: &Signature,
    importance_weighting: bool,
) -> Result<Credit> {
    let rewards = trace_rewards(batch, channel)?;
    let columns = TraceColumns::new(batch.record_batch());
    let offsets = columns.events.value_offsets();
    let logprob = columns.event_columns().logprob;
    let hashes = signature.hashes(batch);
    let mut entries: Vec<Entry> = Vec::new();

    let mut groups: HashMap<&str, Vec<usize>> = HashMap::new();
    for row in 0..batch.len() {
        groups.entry(columns.group_id.value(row)).or_default().push(row);
    }
    let mut nodes: Vec<(Vec<usize>, usize)> =
        groups.into_values().filter(|rows| rows.len() >= 2).map(|rows| (rows, 0)).collect();
    while let Some((rows, depth)) = nodes.pop() {
        let event_of = |row: usize| {
            let position = offsets[row] as usize + depth;
            (position < offsets[row + 1] as usize).then_some(position)
        };
        let mut children: Vec<(Option<u64>, Vec<usize>)> = Vec::new();
        for &row in &rows {
            let key = event_of(row).map(|k| hashes[k]);
            match children.iter_mut().find(|(k, _)| *k == key) {
                Some((_, members)) => members.push(row),
                None => children.push((key, vec![row])),
            }
        }
        if children.len() >= 2 {
            let decisions: Vec<Option<f64>> = rows
                .iter()
                .map(|&row| event_of(row).filter(|&k| logprob.is_valid(k)).map(|k| logprob.value(k)))
                .collect();
            let weighted = importance_weighting && decisions.iter().all(Option::is_some);
            let weights: Vec<f64> = decisions
                .iter()
                .map(|d| match d {
                    Some(logprob) if weighted => (-logprob).exp(),
                    _ => 1.0,
                })
                .collect();
            let total: f64 = weights.iter().sum();
            let baseline = rows.iter().zip(&weights).map(|(&row, w)| w * rewards[row]).sum::<f64>() / total;
            let (_, variance, n) = mean_and_variance(rows.iter().map(|&row| rewards[row]));
            for (key, members) in &children {
                if key.is_none() {
                    continue; // traces that stop here have no event to credit
                }
                let (mean, _, n_child) = mean_and_variance(members.iter().map(|&row| rewards[row]));
                let stderr = (variance * (1.0 / n_child as f64 - 1.0 / n as f64)).sqrt();
                for &row in members {
                    let event = event_of(row).expect("a child with a key has an event here");
                    entries.push((event as u64, row as u32, mean - baseline, stderr, (n - 1) as u32));
                }
            }
        }
        for (key, members) in children {
            if key.is_some() && members.len() >= 2 {
                nodes.push((members, depth + 1));
            }
        }
    }
    Ok(Credit::from_entries(entries))
}
