//! Two textbook games: additive (each player brings its own worth; Shapley = the worths)
//! and weighted voting (a coalition wins when its weights reach the quota).

use crate::bail;
use crate::error::Result;
use crate::limit::{IN_RANGE, in_range};
use crate::shapley::coalition::{Coalitions, contains};
use crate::shapley::game::Game;

fn check_weights(what: &str, weights: &[f64]) -> Result<()> {
    if weights.is_empty() {
        bail!("{what}: at least one player is needed");
    }
    if let Some(i) = weights.iter().position(|&w| !in_range(w)) {
        bail!("{what}: weight {i} must be {IN_RANGE}, got {:e}", weights[i]);
    }
    Ok(())
}

fn weight_of(weights: &[f64], set: &[u64]) -> f64 {
    weights.iter().enumerate().filter(|&(p, _)| contains(set, p)).map(|(_, w)| w).sum()
}

#[derive(Clone, Debug)]
pub struct AdditiveGame {
    pub weights: Vec<f64>,
}

impl AdditiveGame {
    pub fn new(weights: Vec<f64>) -> Result<Self> {
        check_weights("additive", &weights)?;
        Ok(AdditiveGame { weights })
    }
}

impl Game for AdditiveGame {
    fn n_players(&self) -> usize {
        self.weights.len()
    }

    fn values(&self, coalitions: &Coalitions) -> Result<Vec<f64>> {
        Ok(coalitions.iter().map(|set| weight_of(&self.weights, set)).collect())
    }

    fn walk(&self, order: &[u32], out: &mut [f64]) -> bool {
        out[0] = 0.0;
        for (k, &p) in order.iter().enumerate() {
            out[k + 1] = out[k] + self.weights[p as usize];
        }
        true
    }
}

#[derive(Clone, Debug)]
pub struct WeightedVotingGame {
    pub weights: Vec<f64>,
    pub quota: f64,
}

impl WeightedVotingGame {
    pub fn new(weights: Vec<f64>, quota: f64) -> Result<Self> {
        check_weights("weighted_voting", &weights)?;
        if !quota.is_finite() {
            bail!("weighted_voting: quota must be finite");
        }
        Ok(WeightedVotingGame { weights, quota })
    }
}

impl Game for WeightedVotingGame {
    fn n_players(&self) -> usize {
        self.weights.len()
    }

    fn values(&self, coalitions: &Coalitions) -> Result<Vec<f64>> {
        Ok(coalitions.iter().map(|set| f64::from(u8::from(weight_of(&self.weights, set) >= self.quota))).collect())
    }

    fn walk(&self, order: &[u32], out: &mut [f64]) -> bool {
        let mut weight = 0.0;
        out[0] = f64::from(u8::from(0.0 >= self.quota));
        for (k, &p) in order.iter().enumerate() {
            weight += self.weights[p as usize];
            out[k + 1] = f64::from(u8::from(weight >= self.quota));
        }
        true
    }
}
