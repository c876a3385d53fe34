//! Scattered groups for GRPO and RLOO without strata: the layout rows have after a shuffle or
//! a buffer sample. Native arithmetic here; the trainer modes' gather first
//! ([`super::trainer_scatter`]), then write as the second pass below. Instead of gathering each group's rows (a counting sort, then
//! reads and writes in that order), the statistics accumulate in a table indexed by group
//! code, as numpy's `bincount` does, in two passes over the rows in their own order: one
//! takes each group's count and shifted sums (see [`Moments`]), which bound its values, one
//! writes each row's advantage from its group's `(centre, scale)` ([`Affine`]: 16 bytes a
//! group, so the table a row reads stays in cache).
//!
//! A row's group is a dense code, or an integer key read as its distance from a table's first
//! key where the keys span a narrow range (no codes are materialised: [`normalize_keys`]).
//!
//! The first pass runs in parallel over fixed chunks of [`CHUNK_ROWS`] rows, each chunk's
//! moments taken in a table of its own (its rows in row order) and the tables merged into
//! the total in chunk order ([`Moments::merge`]). The chunks never depend on the number of
//! threads (nor on the number of groups, so narrow and hashed keys agree), so the results
//! are the same bits at any thread count; up to [`CHUNK_ROWS`] rows they are those of one
//! plain pass over the rows.

use rayon::prelude::*;

use super::float::AdvantageFloat;
use super::kernel::{KeyRange, key_range, narrow_span};
use super::rows::Rows;
use super::spec::{Compat, Estimator, Scale, Spec};
use super::trainer_scatter::{Counts, gather_then_write};
use crate::error::Result;
use crate::limit::{out_of_range, shifted_sums_in_range, values_out_of_range};
use crate::parallel::min_piece;
use crate::prefetch::prefetch;

/// A group's count and the sums of `x - shift` and `(x - shift)^2` over its values, `shift`
/// being its first value: the shifted-data variance, as accurate as two passes
/// since `shift` is one of the group's own values, in one pass. The group is constant
/// exactly when the squares sum to 0.
#[derive(Clone, Copy, Default)]
struct Moments {
    n: u32,
    shift: f64,
    sum: f64,
    squares: f64,
}

impl Moments {
    #[inline(always)]
    fn add(&mut self, x: f64) {
        // A select, not a branch: a group's first row comes at random.
        let shift = std::hint::select_unpredictable(self.n == 0, x, self.shift);
        let d = x - shift;
        self.shift = shift;
        self.n += 1;
        self.sum += d;
        self.squares += d * d;
    }

    /// The moments of `self`'s values followed by `later`'s, about `self`'s shift (the
    /// first value): `later`'s sums moved from its shift by `d`, as
    /// `sum (x - s + d) = sum + n d` and `sum (x - s + d)^2 = squares + 2 d sum + n d^2`.
    /// Exactly `later` when `self` is empty (and `self` when `later` is).
    fn merge(&mut self, later: &Moments) {
        if later.n == 0 {
            return;
        }
        if self.n == 0 {
            *self = *later;
            return;
        }
        let (n, d) = (later.n as f64, later.shift - self.shift);
        self.n += later.n;
        self.sum += later.sum + n * d;
        self.squares += later.squares + 2.0 * d * later.sum + n * d * d;
    }

    /// Whether a value of the group may be out of [`limit`](crate::limit)'s range (true for an
    /// infinite value, whose sums are not numbers).
    fn may_be_out_of_range(&self) -> bool {
        !shifted_sums_in_range(self.shift, self.squares)
    }

    /// The advantage of value `x` of this group is `(x - centre) * scale`.
    fn affine(&self, spec: &Spec, batch_std: f64) -> Affine {
        if self.n < 2 || self.squares == 0.0 {
            // No comparison in the group: every advantage is 0.
            return Affine { centre: 0.0, scale: 0.0 };
        }
        let n = self.n as f64;
        let centre = self.shift + self.sum / n;
        let scale = match (spec.estimator, spec.scale) {
            // `x - (sum - x) / (n - 1)` is `(x - mean) * n / (n - 1)`.
            (Estimator::Rloo, _) => n / (n - 1.0),
            (_, Scale::Group) => {
                let m2 = (self.squares - self.sum * self.sum / n).max(0.0);
                spec.native_factor((m2 / (n - 1.0)).sqrt())
            }
            (_, Scale::Batch) => spec.native_factor(batch_std),
            (_, Scale::None) => 1.0,
        };
        Affine { centre, scale }
    }
}

