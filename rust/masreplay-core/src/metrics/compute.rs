//! The metrics of one trace, computed in one pass over its events in time order (here), one
//! over its edges (`edges`) and a few over its agents (`spawn_tree`, `lifetimes`). Buffers
//! live in a per-thread [`Scratch`] reused from trace to trace, so the bulk pass allocates
//! almost nothing per trace.

use std::hash::BuildHasher;

use foldhash::fast::FixedState;

use super::TraceMetrics;
use crate::trace::EventType;
use crate::trace_view::{BatchView, NONE, TraceAgents};

mod edges;
mod lifetimes;
mod spawn_tree;

/// What the metrics need to know of one agent of the trace, beside what [`TraceAgents`]
/// knows (its parent, its children, its place in the spawn tree); kept in its record there.
#[derive(Clone, Copy)]
struct Agent {
    own_steps: u32,
    first_t: f64,
    /// End of its last event (`t + duration_s`).
    end_t: f64,
    /// Its current stage while the events are walked in time order: the aggregates it
    /// authored so far. After the walk, its number of stages minus one.
    stage: u32,
    /// Time of its earliest spawn (infinite when never spawned).
    spawn_t: f64,
    /// The parent's stage at that spawn.
    spawn_stage: u32,
    despawn_t: f64,
    returned: bool,
    critical_steps: u32,
}

impl Default for Agent {
    fn default() -> Self {
        Agent {
            own_steps: 0,
            first_t: f64::INFINITY,
            end_t: f64::NEG_INFINITY,
            stage: 0,
            spawn_t: f64::INFINITY,
            spawn_stage: 0,
            despawn_t: f64::NEG_INFINITY,
            returned: false,
            critical_steps: 0,
        }
    }
}

