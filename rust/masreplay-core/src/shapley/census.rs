//! Near-complete enumeration ("census"), for budgets that reach most of the 2^n coalitions.
//!
//! Whole coalition sizes are valued while they fit, the smallest and largest first (as
//! KernelSHAP's sampling does, kernel.rs); what is left of the budget is drawn without
//! replacement from the middle sizes that do not fit, in proportion to their counts. A
//! surrogate fitted on the valued coalitions near the middle stands in for the coalitions left
//! out, and the Shapley formula runs over all 2^n of them. A difference estimator keeps the
//! result unbiased: each drawn size adds its drawn coalitions' cross-fitted residuals, scaled
//! to the coalitions left out (M_s / m_s), and the spread of those residuals under sampling
//! without replacement gives the standard error (t-scaled on the Welch-Satterthwaite degrees of
//! freedom over the drawn sizes). A coalition strictly between the empty and the grand one adds
//! as much to its members' values as it takes from the others', so the values sum to
//! v(N) - v(empty) whatever the surrogate.
//!
//! Where KernelSHAP's regression gives a coalition left out the additive model's value, the
//! surrogate here holds the interactions: a polynomial in the memberships with every product of
//! up to [`MAX_DEGREE`] players that the training coalitions can carry, and, on a game whose
//! values take two levels (a vote, a task that succeeds or fails), the non-decreasing step
//! function of the linear fit's score (pooled adjacent violators). Each is fitted without
//! each of [`FOLDS`] folds in turn; the one whose held-out residuals on the drawn sizes are
//! smallest is used, and those held-out residuals are the ones the estimate adds.

use rand::RngExt;

use super::coalition::Coalitions;
use super::exact::{binomial, shapley_weights};
use super::game::{Game, bounds};
use super::linalg::cholesky;
use super::msr::{t_scaled, variance_of_variance};
use super::pipeline::value_drawn;
use super::sampling::stream;
use super::{Estimate, Stopping};
use crate::error::{MasreplayError, Result};
use crate::interrupt::checkpoint;

/// The most players: coalitions are held as one 64-bit mask, and every one of the 2^n is
/// visited (2^26 is 64 M coalitions).
pub const MAX_PLAYERS: usize = 26;
/// The smallest share of the 2^n coalitions the budget must reach: below it the surrogate
/// would stand in for most of the game (use msr or kernel there).
pub const MIN_SHARE_OF_COALITIONS: f64 = 0.5;
/// Folds of the cross-fit.
const FOLDS: usize = 10;
/// Largest number of players in one product feature.
const MAX_DEGREE: usize = 3;
/// Most features of the polynomial, and the fewest training coalitions per feature.
const MAX_FEATURES: usize = 600;
const ROWS_PER_FEATURE: usize = 4;
/// Most multiply-adds spent accumulating the Gram matrices (training rows x active features
/// squared): a degree whose Gram would cost more is not fitted.
const MAX_GRAM_WORK: f64 = 4e9;
/// Sizes on either side of the drawn ones whose coalitions also train the surrogate.
const TRAINING_MARGIN: usize = 2;
/// Ridge, relative to the Gram matrix's mean diagonal: only against exact collinearity.
const RIDGE: f64 = 1e-10;
/// Residuals within this share of the largest value are rounding.
const ROUNDING: f64 = 1e-8;
/// Rows between two polls for an interrupt.
const POLL_ROWS: usize = 1 << 14;

/// The coalitions of `k` players among `n`, C(n, k) (exact: n <= MAX_PLAYERS).
fn coalitions_of_size(n: usize, k: usize) -> u64 {
    binomial(n, k) as u64
}

/// Every mask of `size` players among `n`, in increasing order (Gosper's hack).
fn masks_of_size(n: usize, size: usize) -> Vec<u64> {
    if size == 0 {
        return vec![0];
    }
    let mut out = Vec::with_capacity(coalitions_of_size(n, size) as usize);
    let mut mask: u64 = (1 << size) - 1;
    while mask < 1 << n {
        out.push(mask);
        let lowest = mask & mask.wrapping_neg();
        let carried = mask + lowest;
        mask = carried | (((mask ^ carried) >> 2) / lowest);
    }
    out
}

/// The sizes valued whole and, for each of the others, how many of its coalitions are drawn.
struct Plan {
    whole: Vec<usize>,
    drawn: Vec<(usize, usize)>,
}

