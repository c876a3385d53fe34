//! Precedence (spawn-tree) values of a noisy game by maximum sample reuse: every valued
//! down-set informs every player on its border, as an MSR coalition informs every player
//! (msr.rs), where a sampled ordering informs each player through one marginal contribution.
//!
//! Cutting a uniform tree-respecting ordering after k players leaves a down-set S with
//! probability q_k(S) = e(S) e(N - S) / e(F), e counting the orderings of a forest that put
//! parents first (k! / prod h over its players, h the subtree sizes: hook lengths). The
//! precedence value splits by k (the players before i form S - i with i a leaf of S, or S with
//! i a root of N - S):
//!   phi_i = sum_{k=0}^{n} E_{q_k}[v(S) w_i(S)],
//!   w_i(S) = e(S - i) / e(S) = (1/k) prod_{a above i} h_S(a) / (h_S(a) - 1)   i a leaf of S,
//!   w_i(S) = -e(N - S - i) / e(N - S) = -h(i) / (n - k)                      i a root of N - S,
//! and 0 for the other players (h_S the subtree sizes inside S). Without a forest these are
//! MSR's 1/s and -1/(n - s). The weights of a down-set sum to zero over the players, but at the
//! empty (-1) and grand (+1) coalition, which are exact terms; the sizes 1..n-1 are strata,
//! sampled by cutting uniform orderings ([`Forest::sample_ordering`]), in proportion to
//! 1 / sqrt(k (n - k)) as MSR's sizes.
//!
//! A linear surrogate g(S) = c + sum_{j in S} b_j is the control variate: every ordering
//! credits i with b_i, so only v - g is sampled. Unbiased by cross-fitting: each stratum's
//! draws are dealt into folds, a fold's residuals taken from the surrogate fitted on the other
//! folds, and the folds' estimates averaged. On a trace game, whose value on a down-set is the
//! sum of its agents' own values, the residual is the noise alone.
//!
//! Standard error: the spread of the contributions within each stratum and fold, widened by
//! Student's t on the sum's Welch-Satterthwaite degrees of freedom (a cell can hold two
//! draws). The noise of the empty and grand coalitions' draws is the caller's to add
//! ([`BoundWeights`]).

use super::coalition::{Coalitions, contains};
use super::forest::Forest;
use super::game::{Game, bounds};
use super::linalg::cholesky;
use super::msr::{allocate, fit_weight, share, t_scaled};
use super::pipeline::value_drawn;
use super::sampling::stream;
use super::{Estimate, Stopping};
use crate::error::{MasreplayError, Result};

/// Most folds of the cross-fitting.
const MAX_FOLDS: usize = 4;
/// Fewest draws of a sampled size: two folds of two.
const MIN_DRAWS: u64 = 4;
/// Ridge on the surrogate's normal equations, relative to their mean diagonal.
const RIDGE: f64 = 1e-9;

/// Scratch space for the border weights of one down-set.
struct Border {
    inside: Vec<bool>,
    /// Subtree sizes inside the down-set.
    h: Vec<usize>,
    /// prod over the ancestors a of h_S(a) / (h_S(a) - 1).
    above: Vec<f64>,
}

impl Border {
    fn new(n: usize) -> Self {
        Border { inside: vec![false; n], h: vec![0; n], above: vec![1.0; n] }
    }

    /// w_i(S) for every player into `out` (see the module's docstring).
    fn weights(&mut self, forest: &Forest, set: &[u64], out: &mut [f64]) {
        let n = forest.len();
        let order = forest.topological();
        out.fill(0.0);
        let mut k = 0;
        for &p in order {
            let p = p as usize;
            self.inside[p] = contains(set, p);
            self.h[p] = 1;
            k += usize::from(self.inside[p]);
        }
        // Children come after their parents in topological order: sum the sizes bottom up.
        for &p in order.iter().rev() {
            let p = p as usize;
            if let (true, Some(parent)) = (self.inside[p], forest.parent(p)) {
                self.h[parent] += self.h[p];
            }
        }
        for &p in order {
            let p = p as usize;
            match forest.parent(p) {
                Some(parent) if self.inside[p] => {
                    let h = self.h[parent] as f64;
                    self.above[p] = self.above[parent] * h / (h - 1.0);
                }
                _ => self.above[p] = 1.0,
            }
            if self.inside[p] && self.h[p] == 1 {
                out[p] = self.above[p] / k as f64;
            } else if !self.inside[p] && forest.parent(p).is_none_or(|parent| self.inside[parent]) {
                out[p] = -(forest.subtree_size(p) as f64) / (n - k) as f64;
            }
        }
    }
}