#[derive(Clone, Copy, Default)]
struct Affine {
    centre: f64,
    scale: f64,
}

/// Whether a table of `n_groups` entries pays for itself over `n` rows (not where most groups
/// have one or two rows: the gathered path does better there); the trainer modes' counting
/// sort numbers rows in u32.
fn worth_a_table(n: usize, n_groups: usize) -> bool {
    n_groups <= n / 2 && u32::try_from(n).is_ok()
}

/// Whether `spec` is computed here over rows without strata: GRPO and RLOO, natively or in a
/// trainer's arithmetic.
pub(super) fn takes(spec: &Spec) -> bool {
    matches!(spec.estimator, Estimator::Grpo | Estimator::Rloo)
}

/// Whether [`normalize_scattered`] computes `spec` over `rows`.
pub(super) fn applies(rows: &Rows, spec: &Spec) -> bool {
    takes(spec) && rows.strata.is_none() && worth_a_table(rows.values.len(), rows.n_groups)
}

/// Native's two passes or the trainer modes' gather and write (see the module doc).
fn by_arithmetic<K: Copy + Sync, T: AdvantageFloat>(
    values: &[f64],
    keys: &[K],
    code: impl Fn(K) -> usize + Sync + Copy,
    n_groups: usize,
    spec: &Spec,
    batch_std: (f64, f32),
    out: &mut [T],
) -> Result<()> {
    match spec.compat {
        Compat::Native => two_passes(values, keys, code, n_groups, spec, batch_std.0, out),
        _ => gather_then_write(values, keys, code, Counts::of(keys, code, n_groups), spec, batch_std.1, out),
    }
}

/// Advantages of rows whose groups are scattered, in row order; NaN values are left out of
/// the statistics and get 0. Call where [`applies`] holds, after the values were checked
/// finite or NaN.
pub(super) fn normalize_scattered<T: AdvantageFloat>(rows: &Rows, spec: &Spec, batch_std: (f64, f32), out: &mut [T]) {
    // The values were checked: no value out of range to report.
    let _ = by_arithmetic(rows.values, rows.groups, |g| g as usize, rows.n_groups, spec, batch_std, out);
}

/// Whether keys spanning `span` over `n` rows are read through a table here.
fn table_fits(span: u64, n: usize) -> bool {
    narrow_span(span, n) && worth_a_table(n, span as usize + 1)
}

/// Rows labelled by integer keys over a narrow range (`key - min` is the code: no renumbering)
/// whose groups are scattered, for a spec of the scattered path without strata. None where
/// that does not hold (keys spread wide, groups contiguous, most groups of one or two rows):
/// the caller takes the general path. Finds values out of range itself.
///
/// The keys' range is not read ahead of the first pass (a pass over the keys of its own): the
/// pass (native's moments, the trainer modes' counts) runs over a table around the range of
/// the keys [`reappears`] reads, widened by [`window`], and finds the keys' range as it goes;
/// where a key falls outside the window, the range is read and the pass run again. The
/// decisions are those of the keys' own range either way: the probe's range is within it, and
/// `reappears` reads codes only for equality. The trainer modes then number the groups from
/// the smallest key, as from the range read.
pub(super) fn normalize_keys<T: AdvantageFloat>(
    values: &[f64],
    keys: &[i64],
    spec: &Spec,
    batch_std: impl FnOnce() -> (f64, f32),
) -> Option<Result<Vec<T>>> {
    let n = values.len();
    let probe = &keys[..n.min(PROBE_ROWS)];
    let probed = key_range(probe)?;
    if !table_fits(probed.span, n) {
        return None; // the keys span at least what the probe's do
    }
    let (origin, len) = window(probed);
    let windowed = move |k: i64| k.wrapping_sub(origin) as u64 as usize;
    if !reappears(probe, windowed, len) {
        return None;
    }
    let batch_std = batch_std();
    let mut out = vec![T::default(); n];
    if spec.compat == Compat::Native {
        let (moments, used) = moments_by_group(values, keys, windowed, len);
        if used.last < len {
            if !table_fits(used.span(), n) {
                return None;
            }
            let written = write_advantages(&moments, values, keys, windowed, spec, batch_std.0, &mut out);
            return Some(written.map(|()| out));
        }
    } else {
        let mut counts = Counts::of(keys, windowed, len);
        if counts.all {
            let used = counts.used();
            if !table_fits(used.span(), n) {
                return None;
            }
            counts.narrow(used);
            let min = origin.wrapping_add(used.first as i64);
            let code = move |k: i64| k.wrapping_sub(min) as u64 as usize;
            let written = gather_then_write(values, keys, code, counts, spec, batch_std.1, &mut out);
            return Some(written.map(|()| out));
        }
    }
    let KeyRange { min, span } = key_range(keys)?;
    if !table_fits(span, n) {
        return None;
    }
    let code = move |k: i64| k.wrapping_sub(min) as u64 as usize;
    Some(by_arithmetic(values, keys, code, span as usize + 1, spec, batch_std, &mut out).map(|()| out))
}

