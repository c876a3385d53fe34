//! Small groups (at most [`SMALL_ROWS`] rows) for native GRPO and RLOO: the shapes GRPO
//! rollouts come in, and the kernel's hot path. Three ways through, fastest first:
//! - [`plain_run`]: a contiguous group without strata, as slice loops the compiler vectorises;
//! - [`Block`]: groups with strata labels in `0..64` (agent ids, roles, depths usually are),
//!   several groups at a time, without a data-dependent branch;
//! - [`normalize_small_group`]: whatever those decline (a NaN reward, labels outside `0..64`),
//!   cells found by a linear scan.
//!
//! Which way a group takes depends only on that group, and each is deterministic, so results
//! are the same at any thread count and however the groups are split between threads.

use std::hint::select_unpredictable;

use super::float::AdvantageFloat;
use super::spec::{Compat, Estimator, Scale, Spec};
use crate::limit::{BOUND, OVERFLOW_SCALE, out_of_range};

/// Groups of at most this many rows take the small paths (and can hold as many cells).
pub(super) const SMALL_ROWS: usize = 64;
const SMALL_CELLS: usize = SMALL_ROWS;

/// Whether `spec` is computed by the small paths.
pub(super) fn small_path(spec: &Spec) -> bool {
    spec.compat == Compat::Native && matches!(spec.estimator, Estimator::Grpo | Estimator::Rloo)
}

/// `1 / n` for the counts of a small group (1 / 0 read as 1, for empty cells): a multiply
/// where each cell would otherwise pay two divisions.
const RECIPROCAL: [f64; SMALL_ROWS + 1] = {
    let mut table = [1.0; SMALL_ROWS + 1];
    let mut n = 2;
    while n <= SMALL_ROWS {
        table[n] = 1.0 / n as f64;
        n += 1;
    }
    table
};

/// The stratum of each row as the small paths read it: dense codes, or the caller's own
/// labels (the small paths compare them and never need them dense).
#[derive(Clone, Copy)]
pub(super) enum Labels<'a> {
    None,
    Dense(&'a [u32]),
    Raw(&'a [i64]),
}

impl Labels<'_> {
    #[inline]
    pub fn at(self, i: usize) -> i64 {
        match self {
            Labels::None => 0,
            Labels::Dense(codes) => codes[i] as i64,
            Labels::Raw(labels) => labels[i],
        }
    }

    /// The labels of the rows in `range`.
    pub fn range(self, range: std::ops::Range<usize>) -> Self {
        match self {
            Labels::None => Labels::None,
            Labels::Dense(codes) => Labels::Dense(&codes[range]),
            Labels::Raw(labels) => Labels::Raw(&labels[range]),
        }
    }
}

/// Why a fast path did not compute a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Declined {
    /// A NaN reward or a label outside `0..64`: the scanning path takes the group.
    Scan,
    /// A reward out of [`limit`](crate::limit)'s range: an error.
    OutOfRange,
}

/// Why a group holding a value out of range or NaN (or a label outside `0..64`) is declined.
fn declined(values: impl Iterator<Item = f64>) -> Declined {
    let mut values = values;
    if values.any(out_of_range) { Declined::OutOfRange } else { Declined::Scan }
}

/// GRPO or RLOO over one contiguous group without strata, as slice loops the compiler
/// vectorises. Writes nothing when it declines.
pub(super) fn plain_run<T: AdvantageFloat>(
    values: &[f64],
    out: &mut [T],
    spec: &Spec,
    batch_std: f64,
) -> Result<(), Declined> {
    let n = values.len();
    let (mut sum, mut low, mut high) = (0.0, f64::INFINITY, f64::NEG_INFINITY);
    for &x in values {
        sum += x;
        low = low.min(x);
        high = high.max(x);
    }
    // One branch for both rare cases (min and max pass NaN by; the sum does not).
    if !((low > -BOUND) & (high < BOUND) & !sum.is_nan()) {
        return Err(declined(values.iter().copied()));
    }
    if n < 2 || low == high {
        out.fill(T::from_f64(0.0));
        return Ok(());
    }
    let mean = sum / n as f64;
    if spec.estimator == Estimator::Rloo {
        for (slot, &x) in out.iter_mut().zip(values) {
            *slot = T::from_f64(x - (sum - x) / (n - 1) as f64);
        }
        return Ok(());
    }
    let m2: f64 = values.iter().fold(0.0, |m2, &x| m2 + (x - mean) * (x - mean));
    let std = (m2 / (n - 1) as f64).sqrt();
    let factor = match spec.scale {
        Scale::Group => spec.native_factor(std),
        Scale::Batch => spec.native_factor(batch_std),
        Scale::None => 1.0,
    };
    for (slot, &x) in out.iter_mut().zip(values) {
        *slot = T::from_f64((x - mean) * factor);
    }
    Ok(())
}