fn plan(n: usize, budget: u64) -> Plan {
    let mut left = budget - 2;
    let (mut whole, mut low) = (Vec::new(), 1);
    while low <= n - low {
        let high = n - low;
        let pairs = if low == high { coalitions_of_size(n, low) } else { 2 * coalitions_of_size(n, low) };
        if pairs > left {
            break;
        }
        whole.extend(if low == high { vec![low] } else { vec![low, high] });
        left -= pairs;
        low += 1;
    }
    let rest: Vec<usize> = (low..=n - low).collect();
    let counts: Vec<u64> = rest.iter().map(|&s| coalitions_of_size(n, s)).collect();
    let total: u64 = counts.iter().sum();
    // Shares proportional to the counts, rounded down, and what rounding left one by one.
    let mut drawn: Vec<(usize, usize)> = rest
        .iter()
        .zip(&counts)
        .map(|(&s, &c)| (s, (left as u128 * c as u128 / total.max(1) as u128) as usize))
        .collect();
    let mut spare = left as usize - drawn.iter().map(|d| d.1).sum::<usize>();
    while spare > 0 {
        for ((_, m), &c) in drawn.iter_mut().zip(&counts) {
            if spare > 0 && (*m as u64) < c {
                *m += 1;
                spare -= 1;
            }
        }
    }
    Plan { whole, drawn }
}

