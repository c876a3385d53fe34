//! The empirical game of logged rollouts: each rollout is a coalition (the players that took
//! part) with its reward. An observed coalition is worth its mean reward; a coalition never
//! observed is worth the prediction of a ridge regression fitted on the observed means
//! (weighted by how often each was seen) over an intercept, each player's presence and, at
//! order 2, each pair's presence.

use std::collections::HashMap;

use crate::bail;
use crate::error::Result;
use crate::limit::{IN_RANGE, in_range};
use crate::shapley::coalition::{Coalitions, contains};
use crate::shapley::game::Game;
use crate::shapley::linalg::cholesky;

/// Ridge penalty, relative to the largest diagonal entry of the normal equations.
const RIDGE: f64 = 1e-6;

#[derive(Clone, Debug)]
pub struct EmpiricalGame {
    n_players: usize,
    order: usize,
    means: HashMap<Vec<u64>, f64>,
    /// Intercept, then one per player, then one per pair (i < j) at order 2.
    coefficients: Vec<f64>,
}

impl EmpiricalGame {
    pub fn new(observed: &Coalitions, rewards: &[f64], order: usize) -> Result<Self> {
        let n = observed.n_players();
        if observed.is_empty() {
            bail!("empirical: no observations");
        }
        if observed.len() != rewards.len() {
            bail!("empirical: {} coalitions but {} rewards", observed.len(), rewards.len());
        }
        if !(1..=2).contains(&order) {
            bail!("empirical: order must be 1 or 2, got {order}");
        }
        if let Some(i) = rewards.iter().position(|&r| !in_range(r)) {
            bail!("empirical: reward {i} must be {IN_RANGE}, got {:e}", rewards[i]);
        }
        let mut sums: HashMap<Vec<u64>, (f64, f64)> = HashMap::new();
        for (set, &reward) in observed.iter().zip(rewards) {
            let slot = sums.entry(set.to_vec()).or_insert((0.0, 0.0));
            slot.0 += reward;
            slot.1 += 1.0;
        }
        let means: HashMap<Vec<u64>, f64> = sums.iter().map(|(set, (sum, count))| (set.clone(), sum / count)).collect();
        let mut game = EmpiricalGame { n_players: n, order, means, coefficients: Vec::new() };
        let k = game.n_features();
        let mut gram = vec![0.0; k * k];
        let mut rhs = vec![0.0; k];
        let mut features = Vec::with_capacity(k);
        // Fixed iteration order (sorted keys) keeps the fit bit-identical from run to run.
        let mut keys: Vec<&Vec<u64>> = sums.keys().collect();
        keys.sort();
        for set in keys {
            let (sum, count) = sums[set];
            game.features(set, &mut features);
            for &a in &features {
                rhs[a] += sum;
                for &b in &features {
                    gram[a * k + b] += count;
                }
            }
        }
        let scale = (0..k).map(|i| gram[i * k + i]).fold(0.0f64, f64::max);
        for i in 0..k {
            gram[i * k + i] += RIDGE * scale;
        }
        let factor = cholesky(k, gram).ok_or_else(|| {
            crate::error::MasreplayError::InvalidArgument("empirical: the regression is singular".into())
        })?;
        game.coefficients = factor.solve(&rhs);
        Ok(game)
    }

    fn n_features(&self) -> usize {
        let n = self.n_players;
        1 + n + if self.order == 2 { n * (n - 1) / 2 } else { 0 }
    }

    /// Indices of the features present in `set`.
    fn features(&self, set: &[u64], out: &mut Vec<usize>) {
        let n = self.n_players;
        out.clear();
        out.push(0);
        let members: Vec<usize> = (0..n).filter(|&p| contains(set, p)).collect();
        out.extend(members.iter().map(|p| 1 + p));
        if self.order == 2 {
            for (a, &i) in members.iter().enumerate() {
                for &j in &members[a + 1..] {
                    // Pairs (i, j), i < j, in row-major order of the upper triangle.
                    out.push(1 + n + i * (2 * n - i - 1) / 2 + (j - i - 1));
                }
            }
        }
    }

    /// Observed distinct coalitions.
    pub fn n_observed(&self) -> usize {
        self.means.len()
    }

    /// The regression's prediction for a coalition, observed or not.
    pub fn predict(&self, set: &[u64]) -> f64 {
        let mut features = Vec::new();
        self.features(set, &mut features);
        features.iter().map(|&f| self.coefficients[f]).sum()
    }
}

impl Game for EmpiricalGame {
    fn n_players(&self) -> usize {
        self.n_players
    }

    fn values(&self, coalitions: &Coalitions) -> Result<Vec<f64>> {
        Ok(coalitions.iter().map(|set| self.means.get(set).copied().unwrap_or_else(|| self.predict(set))).collect())
    }
}