/// The weights of v(empty) and v(N) in every player's value: -h(i) / n for a root, the leaf
/// weight of the whole forest for a leaf.
pub struct BoundWeights {
    pub empty: Vec<f64>,
    pub full: Vec<f64>,
}

impl BoundWeights {
    pub fn of(forest: &Forest) -> Self {
        let n = forest.len();
        let mut border = Border::new(n);
        let (mut empty, mut full) = (vec![0.0; n], vec![0.0; n]);
        let mut everyone = vec![0u64; Coalitions::new(n).words()];
        (0..n).for_each(|p| everyone[p / 64] |= 1 << (p % 64));
        border.weights(forest, &vec![0u64; everyone.len()], &mut empty);
        border.weights(forest, &everyone, &mut full);
        BoundWeights { empty, full }
    }

    /// Draws of each bound on a noisy game by Neyman's rule, from the players' mean squared
    /// bound weights against the strata's 1 / sqrt(k (n - k)) (at least `least`, at most half
    /// the budget).
    pub fn draws(&self, budget: u64, least: u64) -> u64 {
        let n = self.empty.len();
        let squares = self.empty.iter().chain(&self.full).map(|w| w * w).sum::<f64>();
        let per_draw = (squares / n as f64 / 2.0).sqrt();
        let shares = 2.0 * per_draw + (1..n).map(|k| share(n, k)).sum::<f64>();
        least.max((budget as f64 / shares * per_draw).round() as u64).min(budget / 2)
    }
}

