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

/// Per-player sums of unit contributions (the mean, its bits as before), and of their
/// deviations from the player's first contribution and of those deviations' squares: the
/// variance without the cancellation of a plain sum of squares (a player that antithetic pairs
/// estimate exactly has contributions equal to rounding, and squares of the raw values left
/// standard errors of 1e-8 on errors of 1e-14).
#[derive(Clone)]
pub struct Moments {
    pub units: u64,
    sum: Vec<f64>,
    shift: Vec<f64>,
    shifted: Vec<f64>,
    shifted_squares: Vec<f64>,
}

impl Moments {
    pub fn new(n: usize) -> Self {
        Moments {
            units: 0,
            sum: vec![0.0; n],
            shift: vec![0.0; n],
            shifted: vec![0.0; n],
            shifted_squares: vec![0.0; n],
        }
    }

    pub fn add(&mut self, unit: &[f64]) {
        if self.units == 0 {
            self.shift.copy_from_slice(unit);
        }
        self.units += 1;
        for (i, &x) in unit.iter().enumerate() {
            self.sum[i] += x;
            let d = x - self.shift[i];
            self.shifted[i] += d;
            self.shifted_squares[i] += d * d;
        }
    }

    pub fn merge(&mut self, other: &Moments) {
        if other.units == 0 {
            return;
        }
        if self.units == 0 {
            self.shift.copy_from_slice(&other.shift);
        }
        let count = other.units as f64;
        for i in 0..self.sum.len() {
            // `other`'s deviations re-centred on this shift: x - a = (x - b) + (b - a).
            let delta = other.shift[i] - self.shift[i];
            self.sum[i] += other.sum[i];
            self.shifted_squares[i] += other.shifted_squares[i] + delta * (2.0 * other.shifted[i] + count * delta);
            self.shifted[i] += other.shifted[i] + count * delta;
        }
        self.units += other.units;
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
        let variances: Vec<f64> =
            self.shifted.iter().zip(&self.shifted_squares).map(|(s, q)| (q - s * s / m).max(0.0) / (m - 1.0)).collect();
        moderated_stderr(&variances, self.units as usize - 1, m)
    }
}

/// Standard errors of means of `units` draws from per-player sample variances with `dof`
/// degrees of freedom, moderated toward the players' pool and t-scaled (see
/// [`Moments::stderr`]).
fn moderated_stderr(variances: &[f64], dof: usize, units: f64) -> Vec<f64> {
    // Two pools: every player's mean variance is the floor of a player whose contributions
    // never varied (a rare swing no ordering showed, or a null player); a player whose did
    // is moderated toward the mean of those that varied. In a sparse game most players
    // add nothing, and shrinking the active players toward a mean that counts them made
    // their intervals too short (4 active players of 16 covered 86-91% at 302
    // evaluations); where every player varies the two pools are one.
    let floor_pool = mean(variances.iter().copied());
    let varied_pool = mean(variances.iter().copied().filter(|&v| v > 0.0));
    // A player whose contributions never varied takes the floor with at least the weight of
    // its own units, half the pool from 17 units on: with the prior's fixed 16 units the floor
    // fell as 1 / units, and a voter whose few swings (1.7 expected in 100 orderings) all went
    // unseen had a floor of half its value (bench voting games, n = 100, 10,000 evaluations:
    // 0.851 coverage; 0.94-0.95 with the weight of its own units).
    let scale = z_scale(dof + POOLED_DOF);
    let (dof, prior) = (dof as f64, POOLED_DOF as f64);
    let floor_prior = prior.max(dof);
    variances
        .iter()
        .map(|&v| {
            let variance = if v > 0.0 {
                (dof * v + prior * varied_pool) / (dof + prior)
            } else {
                floor_prior * floor_pool / (dof + floor_prior)
            };
            (variance / units).sqrt() * scale
        })
        .collect()
}

/// The mean of `values` (0 for none).
fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, count) = values.fold((0.0, 0usize), |(s, c), v| (s + v, c + 1));
    if count == 0 { 0.0 } else { sum / count as f64 }
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
    // Antithetic pairs only when two fit: one pair gives no standard error. Where one pair
    // and one more ordering fit but not two pairs, the pair gives the values and the ordering
    // their errors (see [`one_pair_and_a_witness`]); elsewhere plain orderings give both.
    let orderings_fit = stopping.budget.saturating_sub(once) / order_cost;
    let pairs_fit = orderings_fit >= 4;
    if sampler.antithetic() && orderings_fit == 3 && n >= ONE_PAIR_FROM_PLAYERS {
        return one_pair_and_a_witness(game, sampler, stopping, once + 3 * order_cost);
    }
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
            add_contributions(order, &values[(u * orders_per_unit + o) * (n + 1)..][..n + 1], scale, &mut unit);
        }
        moments.add(&unit);
    }
    Ok(moments)
}