/// Rows a [`Block`] holds before it must be flushed.
const BLOCK_ROWS: usize = 256;
/// Slots of the block's per-cell arrays (a cell per row at most), as a power of two so that a
/// masked index needs no bounds check.
const BLOCK_SLOTS: usize = BLOCK_ROWS;

/// Consecutive small groups with strata, computed together: [`Block::add`] takes each group's
/// statistics in one pass, [`Block::flush`] then finishes every cell of the block and writes
/// every row. Finishing a cell (a square root and a division) and writing its rows wait on
/// its statistics; batching many groups keeps those waits from lining up one group after
/// another, and lets the finishing run as one loop the compiler vectorises. Each cell keeps
/// its first value `K` and the sums of `x - K` and `(x - K)^2` (the shifted-data variance: as
/// accurate as two passes when `K` is one of the cell's own values); a cell is constant
/// exactly when the squares sum to 0. A row's cell is found by its label through a table
/// stamped per group, with selects rather than branches, so agents interleaved at random cost
/// no mispredictions.
pub(super) struct Block {
    rows: usize,
    cells: usize,
    /// `cell_of_label[l]` is valid for the current group where `stamp[l] == group`.
    group: u64,
    stamp: [u64; SMALL_CELLS],
    cell_of_label: [u16; SMALL_CELLS],
    xs: [f64; BLOCK_ROWS],
    cell_of_row: [u16; BLOCK_ROWS],
    // Per cell; the slots past `cells` are empty (n, sum and squares at 0).
    n: [u32; BLOCK_SLOTS],
    first: [f64; BLOCK_SLOTS],
    sum: [f64; BLOCK_SLOTS],
    squares: [f64; BLOCK_SLOTS],
    mean: [f64; BLOCK_SLOTS],
    factor: [f64; BLOCK_SLOTS],
}

impl Block {
    pub fn new() -> Box<Self> {
        Box::new(Block {
            rows: 0,
            cells: 0,
            group: 0,
            stamp: [0; SMALL_CELLS],
            cell_of_label: [0; SMALL_CELLS],
            xs: [0.0; BLOCK_ROWS],
            cell_of_row: [0; BLOCK_ROWS],
            n: [0; BLOCK_SLOTS],
            first: [0.0; BLOCK_SLOTS],
            sum: [0.0; BLOCK_SLOTS],
            squares: [0.0; BLOCK_SLOTS],
            mean: [0.0; BLOCK_SLOTS],
            factor: [0.0; BLOCK_SLOTS],
        })
    }

    /// Rows held, to be written by the next [`Block::flush`].
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Whether a group of `len` rows fits.
    pub fn fits(&self, len: usize) -> bool {
        self.rows + len <= BLOCK_ROWS
    }

    /// Empties cells `from..to`, for the groups to come.
    fn clear(&mut self, from: usize, to: usize) {
        self.n[from..to].fill(0);
        self.sum[from..to].fill(0.0);
        self.squares[from..to].fill(0.0);
    }

    /// Takes the statistics of a group of `len` rows (`row(k)` is its k-th row; `len` at most
    /// [`SMALL_ROWS`] and [`Block::fits`]). Keeps nothing when it declines.
    #[inline]
    pub fn add(
        &mut self,
        values: &[f64],
        labels: Labels,
        row: &impl Fn(usize) -> usize,
        len: usize,
    ) -> Result<(), Declined> {
        // One loop per kind of label, rather than asking which kind for every row.
        match labels {
            Labels::Raw(raw) => self.take(len, |k| (values[row(k)], raw[row(k)])),
            Labels::Dense(codes) => self.take(len, |k| (values[row(k)], codes[row(k)] as i64)),
            Labels::None => self.take(len, |k| (values[row(k)], 0)),
        }
    }

