//! Stratified SVARM (Kolpaczki et al. 2024): phi_i = (1/n) sum_k (E[v(S + i)] - E[v(S)]) over
//! coalition sizes k, each stratum mean estimated from coalitions drawn uniformly at that
//! size. One valued coalition A of size k informs every player at once: for i in A it is a
//! draw of v(S + i) with |S| = k - 1, for i outside A a draw of v(S) with |S| = k. Sizes 1
//! and n - 1 are enumerated (n coalitions each, from 4 players); the others get two draws
//! at least (a smaller budget is refused, naming what is needed), a pilot share, then the
//! rest half by Neyman allocation on the pilot's spreads and half evenly ([`EVEN_SHARE`]), so
//! the coalitions drawn depend on the values seen (unlike every other estimator here). Best
//! on games with high-order interactions, where an ordering's marginal contributions are
//! dominated by rare large terms; efficiency is restored by the dispatcher's projection.
//!
//! A player's cell with no draw (most with-cells of small sizes and without-cells of large
//! ones, at a few draws a size) is filled from the player's differences at the sizes around
//! it ([`fill_empty_cells`]), so that size adds an estimate of the player's effect rather than
//! nothing.
//!
//! Standard errors are those of the projected values: per sampled stratum and player, the
//! variance of the mean with the player and of the mean without it, each cell's sample
//! variance moderated toward the stratum's pooled one (most cells hold one or two draws),
//! scaled by the weight the fills give that size's difference, then what the projection onto
//! efficiency does to each player's error: it subtracts the mean error over players, which
//! the same coalitions put into every player's value (see [`projected_variance`]); enumerated
//! strata are a census and add none. Not covered: the bias of the pilot's draws (kept in the
//! means while the allocation half follows their spread) and of the fills where a player's
//! differences curve within the fit's width. Intervals cover 94-96% on every benchmark family
//! at n = 30 and 100 with 1,000 evaluations, at n = 300 with 2,000 (4.7 draws a size, near the
//! least budget) and at 10,000. The shrinkage the empty cells caused had also lowered the
//! error where draws are few: unbiased, the values have 0-16% more absolute error at n = 100
//! and 1,000 evaluations, 13-84% more at n = 300 and 2,000 (benches/RESULTS.md, 2026-11-29
//! late morning).

use std::collections::HashMap;

use rand::RngExt;
use rand_xoshiro::Xoshiro256PlusPlus;
use rayon::prelude::*;

use super::coalition::{Coalitions, contains, insert, members_of};
use super::game::{Game, bounds};
use super::pipeline::{Sink, value_streamed};
use super::sampling::stream;
use super::{Estimate, Stopping};
use crate::error::{MasreplayError, Result};

/// Per-player sums of one stratum: in A (plus) and out of A (minus), each (count, sum, sum of
/// squares). A coalition is added to its members' sums and to the stratum's (`all`); the sums
/// out of A are what is left of the stratum's ([`Stratum::complete`]), so a coalition costs
/// its members, not every player.
#[derive(Clone)]
struct Stratum {
    plus: Vec<[f64; 3]>,
    minus: Vec<[f64; 3]>,
    all: [f64; 3],
}

impl Stratum {
    fn new(n: usize) -> Self {
        Stratum { plus: vec![[0.0; 3]; n], minus: vec![[0.0; 3]; n], all: [0.0; 3] }
    }

    fn merge(&mut self, other: &Stratum) {
        for (mine, theirs) in self.plus.iter_mut().zip(&other.plus).chain([(&mut self.all, &other.all)]) {
            (0..3).for_each(|j| mine[j] += theirs[j]);
        }
    }

    fn add(&mut self, set: &[u64], value: f64, members: &mut Vec<usize>) {
        let moments = [1.0, value, value * value];
        members_of(set, members);
        let add = |slot: &mut [f64; 3]| (0..3).for_each(|j| slot[j] += moments[j]);
        members.iter().for_each(|&i| add(&mut self.plus[i]));
        add(&mut self.all);
    }

    /// Fills the sums out of A, once every coalition is in.
    fn complete(&mut self) {
        for (minus, plus) in self.minus.iter_mut().zip(&self.plus) {
            (0..3).for_each(|j| minus[j] = self.all[j] - plus[j]);
        }
    }
}

