//! Rows -> advantages: rows are partitioned into groups, groups into strata, and each cell
//! is normalised on its own. No sort and no hashing on the hot path. Group labels sorted
//! ascending (the layout of GRPO rollouts) are read in place as runs; a run without strata
//! is a few vectorisable slice loops (`plain_run`), a small run with strata keeps its cells
//! in per-thread fixed arrays (`normalize_small_direct` for labels in 0..64, a linear scan
//! otherwise). Everything else (unsorted labels, large groups, the trainers' fp32 modes, OPO
//! and REINFORCE++) goes through dense codes, a counting sort when groups are scattered, and
//! a per-thread stamp table for the strata. Groups run in parallel (rayon), and every output
//! depends only on its own group, so results are identical at any thread count.

use rayon::prelude::*;

use super::cell::{Cell, batch_std};
use super::spec::{Compat, Estimator, Scale, Spec, invalid};
use crate::error::Result;

/// The rows to normalise: a value, a dense group code and optionally a dense stratum code
/// and a length (token count; OPO's and REINFORCE++'s weights) per row.
#[derive(Clone, Copy, Debug)]
pub struct Rows<'a> {
    pub values: &'a [f64],
    pub groups: &'a [u32],
    pub n_groups: usize,
    pub strata: Option<(&'a [u32], usize)>,
    pub lengths: Option<&'a [f64]>,
}

/// The element type of the advantages handed to a trainer.
pub trait Output: Copy + Default + Send + Sync {
    fn from_f64(x: f64) -> Self;
    fn to_f64(self) -> f64;
}

impl Output for f64 {
    fn from_f64(x: f64) -> Self {
        x
    }
    fn to_f64(self) -> f64 {
        self
    }
}

impl Output for f32 {
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
}

/// Arbitrary integer keys -> dense codes `0..n`. A key range no wider than a few times the
/// number of rows is used directly (code = key - min: no hashing); wider ranges are numbered
/// in order of first appearance.
pub fn dense_codes(keys: &[i64]) -> (Vec<u32>, usize) {
    if keys.is_empty() {
        return (Vec::new(), 0);
    }
    let (min, max) = keys
        .par_chunks(1 << 16)
        .map(|chunk| chunk.iter().fold((i64::MAX, i64::MIN), |(lo, hi), &k| (lo.min(k), hi.max(k))))
        .reduce(|| (i64::MAX, i64::MIN), |a, b| (a.0.min(b.0), a.1.max(b.1)));
    let span = (max as i128 - min as i128) as u128;
    if span < (keys.len() as u128 * 4).max(1 << 16) {
        let codes = keys.par_iter().map(|&k| (k as i128 - min as i128) as u32).collect();
        return (codes, span as usize + 1);
    }
    let mut numbers: std::collections::HashMap<i64, u32, foldhash::fast::RandomState> = Default::default();
    let codes = keys
        .iter()
        .map(|&k| {
            let next = numbers.len() as u32;
            *numbers.entry(k).or_insert(next)
        })
        .collect();
    (codes, numbers.len())
}

/// How the rows of each group are found.
enum Layout {
    /// Each group's rows are one contiguous run: run `i` is `bounds[i]..bounds[i + 1]`.
    Runs(Vec<usize>),
    /// Rows gathered by group: group `g` holds `order[bounds[g]..bounds[g + 1]]`.
    Gathered { bounds: Vec<usize>, order: Vec<u32> },
}

fn layout(groups: &[u32], n_groups: usize) -> Layout {
    let n = groups.len();
    let chunk = (n / (rayon::current_num_threads() * 4)).max(1 << 14);
    let mut starts: Vec<usize> = (0..n.div_ceil(chunk))
        .into_par_iter()
        .flat_map_iter(|c| {
            let (lo, hi) = (c * chunk, ((c + 1) * chunk).min(n));
            (lo..hi).filter(|&i| i == 0 || groups[i] != groups[i - 1]).collect::<Vec<_>>()
        })
        .collect();
    let mut seen = vec![false; n_groups];
    let contiguous = starts.iter().all(|&s| !std::mem::replace(&mut seen[groups[s] as usize], true));
    if contiguous {
        starts.push(n);
        return Layout::Runs(starts);
    }
    let mut bounds = vec![0usize; n_groups + 1];
    for &g in groups {
        bounds[g as usize + 1] += 1;
    }
    for g in 0..n_groups {
        bounds[g + 1] += bounds[g];
    }
    let mut cursor = bounds.clone();
    let mut order = vec![0u32; n];
    for (row, &g) in groups.iter().enumerate() {
        order[cursor[g as usize]] = row as u32;
        cursor[g as usize] += 1;
    }
    Layout::Gathered { bounds, order }
}

