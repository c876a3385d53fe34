//! KernelSHAP as a constrained weighted regression (Lundberg & Lee 2017), sampled the way
//! Leverage SHAP recommends (Musco & Witter 2025): coalition sizes whose coalitions all fit
//! in the budget are enumerated (smallest and largest first, in complementary pairs); the
//! rest are drawn with sizes uniform, in complementary pairs, without replacement, each size
//! carrying its Shapley-kernel mass shared among its draws. The fit is solved with the
//! efficiency constraint, so values sum to v(N) - v(empty) exactly.
//!
//! Standard error: delete-a-group jackknife, linearised. The sampled pairs are dealt into up
//! to [`GROUPS`] groups; the change of the fit without each group in turn (the rest scaled up
//! to the whole) is taken to first order, one solve with the whole fit's factor, each pair's
//! residual corrected for its leverage, and t-scaled on Satterthwaite's degrees of freedom
//! (see [`Design::jackknife`]). The refits themselves, used before, move more than the fit
//! does where the regression is barely determined (a non-linear statistic's delete-a-group
//! spread is biased up): at 1,000 evaluations intervals covered 0.96-0.98 at 30-100 players and
//! 0.99-1.00 at 300. (Half the gap between two half fits, used before that, is an estimate with
//! one degree of freedom: its intervals covered about 70% instead of 95%.) Not covered: the
//! regression's finite-sample bias, a quarter of the squared error on full-order games where
//! the sampled pairs are fewer than the players (n = 300, 1,000 evaluations: 91% coverage).

use rand::RngExt;
use rayon::prelude::*;

use super::coalition::{CoalitionMap, Coalitions, contains, members_of};
use super::exact::{self, binomial};
use super::game::{Game, bounds};
use super::linalg::{Factor, cholesky, symmetric_products};
use super::pipeline::{Sink, value_streamed};
use super::sampling::stream;
use super::{Estimate, Stopping};
use crate::error::{MasreplayError, Result};
use crate::student_t::z_scale;

/// Draw attempts per wanted coalition before a size is taken as exhausted.
const MAX_REDRAWS: usize = 64;
/// Jackknife groups: enough degrees of freedom for a steady error (the standard error is
/// scaled to t with groups - 1 degrees of freedom, so value +- 1.96 stderr is a 95% interval).
const GROUPS: usize = 64;
/// Most bytes of factored normal equations held from the drawing to the last valuation (see
/// [`Design::prepare`]): two n x n matrices (three with the jackknife's K), so up to about
/// 2,000 players; past that the fit is factored after the last valuation.
const MOST_PREPARED_BYTES: usize = 64 << 20;

