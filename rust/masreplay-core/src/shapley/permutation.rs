//! Uniform random orderings of all players (Castro et al. 2009), drawn in antithetic pairs
//! (an ordering and its reverse) unless asked otherwise: unbiased, exactly efficient, and
//! about half the error on low-order games.

use rand::RngExt;
use rand_xoshiro::Xoshiro256PlusPlus;

use super::sampling::OrderSampler;

pub struct UniformOrderings {
    pub n_players: usize,
    pub antithetic: bool,
}

impl OrderSampler for UniformOrderings {
    fn sample(&self, rng: &mut Xoshiro256PlusPlus, order: &mut Vec<u32>, _scratch: &mut Vec<u32>) {
        order.clear();
        order.extend(0..self.n_players as u32);
        for i in (1..order.len()).rev() {
            let j = rng.random_range(0..=i);
            order.swap(i, j);
        }
    }

    fn antithetic(&self) -> bool {
        self.antithetic
    }
}
