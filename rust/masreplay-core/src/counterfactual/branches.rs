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
use std::ops::Range;
use std::sync::OnceLock;

use arrow_array::cast::AsArray;
use arrow_array::{Array, StringArray, StructArray};
use foldhash::fast::RandomState;
use rayon::prelude::*;

use super::{Credit, Entry, mean_and_variance, missing_reward};
use crate::error::{Result, ValidationError};
use crate::names::named_enum;
use crate::store::schema::TraceColumns;
use crate::store::{ChannelReader, TraceBatch, same_text};

named_enum!(
    /// What a branch's reward is credited against (see the module comment).
    Baseline as "baseline" {
        Mean = "mean",
        LeaveOneOut = "loo",
    }
);

/// Position of the event `event_id` of trace `row` among the batch's events.
fn event_position(ids: &StringArray, offsets: &[i32], row: usize, event_id: &str) -> Option<usize> {
    (offsets[row] as usize..offsets[row + 1] as usize).find(|&k| same_text(ids.value(k), event_id))
}

pub fn branch_credit(batch: &TraceBatch, channel: &str, baseline: Baseline) -> Result<Credit> {
    let columns = TraceColumns::new(batch.record_batch());
    let families = Families::new(batch, &columns, channel, baseline);
    let entries = match families.credit_contiguous()? {
        Some(entries) => entries,
        None => families.credit_paired()?,
    };
    Ok(Credit::from_entries(entries))
}

/// Families credited together by [`Families::credit_families`].
const FAMILY_BATCH: usize = 16;

/// Rows per parallel task: a few tasks per thread, none tiny.
fn span_of(rows: usize) -> usize {
    rows.div_ceil(4 * rayon::current_num_threads()).max(1 << 14)
}

/// The results of parallel tasks in task order: the first error (in row order), or all entries.
fn first_error_or_all(parts: Vec<Result<Vec<Entry>>>) -> Result<Vec<Entry>> {
    let mut all = Vec::with_capacity(parts.iter().map(|part| part.as_ref().map_or(0, Vec::len)).sum());
    for part in parts {
        all.extend(part?);
    }
    Ok(all)
}

/// A factual trace with its branch rollouts: the unit of branch credit.
struct Families<'a> {
    batch: &'a TraceBatch,
    columns: &'a TraceColumns<'a>,
    event_ids: &'a StringArray,
    event_offsets: &'a [i32],
    of: &'a StructArray,
    of_trace: &'a StringArray,
    of_event: &'a StringArray,
    rewards: ChannelReader<'a>,
    channel: &'a str,
    baseline: Baseline,
}

/// Per-task scratch space: one family's branch rows and one event's rewards.
#[derive(Default)]
struct Scratch {
    rows: Vec<u32>,
    rewards: Vec<f64>,
}

impl<'a> Families<'a> {
    fn new(batch: &'a TraceBatch, columns: &'a TraceColumns<'a>, channel: &'a str, baseline: Baseline) -> Self {
        let of = columns.counterfactual_of;
        Families {
            batch,
            columns,
            event_ids: columns.event_columns().id,
            event_offsets: columns.events.value_offsets(),
            of,
            of_trace: of.column_by_name("trace_id").expect("canonical field").as_string::<i32>(),
            of_event: of.column_by_name("event_id").expect("canonical field").as_string::<i32>(),
            rewards: ChannelReader::new(columns, channel),
            channel,
            baseline,
        }
    }

    fn reward(&self, row: usize) -> Result<f64> {
        let reward = self.rewards.at(row);
        if reward.is_nan() { Err(missing_reward(self.batch, row, self.channel)) } else { Ok(reward) }
    }

    fn is_factual(&self, row: usize) -> bool {
        self.of.is_null(row)
    }

    /// Credit when every factual trace is directly followed by all its branches (the layout
    /// of `sim.branches` and of GraphBuffer, which stores a branch after its factual trace):
    /// one parallel pass, each family credited as soon as its rows end. None when a branch
    /// sits anywhere else, for [`Self::credit_paired`] to handle.
    fn credit_contiguous(&self) -> Result<Option<Vec<Entry>>> {
        let rows = self.batch.len();
        let span = span_of(rows);
        // Task boundaries moved forward to the next factual row, so no family straddles two.
        let mut starts = vec![0];
        starts.extend(
            (span..rows).step_by(span).map(|start| (start..rows).find(|&r| self.is_factual(r)).unwrap_or(rows)),
        );
        starts.push(rows);
        starts.dedup();
        let parts: Vec<Option<Result<Vec<Entry>>>> =
            starts.par_windows(2).map(|bounds| self.credit_span(bounds[0]..bounds[1])).collect();
        parts.into_iter().collect::<Option<Vec<_>>>().map(first_error_or_all).transpose()
    }

    /// [`Self::credit_contiguous`] over the rows of one task (which starts at a factual row
    /// unless it is the first).
    fn credit_span(&self, rows: Range<usize>) -> Option<Result<Vec<Entry>>> {
        let (mut entries, mut scratch) = (Vec::new(), Scratch::default());
        // Families whose rows have ended, as (factual row, end of its branch rows).
        let mut ended: Vec<(usize, usize)> = Vec::with_capacity(FAMILY_BATCH);
        let mut family: Option<usize> = None;
        let end = rows.end;
        for row in rows {
            if self.is_factual(row) {
                ended.extend(family.filter(|&factual| factual + 1 < row).map(|factual| (factual, row)));
                if ended.len() == FAMILY_BATCH {
                    if let Err(error) = self.credit_families(&mut entries, &mut scratch, &ended) {
                        return Some(Err(error));
                    }
                    ended.clear();
                }
                family = Some(row);
            } else if !family.is_some_and(|f| same_text(self.columns.trace_id.value(f), self.of_trace.value(row))) {
                return None;
            }
        }
        ended.extend(family.filter(|&factual| factual + 1 < end).map(|factual| (factual, end)));
        Some(self.credit_families(&mut entries, &mut scratch, &ended).map(|()| entries))
    }