pub fn kernel(game: &dyn Game, stopping: &Stopping) -> Result<Estimate> {
    let n = game.n_players();
    let (empty, full) = bounds(game)?;
    let delta = full - empty;
    if n == 1 {
        return Ok(Estimate::of_one_player(delta).with_target(stopping));
    }
    if stopping.budget < 2 + 2 {
        return Err(MasreplayError::InvalidArgument(format!(
            "budget: {} evaluations cannot cover one complementary pair of coalitions (needs 4)",
            stopping.budget
        )));
    }
    // Whole size pairs (s, n - s) are enumerated while they fit; the budget left is drawn.
    let mut left = stopping.budget - 2;
    let mut enumerated = Vec::new();
    let mut low = 1;
    while low <= n - low {
        let high = n - low;
        let count = if low == high { binomial(n, low) } else { 2.0 * binomial(n, low) };
        if count > left as f64 {
            break;
        }
        enumerated.extend(if low == high { vec![low] } else { vec![low, high] });
        left -= count as u64;
        low += 1;
    }
    let complete = low > n - low;
    let drawn = if complete { 0 } else { left - left % 2 };
    let planned = (stopping.budget - 2 - left + drawn) as usize;
    // Drawn on the worker while the game values the first chunks (see [`value_streamed`]),
    // the fits factored there (they depend on the coalitions only), the values summed part by
    // part as they come in.
    let (mut design, seed) = (Design::new(n, complete), stopping.seed);
    // Every part the draws can fill, allocated here rather than on the worker, whose memory
    // is fresh (zeroed and faulted in) on every run.
    let most_parts = 1 + (drawn / 2).min(GROUPS as u64) as usize;
    design.parts = (0..most_parts).map(|_| Part::new(n)).collect();
    let draw = |design: &mut Design, sink: &mut Sink| {
        for &size in &enumerated {
            let weight = mass(n, size) / binomial(n, size);
            for_each_subset(n, size, |set| design.push(sink, set, weight, 0, false));
        }
        if drawn >= 2 {
            design.draw_pairs(sink, (low..=n / 2).collect(), drawn, seed);
        }
        design.parts.truncate(design.part_of.iter().max().map_or(1, |p| p + 1));
    };
    let valued = value_streamed(game, planned, &mut design, draw, |design, batch, worth| {
        design.prepare(batch, worth.len() < batch.len());
        design.sum(batch, worth, empty)
    })?;
    let groups = design.parts.len() - 1;
    // Every coalition valued: the Shapley weights give the values exactly (the regression's
    // ridge would leave them ~1e-10 off while reporting a zero error).
    if complete {
        let mut rows = Coalitions::new(n);
        enumerated.iter().for_each(|&size| for_each_subset(n, size, |set| rows.push(set)));
        let values = exact::from_every_coalition(n, empty, full, rows.iter().zip(valued.worth.iter().copied()));
        let evaluations = 2 + valued.distinct as u64;
        return Ok(
            Estimate { values, stderr: vec![0.0; n], evaluations, converged: true, exact: true }.with_target(stopping)
        );
    }
    // The fit factored beside the game is solved here; past [`MOST_PREPARED_BYTES`] it is
    // factored here first.
    let normal = match design.normal.take() {
        Some(normal) => normal?,
        None => Normal::of(n, sum_grams(n, &design.parts))?,
    };
    let values = normal.solve(&sum_rhs(&design.parts), delta);
    let stderr = match groups {
        0 => vec![0.0; n],
        1 => vec![f64::NAN; n],
        _ => {
            let sensitivity = design.sensitivity.take().unwrap_or_else(|| design.sensitivity(&normal, true));
            // Drawn without replacement: the jackknife's with-replacement variance shrinks by
            // the share of each size left unsampled (the least of them, so never too far:
            // near complete enumeration it covered 100% without it; negligible when few of
            // a size's coalitions are drawn).
            let spread = design.jackknife(&sensitivity, &values, &valued.worth, delta);
            spread
                .into_iter()
                .map(|(variance, dof)| (design.unsampled_share * variance).sqrt() * z_scale(dof))
                .collect()
        }
    };
    Ok(Estimate { values, stderr, evaluations: 2 + valued.distinct as u64, converged: false, exact: false }
        .with_target(stopping))
}

/// The Shapley kernel's mass of coalition size s, shared among the coalitions of that size.
fn mass(n: usize, s: usize) -> f64 {
    (n - 1) as f64 / (s * (n - s)) as f64
}

/// The design, row by row as drawn: per row its regression weight and its part (0 for an
/// enumerated row, in every fit; 1 + its jackknife group for a drawn one); each part's normal
/// equations, the Gram side summed once every row is drawn and the right-hand side as the
/// values come in; and the whole fit's factored normal equations ([`Design::prepare`]).
struct Design {
    n: usize,
    /// Whether every coalition is enumerated (the values are then exact, with no fit).
    complete: bool,
    weights: Vec<f64>,
    part_of: Vec<usize>,
    /// Whether a row is the smaller side of a drawn pair whose complement is the next row
    /// (the two are summed together, see [`Part::add`]).
    paired: Vec<bool>,
    /// The least share of a sampled size's coalitions left undrawn: the finite-population
    /// factor of the jackknife's variance (see the standard error in [`kernel`]).
    unsampled_share: f64,
    parts: Vec<Part>,
    /// Whether the Gram sides are summed ([`Design::prepare`]).
    prepared: bool,
    /// The whole sample's factored normal equations, where they fit in [`MOST_PREPARED_BYTES`]
    /// (none when every coalition is enumerated).
    normal: Option<Result<Normal>>,
    /// What the standard error needs of the coalitions alone, beside `normal` (none where
    /// that is none, or every pair is in one group).
    sensitivity: Option<Sensitivity>,
    /// The rows' coalitions, kept once every row is drawn (the standard error's residuals).
    rows: Coalitions,
    /// The first drawn row: from there on the rows come in complementary pairs.
    first_drawn: usize,
    /// Rows summed so far, and scratch for summing more.
    summed: usize,
    members: Vec<usize>,
}

