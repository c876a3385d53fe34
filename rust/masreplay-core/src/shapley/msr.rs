//! Regression-adjusted maximum sample reuse (Witter, Liu & Musco, "Regression-adjusted Monte
//! Carlo estimators for Shapley values and probabilistic values", NeurIPS 2025, arXiv
//! 2506.11849): a surrogate f fitted on the valued coalitions is a control variate. Its
//! Shapley values are known in closed form; only the residual v - f is estimated by Monte
//! Carlo, and every valued coalition informs every player at once (maximum sample reuse).
//!
//! The Shapley value splits by coalition size s (the MSR identity):
//!   phi_i = (v(N) - v(empty)) / n + sum_{s=1}^{n-1} E_s[v(S) a_i(S)],
//!   a_i(S) = 1/s if i in S, -1/(n - s) if not,
//! E_s the mean over coalitions of size s. Each size is a stratum: the smallest and largest
//! sizes are enumerated while they are cheap (a census, no error); the others are sampled
//! uniformly with replacement, in complementary pairs (S, N - S) of sizes s <= n / 2 and
//! n - s, in proportion to 1 / sqrt(s (n - s)). A pair informs both strata through its half
//! difference y(S) = (v(S) - v(N - S)) / 2: strata s and n - s together contribute
//! 2 E_s[y(S) a_i(S)]. Pairing removes the even part of the game: for a game with terms of at
//! most two players, y is linear in the members of S.
//!
//! The surrogate g_s(S) = c(s) + sum_{i in S} b_i(s) fits y with an intercept per size (bins
//! of sizes when draws are few) and slopes that vary with the size, by weighted least squares
//! (each stratum weighted by its share of the estimate's variance). Its MSR mean is known:
//! E_s[g_s a_i] = (n b_i(s) - sum_j b_j(s)) / (n (n - 1)). So a pair of size s contributes
//! d_i = 2 (y(S) - g_s(S)) a_i(S) + 2 (n b_i(s) - sum_j b_j(s)) / (n (n - 1)), a draw of the
//! strata's term whose mean is exact whatever g is, provided g was fitted without that pair.
//! On a game whose values are two, a step h (threshold.rs: v = low or high as a weighted sum
//! of the members reaches a quota), or a staircase (the share of high values at each weighted
//! sum), may join g: the linear part then fits what h's half difference leaves, and h adds its
//! own MSR means, exact by dynamic programming.
//! With interactions (surrogate.rs), g also holds the characters x_i x_j x_k of triples of
//! players screened on the linear fit's residuals, fitted jointly with the linear part; their
//! MSR means are exact too (hypergeometric).
//!
//! Unbiased by cross-fitting: the pairs are dealt into folds and each fold's contributions use
//! the surrogate fitted on the other folds. The a_i(S) sum to zero over the players, and so do
//! the surrogate terms, so the values sum to v(N) - v(empty) by construction. Which
//! coalitions are valued depends on the number of players, the budget and the seed only,
//! never on the values (trace_shapley's recording pass relies on it), but for one case that
//! such a pass turns off (`Extras::settle`): on a game whose census takes two values, a pilot
//! finds the sizes where the outcome never swings and they get fewer draws
//! ([`settled_sizes`]).
//!
//! Standard error: the sample variance of the contributions within each stratum, summed over
//! the sampled strata (the folds' surrogates differ a little; that spread is part of the
//! contributions' variance). With a target standard error the sample grows in rounds,
//! doubling the budget, until every error meets it.
//!
//! What differs from the paper: strata by size with a census of the edges instead of
//! importance sampling of sizes, complementary pairs, a linear surrogate with size-varying
//! slopes and screened triple features (the paper's best is a tree ensemble), and
//! cross-fitting, which keeps the estimate exactly unbiased although the surrogate (its
//! features' selection included) is fitted on the evaluations it adjusts.

use rand_xoshiro::Xoshiro256PlusPlus;
use rayon::prelude::*;

use super::coalition::{Coalitions, contains, members_of, size};
use super::exact::binomial;
use super::game::{Game, bounds};
use super::kernel::{complement_of, for_each_subset, random_subset};
use super::linalg::{Factor, cholesky};
use super::pipeline::{Sink, value_drawn, value_streamed};
use super::sampling::stream;
use super::surrogate::{Interactions, Stratum};
use super::threshold::{self, Outcome, Staircase};
use super::{Estimate, Stopping};
use crate::error::{MasreplayError, Result};
use crate::student_t::z_scale;

/// Folds of the cross-fitting (fewer when the budget cannot give each fold a draw of every
/// sampled size).
const MAX_FOLDS: usize = 4;
/// Training coalitions per intercept bin of the surrogate (neighbouring sizes are pooled
/// until they have this many).
const MIN_BIN: u64 = 8;
/// Ridge on the surrogate's normal equations, relative to their mean diagonal.
const RIDGE: f64 = 1e-9;
/// Most knots of a slope.
const MAX_KNOTS: usize = 8;
/// Most slopes of a surrogate.
const MAX_PARAMETERS: usize = 512;
/// Budget of the first round when a target standard error is given.
const FIRST_ROUND: u64 = 4096;
/// On a two-valued game, the share of the sampled pool a pilot may spend finding the settled
/// sizes ([`settled_sizes`]), its pairs per size at most [`PILOT_PAIRS`] and at least
/// [`MIN_PILOT_PAIRS`] (no pilot below).
const PILOT_SHARE: f64 = 0.1;
const PILOT_PAIRS: u64 = 8;
const MIN_PILOT_PAIRS: u64 = 4;
/// The part of its usual draws a settled size keeps: not none, as a size that swings rarely
/// can look settled to a pilot of a few pairs, and its error must still be measured.
const SETTLED_SHARE: f64 = 0.2;
/// Pilot streams are numbered from here (the sampled sizes' own streams are their sizes).
const PILOT_STREAMS: u64 = 1 << 32;

/// Complementary pairs drawn at one size s <= n / 2: each coalition S with the half
/// difference (v(S) - v(N - S)) / 2 of its pair's values, and the two values (the threshold
/// surrogate's fit reads them).
struct Draws {
    size: usize,
    sets: Coalitions,
    values: Vec<f64>,
    outcomes: Vec<[f64; 2]>,
}

/// Draws `counts[k]` more pairs of stratum k from its stream and values both sides of every
/// pair in one batch (a callable game is called once per chunk, not once per size). Once every
/// pair is drawn, `fit` builds and factors its surrogates' Gram matrices, which depend on the
/// coalitions only, while the game values them ([`CrossFit::prepare`], beside the game's
/// valuation, see [`value_streamed`]); each stratum whose pairs are all valued while the game
/// still has coalitions to value then goes to `fit` in order ([`CrossFit::add`]); those the
/// last chunk completes are left to the caller. Returns the evaluations asked for.
fn extend_draws(
    game: &dyn Game,
    draws: &mut [Draws],
    counts: &[u64],
    rngs: &mut [Xoshiro256PlusPlus],
    fit: &mut CrossFit,
) -> Result<u64> {
    let n = game.n_players();
    let planned = 2 * counts.iter().sum::<u64>() as usize;
    let sizes: Vec<usize> = draws.iter().map(|stratum| stratum.size).collect();
    // Per stratum: its fresh coalitions, then their complements.
    let draw = |rngs: &mut &mut [Xoshiro256PlusPlus], sink: &mut Sink| {
        for ((&size, rng), &count) in sizes.iter().zip(rngs.iter_mut()).zip(counts) {
            let start = sink.batch().len();
            for _ in 0..count {
                if sink.stopped() {
                    return;
                }
                sink.push(&random_subset(rng, n, size, sink.words()));
            }
            for i in start..sink.batch().len() {
                let complement = complement_of(sink.batch().get(i), n);
                sink.push(&complement);
            }
        }
    };
    let (mut next, mut start, mut prepared) = (0, 0, false);
    let valuation = value_streamed(game, planned, &mut &mut *rngs, draw, |_, batch, worth| {
        let pending = worth.len() < batch.len();
        if !prepared {
            // The batch is whole from the first call on.
            let mut first = 0;
            for (stratum, &count) in draws.iter_mut().zip(counts) {
                (first..first + count as usize).for_each(|i| stratum.sets.push(batch.get(i)));
                first += 2 * count as usize;
            }
            fit.prepare(draws, !pending);
            prepared = true;
        }
        while let Some(stratum) = draws.get_mut(next) {
            let count = counts[next] as usize;
            let Some(both) = worth.get(start..start + 2 * count) else { break };
            let (inside, outside) = both.split_at(count);
            stratum.values.extend(inside.iter().zip(outside).map(|(a, b)| (a - b) / 2.0));
            stratum.outcomes.extend(inside.iter().zip(outside).map(|(&a, &b)| [a, b]));
            if pending {
                fit.add(stratum);
            }
            (next, start) = (next + 1, start + 2 * count);
        }
    })?;
    Ok(valuation.worth.len() as u64)
}

