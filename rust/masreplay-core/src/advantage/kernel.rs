//! Rows -> advantages: rows are partitioned into groups, groups into strata, and each cell
//! is normalised on its own. No sort and no hashing on the hot path. Group labels sorted
//! ascending in small runs (the layout of GRPO rollouts) are read in place in one pass that
//! finds the groups, checks the values and normalises them (`normalize_sorted_runs`); small
//! groups take the paths of `small`. GRPO and RLOO without strata over scattered groups go to
//! `scatter` (natively accumulated in place, in a trainer's fp32 arithmetic gathered by group
//! there). Everything else (contiguous groups in the trainers' modes, strata, OPO and
//! REINFORCE++) goes through dense codes, a counting sort when groups are scattered, and a
//! per-thread stamp table for the strata. Groups run in parallel
//! (rayon), and every output depends only on its own group, so results are identical at any
//! thread count.

use rayon::prelude::*;

use super::cell::{Cell, batch_std};
use super::float::AdvantageFloat;
use super::rows::Rows;
use super::scatter::{self, normalize_scattered};
use super::small::{Block, Declined, Labels, SMALL_ROWS, Small, normalize_small_group, plain_run, small_path};
use super::spec::{Compat, Estimator, Scale, Spec};
use super::torch_sum::torch_sum_threads_of;
use crate::bail;
use crate::error::{MasreplayError, Result};
use crate::limit::{in_range, out_of_range, values_out_of_range};
use crate::parallel::min_piece;
use crate::stamped::StampedIndex;

/// The smallest key and the width of the keys' range (`max - min`), or None for no keys.
#[derive(Clone, Copy)]
pub(super) struct KeyRange {
    pub min: i64,
    pub span: u64,
}

pub(super) fn key_range(keys: &[i64]) -> Option<KeyRange> {
    if keys.is_empty() {
        return None;
    }
    let (min, max) = keys
        .par_chunks(1 << 16)
        .map(|chunk| chunk.iter().fold((i64::MAX, i64::MIN), |(lo, hi), &k| (lo.min(k), hi.max(k))))
        .reduce(|| (i64::MAX, i64::MIN), |a, b| (a.0.min(b.0), a.1.max(b.1)));
    Some(KeyRange { min, span: max.wrapping_sub(min) as u64 })
}

/// Whether keys spanning `span` over `n` rows are used as codes directly (`key - min`): a
/// range no wider than a few times the number of rows.
pub(super) fn narrow_span(span: u64, n: usize) -> bool {
    span < (n as u64 * 4).max(1 << 16)
}

/// Arbitrary integer keys -> dense codes `0..n`. A key range no wider than a few times the
/// number of rows is used directly (code = key - min: no hashing); wider ranges are numbered
/// in order of first appearance.
pub fn dense_codes(keys: &[i64]) -> (Vec<u32>, usize) {
    let Some(KeyRange { min, span }) = key_range(keys) else {
        return (Vec::new(), 0);
    };
    if narrow_span(span, keys.len()) {
        let codes = keys.par_iter().with_min_len(min_piece(keys.len())).map(|&k| k.wrapping_sub(min) as u32).collect();
        return (codes, span as usize + 1);
    }
    let hasher = foldhash::fast::FixedState::default();
    let mut numbers: hashbrown::HashMap<i64, u32, _> = hashbrown::HashMap::with_hasher(hasher);
    let mut last = None;
    let codes = keys
        .iter()
        .map(|&k| match last {
            // Rows of a group often come together: no hashing for a repeat of the last key.
            Some((key, code)) if key == k => code,
            _ => {
                let next = numbers.len() as u32;
                let code = *numbers.entry(k).or_insert(next);
                last = Some((k, code));
                code
            }
        })
        .collect();
    (codes, numbers.len())
}

/// How the rows of each group are found.
enum Layout {
    /// Each group's rows are one contiguous run: run `i` is `bounds[i]..bounds[i + 1]`.
    Runs(Vec<usize>),
    /// Rows gathered by group (see [`Gathered`]).
    Gathered(Gathered),
    /// Groups scattered over the rows, left where they are (see [`scatter`]).
    Scattered,
}

