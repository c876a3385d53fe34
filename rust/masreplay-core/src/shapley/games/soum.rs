//! Sum of unanimity models: v(S) = sum_T c_T [T subset of S]. Its Shapley and Banzhaf
//! values have closed forms, which makes it the ground truth of the tests and benchmarks.

use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use super::check_players;
use crate::bail;
use crate::error::Result;
use crate::limit::{IN_RANGE, in_range};
use crate::shapley::coalition::{Coalitions, is_subset, words_for};
use crate::shapley::game::Game;

#[derive(Clone, Debug)]
pub struct SoumGame {
    n_players: usize,
    coefficients: Vec<f64>,
    /// Term t's members as a bitset (`words` words per term).
    masks: Vec<u64>,
    words: usize,
    sizes: Vec<u32>,
    /// CSR: the terms that contain each player, for incremental walks.
    term_offsets: Vec<u32>,
    terms_of: Vec<u32>,
}

impl SoumGame {
    pub fn new(n_players: usize, terms: Vec<(Vec<u32>, f64)>) -> Result<Self> {
        if n_players == 0 {
            bail!("soum: n must be at least 1");
        }
        let words = words_for(n_players);
        let mut masks = vec![0u64; terms.len() * words];
        let mut sizes = Vec::with_capacity(terms.len());
        let mut coefficients = Vec::with_capacity(terms.len());
        let mut counts = vec![0u32; n_players + 1];
        for (t, (members, coefficient)) in terms.iter().enumerate() {
            check_players("soum term", n_players, members)?;
            if !in_range(*coefficient) {
                bail!("soum: the coefficient of term {t} must be {IN_RANGE}, got {coefficient:e}");
            }
            let mask = &mut masks[t * words..(t + 1) * words];
            for &p in members {
                crate::shapley::coalition::insert(mask, p as usize);
            }
            let size = crate::shapley::coalition::size(mask);
            if size == 0 {
                bail!("soum: term {t} has no players");
            }
            for p in 0..n_players {
                if crate::shapley::coalition::contains(mask, p) {
                    counts[p + 1] += 1;
                }
            }
            sizes.push(size as u32);
            coefficients.push(*coefficient);
        }
        for p in 0..n_players {
            counts[p + 1] += counts[p];
        }
        let mut fill = counts.clone();
        let mut terms_of = vec![0u32; counts[n_players] as usize];
        for t in 0..terms.len() {
            for p in 0..n_players {
                if crate::shapley::coalition::contains(&masks[t * words..(t + 1) * words], p) {
                    terms_of[fill[p] as usize] = t as u32;
                    fill[p] += 1;
                }
            }
        }
        Ok(SoumGame { n_players, coefficients, masks, words, sizes, term_offsets: counts, terms_of })
    }

    /// `n_terms` random terms: sizes uniform in 1..=max_order, members uniform, coefficients
    /// uniform in [-1, 1] (the benchmark games of shapiq's SOUM).
    pub fn random(n_players: usize, n_terms: usize, max_order: usize, seed: u64) -> Result<Self> {
        if max_order == 0 || max_order > n_players {
            bail!("soum: max_order must be in 1..={n_players}, got {max_order}");
        }
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        let mut pool: Vec<u32> = (0..n_players as u32).collect();
        let terms = (0..n_terms)
            .map(|_| {
                let size = rng.random_range(1..=max_order);
                // Partial Fisher-Yates: the first `size` slots become a uniform subset.
                for i in 0..size {
                    let j = rng.random_range(i..n_players);
                    pool.swap(i, j);
                }
                (pool[..size].to_vec(), rng.random_range(-1.0..=1.0))
            })
            .collect();
        Self::new(n_players, terms)
    }

    fn term(&self, t: usize) -> &[u64] {
        &self.masks[t * self.words..(t + 1) * self.words]
    }

    pub fn terms(&self) -> Vec<(Vec<u32>, f64)> {
        (0..self.coefficients.len())
            .map(|t| {
                let members = (0..self.n_players as u32)
                    .filter(|&p| crate::shapley::coalition::contains(self.term(t), p as usize))
                    .collect();
                (members, self.coefficients[t])
            })
            .collect()
    }

    /// phi_i = sum over terms containing i of c_T / |T|.
    pub fn shapley_values(&self) -> Vec<f64> {
        self.per_player(|size| 1.0 / size as f64)
    }

    /// beta_i = sum over terms containing i of c_T / 2^(|T| - 1).
    pub fn banzhaf_values(&self) -> Vec<f64> {
        self.per_player(|size| 0.5f64.powi(size as i32 - 1))
    }

    fn per_player(&self, share: impl Fn(u32) -> f64) -> Vec<f64> {
        (0..self.n_players)
            .map(|p| {
                let terms = &self.terms_of[self.term_offsets[p] as usize..self.term_offsets[p + 1] as usize];
                terms.iter().map(|&t| self.coefficients[t as usize] * share(self.sizes[t as usize])).sum()
            })
            .collect()
    }
}

impl Game for SoumGame {
    fn n_players(&self) -> usize {
        self.n_players
    }

    fn values(&self, coalitions: &Coalitions) -> Result<Vec<f64>> {
        Ok(coalitions
            .iter()
            .map(|set| {
                (0..self.coefficients.len())
                    .filter(|&t| is_subset(self.term(t), set))
                    .map(|t| self.coefficients[t])
                    .sum()
            })
            .collect())
    }

    /// Adding a player touches only the terms that contain it: a term pays out when its last
    /// member arrives.
    fn walk(&self, order: &[u32], out: &mut [f64]) -> bool {
        let mut missing = self.sizes.clone();
        let mut value = 0.0;
        out[0] = value;
        for (k, &player) in order.iter().enumerate() {
            let p = player as usize;
            for &t in &self.terms_of[self.term_offsets[p] as usize..self.term_offsets[p + 1] as usize] {
                let left = &mut missing[t as usize];
                *left -= 1;
                if *left == 0 {
                    value += self.coefficients[t as usize];
                }
            }
            out[k + 1] = value;
        }
        true
    }
}