/// The surrogate's slope of player i at size s interpolates linearly between its values at
/// `knots` sizes spread evenly over u(s) = 1 - 2s/n in [0, 1) (the sampled sizes s <= n / 2):
/// the slopes that fit a pair's half difference change with the size (a cubic term's share
/// by a factor of two; a voting game's swings peak near its quota).
fn size_basis(n: usize, s: usize, knots: usize, out: &mut Vec<f64>) {
    out.clear();
    out.resize(knots, 0.0);
    if knots == 1 {
        out[0] = 1.0;
        return;
    }
    let position = (1.0 - 2.0 * s as f64 / n as f64) * (knots - 1) as f64;
    let left = (position.floor() as usize).min(knots - 2);
    let right_share = position - left as f64;
    out[left] = 1.0 - right_share;
    out[left + 1] = right_share;
}

/// The knots whose slopes size `s` interpolates (at most two), with their weights
/// ([`size_basis`], `basis` its scratch).
fn size_knots(n: usize, s: usize, knots: usize, basis: &mut Vec<f64>) -> Vec<(usize, f64)> {
    size_basis(n, s, knots, basis);
    basis.iter().copied().enumerate().filter(|&(_, b)| b != 0.0).collect()
}

/// Which coalitions of one size the surrogate's Gram matrix sees: how many hold each pair of
/// players (`together`, n x n; the diagonal counts each player's coalitions) and how many
/// there are. Every coalition of a size weighs the same in the fit, so these counts give the
/// Gram matrix in s^2 steps per coalition instead of a row of features per member; they do
/// not depend on the values.
#[derive(Clone)]
struct Counts {
    n: usize,
    together: Vec<u32>,
    coalitions: u64,
}

impl Counts {
    fn new(n: usize) -> Self {
        Counts { n, together: vec![0; n * n], coalitions: 0 }
    }

    fn clear(&mut self) {
        self.together.fill(0);
        self.coalitions = 0;
    }

    /// `members` ascending: only the lower triangle is counted (see [`Counts::mirror`]).
    #[inline(always)]
    fn add(&mut self, members: &[usize]) {
        for (k, &a) in members.iter().enumerate() {
            let row = &mut self.together[a * self.n..(a + 1) * self.n];
            members[..=k].iter().for_each(|&b| row[b] += 1);
        }
        self.coalitions += 1;
    }

    #[inline(always)]
    fn merge(&mut self, other: &Counts) {
        self.together.iter_mut().zip(&other.together).for_each(|(a, b)| *a += b);
        self.coalitions += other.coalitions;
    }

    /// The counted lower triangle copied onto the upper one.
    #[inline(always)]
    fn mirror(&mut self) {
        let n = self.n;
        for a in 0..n {
            for b in 0..a {
                self.together[b * n + a] = self.together[a * n + b];
            }
        }
    }
}

/// What the surrogate's right-hand side needs from the values of coalitions of one size: each
/// player's sum of values, and the values' sum.
#[derive(Clone)]
struct Sums {
    players: Vec<f64>,
    total: f64,
}

impl Sums {
    fn new(n: usize) -> Self {
        Sums { players: vec![0.0; n], total: 0.0 }
    }

    fn clear(&mut self) {
        self.players.fill(0.0);
        self.total = 0.0;
    }

    fn add(&mut self, members: &[usize], value: f64) {
        members.iter().for_each(|&a| self.players[a] += value);
        self.total += value;
    }

    fn merge(&mut self, other: &Sums) {
        self.players.iter_mut().zip(&other.players).for_each(|(a, b)| *a += b);
        self.total += other.total;
    }
}

/// The weighted Gram side of the surrogate's normal equations (features x_i times the size
/// basis), with the intercept's sums kept per size so that sizes can be pooled into bins when
/// solving: it depends on the coalitions drawn, not on their values. The matrix holds its
/// lower triangle only (what the Cholesky factorisation reads).
struct Gram {
    n: usize,
    knots: usize,
    xx: Vec<f64>,
    /// Per size s: sum of weights, and of weighted features (n knots per size).
    w: Vec<f64>,
    x: Vec<f64>,
    /// Scratch of [`Gram::add`]: the size basis and a row of pair counts.
    basis: Vec<f64>,
    row: Vec<f64>,
}

impl Gram {
    fn new(n: usize, knots: usize) -> Self {
        let p = n * knots;
        Gram {
            n,
            knots,
            xx: vec![0.0; p * p],
            w: vec![0.0; n + 1],
            x: vec![0.0; (n + 1) * p],
            basis: Vec::with_capacity(knots),
            row: Vec::with_capacity(n),
        }
    }

    /// Adds the coalitions of size `s` that `all` counts and `held_out` does not (both
    /// mirrored), each of weight `weight`. A size touches the blocks of its (at most two)
    /// knots only.
    fn add(&mut self, s: usize, all: &Counts, held_out: &Counts, weight: f64) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the processor has AVX2, checked just above.
            return unsafe { self.add_avx2(s, all, held_out, weight) };
        }
        self.add_lanes(s, all, held_out, weight)
    }

    /// [`Gram::add`] with 256-bit vector registers: its loops are element by element, so
    /// wider registers give the same bits (no fused multiply-add).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn add_avx2(&mut self, s: usize, all: &Counts, held_out: &Counts, weight: f64) {
        self.add_lanes(s, all, held_out, weight)
    }

    #[inline(always)]
    fn add_lanes(&mut self, s: usize, all: &Counts, held_out: &Counts, weight: f64) {
        let Gram { n, knots, xx, w, x, basis, row } = self;
        let (n, p) = (*n, *n * *knots);
        let knots = size_knots(n, s, *knots, basis);
        for a in 0..n {
            let (mine, theirs) = (&all.together[a * n..(a + 1) * n], &held_out.together[a * n..(a + 1) * n]);
            row.clear();
            row.extend(mine.iter().zip(theirs).map(|(m, t)| (m - t) as f64));
            for &(q, bq) in &knots {
                let i = q * n + a;
                x[s * p + i] += weight * bq * row[a];
                // Lower triangle: blocks left of the diagonal block whole, the diagonal
                // block up to its diagonal.
                for &(r, br) in knots.iter().filter(|&&(r, _)| r <= q) {
                    let wqr = weight * bq * br;
                    let width = if r == q { a + 1 } else { n };
                    let block = &mut xx[i * p + r * n..i * p + r * n + width];
                    block.iter_mut().zip(row.iter()).for_each(|(x, c)| *x += wqr * c);
                }
            }
        }
        w[s] += weight * (all.coalitions - held_out.coalitions) as f64;
    }

    /// Profiles out one intercept per bin (`bin_of[s]`; sizes in no bin get none) by centring
    /// within each bin, and factors what is left.
    fn factor(self, bin_of: &[Option<usize>], n_bins: usize) -> Result<Fit> {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the processor has AVX2, checked just above.
            return unsafe { self.factor_avx2(bin_of, n_bins) };
        }
        self.factor_lanes(bin_of, n_bins)
    }

    /// [`Gram::factor`] with 256-bit vector registers: the centring is element by element,
    /// so wider registers give the same bits (no fused multiply-add).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn factor_avx2(self, bin_of: &[Option<usize>], n_bins: usize) -> Result<Fit> {
        self.factor_lanes(bin_of, n_bins)
    }

    #[inline(always)]
    fn factor_lanes(mut self, bin_of: &[Option<usize>], n_bins: usize) -> Result<Fit> {
        let (n, p) = (self.n, self.n * self.knots);
        let mut w = vec![0.0; n_bins];
        let mut x = vec![0.0; n_bins * p];
        for (s, bin) in bin_of.iter().enumerate() {
            let Some(b) = *bin else { continue };
            w[b] += self.w[s];
            x[b * p..(b + 1) * p].iter_mut().zip(&self.x[s * p..(s + 1) * p]).for_each(|(a, c)| *a += c);
        }
        // A bin's features are zero outside the knots of its sizes.
        let spans: Vec<Option<(usize, usize)>> = (0..n_bins)
            .map(|b| {
                let xb = &x[b * p..(b + 1) * p];
                let first = xb.iter().position(|&v| v != 0.0).filter(|_| w[b] > 0.0)?;
                Some((first, xb.iter().rposition(|&v| v != 0.0).unwrap_or(first)))
            })
            .collect();
        let gram = &mut self.xx;
        for (b, &span) in spans.iter().enumerate() {
            let Some((first, last)) = span else { continue };
            let xb = &x[b * p..(b + 1) * p];
            for i in first..=last {
                let scaled = xb[i] / w[b];
                let row = &mut gram[i * p + first..=i * p + i];
                row.iter_mut().zip(&xb[first..=i]).for_each(|(g, xj)| *g -= scaled * xj);
            }
        }
        let mean_diagonal = (0..p).map(|i| gram[i * p + i]).sum::<f64>() / p as f64;
        let ridge = RIDGE * mean_diagonal.max(f64::MIN_POSITIVE);
        (0..p).for_each(|i| gram[i * p + i] += ridge);
        let factor = cholesky(p, std::mem::take(gram)).ok_or_else(|| {
            MasreplayError::InvalidArgument("msr: the surrogate's regression is singular (non-finite values?)".into())
        })?;
        Ok(Fit { n, knots: self.knots, factor, w, x, spans })
    }
}