/// Share of the sampling budget spent on the pilot that measures each stratum's spread.
const PILOT_SHARE: f64 = 0.15;

/// Share of the budget after the pilot allocated as if every stratum's spread were equal, the
/// rest by the pilot's spreads. On weighted voting a size's pilot draws often all agree
/// (every coalition of that size wins, or one in ten loses): pure Neyman allocation then gave
/// the size no more draws and its error no weight, and intervals covered 48-90% at n = 30-300
/// and 10,000 evaluations; with half the budget spread evenly 0.94-0.95, at 1.4-2x the error
/// on voting games (their spread sits in a few sizes) and the same on SOUM and trace games
/// (benches/RESULTS.md, 2026-11-26 afternoon).
const EVEN_SHARE: f64 = 0.5;

/// `floor(total * weight_k / sum of weights)` coalitions per size, plus `floor_each`.
fn allocate(sizes: &[usize], total: f64, weight: impl Fn(usize) -> f64, floor_each: u64) -> HashMap<usize, u64> {
    let sum: f64 = sizes.iter().map(|&k| weight(k)).sum();
    sizes.iter().map(|&k| (k, floor_each + (total * weight(k) / sum).floor() as u64)).collect()
}

/// The coalitions of one size valued so far, with their per-player sums.
struct Drawn {
    stratum: Stratum,
    coalitions: Coalitions,
    values: Vec<f64>,
}

/// Draws `count` coalitions of `size` uniformly (or, with `enumerate`, all n of size 1 or
/// n - 1) into `sink`.
fn push_draws(sink: &mut Sink, size: usize, count: u64, enumerate: bool, mut rng: Xoshiro256PlusPlus) {
    let n = sink.n_players();
    let mut set = vec![0u64; sink.words()];
    if enumerate {
        for p in 0..n {
            set.fill(0);
            if size == 1 {
                insert(&mut set, p);
            } else {
                (0..n).filter(|&q| q != p).for_each(|q| insert(&mut set, q));
            }
            sink.push(&set);
        }
    } else {
        for _ in 0..count {
            if sink.stopped() {
                return;
            }
            set.fill(0);
            // Floyd's algorithm: a uniform subset of `size` players.
            for j in n - size..n {
                let t = rng.random_range(0..=j);
                let pick = if contains(&set, t) { j } else { t };
                insert(&mut set, pick);
            }
            sink.push(&set);
        }
    }
}

/// One phase of draws (the pilot or the follow-up): `count(size)` coalitions of every size
/// 1..n from the size's own stream (number `first_stream + size`), or all n where
/// `enumerate(size)`, valued in one batch; each size's per-player sums are filled as the
/// values come in (drawing and summing beside the game's valuation, see [`value_streamed`]).
fn draw_phase(
    game: &dyn Game,
    seed: u64,
    first_stream: u64,
    count: impl Fn(usize) -> u64 + Sync,
    enumerate: impl Fn(usize) -> bool + Sync,
) -> Result<Vec<Drawn>> {
    let n = game.n_players();
    let planned = (1..n).map(|size| if enumerate(size) { n as u64 } else { count(size) }).sum::<u64>() as usize;
    // Where each size's coalitions end in the batch.
    let mut ends = Vec::with_capacity(n - 1);
    let draw = |ends: &mut Vec<usize>, sink: &mut Sink| {
        for size in 1..n {
            push_draws(sink, size, count(size), enumerate(size), stream(seed, first_stream + size as u64));
            ends.push(sink.batch().len());
        }
    };
    let mut strata: Vec<Drawn> = (1..n)
        .map(|_| Drawn { stratum: Stratum::new(n), coalitions: Coalitions::new(n), values: Vec::new() })
        .collect();
    let (mut members, mut summed, mut index) = (Vec::with_capacity(n), 0, 0);
    value_streamed(game, planned, &mut ends, draw, |ends, batch, worth| {
        for (position, &value) in worth.iter().enumerate().skip(summed) {
            while ends[index] <= position {
                index += 1;
            }
            let (drawn, set) = (&mut strata[index], batch.get(position));
            drawn.stratum.add(set, value, &mut members);
            drawn.coalitions.push(set);
            drawn.values.push(value);
        }
        summed = worth.len();
    })?;
    Ok(strata)
}