/// Precedence values of `game` under `forest` by MSR over down-sets, each bound valued once
/// (a noisy game draws it `bound_draws` times: those draws count in the budget); `weights`
/// are the forest's [`BoundWeights`].
pub fn precedence_msr(
    game: &dyn Game,
    forest: &Forest,
    weights: &BoundWeights,
    stopping: &Stopping,
    bound_draws: u64,
) -> Result<Estimate> {
    let n = forest.len();
    let (empty, full) = bounds(game)?;
    if n == 1 {
        return Ok(Estimate::of_one_player(full - empty));
    }
    let mut evaluations = 2 * bound_draws;
    let sizes: Vec<usize> = (1..n).collect();
    let pool = stopping.budget.saturating_sub(evaluations);
    if pool < MIN_DRAWS * sizes.len() as u64 {
        return Err(MasreplayError::InvalidArgument(format!(
            "budget: {} cannot draw {MIN_DRAWS} down-sets of each of the {} sizes (needs {})",
            stopping.quoted_budget(),
            sizes.len(),
            stopping.evaluations(evaluations + MIN_DRAWS * sizes.len() as u64)
        )));
    }
    let counts = allocate(&sizes, pool, MIN_DRAWS, |k| share(n, k));
    let folds = (MAX_FOLDS as u64).min(counts.iter().map(|c| c.1).min().unwrap_or(0) / 2) as usize;
    // Down-sets of size k: the first k players of uniform orderings, from a stream per size.
    let mut sets = Coalitions::with_capacity(n, counts.iter().map(|c| c.1 as usize).sum());
    let (mut order, mut scratch) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for &(k, count) in &counts {
        let mut rng = stream(stopping.seed, k as u64);
        for _ in 0..count {
            forest.sample_ordering(&mut rng, &mut order, &mut scratch);
            let mut set = vec![0u64; sets.words()];
            order[..k].iter().for_each(|&p| set[p as usize / 64] |= 1 << (p % 64));
            sets.push(&set);
        }
    }
    let worth = value_drawn(game, &sets, &mut (), |_, _, _| {})?.worth;
    evaluations += sets.len() as u64;
    // The j-th draw of a size goes to fold j % folds.
    let fold_of: Vec<(usize, usize)> = counts
        .iter()
        .enumerate()
        .flat_map(|(stratum, &(_, count))| (0..count as usize).map(move |j| (stratum, j % folds)))
        .collect();
    let surrogates = fit_surrogates(n, &sets, &worth, &fold_of, &counts, folds)?;
    let (at_empty, at_full) = (&weights.empty, &weights.full);
    // Per stratum and fold: the sums and sums of squares of each player's contributions.
    let cells = counts.len() * folds;
    let (mut sums, mut squares) = (vec![0.0; cells * n], vec![0.0; cells * n]);
    let mut border = Border::new(n);
    let mut w = vec![0.0; n];
    for (draw, (set, &v)) in sets.iter().zip(&worth).enumerate() {
        let (stratum, fold) = fold_of[draw];
        let residual = v - surrogates[fold].value(set);
        border.weights(forest, set, &mut w);
        let cell = (stratum * folds + fold) * n;
        for i in 0..n {
            let d = residual * w[i];
            sums[cell + i] += d;
            squares[cell + i] += d * d;
        }
    }
    let mut values = vec![0.0; n];
    // Per stratum and player the variance its draws add to the value.
    let mut terms = vec![0.0; counts.len() * n];
    let share_of_fold = 1.0 / folds as f64;
    for (fold, g) in surrogates.iter().enumerate() {
        let (r_empty, r_full) = (empty - g.intercept, full - g.intercept - g.slopes.iter().sum::<f64>());
        for i in 0..n {
            values[i] += share_of_fold * (g.slopes[i] + r_empty * at_empty[i] + r_full * at_full[i]);
        }
        for (stratum, &(_, count)) in counts.iter().enumerate() {
            let m = (count as usize + folds - 1 - fold) / folds;
            let cell = (stratum * folds + fold) * n;
            for i in 0..n {
                let mean = sums[cell + i] / m as f64;
                values[i] += share_of_fold * mean;
                let spread = (squares[cell + i] / m as f64 - mean * mean).max(0.0) * m as f64 / (m - 1) as f64;
                terms[stratum * n + i] += share_of_fold * share_of_fold * spread / m as f64;
            }
        }
    }
    // Per player the variance, and the sum over the strata of a term squared over its degrees
    // of freedom (draws less folds), for Welch-Satterthwaite's.
    let (mut variance, mut unsureness) = (vec![0.0; n], vec![0.0; n]);
    for (stratum, &(_, count)) in counts.iter().enumerate() {
        let freedom = (count as usize - folds) as f64;
        for (i, term) in terms[stratum * n..(stratum + 1) * n].iter().enumerate() {
            variance[i] += term;
            unsureness[i] += term * term / freedom;
        }
    }
    // At the smallest budgets a stratum holds four to eight draws in two to four folds, and
    // 1.96 standard errors covered 90-92% (n = 7, 70 evaluations, a chain, a star, singletons
    // and a mixed forest, 300 seeds): Student's t on the Welch-Satterthwaite degrees of
    // freedom of the sum over the strata widens them to 92-96%. (Over the cells, one or two
    // degrees of freedom each, the chain's went to 98%: too few terms to read them from.)
    let stderr = t_scaled(&variance, &unsureness);
    Ok(Estimate { values, stderr, evaluations, converged: false, exact: false })
}

/// g(S) = intercept + sum_{j in S} slopes_j.
struct Linear {
    intercept: f64,
    slopes: Vec<f64>,
}

impl Linear {
    fn value(&self, set: &[u64]) -> f64 {
        self.intercept + self.slopes.iter().enumerate().filter(|&(j, _)| contains(set, j)).map(|(_, b)| b).sum::<f64>()
    }
}