/// The table of the native first pass for keys whose probe spans `probed`: (the key of entry
/// 0, the number of entries), an eighth of the probe's span wider on either side. The rows a
/// shuffle leaves in the probe cover nearly every group's range already.
fn window(probed: KeyRange) -> (i64, usize) {
    let margin = probed.span / 8 + 64;
    (probed.min.saturating_sub(margin as i64), (probed.span + 2 * margin + 1) as usize)
}

/// Rows the cheap test for scattered groups reads.
pub(super) const PROBE_ROWS: usize = 1 << 14;

/// Whether a group of `keys` comes back after another group's rows: the groups are
/// scattered. Stops at the first such row (after a shuffle, a few hundred rows in).
pub(super) fn reappears<K: Copy>(keys: &[K], code: impl Fn(K) -> usize, n_groups: usize) -> bool {
    let mut seen = vec![0u64; n_groups.div_ceil(64)];
    let mut previous = usize::MAX;
    for &k in keys {
        let g = code(k);
        if g != previous {
            let (word, bit) = (g / 64, 1u64 << (g % 64));
            if seen[word] & bit != 0 {
                return true;
            }
            seen[word] |= bit;
            previous = g;
        }
    }
    false
}

/// Rows per chunk of the first pass (see the module doc): a constant, so that the results
/// depend on the rows alone. Big enough that a chunk's table costs little beside its rows.
const CHUNK_ROWS: usize = 1 << 19;

/// How many rows ahead [`add_rows`] asks for a row's entry of the table (and the trainer
/// modes' gather for a row's slot): about as many as it handles while a line comes from the
/// outer caches.
pub(super) const PREFETCH_ROWS: usize = 20;

/// The smallest and the largest group code of some rows.
#[derive(Clone, Copy)]
pub(super) struct Used {
    pub first: usize,
    pub last: usize,
}

impl Used {
    pub const NONE: Used = Used { first: usize::MAX, last: 0 };

    pub fn and(self, other: Used) -> Used {
        Used { first: self.first.min(other.first), last: self.last.max(other.last) }
    }

    /// How far the last code is from the first (some rows: `first <= last`).
    pub fn span(self) -> u64 {
        (self.last - self.first) as u64
    }
}

/// Adds each row's value to its group's entry of `table`, in row order (NaN values left out;
/// a row whose code is past the table too), and returns the codes the rows use. The table is
/// read at random: the entry of a row further on is asked for now, so that it is in cache
/// when that row comes. (A slice, not the table's `Vec`: its address and length stay in
/// registers rather than being read again after every store.)
fn add_rows<K: Copy>(table: &mut [Moments], values: &[f64], keys: &[K], code: impl Fn(K) -> usize) -> Used {
    let mut used = Used::NONE;
    for (row, (&x, &k)) in values.iter().zip(keys).enumerate() {
        if let Some(entry) = keys.get(row + PREFETCH_ROWS).and_then(|&ahead| table.get(code(ahead))) {
            prefetch(entry);
        }
        let g = code(k);
        used = Used { first: used.first.min(g), last: used.last.max(g) };
        if let Some(entry) = table.get_mut(g).filter(|_| !x.is_nan()) {
            entry.add(x);
        }
    }
    used
}

