//! The event graph of one trace in compressed sparse row form: topological order, cycle
//! detection, depth, branching, ancestors and descendants.

/// Outgoing adjacency of a trace's events, by local index.
#[derive(Clone, Debug)]
pub struct Csr {
    offsets: Vec<u32>,
    targets: Vec<u32>,
    /// For each adjacency slot, the position of its edge in the trace's edge list.
    edge_ids: Vec<u32>,
}

/// A directed cycle: the events in order, and the position of one of its edges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cycle {
    pub events: Vec<u32>,
    pub edge_index: usize,
}

/// Shape figures derived once at ingest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Shape {
    /// Edges on the longest path of the event graph (0 when there are no edges).
    pub depth: u32,
    /// The largest out-degree of any event.
    pub max_branching: u32,
}

impl Csr {
    /// Builds the adjacency; every endpoint must be below `n_events`.
    pub fn from_edges(n_events: usize, edges: &[(u32, u32)]) -> Self {
        let mut offsets = vec![0u32; n_events + 1];
        for &(src, _) in edges {
            offsets[src as usize + 1] += 1;
        }
        for i in 0..n_events {
            offsets[i + 1] += offsets[i];
        }
        let mut cursor = offsets.clone();
        let mut targets = vec![0u32; edges.len()];
        let mut edge_ids = vec![0u32; edges.len()];
        for (k, &(src, dst)) in edges.iter().enumerate() {
            let slot = cursor[src as usize] as usize;
            targets[slot] = dst;
            edge_ids[slot] = k as u32;
            cursor[src as usize] += 1;
        }
        Csr { offsets, targets, edge_ids }
    }

    pub fn n_events(&self) -> usize {
        self.offsets.len() - 1
    }

    pub fn successors(&self, event: u32) -> &[u32] {
        let (start, end) = (self.offsets[event as usize], self.offsets[event as usize + 1]);
        &self.targets[start as usize..end as usize]
    }

    /// The graph with every edge reversed (edge positions kept).
    pub fn reversed(&self) -> Csr {
        let pairs: Vec<(u32, u32)> = self.pairs().map(|(src, dst, _)| (dst, src)).collect();
        let mut reversed = Csr::from_edges(self.n_events(), &pairs);
        let ids: Vec<u32> = self.pairs().map(|(_, _, id)| id).collect();
        for slot in reversed.edge_ids.iter_mut() {
            *slot = ids[*slot as usize];
        }
        reversed
    }

    fn pairs(&self) -> impl Iterator<Item = (u32, u32, u32)> + '_ {
        (0..self.n_events() as u32).flat_map(move |src| {
            let range = self.offsets[src as usize] as usize..self.offsets[src as usize + 1] as usize;
            range.map(move |slot| (src, self.targets[slot], self.edge_ids[slot]))
        })
    }

    /// Kahn's algorithm; ties keep the events' original order. Fails with one cycle.
    pub fn topological_order(&self) -> Result<Vec<u32>, Cycle> {
        let n = self.n_events();
        let mut in_degree = vec![0u32; n];
        for &dst in &self.targets {
            in_degree[dst as usize] += 1;
        }
        let mut order: Vec<u32> = (0..n as u32).filter(|&v| in_degree[v as usize] == 0).collect();
        let mut head = 0;
        while head < order.len() {
            let event = order[head];
            head += 1;
            for &next in self.successors(event) {
                in_degree[next as usize] -= 1;
                if in_degree[next as usize] == 0 {
                    order.push(next);
                }
            }
        }
        if order.len() == n { Ok(order) } else { Err(self.find_cycle(&in_degree)) }
    }

    /// Every event left with a positive in-degree after Kahn's pass has a predecessor that is
    /// also left, so walking predecessors among them must come back to an event already seen.
    fn find_cycle(&self, in_degree: &[u32]) -> Cycle {
        let reversed = self.reversed();
        let left = |v: u32| in_degree[v as usize] > 0;
        let start = (0..self.n_events() as u32).find(|&v| left(v)).expect("a cycle leaves events behind");
        let mut position = vec![usize::MAX; self.n_events()];
        let mut walk: Vec<(u32, u32)> = Vec::new(); // (event, edge from its predecessor to it)
        let mut current = start;
        loop {
            if position[current as usize] != usize::MAX {
                let cycle = &walk[position[current as usize]..];
                // The walk went backwards along edges; read it forwards.
                let mut events: Vec<u32> = cycle.iter().map(|&(event, _)| event).collect();
                events.reverse();
                return Cycle { events, edge_index: cycle[0].1 as usize };
            }
            position[current as usize] = walk.len();
            let range = reversed.offsets[current as usize] as usize..reversed.offsets[current as usize + 1] as usize;
            let slot =
                range.clone().find(|&slot| left(reversed.targets[slot])).expect("a left event has a left predecessor");
            walk.push((current, reversed.edge_ids[slot]));
            current = reversed.targets[slot];
        }
    }

    /// Depth and branching along a topological order.
    fn shape_along(&self, order: &[u32]) -> Shape {
        let mut level = vec![0u32; self.n_events()];
        let mut shape = Shape::default();
        for &event in order {
            let successors = self.successors(event);
            shape.max_branching = shape.max_branching.max(successors.len() as u32);
            for &next in successors {
                level[next as usize] = level[next as usize].max(level[event as usize] + 1);
                shape.depth = shape.depth.max(level[next as usize]);
            }
        }
        shape
    }

    /// Every event reachable from `start` along edges, `start` excluded, in ascending order.
    pub fn reachable(&self, start: u32) -> Vec<u32> {
        let mut seen = vec![false; self.n_events()];
        let mut stack = vec![start];
        while let Some(event) = stack.pop() {
            for &next in self.successors(event) {
                if !seen[next as usize] {
                    seen[next as usize] = true;
                    stack.push(next);
                }
            }
        }
        seen[start as usize] = false;
        (0..self.n_events() as u32).filter(|&v| seen[v as usize]).collect()
    }

    pub fn descendants(&self, event: u32) -> Vec<u32> {
        self.reachable(event)
    }

    pub fn ancestors(&self, event: u32) -> Vec<u32> {
        self.reversed().reachable(event)
    }
}