impl Design {
    fn new(n: usize, complete: bool) -> Self {
        Design {
            n,
            complete,
            weights: Vec::new(),
            part_of: Vec::new(),
            paired: Vec::new(),
            unsampled_share: 1.0,
            parts: Vec::new(),
            prepared: false,
            normal: None,
            sensitivity: None,
            rows: Coalitions::new(n),
            first_drawn: 0,
            summed: 0,
            members: Vec::with_capacity(n),
        }
    }

    fn push(&mut self, sink: &mut Sink, set: &[u64], weight: f64, part: usize, paired: bool) {
        sink.push(set);
        self.weights.push(weight);
        self.part_of.push(part);
        self.paired.push(paired);
    }

    /// Draws `budget` coalitions of the sizes `sizes` and their complements: sizes uniform,
    /// in complementary pairs, without replacement, each pair dealt to the next of
    /// [`GROUPS`] jackknife groups; each size's rows weigh its mass shared among its draws.
    fn draw_pairs(&mut self, sink: &mut Sink, sizes: Vec<usize>, mut budget: u64, seed: u64) {
        let n = self.n;
        let mut rng = stream(seed, u64::MAX);
        let mut drawn: CoalitionMap<()> = CoalitionMap::default();
        let first_row = self.weights.len();
        self.first_drawn = first_row;
        // Per row drawn its size; per size its draws.
        let (mut size_of, mut per_size) = (Vec::new(), vec![0usize; n + 1]);
        let (mut misses, mut pairs) = (0, 0usize);
        while budget >= 2 && misses < MAX_REDRAWS * 16 && !sink.stopped() {
            let size = sizes[rng.random_range(0..sizes.len())];
            let set = random_subset(&mut rng, n, size, sink.words());
            if drawn.insert(set.clone(), ()).is_some() {
                misses += 1;
                continue;
            }
            let complement = complement_of(&set, n);
            drawn.insert(complement.clone(), ());
            misses = 0;
            let part = 1 + pairs % GROUPS;
            pairs += 1;
            for (side, set) in [(size, set), (n - size, complement)] {
                self.push(sink, &set, 0.0, part, side < n - side);
                size_of.push(side);
                per_size[side] += 1;
            }
            budget -= 2;
        }
        self.unsampled_share = sizes
            .iter()
            .filter(|&&size| per_size[size] > 0)
            .map(|&size| 1.0 - per_size[size] as f64 / binomial(n, size))
            .fold(1.0, f64::min)
            .max(0.0);
        for (weight, size) in self.weights[first_row..].iter_mut().zip(size_of) {
            *weight = mass(n, size) / per_size[size] as f64;
        }
    }