/// The right-hand side of the surrogate's normal equations: the weighted features times the
/// values, and per size the weighted values' sum.
#[derive(Clone)]
struct Moments {
    n: usize,
    knots: usize,
    xy: Vec<f64>,
    y: Vec<f64>,
    /// Scratch of [`Moments::add`]: the size basis.
    basis: Vec<f64>,
}

impl Moments {
    fn new(n: usize, knots: usize) -> Self {
        Moments { n, knots, xy: vec![0.0; n * knots], y: vec![0.0; n + 1], basis: Vec::with_capacity(knots) }
    }

    /// Adds the values of the coalitions of size `s` that `all` sums and `held_out` does
    /// not, each of weight `weight`.
    fn add(&mut self, s: usize, all: &Sums, held_out: &Sums, weight: f64) {
        let Moments { n, knots, xy, y, basis } = self;
        let knots = size_knots(*n, s, *knots, basis);
        for a in 0..*n {
            let value_sum = all.players[a] - held_out.players[a];
            for &(q, bq) in &knots {
                xy[q * *n + a] += weight * bq * value_sum;
            }
        }
        y[s] += weight * (all.total - held_out.total);
    }
}

/// A surrogate's factored normal equations, the intercepts profiled out: what its fit needs
/// beside the values.
struct Fit {
    n: usize,
    knots: usize,
    factor: Factor,
    /// Per bin: its sum of weights, of weighted features, and the span of its nonzero features.
    w: Vec<f64>,
    x: Vec<f64>,
    spans: Vec<Option<(usize, usize)>>,
}

impl Fit {
    /// Fits the slopes and one intercept per bin (`bin_of[s]`) to the values' `moments`.
    fn solve(&self, moments: &Moments, bin_of: &[Option<usize>]) -> Surrogate {
        let (n_bins, p) = (self.w.len(), self.n * self.knots);
        let mut y = vec![0.0; n_bins];
        for (s, bin) in bin_of.iter().enumerate() {
            let Some(b) = *bin else { continue };
            y[b] += moments.y[s];
        }
        let mut rhs = moments.xy.clone();
        for (b, &span) in self.spans.iter().enumerate() {
            let Some((first, last)) = span else { continue };
            let xb = &self.x[b * p..(b + 1) * p];
            (first..=last).for_each(|i| rhs[i] -= xb[i] * y[b] / self.w[b]);
        }
        let coef = self.factor.solve(&rhs);
        let intercept_of_bin: Vec<f64> = (0..n_bins)
            .map(|b| {
                let fitted: f64 = self.x[b * p..(b + 1) * p].iter().zip(&coef).map(|(a, c)| a * c).sum();
                if self.w[b] > 0.0 { (y[b] - fitted) / self.w[b] } else { 0.0 }
            })
            .collect();
        let intercept = bin_of.iter().map(|bin| bin.map_or(0.0, |b| intercept_of_bin[b])).collect();
        Surrogate { n: self.n, knots: self.knots, coef, intercept }
    }
}

/// g_s(S) = intercept[s] + sum over i in S of the slope b_i(s), fitted to a pair's half
/// difference; its mean against the MSR weights is known: E_s[g_s a_i] = (n b_i(s) - sum_j
/// b_j(s)) / (n (n - 1)).
struct Surrogate {
    n: usize,
    knots: usize,
    coef: Vec<f64>,
    intercept: Vec<f64>,
}

impl Surrogate {
    /// The slopes b_i(s) of every player at size `s`.
    fn slopes(&self, s: usize, basis: &mut Vec<f64>) -> Vec<f64> {
        size_basis(self.n, s, self.knots, basis);
        (0..self.n).map(|i| basis.iter().enumerate().map(|(q, bq)| bq * self.coef[q * self.n + i]).sum()).collect()
    }

    /// E_s[g_s a_i] for every player, from the slopes at size s.
    fn shapley_term(&self, slopes: &[f64]) -> Vec<f64> {
        let n = self.n as f64;
        let total: f64 = slopes.iter().sum();
        slopes.iter().map(|b| (n * b - total) / (n * (n - 1.0))).collect()
    }

    fn residual(&self, members: &[usize], slopes: &[f64], value: f64) -> f64 {
        value - self.intercept[members.len()] - members.iter().map(|&i| slopes[i]).sum::<f64>()
    }
}

/// A fold's step or staircase h (threshold.rs), whose half difference the linear part's fit
/// and the Monte Carlo residual leave out, and its MSR means per size (once kept).
struct Step {
    h: Staircase,
    means: Vec<Vec<f64>>,
}

impl Step {
    fn new(h: Staircase) -> Self {
        Step { h, means: Vec::new() }
    }

    fn with_means(mut self) -> Self {
        self.means = self.h.size_means();
        self
    }

    /// h's half difference at S (`members`); zero without a step.
    fn value(step: Option<&Step>, members: &[usize]) -> f64 {
        step.map_or(0.0, |step| step.h.half_difference(members))
    }

    /// h's closed-form part of stratum s's contributions: its means at sizes s and n - s
    /// (the middle size, its own partner, once).
    fn term(&self, n: usize, s: usize) -> Vec<f64> {
        if 2 * s == n {
            return self.means[s].clone();
        }
        self.means[s].iter().zip(&self.means[n - s]).map(|(a, b)| a + b).collect()
    }
}

/// Groups consecutive sizes of `sizes` into bins of at least `min` coalitions (`counts[s]`);
/// a short last bin joins the one before.
fn bins(n: usize, sizes: &[usize], counts: &[u64], min: u64) -> (Vec<Option<usize>>, usize) {
    let mut bin_of = vec![None; n + 1];
    let (mut bin, mut filled) = (0, 0);
    for &s in sizes {
        bin_of[s] = Some(bin);
        filled += counts[s];
        if filled >= min {
            bin += 1;
            filled = 0;
        }
    }
    if filled > 0 && bin > 0 {
        for &s in sizes {
            if bin_of[s] == Some(bin) {
                bin_of[s] = Some(bin - 1);
            }
        }
        return (bin_of, bin);
    }
    (bin_of, if filled > 0 { bin + 1 } else { bin })
}

/// `total` draws over `sizes` in proportion to `weight` (largest remainders), after `floor`
/// each.
pub(super) fn allocate(sizes: &[usize], total: u64, floor: u64, weight: impl Fn(usize) -> f64) -> Vec<(usize, u64)> {
    let spare = total.saturating_sub(floor * sizes.len() as u64);
    let sum: f64 = sizes.iter().map(|&s| weight(s)).sum();
    let share = |s: usize| if sum > 0.0 { spare as f64 * weight(s) / sum } else { spare as f64 / sizes.len() as f64 };
    let mut counts: Vec<(usize, u64)> = sizes.iter().map(|&s| (s, floor + share(s).floor() as u64)).collect();
    let mut left = (floor * sizes.len() as u64 + spare).saturating_sub(counts.iter().map(|c| c.1).sum());
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by(|&a, &b| (share(sizes[b]).fract()).total_cmp(&share(sizes[a]).fract()));
    for &k in order.iter().cycle().take(sizes.len() * 2) {
        if left == 0 {
            break;
        }
        counts[k].1 += 1;
        left -= 1;
    }
    counts
}

