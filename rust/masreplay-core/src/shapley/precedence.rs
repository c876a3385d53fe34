//! Precedence-constrained (spawn-tree) Shapley values (Faigle & Kern 1992): marginal
//! contributions averaged over the orderings in which every parent precedes its children,
//! so a sub-agent is only ever credited on top of the agent that spawned it.
//!
//! Exact when the forest has few down-sets: an ordering passes through down-set D and then
//! adds i with probability
//!   |D|! (n - |D| - 1)! / n! * prod_{x} h(x) / (prod_{x in D} h_D(x) * prod_{x not in D+i} h(x)),
//! h the subtree sizes in the forest and h_D those inside D (hook-length counts of both
//! sides). Otherwise sampled: uniform orderings drawn by subtree size.

use std::collections::HashMap;

use rand_xoshiro::Xoshiro256PlusPlus;

use super::coalition::{Coalitions, contains, insert};
use super::forest::{Forest, ln_factorials};
use super::game::Game;
use super::sampling::{OrderSampler, map_items};
use super::{Estimate, Stopping};
use crate::error::Result;

impl OrderSampler for Forest {
    fn sample(&self, rng: &mut Xoshiro256PlusPlus, order: &mut Vec<u32>, scratch: &mut Vec<u32>) {
        self.sample_ordering(rng, order, scratch);
    }

    /// The reverse of a valid ordering puts children first.
    fn antithetic(&self) -> bool {
        false
    }
}

/// Exact precedence values from all down-sets.
pub fn exact_precedence(
    game: &dyn Game,
    forest: &Forest,
    downsets: Coalitions,
    stopping: &Stopping,
) -> Result<Estimate> {
    let n = forest.len();
    // The enumeration yields each down-set once: value them in order, and find D + i by a
    // map borrowing the enumerated sets (no allocation per coalition).
    let chunk = game.preferred_batch().max(1);
    let valued = map_items(game.sequential(), downsets.len().div_ceil(chunk), |c| {
        let mut part = Coalitions::with_capacity(n, chunk);
        (c * chunk..((c + 1) * chunk).min(downsets.len())).for_each(|i| part.push(downsets.get(i)));
        game.values(&part)
    })?;
    let worth: Vec<f64> = valued.into_iter().flatten().collect();
    let index: HashMap<&[u64], usize, foldhash::fast::FixedState> =
        downsets.iter().enumerate().map(|(i, set)| (set, i)).collect();
    let ln_fact = ln_factorials(n);
    // ln k for the subtree sizes 1..=n.
    let ln_count: Vec<f64> = (0..=n).map(|k| (k.max(1) as f64).ln()).collect();
    let ln_h: Vec<f64> = (0..n).map(|x| ln_count[forest.subtree_size(x)]).collect();
    let ln_h_total: f64 = ln_h.iter().sum();
    let chunk = 1024;
    let parts = map_items(false, downsets.len().div_ceil(chunk), |c| {
        let mut phi = vec![0.0; n];
        let mut inside = vec![0u32; n];
        let mut grown = vec![0u64; downsets.words()];
        for d in c * chunk..((c + 1) * chunk).min(downsets.len()) {
            let set = downsets.get(d);
            let size = super::coalition::size(set);
            if size == n {
                continue;
            }
            // ln of prod_{x in D} h_D(x) * prod_{x not in D} h(x).
            let mut ln_a = 0.0;
            for &x in forest.topological().iter().rev() {
                let x = x as usize;
                if contains(set, x) {
                    inside[x] = 1 + forest.children_of(x).iter().map(|&c| inside[c as usize]).sum::<u32>();
                    ln_a += ln_count[inside[x] as usize];
                } else {
                    inside[x] = 0;
                    ln_a += ln_h[x];
                }
            }
            let base = ln_fact[size] + ln_fact[n - size - 1] - ln_fact[n] + ln_h_total - ln_a;
            let value = worth[d];
            for i in 0..n {
                if contains(set, i) || !forest.addable(set, i) {
                    continue;
                }
                grown.copy_from_slice(set);
                insert(&mut grown, i);
                phi[i] += (base + ln_h[i]).exp() * (worth[index[grown.as_slice()]] - value);
            }
        }
        Ok(phi)
    })?;
    let mut values = vec![0.0; n];
    for phi in parts {
        values.iter_mut().zip(phi).for_each(|(v, p)| *v += p);
    }
    Ok(Estimate { values, stderr: vec![0.0; n], evaluations: downsets.len() as u64, converged: true, exact: true }
        .with_target(stopping))
}