/// `gather`: whether scattered groups are gathered (a counting sort) or left in place.
fn layout(rows: &Rows, gather: bool) -> Layout {
    let (groups, n_groups, n) = (rows.groups, rows.n_groups, rows.groups.len());
    // Scattered groups show within the first rows: no need to look for runs then.
    let scattered = scatter::reappears(&groups[..n.min(scatter::PROBE_ROWS)], |g| g as usize, n_groups);
    if !scattered {
        let chunk = (n / (rayon::current_num_threads() * 4)).max(1 << 14);
        let mut starts: Vec<usize> = (0..n.div_ceil(chunk))
            .into_par_iter()
            .flat_map_iter(|c| {
                let (lo, hi) = (c * chunk, ((c + 1) * chunk).min(n));
                (lo..hi).filter(|&i| i == 0 || groups[i] != groups[i - 1]).collect::<Vec<_>>()
            })
            .collect();
        let mut seen = vec![false; n_groups];
        if starts.iter().all(|&s| !std::mem::replace(&mut seen[groups[s] as usize], true)) {
            starts.push(n);
            return Layout::Runs(starts);
        }
    }
    if !gather {
        return Layout::Scattered;
    }
    Layout::Gathered(Gathered::new(rows))
}

/// The rows copied in order of group (a stable counting sort), so that each group's rows are
/// read as one slice: group `g` is `bounds[g]..bounds[g + 1]` of `values` (and `strata`,
/// `lengths`), row `order[k]` of the input. The rows are read in their own order and written
/// at random (writes do not stall; reads of scattered rows would).
struct Gathered {
    bounds: Vec<usize>,
    order: Vec<u32>,
    values: Vec<f64>,
    strata: Option<Vec<u32>>,
    lengths: Option<Vec<f64>>,
}

impl Gathered {
    fn new(rows: &Rows) -> Self {
        let (groups, n_groups, n) = (rows.groups, rows.n_groups, rows.groups.len());
        let mut bounds = vec![0usize; n_groups + 1];
        for &g in groups {
            bounds[g as usize + 1] += 1;
        }
        for g in 0..n_groups {
            bounds[g + 1] += bounds[g];
        }
        let mut cursor = bounds.clone();
        let mut order = vec![0u32; n];
        let mut values = vec![0.0; n];
        let mut strata = rows.strata.map(|_| vec![0u32; n]);
        let mut lengths = rows.lengths.map(|_| vec![0.0; n]);
        for (row, &g) in groups.iter().enumerate() {
            let slot = cursor[g as usize];
            cursor[g as usize] += 1;
            order[slot] = row as u32;
            values[slot] = rows.values[row];
            if let (Some(to), Some((from, _))) = (strata.as_mut(), rows.strata) {
                to[slot] = from[row];
            }
            if let (Some(to), Some(from)) = (lengths.as_mut(), rows.lengths) {
                to[slot] = from[row];
            }
        }
        Gathered { bounds, order, values, strata, lengths }
    }

    /// The gathered rows (group codes are not needed: groups are the slices of `bounds`).
    fn rows<'a>(&'a self, rows: &Rows) -> Rows<'a> {
        let strata = self.strata.as_deref().zip(rows.strata.map(|(_, count)| count));
        Rows {
            values: &self.values,
            groups: &[],
            n_groups: rows.n_groups,
            strata,
            lengths: self.lengths.as_deref(),
            tokens: None,
        }
    }
}

/// Per-thread buffers.
struct Scratch {
    /// Stratum code -> the group's cell of that stratum.
    cell_of_stratum: StampedIndex,
    cells: Vec<Cell>,
    cell_of_row: Vec<u32>,
    /// The trainer modes: the group's rows by cell (`cell_bounds`), their fp32 values and
    /// lengths in that order, and a buffer.
    cell_bounds: Vec<usize>,
    values32: Vec<f32>,
    lengths32: Vec<f32>,
    buffer: Vec<f32>,
    small: Box<Small>,
    block: Box<Block>,
}

impl Scratch {
    fn new(n_strata: usize) -> Self {
        Scratch {
            cell_of_stratum: StampedIndex::new(n_strata),
            cells: Vec::new(),
            cell_of_row: Vec::new(),
            cell_bounds: Vec::new(),
            values32: Vec::new(),
            lengths32: Vec::new(),
            buffer: Vec::new(),
            small: Small::new(),
            block: Block::new(),
        }
    }

    fn next_group(&mut self) {
        self.cell_of_stratum.clear();
        self.cells.clear();
        self.cell_of_row.clear();
    }

    fn cell_of(&mut self, stratum: u32) -> u32 {
        if let Some(cell) = self.cell_of_stratum.get(stratum) {
            return cell;
        }
        let cell = self.cells.len() as u32;
        self.cell_of_stratum.insert(stratum, cell);
        self.cells.push(Cell::default());
        cell
    }

