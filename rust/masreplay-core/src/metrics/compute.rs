//! The metrics of one trace, computed in one pass over its events in time order (here), one
//! over its edges (`edges`) and a few over its agents (`spawn_tree`, `lifetimes`). Buffers
//! live in a per-thread [`Scratch`] reused from trace to trace, so the bulk pass allocates
//! almost nothing per trace.

use std::hash::BuildHasher;

use arrow_array::Array;
use foldhash::fast::FixedState;

use super::{Columns, Role, TraceMetrics};
use crate::trace::EventType;

mod edges;
mod lifetimes;
mod spawn_tree;

const NONE: u32 = u32::MAX;

/// What the metrics need to know of one agent of the trace.
#[derive(Clone, Copy)]
struct Agent {
    own_steps: u32,
    first_t: f64,
    /// End of its last event (`t + duration_s`).
    end_t: f64,
    /// Time-order position of its first event whose role is orchestrator, or NONE.
    orchestrator_event: u32,
    /// Time-order position of its first event that makes it a candidate orchestrator in a
    /// trace without that role (see [`super::TraceMetrics`]), or NONE.
    candidate_event: u32,
    /// Its current stage while the events are walked in time order: the aggregates it
    /// authored so far. After the walk, its number of stages minus one.
    stage: u32,
    /// Local index of the author of its earliest spawn, or NONE.
    parent: u32,
    /// Time of that spawn (infinite when never spawned).
    spawn_t: f64,
    /// The parent's stage at that spawn.
    spawn_stage: u32,
    /// Sub-agents whose earliest spawn it authored.
    n_children: u32,
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
            orchestrator_event: NONE,
            candidate_event: NONE,
            stage: 0,
            parent: NONE,
            spawn_t: f64::INFINITY,
            spawn_stage: 0,
            n_children: 0,
            despawn_t: f64::NEG_INFINITY,
            returned: false,
            critical_steps: 0,
            level: NONE,
        }
    }

    fn lifetime(&self) -> (f64, f64) {
        let start = self.first_t.min(self.spawn_t);
        (start, self.end_t.max(self.despawn_t).max(start))
    }
}

/// An event's state in the pass over the edges.
#[derive(Clone, Copy)]
struct Node {
    /// Its weight in seconds: `duration_s`, else 1.
    weight: f64,
    /// The longest path ending at it, in seconds and in events.
    seconds: f64,
    steps: u32,
    /// SOURCE (a safety event or an untrusted tool result) and/or DOWNSTREAM (of a source).
    error_flags: u8,
}

impl Node {
    fn new(weight: f64) -> Self {
        Node { weight, seconds: weight, steps: 1, error_flags: 0 }
    }
}

/// Per-thread buffers; every vector is cleared, not freed, between traces.
pub(super) struct Scratch {
    /// Agent number -> local index, valid where `stamp` equals `generation`.
    local_of: Vec<u32>,
    stamp: Vec<u32>,
    generation: u32,
    agents: Vec<Agent>,
    /// The trace's events (local indices) by (t, id).
    by_time: Vec<u32>,
    /// Event -> local index of its author (NONE for tool results).
    author: Vec<u32>,
    nodes: Vec<Node>,
    n_error_sources: u32,
    returns: Vec<u32>,
    /// The messages' content_refs as (hash, row).
    contents: Vec<(u64, usize)>,
    /// Successors of each event (CSR), built only for the traces whose metrics need them.
    has_adjacency: bool,
    out_offsets: Vec<u32>,
    out_targets: Vec<u32>,
    in_degree: Vec<u32>,
    order: Vec<u32>,
    child_offsets: Vec<u32>,
    children: Vec<u32>,
    tree: Vec<u32>,
    /// Each agent's first slot in `stage_best`, one slot per stage.
    stage_base: Vec<u32>,
    /// Per stage of an agent, the largest critical steps among the sub-agents it spawned then.
    stage_best: Vec<u32>,
    /// The agents' births and deaths, times as [`lifetimes::total_order_key`]s.
    births: Vec<i64>,
    deaths: Vec<i64>,
}

