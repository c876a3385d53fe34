//! Loss weights that keep a wide trace from drowning a narrow one: WideSeek-R1 weighs each
//! token by 1/G * 1/N_agents * 1/tokens_of_its_agent, so every rollout, and every agent in
//! it, counts the same whatever its size. Generalised here to any strata: an event's weight
//! is 1/(traces in its group) * 1/(strata present in its trace) * its share of its
//! (trace, stratum) cell, by tokens where the cell records them all, by count otherwise.
//! The weights of a group's events sum to 1.

use rayon::prelude::*;

use crate::parallel::min_items;
use crate::trace_view::BatchView;

/// Per-event weights; `codes` are the events' stratum codes (`n_codes` of them), `groups`
/// the traces' dense group codes.
pub(crate) fn loss_weights(
    view: &BatchView,
    groups: &[u32],
    n_groups: usize,
    codes: &[u32],
    n_codes: usize,
) -> Vec<f64> {
    let mut traces_in_group = vec![0u32; n_groups];
    for &g in groups {
        traces_in_group[g as usize] += 1;
    }
    let parts: Vec<Vec<f64>> = (0..view.n_traces())
        .into_par_iter()
        .with_min_len(min_items(view.n_traces(), view.n_events()))
        .map_init(
            || (vec![u32::MAX; n_codes], Vec::<(u32, f64, bool)>::new()),
            |(local, cells), trace| {
                let range = view.events_of(trace);
                cells.clear();
                // (events, tokens, every event has tokens) per cell of this trace
                for e in range.clone() {
                    let code = codes[e] as usize;
                    if local[code] == u32::MAX {
                        local[code] = cells.len() as u32;
                        cells.push((0, 0.0, true));
                    }
                    let cell = &mut cells[local[code] as usize];
                    cell.0 += 1;
                    match view.tokens(e) {
                        Some(t) => cell.1 += t as f64,
                        None => cell.2 = false,
                    }
                }
                let per_trace = 1.0 / traces_in_group[groups[trace] as usize] as f64 / cells.len() as f64;
                let weights = range
                    .clone()
                    .map(|e| {
                        let (count, tokens, all) = cells[local[codes[e] as usize] as usize];
                        let share = if all && tokens > 0.0 {
                            view.tokens(e).unwrap_or(0) as f64 / tokens
                        } else {
                            1.0 / count as f64
                        };
                        per_trace * share
                    })
                    .collect();
                for e in range {
                    local[codes[e] as usize] = u32::MAX;
                }
                weights
            },
        )
        .collect();
    parts.concat()
}