    /// The trainer modes' fp32 statistics of every cell, from its rows in row order.
    fn close_trainer(&mut self, rows: &Rows, row: &impl Fn(usize) -> usize, spec: &Spec) {
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
            // A group's sums: a dimension of TRL's (groups, G) view or verl's per-group tensor,
            // which ATen splits between threads only past 32768 rows.
            self.cells[c].close_trainer(values, lengths, spec, 1, &mut self.buffer);
        }
    }
}

/// Normalises the rows of one group; `row(k)` is the k-th row of the group and `out[k]` its
/// advantage.
fn normalize_group<T: AdvantageFloat>(
    rows: &Rows,
    labels: Labels,
    row: impl Fn(usize) -> usize,
    out: &mut [T],
    scratch: &mut Scratch,
    spec: &Spec,
    batch_std: (f64, f32),
) {
    if small_path(spec) && out.len() <= SMALL_ROWS {
        normalize_small_group(rows.values, labels, &row, out, &mut scratch.small, spec, batch_std.0);
        return;
    }
    let length = |i: usize| rows.lengths.map_or(1.0, |l| l[i]);
    let present = |k: usize| Some(row(k)).filter(|&i| !rows.values[i].is_nan());
    scratch.next_group();
    match rows.strata {
        None => {
            // One cell, its sums in registers (through the cell table each row's update
            // would wait on the previous row's store).
            let mut cell = Cell::default();
            if matches!(spec.compat, Compat::Verl | Compat::Trl) {
                // Their formulas read only the count of the native statistics.
                cell.n = (0..out.len()).filter_map(present).count() as u32;
            } else {
                (0..out.len()).filter_map(present).for_each(|i| cell.add(rows.values[i], length(i)));
                cell.close_mean();
                (0..out.len()).filter_map(present).for_each(|i| cell.add_deviation(rows.values[i]));
            }
            scratch.cells.push(cell);
            scratch.cell_of_row.resize(out.len(), 0);
        }
        Some((strata, _)) => {
            for k in 0..out.len() {
                let c = scratch.cell_of(strata[row(k)]);
                scratch.cell_of_row.push(c);
                if let Some(i) = present(k) {
                    scratch.cells[c as usize].add(rows.values[i], length(i));
                }
            }
            scratch.cells.iter_mut().for_each(Cell::close_mean);
            for k in 0..out.len() {
                if let Some(i) = present(k) {
                    scratch.cells[scratch.cell_of_row[k] as usize].add_deviation(rows.values[i]);
                }
            }
        }
    }
    scratch.cells.iter_mut().for_each(Cell::close_std);
    if spec.compat != Compat::Native {
        scratch.close_trainer(rows, &row, spec);
    }
    for (k, slot) in out.iter_mut().enumerate() {
        let cell = &scratch.cells[scratch.cell_of_row[k] as usize];
        *slot = T::from_f64(cell.advantage(rows.values[row(k)], spec, batch_std));
    }
}

/// One thread's walk over consecutive groups, each a slice of the rows, whose advantages are
/// consecutive in `out`, which starts at row `base` of the whole output: small stratified
/// groups wait in the thread's [`Block`] and are written several at a time, every other group
/// at once.
struct Walk<'a, T> {
    rows: &'a Rows<'a>,
    labels: Labels<'a>,
    spec: &'a Spec,
    batch_std: (f64, f32),
    out: &'a mut [T],
    base: usize,
    /// The output row the block's first held row goes to.
    held: usize,
    scratch: &'a mut Scratch,
}

