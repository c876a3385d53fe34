//! The metrics of one trace, computed in a few linear passes over its rows of the event and
//! edge columns. Buffers live in a per-thread [`Scratch`] reused from trace to trace, so the
//! bulk pass allocates almost nothing per trace.

use std::cmp::Ordering;

use arrow_array::Array;

use super::{Columns, TraceMetrics};
use crate::trace::EventType;

const NONE: u32 = u32::MAX;

/// What the metrics need to know of one agent of the trace.
#[derive(Clone, Copy)]
struct Agent {
    own_steps: u32,
    first_t: f64,
    /// End of its last event (`t + duration_s`).
    end_t: f64,
    /// Its earliest spawn event (local index), or NONE.
    spawn: u32,
    /// Local index of the agent that authored that spawn, or NONE.
    parent: u32,
    despawn_t: f64,
    returned: bool,
    critical_steps: u32,
    /// Level in the spawn tree below the orchestrator; NONE when not reached from it.
    level: u32,
}

impl Agent {
    fn new() -> Self {
        Agent {
            own_steps: 0,
            first_t: f64::INFINITY,
            end_t: f64::NEG_INFINITY,
            spawn: NONE,
            parent: NONE,
            despawn_t: f64::NEG_INFINITY,
            returned: false,
            critical_steps: 0,
            level: NONE,
        }
    }

    fn lifetime(&self, spawn_t: f64) -> (f64, f64) {
        let start = self.first_t.min(spawn_t);
        (start, self.end_t.max(self.despawn_t).max(start))
    }
}

/// Per-thread buffers; every vector is cleared, not freed, between traces.
pub(super) struct Scratch<'a> {
    /// Agent number -> local index, valid where `stamp` equals `generation`.
    local_of: Vec<u32>,
    stamp: Vec<u32>,
    generation: u32,
    agents: Vec<Agent>,
    types: Vec<EventType>,
    author: Vec<u32>,
    out_offsets: Vec<u32>,
    out_targets: Vec<u32>,
    in_degree: Vec<u32>,
    order: Vec<u32>,
    steps: Vec<u32>,
    weights: Vec<f64>,
    seconds: Vec<f64>,
    reached: Vec<bool>,
    stack: Vec<u32>,
    contents: Vec<&'a str>,
    /// Each agent's own events, grouped by agent (counting sort), then sorted by time.
    own_offsets: Vec<u32>,
    own_events: Vec<u32>,
    stage_of: Vec<u32>,
    child_offsets: Vec<u32>,
    children: Vec<u32>,
    tree: Vec<u32>,
    stage_steps: Vec<u32>,
    stage_best: Vec<u32>,
    sweep: Vec<(f64, u8)>,
}

fn refill<T: Clone>(buffer: &mut Vec<T>, len: usize, value: T) {
    buffer.clear();
    buffer.resize(len, value);
}

/// Exclusive prefix sums of `counts` (length n + 1, counts in slots 1..).
fn prefix_sums(offsets: &mut [u32]) {
    for i in 1..offsets.len() {
        offsets[i] += offsets[i - 1];
    }
}

impl<'a> Scratch<'a> {
    pub(super) fn new(n_agent_names: usize) -> Self {
        Scratch {
            local_of: vec![0; n_agent_names],
            stamp: vec![0; n_agent_names],
            generation: 0,
            agents: Vec::new(),
            types: Vec::new(),
            author: Vec::new(),
            out_offsets: Vec::new(),
            out_targets: Vec::new(),
            in_degree: Vec::new(),
            order: Vec::new(),
            steps: Vec::new(),
            weights: Vec::new(),
            seconds: Vec::new(),
            reached: Vec::new(),
            stack: Vec::new(),
            contents: Vec::new(),
            own_offsets: Vec::new(),
            own_events: Vec::new(),
            stage_of: Vec::new(),
            child_offsets: Vec::new(),
            children: Vec::new(),
            tree: Vec::new(),
            stage_steps: Vec::new(),
            stage_best: Vec::new(),
            sweep: Vec::new(),
        }
    }