/// The sampled sizes (`settled[s]`) at which a pilot of complementary pairs, drawn from
/// streams of its own and left out of the estimate, found every pair's half difference alike.
/// Called on a game whose census took two values only (a team that wins or loses): there most
/// sizes are settled (at n = 100 with weights of 1-5 and a quota of 60%, a pair of size 2-30
/// is always a loss against a win, one of size 48-50 always two losses), and the fixed
/// allocation would spend three quarters of the pool on them. Their draws are cut to [`SETTLED_SHARE`] and the rest go where the outcome
/// swings. The estimate stays unbiased: the allocation depends on the pilot's values only, and
/// those are not in it. Measured (weighted voting, 10,000 evaluations, MAE before
/// projection, before / after): integer weights 1-5, quota 0.6, 20 seeds: n = 30 0.00015 /
/// 0.00011, n = 100 0.00162 / 0.00101; 10 seeds: n = 64 0.00207 / 0.00146, n = 150 0.00194 /
/// 0.00137; 10% of the weights 10-29 and the rest 1-2, quota 0.55, 5 seeds: n = 50 0.00163 /
/// 0.00148, n = 100 0.00169 / 0.00124 (benches/RESULTS.md, 2026-11-28).
fn settled_sizes(game: &dyn Game, sampled: &[usize], pool: u64, seed: u64, evaluations: &mut u64) -> Result<Vec<bool>> {
    let n = game.n_players();
    let pairs = (PILOT_SHARE * pool as f64 / (2 * sampled.len()) as f64) as u64;
    let mut settled = vec![false; n + 1];
    if pairs < MIN_PILOT_PAIRS {
        return Ok(settled);
    }
    let pairs = pairs.min(PILOT_PAIRS) as usize;
    let mut batch = Coalitions::with_capacity(n, 2 * pairs * sampled.len());
    for &s in sampled {
        let mut rng = stream(seed, PILOT_STREAMS + s as u64);
        for _ in 0..pairs {
            let set = random_subset(&mut rng, n, s, batch.words());
            batch.push(&set);
            batch.push(&complement_of(&set, n));
        }
    }
    let worth = value_drawn(game, &batch, &mut (), |_, _, _| {})?.worth;
    *evaluations += worth.len() as u64;
    for (&s, pilot) in sampled.iter().zip(worth.chunks_exact(2 * pairs)) {
        let first = pilot[0] - pilot[1];
        settled[s] = pilot.chunks_exact(2).all(|pair| pair[0] - pair[1] == first);
    }
    Ok(settled)
}

/// Which sizes are a census and which are sampled, from the budget left after the empty and
/// the grand coalition: size pairs (s, n - s) from the edges inward while a pair costs at
/// most half of what is left, or everything when all that remains fits.
fn census_sizes(n: usize, mut left: u64) -> (Vec<usize>, Vec<usize>, u64) {
    let mut census = Vec::new();
    let mut low = 1;
    while low <= n - low {
        let high = n - low;
        let pair = if low == high { binomial(n, low) } else { 2.0 * binomial(n, low) };
        let rest: f64 = (low..=high).map(|s| binomial(n, s)).sum();
        if rest <= left as f64 {
            census.extend(low..=high);
            return (census, Vec::new(), left - rest as u64);
        }
        if pair > left as f64 / 2.0 {
            break;
        }
        census.push(low);
        if high != low {
            census.push(high);
        }
        left -= pair as u64;
        low += 1;
    }
    (census, (low..=n / 2).collect(), left)
}

/// Draws of size s in proportion to 1 / sqrt(s (n - s)): Neyman's rule for a residual of the
/// same spread at every size. (Following the spreads a pilot measured, as stratified does, won
/// on voting games and lost on SOUM games once the pilot's draws were left out of the
/// estimate, as unbiasedness requires; and a fixed allocation asks for the same coalitions
/// whatever the values, which a recording pass such as trace_shapley's relies on.)
pub(super) fn share(n: usize, s: usize) -> f64 {
    1.0 / ((s * (n - s)) as f64).sqrt()
}

/// The weight of a training pair of size s: the variance of the estimate is
/// sum_s E_s[r^2] / (s (n - s) m_s) for m_s pairs of size s, and E_s[r^2] is estimated by
/// the mean over those pairs.
pub(super) fn fit_weight(n: usize, s: usize, drawn: f64) -> f64 {
    1.0 / ((s * (n - s)) as f64 * drawn.max(1.0) * drawn.max(1.0))
}

/// What MSR's surrogate may hold beside its linear part.
#[derive(Clone, Copy, Debug)]
pub struct Extras {
    /// Interaction features screened on the linear part's residuals (surrogate.rs).
    pub interactions: bool,
    /// A step or staircase fitted when the game's values are two (threshold.rs), kept by a
    /// fold where it leaves a held-out training fold less (see `CrossFit::with_step`).
    pub threshold: bool,
    /// Fewer draws at the sizes a pilot finds settled when the game's values are two
    /// ([`settled_sizes`]); off where the coalitions must not depend on the values (a
    /// recording pass).
    pub settle: bool,
}

/// How MSR spends its first budget: the sizes it enumerates (a census), the sizes it samples
/// in complementary pairs, the evaluations left for the pairs, and the draws a request of a
/// coalition of each size costs (one, but on a noisy game, where the empty and grand coalitions
/// and the census are drawn repeatedly and averaged).
pub struct Plan {
    census: Vec<usize>,
    sampled: Vec<usize>,
    pool: u64,
    repeats: Vec<u64>,
}

impl Plan {
    /// A deterministic game's plan: [`census_sizes`], each coalition valued once.
    fn deterministic(n: usize, budget: u64) -> Self {
        let (census, sampled, pool) = census_sizes(n, budget.saturating_sub(2));
        Plan { census, sampled, pool, repeats: vec![1; n + 1] }
    }

    /// A noisy game's plan. Every evaluation carries noise of the same variance, and each part
    /// of the estimate gets draws in proportion to sqrt(its noise variance per draw / its cost)
    /// (Neyman allocation): a pair of size s, 1 / sqrt(s (n - s)), as the sampled strata get
    /// without noise; the empty and grand coalitions, weighted 1/n in every value, 1 / n each.
    /// A size whose share pays for all its coalitions `least` times or more is a census with
    /// that many draws of each (the same noise per evaluation as sampling, and no sampling
    /// error); the others are sampled, each pair drawn once. `least` is 2 when the noise is to
    /// be estimated from the repeats. The plan depends on n and the budget only.
    pub fn noisy(n: usize, budget: u64, least: u64) -> Self {
        let pair_share = |s: usize| share(n, s);
        let shares = 1.0 / n as f64 + (1..=n / 2).map(pair_share).sum::<f64>();
        let t = budget as f64 / (2.0 * shares);
        let mut repeats = vec![1; n + 1];
        repeats[0] = least.max((t / n as f64).round() as u64).min(budget / 2);
        repeats[n] = repeats[0];
        let mut left = budget.saturating_sub(2 * repeats[0]);
        let mut census = Vec::new();
        let mut low = 1;
        while low <= n - low {
            let high = n - low;
            let round = if low == high { binomial(n, low) } else { 2.0 * binomial(n, low) }.round();
            let draws = (2.0 * t * pair_share(low) / round).floor() as u64;
            if draws < least || round * draws as f64 > left as f64 {
                break;
            }
            census.push(low);
            repeats[low] = draws;
            if high != low {
                census.push(high);
                repeats[high] = draws;
            }
            left -= (round * draws as f64) as u64;
            low += 1;
        }
        if low > n / 2 {
            left = spend_on_census(n, &mut repeats, left);
        }
        Plan { census, sampled: (low..=n / 2).collect(), pool: left, repeats }
    }

    /// Whether the plan enumerates every size (a census), sampling none.
    pub fn samples_nothing(&self) -> bool {
        self.sampled.is_empty()
    }