/// The moments of every group over rows whose group codes are `code(keys[i])` (NaN values
/// left out; rows whose code is `n_groups` or more too), and the codes the rows use: as many
/// chunks at a time as there are threads, each into a table of its own, merged into the total
/// in chunk order (the first chunk's table is the total).
fn moments_by_group<K: Copy + Sync>(
    values: &[f64],
    keys: &[K],
    code: impl Fn(K) -> usize + Sync + Copy,
    n_groups: usize,
) -> (Vec<Moments>, Used) {
    let chunks: Vec<(&[f64], &[K])> = values.chunks(CHUNK_ROWS).zip(keys.chunks(CHUNK_ROWS)).collect();
    let mut total = Vec::new();
    let mut tables: Vec<Vec<Moments>> = Vec::new();
    let mut used = Used::NONE;
    for (wave, chunks) in chunks.chunks(rayon::current_num_threads().max(1)).enumerate() {
        tables.resize_with(chunks.len(), Vec::new);
        let wave_used = tables
            .par_iter_mut()
            .zip(chunks)
            .map(|(table, &(values, keys))| {
                table.clear();
                table.resize(n_groups, Moments::default());
                add_rows(table, values, keys, code)
            })
            .reduce(|| Used::NONE, Used::and);
        used = used.and(wave_used);
        let later = if wave == 0 {
            total = std::mem::take(&mut tables[0]);
            &tables[1..]
        } else {
            &tables[..]
        };
        if !later.is_empty() {
            const PART: usize = 1 << 12;
            total.par_chunks_mut(PART).enumerate().for_each(|(part, total)| {
                for table in later {
                    for (sum, later) in total.iter_mut().zip(&table[part * PART..]) {
                        sum.merge(later);
                    }
                }
            });
        }
    }
    total.resize(n_groups, Moments::default()); // no rows: no chunk
    (total, used)
}

/// The two passes over rows whose group codes are `code(keys[i])`, all below `n_groups`.
/// An error for a value out of range, found after the first pass (nothing written then).
fn two_passes<K: Copy + Sync, T: AdvantageFloat>(
    values: &[f64],
    keys: &[K],
    code: impl Fn(K) -> usize + Sync + Copy,
    n_groups: usize,
    spec: &Spec,
    batch_std: f64,
    out: &mut [T],
) -> Result<()> {
    let (moments, _) = moments_by_group(values, keys, code, n_groups);
    write_advantages(&moments, values, keys, code, spec, batch_std, out)
}

/// The second pass, from every group's moments (`moments[code(keys[i])]`, every code in
/// range). An error for a value out of range (nothing written then).
fn write_advantages<K: Copy + Sync, T: AdvantageFloat>(
    moments: &[Moments],
    values: &[f64],
    keys: &[K],
    code: impl Fn(K) -> usize + Sync + Copy,
    spec: &Spec,
    batch_std: f64,
    out: &mut [T],
) -> Result<()> {
    let piece = min_piece(moments.len());
    if moments.par_iter().with_min_len(piece).any(Moments::may_be_out_of_range)
        && values.par_iter().with_min_len(min_piece(values.len())).any(|&x| out_of_range(x))
    {
        return Err(values_out_of_range("values", values));
    }
    let affine: Vec<Affine> = moments.par_iter().with_min_len(piece).map(|m| m.affine(spec, batch_std)).collect();
    let affine = affine.as_slice();
    write_rows(values, keys, out, move |x, k| {
        let Affine { centre, scale } = affine[code(k)];
        // A NaN reward gets 0; `+ 0.0` turns the -0.0 of a constant group's negative
        // values into 0.0 and changes nothing else.
        T::from_f64(if x.is_nan() { 0.0 } else { (x - centre) * scale + 0.0 })
    });
    Ok(())
}

/// The second pass of both arithmetics: `out[i] = advantage(values[i], keys[i])`, in
/// parallel over pieces of rows.
pub(super) fn write_rows<K: Copy + Sync, T: AdvantageFloat>(
    values: &[f64],
    keys: &[K],
    out: &mut [T],
    advantage: impl Fn(f64, K) -> T + Sync + Copy,
) {
    let chunk = (values.len() / (rayon::current_num_threads() * 4)).max(1 << 14);
    let pieces = values.par_chunks(chunk).zip(keys.par_chunks(chunk));
    out.par_chunks_mut(chunk).zip(pieces).for_each(|(out, (values, keys))| write_piece(out, values, keys, advantage));
}

/// One piece of [`write_rows`], in a function of its own so that `out` is known to alias
/// nothing the loop reads, and `advantage` (what it captured: the table's address, the keys'
/// origin) held by value: they stay in registers rather than being read again after every
/// store.
fn write_piece<K: Copy, T>(out: &mut [T], values: &[f64], keys: &[K], advantage: impl Fn(f64, K) -> T) {
    for ((slot, &x), &k) in out.iter_mut().zip(values).zip(keys) {
        *slot = advantage(x, k);
    }
}
