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
use crate::interrupt::checkpoint;
use crate::store::TraceBatch;
use crate::store::schema::TraceColumns;
use crate::student_t::z_scale;

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
        checkpoint()?;
        let event_of = |row: usize| {
            let position = offsets[row] as usize + depth;
            (position < offsets[row + 1] as usize).then_some(position)
        };
        // Each alternative: its event's signature (None: the traces that stop here) and its
        // traces, as positions in `rows`.
        let mut children: Vec<(Option<u64>, Vec<usize>)> = Vec::new();
        for (position, &row) in rows.iter().enumerate() {
            let key = event_of(row).map(|k| hashes[k]);
            match children.iter_mut().find(|(k, _)| *k == key) {
                Some((_, members)) => members.push(position),
                None => children.push((key, vec![position])),
            }
        }
        let reward_at = |position: &usize| rewards[rows[*position]];
        if children.len() >= 2 {
            let logprobs: Vec<Option<f64>> = rows
                .iter()
                .map(|&row| event_of(row).filter(|&k| logprob.is_valid(k)).map(|k| logprob.value(k)))
                .collect();
            let weighted = importance_weighting && logprobs.iter().all(Option::is_some);
            let weights: Vec<f64> = logprobs
                .iter()
                .map(|d| match d {
                    Some(logprob) if weighted => (-logprob).exp(),
                    _ => 1.0,
                })
                .collect();
            let total: f64 = weights.iter().sum();
            let baseline = rows.iter().zip(&weights).map(|(&row, w)| w * rewards[row]).sum::<f64>() / total;
            let squared_shares = weights.iter().map(|w| w * w).sum::<f64>() / (total * total);
            // Each alternative's (mean, variance, size), read once for the noise and the credits.
            let alternatives: Vec<(f64, f64, usize)> =
                children.iter().map(|(_, members)| mean_and_variance(members.iter().map(reward_at))).collect();
            let (noise, dof) = reward_noise(&alternatives, rows.iter().map(|&row| rewards[row]));
            let z_scale = z_scale(dof);
            for ((key, members), &(mean, _, n_child)) in children.iter().zip(&alternatives) {
                if key.is_none() {
                    continue; // traces that stop here have no event to credit
                }
                let n_child = n_child as f64;
                // Q - V is a weighted sum of the node's rewards, sum_i a_i r_i with
                // a_i = [i in child] / n_child - w_i / W: its variance is noise * sum_i a_i^2.
                let child_share = members.iter().map(|&position| weights[position]).sum::<f64>() / total;
                let coefficients = 1.0 / n_child - 2.0 * child_share / n_child + squared_shares;
                let stderr = (noise * coefficients.max(0.0)).sqrt() * z_scale;
                for &position in members {
                    let (row, event) =
                        (rows[position], event_of(rows[position]).expect("a child with a key has an event"));
                    entries.push((event as u64, row as u32, mean - baseline, stderr, (rows.len() - 1) as u32));
                }
            }
        }
        for (key, members) in children {
            if key.is_some() && members.len() >= 2 {
                nodes.push((members.into_iter().map(|position| rows[position]).collect(), depth + 1));
            }
        }
    }
    Ok(Credit::from_entries(entries))
}

/// The variance of one reward around its alternative's mean, and its degrees of freedom: pooled
/// within the node's alternatives (a difference between alternatives is the effect being
/// measured, not noise). When every alternative was taken once there is nothing within to pool,
/// and the spread over the whole node stands in: it holds the effects too, so it can only widen
/// the bar.
fn reward_noise(alternatives: &[(f64, f64, usize)], node: impl Iterator<Item = f64> + Clone) -> (f64, usize) {
    let n = alternatives.iter().map(|&(_, _, n)| n).sum::<usize>();
    let dof = n - alternatives.len();
    if dof == 0 {
        let (_, variance, n) = mean_and_variance(node);
        return (variance, n - 1);
    }
    let within: f64 =
        alternatives.iter().filter(|&&(_, _, n)| n >= 2).map(|&(_, variance, n)| variance * (n - 1) as f64).sum();
    (within / dof as f64, dof)
}
