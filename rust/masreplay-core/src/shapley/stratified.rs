//! Stratified SVARM (Kolpaczki et al. 2024): phi_i = (1/n) sum_k (E[v(S + i)] - E[v(S)]) over
//! coalition sizes k, each stratum mean estimated from coalitions drawn uniformly at that
//! size. One valued coalition A of size k informs every player at once: for i in A it is a
//! draw of v(S + i) with |S| = k - 1, for i outside A a draw of v(S) with |S| = k. Sizes 1
//! and n - 1 are enumerated when the budget allows (n coalitions each), the others share
//! the rest in proportion to 1 / sqrt(k (n - k)). Best on games with high-order interactions, where an ordering's
//! marginal contributions are dominated by rare large terms; efficiency is restored by the
//! dispatcher's projection.

use rand::RngExt;

use super::coalition::{Coalitions, contains, insert, words_for};
use super::game::{Game, bounds};
use super::sampling::{map_items, stream};
use super::{Estimate, Stopping};
use crate::error::{MasreplayError, Result};

/// Per-player sums of one stratum: in A (plus) and out of A (minus).
#[derive(Clone)]
struct Stratum {
    plus: Vec<[f64; 3]>,
    minus: Vec<[f64; 3]>,
}

impl Stratum {
    fn new(n: usize) -> Self {
        Stratum { plus: vec![[0.0; 3]; n], minus: vec![[0.0; 3]; n] }
    }

    fn add(&mut self, set: &[u64], value: f64) {
        for (i, (plus, minus)) in self.plus.iter_mut().zip(&mut self.minus).enumerate() {
            let slot = if contains(set, i) { plus } else { minus };
            slot[0] += 1.0;
            slot[1] += value;
            slot[2] += value * value;
        }
    }
}

/// Mean and variance of the mean of (count, sum, sum of squares); `fallback` when empty.
fn mean_and_variance(moments: [f64; 3], fallback: (f64, f64)) -> (f64, f64) {
    let [count, sum, squares] = moments;
    if count == 0.0 {
        return fallback;
    }
    let mean = sum / count;
    let variance = if count > 1.0 { ((squares / count - mean * mean).max(0.0) * count / (count - 1.0)) / count } else { 0.0 };
    (mean, variance)
}

pub fn stratified(game: &dyn Game, stopping: &Stopping) -> Result<Estimate> {
    let n = game.n_players();
    let (empty, full) = bounds(game)?;
    if n == 1 {
        return Ok(Estimate { values: vec![full - empty], stderr: vec![0.0], evaluations: 2, converged: true, exact: true });
    }
    let left = stopping.budget.saturating_sub(2);
    if left < (n - 1) as u64 {
        return Err(MasreplayError::InvalidArgument(format!(
            "budget: {} evaluations cannot draw one coalition of each size (needs {})",
            stopping.budget,
            n + 1
        )));
    }
    let edges: Vec<usize> = if n >= 3 { vec![1, n - 1] } else { vec![1] };
    let enumerate_edges = n >= 4 && left >= (2 * n + (n - 3)) as u64;
    let sampled_sizes: Vec<usize> = (1..n).filter(|k| !(enumerate_edges && edges.contains(k))).collect();
    let spent_on_edges = if enumerate_edges { 2 * n as u64 } else { 0 };
    // Var(phi_i) ~ sum_k var_k / (m_k k (n - k)): with strata of equal spread the best
    // allocation is m_k ~ 1 / sqrt(k (n - k)), heavier at the extreme sizes.
    let shares: Vec<f64> = sampled_sizes.iter().map(|&k| 1.0 / ((k * (n - k)) as f64).sqrt()).collect();
    let total_share: f64 = shares.iter().sum();
    // One coalition per size first, the rest by share (never past the budget).
    let pool = (left - spent_on_edges - sampled_sizes.len() as u64) as f64;
    let per_size = |size: usize| -> u64 {
        let slot = sampled_sizes.iter().position(|&k| k == size).unwrap_or(0);
        1 + (pool * shares[slot] / total_share).floor() as u64
    };
    let words = words_for(n);
    let strata = map_items(game.sequential(), n - 1, |index| {
        let size = index + 1;
        let mut batch = Coalitions::new(n);
        if enumerate_edges && edges.contains(&size) {
            for p in 0..n {
                // Size 1: {p}; size n - 1: everyone but p.
                let set = batch.push_empty();
                if size == 1 {
                    insert(set, p);
                } else {
                    (0..n).filter(|&q| q != p).for_each(|q| insert(set, q));
                }
            }
        } else {
            let mut rng = stream(stopping.seed, size as u64);
            for _ in 0..per_size(size) {
                let set = batch.push_empty();
                // Floyd's algorithm: a uniform subset of `size` players.
                for j in n - size..n {
                    let t = rng.random_range(0..=j);
                    insert(set, if contains(set, t) { j } else { t });
                }
            }
        }
        let values = game.values(&batch)?;
        let mut stratum = Stratum::new(n);
        for (set, value) in batch.iter().zip(values) {
            stratum.add(set, value);
        }
        debug_assert_eq!(batch.words(), words);
        Ok((stratum, batch.len() as u64))
    })?;
    let mut values = vec![0.0; n];
    let mut stderr = vec![0.0; n];
    for i in 0..n {
        let (mut total, mut variance) = (0.0, 0.0);
        for k in 0..n {
            // E[v(S + i)] over |S| = k is stratum k + 1 with i in; E[v(S)] is stratum k without i.
            let with = if k + 1 == n {
                (full, 0.0)
            } else {
                let all = stratum_mean(&strata[k].0);
                mean_and_variance(strata[k].0.plus[i], (all, 0.0))
            };
            let without = if k == 0 {
                (empty, 0.0)
            } else {
                let all = stratum_mean(&strata[k - 1].0);
                mean_and_variance(strata[k - 1].0.minus[i], (all, 0.0))
            };
            total += with.0 - without.0;
            variance += with.1 + without.1;
        }
        values[i] = total / n as f64;
        stderr[i] = variance.sqrt() / n as f64;
    }
    let evaluations = 2 + strata.iter().map(|(_, count)| count).sum::<u64>();
    Ok(Estimate { values, stderr, evaluations, converged: false, exact: false }.with_target(stopping))
}

/// Mean value over every coalition drawn in a stratum (each counted once, via player 0).
fn stratum_mean(stratum: &Stratum) -> f64 {
    let [count_in, sum_in, _] = stratum.plus[0];
    let [count_out, sum_out, _] = stratum.minus[0];
    (sum_in + sum_out) / (count_in + count_out).max(1.0)
}
