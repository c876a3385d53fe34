//! Scattered groups in a trainer's fp32 arithmetic (`compat` verl, TRL, OpenRLHF; GRPO and
//! RLOO without strata). A trainer's group sums follow torch's order over the group's values
//! in row order (`torch_sum`: interleaved lanes folded at the end, chosen by the group's
//! size), and TRL's and verl's spread is taken about that fp32 mean: unlike native's running
//! moments ([`super::scatter`]) they cannot accumulate as the rows stream by. So each
//! group's values are gathered first (a stable counting sort, in parallel over chunks of
//! rows: chunk `c`'s rows of a group go after those of chunks before it, so every group holds
//! its values in row order whatever the chunks), each group's statistics are taken from its
//! slice ([`Trainer32::of_group`], the gathered path's own operations), and each row's
//! advantage is written in row order from its group's entry in a table (8 bytes for GRPO), as
//! native's second pass does. Nothing depends on the number of threads but how the work is
//! split.
//!
//! Where the order is forced: torch's sum of a group and, for TRL and verl, its spread about
//! that sum's mean read the group's values in the trainer's order, so each group's
//! statistics are serial in its own values (groups run in parallel). The counts, the gather
//! and the write have no order of their own: any split gives the same bits.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use rayon::prelude::*;

use super::cell::Trainer32;
use super::float::AdvantageFloat;
use super::scatter::{PREFETCH_ROWS, Used, write_rows};
use super::spec::{Compat, Estimator, Spec};
use crate::error::Result;
use crate::limit::{out_of_range, values_out_of_range};
use crate::parallel::min_piece;
use crate::prefetch::prefetch;

/// Groups per parallel task of the statistics pass.
const GROUPS_PER_TASK: usize = 1 << 10;

/// Rows per chunk of the counting sort: one chunk per thread (each keeps a count per group).
fn chunk_rows(n: usize) -> usize {
    n.div_ceil(rayon::current_num_threads()).max(1 << 16)
}

/// The advantages of rows whose group codes are `code(keys[i])`, counted in `counts` (every
/// code below its number of groups), in `out`. An error for a value out of range (`out`
/// holds no advantages then).
pub(super) fn gather_then_write<K: Copy + Sync, T: AdvantageFloat>(
    values: &[f64],
    keys: &[K],
    code: impl Fn(K) -> usize + Sync + Copy,
    counts: Counts,
    spec: &Spec,
    batch_std: f32,
    out: &mut [T],
) -> Result<()> {
    let (bounds, gathered) = gather(values, keys, code, counts, Filling::new(values, spec, out))?;
    if spec.estimator == Estimator::Grpo {
        // GRPO is `(x - centre) / divisor` in every trainer: 8 bytes a group.
        let table = statistics(&bounds, gathered, spec, |group| group.grpo(spec, batch_std));
        let table = table.as_slice();
        write_fp32(values, keys, out, move |x, k| {
            let (centre, divisor) = table[code(k)];
            (x - centre) / divisor
        });
    } else {
        let table = statistics(&bounds, gathered, spec, |group| group);
        let table = table.as_slice();
        write_fp32(values, keys, out, move |x, k| table[code(k)].advantage(x, spec, batch_std));
    }
    Ok(())
}

/// Each row's advantage in row order, `advantage(x, key)` of its fp32 value `x` (a NaN
/// value gets 0).
fn write_fp32<K: Copy + Sync, T: AdvantageFloat>(
    values: &[f64],
    keys: &[K],
    out: &mut [T],
    advantage: impl Fn(f32, K) -> f32 + Sync + Copy,
) {
    write_rows(values, keys, out, move |x, k| {
        let x = x as f32;
        let advantage = advantage(x, k);
        T::from_f64(if x.is_nan() { 0.0 } else { advantage as f64 })
    });
}

/// The rows' values by group: fp32, what the trainer's tensor holds (in the output's memory,
/// see [`Filling::new`]), except for OpenRLHF where a value is not exact in fp32: its std is
/// torch's f64 one of the f64 values.
enum Gathered<'a> {
    Fp32(&'a [f32]),
    F64(Vec<f64>),
}

/// [`Gathered`] while the chunks of rows fill it: atomics only so that they write their
/// disjoint slots through a shared slice (relaxed stores are plain moves).
enum Filling<'a> {
    Fp32(&'a [AtomicU32]),
    F64(Vec<AtomicU64>),
}