    /// The variance, per unit of one draw's noise variance, that the noise alone leaves in
    /// every value: [`Plan::fixed_noise_variance`] and the sampled strata's, 2 / (s (n - s) m)
    /// for m pairs of size s < n / 2 (the pair's half difference counts twice), half that at
    /// n / 2. The sampling error comes on top, so an estimate is never better than this;
    /// infinite where the budget cannot draw the sampled sizes.
    pub fn noise_variance(&self) -> f64 {
        let n = self.repeats.len() - 1;
        let strata = self.sampled.len() as u64;
        let pairs = self.pool / 2;
        if strata == 0 {
            return self.fixed_noise_variance();
        }
        if pairs < 2 * strata {
            return f64::INFINITY;
        }
        let folds = (MAX_FOLDS as u64).min(pairs / strata);
        let counts = allocate(&self.sampled, pairs, folds, |s| share(n, s));
        let sampled: f64 =
            counts.iter().map(|&(s, m)| if 2 * s == n { 0.5 } else { 2.0 } / ((s * (n - s)) as f64 * m as f64)).sum();
        self.fixed_noise_variance() + sampled
    }

    /// Draws per request of a coalition of each size (of the empty and grand coalition,
    /// fewer than `least` when the budget cannot pay for `least`).
    pub fn repeats(&self) -> &[u64] {
        &self.repeats
    }

    /// The variance, per unit of one draw's noise variance, that the noise of the empty and
    /// grand coalitions and of the census adds to every player's value: (v(N) - v(empty)) / n
    /// from r draws of each, 2 / (r n^2); a census of size s, r draws of each of its C(n, s)
    /// coalitions, 1 / (r C(n, s) s (n - s)). The sampled strata's own spread holds theirs.
    pub fn fixed_noise_variance(&self) -> f64 {
        let n = self.repeats.len() - 1;
        let bounds = 2.0 / (self.repeats[0] as f64 * (n * n) as f64);
        let census: f64 =
            self.census.iter().map(|&s| 1.0 / (self.repeats[s] as f64 * binomial(n, s) * (s * (n - s)) as f64)).sum();
        bounds + census
    }
}

/// What a plan whose census covers every size leaves, `left` evaluations, spent one more draw
/// at a time of the empty and grand coalitions (two evaluations) or of every coalition of a
/// pair of sizes (s, n - s), to whichever takes the most noise variance off per evaluation
/// (the terms of [`Plan::fixed_noise_variance`]: K / r falls by K / (r (r + 1))), while one
/// fits. Returns what is left after.
fn spend_on_census(n: usize, repeats: &mut [u64], mut left: u64) -> u64 {
    // Per option: the size whose repeats it raises (0 for the bounds), its cost and K.
    let options: Vec<(usize, u64, f64)> = std::iter::once((0, 2, 2.0 / (n * n) as f64))
        .chain((1..=n / 2).map(|s| {
            let (count, sizes) = if 2 * s == n { (binomial(n, s), 1.0) } else { (2.0 * binomial(n, s), 2.0) };
            (s, count.round() as u64, sizes / (binomial(n, s) * (s * (n - s)) as f64))
        }))
        .collect();
    let gain = |&(s, cost, k): &(usize, u64, f64), repeats: &[u64]| {
        let r = repeats[s] as f64;
        k / (r * (r + 1.0) * cost as f64)
    };
    while let Some(&(s, cost, _)) =
        options.iter().filter(|o| o.1 <= left).max_by(|a, b| gain(a, repeats).total_cmp(&gain(b, repeats)))
    {
        repeats[s] += 1;
        repeats[n - s] = repeats[s];
        left -= cost;
    }
    left
}

pub fn msr(game: &dyn Game, stopping: &Stopping, extras: Extras) -> Result<Estimate> {
    let n = game.n_players();
    msr_planned(game, stopping, extras, Plan::deterministic(n, first_budget(stopping, n)))
}

/// The first round's budget: all of it, or with a target standard error a first sample.
fn first_budget(stopping: &Stopping, n: usize) -> u64 {
    match stopping.target_stderr {
        Some(_) => stopping.budget.min(FIRST_ROUND.max(40 * n as u64)),
        None => stopping.budget,
    }
}

/// MSR with the first round's budget spent as `plan` says (the rounds that follow, with a
/// target standard error, sample more pairs).
pub fn msr_planned(game: &dyn Game, stopping: &Stopping, extras: Extras, plan: Plan) -> Result<Estimate> {
    let n = game.n_players();
    let (empty, full) = bounds(game)?;
    let delta = full - empty;
    if n == 1 {
        return Ok(Estimate::of_one_player(delta));
    }
    let Plan { census, sampled, pool, repeats } = plan;
    let mut values = vec![delta / n as f64; n];
    let mut evaluations = 2 * repeats[0];
    // The census strata: E_s[v a_i] exactly.
    let mut sets = Coalitions::new(n);
    for &s in &census {
        // Tens of millions at a large budget: seconds before the first valuation.
        crate::interrupt::checkpoint()?;
        for_each_subset(n, s, |set| sets.push(set));
    }
    let worth = value_drawn(game, &sets, &mut (), |_, _, _| {})?.worth;
    evaluations += sets.iter().map(|set| repeats[size(set)]).sum::<u64>();
    let mut per_size = vec![0u64; n + 1];
    sets.iter().for_each(|set| per_size[size(set)] += 1);
    for (set, &v) in sets.iter().zip(&worth) {
        let s = size(set);
        let count = per_size[s] as f64;
        let (inside, outside) = (v / (s as f64 * count), -v / ((n - s) as f64 * count));
        values.iter_mut().enumerate().for_each(|(i, phi)| *phi += if contains(set, i) { inside } else { outside });
    }
    if sampled.is_empty() {
        return Ok(Estimate { values, stderr: vec![0.0; n], evaluations, converged: true, exact: true });
    }
    // Budgets below are in pairs (two evaluations each).
    let strata = sampled.len() as u64;
    let pairs = pool / 2;
    if pairs < 2 * strata {
        return Err(MasreplayError::InvalidArgument(format!(
            "budget: {} cannot draw two complementary pairs of each of the {strata} sampled sizes (needs {})",
            stopping.quoted_budget(),
            stopping.evaluations(stopping.budget + 4 * strata - 2 * pairs)
        )));
    }
    let folds = (MAX_FOLDS as u64).min(pairs / strata) as usize;
    let two_valued = delta != 0.0 && !worth.is_empty() && worth.iter().all(|&v| v == empty || v == full);
    let settled = if extras.settle && two_valued && game.draws_per_request().is_none() {
        settled_sizes(game, &sampled, pool, stopping.seed, &mut evaluations)?
    } else {
        vec![false; n + 1]
    };
    let share = |s: usize| if settled[s] { SETTLED_SHARE * share(n, s) } else { share(n, s) };
    // Per size its own stream, extended round by round.
    let mut rngs: Vec<Xoshiro256PlusPlus> = sampled.iter().map(|&s| stream(stopping.seed, s as u64)).collect();
    let mut draws: Vec<Draws> = sampled
        .iter()
        .map(|&s| Draws { size: s, sets: Coalitions::new(n), values: Vec::new(), outcomes: Vec::new() })
        .collect();
    let mut budget = first_budget(stopping, n);
    loop {
        let drawn: u64 = draws.iter().map(|d| d.values.len() as u64).sum();
        let targets = allocate(&sampled, budget.saturating_sub(evaluations) / 2 + drawn, folds as u64, share);
        let counts: Vec<u64> = draws
            .iter()
            .zip(targets)
            .map(|(stratum, (_, target))| target.saturating_sub(stratum.values.len() as u64))
            .collect();
        let after: Vec<u64> = draws.iter().zip(&counts).map(|(d, count)| d.values.len() as u64 + count).collect();
        let mut fit = CrossFit::new(n, &sampled, &after, folds, extras, [empty, full]);
        evaluations += extend_draws(game, &mut draws, &counts, &mut rngs, &mut fit)?;
        let (estimate, stderr) = fit.finish(&draws)?;
        let converged = stopping.converged(&stderr);
        if converged || budget >= stopping.budget {
            let values = values.iter().zip(&estimate).map(|(a, b)| a + b).collect();
            return Ok(Estimate { values, stderr, evaluations, converged, exact: false });
        }
        budget = budget.saturating_mul(2).min(stopping.budget);
    }
}

