//! The spawn forest of a game's players: `parent[i]` spawned `i`. Feasible coalitions are
//! its down-sets (a player is present only with its parent). Everything the tree-aware
//! estimators need lives here: the largest down-set inside a coalition, counting and
//! enumerating down-sets, and uniform sampling of the orderings that put parents first.

use rand::RngExt;
use rand_xoshiro::Xoshiro256PlusPlus;

use super::coalition::{Coalitions, contains, insert, words_for};
use crate::error::{MasreplayError, Result};

#[derive(Clone, Debug)]
pub struct Forest {
    parent: Vec<Option<u32>>,
    child_offsets: Vec<u32>,
    children: Vec<u32>,
    /// Parents before children (breadth first from the roots).
    topological: Vec<u32>,
    /// Players in each player's subtree, itself included.
    subtree: Vec<u32>,
}

impl Forest {
    /// `parents[i]` is the index of i's spawning player, or -1 for a root.
    pub fn new(parents: &[i64]) -> Result<Self> {
        let n = parents.len();
        let invalid = |message: String| Err(MasreplayError::InvalidArgument(format!("parents: {message}")));
        let mut parent = Vec::with_capacity(n);
        for (i, &p) in parents.iter().enumerate() {
            match p {
                -1 => parent.push(None),
                p if p >= 0 && (p as usize) < n && p as usize != i => parent.push(Some(p as u32)),
                p if p as usize == i => return invalid(format!("player {i} is its own parent")),
                p => return invalid(format!("parents[{i}] = {p} is neither -1 nor a player index below {n}")),
            }
        }
        let mut child_offsets = vec![0u32; n + 1];
        for p in parent.iter().flatten() {
            child_offsets[*p as usize + 1] += 1;
        }
        for i in 0..n {
            child_offsets[i + 1] += child_offsets[i];
        }
        let mut fill = child_offsets.clone();
        let mut children = vec![0u32; n];
        for (i, p) in parent.iter().enumerate() {
            if let Some(p) = p {
                children[fill[*p as usize] as usize] = i as u32;
                fill[*p as usize] += 1;
            }
        }
        let mut forest =
            Forest { parent, child_offsets, children, topological: Vec::with_capacity(n), subtree: vec![1; n] };
        forest.topological.extend((0..n as u32).filter(|&i| forest.parent[i as usize].is_none()));
        let mut head = 0;
        while head < forest.topological.len() {
            let p = forest.topological[head] as usize;
            head += 1;
            let kids = forest.children_of(p).to_vec();
            forest.topological.extend(kids);
        }
        if forest.topological.len() != n {
            let stuck = (0..n).find(|i| !forest.topological.contains(&(*i as u32))).unwrap_or(0);
            return invalid(format!("player {stuck} is on a cycle (no chain of parents reaches a root)"));
        }
        for &p in forest.topological.iter().rev() {
            if let Some(q) = forest.parent[p as usize] {
                forest.subtree[q as usize] += forest.subtree[p as usize];
            }
        }
        Ok(forest)
    }

    pub fn len(&self) -> usize {
        self.parent.len()
    }

    pub fn is_empty(&self) -> bool {
        self.parent.is_empty()
    }

    pub fn parent(&self, player: usize) -> Option<usize> {
        self.parent[player].map(|p| p as usize)
    }

    pub fn children_of(&self, player: usize) -> &[u32] {
        &self.children[self.child_offsets[player] as usize..self.child_offsets[player + 1] as usize]
    }

    pub fn subtree_size(&self, player: usize) -> usize {
        self.subtree[player] as usize
    }

    pub fn topological(&self) -> &[u32] {
        &self.topological
    }

    /// Can `player` join `set` (its parent is in, or it is a root)?
    pub fn addable(&self, set: &[u64], player: usize) -> bool {
        self.parent(player).is_none_or(|p| contains(set, p))
    }

    /// The largest down-set inside `set`: its players whose whole ancestry is in `set`.
    pub fn largest_downset(&self, set: &[u64], out: &mut [u64]) {
        out.fill(0);
        for &p in &self.topological {
            let p = p as usize;
            if contains(set, p) && self.addable(out, p) {
                insert(out, p);
            }
        }
    }

    /// Down-sets, the empty one included; f64 because a wide forest has more than 2^64.
    pub fn count_downsets(&self) -> f64 {
        // containing[x]: down-sets of x's subtree that contain x.
        let mut containing = vec![1.0f64; self.len()];
        for &p in self.topological.iter().rev() {
            let p = p as usize;
            containing[p] = self.children_of(p).iter().map(|&c| 1.0 + containing[c as usize]).product();
        }
        self.topological
            .iter()
            .filter(|&&r| self.parent[r as usize].is_none())
            .map(|&r| 1.0 + containing[r as usize])
            .product()
    }

    /// Every down-set, in a fixed order, when there are at most `limit`.
    pub fn downsets(&self, limit: usize) -> Option<Coalitions> {
        if self.count_downsets() > limit as f64 {
            return None;
        }
        let mut out = Coalitions::new(self.len());
        let mut set = vec![0u64; words_for(self.len())];
        self.enumerate(0, &mut set, &mut out);
        Some(out)
    }

    fn enumerate(&self, position: usize, set: &mut [u64], out: &mut Coalitions) {
        let Some(&p) = self.topological.get(position) else {
            out.push(set);
            return;
        };
        let p = p as usize;
        self.enumerate(position + 1, set, out);
        if self.addable(set, p) {
            insert(set, p);
            self.enumerate(position + 1, set, out);
            set[p / 64] &= !(1 << (p % 64));
        }
    }

    /// A uniformly random ordering of the players in which every parent precedes its
    /// children: each step picks an available player with probability proportional to its
    /// subtree size (the available subtrees partition the players left, so the weights sum
    /// to their number).
    pub fn sample_ordering(&self, rng: &mut Xoshiro256PlusPlus, order: &mut Vec<u32>, available: &mut Vec<u32>) {
        order.clear();
        available.clear();
        available.extend(self.topological.iter().copied().filter(|&r| self.parent[r as usize].is_none()));
        for left in (1..=self.len()).rev() {
            let mut draw = rng.random_range(0..left as u32);
            let mut slot = 0;
            while draw >= self.subtree[available[slot] as usize] {
                draw -= self.subtree[available[slot] as usize];
                slot += 1;
            }
            let chosen = available.swap_remove(slot);
            order.push(chosen);
            available.extend_from_slice(self.children_of(chosen as usize));
        }
    }

    /// ln of the number of orderings that put parents first: n! / prod of subtree sizes.
    pub fn ln_orderings(&self) -> f64 {
        ln_factorial(self.len()) - self.subtree.iter().map(|&s| (s as f64).ln()).sum::<f64>()
    }
}

pub fn ln_factorial(n: usize) -> f64 {
    (2..=n).map(|k| (k as f64).ln()).sum()
}

/// ln k! for k in 0..=n.
pub fn ln_factorials(n: usize) -> Vec<f64> {
    let mut table = vec![0.0; n + 1];
    for k in 1..=n {
        table[k] = table[k - 1] + (k as f64).ln();
    }
    table
}
