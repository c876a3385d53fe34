//! Counterfactual credit: what an event earned, measured against rollouts that did something
//! else at that event. Two sources of alternatives are read from a batch:
//! - branch rollouts, traces that declare `counterfactual_of` (see [`branches`]);
//! - sibling traces of one group that share a prefix and then diverge (see [`prefix`]).
//!
//! Results are per event, aligned with the batch's events (trace by trace, in stored order).
//! An event without alternatives gets no value: NaN credit and a count of 0.

pub mod branches;
pub mod prefix;

use arrow_array::Array;
use arrow_array::cast::AsArray;

use crate::error::{MasreplayError, Result, ValidationError};
use crate::store::TraceBatch;
use crate::store::schema::TraceColumns;

pub use branches::{Baseline, branch_credit};
pub use prefix::{Signature, same_prefix_credit};

#[cfg(test)]
mod tests;

/// Credit per event of a batch, aligned with its events.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Credit {
    pub credit: Vec<f64>,
    pub stderr: Vec<f64>,
    /// How many alternatives the credit was measured against (0: no credit).
    pub n_branches: Vec<u32>,
}

impl Credit {
    fn empty(n_events: usize) -> Self {
        Credit { credit: vec![f64::NAN; n_events], stderr: vec![f64::NAN; n_events], n_branches: vec![0; n_events] }
    }

    fn set(&mut self, event: usize, credit: f64, stderr: f64, n_branches: usize) {
        self.credit[event] = credit;
        self.stderr[event] = stderr;
        self.n_branches[event] = n_branches as u32;
    }
}

/// Each trace's reward on `channel`; a trace without it is an error naming the trace.
pub(crate) fn trace_rewards(batch: &TraceBatch, channel: &str) -> Result<Vec<f64>> {
    let columns = TraceColumns::new(batch.record_batch());
    let rewards = columns.rewards;
    let keys = rewards.keys().as_string::<i32>();
    let values = rewards.values().as_primitive::<arrow_array::types::Float64Type>();
    let offsets = rewards.value_offsets();
    (0..batch.len())
        .map(|row| {
            let (start, end) = (offsets[row] as usize, offsets[row + 1] as usize);
            let found = (start..end).find(|&k| keys.value(k) == channel).filter(|&k| values.is_valid(k));
            found.map(|k| values.value(k)).ok_or_else(|| {
                let trace_id = columns.trace_id.value(row);
                let error =
                    ValidationError::new(Some(trace_id), format!("/rewards/{channel}"), "no reward on this channel");
                MasreplayError::from(error)
            })
        })
        .collect()
}

/// Sample mean and unbiased variance (NaN variance below two values) of `values`.
fn mean_and_variance(values: impl Iterator<Item = f64> + Clone) -> (f64, f64, usize) {
    let n = values.clone().count();
    let mean = values.clone().sum::<f64>() / n as f64;
    let variance =
        if n >= 2 { values.map(|v| (v - mean) * (v - mean)).sum::<f64>() / (n - 1) as f64 } else { f64::NAN };
    (mean, variance, n)
}