    /// [`Block::add`] given each row's value and label.
    #[inline(always)]
    fn take(&mut self, len: usize, row: impl Fn(usize) -> (f64, i64)) -> Result<(), Declined> {
        debug_assert!(len <= SMALL_ROWS && self.fits(len));
        self.group += 1;
        let group = self.group;
        let (rows, cells) = (self.rows, self.cells);
        let mut next = cells;
        let mut any_label = 0u64;
        // Stays 0 unless a value is NaN or out of range (see `OVERFLOW_SCALE`).
        let mut poison = 0.0;
        for k in 0..len {
            let (x, label) = row(k);
            any_label |= label as u64;
            poison += (x * OVERFLOW_SCALE) * 0.0;
            let l = (label as usize) & (SMALL_CELLS - 1);
            let new = self.stamp[l] != group;
            self.stamp[l] = group;
            let c = select_unpredictable(new, next, self.cell_of_label[l] as usize) & (BLOCK_SLOTS - 1);
            self.cell_of_label[l] = c as u16;
            next += new as usize;
            // On the bits: a select of floats still becomes a branch.
            let first = f64::from_bits(select_unpredictable(new, x.to_bits(), self.first[c].to_bits()));
            self.first[c] = first;
            let shifted = x - first;
            self.n[c] += 1;
            self.sum[c] += shifted;
            self.squares[c] += shifted * shifted;
            let r = (rows + k) & (BLOCK_ROWS - 1);
            self.xs[r] = x;
            self.cell_of_row[r] = c as u16;
        }
        if any_label >= SMALL_CELLS as u64 || poison != 0.0 {
            self.clear(cells, next);
            return Err(declined((0..len).map(|k| row(k).0)));
        }
        self.rows += len;
        self.cells = next;
        Ok(())
    }

    /// Every cell's mean and factor: a square root and a division each, the most expensive
    /// steps of a small group, so in the widest vectors the CPU has.
    fn finish(&mut self, spec: &Spec, batch_std: f64) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: `finish_avx2` needs AVX2 and nothing else, and the CPU has it.
            unsafe { self.finish_avx2(spec, batch_std) };
            return;
        }
        self.finish_cells(spec, batch_std);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn finish_avx2(&mut self, spec: &Spec, batch_std: f64) {
        self.finish_cells(spec, batch_std);
    }

    /// The body of [`Block::finish`]. The reciprocals of the counts are divisions rather than
    /// `RECIPROCAL` lookups (the same correctly rounded values), so that the loop vectorises.
    #[inline(always)]
    fn finish_cells(&mut self, spec: &Spec, batch_std: f64) {
        let cells = self.cells;
        let (n, first, sum, squares) =
            (&self.n[..cells], &self.first[..cells], &self.sum[..cells], &self.squares[..cells]);
        let (mean, factor) = (&mut self.mean[..cells], &mut self.factor[..cells]);
        // Under `Scale::Group` each cell's own factor, otherwise one for all.
        let shared = match spec.scale {
            Scale::Group => None,
            Scale::Batch => Some(spec.native_factor(batch_std)),
            Scale::None => Some(1.0),
        };
        for c in 0..cells {
            let count = n[c] as f64;
            let shift = sum[c] * (1.0 / count);
            mean[c] = first[c] + shift;
            let m2 = squares[c] - sum[c] * shift;
            let m2 = if m2 > 0.0 { m2 } else { 0.0 };
            let std = (m2 * (1.0 / if count > 2.0 { count - 1.0 } else { 1.0 })).sqrt();
            let scaled = shared.unwrap_or(spec.native_factor(std));
            factor[c] = if count < 2.0 || squares[c] == 0.0 { 0.0 } else { scaled };
        }
    }

    /// Writes the advantages of the rows held, in the order they came, to `out` (one slot
    /// per row held), and empties the block.
    pub fn flush<T: AdvantageFloat>(&mut self, out: &mut [T], spec: &Spec, batch_std: f64) {
        debug_assert_eq!(out.len(), self.rows);
        self.finish(spec, batch_std);
        let rows = self.xs[..self.rows].iter().zip(&self.cell_of_row[..self.rows]);
        if spec.estimator == Estimator::Rloo {
            for (slot, (&x, &c)) in out.iter_mut().zip(rows) {
                let c = c as usize & (BLOCK_SLOTS - 1);
                let n = self.n[c] as usize;
                let total = self.sum[c] + n as f64 * self.first[c];
                let value = if self.factor[c] == 0.0 { 0.0 } else { x - (total - x) * RECIPROCAL[n - 1] };
                *slot = T::from_f64(value);
            }
        } else {
            for (slot, (&x, &c)) in out.iter_mut().zip(rows) {
                let c = c as usize & (BLOCK_SLOTS - 1);
                *slot = T::from_f64((x - self.mean[c]) * self.factor[c]);
            }
        }
        self.clear(0, self.cells);
        self.rows = 0;
        self.cells = 0;
    }
}