/// Knots of the surrogate's slopes: one (a slope per player) until the training pairs
/// number five per parameter of the next, at most [`MAX_KNOTS`] and [`MAX_PARAMETERS`] slopes
/// in all (the fits cost the cube of that).
fn knots_for(n: usize, training_pairs: u64) -> usize {
    (training_pairs as usize / (5 * n)).min(MAX_PARAMETERS / n).clamp(1, MAX_KNOTS)
}

/// The cross-fitted estimate of the sampled strata. Each fold's surrogate is fitted on every
/// stratum's draws less the fold's own. Its Gram matrix depends on which coalitions were drawn
/// only: it is built and factored once they all are ([`CrossFit::prepare`], beside the game);
/// the values' sums follow stratum by stratum as the strata come in ([`CrossFit::add`]);
/// [`CrossFit::finish`] adds the strata valued last, solves and sums the contributions.
struct CrossFit {
    n: usize,
    folds: usize,
    /// What each fold's surrogate may hold beside its linear part.
    extras: Extras,
    /// v(empty) and v(N): the two values of a two-valued game.
    levels: [f64; 2],
    drawn: Vec<u64>,
    bin_of: Vec<Option<usize>>,
    n_bins: usize,
    knots: usize,
    /// Per fold its factored normal equations ([`CrossFit::prepare`]) and their right-hand
    /// side.
    fits: Option<Result<Vec<Fit>>>,
    moments: Vec<Moments>,
    /// Per fold the sums of a stratum's values in it, and the stratum's in all (reused from
    /// stratum to stratum).
    parts: Vec<Sums>,
    all: Sums,
    members: Vec<usize>,
    /// Strata added so far: the first ones of the draws.
    added: usize,
}

impl CrossFit {
    /// For strata of sizes `sizes` that will hold `drawn[k]` pairs each.
    fn new(n: usize, sizes: &[usize], drawn: &[u64], folds: usize, extras: Extras, levels: [f64; 2]) -> Self {
        let mut per_size = vec![0u64; n + 1];
        sizes.iter().zip(drawn).for_each(|(&s, &count)| per_size[s] = count);
        let (bin_of, n_bins) = bins(n, sizes, &per_size, MIN_BIN);
        let knots = knots_for(n, per_size.iter().sum::<u64>() * (folds as u64 - 1) / folds as u64);
        CrossFit {
            n,
            folds,
            extras,
            levels,
            drawn: per_size,
            bin_of,
            n_bins,
            knots,
            fits: None,
            moments: (0..folds).map(|_| Moments::new(n, knots)).collect(),
            parts: vec![Sums::new(n); folds],
            all: Sums::new(n),
            members: Vec::with_capacity(n),
            added: 0,
        }
    }

    /// Builds and factors each fold's Gram matrix from the strata's coalitions, all drawn (not
    /// necessarily valued): the folds one after another (beside the game, which has the other
    /// core; the matrices, a few megabytes, are allocated there too) or `in_parallel`.
    fn prepare(&mut self, draws: &[Draws], in_parallel: bool) {
        self.fits = Some(self.factored(draws, in_parallel));
    }

    fn factored(&mut self, draws: &[Draws], in_parallel: bool) -> Result<Vec<Fit>> {
        let (n, folds) = (self.n, self.folds);
        let mut grams: Vec<Gram> = (0..folds).map(|_| Gram::new(n, self.knots)).collect();
        let (mut parts, mut all) = (vec![Counts::new(n); folds], Counts::new(n));
        for d in draws {
            parts.iter_mut().for_each(Counts::clear);
            count(d, folds, &mut parts, &mut self.members);
            all.clear();
            parts.iter().for_each(|part| all.merge(part));
            all.mirror();
            let weight = fit_weight(n, d.size, self.drawn[d.size] as f64);
            let all = &all;
            // Fold k's surrogate is fitted on the other folds: all the draws less fold k's.
            let add_fold = |(part, gram): (&mut Counts, &mut Gram)| {
                part.mirror();
                gram.add(d.size, all, part, weight);
            };
            if in_parallel {
                parts.par_iter_mut().zip(grams.par_iter_mut()).for_each(add_fold);
            } else {
                parts.iter_mut().zip(grams.iter_mut()).for_each(add_fold);
            }
        }
        let (bin_of, n_bins) = (&self.bin_of, self.n_bins);
        if in_parallel {
            grams.into_par_iter().map(|gram| gram.factor(bin_of, n_bins)).collect()
        } else {
            grams.into_iter().map(|gram| gram.factor(bin_of, n_bins)).collect()
        }
    }

    /// Adds the next stratum's values, all of them known, to every fold's right-hand side
    /// but its own.
    fn add(&mut self, d: &Draws) {
        let CrossFit { parts, all, moments, members, folds, .. } = self;
        parts.iter_mut().for_each(Sums::clear);
        for (j, (set, &v)) in d.sets.iter().zip(&d.values).enumerate() {
            members_of(set, members);
            parts[j % *folds].add(members, v);
        }
        all.clear();
        parts.iter().for_each(|part| all.merge(part));
        let weight = fit_weight(self.n, d.size, self.drawn[d.size] as f64);
        moments.iter_mut().zip(parts.iter()).for_each(|(moments, part)| moments.add(d.size, all, part, weight));
        self.added += 1;
    }

    /// Fold k's surrogate when the game may be two-valued: a step (or staircase) fitted on the
    /// training pairs with the linear part refitted to what it leaves, or `linear` alone.
    /// Which, is decided on the training folds only, by one of them (the next fold, v) held
    /// out: a step fitted without v, with its linear part, must leave v's pairs a smaller
    /// weighted sum of squares than `linear` does. (The training pairs' own sum cannot decide:
    /// at n = 300 a step fits them exactly and misclassifies more of the other pairs than the
    /// linear part leaves.)
    fn with_step(
        &self,
        draws: &[Draws],
        k: usize,
        fit: &Fit,
        moments: &Moments,
        linear: Surrogate,
    ) -> (Surrogate, Option<Step>) {
        let folds = self.folds;
        let v = (k + 1) % folds;
        let train = |j: usize| j % folds != k;
        let Some(inner) = self.step_fitted(draws, |j| train(j) && j % folds != v) else { return (linear, None) };
        let validated = |j: usize| j % folds == v;
        let with_inner = self.stepped(draws, fit, moments, &inner, train);
        if self.left(draws, &with_inner, Some(&inner), validated) >= self.left(draws, &linear, None, validated) {
            return (linear, None);
        }
        match self.step_fitted(draws, train) {
            Some(step) => (self.stepped(draws, fit, moments, &step, train), Some(step.with_means())),
            None => (linear, None),
        }
    }

    /// The step fitted on the pairs `keep` takes (None when the game is not two-valued on
    /// them).
    fn step_fitted(&self, draws: &[Draws], keep: impl Fn(usize) -> bool) -> Option<Step> {
        let outcomes: Vec<Outcome> = draws
            .iter()
            .flat_map(|d| {
                let kept = d.sets.iter().zip(&d.outcomes).enumerate().filter(|&(j, _)| keep(j));
                kept.map(|(_, (set, &[inside, outside]))| Outcome { set, inside, outside })
            })
            .collect();
        let [low, high] = self.levels;
        threshold::fit(self.n, &outcomes, low, high).map(Step::new)
    }

    /// The linear part fitted to what `step` leaves of the pairs `train` takes (those whose
    /// values `moments` sum).
    fn stepped(
        &self,
        draws: &[Draws],
        fit: &Fit,
        moments: &Moments,
        step: &Step,
        train: impl Fn(usize) -> bool,
    ) -> Surrogate {
        self.refitted(draws, fit, moments, train, |_, _, members| Step::value(Some(step), members))
    }

    /// The linear part fitted to what `part` (of a pair's stratum, place and members) leaves
    /// of the pairs `train` takes (those whose values `moments` sum).
    fn refitted(
        &self,
        draws: &[Draws],
        fit: &Fit,
        moments: &Moments,
        train: impl Fn(usize) -> bool,
        part: impl Fn(usize, usize, &[usize]) -> f64,
    ) -> Surrogate {
        let n = self.n;
        let mut less = moments.clone();
        let (mut sums, nothing, mut members) = (Sums::new(n), Sums::new(n), Vec::with_capacity(n));
        for (k, d) in draws.iter().enumerate() {
            sums.clear();
            for (j, set) in d.sets.iter().enumerate().filter(|&(j, _)| train(j)) {
                members_of(set, &mut members);
                sums.add(&members, -part(k, j, &members));
            }
            less.add(d.size, &sums, &nothing, fit_weight(n, d.size, self.drawn[d.size] as f64));
        }
        fit.solve(&less, &self.bin_of)
    }