/// Per-thread buffers: stratum code -> local cell, valid where `stamp` is `generation`.
struct Scratch {
    stamp: Vec<u32>,
    local: Vec<u32>,
    generation: u32,
    cells: Vec<Cell>,
    cell_of_row: Vec<u32>,
    /// The trainer modes: the group's rows by cell (`cell_bounds`), their fp32 values and
    /// lengths in that order, and a buffer.
    cell_bounds: Vec<usize>,
    values32: Vec<f32>,
    lengths32: Vec<f32>,
    buffer: Vec<f32>,
    small: Box<Small>,
}

impl Scratch {
    fn new(n_strata: usize) -> Self {
        Scratch {
            stamp: vec![0; n_strata],
            local: vec![0; n_strata],
            generation: 0,
            cells: Vec::new(),
            cell_of_row: Vec::new(),
            cell_bounds: Vec::new(),
            values32: Vec::new(),
            lengths32: Vec::new(),
            buffer: Vec::new(),
            small: Small::new(),
        }
    }

    fn next_group(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.stamp.fill(0);
            self.generation = 1;
        }
        self.cells.clear();
        self.cell_of_row.clear();
    }

    fn cell_of(&mut self, stratum: u32) -> u32 {
        let s = stratum as usize;
        if self.stamp[s] != self.generation {
            self.stamp[s] = self.generation;
            self.local[s] = self.cells.len() as u32;
            self.cells.push(Cell::default());
        }
        self.local[s]
    }

    /// The trainer modes' fp32 statistics of every cell, from its rows in row order.
    fn close_trainer(&mut self, rows: &Rows, row: &impl Fn(usize) -> usize, compat: Compat) {
        let n_cells = self.cells.len();
        self.cell_bounds.clear();
        self.cell_bounds.resize(n_cells + 1, 0);
        for &c in &self.cell_of_row {
            self.cell_bounds[c as usize + 1] += 1;
        }
        for c in 0..n_cells {
            self.cell_bounds[c + 1] += self.cell_bounds[c];
        }
        let total = self.cell_of_row.len();
        self.values32.clear();
        self.values32.resize(total, 0.0);
        self.lengths32.clear();
        self.lengths32.resize(total, 0.0);
        let mut cursor = self.cell_bounds.clone();
        for (k, &c) in self.cell_of_row.iter().enumerate() {
            let i = row(k);
            let slot = cursor[c as usize];
            self.values32[slot] = rows.values[i] as f32;
            self.lengths32[slot] = rows.lengths.map_or(1.0, |l| l[i] as f32);
            cursor[c as usize] += 1;
        }
        for c in 0..n_cells {
            let range = self.cell_bounds[c]..self.cell_bounds[c + 1];
            let (values, lengths) = (&self.values32[range.clone()], &self.lengths32[range]);
            self.cells[c].close_trainer(values, lengths, compat, &mut self.buffer);
        }
    }
}

/// Groups of at most this many rows take the small path (and can hold as many cells).
const SMALL_ROWS: usize = 64;
const SMALL_CELLS: usize = SMALL_ROWS;

/// The stratum of each row as the small path reads it: dense codes, or the caller's own
/// labels (the small path compares them and never needs them dense).
#[derive(Clone, Copy)]
enum Labels<'a> {
    None,
    Dense(&'a [u32]),
    Raw(&'a [i64]),
}

impl Labels<'_> {
    #[inline]
    fn at(self, i: usize) -> i64 {
        match self {
            Labels::None => 0,
            Labels::Dense(codes) => codes[i] as i64,
            Labels::Raw(labels) => labels[i],
        }
    }
}

