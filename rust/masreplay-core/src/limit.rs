//! The largest magnitude the numbers masreplay sums may have (rewards, value estimates, token
//! counts, a game's values): below 2^49 (about 5.6e14). Below it no sum any path takes can
//! overflow, in f64 or in a trainer's fp32 (TRL's fp32 sum of squared deviations, the
//! largest, stays finite up to 2^28 rows), and every fp32 advantage is finite; above it a
//! finite input could come out as NaN, an infinity or a silent 0 (squares overflowing make a
//! standard deviation infinite). Numbers that large carry no meaning an fp32 trainer could
//! keep, so they are refused rather than rescaled.

use crate::error::{MasreplayError, Result};

/// 2^49: every value in range is of smaller magnitude.
pub const BOUND: f64 = (1u64 << 49) as f64;

/// 2^975: `x * OVERFLOW_SCALE` is finite exactly when `x` is in range (scaling by a power of
/// two is exact short of overflow, and `f64::MAX / 2^975` is the largest float below
/// [`BOUND`]): a test the hot loops fold into their NaN test, `(x * OVERFLOW_SCALE) * 0.0`
/// being 0 for a value in range and NaN otherwise.
pub const OVERFLOW_SCALE: f64 = f64::from_bits((1023 + 975) << 52);

/// What a number in range is, for messages.
pub const IN_RANGE: &str = "finite, of magnitude below 2^49 (about 5.6e14)";

/// Whether `x` is a number of magnitude below [`BOUND`] (false for NaN and infinities).
#[inline(always)]
pub fn in_range(x: f64) -> bool {
    x.abs() < BOUND
}

/// Whether `x` is out of range and not NaN (NaN marks a missing reward, which is allowed).
#[inline(always)]
pub fn out_of_range(x: f64) -> bool {
    x.abs() >= BOUND
}

/// Whether values summed as `x - shift` into `squares` (shifted-data sums, `shift` one of
/// them) are surely in range: each is within `sqrt(squares)` of the shift, so all are when
/// the shift is within a quarter of the bound and the squares within a quarter's square
/// (within half of it then, whatever the rounding). False for NaN or infinite sums. A lazy
/// test for the paths that take such sums anyway: only where it fails are the values read.
#[inline]
pub fn shifted_sums_in_range(shift: f64, squares: f64) -> bool {
    const QUARTER: f64 = BOUND / 4.0;
    shift.abs() <= QUARTER && squares <= QUARTER * QUARTER
}

/// The error for `values` holding a value out of range, naming the first (NaN marks a missing
/// reward, which is allowed).
pub fn values_out_of_range(name: &str, values: &[f64]) -> MasreplayError {
    let row = values.iter().position(|&x| out_of_range(x)).unwrap_or(0);
    refused(&format!("{name}[{row}]"), name, values.get(row).copied().unwrap_or(f64::NAN), NAN_ALLOWED)
}

/// Every value of `values` in range, NaN refused too: an error naming the first that is not.
pub fn check_in_range(name: &str, values: &[f64]) -> Result<()> {
    match values.iter().position(|&x| !in_range(x)) {
        Some(row) => Err(refused(&format!("{name}[{row}]"), name, values[row], "")),
        None => Ok(()),
    }
}

/// The error for reward `x` of `whose` (a trace, an event) out of range.
pub fn reward_out_of_range(whose: &str, x: f64) -> MasreplayError {
    refused(&format!("{whose}: the reward"), "rewards", x, NAN_ALLOWED)
}

/// The first value of `values` out of range (NaN included) that `function` (a game,
/// `value_fn`) returned for `whom` (a coalition, a coalition of a trace), as an error.
pub fn check_game_values(values: &[f64], function: &str, whom: &str) -> Result<()> {
    let Some(&x) = values.iter().find(|&&x| !in_range(x)) else { return Ok(()) };
    let what = if x.is_finite() { "a value out of range" } else { "a non-finite value" };
    Err(MasreplayError::InvalidArgument(format!(
        "{function} returned {what} ({x:e}) for {whom}: values must be {IN_RANGE}, beyond which sums overflow"
    )))
}

const NAN_ALLOWED: &str = " (NaN marks a missing reward)";

fn refused(what: &str, name: &str, x: f64, note: &str) -> MasreplayError {
    MasreplayError::InvalidArgument(format!(
        "{what} is {x:e}: {name} must be {IN_RANGE}, beyond which sums overflow{note}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_is_out_of_range_and_the_float_below_it_is_not() {
        let below = f64::from_bits(BOUND.to_bits() - 1);
        assert!(in_range(below) && in_range(-below) && !in_range(BOUND) && !in_range(f64::NAN));
        assert!(out_of_range(-BOUND) && out_of_range(f64::INFINITY) && !out_of_range(f64::NAN));
        assert_eq!(OVERFLOW_SCALE, 2f64.powi(975));
        assert_eq!(f64::MAX / OVERFLOW_SCALE, below);
        for x in [below, -below, BOUND, -BOUND, 1.0, 0.0, 1e300, f64::INFINITY, f64::NAN] {
            assert_eq!((x * OVERFLOW_SCALE) * 0.0 == 0.0, in_range(x), "{x}");
        }
    }

    #[test]
    fn the_error_names_the_first_value_out_of_range() {
        let values = [1.0, f64::NAN, -1e300, f64::INFINITY];
        let message = values_out_of_range("values", &values).to_string();
        assert!(message.starts_with("values[2] is -1e300: values must be finite"), "{message}");
        assert!(message.ends_with("(NaN marks a missing reward)"), "{message}");
        let message = check_in_range("rewards", &values).unwrap_err().to_string();
        assert!(message.starts_with("rewards[1] is NaN: "), "{message}");
        assert!(check_in_range("rewards", &[BOUND / 2.0, -1e14, 0.0]).is_ok());
        let message = reward_out_of_range("trace \"t1\"", f64::INFINITY).to_string();
        assert!(message.starts_with("trace \"t1\": the reward is inf: rewards must be finite"), "{message}");
    }
}
