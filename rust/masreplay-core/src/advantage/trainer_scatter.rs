//! Scattered groups in a trainer's fp32 arithmetic (`compat` verl, TRL, OpenRLHF; GRPO and
//! RLOO without strata). A trainer's group sums follow torch's order over the group's values
//! in row order (`torch_sum`: interleaved lanes folded at the end, chosen by the group's
//! size), and TRL's and verl's spread is taken about that fp32 mean: unlike native's running
//! moments ([`super::scatter`]) they cannot accumulate as the rows stream by. So each
//! group's values are gathered first (a stable counting sort, in parallel over chunks of
//! rows: chunk `c`'s rows of a group go after those of chunks before it, so every group holds
//! its values in row order whatever the chunks), each group's statistics are taken from its
//! slice ([`Trainer32::of_group`], the gathered path's own operations), and each row's
//! advantage is written in row order from its group's 24-byte entry, as native's second pass
//! does. Nothing depends on the number of threads but how the work is split.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use rayon::prelude::*;

use super::cell::Trainer32;
use super::float::AdvantageFloat;
use super::kernel::infinite_values;
use super::spec::Spec;
use crate::error::Result;

/// Groups per parallel task of the statistics pass.
const GROUPS_PER_TASK: usize = 1 << 10;

/// Rows per chunk of the counting sort: one chunk per thread (each keeps a count per group).
fn chunk_rows(n: usize) -> usize {
    n.div_ceil(rayon::current_num_threads()).max(1 << 16)
}

/// The advantages of rows whose group codes are `code(keys[i])`, all below `n_groups`, in
/// `out`. An error for an infinite value (nothing written then).
pub(super) fn gather_then_write<K: Copy + Sync, T: AdvantageFloat>(
    values: &[f64],
    keys: &[K],
    code: impl Fn(K) -> usize + Sync + Copy,
    n_groups: usize,
    spec: &Spec,
    batch_std: f32,
    out: &mut [T],
) -> Result<()> {
    let chunk = chunk_rows(values.len());
    let rows = || values.par_chunks(chunk).zip(keys.par_chunks(chunk));
    // Each chunk's count of every group, then where its rows of each group go.
    let counted: Vec<(Vec<usize>, bool)> = rows()
        .map(|(values, keys)| {
            let mut count = vec![0usize; n_groups];
            let mut infinite = false;
            for (&x, &k) in values.iter().zip(keys) {
                count[code(k)] += 1;
                infinite |= x.is_infinite();
            }
            (count, infinite)
        })
        .collect();
    if counted.iter().any(|(_, infinite)| *infinite) {
        return Err(infinite_values());
    }
    let mut cursors: Vec<Vec<usize>> = counted.into_iter().map(|(count, _)| count).collect();
    let mut bounds = vec![0usize; n_groups + 1];
    let mut next = 0;
    for g in 0..n_groups {
        bounds[g] = next;
        for cursor in &mut cursors {
            let count = cursor[g];
            cursor[g] = next;
            next += count;
        }
    }
    bounds[n_groups] = next;

    // The rows by group; atomics only so that chunks write their disjoint slots through a
    // shared slice (relaxed stores and loads are plain moves).
    let gathered: Vec<AtomicU64> = (0..values.len()).map(|_| AtomicU64::new(0)).collect();
    rows().zip(cursors).for_each(|((values, keys), mut cursor)| {
        for (&x, &k) in values.iter().zip(keys) {
            let slot = &mut cursor[code(k)];
            gathered[*slot].store(x.to_bits(), Relaxed);
            *slot += 1;
        }
    });

    let mut table = vec![Trainer32::default(); n_groups];
    table.par_chunks_mut(GROUPS_PER_TASK).enumerate().for_each_init(
        || (Vec::new(), Vec::new(), Vec::new()),
        |(group, values32, scratch), (task, entries)| {
            for (g, entry) in (task * GROUPS_PER_TASK..).zip(entries) {
                group.clear();
                group.extend(gathered[bounds[g]..bounds[g + 1]].iter().map(|x| f64::from_bits(x.load(Relaxed))));
                *entry = Trainer32::of_group(group, spec, values32, scratch);
            }
        },
    );

    let chunk = (values.len() / (rayon::current_num_threads() * 4)).max(1 << 14);
    let pieces = values.par_chunks(chunk).zip(keys.par_chunks(chunk));
    out.par_chunks_mut(chunk).zip(pieces).for_each(|(out, (values, keys))| {
        for ((slot, &x), &k) in out.iter_mut().zip(values).zip(keys) {
            *slot = T::from_f64(table[code(k)].advantage(x as f32, spec, batch_std) as f64);
        }
    });
    Ok(())
}
