//! Owen values with nested a priori unions (e.g. role > agent > message): orderings keep
//! every union contiguous at every level, orders of siblings uniform. The players of a
//! union then share exactly the union's Shapley value in the game between unions, so credit
//! splits level by level without double counting.

use rand::RngExt;
use rand_xoshiro::Xoshiro256PlusPlus;

use super::coalition::{Coalitions, insert, words_for};
use super::exact::shapley_weights;
use super::game::Game;
use super::pipeline::value_drawn;
use super::sampling::OrderSampler;
use super::{Estimate, Stopping};
use crate::error::{MasreplayError, Result};

/// A union: players, or unions nested further.
#[derive(Clone, Debug, PartialEq)]
pub enum Union {
    Player(u32),
    Group(Vec<Union>),
}

#[derive(Clone, Debug)]
pub struct Hierarchy {
    n_players: usize,
    /// The top-level unions; players that no union names stand alone.
    top: Vec<Union>,
}

impl Hierarchy {
    pub fn new(n_players: usize, unions: Vec<Union>) -> Result<Self> {
        let mut seen = vec![false; n_players];
        fn visit(node: &Union, seen: &mut [bool]) -> Result<()> {
            match node {
                Union::Player(p) => {
                    let n = seen.len();
                    let slot = seen.get_mut(*p as usize).ok_or_else(|| {
                        MasreplayError::InvalidArgument(format!("unions: player {p} out of range for {n} players"))
                    })?;
                    if std::mem::replace(slot, true) {
                        return Err(MasreplayError::InvalidArgument(format!("unions: player {p} appears twice")));
                    }
                    Ok(())
                }
                Union::Group(children) if children.is_empty() => {
                    Err(MasreplayError::InvalidArgument("unions: a union is empty".into()))
                }
                Union::Group(children) => children.iter().try_for_each(|c| visit(c, seen)),
            }
        }
        for union in &unions {
            visit(union, &mut seen)?;
        }
        let mut top = unions;
        top.extend((0..n_players as u32).filter(|&p| !seen[p as usize]).map(Union::Player));
        Ok(Hierarchy { n_players, top })
    }

    /// The players of each top-level union.
    pub fn top_level(&self) -> Vec<Vec<u32>> {
        self.top.iter().map(players_of).collect()
    }

    fn emit(&self, nodes: &[Union], rng: &mut Xoshiro256PlusPlus, order: &mut Vec<u32>) {
        let mut slots: Vec<usize> = (0..nodes.len()).collect();
        for i in (1..slots.len()).rev() {
            slots.swap(i, rng.random_range(0..=i));
        }
        for s in slots {
            match &nodes[s] {
                Union::Player(p) => order.push(*p),
                Union::Group(children) => self.emit(children, rng, order),
            }
        }
    }

    /// Per player, the sibling sets met on the way down: (the others' player lists).
    fn paths(&self) -> Vec<Vec<Vec<Vec<u32>>>> {
        let mut paths = vec![Vec::new(); self.n_players];
        fn walk(nodes: &[Union], above: &mut Vec<Vec<Vec<u32>>>, paths: &mut [Vec<Vec<Vec<u32>>>]) {
            for (k, node) in nodes.iter().enumerate() {
                let others = nodes.iter().enumerate().filter(|&(j, _)| j != k).map(|(_, o)| players_of(o)).collect();
                above.push(others);
                match node {
                    Union::Player(p) => paths[*p as usize] = above.clone(),
                    Union::Group(children) => walk(children, above, paths),
                }
                above.pop();
            }
        }
        walk(&self.top, &mut Vec::new(), &mut paths);
        paths
    }

    /// Coalitions exact Owen values would value (two per predecessor set).
    pub fn exact_cost(&self) -> f64 {
        self.paths()
            .iter()
            .map(|path| path.iter().map(|level| 2f64.powi(level.len() as i32)).product::<f64>() * 2.0)
            .sum()
    }
}

fn players_of(node: &Union) -> Vec<u32> {
    match node {
        Union::Player(p) => vec![*p],
        Union::Group(children) => children.iter().flat_map(players_of).collect(),
    }
}

impl OrderSampler for Hierarchy {
    fn sample(&self, rng: &mut Xoshiro256PlusPlus, order: &mut Vec<u32>, _scratch: &mut Vec<u32>) {
        order.clear();
        self.emit(&self.top, rng, order);
    }

    /// Reversing keeps every union contiguous, and sibling orders stay uniform.
    fn antithetic(&self) -> bool {
        true
    }
}

/// Exact Owen values: at each level, the siblings that precede i's branch form a uniformly
/// ordered prefix, so a subset R of the m siblings precedes with weight |R|! (m - |R|)! / (m + 1)!.
pub fn exact_owen(game: &dyn Game, hierarchy: &Hierarchy, stopping: &Stopping) -> Result<Estimate> {
    let n = hierarchy.n_players;
    let words = words_for(n);
    // (player, weight, predecessors)
    let mut terms: Vec<(usize, f64, Vec<u64>)> = Vec::new();
    for (player, path) in hierarchy.paths().into_iter().enumerate() {
        let mut partial = vec![(1.0, vec![0u64; words])];
        for siblings in &path {
            let m = siblings.len();
            let weights = shapley_weights(m + 1);
            let mut next = Vec::with_capacity(partial.len() << m);
            for (weight, set) in &partial {
                for subset in 0u64..1 << m {
                    let mut grown = set.clone();
                    for (k, sibling) in siblings.iter().enumerate() {
                        if subset >> k & 1 == 1 {
                            sibling.iter().for_each(|&p| insert(&mut grown, p as usize));
                        }
                    }
                    next.push((weight * weights[subset.count_ones() as usize], grown));
                }
            }
            partial = next;
        }
        terms.extend(partial.into_iter().map(|(weight, set)| (player, weight, set)));
    }
    let mut batch = Coalitions::with_capacity(n, 2 * terms.len());
    for (player, _, set) in &terms {
        batch.push(set);
        let mut with = set.clone();
        insert(&mut with, *player);
        batch.push(&with);
    }
    let valued = value_drawn(game, &batch, &mut (), |_, _, _| {})?;
    let mut values = vec![0.0; n];
    for (t, (player, weight, _)) in terms.iter().enumerate() {
        values[*player] += weight * (valued.worth[2 * t + 1] - valued.worth[2 * t]);
    }
    Ok(Estimate { values, stderr: vec![0.0; n], evaluations: valued.distinct as u64, converged: true, exact: true }
        .with_target(stopping))
}