/// Depth and branching of a trace's graph, or one of its cycles; endpoints must be below
/// `n_events`. Traces are mostly written in time order with edges listed by source, so edges
/// that all point forward and come sorted by source are settled in one pass (forward edges
/// cannot close a cycle); anything else builds the adjacency and sorts it topologically once.
pub fn acyclic_shape(n_events: usize, edges: &[(u32, u32)]) -> Result<Shape, Cycle> {
    let forward_sorted =
        edges.iter().all(|&(src, dst)| src < dst) && edges.windows(2).all(|pair| pair[0].0 <= pair[1].0);
    if !forward_sorted {
        let csr = Csr::from_edges(n_events, edges);
        return csr.topological_order().map(|order| csr.shape_along(&order));
    }
    let mut shape = Shape::default();
    if edges.is_empty() {
        return Ok(shape);
    }
    // Every edge into an event's source comes earlier in the list (it has a smaller source),
    // so the source's level is final when its own edges are read.
    let mut level = vec![0u32; n_events];
    let mut run = (u32::MAX, 0u32);
    for &(src, dst) in edges {
        run = if run.0 == src { (src, run.1 + 1) } else { (src, 1) };
        shape.max_branching = shape.max_branching.max(run.1);
        level[dst as usize] = level[dst as usize].max(level[src as usize] + 1);
        shape.depth = shape.depth.max(level[dst as usize]);
    }
    Ok(shape)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_and_branching_of_a_fan_out() {
        let edges = [(0, 1), (0, 2), (0, 3), (1, 4), (3, 4)];
        assert_eq!(acyclic_shape(5, &edges), Ok(Shape { depth: 2, max_branching: 3 }));
        let csr = Csr::from_edges(5, &edges);
        assert_eq!(csr.descendants(0), vec![1, 2, 3, 4]);
        assert_eq!(csr.ancestors(4), vec![0, 1, 3]);
    }

    #[test]
    fn joined_paths_take_the_longest() {
        assert_eq!(acyclic_shape(4, &[(0, 3), (0, 1), (1, 2), (2, 3)]).map(|s| s.depth), Ok(3));
    }

    #[test]
    fn cycle_is_reported_in_order_with_one_of_its_edges() {
        let edges = [(0, 1), (1, 2), (2, 3), (3, 1)];
        let cycle = Csr::from_edges(4, &edges).topological_order().unwrap_err();
        let mut events = cycle.events.clone();
        events.sort();
        assert_eq!(events, vec![1, 2, 3]);
        let (src, dst) = edges[cycle.edge_index];
        assert!(cycle.events.contains(&src) && cycle.events.contains(&dst));
        let k = cycle.events.len();
        for i in 0..k {
            let (a, b) = (cycle.events[i], cycle.events[(i + 1) % k]);
            assert!(edges.contains(&(a, b)), "{a}->{b} is not an edge");
        }
    }

    #[test]
    fn no_edges_means_depth_zero() {
        assert_eq!(acyclic_shape(3, &[]), Ok(Shape { depth: 0, max_branching: 0 }));
    }

    #[test]
    fn a_backward_edge_is_still_checked_for_cycles() {
        assert!(acyclic_shape(3, &[(0, 1), (1, 2), (2, 0)]).is_err());
        assert_eq!(acyclic_shape(3, &[(2, 1), (1, 0)]), Ok(Shape { depth: 2, max_branching: 1 }));
    }
}