    /// Once every row is drawn (the first valued chunk's call): sums each part's Gram side,
    /// which depends on the coalitions and weights only, part by part, each part's rows in
    /// order (the same sums, bit for bit, as row by row as the values come in: consecutive
    /// pairs belong to different groups, and a part's matrix stays in cache while its rows are
    /// added instead of each row fetching another one's); then builds and factors the whole
    /// sample's normal equations and what the standard error needs of them ([`Sensitivity`]),
    /// while the game values the rest. In parallel where the game is done (`pending` false),
    /// else one after another on this worker thread.
    fn prepare(&mut self, batch: &Coalitions, pending: bool) {
        if self.prepared {
            return;
        }
        self.prepared = true;
        self.rows = batch.clone();
        let Design { n, weights, part_of, paired, parts, members, .. } = self;
        let mut order = Vec::with_capacity(part_of.len());
        let mut r = 0;
        while r < part_of.len() {
            order.push(r);
            r += if paired[r] { 2 } else { 1 };
        }
        order.sort_by_key(|&r| part_of[r]);
        let (order, part_of) = (&order, &*part_of);
        let add_part = |members: &mut Vec<usize>, (p, part): (usize, &mut Part)| {
            let rows = order.partition_point(|&r| part_of[r] < p)..order.partition_point(|&r| part_of[r] <= p);
            for &r in &order[rows] {
                let set = batch.get(r);
                members_of(set, members);
                part.add_row(set, members, weights[r], paired[r]);
            }
        };
        if pending {
            parts.iter_mut().enumerate().for_each(|part| add_part(members, part));
        } else {
            parts.par_iter_mut().enumerate().for_each_init(|| Vec::with_capacity(*n), add_part);
        }
        let bytes = 2 * self.n * self.n * std::mem::size_of::<f64>();
        if self.complete || bytes > MOST_PREPARED_BYTES {
            return;
        }
        let normal = Normal::of(self.n, sum_grams(self.n, &self.parts));
        if let Ok(normal) = &normal
            && self.parts.len() > 2
        {
            self.sensitivity = Some(self.sensitivity(normal, !pending));
        }
        self.normal = Some(normal);
    }

    /// Per player, the jackknife variance of the whole fit `fit` and its degrees of freedom.
    ///
    /// Leaving group k out (the other groups scaled by g / (g - 1) to stand for the whole
    /// sample) moves the normal equations by g / (g - 1) (mean r - r_k), with r_k the group's
    /// residual contribution b_k - A_k phi, and the fit, to first order, by K of that, K the
    /// whole fit's inverse under efficiency. K 1 = 0, so a pair of rows z and 1 - z (weight w
    /// each) contributes w (e_z - e_c) z up to a multiple of 1, and its residual lies along
    /// the pair's leverage direction. A fitted residual is smaller than the error it stands
    /// for: each pair's is divided by the square root of its share left (see
    /// [`Sensitivity::left`]). The degrees of freedom are Satterthwaite's for a sum of the
    /// groups' squares (see [`Sensitivity::shares`]). Groups in parallel.
    fn jackknife(&self, sensitivity: &Sensitivity, fit: &[f64], worth: &[f64], total: f64) -> Vec<(f64, usize)> {
        let n = self.n;
        let Sensitivity { inverse, left, shares } = sensitivity;
        let g = shares.len() as f64;
        // Per group: its leverage-corrected residual contribution.
        let residuals: Vec<Vec<f64>> = self
            .pairs_of_groups()
            .par_iter()
            .map(|pairs| {
                let (mut residual, mut members) = (vec![0.0; n], Vec::with_capacity(n));
                for &r in pairs {
                    let left = left[(r - self.first_drawn) / 2];
                    // None left (to rounding): the fit passes through the pair whatever its
                    // values, and its residual, zero, says nothing.
                    if left <= 0.0 {
                        continue;
                    }
                    members_of(self.rows.get(r), &mut members);
                    let inside: f64 = members.iter().map(|&a| fit[a]).sum();
                    // e_z - e_c: (y_z - z'phi) - (y_c - (total - z'phi)).
                    let gap = worth[r] - worth[r + 1] - 2.0 * inside + total;
                    members.iter().for_each(|&a| residual[a] += self.weights[r] * gap / left.sqrt());
                }
                residual
            })
            .collect();
        let mean: Vec<f64> = (0..n).map(|i| residuals.iter().map(|r| r[i]).sum::<f64>() / g).collect();
        let changes: Vec<Vec<f64>> = residuals
            .par_iter()
            .map(|r| {
                let moved: Vec<f64> = mean.iter().zip(r).map(|(m, r)| g / (g - 1.0) * (m - r)).collect();
                inverse.iter().map(|row| row.iter().zip(&moved).map(|(k, m)| k * m).sum()).collect()
            })
            .collect();
        (0..n)
            .map(|i| {
                let mean = changes.iter().map(|d| d[i]).sum::<f64>() / g;
                let variance = (g - 1.0) / g * changes.iter().map(|d| (d[i] - mean).powi(2)).sum::<f64>();
                let (sum, squares) = shares.iter().fold((0.0, 0.0), |(s, q), v| (s + v[i], q + v[i] * v[i]));
                // A player no pair moves (sum 0) keeps the groups' count.
                let dof = if squares > 0.0 { sum * sum / squares * (g - 1.0) / g } else { g - 1.0 };
                (variance, (dof.floor() as usize).max(1))
            })
            .collect()
    }

