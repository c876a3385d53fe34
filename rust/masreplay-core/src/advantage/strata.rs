//! Per-event stratum codes: which agent, role, graph depth, turn or event type an event
//! belongs to, and joint codes for several at once. Codes are dense and comparable across
//! the traces of a batch (an agent's name, not its position, decides its code), so a cell of
//! the normalisation is "these events of the group's traces".

use std::collections::HashMap;

use arrow_array::cast::AsArray;
use arrow_buffer::ArrowNativeType;
use rayon::prelude::*;

use crate::bail;
use crate::error::{MasreplayError, Result};
use crate::names::named_enum;
use crate::parallel::min_items;
use crate::store::TraceBatch;
use crate::trace_view::BatchView;

named_enum!(
    /// What a cell of the normalisation holds apart, event by event.
    Stratum as "stratum" {
        /// The event's author (Dr. MAS's agent-wise normalisation).
        Agent = "agent",
        /// The author's role (events without one share a stratum).
        Role = "role",
        /// Longest-path distance from a root of the event graph: events at the same depth.
        Depth = "depth",
        /// The event's position among its author's events by time: the agent's k-th turn.
        Turn = "turn",
        EventType = "event_type",
    }
);

/// Joint codes above this many combinations are renumbered densely (the normalisation keeps
/// one table entry per possible code and thread).
const DIRECT_CODES: u64 = 1 << 20;

/// Codes of one stratum for every event, and how many codes there are.
fn codes_of(view: &BatchView, stratum: Stratum) -> Result<(Vec<u32>, usize)> {
    let n = view.n_events();
    Ok(match stratum {
        Stratum::Agent => ((0..n).map(|e| view.agent(e)).collect(), view.n_authors().max(1)),
        Stratum::EventType => {
            let keys = view.events.event_type.keys();
            ((0..n).map(|e| keys.value(view.column_row(e)) as u32).collect(), crate::trace::EventType::NAMES.len())
        }
        Stratum::Role => {
            let role = view.events.role;
            let mut numbers: HashMap<&str, u32> = HashMap::new();
            let of_key: Vec<u32> = role
                .values()
                .as_string::<i32>()
                .iter()
                .map(|name| {
                    let next = numbers.len() as u32 + 1;
                    *numbers.entry(name.unwrap_or("")).or_insert(next)
                })
                .collect();
            let codes = (0..n)
                .map(|e| {
                    let row = view.column_row(e);
                    if arrow_array::Array::is_null(role, row) { 0 } else { of_key[role.keys().value(row).as_usize()] }
                })
                .collect();
            (codes, numbers.len() + 1)
        }
        Stratum::Depth => per_trace(view, |trace| {
            let graph = view.graph(trace);
            let mut depth = vec![0u32; graph.n_events()];
            for &event in &view.topological_order(trace, &graph)? {
                for &next in graph.successors(event) {
                    depth[next as usize] = depth[next as usize].max(depth[event as usize] + 1);
                }
            }
            Ok(depth)
        })?,
        Stratum::Turn => per_trace(view, |trace| Ok(view.turns(trace)))?,
    })
}

/// Concatenates a per-trace computation (run in parallel); the count is the largest code + 1.
fn per_trace(view: &BatchView, f: impl Fn(usize) -> Result<Vec<u32>> + Sync + Send) -> Result<(Vec<u32>, usize)> {
    let pieces = min_items(view.n_traces(), view.n_events());
    let parts: Vec<Vec<u32>> =
        (0..view.n_traces()).into_par_iter().with_min_len(pieces).map(f).collect::<Result<_>>()?;
    let codes: Vec<u32> = parts.concat();
    let count = codes.iter().max().map_or(1, |&m| m as usize + 1);
    Ok((codes, count))
}

pub(crate) fn joint_codes(view: &BatchView, strata: &[Stratum]) -> Result<(Vec<u32>, usize)> {
    let Some((&first, rest)) = strata.split_first() else {
        bail!("normalize_by names no stratum");
    };
    let (first_codes, count) = codes_of(view, first)?;
    if rest.is_empty() && count as u64 <= DIRECT_CODES {
        return Ok((first_codes, count)); // one stratum: its codes are the joint codes
    }
    let mut codes: Vec<u64> = first_codes.into_iter().map(u64::from).collect();
    let mut combinations = count as u64;
    for &stratum in rest {
        let (next, count) = codes_of(view, stratum)?;
        codes.iter_mut().zip(&next).for_each(|(a, &c)| *a = *a * count as u64 + c as u64);
        combinations = combinations.checked_mul(count as u64).ok_or_else(|| {
            MasreplayError::InvalidArgument(format!("normalize_by {strata:?} has too many combinations"))
        })?;
    }
    if combinations <= DIRECT_CODES {
        return Ok((codes.into_iter().map(|c| c as u32).collect(), combinations as usize));
    }
    let mut numbers: HashMap<u64, u32> = HashMap::new();
    let dense = codes
        .into_iter()
        .map(|c| {
            let next = numbers.len() as u32;
            *numbers.entry(c).or_insert(next)
        })
        .collect();
    Ok((dense, numbers.len()))
}

/// Dense joint codes of `strata` for every event of `batch` (aligned with `batch.events()`),
/// and the number of codes.
pub fn strata_codes(batch: &TraceBatch, strata: &[Stratum]) -> Result<(Vec<u32>, usize)> {
    joint_codes(&BatchView::new(batch), strata)
}
