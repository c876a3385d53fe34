//! What to compute: the estimator, how it scales, and whose arithmetic to follow.

use crate::ensure;
use crate::error::Result;
use crate::names::named_enum;

named_enum!(
    /// The baseline (and scale) an advantage subtracts from a reward.
    Estimator as "estimator" {
        /// `(r - mean) / (std + eps)`; with [`Scale::None`] it is Dr.GRPO's `r - mean`.
        Grpo = "grpo",
        /// Leave-one-out: `r - mean of the others`.
        Rloo = "rloo",
        /// `r - mean`, then whitened over the whole batch (weighted by length).
        ReinforcePpBaseline = "reinforce_pp_baseline",
        /// `r - sum(len r) / sum(len)`: the length-weighted mean as baseline.
        Opo = "opo",
    }
    aliases { "reinforce_plus_plus_baseline" => ReinforcePpBaseline }
);

named_enum!(
    /// The standard deviation GRPO divides by.
    Scale as "std" {
        /// The cell's own (unbiased) standard deviation.
        Group = "group",
        /// One standard deviation of the raw rewards over the whole batch (TRL's "batch"); the
        /// mean stays per cell.
        Batch = "batch",
        /// No division (Dr.GRPO).
        None = "none",
    }
);

named_enum!(
    /// Whose numbers to reproduce. `Native` computes in f64 with masreplay's conventions; the
    /// others follow that trainer's fp32 arithmetic and edge cases (see `cell`).
    Compat as "compat" {
        Native = "native",
        Verl = "verl",
        Trl = "trl",
        OpenRlhf = "openrlhf",
    }
);

impl Compat {
    /// The epsilon this trainer adds to the standard deviation.
    pub fn default_eps(self) -> f64 {
        match self {
            Compat::Native | Compat::Verl => 1e-6,
            Compat::Trl => 1e-4,
            Compat::OpenRlhf => 1e-9,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spec {
    pub estimator: Estimator,
    pub scale: Scale,
    pub eps: f64,
    pub compat: Compat,
    /// torch's intra-op threads in the trainer (`torch.get_num_threads()`): ATen splits a sum
    /// of a whole tensor of at least 32768 values between them, which changes its rounding.
    /// Read by the trainer modes' whole-batch sums (TRL's `std="batch"`, verl's whitening).
    pub torch_threads: usize,
}

impl Spec {
    /// Checks the combination: a trainer is reproduced only where it has that estimator.
    pub fn new(estimator: Estimator, scale: Scale, eps: Option<f64>, compat: Compat) -> Result<Self> {
        let eps = eps.unwrap_or(compat.default_eps());
        ensure!(eps.is_finite() && eps >= 0.0, "eps must be a finite number >= 0, got {eps}");
        let supported = match compat {
            Compat::Native | Compat::Verl => true,
            Compat::Trl => estimator == Estimator::Grpo,
            Compat::OpenRlhf => estimator != Estimator::Opo,
        };
        ensure!(supported, "{compat:?} has no estimator {estimator:?} to reproduce");
        if scale == Scale::Batch {
            ensure!(
                matches!(compat, Compat::Native | Compat::Trl),
                "std 'batch' is TRL's scale_rewards 'batch'; {compat:?} has no such mode"
            );
            ensure!(estimator == Estimator::Grpo, "std 'batch' applies to estimator 'grpo' only");
        }
        Ok(Spec { estimator, scale, eps, compat, torch_threads: 1 })
    }

    /// GRPO's native factor `1 / (std + eps)`, or 0 where that is not finite: with `eps = 0`
    /// a spread so small that its squares underflow has a std of 0, and no comparison f64
    /// can resolve, like a constant cell's (the trainer modes divide as their trainer does).
    #[inline(always)]
    pub fn native_factor(&self, std: f64) -> f64 {
        let factor = 1.0 / (std + self.eps);
        if factor < f64::INFINITY { factor } else { 0.0 }
    }

    /// The same spec for a trainer whose torch runs `threads` intra-op threads.
    pub fn with_torch_threads(self, threads: usize) -> Self {
        Spec { torch_threads: threads.max(1), ..self }
    }
}