    /// Credits families given as (factual row, end of its branch rows). The ids of their
    /// factual traces' events are loaded together first: the cache misses of finding each
    /// branched event then overlap instead of stalling family after family.
    fn credit_families(
        &self,
        entries: &mut Vec<Entry>,
        scratch: &mut Scratch,
        families: &[(usize, usize)],
    ) -> Result<()> {
        let id_offsets = self.event_ids.value_offsets();
        let touched =
            families.iter().fold(0, |acc, &(factual, _)| acc ^ id_offsets[self.event_offsets[factual] as usize]);
        std::hint::black_box(touched);
        for &(factual, end) in families {
            self.credit_family(entries, scratch, factual, (factual + 1) as u32..end as u32)?;
        }
        Ok(())
    }

    /// Credit for any layout: branches are paired with their factual trace by id, then each
    /// family is credited. Branches whose factual trace is not in the batch are left out.
    fn credit_paired(&self) -> Result<Vec<Entry>> {
        let trace_id = self.columns.trace_id;
        // The last factual row before a branch is tried first; the id index is built only
        // when that guess fails.
        let index: OnceLock<HashMap<&str, u32, RandomState>> = OnceLock::new();
        let factual_row = |id: &str| {
            let index = index.get_or_init(|| {
                (0..self.batch.len()).filter(|&r| self.is_factual(r)).map(|r| (trace_id.value(r), r as u32)).collect()
            });
            index.get(id).copied()
        };
        let span = span_of(self.batch.len());
        let spans: Vec<Vec<(u32, u32)>> = (0..self.batch.len().div_ceil(span))
            .into_par_iter()
            .map(|part| {
                let rows = part * span..((part + 1) * span).min(self.batch.len());
                let mut last_factual = (0..rows.start).rev().find(|&row| self.is_factual(row));
                let mut pairs = Vec::new();
                for row in rows {
                    if self.is_factual(row) {
                        last_factual = Some(row);
                        continue;
                    }
                    let factual_id = self.of_trace.value(row);
                    let factual = match last_factual {
                        Some(last) if same_text(trace_id.value(last), factual_id) => Some(last as u32),
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
        let families: Vec<&[(u32, u32)]> = branches.chunk_by(|a, b| a.0 == b.0).collect();
        let parts: Vec<Result<Vec<Entry>>> = families
            .par_chunks(span_of(families.len()).min(1 << 12))
            .map(|chunk| {
                let (mut entries, mut scratch) = (Vec::new(), Scratch::default());
                for pairs in chunk {
                    let branches = pairs.iter().map(|pair| pair.1);
                    self.credit_family(&mut entries, &mut scratch, pairs[0].0 as usize, branches)?;
                }
                Ok(entries)
            })
            .collect();
        first_error_or_all(parts)
    }

    /// Credits the alternatives of one factual trace into `entries`.
    fn credit_family(
        &self,
        entries: &mut Vec<Entry>,
        scratch: &mut Scratch,
        factual: usize,
        branches: impl Iterator<Item = u32>,
    ) -> Result<()> {
        let Scratch { rows, rewards } = scratch;
        rows.clear();
        rows.extend(branches);
        // Branches of one factual trace, grouped by the event they branch at.
        let event_of = |row: u32| self.of_event.value(row as usize);
        let first = event_of(rows[0]);
        if !rows.iter().all(|&row| same_text(event_of(row), first)) {
            rows.sort_by(|&a, &b| event_of(a).cmp(event_of(b)).then(a.cmp(&b)));
        }
        let factual_reward = self.reward(factual)?;
        for group in rows.chunk_by(|&a, &b| same_text(event_of(a), event_of(b))) {
            let event_id = event_of(group[0]);
            let event = event_position(self.event_ids, self.event_offsets, factual, event_id).ok_or_else(|| {
                let branch_id = self.columns.trace_id.value(group[0] as usize);
                let factual_id = self.columns.trace_id.value(factual);
                let reason = format!("the factual trace {factual_id:?} has no event {event_id:?}");
                ValidationError::new(Some(branch_id), "/counterfactual_of/event_id", reason)
            })?;
            rewards.clear();
            for &branch in group {
                rewards.push(self.reward(branch as usize)?);
            }
            let (mean, variance, n) = mean_and_variance(rewards.iter().copied());
            let stderr = (variance * (1.0 + 1.0 / n as f64)).sqrt();
            entries.push((event as u64, factual as u32, factual_reward - mean, stderr, n as u32));
            if self.baseline == Baseline::LeaveOneOut {
                for (i, &branch) in group.iter().enumerate() {
                    let Some(own) = event_position(self.event_ids, self.event_offsets, branch as usize, event_id)
                    else {
                        continue; // ablated: the branch has no such event to credit
                    };
                    let others = rewards.iter().enumerate().filter(|&(j, _)| j != i).map(|(_, &r)| r);
                    let (mean, variance, n_others) = mean_and_variance(others.chain([factual_reward]));
                    let stderr = (variance * (1.0 + 1.0 / n_others as f64)).sqrt();
                    entries.push((own as u64, branch, rewards[i] - mean, stderr, n_others as u32));
                }
            }
        }
        Ok(())
    }
}