pub fn census(game: &dyn Game, stopping: &Stopping) -> Result<Estimate> {
    let n = game.n_players();
    if n > MAX_PLAYERS {
        return Err(MasreplayError::InvalidArgument(format!(
            "method='census' enumerates the 2^n coalitions; n = {n} exceeds {MAX_PLAYERS}"
        )));
    }
    let all = 1u64 << n;
    let budget = stopping.budget.min(all);
    if (budget as f64) < MIN_SHARE_OF_COALITIONS * all as f64 {
        return Err(MasreplayError::InvalidArgument(format!(
            "budget: method='census' values at least half of the 2^{n} = {all} coalitions, budget={} reaches {:.0}% \
             (msr or kernel estimate from fewer)",
            stopping.budget,
            100.0 * budget as f64 / all as f64
        )));
    }
    let (empty, full) = bounds(game)?;
    if n == 1 {
        return Ok(Estimate::of_one_player(full - empty).with_target(stopping));
    }
    let Plan { whole, drawn } = plan(n, budget);
    // Each drawn size: its coalitions shuffled in part, the first m drawn, the rest left out.
    let mut sampled = Vec::with_capacity(drawn.len());
    for &(size, m) in &drawn {
        let mut masks = masks_of_size(n, size);
        let mut rng = stream(stopping.seed, size as u64);
        for k in 0..m.min(masks.len().saturating_sub(1)) {
            let pick = rng.random_range(k..masks.len());
            masks.swap(k, pick);
        }
        sampled.push((size, m, masks));
    }
    let mut batch = Coalitions::new(n);
    let mut sizes = Vec::new();
    for &size in &whole {
        for mask in masks_of_size(n, size) {
            batch.push_mask(mask);
            sizes.push(size);
        }
    }
    for (size, m, masks) in &sampled {
        for &mask in &masks[..*m] {
            batch.push_mask(mask);
            sizes.push(*size);
        }
    }
    let valued = value_drawn(game, &batch, &mut (), |_, _, _| {})?;
    let masks: Vec<u64> = batch.iter().map(|set| set[0]).collect();
    let rows = Rows { masks: &masks, worth: &valued.worth, sizes: &sizes };
    let fitted = if drawn.iter().all(|&(size, m)| m as u64 == coalitions_of_size(n, size)) {
        None
    } else {
        Some(Surrogate::fit(n, &rows, &drawn, empty, full)?)
    };

    // phi_i = sum over all coalitions T of c_i(T) u(T), c_i(T) = w(|T| - 1) for members and
    // -w(|T|) for the others; u(T) is v(T) for a valued coalition, plus its residual times
    // M_s / m_s for a drawn one, and the surrogate's value for one left out.
    let weights = shapley_weights(n);
    let mut values = vec![0.0; n];
    let mut add = |mask: u64, value: f64| {
        let size = mask.count_ones() as usize;
        let (inside, outside) =
            (if size > 0 { weights[size - 1] } else { 0.0 }, if size < n { weights[size] } else { 0.0 });
        for (i, phi) in values.iter_mut().enumerate() {
            *phi += if mask >> i & 1 == 1 { inside * value } else { -outside * value };
        }
    };
    add(0, empty);
    add(all - 1, full);
    let residual = fitted.as_ref().map(|f| &f.residual);
    for (k, (&mask, &worth)) in masks.iter().zip(&valued.worth).enumerate() {
        let scaled = match residual.and_then(|r| r[k]) {
            Some((residual, scale)) => worth + scale * residual,
            None => worth,
        };
        add(mask, scaled);
    }
    // Per player, the variance of the estimate and the variance of that variance (from the
    // fourth moment: a two-level game's residuals are mostly zero with rare misses, far fewer
    // degrees of freedom than their count), summed over the drawn sizes; a size with
    // coalitions left out but fewer than two drawn leaves the error unknown.
    let (mut variance, mut unsureness, mut unknown) = (vec![0.0; n], vec![0.0; n], false);
    if let Some(fitted) = &fitted {
        // A step function can misclassify a coalition near the quota that no draw showed it:
        // on a two-level game a size whose drawn coalitions it all fits may still hide a miss
        // of up to |v(N) - v(empty)| among those left out.
        let largest_miss = if matches!(fitted.model, Model::Steps(..)) { (full - empty).abs() } else { 0.0 };
        // The drawn coalitions follow the whole sizes' in the batch, size by size.
        let mut first = masks.len() - sampled.iter().map(|(_, m, _)| m).sum::<usize>();
        for (size, m, every) in &sampled {
            let rows = first..first + m;
            first += m;
            for &mask in &every[*m..] {
                add(mask, fitted.predict(mask));
            }
            let (count, m) = (every.len() as f64, *m as f64);
            if m >= count {
                continue;
            }
            if m < 2.0 {
                unknown = true;
                continue;
            }
            // N_s / m_s times the sum of x = c_i(T) r(T) over m_s coalitions drawn without
            // replacement: variance N_s^2 (1 - m_s / N_s) S_x^2 / m_s.
            let scale = count * count * (1.0 - m / count) / m;
            let (inside, outside) = (weights[size - 1], -weights[*size]);
            let drawn: Vec<(u64, f64)> = rows.filter_map(|k| fitted.residual[k].map(|(r, _)| (masks[k], r))).collect();
            let x = |i: usize, (mask, r): (u64, f64)| if mask >> i & 1 == 1 { inside * r } else { outside * r };
            if largest_miss > 0.0 && drawn.iter().all(|&(_, r)| r == 0.0) {
                // No miss in m draws: Jeffreys' posterior mean rate of misses, 0.5 / (m + 1),
                // each of the largest size, as the variance of the coalitions left out (a
                // prior's, not an estimate's: no t inflation). Without it such a size reads as
                // exact, and the values carried a rounding-sized stderr with a whole miss in 3%
                // of runs (n = 12, 3,700).
                let rate = 0.5 / (m + 1.0);
                for (i, variance) in variance.iter_mut().enumerate() {
                    let c2 = drawn.iter().map(|&(mask, _)| x(i, (mask, 1.0)).powi(2)).sum::<f64>() / m;
                    *variance += scale * rate * largest_miss * largest_miss * c2;
                }
                continue;
            }
            for i in 0..n {
                let mean = drawn.iter().map(|&d| x(i, d)).sum::<f64>() / m;
                let (second, fourth) = drawn.iter().fold((0.0, 0.0), |(second, fourth), &d| {
                    let square = (x(i, d) - mean).powi(2);
                    (second + square, fourth + square * square)
                });
                let spread = second / (m - 1.0);
                variance[i] += scale * spread;
                unsureness[i] += scale * scale * variance_of_variance(spread, fourth / m, m, FOLDS);
            }
        }
    }
    // Residuals within ROUNDING of the largest value count as none (Surrogate::fit): what
    // they can add to a value, over the coalitions left out, is its least standard error.
    let largest = valued.worth.iter().chain([&empty, &full]).fold(0.0f64, |a, v| a.max(v.abs()));
    let rounding: f64 = sampled
        .iter()
        .filter(|_| fitted.is_some())
        .map(|(size, m, every)| (every.len() - m) as f64 * weights[size - 1].max(weights[*size]))
        .sum::<f64>()
        * ROUNDING
        * largest;
    let stderr = if unknown {
        vec![f64::NAN; n]
    } else {
        t_scaled(&variance, &unsureness).into_iter().map(|e| e.max(rounding)).collect()
    };
    let exact = fitted.is_none();
    Ok(Estimate { values, stderr, evaluations: 2 + valued.distinct as u64, converged: exact, exact }
        .with_target(stopping))
}