/// Mean of (count, sum, sum of squares); `fallback` when empty.
fn mean_or(moments: [f64; 3], fallback: f64) -> f64 {
    let [count, sum, _] = moments;
    if count == 0.0 { fallback } else { sum / count }
}

/// Standard deviation of a stratum's values.
fn spread_of(stratum: &Stratum) -> f64 {
    let [count, sum, squares] = stratum.all;
    if count < 2.0 {
        return 0.0;
    }
    let mean = sum / count;
    ((squares / count - mean * mean).max(0.0) * count / (count - 1.0)).sqrt()
}

pub fn stratified(game: &dyn Game, stopping: &Stopping) -> Result<Estimate> {
    let n = game.n_players();
    let (empty, full) = bounds(game)?;
    if n == 1 {
        return Ok(Estimate::of_one_player(full - empty));
    }
    // Sizes 1 and n - 1 enumerated (from 4 players) and two draws of every other size. With one
    // draw a player's two cells there both read the single value: the size adds the same
    // difference to every player and shows no spread (at n = 300 and 1,000 evaluations every
    // value was the equal split with stderr 0); without the edges' census two draws a size left
    // intervals covering 68-82% on SOUM and pairwise games there.
    let enumerate_edges = n >= 4;
    let needed = if enumerate_edges { 2 + 2 * n + 2 * (n - 3) } else { 2 * n };
    if stopping.budget < needed as u64 {
        return Err(MasreplayError::InvalidArgument(format!(
            "budget: method='stratified' needs {needed} evaluations at n = {n} (each player alone and left out, \
             and two coalitions of every other size), budget={} (permutation or msr estimate from fewer)",
            stopping.budget
        )));
    }
    let left = stopping.budget - 2;
    let edges: Vec<usize> = if n >= 3 { vec![1, n - 1] } else { vec![1] };
    let sampled_sizes: Vec<usize> = (1..n).filter(|k| !(enumerate_edges && edges.contains(k))).collect();
    let spent_on_edges = if enumerate_edges { 2 * n as u64 } else { 0 };
    // Var(phi_i) ~ sum_k var_k / (m_k k (n - k)), so the best allocation (Neyman) is
    // m_k ~ sd_k / sqrt(k (n - k)). A pilot with sd_k taken equal spends PILOT_SHARE of the
    // budget (at least one coalition per size); the rest half follows the pilot's spreads.
    let balance = |k: usize| 1.0 / ((k * (n - k)) as f64).sqrt();
    let pool = (left - spent_on_edges - sampled_sizes.len() as u64) as f64;
    let pilot_counts = allocate(&sampled_sizes, pool * PILOT_SHARE, balance, 1);
    let pilot_count = |size: usize| pilot_counts.get(&size).copied().unwrap_or(0);
    let enumerated = |size: usize| enumerate_edges && edges.contains(&size);
    let pilot = draw_phase(game, stopping.seed, 0, pilot_count, enumerated)?;
    let spent: u64 = pilot.iter().map(|drawn| drawn.values.len() as u64).sum();
    let spread = |k: usize| spread_of(&pilot[k - 1].stratum);
    // A size the pilot drew once gets its second draw first; the rest is shared out.
    let short = |k: usize| 2u64.saturating_sub(pilot[k - 1].values.len() as u64);
    let seconds: u64 = sampled_sizes.iter().map(|&k| short(k)).sum();
    let rest = left.saturating_sub(spent + seconds) as f64;
    // Half the rest by Neyman on the pilot's spreads, half as if the spreads were equal (a
    // defensive mixture): a stratum whose few pilot draws happened to agree still gets draws.
    let neyman = |k: usize| spread(k) * balance(k);
    let neyman_total: f64 = sampled_sizes.iter().map(|&k| neyman(k)).sum();
    let balance_total: f64 = sampled_sizes.iter().map(|&k| balance(k)).sum();
    let follow_counts = if neyman_total > 0.0 {
        let mixed = |k: usize| (1.0 - EVEN_SHARE) * neyman(k) / neyman_total + EVEN_SHARE * balance(k) / balance_total;
        allocate(&sampled_sizes, rest, mixed, 0)
    } else {
        allocate(&sampled_sizes, rest, balance, 0)
    };
    let follow_count = |size: usize| follow_counts.get(&size).copied().unwrap_or(0) + short(size);
    let follow = draw_phase(game, stopping.seed, n as u64, follow_count, |_| false)?;
    let strata: Vec<Drawn> = pilot
        .into_iter()
        .zip(follow)
        .map(|(mut first, second)| {
            first.stratum.merge(&second.stratum);
            first.stratum.complete();
            second.coalitions.iter().for_each(|set| first.coalitions.push(set));
            first.values.extend(second.values);
            first
        })
        .collect();
    // Per stratum k (coalitions of k + 1 players) and player i: the mean value with i in
    // (E[v(S + i)], |S| = k) and with i out (E[v(S + i)] of the next size down's term).
    let mut means: Vec<(Vec<f64>, Vec<f64>)> = strata
        .iter()
        .map(|drawn| {
            let all = stratum_mean(&drawn.stratum);
            (
                drawn.stratum.plus.iter().map(|&m| mean_or(m, all)).collect(),
                drawn.stratum.minus.iter().map(|&m| mean_or(m, all)).collect(),
            )
        })
        .collect();
    let sampled: Vec<usize> = (0..strata.len()).filter(|&index| !enumerated(index + 1)).collect();
    let cells: Vec<CellSpread> = sampled.iter().map(|&index| CellSpread::of(&strata[index], &means[index])).collect();
    // A stratum whose cells show no spread of their own (one draw each) borrows the mean of the others'.
    let (squares, dof) = cells.iter().fold((0.0, 0.0), |(s, d), cell| (s + cell.squares, d + cell.dof));
    let borrowed = if dof > 0.0 { squares / dof } else { 0.0 };
    let mut pooled = vec![0.0; strata.len()];
    for (&index, cell) in sampled.iter().zip(&cells) {
        pooled[index] = if cell.dof > 0.0 { cell.squares / cell.dof } else { borrowed };
    }
    let weights = fill_empty_cells(&strata, &mut means, |index| enumerated(index + 1));
    let mut values = vec![0.0; n];
    for (i, value) in values.iter_mut().enumerate() {
        let mut total = 0.0;
        for k in 0..n {
            // E[v(S + i)] over |S| = k is stratum k with i in; E[v(S)] is stratum k - 1 without i.
            let with = if k + 1 == n { full } else { means[k].0[i] };
            let without = if k == 0 { empty } else { means[k - 1].1[i] };
            total += with - without;
        }
        *value = total / n as f64;
    }
    let per_stratum: Vec<Vec<f64>> = sampled
        .par_iter()
        .map(|&index| projected_variance(&strata[index], &means[index], pooled[index], &weights[index]))
        .collect();
    let mut variance = vec![0.0; n];
    for part in &per_stratum {
        variance.iter_mut().zip(part).for_each(|(v, p)| *v += p);
    }
    let stderr = variance.iter().map(|v| v.sqrt()).collect();
    let evaluations = 2 + strata.iter().map(|drawn| drawn.values.len() as u64).sum::<u64>();
    Ok(Estimate { values, stderr, evaluations, converged: false, exact: false }.with_target(stopping))
}

