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
use std::sync::OnceLock;

use arrow_array::cast::AsArray;
use arrow_array::{Array, StringArray};
use foldhash::fast::RandomState;
use rayon::prelude::*;

use super::{Credit, Entry, mean_and_variance, trace_rewards};
use crate::error::{Result, ValidationError};
use crate::store::schema::TraceColumns;
use crate::store::{TraceBatch, same_text};

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

/// Position of the event `event_id` of trace `row` among the batch's events.
fn event_position(ids: &StringArray, offsets: &[i32], row: usize, event_id: &str) -> Option<usize> {
    (offsets[row] as usize..offsets[row + 1] as usize).find(|&k| same_text(ids.value(k), event_id))
}

pub fn branch_credit(batch: &TraceBatch, channel: &str, baseline: Baseline) -> Result<Credit> {
    let columns = TraceColumns::new(batch.record_batch());
    let event_ids = columns.event_columns().id;
    let offsets = columns.events.value_offsets();
    let of = columns.counterfactual_of;
    let of_trace = of.column_by_name("trace_id").expect("canonical field").as_string::<i32>();
    let of_event = of.column_by_name("event_id").expect("canonical field").as_string::<i32>();
    let rewards = trace_rewards(batch, channel)?;

    // (factual row, branch row) of the branches whose factual trace is in the batch, grouped
    // by factual row. Branches usually follow their factual trace, so the last factual row
    // before a branch is tried first; the id index is built only when that guess fails.
    let index: OnceLock<HashMap<&str, u32, RandomState>> = OnceLock::new();
    let factual_row = |id: &str| {
        let index = index.get_or_init(|| {
            (0..batch.len()).filter(|&r| of.is_null(r)).map(|r| (columns.trace_id.value(r), r as u32)).collect()
        });
        index.get(id).copied()
    };
    let span = batch.len().div_ceil(4 * rayon::current_num_threads()).max(1 << 14);
    let spans: Vec<Vec<(u32, u32)>> = (0..batch.len().div_ceil(span))
        .into_par_iter()
        .map(|part| {
            let rows = part * span..((part + 1) * span).min(batch.len());
            let mut last_factual = (0..rows.start).rev().find(|&row| of.is_null(row));
            let mut pairs = Vec::new();
            for row in rows {
                if of.is_null(row) {
                    last_factual = Some(row);
                    continue;
                }
                let factual_id = of_trace.value(row);
                let factual = match last_factual {
                    Some(last) if same_text(columns.trace_id.value(last), factual_id) => Some(last as u32),
                    _ => factual_row(factual_id),
                };
                pairs.extend(factual.map(|factual| (factual, row as u32)));
            }
            pairs
        })
        .collect();
    let mut branches: Vec<(u32, u32)> = spans.concat();
    if !branches.is_sorted_by_key(|pair| pair.0) {
        branches.par_sort_unstable();
    }

    // Credits the alternatives of one factual trace into `entries`; `rows` is scratch space.
    let alternatives = |entries: &mut Vec<Entry>, rows: &mut Vec<u32>, pairs: &[(u32, u32)]| -> Result<()> {
        let factual = pairs[0].0 as usize;
        rows.clear();
        rows.extend(pairs.iter().map(|pair| pair.1));
        // Branches of one factual trace, grouped by the event they branch at.
        let event_of = |row: u32| of_event.value(row as usize);
        let first = event_of(rows[0]);
        if !rows.iter().all(|&row| same_text(event_of(row), first)) {
            rows.sort_by(|&a, &b| event_of(a).cmp(event_of(b)).then(a.cmp(&b)));
        }
        for group in rows.chunk_by(|&a, &b| same_text(event_of(a), event_of(b))) {
            let event_id = event_of(group[0]);
            let event = event_position(event_ids, offsets, factual, event_id).ok_or_else(|| {
                let branch_id = columns.trace_id.value(group[0] as usize);
                let reason =
                    format!("the factual trace {:?} has no event {event_id:?}", columns.trace_id.value(factual));
                ValidationError::new(Some(branch_id), "/counterfactual_of/event_id", reason)
            })?;
            let (mean, variance, n) = mean_and_variance(group.iter().map(|&b| rewards[b as usize]));
            let factual_reward = rewards[factual];
            let stderr = (variance * (1.0 + 1.0 / n as f64)).sqrt();
            entries.push((event as u64, factual_reward - mean, stderr, n as u32));
            if baseline == Baseline::LeaveOneOut {
                for &branch in group {
                    let Some(own) = event_position(event_ids, offsets, branch as usize, event_id) else {
                        continue; // ablated: the branch has no such event to credit
                    };
                    let others = group.iter().filter(|&&b| b != branch).map(|&b| rewards[b as usize]);
                    let (mean, variance, n_others) = mean_and_variance(others.chain([factual_reward]));
                    let stderr = (variance * (1.0 + 1.0 / n_others as f64)).sqrt();
                    entries.push((own as u64, rewards[branch as usize] - mean, stderr, n_others as u32));
                }
            }
        }
        Ok(())
    };
    let per_factual: Vec<&[(u32, u32)]> = branches.chunk_by(|a, b| a.0 == b.0).collect();
    let entries = per_factual
        .into_par_iter()
        .try_fold(
            || (Vec::new(), Vec::new()),
            |(mut entries, mut rows), pairs| {
                alternatives(&mut entries, &mut rows, pairs)?;
                Ok::<_, crate::error::MasreplayError>((entries, rows))
            },
        )
        .map(|folded| folded.map(|(entries, _)| entries))
        .try_reduce(Vec::new, |mut all, more| {
            all.extend(more);
            Ok(all)
        })?;
    Ok(Credit::from_entries(entries))
}
