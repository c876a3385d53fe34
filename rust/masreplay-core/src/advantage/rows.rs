//! What the kernel normalises, as the callers lay it out: the rows of a batch of values.

/// The rows to normalise: a value, a dense group code and optionally a dense stratum code
/// and a length (token count; OPO's and REINFORCE++'s weights) per row.
#[derive(Clone, Copy, Debug)]
pub struct Rows<'a> {
    pub values: &'a [f64],
    pub groups: &'a [u32],
    pub n_groups: usize,
    pub strata: Option<(&'a [u32], usize)>,
    pub lengths: Option<&'a [f64]>,
    /// verl's response mask (rows x width, row-major, 0 or 1) and its width, for REINFORCE++'s
    /// token-level whitening under `Compat::Verl`; without it each row's `lengths` tokens
    /// come first in a width of the longest row.
    pub tokens: Option<(&'a [f32], usize)>,
}