/// Width of the kernel of [`fill_empty_cells`]'s local linear fit, in coalition sizes: the
/// high-order terms of a game move D_i over a few sizes near the ends, whatever n. 5 games x 8
/// seeds a family at n = 100 / 1,000 and n = 300 / 2,000: 7, 15 and 30 sizes all covered
/// 0.944-0.957, with MAE within 5% of each other (benches/RESULTS.md, 2026-11-29 late morning).
const BANDWIDTH: f64 = 15.0;

/// Fills each cell that holds no draw (most with-cells of small sizes, and without-cells of
/// large ones, at a few draws a size) and returns, per stratum and player, the weight of the
/// player's difference there in its value.
///
/// A value is (v(N) - v(empty) + sum over sizes s of D_i(s)) / n, with D_i(s) the mean value
/// of the coalitions A of size s holding i less that of those without it. A size where one of
/// i's cells is empty has no draw of D_i(s); read as the stratum mean (which is then the other
/// cell's mean) it added 0, shrinking values toward the equal split: at n = 100 and 1,000
/// evaluations that bias was a quarter to a third of the squared error on SOUM and pairwise
/// games, which the error bars did not hold (benches/RESULTS.md, 2026-11-29). Each such
/// D_i(s) is now read off a local linear fit in s through the player's differences at the
/// sampled sizes whose cells both hold draws: unbiased where D_i is linear in s (additive and
/// pairwise games), and wherever the fit's width follows its curve. The census sizes 1 and
/// n - 1 are left out of the fit: there the highest-order terms of a game make D_i jump (a
/// full-order SOUM game at n = 100: D_i(99) = -5.2 against -1.9 at 97 and -0.7 at 90), and a
/// fit through them covered 0.60-0.78 on full-order games (measured with spread-based weights,
/// see [`Fill::of`]). The fit is linear in the differences it reads, so the
/// value is too: a sampled difference weighs 1 plus the fills' coefficients on it, which
/// scales its variance ([`projected_variance`]), so the error the fills share is in the
/// standard error; a filled size weighs 0 (its one cell's draws cancel in the difference).
fn fill_empty_cells(
    strata: &[Drawn],
    means: &mut [(Vec<f64>, Vec<f64>)],
    enumerated: impl Fn(usize) -> bool + Sync,
) -> Vec<Vec<f64>> {
    let players = means.first().map_or(0, |(mean_in, _)| mean_in.len());
    let kernel: Vec<f64> = (0..=players).map(|distance| (-0.5 * (distance as f64 / BANDWIDTH).powi(2)).exp()).collect();
    let fills: Vec<Fill> =
        (0..players).into_par_iter().map(|i| Fill::of(i, strata, means, &kernel, &enumerated)).collect();
    let mut per_stratum = vec![vec![0.0; players]; strata.len()];
    for (i, fill) in fills.into_iter().enumerate() {
        for (index, level) in fill.levels {
            let (mean_in, mean_out) = &mut means[index];
            if strata[index].stratum.plus[i][0] == 0.0 {
                mean_in[i] = mean_out[i] + level;
            } else {
                mean_out[i] = mean_in[i] - level;
            }
        }
        fill.weights.into_iter().enumerate().for_each(|(index, w)| per_stratum[index][i] = w);
    }
    per_stratum
}

