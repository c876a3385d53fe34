//! Counterfactual credit: what an event earned, measured against rollouts that did something
//! else at that event. Two sources of alternatives are read from a batch:
//! - branch rollouts, traces that declare `counterfactual_of` (see [`branches`]);
//! - sibling traces of one group that share a prefix and then diverge (see [`prefix`]).
//!
//! Results name events by their position among the batch's events (trace by trace, in stored
//! order). An event without alternatives gets no value (NaN credit and a count of 0 once
//! aligned with the events), never an invented one.

pub mod branches;
mod factual_index;
pub mod prefix;

use rayon::prelude::*;

use crate::error::{MasreplayError, Result, ValidationError};
use crate::store::schema::TraceColumns;
use crate::store::{TraceBatch, trace_channel};

pub use branches::{Baseline, branch_credit};
pub use prefix::{Signature, same_prefix_credit};

#[cfg(test)]
mod tests;

/// Credit of the events of a batch that have alternatives (every other event has none).
/// Events are positions among the batch's events (trace by trace, in stored order), ascending.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Credit {
    pub event: Vec<u64>,
    /// Row of the trace that holds each event.
    pub trace: Vec<u32>,
    pub credit: Vec<f64>,
    pub stderr: Vec<f64>,
    /// How many alternatives the credit was measured against.
    pub n_branches: Vec<u32>,
}

/// One credited event: (position, trace row, credit, stderr, n_branches).
pub(crate) type Entry = (u64, u32, f64, f64, u32);

impl Credit {
    fn from_entries(mut entries: Vec<Entry>) -> Self {
        if !entries.is_sorted_by_key(|entry| entry.0) {
            entries.par_sort_unstable_by_key(|entry| entry.0);
        }
        Credit {
            event: entries.iter().map(|e| e.0).collect(),
            trace: entries.iter().map(|e| e.1).collect(),
            credit: entries.iter().map(|e| e.2).collect(),
            stderr: entries.iter().map(|e| e.3).collect(),
            n_branches: entries.iter().map(|e| e.4).collect(),
        }
    }
}

/// Each trace's reward on `channel`; a trace without it is an error naming the trace.
pub(crate) fn trace_rewards(batch: &TraceBatch, channel: &str) -> Result<Vec<f64>> {
    let rewards = trace_channel(batch, channel);
    match rewards.iter().position(|r| r.is_nan()) {
        None => Ok(rewards),
        Some(row) => Err(missing_reward(batch, row, channel)),
    }
}

/// The error of trace `row` having no reward on `channel`.
pub(crate) fn missing_reward(batch: &TraceBatch, row: usize, channel: &str) -> MasreplayError {
    let trace_id = TraceColumns::new(batch.record_batch()).trace_id.value(row);
    ValidationError::new(Some(trace_id), format!("/rewards/{channel}"), "no reward on this channel").into()
}

/// The first eight bytes of `text` as one word (zero-padded): with the length, it tells two
/// ids of up to eight bytes apart without reading their text again.
fn head_word(text: impl AsRef<[u8]>) -> u64 {
    let bytes = text.as_ref();
    match bytes.first_chunk::<8>() {
        Some(word) => u64::from_le_bytes(*word),
        // Byte by byte, first byte lowest: not a memcpy call into a buffer read back at once.
        None => bytes.iter().rev().fold(0, |word, &byte| (word << 8) | u64::from(byte)),
    }
}

/// Sample mean and unbiased variance (NaN variance below two values) of `values`.
fn mean_and_variance(values: impl Iterator<Item = f64> + Clone) -> (f64, f64, usize) {
    let (n, sum) = values.clone().fold((0usize, 0.0), |(n, sum), v| (n + 1, sum + v));
    let mean = sum / n as f64;
    let variance =
        if n >= 2 { values.map(|v| (v - mean) * (v - mean)).sum::<f64>() / (n - 1) as f64 } else { f64::NAN };
    (mean, variance, n)
}