/// Whether `spec` is computed by the small path.
fn small_path(spec: &Spec) -> bool {
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

/// The small path's per-cell statistics, kept per thread: only the cells a group uses are
/// reset, so a group of 8 rows touches a few cache lines, not kilobytes of fresh arrays.
struct Small {
    xs: [f64; SMALL_ROWS],
    cell_of: [u8; SMALL_ROWS],
    keys: [i64; SMALL_CELLS],
    n: [u32; SMALL_CELLS],
    sum: [f64; SMALL_CELLS],
    first: [f64; SMALL_CELLS],
    constant: [bool; SMALL_CELLS],
    mean: [f64; SMALL_CELLS],
    m2: [f64; SMALL_CELLS],
    /// The direct path's statistics, indexed by the label itself; all back to their empty
    /// values after every group.
    direct: Direct,
}

/// Per-label statistics of [`normalize_small_direct`].
struct Direct {
    n: [u32; SMALL_CELLS],
    first: [f64; SMALL_CELLS],
    /// Sums of `x - first` and of its squares.
    sum: [f64; SMALL_CELLS],
    squares: [f64; SMALL_CELLS],
    mean: [f64; SMALL_CELLS],
    factor: [f64; SMALL_CELLS],
    /// The labels present, in order of appearance.
    present: [u8; SMALL_ROWS],
}

impl Small {
    fn new() -> Box<Self> {
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
            direct: Direct {
                n: [0; SMALL_CELLS],
                first: [0.0; SMALL_CELLS],
                sum: [0.0; SMALL_CELLS],
                squares: [0.0; SMALL_CELLS],
                mean: [0.0; SMALL_CELLS],
                factor: [0.0; SMALL_CELLS],
                present: [0; SMALL_ROWS],
            },
        })
    }
}

/// The small path for labels in `0..64` (agent ids, roles, depths usually are): one pass of
/// statistics indexed by the label itself, then one pass of output. Each cell keeps its
/// first value `K` and the sums of `x - K` and `(x - K)^2` (the shifted-data variance: as
/// accurate as two passes when `K` is one of the cell's own values), and a cell is constant
/// exactly when the squares sum to 0. No branch depends on the data (a new label is appended
/// to `present` branch-free), so agents interleaved at random cost no mispredictions.
/// Returns false, having left `Direct` empty, when a label is out of range or a value is NaN;
/// the scanning path then takes the group.
#[inline]
fn normalize_small_direct<T: Output>(
    rows: &Rows,
    labels: Labels,
    row: &impl Fn(usize) -> usize,
    out: &mut [T],
    d: &mut Direct,
    spec: &Spec,
    batch_std: f64,
) -> bool {
    let mut cells = 0usize;
    let mut in_range = true;
    let mut total = 0.0;
    for k in 0..out.len() {
        let i = row(k);
        let label = labels.at(i);
        in_range &= (0..SMALL_CELLS as i64).contains(&label);
        let l = (label as usize) & (SMALL_CELLS - 1);
        let x = rows.values[i];
        total += x;
        let new = d.n[l] == 0;
        d.present[cells] = l as u8;
        cells += new as usize;
        d.first[l] = if new { x } else { d.first[l] };
        let shifted = x - d.first[l];
        d.n[l] += 1;
        d.sum[l] += shifted;
        d.squares[l] += shifted * shifted;
    }
    let usable = in_range && !total.is_nan();
    if usable {
        // Per cell: the mean, and the factor its deviations are multiplied by (0: no comparison).
        for &l in &d.present[..cells] {
            let l = l as usize;
            let n = d.n[l] as usize;
            let shift = d.sum[l] * RECIPROCAL[n];
            d.mean[l] = d.first[l] + shift;
            let m2 = (d.squares[l] - d.sum[l] * shift).max(0.0);
            let std = if n < 2 { 0.0 } else { (m2 * RECIPROCAL[n - 1]).sqrt() };
            let factor = match spec.scale {
                Scale::Group => 1.0 / (std + spec.eps),
                Scale::Batch => 1.0 / (batch_std + spec.eps),
                Scale::None => 1.0,
            };
            d.factor[l] = if n < 2 || d.squares[l] == 0.0 { 0.0 } else { factor };
        }
        for (k, slot) in out.iter_mut().enumerate() {
            let i = row(k);
            let l = labels.at(i) as usize;
            let x = rows.values[i];
            let value = if spec.estimator == Estimator::Rloo {
                let n = d.n[l] as usize;
                let total = d.sum[l] + n as f64 * d.first[l];
                if d.factor[l] == 0.0 { 0.0 } else { x - (total - x) * RECIPROCAL[n - 1] }
            } else {
                (x - d.mean[l]) * d.factor[l]
            };
            *slot = T::from_f64(value);
        }
    }
    for &l in &d.present[..cells] {
        let l = l as usize;
        d.n[l] = 0;
        d.sum[l] = 0.0;
        d.squares[l] = 0.0;
    }
    usable
}

