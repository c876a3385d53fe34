//! Loss weights that keep a wide trace from drowning a narrow one: WideSeek-R1 weighs each
//! token by 1/G * 1/N_agents * 1/tokens_of_its_agent, so every rollout, and every agent in
//! it, counts the same whatever its size. Generalised here to any strata: an event's weight
//! is 1/(traces in its group) * 1/(strata present in its trace) * its share of its
//! (trace, stratum) cell, by tokens where the cell records them all, by count otherwise.
//! The weights of a group's events sum to 1.

use rayon::prelude::*;

use crate::parallel::min_items;
use crate::trace_view::BatchView;

/// What a (trace, stratum) cell holds: its events, and their tokens (NaN unless every one of
/// them records its tokens).
#[derive(Clone, Copy)]
struct Cell {
    events: u32,
    tokens: f64,
}

/// Per-event weights; `codes` are the events' stratum codes (`n_codes` of them), `groups`
/// the traces' dense group codes, `tokens` each event's token count (NaN where not recorded).
pub(crate) fn loss_weights(
    view: &BatchView,
    groups: &[u32],
    n_groups: usize,
    codes: &[u32],
    n_codes: usize,
    tokens: &[f64],
) -> Vec<f64> {
    let mut traces_in_group = vec![0u32; n_groups];
    for &g in groups {
        traces_in_group[g as usize] += 1;
    }
    let mut weights = vec![0.0; view.n_events()];
    // Each trace's slice of the weights, written by whichever thread takes the trace.
    let mut rest = weights.as_mut_slice();
    let mut per_trace: Vec<&mut [f64]> = Vec::with_capacity(view.n_traces());
    for trace in 0..view.n_traces() {
        let (slice, tail) = rest.split_at_mut(view.events_of(trace).len());
        per_trace.push(slice);
        rest = tail;
    }
    let pieces = min_items(view.n_traces(), view.n_events());
    per_trace.into_par_iter().enumerate().with_min_len(pieces).for_each_init(
        || (vec![u32::MAX; n_codes], Vec::<u32>::new(), Vec::<Cell>::new()),
        |(local, cell_of, cells), (trace, out)| {
            let range = view.events_of(trace);
            let (codes, tokens) = (&codes[range.clone()], &tokens[range]);
            // The trace's cells numbered as they first come, then their sums.
            cell_of.clear();
            let mut n_cells = 0;
            for &code in codes {
                let cell = &mut local[code as usize];
                if *cell == u32::MAX {
                    *cell = n_cells;
                    n_cells += 1;
                }
                cell_of.push(*cell);
            }
            cells.clear();
            cells.resize(n_cells as usize, Cell { events: 0, tokens: 0.0 });
            for (&c, &t) in cell_of.iter().zip(tokens) {
                let cell = &mut cells[c as usize];
                cell.events += 1;
                cell.tokens += t;
            }
            let trace_weight = 1.0 / traces_in_group[groups[trace] as usize] as f64 / n_cells as f64;
            for ((slot, &c), &t) in out.iter_mut().zip(cell_of.iter()).zip(tokens) {
                let cell = cells[c as usize];
                // NaN tokens (one event without them) fail the test: shares by count then.
                let share = if cell.tokens > 0.0 { t / cell.tokens } else { 1.0 / cell.events as f64 };
                *slot = trace_weight * share;
            }
            for &code in codes {
                local[code as usize] = u32::MAX;
            }
        },
    );
    weights
}
