//! A [`TraceBatch`] -> rows -> advantages -> back to traces and events.
//!
//! What a row is depends on the unit the statistics count over: with [`Unit::Traces`] a row
//! is a (trace, stratum) pair, so a trace counts once in every cell it appears in, whatever
//! its number of events (the value is the trace's reward, or the mean of its events' credit
//! in that stratum); with [`Unit::Events`] a row is an event (Dr. MAS: every step of agent k
//! counts). Without strata and without per-event credit both reduce to one row per trace:
//! plain group normalisation of trace rewards.

use super::kernel::normalize;
use super::rows::Rows;
use super::spec::Spec;
use super::strata::{Stratum, joint_codes};
use super::weights::loss_weights;
use crate::bail;
use crate::error::Result;
use crate::limit::{out_of_range, reward_out_of_range};
use crate::store::TraceBatch;
use crate::trace::Unit;
use crate::trace_view::BatchView;

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
    /// The trace of each event.
    pub trace_of_event: Vec<u32>,
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
    // Named here, where the traces are known (the kernel only knows rows).
    if let Some(t) = options.trace_values.iter().position(|&x| out_of_range(x)) {
        return Err(reward_out_of_range(&format!("trace {:?}", view.trace_id.value(t)), options.trace_values[t]));
    }
    if let Some(credit) = options.event_values
        && let Some(e) = credit.iter().position(|&x| out_of_range(x))
    {
        let t = (0..traces).find(|&t| view.events_of(t).contains(&e)).unwrap_or(0);
        let whose = format!("trace {:?}, event {:?}", view.trace_id.value(t), view.id(e));
        return Err(reward_out_of_range(&whose, credit[e]));
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
    let events = Events::new(&view, options)?;
    let (per_trace, per_event) = if events.strata.is_none() && options.event_values.is_none() {
        row_per_trace(&events)?
    } else if options.unit == Unit::Events {
        row_per_event(&events)?
    } else {
        row_per_trace_and_stratum(&events)?
    };
    let (weights, trace_of_event) = weights(events)?;
    debug_assert_eq!(weights.len(), per_event.len());
    Ok(BatchAdvantages { per_trace, per_event, weights, trace_of_event })
}

/// What every layout of rows reads of the batch's events.
struct Events<'a> {
    view: &'a BatchView<'a>,
    options: &'a BatchOptions<'a>,
    trace_of_event: Vec<u32>,
    /// Each event's token count, NaN where not recorded: the loss weights' shares.
    recorded_tokens: Vec<f64>,
    /// Each event's token count, 1 where not recorded: the rows' lengths.
    tokens: Vec<f64>,
    /// Each event's joint code of `normalize_by`, and the number of codes.
    strata: Option<(Vec<u32>, usize)>,
}

/// Advantages per trace and per event.
type Advantages = (Vec<f64>, Vec<f64>);

impl<'a> Events<'a> {
    fn new(view: &'a BatchView<'a>, options: &'a BatchOptions<'a>) -> Result<Self> {
        let mut trace_of_event = Vec::with_capacity(view.n_events());
        for t in 0..view.n_traces() {
            trace_of_event.resize(view.events_of(t).end, t as u32);
        }
        let recorded_tokens = view.tokens_or_nan();
        let tokens = recorded_tokens.iter().map(|&t| if t.is_nan() { 1.0 } else { t }).collect();
        let strata =
            if options.normalize_by.is_empty() { None } else { Some(joint_codes(view, options.normalize_by)?) };
        Ok(Events { view, options, trace_of_event, recorded_tokens, tokens, strata })
    }

    /// The event's credit, or its trace's reward.
    fn value(&self, e: usize) -> f64 {
        match self.options.event_values {
            Some(credit) => credit[e],
            None => self.options.trace_values[self.trace_of_event[e] as usize],
        }
    }
}

/// Plain group normalisation of the trace rewards, broadcast to the events.
fn row_per_trace(events: &Events) -> Result<Advantages> {
    let (view, options) = (events.view, events.options);
    let lengths: Vec<f64> = (0..view.n_traces()).map(|t| events.tokens[view.events_of(t)].iter().sum()).collect();
    let rows = Rows {
        values: options.trace_values,
        groups: options.groups,
        n_groups: options.n_groups,
        strata: None,
        lengths: Some(&lengths),
        tokens: None,
    };
    let per_trace: Vec<f64> = normalize(&rows, &options.spec)?;
    let mut per_event = Vec::with_capacity(view.n_events());
    for (t, &advantage) in per_trace.iter().enumerate() {
        per_event.resize(view.events_of(t).end, advantage);
    }
    Ok((per_trace, per_event))
}