    /// Per jackknife group, the first rows of its drawn pairs.
    fn pairs_of_groups(&self) -> Vec<Vec<usize>> {
        let mut pairs_of = vec![Vec::new(); self.parts.len() - 1];
        (self.first_drawn..self.part_of.len()).step_by(2).for_each(|r| pairs_of[self.part_of[r] - 1].push(r));
        pairs_of
    }

    /// What the jackknife needs of the coalitions alone, from the whole fit's normal equations:
    /// built beside the game where those are ([`Design::prepare`]), so that only the residuals
    /// are left once the last value is in. In parallel where `parallel` (not while a
    /// sequential game holds a core).
    fn sensitivity(&self, normal: &Normal, parallel: bool) -> Sensitivity {
        let n = self.n;
        // K column by column (symmetric: row by row too).
        let inverse: Vec<Vec<f64>> = indices(parallel, n, |a| {
            let mut unit = vec![0.0; n];
            unit[a] = 1.0;
            normal.solve(&unit, 0.0)
        });
        // E, the enumerated rows' Gram matrix, whole (the parts keep its lower triangle).
        let lower: Vec<Vec<f64>> = (0..n).map(|a| self.parts[0].lower_row(a).collect()).collect();
        let enumerated: Vec<Vec<f64>> =
            (0..n).map(|a| (0..n).map(|b| if b <= a { lower[a][b] } else { lower[b][a] }).collect()).collect();
        // x y, y's columns read as the rows of its transpose (the same products summed in the
        // same order as down y's columns, which are a cache miss a step at a few hundred players).
        let times = |x: &[Vec<f64>], y: &[Vec<f64>]| -> Vec<Vec<f64>> {
            let columns: Vec<Vec<f64>> = (0..n).map(|b| y.iter().map(|row| row[b]).collect()).collect();
            indices(parallel, n, |a| {
                columns.iter().map(|column| x[a].iter().zip(column).map(|(r, c)| r * c).sum()).collect()
            })
        };
        let through_fixed = times(&times(&inverse, &enumerated), &inverse);
        let pairs_of = self.pairs_of_groups();
        // Per group: its pairs' shares left, and its share of each player's variance.
        let (lefts, shares): (Vec<Vec<f64>>, Vec<Vec<f64>>) = indices(parallel, pairs_of.len(), |k| {
            let (mut left, mut share, mut members) = (Vec::new(), vec![0.0; n], Vec::with_capacity(n));
            for &r in &pairs_of[k] {
                members_of(self.rows.get(r), &mut members);
                let w = self.weights[r];
                let quadratic: f64 = members
                    .iter()
                    .map(|&a| members.iter().map(|&b| inverse[a][b] + through_fixed[a][b]).sum::<f64>())
                    .sum();
                left.push(1.0 - 2.0 * w * quadratic);
                let mut moved = vec![0.0; n];
                members.iter().for_each(|&a| moved.iter_mut().zip(&inverse[a]).for_each(|(m, k)| *m += k));
                share.iter_mut().zip(&moved).for_each(|(s, m)| *s += w * m * m);
            }
            (left, share)
        })
        .into_iter()
        .unzip();
        let mut left = vec![0.0; (self.part_of.len() - self.first_drawn) / 2];
        for (pairs, lefts) in pairs_of.iter().zip(lefts) {
            pairs.iter().zip(lefts).for_each(|(&r, l)| left[(r - self.first_drawn) / 2] = l);
        }
        Sensitivity { inverse, left, shares }
    }