impl<'a> Filling<'a> {
    /// Slots for `values`. The fp32 ones are the first `values.len()` 32-bit words of `out`
    /// (as long, of f32 or f64): the advantages are written there only once the groups'
    /// statistics are taken, and a buffer of its own would be zeroed and fault its pages in
    /// on every call.
    fn new<T: AdvantageFloat>(values: &[f64], spec: &Spec, out: &'a mut [T]) -> Self {
        const { assert!(align_of::<T>() >= align_of::<AtomicU32>() && size_of::<T>() >= size_of::<AtomicU32>()) };
        debug_assert_eq!(out.len(), values.len());
        // Rewards from an fp32 tensor (what OpenRLHF holds) lose nothing in 4 bytes: half the
        // scattered stores of the gather.
        if spec.compat == Compat::OpenRlhf && !exact_in_fp32(values) {
            return Filling::F64((0..values.len()).map(|_| AtomicU64::new(0)).collect());
        }
        // SAFETY: `out` is borrowed mutably for `'a`, so nothing else reads or writes its
        // memory meanwhile. Its `out.len()` elements, each at least 4 bytes and aligned at least
        // as `AtomicU32` is (asserted above), hold `out.len()` aligned words; any bits are a
        // valid `AtomicU32` (which has `u32`'s size and bit validity), and any bits they are
        // left with are a valid f32 or f64.
        Filling::Fp32(unsafe { std::slice::from_raw_parts(out.as_mut_ptr().cast::<AtomicU32>(), out.len()) })
    }

    /// Stores the rows of a chunk (see [`fill_chunk`]); true if a value is out of range.
    fn fill<K: Copy>(&self, values: &[f64], keys: &[K], cursor: &mut [u32], code: impl Fn(K) -> usize) -> bool {
        match self {
            Filling::Fp32(slots) => {
                fill_chunk(slots, values, keys, cursor, code, |slot, x| slot.store((x as f32).to_bits(), Relaxed))
            }
            Filling::F64(slots) => {
                fill_chunk(slots, values, keys, cursor, code, |slot, x| slot.store(x.to_bits(), Relaxed))
            }
        }
    }

    /// Call once every store returned.
    fn filled(self) -> Gathered<'a> {
        match self {
            // SAFETY: an `AtomicU32` has `u32`'s size, alignment here and bit validity, and any
            // bits are a valid f32. Nothing stores into the slots any more: the parallel loop
            // that did returned (which orders its stores before these reads), and `self`, the
            // only handle on the slots, is consumed.
            Filling::Fp32(slots) => {
                Gathered::Fp32(unsafe { std::slice::from_raw_parts(slots.as_ptr().cast::<f32>(), slots.len()) })
            }
            Filling::F64(slots) => Gathered::F64(slots.into_iter().map(|x| f64::from_bits(x.into_inner())).collect()),
        }
    }
}

/// Whether every value is NaN or widens back from fp32 unchanged.
fn exact_in_fp32(values: &[f64]) -> bool {
    // A fold, not a short-circuiting `all`, so that each piece's test vectorises.
    let exact = |piece: &[f64]| piece.iter().fold(true, |exact, &x| exact & (x as f32 as f64 == x || x.is_nan()));
    values.par_chunks(1 << 12).with_min_len(min_piece(values.len())).all(exact)
}

/// Each chunk's count of every group, the chunks being those of [`gather`].
pub(super) struct Counts {
    per_chunk: Vec<Vec<u32>>,
    n_groups: usize,
    /// Whether every row was counted (a row whose code is past the tables is not).
    pub all: bool,
}

impl Counts {
    /// The counts of `n_groups` groups over rows whose group codes are `code(keys[i])`.
    pub fn of<K: Copy + Sync>(keys: &[K], code: impl Fn(K) -> usize + Sync + Copy, n_groups: usize) -> Counts {
        let (per_chunk, all): (Vec<Vec<u32>>, Vec<bool>) = keys
            .par_chunks(chunk_rows(keys.len()))
            .map(|keys| {
                let mut count = vec![0u32; n_groups];
                let all = count_rows(&mut count, keys, code);
                (count, all)
            })
            .unzip();
        Counts { per_chunk, n_groups, all: all.into_iter().all(|all| all) }
    }

    /// The first and the last group with rows (rows were counted).
    pub fn used(&self) -> Used {
        let used = |count: &Vec<u32>| Used {
            first: count.iter().position(|&c| c > 0).unwrap_or(usize::MAX),
            last: count.iter().rposition(|&c| c > 0).unwrap_or(0),
        };
        self.per_chunk.iter().map(used).fold(Used::NONE, Used::and)
    }

    /// The counts of groups `codes.first..=codes.last` only, renumbered from 0.
    pub fn narrow(&mut self, codes: Used) {
        self.n_groups = codes.last - codes.first + 1;
        for count in &mut self.per_chunk {
            count.copy_within(codes.first..=codes.last, 0);
            count.truncate(self.n_groups);
        }
    }
}

