//! The permission (restricted) game of a spawn forest (Gilles, Owen & van den Brink 1992):
//! v'(S) = v(largest down-set inside S). A sub-agent without its parent adds nothing, so
//! parents share in the worth of what they spawned.

use crate::error::Result;
use crate::shapley::coalition::{Coalitions, contains, insert, words_for};
use crate::shapley::forest::Forest;
use crate::shapley::game::{Game, forward_bookkeeping};

pub struct RestrictedGame<'a> {
    inner: &'a dyn Game,
    forest: &'a Forest,
}

impl<'a> RestrictedGame<'a> {
    pub fn new(inner: &'a dyn Game, forest: &'a Forest) -> Self {
        RestrictedGame { inner, forest }
    }
}

impl Game for RestrictedGame<'_> {
    fn n_players(&self) -> usize {
        self.inner.n_players()
    }

    fn values(&self, coalitions: &Coalitions) -> Result<Vec<f64>> {
        let mut mapped = Coalitions::with_capacity(coalitions.n_players(), coalitions.len());
        let mut downset = vec![0u64; coalitions.words()];
        for set in coalitions.iter() {
            self.forest.largest_downset(set, &mut downset);
            mapped.push(&downset);
        }
        self.inner.values(&mapped)
    }

    /// The down-set grows in bursts: when a player arrives whose parent is in, it joins
    /// together with its descendants that were waiting for it. The inner game walks that
    /// induced ordering; each prefix reads the value at its down-set's size.
    fn walk(&self, order: &[u32], out: &mut [f64]) -> bool {
        let n = self.n_players();
        let mut arrived = vec![0u64; words_for(n)];
        let mut inside = vec![0u64; words_for(n)];
        let mut induced = Vec::with_capacity(n);
        let mut sizes = Vec::with_capacity(order.len());
        let mut stack = Vec::new();
        for &player in order {
            insert(&mut arrived, player as usize);
            if self.forest.addable(&inside, player as usize) {
                stack.push(player);
                while let Some(p) = stack.pop() {
                    insert(&mut inside, p as usize);
                    induced.push(p);
                    stack.extend(
                        self.forest.children_of(p as usize).iter().filter(|&&c| contains(&arrived, c as usize)),
                    );
                }
            }
            sizes.push(induced.len());
        }
        if induced.len() != n {
            return false;
        }
        let mut inner = vec![0.0; n + 1];
        if !self.inner.walk(&induced, &mut inner) {
            return false;
        }
        out[0] = inner[0];
        for (k, &size) in sizes.iter().enumerate() {
            out[k + 1] = inner[size];
        }
        true
    }

    forward_bookkeeping!(inner);
}