/// One player's fills: the difference read off the fit at each stratum with an empty cell, and
/// the weight of each stratum's difference in the value.
struct Fill {
    levels: Vec<(usize, f64)>,
    weights: Vec<f64>,
}

impl Fill {
    fn of(
        i: usize,
        strata: &[Drawn],
        means: &[(Vec<f64>, Vec<f64>)],
        kernel: &[f64],
        enumerated: impl Fn(usize) -> bool,
    ) -> Self {
        // (stratum, difference, weight in the fit) of each sampled size the fit reads; the
        // strata with an empty cell. A difference of c_in and c_out draws weighs
        // 1 / (1 / c_in + 1 / c_out), the inverse of its variance in units of one draw's:
        // weights from the cells' own spreads shrank the fills toward 0 (at two draws a size
        // a stratum's spread is its two values' difference, the very difference the point
        // holds: an additive game's values at n = 100 / 400 came out 54% toward the equal
        // split).
        let (mut points, mut gaps) = (Vec::new(), Vec::new());
        for (index, (drawn, (mean_in, mean_out))) in strata.iter().zip(means).enumerate() {
            let (with, without) = (drawn.stratum.plus[i][0], drawn.stratum.minus[i][0]);
            if with == 0.0 || without == 0.0 {
                gaps.push(index);
            } else if !enumerated(index) {
                points.push((index, mean_in[i] - mean_out[i], with * without / (with + without)));
            }
        }
        let mut weights = vec![0.0; strata.len()];
        points.iter().for_each(|&(index, _, _)| weights[index] = 1.0);
        if points.is_empty() {
            // Nothing to fit: the empty cells keep the stratum mean, charged in projected_variance.
            gaps.iter().for_each(|&index| weights[index] = 1.0);
            return Fill { levels: Vec::new(), weights };
        }
        let mut reads = vec![0.0; points.len()];
        let levels = gaps
            .into_iter()
            .map(|gap| {
                let near = reach(&points, gap);
                let (near_points, reads) = (&points[near.clone()], &mut reads[near]);
                let (mut s0, mut s1, mut s2) = (0.0, 0.0, 0.0);
                for (read, &(index, _, w)) in reads.iter_mut().zip(near_points) {
                    let (kw, dx) = (kernel[index.abs_diff(gap)] * w, index as f64 - gap as f64);
                    (s0, s1, s2) = (s0 + kw, s1 + kw * dx, s2 + kw * dx * dx);
                    *read = kw;
                }
                // The level at the gap of the weighted line through the points (e0' (X'KWX)^-1
                // X'KW), or their weighted mean where the points sit at one size.
                let det = s0 * s2 - s1 * s1;
                let line = det > 1e-9 * s0 * s2;
                let mut level = 0.0;
                for (read, &(index, difference, _)) in reads.iter_mut().zip(near_points) {
                    let dx = index as f64 - gap as f64;
                    *read = if line { *read * (s2 - s1 * dx) / det } else { *read / s0 };
                    level += *read * difference;
                    weights[index] += *read;
                }
                (gap, level)
            })
            .collect();
        Fill { levels, weights }
    }
}