    fn lookup(&self, name: u32) -> Option<u32> {
        (self.stamp[name as usize] == self.generation).then(|| self.local_of[name as usize])
    }

    /// The local index of agent `name`, registering it on first sight.
    fn local(&mut self, name: u32) -> u32 {
        if let Some(local) = self.lookup(name) {
            return local;
        }
        let local = self.agents.len() as u32;
        self.stamp[name as usize] = self.generation;
        self.local_of[name as usize] = local;
        self.agents.push(Agent::new());
        local
    }

    fn successors(&self, event: u32) -> &[u32] {
        &self.out_targets[self.out_offsets[event as usize] as usize..self.out_offsets[event as usize + 1] as usize]
    }

    pub(super) fn measure(&mut self, columns: &Columns<'a>, trace: usize) -> TraceMetrics {
        let start = columns.event_offsets[trace] as usize;
        let n = columns.event_offsets[trace + 1] as usize - start;
        // Events are ordered by (t, id), never by row, so the metrics ignore the input order.
        let earlier = |a: u32, b: u32| -> bool {
            let (a, b) = (start + a as usize, start + b as usize);
            let by_time = columns.events.t.value(a).total_cmp(&columns.events.t.value(b));
            by_time.then_with(|| columns.events.id.value(a).cmp(columns.events.id.value(b))) == Ordering::Less
        };
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.stamp.fill(0);
            self.generation = 1;
        }
        self.agents.clear();
        self.types.clear();
        self.author.clear();
        self.contents.clear();
        self.stack.clear();
        let mut metrics = TraceMetrics {
            n_events: n as u32,
            critical_path_steps: 0,
            critical_path_s: 0.0,
            total_work_steps: n as u32,
            parallelism_efficiency: 0.0,
            critical_steps: 0,
            finish_rate: None,
            idle_agents: 0,
            utilization: None,
            protocol_overhead: None,
            message_redundancy: None,
            error_amplification: None,
            max_concurrent_agents: 0,
            spawn_count: 0,
            despawn_count: 0,
            spawn_depth: 0,
            spawn_branching: 0,
        };
        let (mut all_tokens, mut protocol_tokens) = (0i64, 0i64);
        let events = &columns.events;
        for j in 0..n {
            let row = start + j;
            let event_type =
                EventType::from_code(events.event_type.keys().value(row) as usize).expect("canonical event type codes");
            let t = events.t.value(row);
            let tokens = if events.tokens.is_null(row) { 0 } else { events.tokens.value(row) };
            all_tokens += tokens;
            if matches!(event_type, EventType::Spawn | EventType::Despawn | EventType::Message | EventType::ToolCall) {
                protocol_tokens += tokens;
            }
            let author = if event_type == EventType::ToolResult {
                NONE
            } else {
                let local = self.local(columns.agent(row));
                let duration = if events.duration_s.is_null(row) { 0.0 } else { events.duration_s.value(row) };
                let agent = &mut self.agents[local as usize];
                agent.own_steps += 1;
                agent.first_t = agent.first_t.min(t);
                agent.end_t = agent.end_t.max(t + duration);
                local
            };
            match event_type {
                EventType::Spawn => {
                    metrics.spawn_count += 1;
                    if let Some(child) = columns.to(row).map(|name| self.local(name)).filter(|&c| c != author) {
                        let agent = &mut self.agents[child as usize];
                        if agent.spawn == NONE || earlier(j as u32, agent.spawn) {
                            agent.spawn = j as u32;
                            agent.parent = author;
                        }
                    }
                }
                EventType::Despawn => {
                    metrics.despawn_count += 1;
                    if let Some(child) = columns.to(row).map(|name| self.local(name)) {
                        let agent = &mut self.agents[child as usize];
                        agent.despawn_t = agent.despawn_t.max(t);
                    }
                }
                EventType::Message if !events.content_ref.is_null(row) => {
                    self.contents.push(events.content_ref.value(row));
                }
                EventType::SafetyEvent => self.stack.push(j as u32),
                EventType::ToolResult if events.trusted.is_valid(row) && !events.trusted.value(row) => {
                    self.stack.push(j as u32)
                }
                _ => {}
            }
            self.types.push(event_type);
            self.author.push(author);
        }
        if all_tokens > 0 {
            metrics.protocol_overhead = Some(protocol_tokens as f64 / all_tokens as f64);
        }
        if !self.contents.is_empty() {
            let messages = self.contents.len();
            self.contents.sort_unstable();
            self.contents.dedup();
            metrics.message_redundancy = Some(1.0 - self.contents.len() as f64 / messages as f64);
        }
        self.critical_path(columns, trace, &mut metrics);
        self.error_amplification(n, &mut metrics);
        self.finish(columns, start, n, &mut metrics);
        self.critical_steps(&earlier, n, &mut metrics);
        metrics.max_concurrent_agents = self.max_concurrent(columns, start);
        metrics
    }

    /// Builds the trace's adjacency, then walks it in topological order (Kahn), relaxing the
    /// longest path in events and in seconds on the way.
    fn critical_path(&mut self, columns: &Columns<'_>, trace: usize, metrics: &mut TraceMetrics) {
        let (start, n) = (columns.event_offsets[trace] as usize, metrics.n_events as usize);
        let (first, last) = (columns.edge_offsets[trace] as usize, columns.edge_offsets[trace + 1] as usize);
        let (src, dst) = (columns.edges.src.values(), columns.edges.dst.values());
        refill(&mut self.out_offsets, n + 1, 0);
        refill(&mut self.in_degree, n, 0);
        for edge in first..last {
            self.out_offsets[src[edge] as usize + 1] += 1;
            self.in_degree[dst[edge] as usize] += 1;
        }
        prefix_sums(&mut self.out_offsets);
        refill(&mut self.out_targets, last - first, 0);
        // `order` doubles as the fill cursor before it holds the topological order.
        self.order.clear();
        self.order.extend_from_slice(&self.out_offsets[..n]);
        for edge in first..last {
            let slot = &mut self.order[src[edge] as usize];
            self.out_targets[*slot as usize] = dst[edge] as u32;
            *slot += 1;
        }
        let durations = columns.events.duration_s;
        self.weights.clear();
        self.weights
            .extend((start..start + n).map(|row| if durations.is_null(row) { 1.0 } else { durations.value(row) }));
        self.seconds.clear();
        self.seconds.extend_from_slice(&self.weights);
        refill(&mut self.steps, n, 1);
        self.order.clear();
        self.order.extend((0..n as u32).filter(|&v| self.in_degree[v as usize] == 0));
        let mut head = 0;
        while head < self.order.len() {
            let event = self.order[head] as usize;
            head += 1;
            let (steps, seconds) = (self.steps[event] + 1, self.seconds[event]);
            for slot in self.out_offsets[event]..self.out_offsets[event + 1] {
                let next = self.out_targets[slot as usize] as usize;
                self.steps[next] = self.steps[next].max(steps);
                self.seconds[next] = self.seconds[next].max(seconds + self.weights[next]);
                self.in_degree[next] -= 1;
                if self.in_degree[next] == 0 {
                    self.order.push(next as u32);
                }
            }
        }
        metrics.critical_path_steps = self.steps.iter().copied().max().unwrap_or(0);
        metrics.critical_path_s = self.seconds.iter().copied().fold(0.0, f64::max);
        if metrics.critical_path_steps > 0 {
            metrics.parallelism_efficiency = n as f64 / metrics.critical_path_steps as f64;
        }
    }

    /// Events reachable from the sources in `stack`, each counted once.
    fn error_amplification(&mut self, n: usize, metrics: &mut TraceMetrics) {
        let sources = self.stack.len();
        if sources == 0 {
            return;
        }
        refill(&mut self.reached, n, false);
        let mut downstream = 0usize;
        while let Some(event) = self.stack.pop() {
            for slot in self.out_offsets[event as usize]..self.out_offsets[event as usize + 1] {
                let next = self.out_targets[slot as usize];
                if !self.reached[next as usize] {
                    self.reached[next as usize] = true;
                    downstream += 1;
                    self.stack.push(next);
                }
            }
        }
        metrics.error_amplification = Some(downstream as f64 / sources as f64);
    }

    /// Returns, finish rate, idle sub-agents and utilization.
    fn finish(&mut self, columns: &Columns<'_>, start: usize, n: usize, metrics: &mut TraceMetrics) {
        for j in 0..n as u32 {
            let author = self.author[j as usize];
            if self.types[j as usize] != EventType::Return || author == NONE {
                continue;
            }
            let parent = self.agents[author as usize].parent;
            if parent == NONE {
                continue;
            }
            let reaches_parent = match columns.to(start + j as usize) {
                Some(name) => self.lookup(name) == Some(parent),
                None => self.successors(j).iter().any(|&next| self.author[next as usize] == parent),
            };
            self.agents[author as usize].returned |= reaches_parent;
        }
        let (mut spawned, mut returned, mut steps, mut useful_steps) = (0u32, 0u32, 0u32, 0u32);
        for agent in self.agents.iter().filter(|agent| agent.parent != NONE) {
            spawned += 1;
            steps += agent.own_steps;
            if agent.returned {
                returned += 1;
                useful_steps += agent.own_steps;
            }
            metrics.idle_agents += (agent.own_steps == 0) as u32;
        }
        if spawned > 0 {
            metrics.finish_rate = Some(returned as f64 / spawned as f64);
        }
        if steps > 0 {
            metrics.utilization = Some(useful_steps as f64 / steps as f64);
        }
    }

    /// PARL's critical steps over the spawn tree, bottom-up; also its depth and branching.
    fn critical_steps(&mut self, earlier: &impl Fn(u32, u32) -> bool, n: usize, metrics: &mut TraceMetrics) {
        let n_agents = self.agents.len();
        // Each agent's own events, in time order.
        refill(&mut self.own_offsets, n_agents + 1, 0);
        for &author in self.author.iter().filter(|&&a| a != NONE) {
            self.own_offsets[author as usize + 1] += 1;
        }
        prefix_sums(&mut self.own_offsets);
        refill(&mut self.own_events, self.own_offsets[n_agents] as usize, 0);
        self.stage_steps.clear();
        self.stage_steps.extend_from_slice(&self.own_offsets[..n_agents]);
        for (event, &author) in self.author.iter().enumerate().filter(|(_, a)| **a != NONE) {
            let slot = &mut self.stage_steps[author as usize];
            self.own_events[*slot as usize] = event as u32;
            *slot += 1;
        }
        refill(&mut self.stage_of, n, 0);
        for agent in 0..n_agents {
            let own = &mut self.own_events[self.own_offsets[agent] as usize..self.own_offsets[agent + 1] as usize];
            own.sort_unstable_by(|&a, &b| if earlier(a, b) { Ordering::Less } else { Ordering::Greater });
            let mut stage = 0;
            for &event in own.iter() {
                self.stage_of[event as usize] = stage;
                stage += (self.types[event as usize] == EventType::Aggregate) as u32;
            }
        }
        // Children grouped by parent.
        refill(&mut self.child_offsets, n_agents + 1, 0);
        for agent in self.agents.iter().filter(|a| a.parent != NONE) {
            self.child_offsets[agent.parent as usize + 1] += 1;
        }
        metrics.spawn_branching = self.child_offsets.iter().copied().max().unwrap_or(0);
        prefix_sums(&mut self.child_offsets);
        refill(&mut self.children, self.child_offsets[n_agents] as usize, 0);
        self.stage_steps.clear();
        self.stage_steps.extend_from_slice(&self.child_offsets[..n_agents]);
        for (child, agent) in self.agents.iter().enumerate().filter(|(_, a)| a.parent != NONE) {
            let slot = &mut self.stage_steps[agent.parent as usize];
            self.children[*slot as usize] = child as u32;
            *slot += 1;
        }
        let Some(root) = self.orchestrator(earlier) else { return };
        // Breadth-first from the orchestrator; a spawn cycle cannot loop (levels mark visits).
        self.tree.clear();
        self.tree.push(root);
        self.agents[root as usize].level = 0;
        let mut head = 0;
        while head < self.tree.len() {
            let agent = self.tree[head] as usize;
            head += 1;
            for slot in self.child_offsets[agent]..self.child_offsets[agent + 1] {
                let child = self.children[slot as usize];
                if self.agents[child as usize].level == NONE {
                    self.agents[child as usize].level = self.agents[agent].level + 1;
                    self.tree.push(child);
                }
            }
        }
        for position in (0..self.tree.len()).rev() {
            let agent = self.tree[position] as usize;
            let own = &self.own_events[self.own_offsets[agent] as usize..self.own_offsets[agent + 1] as usize];
            let n_stages = own.last().map_or(1, |&last| self.stage_of[last as usize] as usize + 1);
            refill(&mut self.stage_steps, n_stages, 0);
            refill(&mut self.stage_best, n_stages, 0);
            for &event in own {
                self.stage_steps[self.stage_of[event as usize] as usize] += 1;
            }
            for slot in self.child_offsets[agent]..self.child_offsets[agent + 1] {
                let child = &self.agents[self.children[slot as usize] as usize];
                if child.level == self.agents[agent].level + 1 {
                    let stage = self.stage_of[child.spawn as usize] as usize;
                    self.stage_best[stage] = self.stage_best[stage].max(child.critical_steps);
                }
            }
            self.agents[agent].critical_steps =
                self.stage_steps.iter().sum::<u32>() + self.stage_best.iter().sum::<u32>();
            metrics.spawn_depth = metrics.spawn_depth.max(self.agents[agent].level);
        }
        metrics.critical_steps = self.agents[root as usize].critical_steps;
    }

    /// The author of the earliest event among agents nobody spawned (among all authors when
    /// every author was spawned, as in a spawn cycle).
    fn orchestrator(&self, earlier: &impl Fn(u32, u32) -> bool) -> Option<u32> {
        let first_event = |agent: usize| {
            let slot = self.own_offsets[agent] as usize;
            (slot < self.own_offsets[agent + 1] as usize).then(|| self.own_events[slot])
        };
        let mut best: Option<(u32, u32)> = None; // (agent, its first event)
        for agent in 0..self.agents.len() {
            let Some(first) = first_event(agent) else { continue };
            let spawned = self.agents[agent].parent != NONE;
            let better = best.is_none_or(|(current, current_first)| {
                let current_spawned = self.agents[current as usize].parent != NONE;
                if spawned != current_spawned { !spawned } else { earlier(first, current_first) }
            });
            if better {
                best = Some((agent as u32, first));
            }
        }
        best.map(|(agent, _)| agent)
    }

    /// The largest number of agent lifetimes that overlap at one instant.
    fn max_concurrent(&mut self, columns: &Columns<'_>, start: usize) -> u32 {
        self.sweep.clear();
        for agent in &self.agents {
            let spawn_t =
                if agent.spawn == NONE { f64::INFINITY } else { columns.events.t.value(start + agent.spawn as usize) };
            let (born, gone) = agent.lifetime(spawn_t);
            // At equal times births sort first: closed intervals touching at an instant overlap.
            self.sweep.push((born, 0));
            self.sweep.push((gone, 1));
        }
        self.sweep.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let (mut alive, mut most) = (0u32, 0u32);
        for &(_, kind) in &self.sweep {
            if kind == 0 {
                alive += 1;
                most = most.max(alive);
            } else {
                alive -= 1;
            }
        }
        most
    }
}