/// The valued coalitions: mask, value and size, position by position.
struct Rows<'a> {
    masks: &'a [u64],
    worth: &'a [f64],
    sizes: &'a [usize],
}

/// The surrogate chosen by the cross-fit, and each drawn coalition's held-out residual with the
/// factor it is scaled by (M_s / m_s); None for the coalitions of whole sizes.
struct Surrogate {
    model: Model,
    residual: Vec<Option<(f64, f64)>>,
}

enum Model {
    Polynomial(Polynomial, Vec<f64>),
    Steps(Vec<f64>, Staircase),
}

impl Surrogate {
    fn fit(n: usize, rows: &Rows, drawn: &[(usize, usize)], empty: f64, full: f64) -> Result<Self> {
        let (lowest, highest) = (drawn[0].0, drawn[drawn.len() - 1].0);
        let training: Vec<usize> = (0..rows.masks.len())
            .filter(|&k| rows.sizes[k] + TRAINING_MARGIN >= lowest && rows.sizes[k] <= highest + TRAINING_MARGIN)
            .collect();
        let fold_of = |t: usize| t % FOLDS;
        let scored: Vec<bool> = training.iter().map(|&k| drawn.iter().any(|&(s, _)| s == rows.sizes[k])).collect();
        let mut candidates = Vec::new();
        let degree = Polynomial::largest_degree(n, &training, rows);
        let polynomial = Polynomial::new(n, degree);
        let (mut fits, held_out) = polynomial.cross_fit(&training, rows, fold_of)?;
        let all_folds = fits.pop().expect("the all-fold fit comes last");
        candidates.push((Model::Polynomial(polynomial, all_folds), held_out));
        // A game of two levels: a non-decreasing step function of the linear fit's score.
        if rows.worth.iter().all(|&v| v == empty || v == full) && empty != full {
            let (fits, _) = Polynomial::new(n, 1).cross_fit(&training, rows, fold_of)?;
            let mut held_out = vec![0.0; training.len()];
            for (fold, coefficients) in fits.iter().enumerate().take(FOLDS) {
                let train: Vec<(f64, f64)> = (0..training.len())
                    .filter(|&t| fold_of(t) != fold)
                    .map(|t| (linear_score(coefficients, rows.masks[training[t]]), rows.worth[training[t]]))
                    .collect();
                let staircase = Staircase::new(train);
                for t in (0..training.len()).filter(|&t| fold_of(t) == fold) {
                    let k = training[t];
                    held_out[t] = rows.worth[k] - staircase.at(linear_score(coefficients, rows.masks[k]));
                }
            }
            let all_folds = fits.last().expect("the all-fold fit comes last").clone();
            let staircase = Staircase::new(
                training.iter().map(|&k| (linear_score(&all_folds, rows.masks[k]), rows.worth[k])).collect(),
            );
            candidates.push((Model::Steps(all_folds, staircase), held_out));
        }
        let error =
            |held_out: &[f64]| -> f64 { held_out.iter().zip(&scored).filter(|(_, s)| **s).map(|(r, _)| r * r).sum() };
        let best = (0..candidates.len())
            .min_by(|&a, &b| error(&candidates[a].1).total_cmp(&error(&candidates[b].1)))
            .expect("the polynomial is always a candidate");
        let (model, held_out) = candidates.swap_remove(best);
        // A residual at the fits' rounding (a surrogate that holds the game exactly) is none:
        // its spread would be a standard error of rounding that the values' own rounding exceeds.
        let largest = rows.worth.iter().chain([&empty, &full]).fold(0.0f64, |a, v| a.max(v.abs()));
        let mut residual = vec![None; rows.masks.len()];
        for (t, &k) in training.iter().enumerate() {
            if let Some(&(size, m)) = drawn.iter().find(|&&(s, _)| s == rows.sizes[k]) {
                let count = binomial(n, size);
                let r = if held_out[t].abs() <= ROUNDING * largest { 0.0 } else { held_out[t] };
                residual[k] = Some((r, (count - m as f64) / m as f64));
            }
        }
        Ok(Surrogate { model, residual })
    }

    fn predict(&self, mask: u64) -> f64 {
        match &self.model {
            Model::Polynomial(polynomial, coefficients) => polynomial.predict(coefficients, mask),
            Model::Steps(linear, staircase) => staircase.at(linear_score(linear, mask)),
        }
    }
}

/// Products of up to `degree` members: feature 0 the constant, then players, pairs, triples.
struct Polynomial {
    n: usize,
    degree: usize,
    pairs: Vec<u32>,
    triples: Vec<u32>,
    features: usize,
}

