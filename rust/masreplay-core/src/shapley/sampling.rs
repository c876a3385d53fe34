//! The Monte-Carlo engine shared by every ordering-based estimator (permutation, precedence,
//! permission, Owen): draw orderings, value their prefixes, average marginal contributions.
//!
//! Work is cut into chunks of a fixed number of sampling units; chunk j draws from its own
//! stream derived from (seed, j), and chunk sums are added in chunk order, so the result is
//! the same at any thread count. Stopping is checked after each round of chunks, a fixed
//! number, so it too does not depend on the threads.

use rand_xoshiro::Xoshiro256PlusPlus;
use rayon::prelude::*;

use super::game::{Game, prefix_values};
use super::{Estimate, Stopping};
use crate::error::{MasreplayError, Result};
use crate::student_t::z_scale;

/// Chunks per round between two looks at the standard errors.
const ROUND_CHUNKS: usize = 8;
/// Coalitions valued per chunk. Fixed, not the game's preference, so that every game sees
/// the same orderings for the same seed (linearity holds sample by sample, and a Python
/// callable gets the very orderings its native twin gets).
const CHUNK_COALITIONS: usize = 4096;
/// Units drawn before a standard error is trusted for stopping.
const MIN_UNITS_FOR_STOPPING: u64 = 16;
/// Weight, in units, of the players' mean variance in each player's (see
/// [`Moments::stderr`]). Measured on the families of tests/test_shapley_calibration.py
/// (n = 16, 200 seeds): at 10 antithetic pairs, voting covered 66% without the pooling, 90%
/// with a weight of 4, 95% with 8, 94% with 16; precedence's 20 orderings, voting: 71%, 89%,
/// 89%, 94%. From 300 units on every weight gives the same 94-96%.
const POOLED_DOF: usize = 16;

pub use crate::rng::stream;

/// Runs `work` on `n_items` items, in parallel unless `sequential`, results in item order.
pub fn map_items<T: Send>(
    sequential: bool,
    n_items: usize,
    work: impl Fn(usize) -> Result<T> + Sync + Send,
) -> Result<Vec<T>> {
    // One item gains nothing from the pool (and a call nested in a per-trace loop would pay
    // its overhead once per trace).
    if sequential || n_items <= 1 {
        (0..n_items).map(work).collect()
    } else {
        (0..n_items).into_par_iter().map(work).collect()
    }
}

/// Draws the orderings of one estimator.
pub trait OrderSampler: Sync {
    /// Fills `order` with a random ordering of all players.
    fn sample(&self, rng: &mut Xoshiro256PlusPlus, order: &mut Vec<u32>, scratch: &mut Vec<u32>);
    /// True when the reversed ordering has the same law, so units are antithetic pairs.
    fn antithetic(&self) -> bool;
}

/// Per-player sums of unit contributions and of their squares.
#[derive(Clone)]
pub struct Moments {
    pub units: u64,
    pub sum: Vec<f64>,
    pub sum_squares: Vec<f64>,
}

impl Moments {
    pub fn new(n: usize) -> Self {
        Moments { units: 0, sum: vec![0.0; n], sum_squares: vec![0.0; n] }
    }

    pub fn add(&mut self, unit: &[f64]) {
        self.units += 1;
        for (i, &x) in unit.iter().enumerate() {
            self.sum[i] += x;
            self.sum_squares[i] += x * x;
        }
    }

    pub fn merge(&mut self, other: &Moments) {
        self.units += other.units;
        for i in 0..self.sum.len() {
            self.sum[i] += other.sum[i];
            self.sum_squares[i] += other.sum_squares[i];
        }
    }

    pub fn mean(&self) -> Vec<f64> {
        self.sum.iter().map(|s| s / self.units as f64).collect()
    }

    /// Standard error of each mean (NaN below two units), calibrated for few units: each
    /// player's sample variance is moderated toward the players' mean variance as if that
    /// mean came from [`POOLED_DOF`] more units (Smyth's moderated t, 2004), and the error is
    /// scaled by t(units - 1 + POOLED_DOF) / 1.96, so that value +- 1.96 stderr is a 95%
    /// interval. Without the pooling a player whose rare marginal contribution (a swing of a
    /// voting game) no ordering happened to show has stderr 0 however wrong its value: five
    /// antithetic pairs on 16 players covered 46% on weighted voting and 88-91% on SOUM
    /// games; with it 95-97% (tests/test_shapley_calibration.py). A null player's stderr is
    /// the floor, no longer 0.
    pub fn stderr(&self) -> Vec<f64> {
        if self.units < 2 {
            return vec![f64::NAN; self.sum.len()];
        }
        let m = self.units as f64;
        let variances: Vec<f64> = self
            .sum
            .iter()
            .zip(&self.sum_squares)
            .map(|(s, q)| {
                let mean = s / m;
                (q / m - mean * mean).max(0.0) * m / (m - 1.0)
            })
            .collect();
        let pooled = variances.iter().sum::<f64>() / variances.len() as f64;
        let dof = m - 1.0;
        let scale = z_scale(self.units as usize - 1 + POOLED_DOF);
        let prior = POOLED_DOF as f64;
        variances.iter().map(|v| ((dof * v + prior * pooled) / (dof + prior) / m).sqrt() * scale).collect()
    }
}