impl Agent {
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
#[derive(Default)]
pub(super) struct Scratch {
    /// The trace's agents by local index, each with the metrics' own figures.
    table: TraceAgents<Agent>,
    /// The trace's events (local indices) by (t, id), sorted through `time_keys`.
    by_time: Vec<u32>,
    time_keys: Vec<u64>,
    /// Event -> its place in `by_time`, filled only where the edges need it.
    position: Vec<u32>,
    /// Event -> local index of its author (NONE for tool results).
    author: Vec<u32>,
    nodes: Vec<Node>,
    n_error_sources: u32,
    returns: Vec<u32>,
    /// The messages' content_refs as (hash, row).
    contents: Vec<(u64, usize)>,
    /// An open-addressing set of distinct content_refs: indices into `contents`, or NONE.
    content_slots: Vec<u32>,
    /// Successors of each event (CSR), built only for the traces whose metrics need them.
    has_adjacency: bool,
    out_offsets: Vec<u32>,
    out_targets: Vec<u32>,
    in_degree: Vec<u32>,
    order: Vec<u32>,
    /// Fill cursors of the counting sorts (successor lists, `edges_by_time`).
    cursor: Vec<u32>,
    /// The edges as (source, target), by the time order of their sources.
    edges_by_time: Vec<(u32, u32)>,
    /// Each agent's first slot in `stage_best`, one slot per stage.
    stage_base: Vec<u32>,
    /// Per stage of an agent, the largest critical steps among the sub-agents it spawned then.
    stage_best: Vec<u32>,
    /// The agents' births and deaths, times as [`crate::trace_view::total_order_key`]s.
    births: Vec<u64>,
    deaths: Vec<u64>,
}

/// Flags of [`Node::error_flags`].
const SOURCE: u8 = 1;
const DOWNSTREAM: u8 = 2;

/// Marks `node` a source of errors (a safety event, an untrusted tool result).
fn mark_error_source(node: &mut Node, n_error_sources: &mut u32) {
    node.error_flags |= SOURCE;
    *n_error_sources += 1;
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

impl Scratch {
    pub(super) fn new(n_agent_names: usize) -> Self {
        Scratch { table: TraceAgents::new(n_agent_names), ..Scratch::default() }
    }

    fn start_trace(&mut self) {
        self.table.clear();
        self.author.clear();
        self.nodes.clear();
        self.n_error_sources = 0;
        self.returns.clear();
        self.contents.clear();
        self.has_adjacency = false;
    }

    pub(super) fn measure(&mut self, view: &BatchView<'_>, trace: usize) -> TraceMetrics {
        let n = view.events_of(trace).len();
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
        // The next trace's rows arrive while this one is measured.
        if trace + 1 < view.n_traces() {
            view.prefetch_events(trace + 1);
        }
        view.time_order_into(trace, &mut self.by_time, &mut self.time_keys);
        self.walk_events(view, trace, &mut metrics);
        if !self.contents.is_empty() {
            let distinct = self.distinct_contents(view);
            metrics.message_redundancy = Some(1.0 - distinct as f64 / self.contents.len() as f64);
        }
        self.walk_edges(view, trace, &mut metrics);
        self.finish(view, trace, &mut metrics);
        self.critical_steps(&mut metrics);
        metrics.max_concurrent_agents = self.max_concurrent();
        metrics
    }

    /// The one pass over the events, in time order: steps, lifetimes, stages and spawns of
    /// the agents, counts and tokens; returns, error sources and message contents are set
    /// aside for the passes that need the whole trace, and the events' weights and error
    /// sources for the pass over the edges.
    fn walk_events(&mut self, view: &BatchView<'_>, trace: usize, metrics: &mut TraceMetrics) {
        let (mut all_tokens, mut protocol_tokens) = (0i64, 0i64);
        let range = view.events_of(trace);
        let (start, n) = (range.start, range.len());
        self.author.resize(n, NONE);
        self.nodes.resize(n, Node::new(1.0));
        // The buffers as slices bound once: stores through them then leave the vectors'
        // own fields in registers.
        let Scratch { table, by_time, author: authors, nodes, returns, contents, n_error_sources, .. } = self;
        let (authors, nodes) = (&mut authors[..n], &mut nodes[..n]);
        for (position, &j) in by_time[..n].iter().enumerate() {
            let j = j as usize;
            let e = start + j;
            let seen = table.see(view, e, j as u32, position as u32);
            let t = view.t(e);
            let duration = view.duration_s(e);
            if let Some(duration) = duration {
                nodes[j] = Node::new(duration);
            }
            let tokens = view.tokens(e).unwrap_or(0);
            all_tokens += tokens;
            let inter_agent = match seen.event_type {
                EventType::Spawn | EventType::Despawn => true,
                EventType::Message => view.to(e).is_some_and(|to| to != view.agent(e)),
                _ => false,
            };
            if inter_agent {
                protocol_tokens += tokens;
            }
            let author = seen.author;
            if author != NONE {
                let agent = &mut table.agents[author as usize].data;
                agent.own_steps += 1;
                agent.first_t = agent.first_t.min(t);
                agent.end_t = agent.end_t.max(t + duration.unwrap_or(0.0));
            }
            authors[j] = author;
            match seen.event_type {
                EventType::Spawn => {
                    metrics.spawn_count += 1;
                    if let Some(child) = seen.spawned {
                        let stage = table.agents[author as usize].data.stage;
                        let agent = &mut table.agents[child as usize].data;
                        agent.spawn_t = t;
                        agent.spawn_stage = stage;
                    }
                }
                EventType::Despawn => {
                    metrics.despawn_count += 1;
                    if let Some(child) = seen.despawned {
                        let agent = &mut table.agents[child as usize].data;
                        agent.despawn_t = agent.despawn_t.max(t);
                    }
                }
                EventType::Message => {
                    if let Some(text) = view.content_ref(e) {
                        contents.push((FixedState::default().hash_one(text), e));
                    }
                }
                EventType::Return => returns.push(j as u32),
                EventType::Aggregate => table.agents[author as usize].data.stage += 1,
                EventType::SafetyEvent => mark_error_source(&mut nodes[j], n_error_sources),
                EventType::ToolResult if view.untrusted(e) => mark_error_source(&mut nodes[j], n_error_sources),
                _ => {}
            }
        }
        if all_tokens > 0 {
            metrics.protocol_overhead = Some(protocol_tokens as f64 / all_tokens as f64);
        }
    }

    /// How many distinct content_refs the messages carry: each is looked up in a hash set
    /// (at most half full) of the distinct ones so far, its text compared only with those
    /// of equal hash. A few dozen lookups beat sorting the hashes, whose insertion sort
    /// moves half the slice per message.
    fn distinct_contents(&mut self, view: &BatchView<'_>) -> usize {
        let text = |e: usize| view.events.content_ref.value(view.column_row(e));
        let mask = (2 * self.contents.len()).next_power_of_two() - 1;
        refill(&mut self.content_slots, mask + 1, NONE);
        let slots = &mut self.content_slots[..];
        let mut distinct = 0;
        for (index, &(hash, row)) in self.contents.iter().enumerate() {
            let mut slot = hash as usize & mask;
            loop {
                let held = slots[slot];
                if held == NONE {
                    slots[slot] = index as u32;
                    distinct += 1;
                    break;
                }
                let (held_hash, held_row) = self.contents[held as usize];
                if held_hash == hash && text(held_row) == text(row) {
                    break;
                }
                slot = (slot + 1) & mask;
            }
        }
        distinct
    }

    /// Returns, finish rate, idle sub-agents and utilization.
    fn finish(&mut self, view: &BatchView<'_>, trace: usize, metrics: &mut TraceMetrics) {
        let start = view.events_of(trace).start;
        for position in 0..self.returns.len() {
            let event = self.returns[position];
            let author = self.author[event as usize];
            let parent = self.table.agents[author as usize].parent;
            if parent == NONE {
                continue;
            }
            let reaches_parent = match view.to(start + event as usize) {
                Some(name) => self.table.lookup(name) == Some(parent),
                None => {
                    self.adjacency(view, trace);
                    self.successors(event).iter().any(|&next| self.author[next as usize] == parent)
                }
            };
            self.table.agents[author as usize].data.returned |= reaches_parent;
        }
        let (mut spawned, mut returned, mut steps, mut useful_steps) = (0u32, 0u32, 0u32, 0u32);
        for agent in self.table.agents.iter().filter(|entry| entry.parent != NONE).map(|entry| &entry.data) {
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