impl Polynomial {
    fn count(n: usize, degree: usize) -> usize {
        (0..=degree).map(|d| coalitions_of_size(n, d) as usize).sum()
    }

    /// The largest degree whose features the training rows carry (enough rows per feature,
    /// a bounded Gram matrix and a bounded cost to accumulate it).
    fn largest_degree(n: usize, training: &[usize], rows: &Rows) -> usize {
        let widest = training.iter().map(|&k| rows.sizes[k]).max().unwrap_or(0);
        (1..=MAX_DEGREE)
            .rev()
            .find(|&d| {
                let features = Self::count(n, d);
                let active = Self::count(widest, d) as f64;
                features <= MAX_FEATURES
                    && features * ROWS_PER_FEATURE <= training.len()
                    && training.len() as f64 * active * active <= MAX_GRAM_WORK
            })
            .unwrap_or(1)
    }

    fn new(n: usize, degree: usize) -> Self {
        let mut next = 1 + n as u32;
        let mut pairs = vec![0; if degree >= 2 { n * n } else { 0 }];
        for a in 0..n {
            for b in a + 1..n {
                if degree >= 2 {
                    pairs[a * n + b] = next;
                    next += 1;
                }
            }
        }
        let mut triples = vec![0; if degree >= 3 { n * n * n } else { 0 }];
        for a in 0..n {
            for b in a + 1..n {
                for c in b + 1..n {
                    if degree >= 3 {
                        triples[(a * n + b) * n + c] = next;
                        next += 1;
                    }
                }
            }
        }
        Polynomial { n, degree, pairs, triples, features: next as usize }
    }

    /// Calls `f` with each feature a coalition holds (each 1; every other is 0), in increasing
    /// order; no allocation: it runs once per training row and per coalition left out.
    fn for_each_active(&self, mask: u64, mut f: impl FnMut(usize)) {
        let n = self.n;
        let mut players = [0usize; MAX_PLAYERS];
        let mut len = 0;
        for i in (0..n).filter(|&i| mask >> i & 1 == 1) {
            players[len] = i;
            len += 1;
        }
        let members = &players[..len];
        f(0);
        members.iter().for_each(|&a| f(1 + a));
        if self.degree >= 2 {
            for (x, &a) in members.iter().enumerate() {
                for &b in &members[x + 1..] {
                    f(self.pairs[a * n + b] as usize);
                }
            }
        }
        if self.degree >= 3 {
            for (x, &a) in members.iter().enumerate() {
                for (y, &b) in members.iter().enumerate().skip(x + 1) {
                    for &c in &members[y + 1..] {
                        f(self.triples[(a * n + b) * n + c] as usize);
                    }
                }
            }
        }
    }

    fn active(&self, mask: u64, out: &mut Vec<usize>) {
        out.clear();
        self.for_each_active(mask, |f| out.push(f));
    }

    fn predict(&self, coefficients: &[f64], mask: u64) -> f64 {
        let mut sum = 0.0;
        self.for_each_active(mask, |f| sum += coefficients[f]);
        sum
    }

    /// Least-squares fits without each fold and on every fold (last), and each training row's
    /// residual under the fit that left its fold out.
    fn cross_fit(
        &self,
        training: &[usize],
        rows: &Rows,
        fold_of: impl Fn(usize) -> usize,
    ) -> Result<(Vec<Vec<f64>>, Vec<f64>)> {
        let p = self.features;
        let mut grams = vec![vec![0.0; p * p]; FOLDS];
        let mut rhs = vec![vec![0.0; p]; FOLDS];
        let mut active = Vec::new();
        for (t, &k) in training.iter().enumerate() {
            if t % POLL_ROWS == 0 {
                checkpoint()?;
            }
            let fold = fold_of(t);
            self.active(rows.masks[k], &mut active);
            let (gram, b) = (&mut grams[fold], &mut rhs[fold]);
            for (x, &f) in active.iter().enumerate() {
                b[f] += rows.worth[k];
                // Lower triangle: features are listed in increasing order.
                for &g in &active[..=x] {
                    gram[f * p + g] += 1.0;
                }
            }
        }
        let total: Vec<f64> = (0..p * p).map(|c| grams.iter().map(|g| g[c]).sum()).collect();
        let total_rhs: Vec<f64> = (0..p).map(|c| rhs.iter().map(|b| b[c]).sum()).collect();
        let ridge = RIDGE * (0..p).map(|f| total[f * p + f]).sum::<f64>() / p as f64 + f64::MIN_POSITIVE;
        let solve = |left_out: Option<usize>| -> Result<Vec<f64>> {
            let mut a = total.clone();
            let mut b = total_rhs.clone();
            if let Some(fold) = left_out {
                a.iter_mut().zip(&grams[fold]).for_each(|(x, g)| *x -= g);
                b.iter_mut().zip(&rhs[fold]).for_each(|(x, g)| *x -= g);
            }
            (0..p).for_each(|f| a[f * p + f] += ridge);
            let factor = cholesky(p, a).ok_or_else(|| {
                MasreplayError::InvalidArgument("census: the surrogate's normal equations are singular".into())
            })?;
            Ok(factor.solve(&b))
        };
        let mut fits = (0..FOLDS).map(|fold| solve(Some(fold))).collect::<Result<Vec<_>>>()?;
        fits.push(solve(None)?);
        let held_out = training
            .iter()
            .enumerate()
            .map(|(t, &k)| rows.worth[k] - self.predict(&fits[fold_of(t)], rows.masks[k]))
            .collect();
        Ok((fits, held_out))
    }
}