/// Averages marginal contributions over orderings drawn by `sampler` until the budget is
/// spent or the largest standard error reaches the target.
pub fn estimate_by_orderings(game: &dyn Game, sampler: &dyn OrderSampler, stopping: &Stopping) -> Result<Estimate> {
    let n = game.n_players();
    // The empty and the grand coalition are valued once and each ordering adds n - 1 more;
    // a noisy game draws all n + 1 of every ordering afresh.
    let (once, order_cost) = match game.draws_per_request() {
        None => (2, n.saturating_sub(1).max(1) as u64),
        Some(repeats) => (0, (n + 1) as u64 * repeats),
    };
    // Antithetic pairs only when two fit: one pair gives no standard error, and the budget
    // left beside it (up to a pair's cost) would go unspent; plain orderings give both.
    let pairs_fit = stopping.budget.saturating_sub(once) / (2 * order_cost) >= 2;
    let orders_per_unit = if sampler.antithetic() && pairs_fit { 2 } else { 1 };
    let unit_cost = orders_per_unit as u64 * order_cost;
    if stopping.budget < once + unit_cost {
        return Err(MasreplayError::InvalidArgument(format!(
            "budget: {} evaluations cannot cover one sampled {} (needs at least {})",
            stopping.budget,
            if orders_per_unit == 2 { "antithetic pair of orderings" } else { "ordering" },
            once + unit_cost
        )));
    }
    let max_units = (stopping.budget - once) / unit_cost;
    let units_per_chunk = (CHUNK_COALITIONS / ((n + 1) * orders_per_unit)).max(1) as u64;
    let mut moments = Moments::new(n);
    let mut next_chunk = 0u64;
    loop {
        let remaining = max_units - moments.units;
        let chunks = remaining.div_ceil(units_per_chunk).min(ROUND_CHUNKS as u64) as usize;
        let first = next_chunk;
        let results = map_items(game.sequential(), chunks, |c| {
            let chunk = first + c as u64;
            let units = units_per_chunk.min(remaining - c as u64 * units_per_chunk);
            run_chunk(game, sampler, stopping.seed, chunk, units as usize, orders_per_unit)
        })?;
        next_chunk += chunks as u64;
        for chunk in &results {
            moments.merge(chunk);
        }
        let reached = stopping.target_stderr.is_some_and(|target| {
            moments.units >= MIN_UNITS_FOR_STOPPING && moments.stderr().iter().all(|&e| e <= target)
        });
        if reached || moments.units >= max_units {
            let stderr = moments.stderr();
            return Ok(Estimate {
                values: moments.mean(),
                converged: stopping.converged(&stderr),
                stderr,
                evaluations: once + moments.units * unit_cost,
                exact: false,
            });
        }
    }
}

fn run_chunk(
    game: &dyn Game,
    sampler: &dyn OrderSampler,
    seed: u64,
    chunk: u64,
    units: usize,
    orders_per_unit: usize,
) -> Result<Moments> {
    let n = game.n_players();
    let mut rng = stream(seed, chunk);
    let mut scratch = Vec::new();
    let mut orders = Vec::with_capacity(units * orders_per_unit);
    for _ in 0..units {
        let mut order = Vec::with_capacity(n);
        sampler.sample(&mut rng, &mut order, &mut scratch);
        if orders_per_unit == 2 {
            orders.push(order.iter().rev().copied().collect());
        }
        orders.push(order);
    }
    let values = prefix_values(game, &orders)?;
    let mut moments = Moments::new(n);
    let mut unit = vec![0.0; n];
    let scale = 1.0 / orders_per_unit as f64;
    for (u, group) in orders.chunks_exact(orders_per_unit).enumerate() {
        unit.fill(0.0);
        for (o, order) in group.iter().enumerate() {
            let prefix = &values[(u * orders_per_unit + o) * (n + 1)..][..n + 1];
            for (k, &player) in order.iter().enumerate() {
                unit[player as usize] += scale * (prefix[k + 1] - prefix[k]);
            }
        }
        moments.add(&unit);
    }
    Ok(moments)
}
