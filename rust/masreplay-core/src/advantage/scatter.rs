//! Scattered groups for native GRPO and RLOO without strata: the layout rows have after a
//! shuffle or a buffer sample. Instead of gathering each group's rows (a counting sort, then
//! reads and writes in that order), the statistics accumulate in tables indexed by group
//! code, as numpy's `bincount` does, in three passes over the rows in their own order.
//!
//! The rows are cut into chunks whose size depends only on the input's shape, each chunk
//! fills its own table in parallel, and the tables are added in chunk order: the same sums
//! in the same order at any thread count.

use rayon::prelude::*;

use super::cell::Cell;
use super::float::AdvantageFloat;
use super::rows::Rows;
use super::spec::Spec;

/// A group's first-pass statistics within one chunk.
#[derive(Clone, Copy, Default)]
struct Sums {
    n: u32,
    /// Whether every value so far equals `first` (such a cell normalises to 0 exactly).
    constant: bool,
    first: f64,
    sum: f64,
}

impl Sums {
    #[inline]
    fn add(&mut self, x: f64) {
        if self.n == 0 {
            (self.first, self.constant) = (x, true);
        } else {
            self.constant &= x == self.first;
        }
        self.n += 1;
        self.sum += x;
    }

    fn merge(&mut self, later: &Sums) {
        if later.n == 0 {
            return;
        }
        if self.n == 0 {
            *self = *later;
            return;
        }
        self.constant &= later.constant && later.first == self.first;
        self.n += later.n;
        self.sum += later.sum;
    }
}

/// Rows per chunk, or None where tables of every group per chunk would outweigh the rows
/// (most groups of one or two rows: the gathered path does better there).
fn chunk_rows(n: usize, n_groups: usize) -> Option<usize> {
    if n_groups > n / 2 {
        return None;
    }
    // Each chunk's table costs a pass over `n_groups` entries: keep chunks several times larger.
    Some((n_groups * 8).max(1 << 15).max(n / 16))
}

/// Whether [`normalize_scattered`] computes `spec` over `rows`.
pub(super) fn applies(rows: &Rows, spec: &Spec) -> bool {
    super::small::small_path(spec) && rows.strata.is_none() && chunk_rows(rows.values.len(), rows.n_groups).is_some()
}

/// Advantages of rows whose groups are scattered, in row order; NaN values are left out of
/// the statistics and get 0. Call where [`applies`] holds, after the values were checked
/// finite or NaN.
pub(super) fn normalize_scattered<T: AdvantageFloat>(rows: &Rows, spec: &Spec, batch_std: (f64, f32), out: &mut [T]) {
    let n = rows.values.len();
    let chunk = chunk_rows(n, rows.n_groups).unwrap_or(n).max(1);
    let pieces = || rows.values.par_chunks(chunk).zip(rows.groups.par_chunks(chunk));

    let partial_sums: Vec<Vec<Sums>> = pieces()
        .map(|(values, groups)| {
            let mut table = vec![Sums::default(); rows.n_groups];
            for (&x, &g) in values.iter().zip(groups) {
                if !x.is_nan() {
                    table[g as usize].add(x);
                }
            }
            table
        })
        .collect();
    let mut cells: Vec<Cell> = (0..rows.n_groups)
        .into_par_iter()
        .map(|g| {
            let mut sums = Sums::default();
            partial_sums.iter().for_each(|table| sums.merge(&table[g]));
            Cell::from_sums(sums.n, sums.sum, sums.constant)
        })
        .collect();
    drop(partial_sums);

    let partial_m2: Vec<Vec<f64>> = pieces()
        .map(|(values, groups)| {
            let mut table = vec![0.0; rows.n_groups];
            for (&x, &g) in values.iter().zip(groups) {
                if !x.is_nan() {
                    let d = cells[g as usize].deviation(x);
                    table[g as usize] += d * d;
                }
            }
            table
        })
        .collect();
    cells.par_iter_mut().enumerate().for_each(|(g, cell)| {
        cell.close_std_with(partial_m2.iter().map(|table| table[g]).sum());
    });

    out.par_chunks_mut(chunk).zip(pieces()).for_each(|(out, (values, groups))| {
        for ((slot, &x), &g) in out.iter_mut().zip(values).zip(groups) {
            *slot = T::from_f64(cells[g as usize].advantage(x, spec, batch_std));
        }
    });
}