/// Adds `scale` times each player's marginal contribution along `order` (whose prefixes are
/// worth `prefix`) to `unit`.
fn add_contributions(order: &[u32], prefix: &[f64], scale: f64, unit: &mut [f64]) {
    for (k, &player) in order.iter().enumerate() {
        unit[player as usize] += scale * (prefix[k + 1] - prefix[k]);
    }
}

/// Players from which [`one_pair_and_a_witness`] replaces three plain orderings: its variance
/// ratio is a mean over the players, too noisy on few. Coverage over 200 seeds (the families of
/// tests/test_shapley_calibration.py, budget of three orderings), low / full order: n = 16
/// 0.903 / 0.899, n = 30 0.911 / 0.926 (plain orderings 0.948 / 0.986), n = 100 0.943 / 0.980
/// (0.949 / 0.987), n = 300 0.972 / 0.994 (0.958 / 0.996).
const ONE_PAIR_FROM_PLAYERS: usize = 100;

/// Lower bound on the variance ratio of [`one_pair_and_a_witness`]: an estimate of 0 (a pair
/// exact on a pairwise game, or a chance draw) must not give every player a stderr of 0.
const MIN_PAIR_VARIANCE_RATIO: f64 = 0.05;

/// Values from one antithetic pair of orderings, errors from one more, independent ordering:
/// for budgets of three orderings but not four (n = 300 at 1,000 evaluations). Three plain
/// orderings there had 1.4x the pair's error on low-order games (MAE 0.0505 against 0.0356,
/// 5 seeds), and a pair alone has no standard error. With m1, m2 a player's contributions in
/// the pair and m3 in the witness, ((m3 - m1)^2 + (m3 - m2)^2) / 4 estimates the variance V
/// of one ordering's contribution (m3 is independent of both), moderated toward the players'
/// pool as [`Moments::stderr`] does; the pair's mean has variance rho V, where rho = (A - D) /
/// (A + D) from the players' mean A of (m3 - pair mean)^2 (expected V + rho V) and D of
/// (m1 - m2)^2 / 4 (expected V - rho V). Coverage at n = 300, 1,000 evaluations, 40 seeds
/// (numpy prototype): low order 0.958, full 0.992, voting 1.000, pairwise 1.000 (the pair is
/// exact there); three plain orderings 0.957, 0.995, 1.000, 0.969. From
/// [`ONE_PAIR_FROM_PLAYERS`] players only.
fn one_pair_and_a_witness(
    game: &dyn Game,
    sampler: &dyn OrderSampler,
    stopping: &Stopping,
    evaluations: u64,
) -> Result<Estimate> {
    let n = game.n_players();
    let mut rng = stream(stopping.seed, 0);
    let mut scratch = Vec::new();
    let mut first = Vec::with_capacity(n);
    sampler.sample(&mut rng, &mut first, &mut scratch);
    let mut witness = Vec::with_capacity(n);
    sampler.sample(&mut rng, &mut witness, &mut scratch);
    let reverse: Vec<u32> = first.iter().rev().copied().collect();
    let orders = [first, reverse, witness];
    let values = prefix_values(game, &orders)?;
    let mut contributions = vec![vec![0.0; n]; 3];
    for (k, (order, unit)) in orders.iter().zip(contributions.iter_mut()).enumerate() {
        add_contributions(order, &values[k * (n + 1)..][..n + 1], 1.0, unit);
    }
    let [m1, m2, m3] = [&contributions[0], &contributions[1], &contributions[2]];
    let pair: Vec<f64> = m1.iter().zip(m2).map(|(a, b)| 0.5 * (a + b)).collect();
    let spread = mean(m1.iter().zip(m2).map(|(a, b)| 0.25 * (a - b) * (a - b)));
    let off_pair = mean(m3.iter().zip(&pair).map(|(c, p)| (c - p) * (c - p)));
    let ratio = if off_pair + spread > 0.0 { (off_pair - spread) / (off_pair + spread) } else { 0.0 };
    let ratio = ratio.clamp(MIN_PAIR_VARIANCE_RATIO, 1.0);
    let variances: Vec<f64> =
        m3.iter().zip(m1.iter().zip(m2)).map(|(c, (a, b))| 0.25 * ((c - a) * (c - a) + (c - b) * (c - b))).collect();
    let stderr = moderated_stderr(&variances, 1, 1.0).into_iter().map(|e| e * ratio.sqrt()).collect::<Vec<_>>();
    Ok(Estimate { values: pair, converged: stopping.converged(&stderr), stderr, evaluations, exact: false })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shapley::games::WeightedVotingGame;
    use crate::shapley::permutation::UniformOrderings;

    /// Exact Shapley values of a weighted voting game with integer weights: the others'
    /// coalitions counted by size and weight, those a player swings weighted by s! (n-s-1)! / n!.
    fn voting_shapley(weights: &[usize], quota: f64) -> Vec<f64> {
        let (n, total) = (weights.len(), weights.iter().sum::<usize>());
        // s! (n - s - 1)! / n! = 1 / (n C(n-1, s)), built up to stay in range.
        let mut shares = vec![1.0 / n as f64; n];
        for s in 1..n {
            shares[s] = shares[s - 1] * s as f64 / (n - s) as f64;
        }
        (0..n)
            .map(|i| {
                let mut counts = vec![vec![0.0f64; total + 1]; n];
                counts[0][0] = 1.0;
                for (_, &w) in weights.iter().enumerate().filter(|&(j, _)| j != i) {
                    for s in (1..n).rev() {
                        for t in (w..=total).rev() {
                            counts[s][t] += counts[s - 1][t - w];
                        }
                    }
                }
                let swung = |t: usize| (t as f64) < quota && (t + weights[i]) as f64 >= quota;
                (0..n).map(|s| shares[s] * (0..=total).filter(|&t| swung(t)).map(|t| counts[s][t]).sum::<f64>()).sum()
            })
            .collect()
    }

    #[test]
    fn voters_whose_few_swings_went_unseen_are_covered_at_a_hundred_players() {
        // Weights 1-5 (the bench's voting family), 50 antithetic pairs: a weight-5 voter swings
        // in 1.7 of 100 orderings on average, and with the floor at the prior's 16 units of 65
        // the voters that showed none covered too seldom (0.84 over all voters).
        let weights: Vec<usize> = (0..100).map(|i| 1 + i % 5).collect();
        let quota = 0.6 * weights.iter().sum::<usize>() as f64;
        let truth = voting_shapley(&weights, quota);
        let game = WeightedVotingGame::new(weights.iter().map(|&w| w as f64).collect(), quota).expect("a valid game");
        let sampler = UniformOrderings { n_players: 100, antithetic: true };
        let (mut hits, mut count) = (0usize, 0usize);
        for seed in 0..40 {
            let stopping = Stopping { budget: 10_000, target_stderr: None, seed, per_request: 1 };
            let estimate = estimate_by_orderings(&game, &sampler, &stopping).expect("estimated");
            for ((value, stderr), exact) in estimate.values.iter().zip(&estimate.stderr).zip(&truth) {
                hits += usize::from((value - exact).abs() <= 1.96 * stderr);
                count += 1;
            }
        }
        let coverage = hits as f64 / count as f64;
        assert!((0.93..=0.97).contains(&coverage), "coverage {coverage}");
    }

    fn moments_of(units: &[[f64; 2]]) -> Moments {
        let mut moments = Moments::new(2);
        units.iter().for_each(|unit| moments.add(unit));
        moments
    }

    #[test]
    fn merged_chunks_give_the_moments_of_all_units_and_an_exact_player_no_spread() {
        // Player 0 is estimated exactly (the same contribution every unit, far from zero: a
        // plain sum of squares leaves ~1e-8 of noise in its error there); player 1 varies.
        let units: Vec<[f64; 2]> = (0..10).map(|k| [1e4 + 0.1, (k as f64 * 0.7).sin()]).collect();
        let whole = moments_of(&units);
        let mut merged = Moments::new(2);
        for chunk in [&units[..3], &units[3..4], &units[4..], &units[..0]] {
            merged.merge(&moments_of(chunk));
        }
        assert_eq!(merged.units, 10);
        for (a, b) in whole.stderr().iter().zip(merged.stderr()) {
            assert!((a - b).abs() <= 1e-14 * a, "{a} vs {b}");
        }
        let values: Vec<f64> = units.iter().map(|u| u[1]).collect();
        let mean = values.iter().sum::<f64>() / 10.0;
        let variance = values.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 9.0;
        let scale = z_scale(9 + POOLED_DOF);
        // Player 1, the only one that varied, is its own pool: its variance stands.
        let own = (variance / 10.0).sqrt() * scale;
        // Player 0 gets the floor, 16 / 25 of every player's mean: exactly, no rounding noise.
        let floor = (16.0 / 25.0 * variance / 2.0 / 10.0).sqrt() * scale;
        let stderr = whole.stderr();
        assert!((stderr[1] - own).abs() <= 1e-12 * own, "{} vs {own}", stderr[1]);
        assert!((stderr[0] - floor).abs() <= 1e-12 * floor, "{} vs {floor}", stderr[0]);
    }
}