    /// Interaction features (surrogate.rs) screened on what `linear` (and `step`) leave of the
    /// pairs `train` takes, fitted jointly with the linear part, which is refitted to what
    /// they leave: the fold's surrogate.
    fn with_interactions(
        &self,
        draws: &[Draws],
        fit: &Fit,
        moments: &Moments,
        mut linear: Surrogate,
        step: Option<Step>,
        train: impl Fn(usize) -> bool + Copy,
    ) -> (Surrogate, Option<Step>, Interactions) {
        let n = self.n;
        let residuals = self.residuals(draws, &linear, step.as_ref(), train);
        let strata: Vec<Stratum> = draws
            .iter()
            .zip(residuals)
            .map(|(d, residuals)| Stratum {
                size: d.size,
                sets: &d.sets,
                values: &d.values,
                residuals,
                weight: fit_weight(n, d.size, self.drawn[d.size] as f64),
            })
            .collect();
        let features = Interactions::fit(n, &strata, train, |features| {
            let stepped = |k: usize, j: usize, members: &[usize]| Step::value(step.as_ref(), members) + features[k][j];
            linear = self.refitted(draws, fit, moments, train, stepped);
            self.residuals(draws, &linear, step.as_ref(), train)
        });
        (linear, step, features)
    }

    /// What `g` (and `step`) leave of the value of each pair of `d` that `keep` takes, with
    /// the pair's place.
    fn stratum_residuals<'s>(
        &self,
        d: &'s Draws,
        g: &'s Surrogate,
        step: Option<&'s Step>,
        keep: impl Fn(usize) -> bool + 's,
    ) -> impl Iterator<Item = (usize, f64)> + 's {
        let slopes = g.slopes(d.size, &mut Vec::new());
        let mut members = Vec::with_capacity(self.n);
        d.sets.iter().zip(&d.values).enumerate().filter(move |&(j, _)| keep(j)).map(move |(j, (set, &v))| {
            members_of(set, &mut members);
            (j, g.residual(&members, &slopes, v - Step::value(step, &members)))
        })
    }

    /// What `linear` (and `step`) leave of the value of each pair `keep` takes, per stratum
    /// (zero at the others).
    fn residuals(
        &self,
        draws: &[Draws],
        linear: &Surrogate,
        step: Option<&Step>,
        keep: impl Fn(usize) -> bool + Copy,
    ) -> Vec<Vec<f64>> {
        draws
            .iter()
            .map(|d| {
                let mut residuals = vec![0.0; d.values.len()];
                self.stratum_residuals(d, linear, step, keep).for_each(|(j, r)| residuals[j] = r);
                residuals
            })
            .collect()
    }

    /// The weighted sum of squares that `g` (and `step`) leave of the pairs `keep` takes.
    fn left(&self, draws: &[Draws], g: &Surrogate, step: Option<&Step>, keep: impl Fn(usize) -> bool + Copy) -> f64 {
        let n = self.n;
        let mut total = 0.0;
        for d in draws {
            let squares = self.stratum_residuals(d, g, step, keep).fold(0.0, |squares, (_, r)| squares + r * r);
            total += fit_weight(n, d.size, self.drawn[d.size] as f64) * squares;
        }
        total
    }

    /// The sampled strata's part of the values and its standard error: each pair's
    /// contribution with the surrogate fitted without its fold, averaged per size. The strata
    /// not yet added come first, in order; the folds' fits, then the strata's sums, run in
    /// parallel.
    fn finish(mut self, draws: &[Draws]) -> Result<(Vec<f64>, Vec<f64>)> {
        let fits = match self.fits.take() {
            Some(fits) => fits,
            None => self.factored(draws, true),
        }?;
        draws[self.added..].iter().for_each(|d| self.add(d));
        let (n, folds, bin_of) = (self.n, self.folds, &self.bin_of);
        let fitted: Vec<(Surrogate, Option<Step>, Interactions)> = fits
            .par_iter()
            .zip(self.moments.par_iter())
            .enumerate()
            .map(|(k, (fit, moments))| {
                let linear = fit.solve(moments, bin_of);
                let (linear, step) =
                    if self.extras.threshold { self.with_step(draws, k, fit, moments, linear) } else { (linear, None) };
                if self.extras.interactions {
                    self.with_interactions(draws, fit, moments, linear, step, |j| j % folds != k)
                } else {
                    (linear, step, Interactions::none())
                }
            })
            .collect();
        let mut surrogates = Vec::with_capacity(folds);
        let (mut steps, mut interactions) = (Vec::with_capacity(folds), Vec::with_capacity(folds));
        for (g, step, features) in fitted {
            surrogates.push(g);
            steps.push(step);
            interactions.push(features);
        }
        let strata: Vec<Contributions> =
            draws.par_iter().map(|d| stratum_contributions(n, d, &surrogates, &steps, &interactions, folds)).collect();
        let (mut values, mut variance, mut unsureness) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
        for stratum in &strata {
            values.iter_mut().zip(&stratum.mean).for_each(|(v, m)| *v += m);
            variance.iter_mut().zip(&stratum.variance).for_each(|(v, s)| *v += s);
            unsureness.iter_mut().zip(&stratum.unsureness).for_each(|(u, s)| *u += s);
        }
        Ok((values, t_scaled(&variance, &unsureness)))
    }
}

/// Counts a stratum's draws per fold (`parts`, cleared before).
fn count(d: &Draws, folds: usize, parts: &mut [Counts], members: &mut Vec<usize>) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the processor has AVX2, checked just above.
        return unsafe { count_avx2(d, folds, parts, members) };
    }
    count_lanes(d, folds, parts, members)
}

/// [`count`] with 256-bit vector registers (integer counts: the same result).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn count_avx2(d: &Draws, folds: usize, parts: &mut [Counts], members: &mut Vec<usize>) {
    count_lanes(d, folds, parts, members)
}

#[inline(always)]
fn count_lanes(d: &Draws, folds: usize, parts: &mut [Counts], members: &mut Vec<usize>) {
    for (j, set) in d.sets.iter().enumerate() {
        members_of(set, members);
        parts[j % folds].add(members);
    }
}

/// One stratum's part of every player's value: the mean contribution, the variance of that
/// mean, and the variance of that variance's estimate (for the degrees of freedom).
struct Contributions {
    mean: Vec<f64>,
    variance: Vec<f64>,
    unsureness: Vec<f64>,
}

/// One stratum's mean contribution per player, the variance of that mean and how sure that
/// variance is ([`Contributions`]).
fn stratum_contributions(
    n: usize,
    d: &Draws,
    surrogates: &[Surrogate],
    steps: &[Option<Step>],
    interactions: &[Interactions],
    folds: usize,
) -> Contributions {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the processor has AVX2, checked just above.
        return unsafe { stratum_contributions_avx2(n, d, surrogates, steps, interactions, folds) };
    }
    stratum_contributions_lanes(n, d, surrogates, steps, interactions, folds)
}

/// [`stratum_contributions`] with 256-bit vector registers: its loop over the players is
/// element by element, so wider registers give the same bits (no fused multiply-add).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn stratum_contributions_avx2(
    n: usize,
    d: &Draws,
    surrogates: &[Surrogate],
    steps: &[Option<Step>],
    interactions: &[Interactions],
    folds: usize,
) -> Contributions {
    stratum_contributions_lanes(n, d, surrogates, steps, interactions, folds)
}