/// Counts each row in its group's entry of `count`; false where a row's code is past it (that
/// row is not counted). (A slice, not the table's `Vec`: see [`super::scatter`]'s `add_rows`.)
fn count_rows<K: Copy>(count: &mut [u32], keys: &[K], code: impl Fn(K) -> usize) -> bool {
    let mut all = true;
    for &k in keys {
        match count.get_mut(code(k)) {
            Some(count) => *count += 1,
            None => all = false,
        }
    }
    all
}

/// The rows' values by group in `filling`'s slots (a stable counting sort of the rows `counts`
/// counted: group `g` is slots `bounds[g]..bounds[g + 1]`, in row order); an error for a
/// value out of range.
fn gather<'a, K: Copy + Sync>(
    values: &[f64],
    keys: &[K],
    code: impl Fn(K) -> usize + Sync + Copy,
    counts: Counts,
    filling: Filling<'a>,
) -> Result<(Vec<usize>, Gathered<'a>)> {
    let chunk = chunk_rows(values.len());
    // Where each chunk's rows of each group go: after the group's rows of the chunks before
    // it (u32: half the cache a table of usize takes).
    let Counts { per_chunk: mut cursors, n_groups, .. } = counts;
    let mut bounds = vec![0usize; n_groups + 1];
    let mut next = 0;
    for g in 0..n_groups {
        bounds[g] = next as usize;
        for cursor in &mut cursors {
            let count = cursor[g];
            cursor[g] = next;
            next += count;
        }
    }
    bounds[n_groups] = next as usize;
    let out_of_range_found = values
        .par_chunks(chunk)
        .zip(keys.par_chunks(chunk))
        .zip(cursors)
        .map(|((values, keys), mut cursor)| filling.fill(values, keys, &mut cursor, code))
        .reduce(|| false, |a, b| a || b);
    if out_of_range_found {
        return Err(values_out_of_range("values", values));
    }
    Ok((bounds, filling.filled()))
}

/// Stores each row's value in `slots` (`store`), at its group's cursor (`cursor[code(k)]`,
/// then moved on); true if a value is out of range. The slots are written at random: the
/// slot of a row further on (where its group's cursor is now) is asked for ahead of its
/// store. (A function of its own, over one kind of slot, with `code` held by value: the
/// slots' address, length and kind and what `code` captured stay in registers rather than
/// being read again after every store.)
fn fill_chunk<K: Copy, S>(
    slots: &[S],
    values: &[f64],
    keys: &[K],
    cursor: &mut [u32],
    code: impl Fn(K) -> usize,
    store: impl Fn(&S, f64),
) -> bool {
    let mut found = false;
    for (row, (&x, &k)) in values.iter().zip(keys).enumerate() {
        let ahead = keys.get(row + PREFETCH_ROWS).and_then(|&ahead| cursor.get(code(ahead)));
        if let Some(slot) = ahead.and_then(|&ahead| slots.get(ahead as usize)) {
            prefetch(slot);
        }
        found |= out_of_range(x);
        let slot = &mut cursor[code(k)];
        store(&slots[*slot as usize], x);
        *slot += 1;
    }
    found
}

/// Every group's entry of the table the rows are written from: `entry` of its statistics
/// (`gathered` is then let go: its slots may be the output's).
fn statistics<E: Copy + Default + Send>(
    bounds: &[usize],
    gathered: Gathered,
    spec: &Spec,
    entry: impl Fn(Trainer32) -> E + Sync,
) -> Vec<E> {
    let mut table = vec![E::default(); bounds.len() - 1];
    table.par_chunks_mut(GROUPS_PER_TASK).enumerate().for_each_init(
        || (Vec::new(), Vec::new()),
        |(values32, scratch), (task, entries)| {
            for (g, slot) in (task * GROUPS_PER_TASK..).zip(entries) {
                let range = bounds[g]..bounds[g + 1];
                *slot = entry(match &gathered {
                    Gathered::Fp32(all) => {
                        let values32 = &all[range];
                        let exact = (spec.compat == Compat::OpenRlhf).then(|| values32.iter().map(|&x| x as f64));
                        Trainer32::of_group(values32, exact, spec, scratch)
                    }
                    Gathered::F64(all) => {
                        values32.clear();
                        values32.extend(all[range.clone()].iter().map(|&x| x as f32));
                        Trainer32::of_group(values32, Some(all[range].iter().copied()), spec, scratch)
                    }
                });
            }
        },
    );
    table
}