/// The scanning path's per-cell statistics, kept per thread: only the cells a group uses are
/// reset, so a group of 8 rows touches a few cache lines, not kilobytes of fresh arrays.
pub(super) struct Small {
    xs: [f64; SMALL_ROWS],
    cell_of: [u8; SMALL_ROWS],
    keys: [i64; SMALL_CELLS],
    n: [u32; SMALL_CELLS],
    sum: [f64; SMALL_CELLS],
    first: [f64; SMALL_CELLS],
    constant: [bool; SMALL_CELLS],
    mean: [f64; SMALL_CELLS],
    m2: [f64; SMALL_CELLS],
}

impl Small {
    pub fn new() -> Box<Self> {
        Box::new(Small {
            xs: [0.0; SMALL_ROWS],
            cell_of: [0; SMALL_ROWS],
            keys: [0; SMALL_CELLS],
            n: [0; SMALL_CELLS],
            sum: [0.0; SMALL_CELLS],
            first: [0.0; SMALL_CELLS],
            constant: [true; SMALL_CELLS],
            mean: [0.0; SMALL_CELLS],
            m2: [0.0; SMALL_CELLS],
        })
    }
}

/// Small groups the faster paths decline (a NaN reward, labels outside 0..64, a gathered
/// group without strata): values, cells and statistics live in the thread's [`Small`]
/// arrays, cells are found by a linear scan of the keys seen so far, and nothing is allocated.
#[inline]
pub(super) fn normalize_small_group<T: AdvantageFloat>(
    values: &[f64],
    labels: Labels,
    row: &impl Fn(usize) -> usize,
    out: &mut [T],
    small: &mut Small,
    spec: &Spec,
    batch_std: f64,
) {
    let len = out.len();
    debug_assert!(len <= SMALL_ROWS);
    let mut cells = 0usize;
    for k in 0..len {
        let i = row(k);
        let key = labels.at(i);
        let c = match small.keys[..cells].iter().position(|&existing| existing == key) {
            Some(c) => c,
            None => {
                small.keys[cells] = key;
                small.n[cells] = 0;
                small.sum[cells] = 0.0;
                small.m2[cells] = 0.0;
                small.constant[cells] = true;
                cells += 1;
                cells - 1
            }
        };
        let x = values[i];
        small.xs[k] = x;
        small.cell_of[k] = c as u8;
        if !x.is_nan() {
            if small.n[c] == 0 {
                small.first[c] = x;
            } else if x != small.first[c] {
                small.constant[c] = false;
            }
            small.n[c] += 1;
            small.sum[c] += x;
        }
    }
    for c in 0..cells {
        small.mean[c] = small.sum[c] * RECIPROCAL[small.n[c] as usize];
    }
    for k in 0..len {
        let x = small.xs[k];
        if !x.is_nan() {
            let c = small.cell_of[k] as usize;
            small.m2[c] += (x - small.mean[c]) * (x - small.mean[c]);
        }
    }
    // m2 becomes the factor each cell's deviations are multiplied by.
    for c in 0..cells {
        let n = small.n[c];
        let std = if n < 2 { 0.0 } else { (small.m2[c] * RECIPROCAL[n as usize - 1]).sqrt() };
        small.m2[c] = match spec.scale {
            Scale::Group => spec.native_factor(std),
            Scale::Batch => spec.native_factor(batch_std),
            Scale::None => 1.0,
        };
    }
    for (k, slot) in out.iter_mut().enumerate() {
        let (x, c) = (small.xs[k], small.cell_of[k] as usize);
        let n = small.n[c];
        let value = if x.is_nan() || n < 2 || small.constant[c] {
            0.0
        } else if spec.estimator == Estimator::Rloo {
            x - (small.sum[c] - x) * RECIPROCAL[n as usize - 1]
        } else {
            (x - small.mean[c]) * small.m2[c]
        };
        *slot = T::from_f64(value);
    }
}