#[inline(always)]
fn stratum_contributions_lanes(
    n: usize,
    d: &Draws,
    surrogates: &[Surrogate],
    steps: &[Option<Step>],
    interactions: &[Interactions],
    folds: usize,
) -> Contributions {
    let s = d.size;
    let middle = if 2 * s == n { 0.5 } else { 1.0 };
    let (mut sum, mut squares) = (vec![0.0; n], vec![0.0; n]);
    let (mut basis, mut members) = (Vec::new(), Vec::with_capacity(n));
    let slopes: Vec<Vec<f64>> = surrogates.iter().map(|g| g.slopes(s, &mut basis)).collect();
    // The pair's residual half difference counts twice (S in stratum s, N - S in n - s), its
    // surrogate term too; the middle stratum n / 2 is its own partner. A step's term is its
    // means at both sizes (Step::term).
    let mut terms: Vec<Vec<f64>> = surrogates
        .iter()
        .zip(&slopes)
        .zip(steps)
        .map(|((g, b), step)| {
            let linear = g.shapley_term(b).into_iter().map(|t| 2.0 * middle * t);
            match step {
                Some(step) => linear.zip(step.term(n, s)).map(|(a, b)| a + b).collect(),
                None => linear.collect(),
            }
        })
        .collect();
    terms.iter_mut().zip(interactions).for_each(|(terms, features)| features.add_terms(n, s, 2.0 * middle, terms));
    // Membership as booleans, a row per pair: the loop over players below is then branch free.
    let inside_of = d.sets.to_bools();
    let mut residuals = Vec::with_capacity(d.values.len());
    for (j, ((set, &v), inside_row)) in d.sets.iter().zip(&d.values).zip(inside_of.chunks_exact(n)).enumerate() {
        members_of(set, &mut members);
        let k = j % folds;
        let left = v - Step::value(steps[k].as_ref(), &members);
        let r = 2.0 * middle * (surrogates[k].residual(&members, &slopes[k], left) - interactions[k].value(set));
        residuals.push(r);
        let (inside, outside) = (r / s as f64, -r / (n - s) as f64);
        let players = sum.iter_mut().zip(squares.iter_mut()).zip(inside_row).zip(&terms[k]);
        for (((total, total_squares), &is_inside), term) in players {
            let contribution = if is_inside { inside } else { outside } + term;
            *total += contribution;
            *total_squares += contribution * contribution;
        }
    }
    let m = d.values.len() as f64;
    let mean: Vec<f64> = sum.iter().map(|total| total / m).collect();
    let variance: Vec<f64> =
        mean.iter().zip(&squares).map(|(mean, q)| (q / m - mean * mean).max(0.0) / (m - 1.0)).collect();
    // The fourth central moment, a second pass over the residuals kept above.
    let mut fourth = vec![0.0; n];
    for (j, (&r, inside_row)) in residuals.iter().zip(inside_of.chunks_exact(n)).enumerate() {
        let (inside, outside) = (r / s as f64, -r / (n - s) as f64);
        let players = fourth.iter_mut().zip(inside_row).zip(&terms[j % folds]).zip(&mean);
        for (((total, &is_inside), term), mean) in players {
            let deviation = if is_inside { inside } else { outside } + term - mean;
            let square = deviation * deviation;
            *total += square * square;
        }
    }
    let unsureness =
        variance.iter().zip(&fourth).map(|(&v, &q)| variance_of_variance(v * m, q / m, m, folds) / (m * m)).collect();
    Contributions { mean, variance, unsureness }
}

/// The variance of a sample variance `s2` of `m` draws whose fourth central moment is
/// `fourth`, (mu4 - s2^2 (m - 3) / (m - 1)) / m, at least the Gaussian draws' 2 s2^2 / (m -
/// folds) (each fold's surrogate takes one degree of freedom, as a mean would). A stratum's
/// contributions are far from Gaussian at the smallest sizes: a player is in a pair of size s
/// with probability s / n and its contribution is then (n - s) / s times larger, a mixture of
/// kurtosis 7 at n = 8, s = 2, which leaves a third of the degrees of freedom that Gaussian
/// draws would.
pub(super) fn variance_of_variance(s2: f64, fourth: f64, m: f64, folds: usize) -> f64 {
    let gaussian = 2.0 * s2 * s2 / (m - folds as f64).max(1.0);
    ((fourth - s2 * s2 * (m - 3.0) / (m - 1.0)) / m).max(gaussian)
}

/// Standard errors from each player's variance, a sum over strata, and `unsureness`, the sum
/// of the variances of those strata's estimates: scaled to Student's t on the sum's
/// Welch-Satterthwaite degrees of freedom, variance^2 / unsureness, so that value +- 1.96
/// stderr is a 95% interval.
pub(super) fn t_scaled(variance: &[f64], unsureness: &[f64]) -> Vec<f64> {
    variance
        .iter()
        .zip(unsureness)
        .map(|(v, u)| {
            let freedom = v * v / u;
            let scale = if freedom.is_finite() { z_scale(freedom.clamp(1.0, 1e6).round() as usize) } else { 1.0 };
            v.sqrt() * scale
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{Plan, binomial, settled_sizes, share};
    use crate::shapley::games::WeightedVotingGame;

    #[test]
    fn a_noisy_plan_spends_its_budget_by_neymans_rule() {
        for (n, budget) in [(10, 300), (10, 2000), (30, 1000), (30, 10_000), (100, 10_000), (300, 1000)] {
            for least in [1, 2] {
                let plan = Plan::noisy(n, budget, least);
                let census: u64 = plan.census.iter().map(|&s| plan.repeats[s] * binomial(n, s).round() as u64).sum();
                assert_eq!(2 * plan.repeats[0] + census + plan.pool, budget, "n = {n}, budget = {budget}");
                assert_eq!(plan.repeats[0], plan.repeats[n]);
                assert!(plan.repeats[0] >= least && plan.census.iter().all(|&s| plan.repeats[s] >= least));
                // The census is the sizes from the edges inward, each with its complement.
                let low: Vec<usize> = plan.census.iter().copied().filter(|&s| s <= n / 2).collect();
                assert_eq!(low, (1..=low.len()).collect::<Vec<_>>());
                assert!(low.iter().all(|&s| plan.census.contains(&(n - s)) && plan.repeats[s] == plan.repeats[n - s]));
                assert_eq!(plan.sampled, (low.len() + 1..=n / 2).collect::<Vec<_>>());
                // Draws in proportion to sqrt(noise variance per draw / cost): 1 / n for each
                // bound, 1 / sqrt(s (n - s)) for a pair of size s; a census coalition drawn r
                // times stands for r pairs per coalition.
                let t = plan.repeats[0] as f64 * n as f64;
                for &s in &low {
                    let pairs = plan.repeats[s] as f64 * binomial(n, s) / if 2 * s == n { 2.0 } else { 1.0 };
                    let wanted = t * share(n, s);
                    assert!(
                        pairs <= wanted * 1.1 && pairs + binomial(n, s) >= wanted * 0.9,
                        "size {s}: {pairs} vs {wanted}"
                    );
                }
            }
        }
        // n = 10, 2,000 evaluations: each bound drawn 77 times, the sizes 1 and 9 a census of
        // 25 draws a coalition, 2 and 8 of 4; sizes 3-5 sampled.
        let plan = Plan::noisy(10, 2000, 2);
        assert_eq!((plan.repeats[0], plan.repeats[1], plan.repeats[2]), (77, 25, 4));
        assert_eq!((plan.census, plan.sampled), (vec![1, 9, 2, 8], vec![3, 4, 5]));
    }

    #[test]
    fn a_pilot_settles_the_sizes_where_no_pair_can_swing() {
        // 20 players of weight 1 and 20 of weight 2 (60 in all), quota 36. A pair (S, N - S)
        // of size s <= 12 always pairs a loss (w(S) <= 2s < 36) with a win (w(N - S) >= 60 -
        // 2s >= 36): settled whatever is drawn. At s = 16 and 17, N - S wins about half the time.
        let weights = (0..40).map(|i| if i % 2 == 0 { 1.0 } else { 2.0 }).collect();
        let game = WeightedVotingGame::new(weights, 36.0).expect("a valid game");
        let sampled: Vec<usize> = (2..=20).collect();
        let mut evaluations = 0;
        let settled = settled_sizes(&game, &sampled, 10_000, 7, &mut evaluations).expect("valued");
        assert_eq!(evaluations, 2 * 8 * sampled.len() as u64, "8 pairs a size");
        assert!((2..=12).all(|s| settled[s]), "{settled:?}");
        assert!(!settled[16] && !settled[17], "{settled:?}");

        let mut evaluations = 0;
        let settled = settled_sizes(&game, &sampled, 400, 7, &mut evaluations).expect("valued");
        assert_eq!((evaluations, settled.iter().any(|&s| s)), (0, false), "no pilot below 4 pairs a size");
    }
}