/// One surrogate per fold, fitted by weighted least squares on the other folds' draws (each
/// draw of size k weighted by its share of the estimate's variance, as MSR weighs its pairs).
fn fit_surrogates(
    n: usize,
    sets: &Coalitions,
    worth: &[f64],
    fold_of: &[(usize, usize)],
    counts: &[(usize, u64)],
    folds: usize,
) -> Result<Vec<Linear>> {
    // Normal equations of each fold's own draws, over the features (1, x_1, ..., x_n).
    let p = n + 1;
    let mut grams = vec![vec![0.0; p * p]; folds];
    let mut moments = vec![vec![0.0; p]; folds];
    let mut members = Vec::with_capacity(n + 1);
    for (set, (&v, &(stratum, fold))) in sets.iter().zip(worth.iter().zip(fold_of)) {
        let (k, count) = counts[stratum];
        let weight = fit_weight(n, k, count as f64);
        members.clear();
        members.push(0);
        members.extend((0..n).filter(|&j| contains(set, j)).map(|j| j + 1));
        let (gram, moment) = (&mut grams[fold], &mut moments[fold]);
        for &a in &members {
            moment[a] += weight * v;
            for &b in &members {
                gram[a * p + b] += weight;
            }
        }
    }
    (0..folds)
        .map(|fold| {
            let mut gram = vec![0.0; p * p];
            let mut moment = vec![0.0; p];
            for other in (0..folds).filter(|&f| f != fold) {
                gram.iter_mut().zip(&grams[other]).for_each(|(a, b)| *a += b);
                moment.iter_mut().zip(&moments[other]).for_each(|(a, b)| *a += b);
            }
            let ridge = RIDGE * (0..p).map(|j| gram[j * p + j]).sum::<f64>() / p as f64;
            (0..p).for_each(|j| gram[j * p + j] += ridge.max(f64::MIN_POSITIVE));
            let factor = cholesky(p, gram).ok_or_else(|| {
                MasreplayError::InvalidArgument("precedence surrogate: the draws' normal equations are singular".into())
            })?;
            let solution = factor.solve(&moment);
            Ok(Linear { intercept: solution[0], slopes: solution[1..].to_vec() })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::{Border, BoundWeights};
    use crate::shapley::forest::Forest;

    /// Every ordering of `0..n` that puts parents first.
    fn orderings(forest: &Forest, prefix: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        let n = forest.len();
        if prefix.len() == n {
            out.push(prefix.clone());
            return;
        }
        for p in 0..n {
            if !prefix.contains(&p) && forest.parent(p).is_none_or(|q| prefix.contains(&q)) {
                prefix.push(p);
                orderings(forest, prefix, out);
                prefix.pop();
            }
        }
    }

    #[test]
    fn border_weights_are_the_chances_of_the_orderings_over_the_chance_of_the_cut() {
        for parents in [vec![-1, 0, 0, 1, 1, -1, 5], vec![-1, 0, 1, 2, -1, -1], vec![-1, 0, 0, 0, 0, 0]] {
            let forest = Forest::new(&parents).expect("forest");
            let n = forest.len();
            let mut all = Vec::new();
            orderings(&forest, &mut Vec::new(), &mut all);
            let total = all.len() as f64;
            let mask = |players: &[usize]| players.iter().fold(0u64, |m, &p| m | 1 << p);
            // P(the first k players are S), and P(the players before i are T) for each i.
            let (mut cut, mut before) = (HashMap::new(), HashMap::new());
            for order in &all {
                for k in 0..=n {
                    *cut.entry(mask(&order[..k])).or_insert(0.0) += 1.0 / total;
                }
                for (position, &i) in order.iter().enumerate() {
                    *before.entry((i, mask(&order[..position]))).or_insert(0.0) += 1.0 / total;
                }
            }
            let mut border = Border::new(n);
            let mut w = vec![0.0; n];
            for (&set, &chance) in &cut {
                border.weights(&forest, &[set], &mut w);
                for (i, &weight) in w.iter().enumerate() {
                    // a_i(S): +P(before i = S - i) with i in S, -P(before i = S) without.
                    let a = if set & 1 << i != 0 {
                        before.get(&(i, set & !(1 << i))).copied().unwrap_or(0.0)
                    } else {
                        -before.get(&(i, set)).copied().unwrap_or(0.0)
                    };
                    let expected = a / chance;
                    assert!(
                        (weight - expected).abs() < 1e-12,
                        "{parents:?} S = {set:b}, player {i}: {weight} vs {expected}"
                    );
                }
            }
            let BoundWeights { empty, full } = BoundWeights::of(&forest);
            border.weights(&forest, &[0], &mut w);
            assert_eq!(empty, w);
            border.weights(&forest, &[(1 << n) - 1], &mut w);
            assert_eq!(full, w);
            assert!((empty.iter().sum::<f64>() + 1.0).abs() < 1e-12 && (full.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        }
    }
}