/// Every event a row (Dr. MAS: every step of agent k counts); a trace's advantage is the
/// mean of its events'.
fn row_per_event(events: &Events) -> Result<Advantages> {
    let (view, options) = (events.view, events.options);
    let values: Vec<f64> = (0..view.n_events()).map(|e| events.value(e)).collect();
    let groups: Vec<u32> = events.trace_of_event.iter().map(|&t| options.groups[t as usize]).collect();
    let rows = Rows {
        values: &values,
        groups: &groups,
        n_groups: options.n_groups,
        strata: events.strata.as_ref().map(|(codes, n)| (codes.as_slice(), *n)),
        lengths: Some(&events.tokens),
        tokens: None,
    };
    let per_event: Vec<f64> = normalize(&rows, &options.spec)?;
    let per_trace = means(&per_event, |t| view.events_of(t), view.n_traces());
    Ok((per_trace, per_event))
}

/// One row per (trace, stratum) pair present: its value is the mean of its events' values,
/// its length their tokens.
struct CellRows {
    stratum: Vec<u32>,
    trace: Vec<u32>,
    values: Vec<f64>,
    lengths: Vec<f64>,
    row_of_event: Vec<u32>,
    /// Trace t owns rows `trace_rows[t]..trace_rows[t + 1]`.
    trace_rows: Vec<usize>,
}

impl CellRows {
    fn new(events: &Events, codes: &[u32], n_codes: usize) -> Self {
        let view = events.view;
        let mut local = vec![u32::MAX; n_codes];
        let mut rows = CellRows {
            stratum: Vec::new(),
            trace: Vec::new(),
            values: Vec::new(),
            lengths: Vec::new(),
            row_of_event: vec![0u32; view.n_events()],
            trace_rows: vec![0usize; view.n_traces() + 1],
        };
        let mut counts: Vec<f64> = Vec::new();
        for t in 0..view.n_traces() {
            for e in view.events_of(t) {
                let code = codes[e] as usize;
                if local[code] == u32::MAX {
                    local[code] = rows.stratum.len() as u32;
                    rows.stratum.push(code as u32);
                    rows.trace.push(t as u32);
                    rows.values.push(0.0);
                    counts.push(0.0);
                    rows.lengths.push(0.0);
                }
                let row = local[code] as usize;
                rows.row_of_event[e] = row as u32;
                rows.values[row] += events.value(e);
                counts[row] += 1.0;
                rows.lengths[row] += events.tokens[e];
            }
            for e in view.events_of(t) {
                local[codes[e] as usize] = u32::MAX;
            }
            rows.trace_rows[t + 1] = rows.stratum.len();
        }
        rows.values.iter_mut().zip(&counts).for_each(|(sum, count)| *sum /= count);
        rows
    }
}

/// A trace counts once in every cell it appears in, whatever its number of events; a trace's
/// advantage is the mean of its rows'.
fn row_per_trace_and_stratum(events: &Events) -> Result<Advantages> {
    let (view, options) = (events.view, events.options);
    let zero = vec![0u32; view.n_events()];
    let (codes, n_codes) = events.strata.as_ref().map_or((zero.as_slice(), 1), |(c, n)| (c.as_slice(), *n));
    let cells = CellRows::new(events, codes, n_codes);
    let groups: Vec<u32> = cells.trace.iter().map(|&t| options.groups[t as usize]).collect();
    let rows = Rows {
        values: &cells.values,
        groups: &groups,
        n_groups: options.n_groups,
        strata: events.strata.as_ref().map(|_| (cells.stratum.as_slice(), n_codes)),
        lengths: Some(&cells.lengths),
        tokens: None,
    };
    let per_row: Vec<f64> = normalize(&rows, &options.spec)?;
    let per_event = cells.row_of_event.iter().map(|&r| per_row[r as usize]).collect();
    let per_trace = means(&per_row, |t| cells.trace_rows[t]..cells.trace_rows[t + 1], view.n_traces());
    Ok((per_trace, per_event))
}

/// The loss weights over the strata of `weight_by` (the agents by default), reusing the codes
/// of `normalize_by` when they are the same strata; and the trace of each event.
fn weights(events: Events) -> Result<(Vec<f64>, Vec<u32>)> {
    let (view, options) = (events.view, events.options);
    let weight_by = if options.weight_by.is_empty() { &[Stratum::Agent][..] } else { options.weight_by };
    let (codes, n_codes) = match events.strata {
        Some(codes) if weight_by == options.normalize_by => codes,
        _ => joint_codes(view, weight_by)?,
    };
    let weights = loss_weights(view, options.groups, options.n_groups, &codes, n_codes, &events.recorded_tokens);
    Ok((weights, events.trace_of_event))
}