/// Flags of [`Node::error_flags`].
const SOURCE: u8 = 1;
const DOWNSTREAM: u8 = 2;

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

impl Scratch {
    pub(super) fn new(n_agent_names: usize) -> Self {
        Scratch {
            local_of: vec![0; n_agent_names],
            stamp: vec![0; n_agent_names],
            generation: 0,
            agents: Vec::new(),
            by_time: Vec::new(),
            author: Vec::new(),
            nodes: Vec::new(),
            n_error_sources: 0,
            returns: Vec::new(),
            contents: Vec::new(),
            has_adjacency: false,
            out_offsets: Vec::new(),
            out_targets: Vec::new(),
            in_degree: Vec::new(),
            order: Vec::new(),
            child_offsets: Vec::new(),
            children: Vec::new(),
            tree: Vec::new(),
            stage_base: Vec::new(),
            stage_best: Vec::new(),
            births: Vec::new(),
            deaths: Vec::new(),
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

    fn start_trace(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.stamp.fill(0);
            self.generation = 1;
        }
        self.agents.clear();
        self.author.clear();
        self.nodes.clear();
        self.n_error_sources = 0;
        self.returns.clear();
        self.contents.clear();
        self.has_adjacency = false;
    }

    pub(super) fn measure(&mut self, columns: &Columns<'_>, trace: usize) -> TraceMetrics {
        let start = columns.event_offsets[trace] as usize;
        let n = columns.event_offsets[trace + 1] as usize - start;
        self.start_trace();
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
        self.sort_by_time(columns, start, n);
        self.walk_events(columns, start, n, &mut metrics);
        if !self.contents.is_empty() {
            let distinct = self.distinct_contents(columns);
            metrics.message_redundancy = Some(1.0 - distinct as f64 / self.contents.len() as f64);
        }
        self.walk_edges(columns, trace, &mut metrics);
        self.finish(columns, trace, &mut metrics);
        self.critical_steps(&mut metrics);
        metrics.max_concurrent_agents = self.max_concurrent();
        metrics
    }

    /// `by_time`: the events by (t, id); rows already in that order (the usual case) are
    /// only checked, not sorted, and ids only compared where times tie.
    fn sort_by_time(&mut self, columns: &Columns<'_>, start: usize, n: usize) {
        self.by_time.clear();
        self.by_time.extend(0..n as u32);
        let earlier = |a: u32, b: u32| columns.time_order(start + a as usize, start + b as usize);
        let times_increase = columns.t[start..start + n].windows(2).all(|pair| pair[0] < pair[1]);
        if !times_increase && !(1..n as u32).all(|j| earlier(j - 1, j).is_lt()) {
            self.by_time.sort_unstable_by(|&a, &b| earlier(a, b));
        }
    }

    /// The one pass over the events, in time order: steps, lifetimes, stages and spawns of
    /// the agents, counts and tokens; returns, error sources and message contents are set
    /// aside for the passes that need the whole trace, and the events' weights and error
    /// sources for the pass over the edges.
    fn walk_events(&mut self, columns: &Columns<'_>, start: usize, n: usize, metrics: &mut TraceMetrics) {
        let (mut all_tokens, mut protocol_tokens) = (0i64, 0i64);
        let events = &columns.events;
        self.author.resize(n, NONE);
        self.nodes.resize(n, Node::new(1.0));
        for position in 0..n {
            let j = self.by_time[position] as usize;
            let row = start + j;
            let event_type = columns.event_type(row);
            let t = columns.t[row];
            let duration = columns.duration_s(row);
            if let Some(duration) = duration {
                self.nodes[j] = Node::new(duration);
            }
            let tokens = columns.tokens(row);
            all_tokens += tokens;
            let inter_agent = match event_type {
                EventType::Spawn | EventType::Despawn => true,
                EventType::Message => columns.to(row).is_some_and(|to| to != columns.agent(row)),
                _ => false,
            };
            if inter_agent {
                protocol_tokens += tokens;
            }
            let author = if event_type == EventType::ToolResult {
                NONE
            } else {
                let local = self.local(columns.agent(row));
                let agent = &mut self.agents[local as usize];
                agent.own_steps += 1;
                agent.first_t = agent.first_t.min(t);
                agent.end_t = agent.end_t.max(t + duration.unwrap_or(0.0));
                let role = columns.role(row);
                if role == Role::Orchestrator && event_type != EventType::Spawn && agent.orchestrator_event == NONE {
                    agent.orchestrator_event = position as u32;
                }
                let candidate = role != Role::NotAnAgent
                    && !matches!(event_type, EventType::HumanIntervention | EventType::SafetyEvent);
                if candidate && agent.candidate_event == NONE {
                    agent.candidate_event = position as u32;
                }
                local
            };
            self.author[j] = author;
            match event_type {
                EventType::Spawn => {
                    metrics.spawn_count += 1;
                    // Events come in time order, so the first spawn seen is the earliest.
                    if let Some(child) = columns.to(row).map(|name| self.local(name)).filter(|&c| c != author) {
                        let stage = self.agents[author as usize].stage;
                        let agent = &mut self.agents[child as usize];
                        if agent.parent == NONE {
                            agent.parent = author;
                            agent.spawn_t = t;
                            agent.spawn_stage = stage;
                            self.agents[author as usize].n_children += 1;
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
                EventType::Message if events.content_ref.is_valid(row) => {
                    self.contents.push((FixedState::default().hash_one(events.content_ref.value(row)), row));
                }
                EventType::Return => self.returns.push(j as u32),
                EventType::Aggregate => self.agents[author as usize].stage += 1,
                EventType::SafetyEvent => self.mark_error_source(j),
                EventType::ToolResult if events.trusted.is_valid(row) && !events.trusted.value(row) => {
                    self.mark_error_source(j)
                }
                _ => {}
            }
        }
        if all_tokens > 0 {
            metrics.protocol_overhead = Some(protocol_tokens as f64 / all_tokens as f64);
        }
    }

    /// How many distinct content_refs the messages carry. Equal texts hash alike, so only
    /// within a run of equal hashes are the texts themselves compared.
    fn distinct_contents(&mut self, columns: &Columns<'_>) -> usize {
        let text = |row: usize| columns.events.content_ref.value(row);
        self.contents.sort_unstable_by_key(|&(hash, _)| hash);
        self.contents
            .chunk_by_mut(|a, b| a.0 == b.0)
            .map(|run| {
                if run.len() > 1 {
                    run.sort_unstable_by_key(|&(_, row)| text(row));
                }
                1 + run.windows(2).filter(|pair| text(pair[0].1) != text(pair[1].1)).count()
            })
            .sum()
    }

    fn mark_error_source(&mut self, event: usize) {
        self.nodes[event].error_flags |= SOURCE;
        self.n_error_sources += 1;
    }

    /// Returns, finish rate, idle sub-agents and utilization.
    fn finish(&mut self, columns: &Columns<'_>, trace: usize, metrics: &mut TraceMetrics) {
        let start = columns.event_offsets[trace] as usize;
        for position in 0..self.returns.len() {
            let event = self.returns[position];
            let author = self.author[event as usize];
            let parent = self.agents[author as usize].parent;
            if parent == NONE {
                continue;
            }
            let reaches_parent = match columns.to(start + event as usize) {
                Some(name) => self.lookup(name) == Some(parent),
                None => {
                    self.adjacency(columns, trace);
                    self.successors(event).iter().any(|&next| self.author[next as usize] == parent)
                }
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
}
