//! Exact Shapley values by enumerating all 2^n coalitions, valued in blocks (in parallel for
//! native games) and folded in one pass with the identity
//! phi_i = sum_{T contains i} w(|T| - 1) v(T) - sum_{S lacks i} w(|S|) v(S),
//! w(s) = s! (n - s - 1)! / n!.

use super::coalition::{Coalitions, contains, size};
use super::forest::ln_factorials;
use super::game::Game;
use super::sampling::map_items;
use super::{Estimate, Stopping};
use crate::error::{MasreplayError, Result};

/// The most players exact enumeration accepts (2^30 values are 8 GiB).
pub const MAX_EXACT_PLAYERS: usize = 30;
const BLOCK_BITS: usize = 14;

pub fn coalitions_needed(n: usize) -> f64 {
    2f64.powi(n as i32)
}

/// C(n, k), exact while it stays below 2^53 (every partial product is itself a binomial).
pub fn binomial(n: usize, k: usize) -> f64 {
    (0..k).fold(1.0, |acc, i| acc * (n - i) as f64 / (i + 1) as f64)
}

/// Shapley weights w(s) for s in 0..n.
pub fn shapley_weights(n: usize) -> Vec<f64> {
    let ln = ln_factorials(n);
    (0..n).map(|s| (ln[s] + ln[n - s - 1] - ln[n]).exp()).collect()
}

/// Adds one coalition's terms to every player's value: `w(size - 1) v` to its members,
/// `-w(size) v` to the others.
fn fold(phi: &mut [f64], weights: &[f64], size: usize, value: f64, member: impl Fn(usize) -> bool) {
    let n = phi.len();
    for (i, slot) in phi.iter_mut().enumerate() {
        if member(i) {
            *slot += weights[size - 1] * value;
        } else if size < n {
            *slot -= weights[size] * value;
        }
    }
}

/// Shapley values from the values of every coalition: the empty and the grand one, and each
/// other coalition once (an estimator whose budget reached all 2^n, exact to rounding).
pub fn from_every_coalition<'a>(
    n: usize,
    empty: f64,
    full: f64,
    others: impl Iterator<Item = (&'a [u64], f64)>,
) -> Vec<f64> {
    let weights = shapley_weights(n);
    let mut phi = vec![0.0; n];
    fold(&mut phi, &weights, 0, empty, |_| false);
    fold(&mut phi, &weights, n, full, |_| true);
    for (set, value) in others {
        fold(&mut phi, &weights, size(set), value, |i| contains(set, i));
    }
    phi
}

pub fn exact(game: &dyn Game, stopping: &Stopping) -> Result<Estimate> {
    let n = game.n_players();
    if n > MAX_EXACT_PLAYERS {
        return Err(MasreplayError::InvalidArgument(format!(
            "method='exact' enumerates 2^n coalitions; n = {n} exceeds {MAX_EXACT_PLAYERS}"
        )));
    }
    let total = 1u64 << n;
    let block = 1u64 << BLOCK_BITS.min(n);
    let weights = shapley_weights(n);
    let blocks = map_items(game.sequential(), (total / block) as usize, |b| {
        let start = b as u64 * block;
        let mut batch = Coalitions::with_capacity(n, block as usize);
        for mask in start..start + block {
            batch.push_mask(mask);
        }
        let values = game.values(&batch)?;
        let mut phi = vec![0.0; n];
        for (offset, &value) in values.iter().enumerate() {
            let mask = start + offset as u64;
            fold(&mut phi, &weights, mask.count_ones() as usize, value, |i| mask >> i & 1 == 1);
        }
        Ok(phi)
    })?;
    let mut values = vec![0.0; n];
    for phi in blocks {
        values.iter_mut().zip(phi).for_each(|(v, p)| *v += p);
    }
    Ok(Estimate { values, stderr: vec![0.0; n], evaluations: total, converged: true, exact: true }
        .with_target(stopping))
}
