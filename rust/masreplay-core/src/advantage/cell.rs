//! One normalisation cell (a group, or a group x stratum): its statistics, and each
//! estimator's formula. Native arithmetic is f64; the trainer modes redo the trainer's own
//! fp32 operations in torch's order (`torch_sum`), so their results are bit-for-bit the
//! trainer's in the single-agent case:
//! - verl: `torch.mean` (fp32 sum, then / n) and `torch.std` (unbiased; torch accumulates the
//!   squared deviations from the fp32 mean in f64 and rounds the root to fp32); a group of
//!   one has mean 0 and std 1, so GRPO gives `r / (1 + eps)` and RLOO gives `r`.
//! - TRL: `nanmean` and TRL's `nanstd` (fp32 mean of squared deviations times n/(n-1)); a
//!   group of one has std 0, so its advantage is 0; NaN rewards are left out and get 0.
//!   torch's fp32 `sqrt` is MKL's, not correctly rounded on every CPU: `torch_sqrt` rounds
//!   as the kernel MKL runs on this CPU does.
//! - OpenRLHF: mean over the group's dim in fp32, `torch.std` unbiased (f64 Welford, fp32
//!   result); a group of one divides by zero and gives NaN, as OpenRLHF does.
//!
//! Native conventions: a cell of one sample, or of equal values, carries no comparison, so
//! every estimator gives it 0 (exactly, whatever rounding does to the mean); NaN rewards are
//! left out of the statistics and get 0 (TRL's "unscorable").

use super::spec::{Compat, Estimator, Scale, Spec};
use super::torch_sqrt::{SqrtKernel, torch_sqrt};
use super::torch_sum::{torch_sum, torch_sum_threads};

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Cell {
    pub n: u32,
    sum: f64,
    length_sum: f64,
    weighted_sum: f64,
    mean: f64,
    m2: f64,
    std: f64,
    /// Whether every value of the cell is the same (its advantages are then 0 natively,
    /// whatever rounding did to the mean).
    constant: bool,
    first: f64,
    /// The trainer modes' fp32 statistics (see `close_trainer`).
    pub trainer: Trainer32,
}

/// A cell's statistics in a trainer's fp32 arithmetic, and the trainer's formulas: all a
/// trainer mode's advantage reads of its cell (24 bytes, for the per-group tables of
/// `trainer_scatter`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Trainer32 {
    n: u32,
    sum32: f32,
    mean32: f32,
    std32: f32,
    weighted_sum32: f32,
    length_sum32: f32,
}

impl Cell {
    /// First pass: one non-NaN value and its length (token count, or 1).
    #[inline]
    pub fn add(&mut self, x: f64, length: f64) {
        if self.n == 0 {
            self.first = x;
            self.constant = true;
        } else if x != self.first {
            self.constant = false;
        }
        self.n += 1;
        self.sum += x;
        self.length_sum += length;
        self.weighted_sum += length * x;
    }

    /// Between the passes.
    #[inline]
    pub fn close_mean(&mut self) {
        self.mean = self.sum / self.n.max(1) as f64;
    }

    /// A value's deviation from the cell's mean (after [`Cell::close_mean`]).
    #[inline]
    pub fn deviation(&self, x: f64) -> f64 {
        x - self.mean
    }

    /// Second pass: the same value again.
    #[inline]
    pub fn add_deviation(&mut self, x: f64) {
        let d = self.deviation(x);
        self.m2 += d * d;
    }

    /// After the second pass.
    #[inline]
    pub fn close_std(&mut self) {
        self.std = if self.n < 2 { 0.0 } else { (self.m2 / (self.n - 1) as f64).sqrt() };
    }

