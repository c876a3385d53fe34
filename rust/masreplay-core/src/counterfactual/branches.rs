//! Credit from branch rollouts. A branch is a trace whose `counterfactual_of` names a factual
//! trace of the batch and one of its events: the rollout that substituted that event, ablated
//! it, or did not spawn there. For each event with branches,
//! credit = R(factual) - mean R(branches). Its standard error treats the factual reward as
//! one more draw with the branches' variance: s * sqrt(1 + 1/n), which needs n >= 2.
//!
//! With [`Baseline::LeaveOneOut`] (C3), every alternative at the event (the factual and each
//! branch) is credited against the mean of the others, so the branches' own events (where a
//! branch still has the event) get credit too; the factual's credit is the same either way.

use std::collections::HashMap;

use arrow_array::Array;

use super::{Credit, mean_and_variance, trace_rewards};
use crate::error::{Result, ValidationError};
use crate::store::TraceBatch;
use crate::store::schema::TraceColumns;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Baseline {
    Mean,
    LeaveOneOut,
}

impl Baseline {
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "mean" => Some(Baseline::Mean),
            "loo" => Some(Baseline::LeaveOneOut),
            _ => None,
        }
    }
}

/// The alternatives at one event of a factual trace.
struct Alternatives {
    /// Position of the event among the batch's events.
    event: usize,
    factual: usize,
    branches: Vec<usize>,
}

/// Position of the event `event_id` of trace `row` among the batch's events.
fn event_position(ids: &arrow_array::StringArray, offsets: &[i32], row: usize, event_id: &str) -> Option<usize> {
    (offsets[row] as usize..offsets[row + 1] as usize).find(|&k| ids.value(k) == event_id)
}

pub fn branch_credit(batch: &TraceBatch, channel: &str, baseline: Baseline) -> Result<Credit> {
    let columns = TraceColumns::new(batch.record_batch());
    let event_ids = columns.event_columns().id;
    let offsets = columns.events.value_offsets();
    let of = columns.counterfactual_of;
    let of_trace = of.column_by_name("trace_id").expect("canonical field");
    let of_trace = arrow_array::cast::AsArray::as_string::<i32>(of_trace);
    let of_event =
        arrow_array::cast::AsArray::as_string::<i32>(of.column_by_name("event_id").expect("canonical field"));

    let row_of: HashMap<&str, usize> = (0..batch.len()).map(|row| (columns.trace_id.value(row), row)).collect();
    // Alternatives keyed by (factual row, event id), in the order branches appear.
    let mut slots: HashMap<(usize, &str), usize> = HashMap::new();
    let mut alternatives: Vec<Alternatives> = Vec::new();
    for row in (0..batch.len()).filter(|&row| of.is_valid(row)) {
        let (factual_id, event_id) = (of_trace.value(row), of_event.value(row));
        let branch_id = columns.trace_id.value(row);
        let not_found = |path: &str, reason: String| ValidationError::new(Some(branch_id), path, reason);
        let Some(&factual) = row_of.get(factual_id) else {
            // The factual trace is elsewhere (another batch, evicted): nothing to compare with.
            continue;
        };
        let slot = match slots.get(&(factual, event_id)) {
            Some(&slot) => slot,
            None => {
                let event = event_position(event_ids, offsets, factual, event_id).ok_or_else(|| {
                    not_found(
                        "/counterfactual_of/event_id",
                        format!("the factual trace {factual_id:?} has no event {event_id:?}"),
                    )
                })?;
                alternatives.push(Alternatives { event, factual, branches: Vec::new() });
                slots.insert((factual, event_id), alternatives.len() - 1);
                alternatives.len() - 1
            }
        };
        alternatives[slot].branches.push(row);
    }

    let rewards = trace_rewards(batch, channel)?;
    let mut credit = Credit::empty(event_ids.len());
    for alternative in &alternatives {
        let branch_rewards = alternative.branches.iter().map(|&b| rewards[b]);
        let (mean, variance, n) = mean_and_variance(branch_rewards);
        let factual = rewards[alternative.factual];
        credit.set(alternative.event, factual - mean, (variance * (1.0 + 1.0 / n as f64)).sqrt(), n);
        if baseline == Baseline::LeaveOneOut {
            let event_id = event_ids.value(alternative.event);
            for &branch in &alternative.branches {
                let Some(event) = event_position(event_ids, offsets, branch, event_id) else {
                    continue; // ablated: the branch has no such event to credit
                };
                let others = alternative.branches.iter().filter(|&&b| b != branch).map(|&b| rewards[b]);
                let (mean, variance, n_others) = mean_and_variance(others.chain([factual]));
                let stderr = (variance * (1.0 + 1.0 / n_others as f64)).sqrt();
                credit.set(event, rewards[branch] - mean, stderr, n_others);
            }
        }
    }
    Ok(credit)
}
