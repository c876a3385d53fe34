//! A [`TraceBatch`] -> rows -> advantages -> back to traces and events.
//!
//! What a row is depends on the unit the statistics count over: with [`Unit::Traces`] a row
//! is a (trace, stratum) pair, so a trace counts once in every cell it appears in, whatever
//! its number of events (the value is the trace's reward, or the mean of its events' credit
//! in that stratum); with [`Unit::Events`] a row is an event (Dr. MAS: every step of agent k
//! counts). Without strata and without per-event credit both reduce to one row per trace:
//! plain group normalisation of trace rewards.

use super::kernel::{Rows, normalize};
use super::spec::Spec;
use super::strata::{Stratum, joint_codes};
use super::trace_graph::BatchView;
use super::weights::loss_weights;
use crate::bail;
use crate::error::Result;
use crate::store::TraceBatch;
use crate::trace::Unit;

pub struct BatchOptions<'a> {
    /// One reward per trace (NaN: missing).
    pub trace_values: &'a [f64],
    /// Per-event credit replacing the broadcast trace reward (aligned with `events()`).
    pub event_values: Option<&'a [f64]>,
    /// Dense group code per trace.
    pub groups: &'a [u32],
    pub n_groups: usize,
    pub normalize_by: &'a [Stratum],
    pub unit: Unit,
    pub spec: Spec,
    /// Strata of the loss weights (WideSeek-R1's 1/agents uses `[Agent]`).
    pub weight_by: &'a [Stratum],
}

#[derive(Clone, Debug, PartialEq)]
pub struct BatchAdvantages {
    /// One per trace: its advantage, or the mean of its rows' advantages when a trace has
    /// several rows (strata, or per-event credit).
    pub per_trace: Vec<f64>,
    /// One per event, in the order of `batch.events()`.
    pub per_event: Vec<f64>,
    /// Loss weight per event (see `weights`).
    pub weights: Vec<f64>,
}

fn check(view: &BatchView, options: &BatchOptions) -> Result<()> {
    let (traces, events) = (view.n_traces(), view.n_events());
    if options.trace_values.len() != traces {
        bail!("{} trace rewards for {traces} traces", options.trace_values.len());
    }
    if options.groups.len() != traces {
        bail!("{} group codes for {traces} traces", options.groups.len());
    }
    if let Some(credit) = options.event_values
        && credit.len() != events
    {
        bail!("credit has {} values for {events} events", credit.len());
    }
    Ok(())
}

/// Mean of `values` over each consecutive run given by `bounds`.
fn means(values: &[f64], bounds: impl Fn(usize) -> std::ops::Range<usize>, n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let range = bounds(i);
            let len = range.len().max(1) as f64;
            values[range].iter().sum::<f64>() / len
        })
        .collect()
}

pub fn batch_advantages(batch: &TraceBatch, options: &BatchOptions) -> Result<BatchAdvantages> {
    let view = BatchView::new(batch);
    check(&view, options)?;
    let (n_traces, n_events) = (view.n_traces(), view.n_events());
    let trace_of_event: Vec<u32> =
        (0..n_traces).flat_map(|t| std::iter::repeat_n(t as u32, view.events_of(t).len())).collect();
    let event_tokens: Vec<f64> = (0..n_events).map(|e| view.tokens(e).map_or(1.0, |t| t as f64)).collect();
    let strata = if options.normalize_by.is_empty() { None } else { Some(joint_codes(&view, options.normalize_by)?) };
    let value_of_event = |e: usize| match options.event_values {
        Some(credit) => credit[e],
        None => options.trace_values[trace_of_event[e] as usize],
    };

    let (per_trace, per_event) = if strata.is_none() && options.event_values.is_none() {
        let lengths: Vec<f64> = (0..n_traces).map(|t| event_tokens[view.events_of(t)].iter().sum()).collect();
        let rows = Rows {
            values: options.trace_values,
            groups: options.groups,
            n_groups: options.n_groups,
            strata: None,
            lengths: Some(&lengths),
            tokens: None,
        };
        let per_trace: Vec<f64> = normalize(&rows, &options.spec)?;
        let per_event = trace_of_event.iter().map(|&t| per_trace[t as usize]).collect();
        (per_trace, per_event)
    } else if options.unit == Unit::Events {
        let values: Vec<f64> = (0..n_events).map(value_of_event).collect();
        let groups: Vec<u32> = trace_of_event.iter().map(|&t| options.groups[t as usize]).collect();
        let rows = Rows {
            values: &values,
            groups: &groups,
            n_groups: options.n_groups,
            strata: strata.as_ref().map(|(codes, n)| (codes.as_slice(), *n)),
            lengths: Some(&event_tokens),
            tokens: None,
        };
        let per_event: Vec<f64> = normalize(&rows, &options.spec)?;
        let per_trace = means(&per_event, |t| view.events_of(t), n_traces);
        (per_trace, per_event)
    } else {
        // One row per (trace, stratum) pair; `row_of_event` maps events onto them.
        let zero = vec![0u32; n_events];
        let (codes, n_codes) = strata.as_ref().map_or((zero.as_slice(), 1), |(c, n)| (c.as_slice(), *n));
        let mut local = vec![u32::MAX; n_codes];
        let mut row_of_event = vec![0u32; n_events];
        let (mut row_stratum, mut row_trace, mut row_sum, mut row_count, mut row_length) =
            (Vec::new(), Vec::new(), Vec::<f64>::new(), Vec::<f64>::new(), Vec::<f64>::new());
        let mut trace_rows = vec![0usize; n_traces + 1];
        for t in 0..n_traces {
            for e in view.events_of(t) {
                let code = codes[e] as usize;
                if local[code] == u32::MAX {
                    local[code] = row_stratum.len() as u32;
                    row_stratum.push(code as u32);
                    row_trace.push(t as u32);
                    row_sum.push(0.0);
                    row_count.push(0.0);
                    row_length.push(0.0);
                }
                let row = local[code] as usize;
                row_of_event[e] = row as u32;
                row_sum[row] += value_of_event(e);
                row_count[row] += 1.0;
                row_length[row] += event_tokens[e];
            }
            for e in view.events_of(t) {
                local[codes[e] as usize] = u32::MAX;
            }
            trace_rows[t + 1] = row_stratum.len();
        }
        let values: Vec<f64> = row_sum.iter().zip(&row_count).map(|(s, c)| s / c).collect();
        let groups: Vec<u32> = row_trace.iter().map(|&t| options.groups[t as usize]).collect();
        let rows = Rows {
            values: &values,
            groups: &groups,
            n_groups: options.n_groups,
            strata: strata.as_ref().map(|_| (row_stratum.as_slice(), n_codes)),
            lengths: Some(&row_length),
            tokens: None,
        };
        let per_row: Vec<f64> = normalize(&rows, &options.spec)?;
        let per_event = row_of_event.iter().map(|&r| per_row[r as usize]).collect();
        let per_trace = means(&per_row, |t| trace_rows[t]..trace_rows[t + 1], n_traces);
        (per_trace, per_event)
    };

    let weight_by = if options.weight_by.is_empty() { &[Stratum::Agent][..] } else { options.weight_by };
    let (weight_codes, n_weight_codes) = if weight_by == options.normalize_by {
        strata.expect("normalize_by is weight_by and not empty")
    } else {
        joint_codes(&view, weight_by)?
    };
    let weights = loss_weights(&view, options.groups, options.n_groups, &weight_codes, n_weight_codes);
    debug_assert_eq!(weights.len(), per_event.len());
    Ok(BatchAdvantages { per_trace, per_event, weights })
}