/// Sizes past the nearest point beyond which [`fill_empty_cells`]'s kernel leaves a point
/// nothing: e^(-0.5 (d^2 - d_near^2) / BANDWIDTH^2) <= e^(-50) for d >= d_near + 10 widths,
/// below the rounding of the fit even at a thousand times the nearest point's draws.
const REACH: f64 = 10.0 * BANDWIDTH;

/// The points (sorted by stratum) a fill at `gap` reads: those within [`REACH`] of the nearest
/// one. Every point would make each fill a pass over all of a player's sizes, n^3 work in all
/// (n = 1,000 at the least budget: 0.07 s before the fills, 0.72 s with them).
fn reach(points: &[(usize, f64, f64)], gap: usize) -> std::ops::Range<usize> {
    let after = points.partition_point(|&(index, _, _)| index < gap);
    let nearest = [after.checked_sub(1).map(|k| gap - points[k].0), points.get(after).map(|p| p.0 - gap)]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(0);
    let reach = nearest + REACH as usize;
    points.partition_point(|&(index, _, _)| index + reach < gap)
        ..points.partition_point(|&(index, _, _)| index <= gap + reach)
}

/// Weight of a stratum's pooled spread in each cell's variance, in draws: a cell of c draws
/// has c - 1 degrees of freedom of its own and borrows this many from the pool (a moderated
/// variance, as sampling.rs does for orderings), so a cell of one draw, or of draws that
/// happened to agree, still reports the stratum's spread.
const POOLED_DRAWS: f64 = 8.0;

/// The spread of a stratum's draws within cells (a player's draws with it, or without it):
/// squared deviations from the cell means and their degrees of freedom, over every cell.
struct CellSpread {
    squares: f64,
    dof: f64,
}

impl CellSpread {
    fn of(drawn: &Drawn, (mean_in, mean_out): &(Vec<f64>, Vec<f64>)) -> Self {
        let (mut squares, mut dof) = (0.0, 0.0);
        let sides = drawn.stratum.plus.iter().zip(mean_in).chain(drawn.stratum.minus.iter().zip(mean_out));
        for (&moments, &mean) in sides {
            if moments[0] >= 2.0 {
                squares += squared_deviations(moments, mean);
                dof += moments[0] - 1.0;
            }
        }
        // Each player's two cells hold every draw once: per stratum, not n times over.
        let players = drawn.stratum.plus.len() as f64;
        CellSpread { squares: squares / players, dof: dof / players }
    }
}

/// Sum of squared deviations of a cell's draws from `mean`, from its (count, sum, sum of squares).
fn squared_deviations([count, sum, sum_squares]: [f64; 3], mean: f64) -> f64 {
    (sum_squares - 2.0 * mean * sum + count * mean * mean).max(0.0)
}