/// Small groups the direct path declines (a NaN reward, labels outside 0..64), for native
/// GRPO or RLOO: values, cells and statistics live in the thread's [`Small`] arrays, cells
/// are found by a linear scan of the keys seen so far, and nothing is allocated.
#[inline]
fn normalize_small_group<T: Output>(
    rows: &Rows,
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
        let x = rows.values[i];
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
            Scale::Group => 1.0 / (std + spec.eps),
            Scale::Batch => 1.0 / (batch_std + spec.eps),
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

/// GRPO or RLOO over one contiguous group without strata, as slice loops the compiler
/// vectorises; the same sums in the same order as the small path, so the same results.
/// Returns false (writing nothing) when the group holds a NaN, which the general path leaves
/// out.
fn plain_run<T: Output>(values: &[f64], out: &mut [T], spec: &Spec, batch_std: f64) -> bool {
    let n = values.len();
    let (mut sum, mut low, mut high) = (0.0, f64::INFINITY, f64::NEG_INFINITY);
    for &x in values {
        sum += x;
        low = low.min(x);
        high = high.max(x);
    }
    if sum.is_nan() {
        return false;
    }
    if n < 2 || low == high {
        out.fill(T::from_f64(0.0));
        return true;
    }
    let mean = sum / n as f64;
    if spec.estimator == Estimator::Rloo {
        for (slot, &x) in out.iter_mut().zip(values) {
            *slot = T::from_f64(x - (sum - x) / (n - 1) as f64);
        }
        return true;
    }
    let m2: f64 = values.iter().fold(0.0, |m2, &x| m2 + (x - mean) * (x - mean));
    let std = (m2 / (n - 1) as f64).sqrt();
    let factor = match spec.scale {
        Scale::Group => 1.0 / (std + spec.eps),
        Scale::Batch => 1.0 / (batch_std + spec.eps),
        Scale::None => 1.0,
    };
    for (slot, &x) in out.iter_mut().zip(values) {
        *slot = T::from_f64((x - mean) * factor);
    }
    true
}

/// Normalises the rows of one group; `row(k)` is the k-th row of the group and `out[k]` its
/// advantage.
fn normalize_group<T: Output>(
    rows: &Rows,
    labels: Labels,
    row: impl Fn(usize) -> usize,
    out: &mut [T],
    scratch: &mut Scratch,
    spec: &Spec,
    batch_std: (f64, f32),
) {
    if small_path(spec) && out.len() <= SMALL_ROWS {
        let small = &mut scratch.small;
        let direct = !matches!(labels, Labels::None)
            && normalize_small_direct(rows, labels, &row, out, &mut small.direct, spec, batch_std.0);
        if !direct {
            normalize_small_group(rows, labels, &row, out, small, spec, batch_std.0);
        }
        return;
    }
    let length = |i: usize| rows.lengths.map_or(1.0, |l| l[i]);
    scratch.next_group();
    for k in 0..out.len() {
        let i = row(k);
        let c = match rows.strata {
            Some((strata, _)) => scratch.cell_of(strata[i]),
            None if k == 0 => scratch.cell_of(0),
            None => 0,
        };
        scratch.cell_of_row.push(c);
        let x = rows.values[i];
        if !x.is_nan() {
            scratch.cells[c as usize].add(x, length(i));
        }
    }
    scratch.cells.iter_mut().for_each(Cell::close_mean);
    for k in 0..out.len() {
        let x = rows.values[row(k)];
        if !x.is_nan() {
            scratch.cells[scratch.cell_of_row[k] as usize].add_deviation(x);
        }
    }
    scratch.cells.iter_mut().for_each(Cell::close_std);
    if spec.compat != Compat::Native {
        scratch.close_trainer(rows, &row, spec.compat);
    }
    for (k, slot) in out.iter_mut().enumerate() {
        let cell = &scratch.cells[scratch.cell_of_row[k] as usize];
        *slot = T::from_f64(cell.advantage(rows.values[row(k)], spec, batch_std));
    }
}

/// Consecutive groups in blocks of about `target` rows: (first group, end group).
fn blocks(bounds: &[usize], target: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut first = 0;
    for g in 0..bounds.len() - 1 {
        if bounds[g + 1] - bounds[first] >= target {
            out.push((first, g + 1));
            first = g + 1;
        }
    }
    if first < bounds.len() - 1 {
        out.push((first, bounds.len() - 1));
    }
    out
}

/// Runs `normalize_group` over every group in parallel; `out` is in the order of `bounds`.
#[allow(clippy::too_many_arguments)]
fn run_groups<T: Output>(
    rows: &Rows,
    labels: Labels,
    contiguous: bool,
    bounds: &[usize],
    row_at: impl Fn(usize) -> usize + Sync,
    out: &mut [T],
    spec: &Spec,
    batch_std: (f64, f32),
) {
    let target = (out.len() / (rayon::current_num_threads() * 8)).max(4096);
    let mut pieces = Vec::new();
    let mut rest = out;
    for (first, end) in blocks(bounds, target) {
        let (piece, tail) = rest.split_at_mut(bounds[end] - bounds[first]);
        pieces.push((first, end, piece));
        rest = tail;
    }
    let n_strata = rows.strata.map_or(1, |(_, n)| n.max(1));
    pieces.into_par_iter().for_each_init(
        || Scratch::new(n_strata),
        |scratch, (first, end, piece)| {
            let base = bounds[first];
            for g in first..end {
                let (lo, hi) = (bounds[g], bounds[g + 1]);
                let out = &mut piece[lo - base..hi - base];
                let plain = contiguous && matches!(labels, Labels::None) && small_path(spec);
                if !(plain && plain_run(&rows.values[lo..hi], out, spec, batch_std.0)) {
                    normalize_group(rows, labels, |k| row_at(lo + k), out, scratch, spec, batch_std);
                }
            }
        },
    );
}

fn check_values(values: &[f64], lengths: Option<&[f64]>) -> Result<()> {
    if let Some(lengths) = lengths {
        if lengths.len() != values.len() {
            return Err(invalid(format!("lengths has {} entries for {} values", lengths.len(), values.len())));
        }
        if lengths.iter().any(|l| !(l.is_finite() && *l >= 0.0)) {
            return Err(invalid("lengths must be finite and >= 0".to_owned()));
        }
    }
    if values.par_iter().any(|x| x.is_infinite()) {
        return Err(invalid("values must be finite (NaN marks a missing reward)".to_owned()));
    }
    Ok(())
}

/// Normalises every group given its layout; REINFORCE++'s batch whitening last.
fn normalize_layout<T: Output>(rows: &Rows, labels: Labels, layout: Layout, spec: &Spec) -> Vec<T> {
    let n = rows.values.len();
    let batch_std = if spec.scale == Scale::Batch { batch_std(rows.values, spec.compat) } else { (0.0, 0.0) };
    let mut out = vec![T::default(); n];
    match layout {
        Layout::Runs(bounds) => run_groups(rows, labels, true, &bounds, |i| i, &mut out, spec, batch_std),
        Layout::Gathered { bounds, order } => {
            let mut gathered = vec![T::default(); n];
            run_groups(rows, labels, false, &bounds, |k| order[k] as usize, &mut gathered, spec, batch_std);
            for (k, &row) in order.iter().enumerate() {
                out[row as usize] = gathered[k];
            }
        }
    }
    if spec.estimator == Estimator::ReinforcePpBaseline && spec.compat != Compat::OpenRlhf {
        whiten(&mut out, rows.values, rows.lengths);
    }
    out
}

/// Advantages of `rows` under `spec`, one per row, in row order.
pub fn normalize<T: Output>(rows: &Rows, spec: &Spec) -> Result<Vec<T>> {
    let n = rows.values.len();
    if rows.groups.len() != n {
        return Err(invalid(format!("groups has {} entries for {n} values", rows.groups.len())));
    }
    if let Some(bad) = rows.groups.par_iter().find_any(|&&g| g as usize >= rows.n_groups) {
        return Err(invalid(format!("group code {bad} out of range for {} groups", rows.n_groups)));
    }
    if let Some((strata, n_strata)) = rows.strata {
        if strata.len() != n {
            return Err(invalid(format!("strata has {} entries for {n} values", strata.len())));
        }
        if let Some(bad) = strata.par_iter().find_any(|&&s| s as usize >= n_strata) {
            return Err(invalid(format!("stratum code {bad} out of range for {n_strata} strata")));
        }
    }
    check_values(rows.values, rows.lengths)?;
    let labels = rows.strata.map_or(Labels::None, |(codes, _)| Labels::Dense(codes));
    Ok(normalize_layout(rows, labels, layout(rows.groups, rows.n_groups), spec))
}

/// Run boundaries of labels sorted ascending (each group one contiguous run, in order: the
/// layout of GRPO rollouts), or None when the labels are not sorted.
fn sorted_runs(labels: &[i64]) -> Option<Vec<usize>> {
    let n = labels.len();
    let chunk = (n / (rayon::current_num_threads() * 4)).max(1 << 14);
    let parts: Vec<Option<Vec<usize>>> = (0..n.div_ceil(chunk))
        .into_par_iter()
        .map(|c| {
            let mut starts = Vec::new();
            for i in c * chunk..((c + 1) * chunk).min(n) {
                if i == 0 || labels[i] != labels[i - 1] {
                    if i > 0 && labels[i] < labels[i - 1] {
                        return None;
                    }
                    starts.push(i);
                }
            }
            Some(starts)
        })
        .collect();
    let mut bounds: Vec<usize> = parts.into_iter().collect::<Option<Vec<_>>>()?.concat();
    bounds.push(n);
    Some(bounds)
}

/// Advantages of rows labelled by the caller: any int64 group labels (grouping by value)
/// and optional int64 stratum labels. Labels sorted ascending, as GRPO rollouts of one prompt
/// come, are read in place (no renumbering, no gathering); others are renumbered first.
pub fn normalize_labels<T: Output>(
    values: &[f64],
    groups: &[i64],
    strata: Option<&[i64]>,
    lengths: Option<&[f64]>,
    spec: &Spec,
) -> Result<Vec<T>> {
    let n = values.len();
    if groups.len() != n {
        return Err(invalid(format!("groups has {} entries for {n} values", groups.len())));
    }
    if strata.is_some_and(|s| s.len() != n) {
        return Err(invalid(format!("strata has {} entries for {n} values", strata.map_or(0, <[i64]>::len))));
    }
    check_values(values, lengths)?;
    let sorted = sorted_runs(groups);
    let longest = sorted.as_ref().map_or(usize::MAX, |b| b.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0));
    if let (Some(bounds), true) = (sorted, small_path(spec) && longest <= SMALL_ROWS) {
        // Every group takes the small path, which reads the labels as they are.
        let rows = Rows { values, groups: &[], n_groups: 0, strata: None, lengths };
        let labels = strata.map_or(Labels::None, Labels::Raw);
        return Ok(normalize_layout(&rows, labels, Layout::Runs(bounds), spec));
    }
    let (group_codes, n_groups) = dense_codes(groups);
    let strata_codes = strata.map(dense_codes);
    let rows = Rows {
        values,
        groups: &group_codes,
        n_groups,
        strata: strata_codes.as_ref().map(|(codes, count)| (codes.as_slice(), *count)),
        lengths,
    };
    normalize(&rows, spec)
}

/// REINFORCE++'s batch whitening, weighted by length as verl's `masked_whiten` weighs every
/// valid token: mean and unbiased variance over all tokens, `(a - mean) / sqrt(var + 1e-8)`.
/// Rows with a NaN reward stay 0 and weigh nothing.
fn whiten<T: Output>(out: &mut [T], values: &[f64], lengths: Option<&[f64]>) {
    let weight = |i: usize| if values[i].is_nan() { 0.0 } else { lengths.map_or(1.0, |l| l[i]) };
    let (total, weighted) =
        (0..out.len()).fold((0.0, 0.0), |(t, s), i| (t + weight(i), s + weight(i) * out[i].to_f64()));
    if total <= 1.0 {
        return;
    }
    let mean = weighted / (total + 1e-8);
    let squares: f64 = (0..out.len()).map(|i| weight(i) * (out[i].to_f64() - mean).powi(2)).sum();
    let variance = squares / (total + 1e-8) * (total / (total - 1.0));
    let scale = 1.0 / (variance + 1e-8).sqrt();
    for (i, slot) in out.iter_mut().enumerate() {
        if !values[i].is_nan() {
            *slot = T::from_f64((slot.to_f64() - mean) * scale);
        }
    }
}