    /// The trainer modes' statistics from the cell's values in row order (NaN included, as
    /// the trainer's tensor holds them) and their lengths; `scratch` is a reusable buffer.
    /// Call after the two native passes.
    /// `threads`: torch's intra-op threads, which split a whole-tensor sum (the batch's).
    pub fn close_trainer(
        &mut self,
        values: &[f32],
        lengths: &[f32],
        spec: &Spec,
        threads: usize,
        scratch: &mut Vec<f32>,
    ) {
        let (n, compat) = (self.n, spec.compat);
        let t = &mut self.trainer;
        t.n = n;
        t.sum32 = torch_sum_threads(values, true, threads);
        t.mean32 = t.sum32 / n.max(1) as f32;
        if compat == Compat::Verl && spec.estimator == Estimator::Opo {
            // verl's OPO baseline; no other formula reads these sums.
            scratch.clear();
            scratch.extend(values.iter().zip(lengths).map(|(x, l)| l * x));
            t.weighted_sum32 = torch_sum(scratch, true);
            t.length_sum32 = torch_sum(lengths, false);
        }
        t.std32 = match compat {
            _ if n < 2 => {
                if compat == Compat::OpenRlhf {
                    f32::NAN
                } else {
                    0.0
                }
            }
            Compat::Native => self.std as f32,
            Compat::Verl => {
                let mean = t.mean32 as f64;
                let m2: f64 = values.iter().filter(|x| !x.is_nan()).map(|&x| (x as f64 - mean).powi(2)).sum();
                (m2 / (n - 1) as f64).sqrt() as f32
            }
            Compat::Trl => {
                scratch.clear();
                scratch.extend(values.iter().map(|&x| (x - t.mean32) * (x - t.mean32)));
                let mut variance = torch_sum_threads(scratch, true, threads) / n as f32;
                variance *= n as f32 / (n - 1) as f32;
                torch_sqrt(variance, SqrtKernel::detect())
            }
            Compat::OpenRlhf => self.std as f32,
        };
    }

    /// The advantage of value `x` of this cell; `batch_std` is the batch's standard
    /// deviation under [`Scale::Batch`] (f64, and the trainer's fp32 one).
    #[inline(always)]
    pub fn advantage(&self, x: f64, spec: &Spec, batch_std: (f64, f32)) -> f64 {
        if x.is_nan() {
            return 0.0;
        }
        match spec.compat {
            Compat::Native => self.native(x, spec, batch_std.0),
            _ => self.trainer.advantage(x as f32, spec, batch_std.1) as f64,
        }
    }

    #[inline(always)]
    fn native(&self, x: f64, spec: &Spec, batch_std: f64) -> f64 {
        if self.n < 2 || self.constant {
            return 0.0;
        }
        let n = self.n as f64;
        match spec.estimator {
            Estimator::Grpo => match spec.scale {
                // By the reciprocal, as the small-group path computes it (same rounding).
                Scale::Group => (x - self.mean) * spec.native_factor(self.std),
                Scale::Batch => (x - self.mean) * spec.native_factor(batch_std),
                Scale::None => x - self.mean,
            },
            Estimator::Rloo => x - (self.sum - x) / (n - 1.0),
            Estimator::ReinforcePpBaseline => x - self.mean,
            Estimator::Opo if self.length_sum > 0.0 => x - self.weighted_sum / self.length_sum,
            Estimator::Opo => x - self.mean,
        }
    }
}

impl Trainer32 {
    /// The advantage of fp32 value `x` of this cell in the trainer's arithmetic (0 for NaN);
    /// `batch_std` is the batch's fp32 standard deviation under [`Scale::Batch`].
    #[inline(always)]
    pub fn advantage(&self, x: f32, spec: &Spec, batch_std: f32) -> f32 {
        if x.is_nan() {
            return 0.0;
        }
        if spec.estimator == Estimator::Grpo {
            let (centre, divisor) = self.grpo(spec, batch_std);
            return (x - centre) / divisor;
        }
        match spec.compat {
            Compat::Verl => self.verl(x, spec),
            // TRL has GRPO only; native cells compute in f64 and never ask (`Cell::advantage`).
            Compat::Trl | Compat::OpenRlhf | Compat::Native => self.openrlhf(x, spec),
        }
    }

    /// GRPO's advantage of `x` in every trainer is `(x - centre) / divisor` in fp32: the mean
    /// and `std + eps`, or 1 where nothing is divided (`y / 1` is `y`, bit for bit). verl
    /// gives a group of one mean 0 and std 1; TRL's groups of one have std 0 (advantage 0),
    /// OpenRLHF's NaN (advantage NaN, as OpenRLHF gives).
    #[inline(always)]
    pub fn grpo(&self, spec: &Spec, batch_std: f32) -> (f32, f32) {
        let eps = spec.eps as f32;
        let verl_single = spec.compat == Compat::Verl && self.n == 1;
        let (mean, std) = if verl_single { (0.0, 1.0) } else { (self.mean32, self.std32) };
        let divisor = match spec.scale {
            Scale::Group => std + eps,
            Scale::Batch => batch_std + eps,
            Scale::None => 1.0,
        };
        (mean, divisor)
    }

