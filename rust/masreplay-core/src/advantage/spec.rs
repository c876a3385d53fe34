//! What to compute: the estimator, how it scales, and whose arithmetic to follow.

use crate::error::{MasreplayError, Result};

/// The baseline (and scale) an advantage subtracts from a reward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Estimator {
    /// `(r - mean) / (std + eps)`; with [`Scale::None`] it is Dr.GRPO's `r - mean`.
    Grpo,
    /// Leave-one-out: `r - mean of the others`.
    Rloo,
    /// `r - mean`, then whitened over the whole batch (weighted by length).
    ReinforcePpBaseline,
    /// `r - sum(len r) / sum(len)`: the length-weighted mean as baseline.
    Opo,
}

impl Estimator {
    pub const NAMES: &'static [&'static str] = &["grpo", "rloo", "reinforce_pp_baseline", "opo"];

    pub fn parse(name: &str) -> Result<Self> {
        Ok(match name {
            "grpo" => Estimator::Grpo,
            "rloo" => Estimator::Rloo,
            "reinforce_pp_baseline" | "reinforce_plus_plus_baseline" => Estimator::ReinforcePpBaseline,
            "opo" => Estimator::Opo,
            _ => return Err(invalid(format!("estimator must be one of {:?}, got {name:?}", Self::NAMES))),
        })
    }
}

/// The standard deviation GRPO divides by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// The cell's own (unbiased) standard deviation.
    Group,
    /// One standard deviation of the raw rewards over the whole batch (TRL's "batch"); the
    /// mean stays per cell.
    Batch,
    /// No division (Dr.GRPO).
    None,
}

impl Scale {
    pub fn parse(name: &str) -> Result<Self> {
        Ok(match name {
            "group" => Scale::Group,
            "batch" => Scale::Batch,
            "none" => Scale::None,
            _ => return Err(invalid(format!("std must be True, False, 'group', 'batch' or 'none', got {name:?}"))),
        })
    }
}

/// Whose numbers to reproduce. `Native` computes in f64 with masreplay's conventions; the
/// others follow that trainer's fp32 arithmetic and edge cases (see `cell`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compat {
    Native,
    Verl,
    Trl,
    OpenRlhf,
}

impl Compat {
    pub fn parse(name: Option<&str>) -> Result<Self> {
        Ok(match name {
            None => Compat::Native,
            Some("verl") => Compat::Verl,
            Some("trl") => Compat::Trl,
            Some("openrlhf") => Compat::OpenRlhf,
            Some(other) => {
                return Err(invalid(format!("compat must be None, 'verl', 'trl' or 'openrlhf', got {other:?}")));
            }
        })
    }

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
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(invalid(format!("eps must be a finite number >= 0, got {eps}")));
        }
        let supported = match compat {
            Compat::Native | Compat::Verl => true,
            Compat::Trl => estimator == Estimator::Grpo,
            Compat::OpenRlhf => estimator != Estimator::Opo,
        };
        if !supported {
            return Err(invalid(format!("{compat:?} has no estimator {:?} to reproduce", estimator)));
        }
        if scale == Scale::Batch && !matches!(compat, Compat::Native | Compat::Trl) {
            return Err(invalid(format!("std='batch' is TRL's scale_rewards='batch'; {compat:?} has no such mode")));
        }
        if scale == Scale::Batch && estimator != Estimator::Grpo {
            return Err(invalid("std='batch' applies to estimator='grpo' only".to_owned()));
        }
        Ok(Spec { estimator, scale, eps, compat, torch_threads: 1 })
    }

    /// The same spec for a trainer whose torch runs `threads` intra-op threads.
    pub fn with_torch_threads(self, threads: usize) -> Self {
        Spec { torch_threads: threads.max(1), ..self }
    }
}

pub(crate) fn invalid(message: String) -> MasreplayError {
    MasreplayError::InvalidArgument(message)
}