    /// Adds the targets of the rows valued since the last call to their parts' right-hand
    /// sides (a pair's two rows together, once both are valued), in row order.
    fn sum(&mut self, batch: &Coalitions, worth: &[f64], empty: f64) {
        let Design { paired, parts, part_of, weights, summed, members, .. } = self;
        let mut r = *summed;
        while r < worth.len() {
            let rows = if paired[r] { 2 } else { 1 };
            if r + rows > worth.len() {
                break;
            }
            let set = batch.get(r);
            members_of(set, members);
            let complement_target = paired[r].then(|| worth[r + 1] - empty);
            parts[part_of[r]].add_target(set, members, weights[r], worth[r] - empty, complement_target);
            r += rows;
        }
        *summed = r;
    }
}

/// What the jackknife's standard error needs of the coalitions alone ([`Design::sensitivity`]).
struct Sensitivity {
    /// K, the whole fit's inverse under efficiency, row by row (symmetric).
    inverse: Vec<Vec<f64>>,
    /// Per drawn pair, the share of its error its fitted residual keeps, squared: with the
    /// sampled pairs' hat matrix H = M K M' (m = sqrt(2w) z per pair) and the enumerated rows'
    /// Gram matrix E fixed in every sample, the residuals are (I - H) times the errors, and
    /// K S K = K - K E K (S the sampled rows' Gram matrix), so under errors of equal spread
    /// a pair's squared residual is (I - H)^2_pp = 1 - 2w z'(K + K E K) z times its error's
    /// (HC2, MacKinnon & White 1985, with the fixed rows' share; without it, at 300 players
    /// and 1,000 evaluations, where the pairs are fewer than the players and the fit nearly
    /// interpolates them, intervals covered 35%).
    left: Vec<f64>,
    /// Per group, its share of each player's variance, its pairs' w (K z)_i^2: Satterthwaite's
    /// degrees of freedom are g - 1 when the groups weigh alike, fewer where a player's
    /// variance rests on a few pairs (barely determined fits).
    shares: Vec<Vec<f64>>,
}

/// `work` of each index below `count`, in order; in parallel where `parallel`.
fn indices<T: Send>(parallel: bool, count: usize, work: impl Fn(usize) -> T + Sync + Send) -> Vec<T> {
    if parallel { (0..count).into_par_iter().map(work).collect() } else { (0..count).map(work).collect() }
}

/// The Gram matrix of all the parts (its lower triangle, see [`Normal`]),
/// each cell added part after part. Rows of the matrix in parallel.
fn sum_grams(n: usize, parts: &[Part]) -> Vec<f64> {
    let mut gram = vec![0.0; n * n];
    gram.par_chunks_mut(n).enumerate().for_each(|(a, row)| {
        let row = &mut row[..=a];
        row.iter_mut().zip(parts[0].lower_row(a)).for_each(|(cell, x)| *cell = x);
        for part in &parts[1..] {
            row.iter_mut().zip(part.lower_row(a)).for_each(|(cell, x)| *cell += x);
        }
    });
    gram
}

/// The right-hand side of all the parts, added part after part.
fn sum_rhs(parts: &[Part]) -> Vec<f64> {
    let mut rhs = parts[0].rhs.clone();
    for part in &parts[1..] {
        rhs.iter_mut().zip(&part.rhs).for_each(|(a, b)| *a += b);
    }
    rhs
}