    /// The statistics of a group without strata from its fp32 values in row order (NaN
    /// included, as the trainer's tensor holds them), for GRPO and RLOO (no lengths read): the
    /// same operations as for a cell of the gathered path, the native passes OpenRLHF's std
    /// reads (over `values`, the f64 values in row order, given for OpenRLHF only) then
    /// [`Cell::close_trainer`]. `scratch` is a reusable buffer.
    pub fn of_group(
        values32: &[f32],
        values: Option<impl Iterator<Item = f64> + Clone>,
        spec: &Spec,
        scratch: &mut Vec<f32>,
    ) -> Self {
        debug_assert!(matches!(spec.estimator, Estimator::Grpo | Estimator::Rloo));
        debug_assert_eq!(values.is_some(), spec.compat == Compat::OpenRlhf);
        let mut cell = Cell::default();
        match values {
            Some(values) => (cell.n, cell.std) = native_std(values),
            None => cell.n = values32.iter().filter(|x| !x.is_nan()).count() as u32,
        }
        cell.close_trainer(values32, &[], spec, 1, scratch);
        cell.trainer
    }

    /// verl's estimators but GRPO (which [`Trainer32::grpo`] takes).
    fn verl(&self, x: f32, spec: &Spec) -> f32 {
        let single = self.n == 1;
        match spec.estimator {
            Estimator::Rloo if single => x,
            Estimator::Rloo => {
                let n = self.n as f32;
                x * n / (n - 1.0) - self.mean32 * n / (n - 1.0)
            }
            Estimator::ReinforcePpBaseline | Estimator::Grpo => x - if single { 0.0 } else { self.mean32 },
            Estimator::Opo if single => x,
            Estimator::Opo => x - self.weighted_sum32 / self.length_sum32,
        }
    }

    /// OpenRLHF's estimators but GRPO (which [`Trainer32::grpo`] takes).
    fn openrlhf(&self, x: f32, spec: &Spec) -> f32 {
        match spec.estimator {
            Estimator::Rloo => x - (self.sum32 - x) / (self.n as f32 - 1.0),
            Estimator::ReinforcePpBaseline | Estimator::Opo | Estimator::Grpo => x - self.mean32,
        }
    }
}

/// The number of non-NaN `values` and their standard deviation as a cell's native passes take
/// it ([`Cell::add`], [`Cell::close_mean`], [`Cell::add_deviation`], [`Cell::close_std`]: the
/// same operations in the same order, so the same bits), without the sums and the test a
/// group without lengths never reads: a third less time over a shuffled batch's groups.
fn native_std(values: impl Iterator<Item = f64> + Clone) -> (u32, f64) {
    let present = values.filter(|x| !x.is_nan());
    let (n, sum) = present.clone().fold((0u32, 0.0), |(n, sum), x| (n + 1, sum + x));
    let mean = sum / n.max(1) as f64;
    let m2 = present.fold(0.0, |m2, x| {
        let d = x - mean;
        m2 + d * d
    });
    (n, if n < 2 { 0.0 } else { (m2 / (n - 1) as f64).sqrt() })
}

/// The standard deviation of every non-NaN value of the batch: TRL's `nanstd(rewards)` in
/// fp32 for `Compat::Trl`, unbiased f64 otherwise; 0 for fewer than two values.
pub(crate) fn batch_std(values: &[f64], spec: &Spec) -> (f64, f32) {
    let mut cell = Cell::default();
    for &x in values.iter().filter(|x| !x.is_nan()) {
        cell.add(x, 1.0);
    }
    cell.close_mean();
    for &x in values.iter().filter(|x| !x.is_nan()) {
        cell.add_deviation(x);
    }
    cell.close_std();
    if spec.compat == Compat::Trl {
        let values32: Vec<f32> = values.iter().map(|&x| x as f32).collect();
        let ones = vec![1f32; values32.len()];
        cell.close_trainer(&values32, &ones, spec, spec.torch_threads, &mut Vec::new());
    }
    (cell.std, cell.trainer.std32)
}