impl<T: AdvantageFloat> Walk<'_, T> {
    /// The group of rows `lo..hi`; an error for a value out of range (found only by the small
    /// paths: the others run after a check).
    fn group(&mut self, lo: usize, hi: usize) -> Result<()> {
        let (len, spec) = (hi - lo, self.spec);
        if small_path(spec) && len <= SMALL_ROWS && !matches!(self.labels, Labels::None) {
            if !self.scratch.block.fits(len) {
                self.flush();
            }
            // The group as slices of its own: no bounds check per row.
            match self.scratch.block.add(&self.rows.values[lo..hi], self.labels.range(lo..hi), &|k| k, len) {
                Ok(()) => return Ok(()),
                Err(Declined::OutOfRange) => return Err(values_out_of_range("values", self.rows.values)),
                Err(Declined::Scan) => {}
            }
        }
        self.flush();
        debug_assert_eq!(self.held, lo);
        let out = &mut self.out[lo - self.base..hi - self.base];
        let plain = matches!(self.labels, Labels::None) && small_path(spec);
        let done = plain
            && match plain_run(&self.rows.values[lo..hi], out, spec, self.batch_std.0) {
                Ok(()) => true,
                Err(Declined::OutOfRange) => return Err(values_out_of_range("values", self.rows.values)),
                Err(Declined::Scan) => false,
            };
        if !done {
            normalize_group(self.rows, self.labels, |k| lo + k, out, self.scratch, spec, self.batch_std);
        }
        self.held = hi;
        Ok(())
    }

    /// Writes the rows the block holds.
    fn flush(&mut self) {
        let held = self.scratch.block.rows();
        if held > 0 {
            let start = self.held - self.base;
            self.scratch.block.flush(&mut self.out[start..start + held], self.spec, self.batch_std.0);
            self.held += held;
        }
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

/// Rows per parallel piece of `n`: a few pieces per thread, for balance.
fn piece_rows(n: usize) -> usize {
    (n / (rayon::current_num_threads() * 8)).max(4096)
}

/// Walks every group (group `g` is rows `bounds[g]..bounds[g + 1]`) in parallel.
fn run_groups<T: AdvantageFloat>(
    rows: &Rows,
    labels: Labels,
    bounds: &[usize],
    out: &mut [T],
    spec: &Spec,
    batch_std: (f64, f32),
) -> Result<()> {
    let mut pieces = Vec::new();
    let mut rest = out;
    for (first, end) in blocks(bounds, piece_rows(rest.len())) {
        let (piece, tail) = rest.split_at_mut(bounds[end] - bounds[first]);
        pieces.push((first, end, piece));
        rest = tail;
    }
    let n_strata = rows.strata.map_or(1, |(_, n)| n.max(1));
    pieces.into_par_iter().try_for_each_init(
        || Scratch::new(n_strata),
        |scratch, (first, end, piece)| {
            let base = bounds[first];
            let mut walk = Walk { rows, labels, spec, batch_std, out: piece, base, held: base, scratch };
            for g in first..end {
                walk.group(bounds[g], bounds[g + 1])?;
            }
            walk.flush();
            Ok(())
        },
    )
}

fn check_lengths(n: usize, lengths: Option<&[f64]>) -> Result<()> {
    if let Some(lengths) = lengths {
        if lengths.len() != n {
            bail!("lengths has {} entries for {n} values", lengths.len());
        }
        if let Some((row, l)) = lengths.iter().enumerate().find(|(_, l)| !(in_range(**l) && **l >= 0.0)) {
            bail!("lengths[{row}] is {l}: lengths must be >= 0 and below 2^49 (about 5.6e14)");
        }
    }
    Ok(())
}

fn check_values(values: &[f64], lengths: Option<&[f64]>) -> Result<()> {
    check_lengths(values.len(), lengths)?;
    if values.par_iter().with_min_len(min_piece(values.len())).any(|&x| out_of_range(x)) {
        return Err(values_out_of_range("values", values));
    }
    Ok(())
}

/// Normalises every group given its layout; REINFORCE++'s batch whitening last.
fn normalize_layout<T: AdvantageFloat>(rows: &Rows, labels: Labels, layout: Layout, spec: &Spec) -> Result<Vec<T>> {
    let n = rows.values.len();
    let batch_std = if spec.scale == Scale::Batch { batch_std(rows.values, spec) } else { (0.0, 0.0) };
    let mut out = vec![T::default(); n];
    match layout {
        Layout::Runs(bounds) => run_groups(rows, labels, &bounds, &mut out, spec, batch_std)?,
        Layout::Gathered(by_group) => {
            let gathered_rows = by_group.rows(rows);
            let labels = gathered_rows.strata.map_or(Labels::None, |(codes, _)| Labels::Dense(codes));
            let mut gathered = vec![T::default(); n];
            run_groups(&gathered_rows, labels, &by_group.bounds, &mut gathered, spec, batch_std)?;
            for (k, &row) in by_group.order.iter().enumerate() {
                out[row as usize] = gathered[k];
            }
        }
        Layout::Scattered => normalize_scattered(rows, spec, batch_std, &mut out),
    }
    if spec.estimator == Estimator::ReinforcePpBaseline {
        match spec.compat {
            Compat::Native | Compat::Trl => whiten(&mut out, rows.values, rows.lengths),
            Compat::Verl => whiten_verl(&mut out, rows, spec.torch_threads)?,
            Compat::OpenRlhf => {}
        }
    }
    Ok(out)
}

/// Advantages of `rows` under `spec`, one per row, in row order.
pub fn normalize<T: AdvantageFloat>(rows: &Rows, spec: &Spec) -> Result<Vec<T>> {
    check_rows(rows)?;
    let labels = rows.strata.map_or(Labels::None, |(codes, _)| Labels::Dense(codes));
    let gather = !scatter::applies(rows, spec);
    normalize_layout(rows, labels, layout(rows, gather), spec)
}

/// Every array of `rows` has a value per row, every code is in range, every value finite
/// (or NaN) and every length finite and >= 0.
fn check_rows(rows: &Rows) -> Result<()> {
    let n = rows.values.len();
    if rows.groups.len() != n {
        bail!("groups has {} entries for {n} values", rows.groups.len());
    }
    if let Some(bad) = rows.groups.par_iter().with_min_len(min_piece(n)).find_any(|&&g| g as usize >= rows.n_groups) {
        bail!("group code {bad} out of range for {} groups", rows.n_groups);
    }
    if let Some((strata, n_strata)) = rows.strata {
        if strata.len() != n {
            bail!("strata has {} entries for {n} values", strata.len());
        }
        if let Some(bad) = strata.par_iter().with_min_len(min_piece(n)).find_any(|&&s| s as usize >= n_strata) {
            bail!("stratum code {bad} out of range for {n_strata} strata");
        }
    }
    check_values(rows.values, rows.lengths)
}

/// Where each piece of rows labelled in sorted runs starts: about [`piece_rows`] apart, each
/// moved forward to the start of a group. None when a run there is longer than [`SMALL_ROWS`].
fn sorted_piece_starts(labels: &[i64]) -> Option<Vec<usize>> {
    let n = labels.len();
    let target = piece_rows(n);
    let mut starts = vec![0];
    for nominal in (target..n).step_by(target) {
        let mut start = nominal;
        while start < n && labels[start] == labels[start - 1] {
            start += 1;
            if start - nominal > SMALL_ROWS {
                return None;
            }
        }
        if start < n {
            starts.push(start);
        }
    }
    starts.push(n);
    Some(starts)
}

/// Why a walk over sorted runs stopped.
enum Stop {
    /// The labels are not sorted runs of small groups.
    Layout,
    Failed(MasreplayError),
}

/// Rows whose group labels are sorted ascending in runs of at most [`SMALL_ROWS`] (the layout
/// of GRPO rollouts), for a spec of the small paths: one pass over the rows, finding each
/// group where it ends, checking the values and normalising it. None, as soon as a piece
/// finds otherwise, when the labels are not laid out so: the caller takes the general path.
fn normalize_sorted_runs<T: AdvantageFloat>(
    values: &[f64],
    groups: &[i64],
    labels: Labels,
    spec: &Spec,
) -> Option<Result<Vec<T>>> {
    let n = values.len();
    let starts = sorted_piece_starts(groups)?;
    let batch_std = if spec.scale == Scale::Batch { batch_std(values, spec) } else { (0.0, 0.0) };
    let rows = Rows { values, groups: &[], n_groups: 0, strata: None, lengths: None, tokens: None };
    let mut out = vec![T::default(); n];
    let mut pieces = Vec::new();
    let mut rest = out.as_mut_slice();
    for range in starts.windows(2) {
        let (piece, tail) = rest.split_at_mut(range[1] - range[0]);
        pieces.push((range[0], range[1], piece));
        rest = tail;
    }
    let walked = pieces.into_par_iter().try_for_each_init(
        || Scratch::new(1),
        |scratch, (start, end, piece)| {
            let rows = &rows;
            let mut walk = Walk { rows, labels, spec, batch_std, out: piece, base: start, held: start, scratch };
            let mut lo = start;
            while lo < end {
                let label = groups[lo];
                let mut hi = lo + 1;
                while hi < end && groups[hi] == label {
                    hi += 1;
                }
                if hi - lo > SMALL_ROWS || (hi < n && groups[hi] < label) {
                    return Err(Stop::Layout);
                }
                walk.group(lo, hi).map_err(Stop::Failed)?;
                lo = hi;
            }
            walk.flush();
            Ok(())
        },
    );
    match walked {
        Ok(()) => Some(Ok(out)),
        Err(Stop::Layout) => None,
        Err(Stop::Failed(error)) => Some(Err(error)),
    }
}

/// Advantages of rows labelled by the caller: any int64 group labels (grouping by value)
/// and optional int64 stratum labels. Labels sorted ascending, as GRPO rollouts of one prompt
/// come, are read in place (no renumbering, no gathering); others are renumbered first.
pub fn normalize_labels<T: AdvantageFloat>(
    values: &[f64],
    groups: &[i64],
    strata: Option<&[i64]>,
    lengths: Option<&[f64]>,
    tokens: Option<(&[f32], usize)>,
    spec: &Spec,
) -> Result<Vec<T>> {
    let n = values.len();
    if groups.len() != n {
        bail!("groups has {} entries for {n} values", groups.len());
    }
    if strata.is_some_and(|s| s.len() != n) {
        bail!("strata has {} entries for {n} values", strata.map_or(0, <[i64]>::len));
    }
    check_lengths(n, lengths)?;
    if small_path(spec) {
        // The small paths read the stratum labels as they are.
        let labels = strata.map_or(Labels::None, Labels::Raw);
        if let Some(done) = normalize_sorted_runs(values, groups, labels, spec) {
            return done;
        }
    }
    if strata.is_none() && scatter::takes(spec) {
        let whole_batch = || if spec.scale == Scale::Batch { batch_std(values, spec) } else { (0.0, 0.0) };
        if let Some(done) = scatter::normalize_keys(values, groups, spec, whole_batch) {
            return done;
        }
    }
    let (group_codes, n_groups) = dense_codes(groups);
    let strata_codes = strata.map(dense_codes);
    let rows = Rows {
        values,
        groups: &group_codes,
        n_groups,
        strata: strata_codes.as_ref().map(|(codes, count)| (codes.as_slice(), *count)),
        lengths,
        tokens,
    };
    normalize(&rows, spec)
}

/// REINFORCE++'s batch whitening, weighted by length as verl's `masked_whiten` weighs every
/// valid token: mean and unbiased variance over all tokens, `(a - mean) / sqrt(var + 1e-8)`.
/// Rows with a NaN reward stay 0 and weigh nothing.
fn whiten<T: AdvantageFloat>(out: &mut [T], values: &[f64], lengths: Option<&[f64]>) {
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

/// verl's `masked_whiten` of REINFORCE++'s `r - mean` over the response tokens, in its fp32
/// operations: every row's value tiled over its row of the mask, the mean and the unbiased
/// variance as sums over the whole (rows x width) tensor in torch's order, then
/// `(a - mean) * rsqrt(var + 1e-8)` (torch's fp32 `rsqrt` is `1 / sqrt`, both correctly
/// rounded). A row with a NaN reward contributes no tokens and stays 0.
fn whiten_verl<T: AdvantageFloat>(out: &mut [T], rows: &Rows, threads: usize) -> Result<()> {
    let n = out.len();
    let length = |i: usize| rows.lengths.map_or(1, |l| l[i] as usize);
    // The mask, or each row's `lengths` tokens first in a width of the longest row; read
    // entry by entry, never built (rows x width can be large).
    let (mask, width) = match rows.tokens {
        Some((mask, width)) if mask.len() != n * width => {
            bail!("the response mask has {} entries for {n} rows x {width}", mask.len());
        }
        Some((mask, width)) => (Some(mask), width),
        None => (None, (0..n).map(length).max().unwrap_or(0)),
    };
    let valid = |k: usize| {
        let (row, column) = (k / width, k % width);
        mask.map_or(column < length(row), |m| m[k] != 0.0) && !rows.values[row].is_nan()
    };
    let row_value = |k: usize| out[k / width].to_f64() as f32;
    let entries = n * width;
    let count = torch_sum_threads_of(entries, threads, |k| valid(k) as u8 as f32);
    if count < 2.0 {
        bail!("verl's masked_whiten needs at least 2 response tokens, the batch has {count}");
    }
    let mean = torch_sum_threads_of(entries, threads, |k| if valid(k) { row_value(k) } else { 0.0 }) / (count + 1e-8);
    let squares = |k: usize| if valid(k) { (row_value(k) - mean) * (row_value(k) - mean) } else { 0.0 };
    let variance = torch_sum_threads_of(entries, threads, squares) / (count + 1e-8) * (count / (count - 1.0));
    let scale = 1.0 / (variance + 1e-8).sqrt();
    for (i, slot) in out.iter_mut().enumerate() {
        if !rows.values[i].is_nan() {
            *slot = T::from_f64(((slot.to_f64() as f32 - mean) * scale) as f64);
        }
    }
    Ok(())
}