/// One sampled stratum's share of the variance of every projected value.
///
/// A cell of c draws (player i's draws with i, or without) moves i's value by w_i times its
/// mean / n, w_i the weight of i's difference at this size ([`fill_empty_cells`]: 1 plus what
/// the fills of other sizes read from it, 0 where the difference is itself a fill), whose
/// variance is w_i^2 s^2 / (c n^2), with s^2 the cell's variance moderated toward the
/// stratum's `pooled` one ([`POOLED_DRAWS`]; the sample variance alone is 0 for a cell of one
/// draw). A cell with no draw that no fill could replace (no size of the player holds draws
/// on both sides) reads the stratum mean instead, off by the spread of cell means around it
/// (estimated from the other cells, less their own noise) plus that mean's noise.
/// The projection onto efficiency subtracts the mean error over players, which the players
/// share (the same coalitions inform them all). Each draw's error, of the pooled variance,
/// moves i's value by u_i(A) = w_i / (n c) in A and -w_i / (n c) out of it, and the mean by
/// u(A), the mean of u over players; so the projection changes i's variance by
/// pooled * sum_A (u(A)^2 - 2 u_i(A) u(A)), per player: a player whose cells are quiet
/// keeps the noise of the mean the projection subtracts, which one share for all players
/// (as before) took away from it.
fn projected_variance(
    drawn: &Drawn,
    (mean_in, mean_out): &(Vec<f64>, Vec<f64>),
    pooled: f64,
    weights: &[f64],
) -> Vec<f64> {
    let players = mean_in.len();
    let n = players as f64;
    let (plus, minus) = (&drawn.stratum.plus, &drawn.stratum.minus);
    let moderated = |moments: [f64; 3], mean: f64| {
        (squared_deviations(moments, mean) + POOLED_DRAWS * pooled) / (moments[0] - 1.0 + POOLED_DRAWS)
    };
    let overall = stratum_mean(&drawn.stratum);
    let (mut between, mut cells) = (0.0f64, 0.0f64);
    for (side, means) in [(plus, mean_in), (minus, mean_out)] {
        for (&moments, &mean) in side.iter().zip(means) {
            if moments[0] >= 1.0 {
                between += (mean - overall).powi(2) - moderated(moments, mean) / moments[0];
                cells += 1.0;
            }
        }
    }
    let between = (between / cells.max(1.0)).max(0.0);
    let draws = drawn.values.len().max(1) as f64;
    let cell_variance = |moments: [f64; 3], mean: f64| {
        if moments[0] >= 1.0 { moderated(moments, mean) / moments[0] } else { between + pooled / draws }
    };
    // u_i(A) for A with i (`inside`) and without (`outside`); 0 for a cell no draw reaches.
    let unit = |moments: &[f64; 3], sign: f64| if moments[0] > 0.0 { sign / (n * moments[0]) } else { 0.0 };
    let inside: Vec<f64> = plus.iter().zip(weights).map(|(m, w)| w * unit(m, 1.0)).collect();
    let outside: Vec<f64> = minus.iter().zip(weights).map(|(m, w)| w * unit(m, -1.0)).collect();
    // u(A) = (sum of outside + sum over A's members of (inside - outside)) / n; summed over
    // the draws (all and those with i) and squared, so the cost is each coalition's members.
    let outside_total: f64 = outside.iter().sum();
    let (mut unit_mean_total, mut unit_mean_squares) = (0.0, 0.0);
    let mut unit_mean_with = vec![0.0; players];
    let mut members = Vec::with_capacity(players);
    for set in drawn.coalitions.iter() {
        members_of(set, &mut members);
        let unit_mean = (outside_total + members.iter().map(|&i| inside[i] - outside[i]).sum::<f64>()) / n;
        members.iter().for_each(|&i| unit_mean_with[i] += unit_mean);
        unit_mean_total += unit_mean;
        unit_mean_squares += unit_mean * unit_mean;
    }
    (0..players)
        .map(|i| {
            let own = weights[i].powi(2) * (cell_variance(plus[i], mean_in[i]) + cell_variance(minus[i], mean_out[i]));
            // sum_A u_i(A) u(A), split by whether A holds i.
            let cross = inside[i] * unit_mean_with[i] + outside[i] * (unit_mean_total - unit_mean_with[i]);
            let projected = own / (n * n) + pooled * (unit_mean_squares - 2.0 * cross);
            // Cells far quieter than the pool can take the pooled change below zero: then the
            // share the projection keeps of the unit errors scales the player's own variance.
            if projected >= 0.0 {
                projected
            } else {
                let units = inside[i].powi(2) * plus[i][0] + outside[i].powi(2) * minus[i][0];
                let kept = (units - 2.0 * cross + unit_mean_squares).max(0.0);
                own / (n * n) * if units > 0.0 { kept / units } else { 1.0 }
            }
        })
        .collect()
}

/// Mean value over every coalition drawn in a stratum.
fn stratum_mean(stratum: &Stratum) -> f64 {
    let [count, sum, _] = stratum.all;
    sum / count.max(1.0)
}
