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
use crate::limit::{IN_RANGE, in_range, shifted_sums_in_range};
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

/// Each trace's reward on `channel`; a trace without it, or with one out of range, is an
/// error naming the trace.
pub(crate) fn trace_rewards(batch: &TraceBatch, channel: &str) -> Result<Vec<f64>> {
    let rewards = trace_channel(batch, channel);
    match rewards.iter().position(|&r| !in_range(r)) {
        None => Ok(rewards),
        Some(row) => Err(unusable_reward(batch, row, channel, rewards[row])),
    }
}

/// The error of trace `row`'s `reward` on `channel` being missing (NaN) or out of range.
pub(crate) fn unusable_reward(batch: &TraceBatch, row: usize, channel: &str, reward: f64) -> MasreplayError {
    let trace_id = TraceColumns::new(batch.record_batch()).trace_id.value(row);
    let reason = if reward.is_nan() {
        "no reward on this channel".to_owned()
    } else {
        format!("the reward is {reward:e}: rewards must be {IN_RANGE}, beyond which sums overflow")
    };
    ValidationError::new(Some(trace_id), format!("/rewards/{channel}"), reason).into()
}

/// A word that, with the length, tells apart texts of up to eight bytes without reading them
/// again: their bytes, loaded as two overlapping halves where the text is shorter than a
/// word (no loop over its bytes); for a longer text, its first eight bytes.
fn head_word(text: impl AsRef<[u8]>) -> u64 {
    let bytes = text.as_ref();
    let n = bytes.len();
    if let Some(word) = bytes.first_chunk::<8>() {
        return u64::from_le_bytes(*word);
    }
    let half = |at: usize| u64::from(u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]));
    match n {
        0 => 0,
        1..4 => u64::from(bytes[0]) | u64::from(bytes[n / 2]) << 8 | u64::from(bytes[n - 1]) << 16,
        _ => half(0) | half(n - 4) << 32,
    }
}

/// Running sums of values shifted by the first one, for their mean and variance in one pass.
/// Shifted, the sums keep their digits where plain ones cancel (rewards near 1e9 that differ
/// by 1e-3: a sum of squares of the rewards themselves would lose the variance entirely).
#[derive(Clone, Copy, Default)]
struct ShiftedSums {
    /// The first value (NaN once it is NaN; any NaN value makes `sum` NaN).
    shift: f64,
    sum: f64,
    squares: f64,
}

impl ShiftedSums {
    /// Adds `value`; `first` says that it is the first value added.
    #[inline]
    fn add(&mut self, value: f64, first: bool) {
        if first {
            self.shift = value;
        }
        let shifted = value - self.shift;
        self.sum += shifted;
        self.squares += shifted * shifted;
    }

    /// Whether a value added may be NaN or out of [`crate::limit`]'s range (the values are
    /// then read one by one).
    fn may_be_unusable(&self) -> bool {
        !shifted_sums_in_range(self.shift, self.squares) || self.sum.is_nan()
    }

    /// Sample mean and unbiased variance (NaN below two values) of the `n` values added.
    fn mean_and_variance(&self, n: usize) -> (f64, f64) {
        let mean_shift = self.sum / n as f64;
        // Never below zero, which rounding could leave when the values are all but equal.
        let spread = self.squares - self.sum * mean_shift;
        let variance = if n < 2 {
            f64::NAN
        } else if spread < 0.0 {
            0.0
        } else {
            spread / (n - 1) as f64
        };
        (self.shift + mean_shift, variance)
    }
}

/// Sample mean and unbiased variance (NaN variance below two values) of `values`, and their
/// count (see [`ShiftedSums`]).
fn mean_and_variance(values: impl Iterator<Item = f64>) -> (f64, f64, usize) {
    let mut sums = ShiftedSums::default();
    let mut n = 0;
    for value in values {
        sums.add(value, n == 0);
        n += 1;
    }
    let (mean, variance) = sums.mean_and_variance(n);
    (mean, variance, n)
}