/// The weighted normal equations of a set of rows. A row's outer product x x' is summed over
/// the smaller side of its coalition: for a coalition of more than n / 2 players it is
/// 1 1' - 1 c' - c 1' + c c' with c its complement, whose weights and weighted complements are
/// kept apart and spread over the matrix once (a row costs min(s, n - s)^2 / 2 steps, not a
/// row of the matrix per member).
struct Part {
    n: usize,
    /// Lower triangle of the sum of w y y' over each row's smaller side y, packed row after
    /// row (see [`packed_row`]): half the bytes of a square, so that a part stays in the
    /// first-level cache while a chunk's rows of it are added.
    smaller: Vec<f64>,
    rhs: Vec<f64>,
    /// Sum of the weights of the complemented rows, and of their weighted complements.
    complemented: f64,
    complements: Vec<f64>,
    side: Vec<usize>,
    /// The row's weight at the players of its smaller side, 0 elsewhere.
    spread: Vec<f64>,
}

impl Part {
    fn new(n: usize) -> Self {
        Part {
            n,
            smaller: vec![0.0; n * (n + 1) / 2],
            rhs: vec![0.0; n],
            complemented: 0.0,
            complements: vec![0.0; n],
            side: Vec::new(),
            spread: vec![0.0; n],
        }
    }

    /// Adds coalition `set`'s row (players `members`, ascending) with its weight to the Gram
    /// side; with `paired`, its complement's row too, of the same weight (`set` the smaller
    /// side).
    fn add_row(&mut self, set: &[u64], members: &[usize], weight: f64, paired: bool) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the processor has AVX2, checked just above.
            return unsafe { self.add_row_avx2(set, members, weight, paired) };
        }
        self.add_row_lanes(set, members, weight, paired)
    }

    /// [`Part::add_row`] with 256-bit vector registers (its sums are element by element: the
    /// same bits).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn add_row_avx2(&mut self, set: &[u64], members: &[usize], weight: f64, paired: bool) {
        self.add_row_lanes(set, members, weight, paired)
    }

    #[inline(always)]
    fn add_row_lanes(&mut self, set: &[u64], members: &[usize], weight: f64, paired: bool) {
        let n = self.n;
        // The weight on the smaller side's outer product: a complement's row has the same
        // smaller side, so a pair's two rows add it once, doubled.
        let mut side_weight = weight;
        if paired {
            self.complemented += weight;
            members.iter().for_each(|&a| self.complements[a] += weight);
            self.side.clear();
            self.side.extend_from_slice(members);
            side_weight = weight + weight;
        } else if 2 * members.len() > n {
            members_of(&complement_of(set, n), &mut self.side);
            self.complemented += weight;
            self.side.iter().for_each(|&a| self.complements[a] += weight);
        } else {
            self.side.clear();
            self.side.extend_from_slice(members);
        }
        let Some(&first) = self.side.first() else { return };
        // Each member's row gets the weight at the members up to it, +0 elsewhere (which
        // leaves a sum of positive weights as it is): whole rows, in order, instead of one
        // scattered cell per pair.
        self.spread.fill(0.0);
        self.side.iter().for_each(|&b| self.spread[b] = side_weight);
        for &a in &self.side {
            let row = &mut self.smaller[packed_row(a)][first..];
            row.iter_mut().zip(&self.spread[first..=a]).for_each(|(cell, w)| *cell += w);
        }
    }

    /// Adds the target of coalition `set`'s row (players `members`) to the right-hand side;
    /// with `complement_target`, its complement's too ([`Part::add_row`]'s `paired`).
    fn add_target(&mut self, set: &[u64], members: &[usize], weight: f64, target: f64, complement_target: Option<f64>) {
        members.iter().for_each(|&a| self.rhs[a] += weight * target);
        if let Some(outside) = complement_target {
            members_of(&complement_of(set, self.n), &mut self.side);
            self.side.iter().for_each(|&a| self.rhs[a] += weight * outside);
        }
    }

    /// Row `a` of the lower triangle of the Gram matrix (its columns 0..=a).
    fn lower_row(&self, a: usize) -> impl Iterator<Item = f64> + '_ {
        let (total, c) = (self.complemented, &self.complements);
        self.smaller[packed_row(a)].iter().zip(&c[..=a]).map(move |(&smaller, &c_b)| smaller + (total - c_b - c[a]))
    }
}

/// Where row `a` of a packed lower triangle (its columns 0..=a) lies.
fn packed_row(a: usize) -> std::ops::Range<usize> {
    let start = a * (a + 1) / 2;
    start..start + a + 1
}

