//! Properties of the graph derivations against brute force, on random graphs.

use masreplay_core::graph::{Csr, acyclic_shape};
use proptest::prelude::*;

/// A random DAG: edges only from a lower to a higher index (possibly repeated).
fn dag() -> impl Strategy<Value = (usize, Vec<(u32, u32)>)> {
    (2usize..40).prop_flat_map(|n| {
        let n32 = n as u32;
        let edge = (0..n32, 1..n32).prop_map(move |(a, step)| {
            let b = (a + step) % n32;
            (a.min(b), a.max(b))
        });
        (Just(n), prop::collection::vec(edge, 0..(3 * n)))
    })
}

/// Longest path in edges by exhaustive relaxation (n rounds of Bellman-Ford).
fn brute_depth(n: usize, edges: &[(u32, u32)]) -> u32 {
    let mut level = vec![0u32; n];
    for _ in 0..n {
        for &(a, b) in edges {
            level[b as usize] = level[b as usize].max(level[a as usize] + 1);
        }
    }
    level.into_iter().max().unwrap_or(0)
}

fn brute_reach(n: usize, edges: &[(u32, u32)], from: u32) -> Vec<u32> {
    let mut seen = vec![false; n];
    let mut changed = true;
    for &(a, b) in edges {
        if a == from {
            seen[b as usize] = true;
        }
    }
    while changed {
        changed = false;
        for &(a, b) in edges {
            if seen[a as usize] && !seen[b as usize] {
                seen[b as usize] = true;
                changed = true;
            }
        }
    }
    (0..n as u32).filter(|&v| seen[v as usize]).collect()
}

proptest! {
    /// Both ways to the shape: edges as drawn (unsorted: adjacency and a topological sort)
    /// and sorted by source (forward and sorted: the one-pass path).
    #[test]
    fn shape_matches_brute_force((n, edges) in dag()) {
        let mut sorted = edges.clone();
        sorted.sort_unstable();
        let mut out_degree = vec![0u32; n];
        for &(a, _) in &edges {
            out_degree[a as usize] += 1;
        }
        for listed in [&edges, &sorted] {
            let shape = acyclic_shape(n, listed).unwrap();
            prop_assert_eq!(shape.depth, brute_depth(n, &edges));
            prop_assert_eq!(shape.max_branching, out_degree.iter().copied().max().unwrap_or(0));
        }
    }

    #[test]
    fn topological_order_respects_every_edge((n, edges) in dag()) {
        let order = Csr::from_edges(n, &edges).topological_order().unwrap();
        let mut position = vec![0usize; n];
        for (i, &v) in order.iter().enumerate() {
            position[v as usize] = i;
        }
        prop_assert_eq!(order.len(), n);
        for &(a, b) in &edges {
            prop_assert!(position[a as usize] < position[b as usize]);
        }
    }

    #[test]
    fn ancestors_and_descendants_are_reachability((n, edges) in dag(), pick in 0usize..40) {
        let node = (pick % n) as u32;
        let csr = Csr::from_edges(n, &edges);
        prop_assert_eq!(csr.descendants(node), brute_reach(n, &edges, node));
        let reversed: Vec<(u32, u32)> = edges.iter().map(|&(a, b)| (b, a)).collect();
        prop_assert_eq!(csr.ancestors(node), brute_reach(n, &reversed, node));
    }

    /// Adding one backward edge along an existing path closes a cycle, which must be found and
    /// reported as a real cycle of the graph.
    #[test]
    fn a_back_edge_on_a_path_is_a_reported_cycle((n, edges) in dag(), pick in 0usize..200) {
        prop_assume!(!edges.is_empty());
        let (a, b) = edges[pick % edges.len()];
        let mut with_cycle = edges.clone();
        with_cycle.push((b, a));
        let cycle = Csr::from_edges(n, &with_cycle).topological_order().unwrap_err();
        let k = cycle.events.len();
        prop_assert!(k >= 2);
        for i in 0..k {
            let step = (cycle.events[i], cycle.events[(i + 1) % k]);
            prop_assert!(with_cycle.contains(&step), "{:?} is not an edge", step);
        }
        let (src, dst) = with_cycle[cycle.edge_index];
        prop_assert!(cycle.events.contains(&src) && cycle.events.contains(&dst));
    }
}
