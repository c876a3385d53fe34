//! The pass over a trace's edges (longest paths, reach of error sources) and, for the traces
//! that need them, the successor lists and a topological order.

use crate::trace_view::BatchView;

use super::{DOWNSTREAM, Node, SOURCE, Scratch, TraceMetrics, prefix_sums, refill};

/// Relaxes the edge `source -> target`: the longest paths into `target` in events and in
/// seconds, and its DOWNSTREAM mark (without a branch: sources are rare and unpredictable).
#[inline(always)]
fn relax(nodes: &mut [Node], source: usize, target: usize) {
    let from = nodes[source];
    let to = &mut nodes[target];
    to.steps = to.steps.max(from.steps + 1);
    to.seconds = to.seconds.max(from.seconds + to.weight);
    to.error_flags |= DOWNSTREAM * (from.error_flags != 0) as u8;
}

impl Scratch {
    pub(super) fn successors(&self, event: u32) -> &[u32] {
        &self.out_targets[self.out_offsets[event as usize] as usize..self.out_offsets[event as usize + 1] as usize]
    }

    /// The trace's successor lists, built on first use.
    pub(super) fn adjacency(&mut self, view: &BatchView<'_>, trace: usize) {
        if self.has_adjacency {
            return;
        }
        self.has_adjacency = true;
        let n = view.events_of(trace).len();
        let (src, dst) = view.edge_pairs(trace);
        refill(&mut self.out_offsets, n + 1, 0);
        for &source in src {
            self.out_offsets[source as usize + 1] += 1;
        }
        prefix_sums(&mut self.out_offsets);
        refill(&mut self.out_targets, src.len(), 0);
        self.cursor.clear();
        self.cursor.extend_from_slice(&self.out_offsets[..n]);
        for (&source, &target) in src.iter().zip(dst) {
            let slot = &mut self.cursor[source as usize];
            self.out_targets[*slot as usize] = target as u32;
            *slot += 1;
        }
    }

    /// The one pass over the edges, in an order where every edge into an event comes before
    /// the edges out of it. That is the stored order when edges are sorted by source and
    /// point forward, as built traces are; the first edge that breaks it restarts the pass,
    /// in the time order of the edges' sources where every edge points forward in time
    /// (whatever order events and edges are stored in), else out of each event in Kahn's
    /// topological order. On the way it relaxes the longest path in events and in seconds,
    /// and spreads the error sources' reach (events downstream of one, each counted once).
    pub(super) fn walk_edges(&mut self, view: &BatchView<'_>, trace: usize, metrics: &mut TraceMetrics) {
        let n = metrics.n_events as usize;
        let (src, dst) = view.edge_pairs(trace);
        let nodes = &mut self.nodes[..];
        let mut previous = 0;
        let relaxed = src
            .iter()
            .zip(dst)
            .take_while(|&(&source, &target)| {
                let forward = previous <= source && source < target;
                previous = source;
                if forward {
                    relax(nodes, source as usize, target as usize);
                }
                forward
            })
            .count();
        if relaxed < src.len() {
            // Only the targets of the edges relaxed so far have changed.
            for &target in &dst[..relaxed] {
                let node = &mut nodes[target as usize];
                *node = Node { error_flags: node.error_flags & SOURCE, ..Node::new(node.weight) };
            }
            if self.sort_edges_by_source_time(src, dst) {
                let nodes = &mut self.nodes[..];
                for &(source, target) in &self.edges_by_time {
                    relax(nodes, source as usize, target as usize);
                }
            } else {
                self.adjacency(view, trace);
                self.topological_order();
                let nodes = &mut self.nodes[..];
                for &event in &self.order {
                    let targets =
                        self.out_offsets[event as usize] as usize..self.out_offsets[event as usize + 1] as usize;
                    for &target in &self.out_targets[targets] {
                        relax(nodes, event as usize, target as usize);
                    }
                }
            }
        }
        metrics.critical_path_steps = self.nodes.iter().map(|node| node.steps).max().unwrap_or(0);
        metrics.critical_path_s = self.nodes.iter().map(|node| node.seconds).fold(0.0, f64::max);
        if metrics.critical_path_steps > 0 {
            metrics.parallelism_efficiency = n as f64 / metrics.critical_path_steps as f64;
        }
        if self.n_error_sources > 0 {
            let downstream = self.nodes.iter().filter(|node| node.error_flags & DOWNSTREAM != 0).count();
            metrics.error_amplification = Some(downstream as f64 / self.n_error_sources as f64);
        }
    }

    /// `edges_by_time`: the edges as (source, target), by their source's place in time
    /// order (a counting sort), if every edge points from an earlier event to a later one in
    /// time order, as edges of a causal record do: then the time order is a topological
    /// order, whatever order the events and edges are stored in. Returns whether they do.
    /// One flat loop over `edges_by_time` relaxes every edge into an event before any out
    /// of it, without the successor lists' short inner loops, whose ends the CPU mispredicts.
    fn sort_edges_by_source_time(&mut self, src: &[i32], dst: &[i32]) -> bool {
        let n = self.by_time.len();
        // Out-degrees by event, then each event's first slot, the events taken in time
        // order, while each event's place in time order is noted on the way.
        refill(&mut self.cursor, n, 0);
        let cursor = &mut self.cursor[..];
        for &source in src {
            cursor[source as usize] += 1;
        }
        // Every event's place and every edge's slot is written below: no need to clear.
        self.position.resize(n, 0);
        let position = &mut self.position[..n];
        let mut slot = 0;
        for (place, &event) in self.by_time.iter().enumerate() {
            position[event as usize] = place as u32;
            let degree = cursor[event as usize];
            cursor[event as usize] = slot;
            slot += degree;
        }
        self.edges_by_time.resize(src.len(), (0, 0));
        let edges = &mut self.edges_by_time[..src.len()];
        let mut forward = true;
        for (&source, &target) in src.iter().zip(dst) {
            forward &= position[source as usize] < position[target as usize];
            let slot = &mut cursor[source as usize];
            edges[*slot as usize] = (source as u32, target as u32);
            *slot += 1;
        }
        forward
    }

    /// `order`: the events in a topological order (Kahn's), from the successor lists.
    fn topological_order(&mut self) {
        let n = self.out_offsets.len() - 1;
        refill(&mut self.in_degree, n, 0);
        for &target in &self.out_targets {
            self.in_degree[target as usize] += 1;
        }
        self.order.clear();
        self.order.extend((0..n as u32).filter(|&v| self.in_degree[v as usize] == 0));
        let mut head = 0;
        while head < self.order.len() {
            let event = self.order[head] as usize;
            head += 1;
            for slot in self.out_offsets[event]..self.out_offsets[event + 1] {
                let next = self.out_targets[slot as usize] as usize;
                self.in_degree[next] -= 1;
                if self.in_degree[next] == 0 {
                    self.order.push(next as u32);
                }
            }
        }
    }
}