/// A coalition's score under a fit of degree 1 (the constant, then one slope per player).
fn linear_score(coefficients: &[f64], mask: u64) -> f64 {
    let slopes = &coefficients[1..];
    coefficients[0] + (0..slopes.len()).filter(|&i| mask >> i & 1 == 1).map(|i| slopes[i]).sum::<f64>()
}

/// A non-decreasing step function fitted by pooling adjacent violators: blocks of training
/// scores, each with the mean value of its points.
struct Staircase {
    /// (highest score in the block, mean value), scores increasing.
    blocks: Vec<(f64, f64)>,
}

impl Staircase {
    fn new(mut points: Vec<(f64, f64)>) -> Self {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        // (highest score, sum, count)
        let mut blocks: Vec<(f64, f64, f64)> = Vec::new();
        for (score, value) in points {
            let mut block = (score, value, 1.0);
            while let Some(&(_, sum, count)) = blocks.last() {
                if sum / count <= block.1 / block.2 {
                    break;
                }
                block = (block.0, sum + block.1, count + block.2);
                blocks.pop();
            }
            blocks.push(block);
        }
        Staircase { blocks: blocks.into_iter().map(|(top, sum, count)| (top, sum / count)).collect() }
    }

    /// The value of the first block reaching `score` (the last block's beyond them all).
    fn at(&self, score: f64) -> f64 {
        let k = self.blocks.partition_point(|&(top, _)| top < score);
        self.blocks[k.min(self.blocks.len() - 1)].1
    }
}

#[cfg(test)]
mod tests {
    use super::{Staircase, coalitions_of_size, masks_of_size, plan};

    #[test]
    fn the_plan_spends_the_budget_on_whole_sizes_then_draws_in_proportion() {
        for (n, budget) in [(10, 1000), (10, 512), (11, 1843), (12, 2500), (16, 60_000)] {
            let p = plan(n, budget);
            let whole: u64 = p.whole.iter().map(|&s| coalitions_of_size(n, s)).sum();
            let drawn: u64 = p.drawn.iter().map(|&(_, m)| m as u64).sum();
            assert_eq!(2 + whole + drawn, budget, "n = {n}, budget = {budget}");
            assert!(p.drawn.iter().all(|&(s, m)| m as u64 <= coalitions_of_size(n, s) && !p.whole.contains(&s)));
        }
    }

    #[test]
    fn masks_of_a_size_are_every_one_once() {
        for (n, size) in [(1, 1), (5, 0), (6, 3), (12, 5)] {
            let masks = masks_of_size(n, size);
            assert_eq!(masks.len() as u64, coalitions_of_size(n, size));
            assert!(masks.windows(2).all(|w| w[0] < w[1]) && masks.iter().all(|m| m.count_ones() as usize == size));
        }
    }

    #[test]
    fn the_staircase_pools_violators_into_a_non_decreasing_step() {
        let staircase = Staircase::new(vec![(0.0, 0.0), (1.0, 1.0), (2.0, 0.0), (3.0, 1.0), (4.0, 1.0)]);
        let steps: Vec<f64> = [-1.0, 0.0, 1.5, 2.0, 3.0, 9.0].iter().map(|&x| staircase.at(x)).collect();
        assert_eq!(steps, [0.0, 0.0, 0.5, 0.5, 1.0, 1.0]);
    }
}