pub(super) fn for_each_subset(n: usize, size: usize, mut visit: impl FnMut(&[u64])) {
    let mut chosen: Vec<usize> = (0..size).collect();
    let mut set = vec![0u64; super::coalition::words_for(n)];
    loop {
        set.fill(0);
        chosen.iter().for_each(|&p| super::coalition::insert(&mut set, p));
        visit(&set);
        // Next combination in lexicographic order.
        let Some(i) = (0..size).rev().find(|&i| chosen[i] != i + n - size) else { return };
        chosen[i] += 1;
        for j in i + 1..size {
            chosen[j] = chosen[j - 1] + 1;
        }
    }
}

pub(super) fn random_subset(
    rng: &mut rand_xoshiro::Xoshiro256PlusPlus,
    n: usize,
    size: usize,
    words: usize,
) -> Vec<u64> {
    let mut set = vec![0u64; words];
    // Floyd's algorithm: `size` distinct players in O(size).
    for j in n - size..n {
        let t = rng.random_range(0..=j);
        let pick = if contains(&set, t) { j } else { t };
        super::coalition::insert(&mut set, pick);
    }
    set
}

pub(super) fn complement_of(set: &[u64], n: usize) -> Vec<u64> {
    let mut out: Vec<u64> = set.iter().map(|w| !w).collect();
    let tail = n % 64;
    if tail != 0 {
        let last = out.len() - 1;
        out[last] &= (1u64 << tail) - 1;
    }
    out
}

/// Minimises the weighted squared error with sum(phi) = total: with A = Z'WZ and b = Z'Wy,
/// phi = A^-1 (b - nu 1), nu chosen to meet the constraint; a tiny ridge keeps A invertible
/// when the design is thin. The sum meets `total` up to rounding (the dispatcher records what
/// is left). A depends on the coalitions only: it is factored ([`Normal::of`]) before the
/// values are known, b once they are ([`Normal::solve`]).
struct Normal {
    n: usize,
    /// A with the ridge, its lower triangle (row-major, n x n; the upper one is never filled).
    gram: Vec<f64>,
    ridge: f64,
    factor: Factor,
}

impl Normal {
    /// `gram` holds A's lower triangle (what the factorisation reads).
    fn of(n: usize, mut gram: Vec<f64>) -> Result<Self> {
        let ridge = 1e-10 * (0..n).map(|i| gram[i * n + i]).fold(0.0f64, f64::max).max(1e-300);
        for i in 0..n {
            gram[i * n + i] += ridge;
        }
        let factor = cholesky(n, gram.clone()).ok_or_else(|| {
            MasreplayError::InvalidArgument(
                "kernel: the regression is singular (budget too small for the players)".into(),
            )
        })?;
        Ok(Normal { n, gram, ridge, factor })
    }

    fn solve(&self, rhs: &[f64], total: f64) -> Vec<f64> {
        let Normal { n, gram, ridge, factor } = self;
        // One step of iterative refinement against the matrix without the ridge takes the
        // ridge's pull (~1e-10 relative) out of the solution: a game the design fits exactly
        // gets values exact to rounding, as its zero standard error says. Both right-hand sides
        // at once.
        let ones = vec![1.0; *n];
        let mut solved = [factor.solve(rhs), factor.solve(&ones)];
        let products = symmetric_products(*n, gram, [&solved[0], &solved[1]]);
        for ((x, b), product) in solved.iter_mut().zip([rhs, &ones[..]]).zip(products) {
            let residual: Vec<f64> = (0..*n).map(|i| b[i] - product[i] + ridge * x[i]).collect();
            x.iter_mut().zip(factor.solve(&residual)).for_each(|(x, d)| *x += d);
        }
        let [solved_b, solved_one] = solved;
        let nu = (solved_b.iter().sum::<f64>() - total) / solved_one.iter().sum::<f64>();
        solved_b.iter().zip(&solved_one).map(|(b, o)| b - nu * o).collect()
    }
}
