//! A seeded generator of realistic synthetic orchestration traces.
//!
//! Each trace is one run of a centralised (depth 1) or hierarchical (depth > 1) system: the
//! orchestrator decides and spawns workers in stages, workers exchange messages and call tools,
//! return a summary (or never do), and every spawner aggregates what came back. Rewards follow
//! a hidden per-task difficulty and how much the workers delivered, so GRPO groups have
//! variance and credit has a known source.
//!
//! Every trace draws from its own RNG stream, derived from (seed, trace index), so traces are
//! generated in parallel and come out the same at any thread count.

use rand::RngExt;
use rand::seq::IndexedRandom;
use rand_xoshiro::Xoshiro256PlusPlus;
use rayon::prelude::*;

pub mod branches;

use crate::error::Result;
use crate::interrupt::Checkpoint;
use crate::trace::{Costs, Edge, EdgeType, Event, EventType, NamedNumbers, Topology, Trace};
use crate::{bail, ensure};

/// What to generate. Ranges are inclusive `(min, max)`.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub n_traces: usize,
    /// Sub-agents spawned per trace, over all levels (the orchestrator not counted).
    pub agents: (usize, usize),
    /// Maximum spawn-tree depth: 1 = the orchestrator spawns workers only; 2 = workers may
    /// spawn sub-workers; and so on.
    pub depth: usize,
    /// Children one spawner starts at once, in one stage.
    pub fan_out: (usize, usize),
    /// Work events (messages, tool calls and their results) per sub-agent.
    pub events_per_agent: (usize, usize),
    /// Traces per GRPO group; consecutive traces share task_id and group_id.
    pub group_size: usize,
    pub seed: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            n_traces: 8,
            agents: (2, 4),
            depth: 1,
            fan_out: (1, 4),
            events_per_agent: (2, 6),
            group_size: 4,
            seed: 0,
        }
    }
}

impl SimConfig {
    /// Rejects a configuration that cannot describe a run, naming the argument at fault.
    pub fn check(&self) -> Result<()> {
        check_range("agents", self.agents, 1)?;
        check_range("fan_out", self.fan_out, 1)?;
        check_range("events_per_agent", self.events_per_agent, 0)?;
        if self.depth == 0 {
            bail!("depth must be at least 1 (1 = the orchestrator spawns workers only), got 0");
        }
        if self.group_size == 0 {
            bail!("group_size must be at least 1, got 0");
        }
        self.check_size(1)
    }

    /// The most events one trace can hold: per sub-agent its work, its spawn, despawn and
    /// return, and the decision and aggregate of a stage it opens (a stage has a child at
    /// least); and one interjection of the safety monitor or a human.
    pub fn max_events_per_trace(&self) -> usize {
        self.agents.1.saturating_mul(self.events_per_agent.1.saturating_add(5)).saturating_add(8)
    }

    /// Refuses a configuration whose `copies` of each trace (itself and its branch rollouts)
    /// could hold more events than one batch (Arrow's 32-bit offsets): generating them would
    /// spend all memory (an abort) before any check could fail.
    pub fn check_size(&self, copies: usize) -> Result<()> {
        let most = self.max_events_per_trace().saturating_mul(copies).saturating_mul(self.n_traces);
        ensure!(
            most <= i32::MAX as usize,
            "n_traces={}, agents up to {} and events_per_agent up to {}{} can make {most} events, beyond the \
             2^31 - 1 one batch holds",
            self.n_traces,
            self.agents.1,
            self.events_per_agent.1,
            if copies > 1 { format!(" with {} rollouts a trace", copies - 1) } else { String::new() },
        );
        Ok(())
    }
}

fn check_range(name: &str, (low, high): (usize, usize), least: usize) -> Result<()> {
    ensure!(low <= high, "{name}: the range ({low}, {high}) is empty; its minimum must not exceed its maximum");
    ensure!(low >= least, "{name}: the minimum must be at least {least}, got {low}");
    Ok(())
}

/// Generates `config.n_traces` traces; the same configuration always gives the same traces.
pub fn generate(config: &SimConfig) -> Result<Vec<Trace>> {
    config.check()?;
    let checkpoint = Checkpoint::here();
    (0..config.n_traces)
        .into_par_iter()
        .map(|index| checkpoint.check().map(|()| TraceBuilder::new(config, index).build()))
        .collect()
}

const ROLES: &[&str] = &["researcher", "coder", "critic", "planner"];
const TOOLS: &[&str] = &["web.search", "web.fetch", "python.exec", "file.read", "file.write", "shell.run"];

// Domain tags keep the trace streams and the task streams of one seed apart.
const TRACE_STREAM: u64 = 0x7472_6163_6573;
const TASK_STREAM: u64 = 0x0074_6173_6b73;

/// One RNG stream per (seed, domain, index): independent of the order work items run in.
fn stream(seed: u64, domain: u64, index: usize) -> Xoshiro256PlusPlus {
    crate::rng::stream(seed ^ domain, index as u64)
}

/// Timestamps are whole milliseconds inside the generator, so "strictly later" is exact.
fn seconds(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Fate {
    Returns,
    /// Works but never returns (crashed, timed out, lost).
    Unfinished,
    /// Spawned and never does anything.
    Idle,
}

/// A node of the spawn tree; index 0 is the orchestrator.
struct Agent {
    name: String,
    role: &'static str,
    parent: usize,
    /// Which of the parent's stages spawned it.
    stage: usize,
    level: usize,
    fate: Fate,
    stages: Vec<Vec<usize>>,
    /// Its own events (the results of its tool calls are the tools'), in time order.
    events: Vec<usize>,
    /// The return event and the process reward it carries.
    returned: Option<(usize, f64)>,
    last_aggregate: Option<usize>,
}

impl Agent {
    /// An agent spawned by stage `stage` of `parent`, before it has done anything.
    fn new(name: String, role: &'static str, (parent, stage): (usize, usize), level: usize, fate: Fate) -> Self {
        Agent {
            name,
            role,
            parent,
            stage,
            level,
            fate,
            stages: Vec::new(),
            events: Vec::new(),
            returned: None,
            last_aggregate: None,
        }
    }
}

struct Timed {
    event: Event,
    start_ms: u64,
    end_ms: u64,
}

struct ToolUse {
    result: usize,
    caller: usize,
    success: f64,
}

/// Builds one trace: plan the spawn tree, play out its timeline, link what the timeline
/// implies, then sort by time and score.
struct TraceBuilder<'a> {
    config: &'a SimConfig,
    index: usize,
    rng: Xoshiro256PlusPlus,
    /// Hidden in [0, 1], shared by the traces of one task; harder tasks fail more.
    difficulty: f64,
    agents: Vec<Agent>,
    events: Vec<Timed>,
    edges: Vec<(usize, usize, EdgeType)>,
    tool_uses: Vec<ToolUse>,
    /// (message event, recipient agent).
    messages: Vec<(usize, usize)>,
    /// Message contents so far, so that some messages repeat one (redundant work).
    message_contents: Vec<String>,
}

impl<'a> TraceBuilder<'a> {
    fn new(config: &'a SimConfig, index: usize) -> Self {
        let group = index / config.group_size;
        TraceBuilder {
            config,
            index,
            rng: stream(config.seed, TRACE_STREAM, index),
            difficulty: stream(config.seed, TASK_STREAM, group).random::<f64>(),
            agents: Vec::new(),
            events: Vec::new(),
            edges: Vec::new(),
            tool_uses: Vec::new(),
            messages: Vec::new(),
            message_contents: Vec::new(),
        }
    }

    fn build(mut self) -> Trace {
        self.plan_agents();
        self.run_orchestrator();
        self.link_sequences();
        self.link_inputs();
        self.maybe_interrupt();
        self.finish()
    }

    fn range(&mut self, (low, high): (usize, usize)) -> usize {
        self.rng.random_range(low..=high)
    }

    fn hash(&mut self) -> String {
        format!("{:016x}", self.rng.random::<u64>())
    }

    // ---- the spawn tree ---------------------------------------------------------------------

    /// Spends the sub-agent budget stage by stage; each stage goes to the orchestrator or, when
    /// depth allows, to a worker that becomes a sub-orchestrator.
    fn plan_agents(&mut self) {
        self.agents.push(Agent::new("orchestrator".into(), "orchestrator", (0, 0), 0, Fate::Returns));
        let mut spawners = Vec::new();
        let mut remaining = self.range(self.config.agents);
        while remaining > 0 {
            let spawner = self.pick_spawner(&spawners);
            let count = self.range(self.config.fan_out).min(remaining);
            self.agents[spawner].stages.push(Vec::new());
            for _ in 0..count {
                let worker = self.add_worker(spawner);
                let agent = &self.agents[worker];
                if agent.level < self.config.depth && agent.fate != Fate::Idle {
                    spawners.push(worker);
                }
            }
            remaining -= count;
        }
    }

    fn pick_spawner(&mut self, spawners: &[usize]) -> usize {
        // Half the stages stay with the orchestrator, so the top level keeps most of the work.
        match spawners.choose(&mut self.rng) {
            Some(&worker) if self.rng.random_bool(0.5) => worker,
            _ => 0,
        }
    }

    /// Adds a child to the spawner's newest stage.
    fn add_worker(&mut self, spawner: usize) -> usize {
        let parent = &self.agents[spawner];
        let ordinal = parent.stages.iter().map(Vec::len).sum::<usize>() + 1;
        let name = if spawner == 0 { format!("worker_{ordinal}") } else { format!("{}.{ordinal}", parent.name) };
        let (stage, level) = (parent.stages.len() - 1, parent.level + 1);
        let role = *ROLES.choose(&mut self.rng).expect("ROLES is not empty");
        let fate = match self.rng.random::<f64>() {
            p if p < 0.05 => Fate::Idle,
            p if p < 0.15 => Fate::Unfinished,
            _ => Fate::Returns,
        };
        let worker = self.agents.len();
        self.agents.push(Agent::new(name, role, (spawner, stage), level, fate));
        self.agents[spawner].stages[stage].push(worker);
        worker
    }

    // ---- the timeline -----------------------------------------------------------------------

    fn push(&mut self, event: Event, start_ms: u64, duration_ms: u64) -> usize {
        self.events.push(Timed { event, start_ms, end_ms: start_ms + duration_ms });
        self.events.len() - 1
    }

    /// An LLM writes at roughly 25 to 100 tokens a second.
    fn writing_ms(&mut self, tokens: i64) -> u64 {
        (tokens as u64 * self.rng.random_range(10..=40)).max(1)
    }

    /// Appends an event of `agent`'s own, written in a token count drawn from `tokens`.
    fn emit(&mut self, agent: usize, event_type: EventType, start_ms: u64, tokens: (i64, i64)) -> usize {
        let tokens = self.rng.random_range(tokens.0..=tokens.1);
        let duration_ms = self.writing_ms(tokens);
        let mut event = Event::new(String::new(), 0.0, event_type, self.agents[agent].name.clone());
        event.role = Some(self.agents[agent].role.to_owned());
        event.content_ref = Some(self.hash());
        event.tokens = Some(tokens);
        let index = self.push(event, start_ms, duration_ms);
        self.agents[agent].events.push(index);
        index
    }

    /// When the author of `event` is ready for its next step.
    fn after(&mut self, event: usize) -> u64 {
        self.events[event].end_ms + self.rng.random_range(50..=1500)
    }

    fn run_orchestrator(&mut self) {
        let mut clock = 0;
        for stage in 0..self.agents[0].stages.len() {
            let decision = self.emit(0, EventType::OrchestratorDecision, clock, (200, 800));
            clock = self.after(decision);
            clock = self.run_stage(0, stage, clock, Some(decision));
        }
    }

    /// Spawns one stage of children, waits for all of them, despawns some of those that did
    /// not return, and aggregates; returns when the spawner is free again.
    fn run_stage(&mut self, spawner: usize, stage: usize, mut clock: u64, decision: Option<usize>) -> u64 {
        let children = self.agents[spawner].stages[stage].clone();
        let mut spawns = Vec::with_capacity(children.len());
        for &child in &children {
            let spawn = self.emit(spawner, EventType::Spawn, clock, (50, 250));
            // As in the seed example, a spawn names the child and the role it is given.
            let event = &mut self.events[spawn].event;
            event.to = Some(self.agents[child].name.clone());
            event.role = Some(self.agents[child].role.to_owned());
            if let Some(decision) = decision {
                self.edges.push((decision, spawn, EdgeType::Causal));
            }
            clock = self.events[spawn].end_ms + self.rng.random_range(10..=200);
            spawns.push(spawn);
        }
        let mut done = clock;
        for (&child, &spawn) in children.iter().zip(&spawns) {
            let start = self.events[spawn].end_ms + self.rng.random_range(100..=2000);
            done = done.max(self.run_worker(child, start));
            if let Some(&first) = self.agents[child].events.first() {
                self.edges.push((spawn, first, EdgeType::Spawn));
            }
        }
        clock = done + self.rng.random_range(50..=500);
        for &child in &children {
            if self.agents[child].returned.is_none() && self.rng.random_bool(0.5) {
                let despawn = self.emit(spawner, EventType::Despawn, clock, (5, 20));
                self.events[despawn].event.to = Some(self.agents[child].name.clone());
                clock = self.events[despawn].end_ms + self.rng.random_range(10..=200);
            }
        }
        self.aggregate(spawner, &children, clock)
    }

    /// Folds the children's returns, and the spawner's previous aggregate, into a new one.
    fn aggregate(&mut self, spawner: usize, children: &[usize], clock: u64) -> u64 {
        let aggregate = self.emit(spawner, EventType::Aggregate, clock, (200, 900));
        for &child in children {
            if let Some((returned, _)) = self.agents[child].returned {
                self.edges.push((returned, aggregate, EdgeType::Return));
            }
        }
        if let Some(previous) = self.agents[spawner].last_aggregate.replace(aggregate) {
            self.edges.push((previous, aggregate, EdgeType::Aggregate));
        }
        self.after(aggregate)
    }

    /// Plays out one sub-agent from `start`: work, its own stages if it has any, more work,
    /// then the return. Returns when it is done.
    fn run_worker(&mut self, worker: usize, start: u64) -> u64 {
        let fate = self.agents[worker].fate;
        if fate == Fate::Idle {
            return start;
        }
        let work = self.range(self.config.events_per_agent);
        let n_stages = self.agents[worker].stages.len();
        let before = if n_stages == 0 { work } else { self.rng.random_range(0..=work) };
        let mut clock = self.work(worker, before, start);
        for stage in 0..n_stages {
            clock = self.run_stage(worker, stage, clock, None);
        }
        clock = self.work(worker, work - before, clock);
        if fate == Fate::Returns {
            clock = self.return_to_parent(worker, clock);
        }
        clock
    }

    /// `count` work events; a tool call and its result count as two.
    fn work(&mut self, worker: usize, count: usize, mut clock: u64) -> u64 {
        let mut remaining = count;
        while remaining > 0 {
            if remaining >= 2 && self.rng.random_bool(0.5) {
                clock = self.call_tool(worker, clock);
                remaining -= 2;
            } else {
                clock = self.send_message(worker, clock);
                remaining -= 1;
            }
        }
        clock
    }

    fn call_tool(&mut self, caller: usize, clock: u64) -> u64 {
        let tool = *TOOLS.choose(&mut self.rng).expect("TOOLS is not empty");
        let call = self.emit(caller, EventType::ToolCall, clock, (20, 150));
        let event = &mut self.events[call].event;
        event.tool = Some(tool.to_owned());
        event.trusted = Some(true);

        let arrives = self.events[call].end_ms + self.rng.random_range(200..=8000);
        let success = if self.rng.random_bool(0.95 - 0.4 * self.difficulty) { 1.0 } else { 0.0 };
        // As in the seed example, the tool itself is the agent of its result.
        let mut result = Event::new(String::new(), 0.0, EventType::ToolResult, tool);
        result.tool = Some(tool.to_owned());
        result.content_ref = Some(self.hash());
        // Web pages are third-party text: the classic untrusted input.
        result.trusted = Some(!tool.starts_with("web."));
        result.reward = Some(vec![("tool".into(), success)]);
        result.tokens = Some(self.rng.random_range(50..=1500));
        let duration_ms = self.rng.random_range(5..=100);
        let result = self.push(result, arrives, duration_ms);
        self.edges.push((call, result, EdgeType::ToolDependency));
        self.tool_uses.push(ToolUse { result, caller, success });
        self.after(result)
    }

    fn send_message(&mut self, sender: usize, clock: u64) -> u64 {
        let recipient = self.pick_recipient(sender);
        let message = self.emit(sender, EventType::Message, clock, (80, 600));
        let content = match self.message_contents.choose(&mut self.rng) {
            Some(seen) if self.rng.random_bool(0.08) => seen.clone(),
            _ => {
                let fresh = self.hash();
                self.message_contents.push(fresh.clone());
                fresh
            }
        };
        let event = &mut self.events[message].event;
        event.from = Some(self.agents[sender].name.clone());
        event.to = Some(self.agents[recipient].name.clone());
        event.content_ref = Some(content);
        event.trusted = Some(true);
        self.messages.push((message, recipient));
        self.after(message)
    }

    /// Mostly the parent; sometimes a sibling of the same stage.
    fn pick_recipient(&mut self, sender: usize) -> usize {
        let Agent { parent, stage, .. } = self.agents[sender];
        let siblings = &self.agents[parent].stages[stage];
        match siblings.choose(&mut self.rng) {
            Some(&sibling) if sibling != sender && self.rng.random_bool(0.3) => sibling,
            _ => parent,
        }
    }

    fn return_to_parent(&mut self, worker: usize, clock: u64) -> u64 {
        let returned = self.emit(worker, EventType::Return, clock, (100, 500));
        let process = (0.9 - 0.4 * self.difficulty + self.rng.random_range(-0.2..=0.2)).clamp(0.0, 1.0);
        let parent = self.agents[worker].parent;
        let event = &mut self.events[returned].event;
        event.from = Some(self.agents[worker].name.clone());
        event.to = Some(self.agents[parent].name.clone());
        event.trusted = Some(true);
        event.reward = Some(vec![("process".into(), process)]);
        self.agents[worker].returned = Some((returned, process));
        self.after(returned)
    }

    // ---- edges the timeline implies ---------------------------------------------------------

    fn link_sequences(&mut self) {
        for agent in &self.agents {
            for pair in agent.events.windows(2) {
                // A decision links causally to every spawn it orders (run_stage) instead.
                if self.events[pair[0]].event.event_type != EventType::OrchestratorDecision {
                    self.edges.push((pair[0], pair[1], EdgeType::Temporal));
                }
            }
        }
    }

    /// A tool result feeds the caller's next step; a message feeds the recipient's.
    fn link_inputs(&mut self) {
        let results = self.tool_uses.iter().map(|used| (used.result, used.caller, EdgeType::Causal));
        let messages = self.messages.iter().map(|&(message, recipient)| (message, recipient, EdgeType::Message));
        let links: Vec<_> = results
            .chain(messages)
            .filter_map(|(input, reader, edge_type)| {
                let next = self.next_own_event(reader, self.events[input].end_ms)?;
                Some((input, next, edge_type))
            })
            .collect();
        self.edges.extend(links);
    }

    /// The agent's first own event that starts at or after `from_ms`.
    fn next_own_event(&self, agent: usize, from_ms: u64) -> Option<usize> {
        let own = &self.agents[agent].events;
        own.get(own.partition_point(|&event| self.events[event].start_ms < from_ms)).copied()
    }

    /// About one trace in 33 has a safety monitor flag or a human step in.
    fn maybe_interrupt(&mut self) {
        if !self.rng.random_bool(0.03) {
            return;
        }
        if self.rng.random_bool(0.5) { self.flag_unsafe() } else { self.human_steers() }
    }

    fn flag_unsafe(&mut self) {
        let inputs: Vec<usize> =
            self.tool_uses.iter().map(|used| used.result).chain(self.messages.iter().map(|&(m, _)| m)).collect();
        let Some(&flagged) = inputs.choose(&mut self.rng) else { return };
        let start = self.events[flagged].end_ms + self.rng.random_range(50..=500);
        let safety = self.interject("safety_monitor", "monitor", EventType::SafetyEvent, start, EdgeType::SafetyFlow);
        self.edges.push((flagged, safety, EdgeType::SafetyFlow));
    }

    fn human_steers(&mut self) {
        let timeline = &self.agents[0].events;
        let Some(&moment) = timeline[..timeline.len() - 1].choose(&mut self.rng) else { return };
        let start = self.events[moment].end_ms + self.rng.random_range(100..=3000);
        self.interject("human", "human", EventType::HumanIntervention, start, EdgeType::Causal);
    }

    /// Adds an event from outside the spawn tree, addressed to the orchestrator and feeding
    /// its next step.
    fn interject(
        &mut self,
        agent: &str,
        role: &str,
        event_type: EventType,
        start_ms: u64,
        edge_type: EdgeType,
    ) -> usize {
        let tokens = self.rng.random_range(10..=200);
        let mut event = Event::new(String::new(), 0.0, event_type, agent);
        event.role = Some(role.to_owned());
        event.to = Some(self.agents[0].name.clone());
        event.content_ref = Some(self.hash());
        event.tokens = Some(tokens);
        let duration_ms = self.writing_ms(tokens);
        let index = self.push(event, start_ms, duration_ms);
        if let Some(next) = self.next_own_event(0, self.events[index].end_ms) {
            self.edges.push((index, next, edge_type));
        }
        index
    }

    // ---- the trace ----------------------------------------------------------------------------

    /// Team reward from the difficulty and what the workers delivered (returns weighted by
    /// their process quality), plus noise so that a group's traces differ.
    fn rewards(&mut self) -> NamedNumbers {
        let workers = &self.agents[1..];
        let spawned = workers.len() as f64;
        let processes: Vec<f64> = workers.iter().filter_map(|w| w.returned.map(|(_, process)| process)).collect();
        let idle = workers.iter().filter(|w| w.fate == Fate::Idle).count() as f64;
        let finish_rate = processes.len() as f64 / spawned;
        let delivered = processes.iter().sum::<f64>() / spawned;
        let noise = self.rng.random_range(-0.2..=0.2);
        let team = (0.8 * delivered + 0.5 * (1.0 - self.difficulty) - 0.15 + noise).clamp(0.0, 1.0);
        let mut rewards =
            vec![("team".to_owned(), team), ("orchestration".to_owned(), finish_rate - 0.1 * idle / spawned)];
        if !self.tool_uses.is_empty() {
            let tool = self.tool_uses.iter().map(|used| used.success).sum::<f64>() / self.tool_uses.len() as f64;
            rewards.push(("tool".to_owned(), tool));
        }
        rewards
    }

    /// Orders the events by start time (creation order breaks ties), names them, and scores
    /// the trace. Every edge runs from an earlier to a strictly later start, so the graph is a
    /// DAG and edges point forward in the list.
    fn finish(mut self) -> Trace {
        let rewards = self.rewards();
        let mut timed: Vec<(usize, Timed)> = self.events.into_iter().enumerate().collect();
        timed.sort_by_key(|(_, timed)| timed.start_ms);
        let mut position = vec![0u32; timed.len()];
        let mut events = Vec::with_capacity(timed.len());
        let mut wall_clock_ms = 0;
        for (at, (created, timed)) in timed.into_iter().enumerate() {
            position[created] = at as u32;
            wall_clock_ms = wall_clock_ms.max(timed.end_ms);
            let mut event = timed.event;
            event.id = format!("e{at}");
            event.t = seconds(timed.start_ms);
            event.duration_s = Some(seconds(timed.end_ms - timed.start_ms));
            events.push(event);
        }
        let mut edges: Vec<Edge> = self
            .edges
            .iter()
            .map(|&(src, dst, edge_type)| Edge { src: position[src], dst: position[dst], edge_type })
            .collect();
        edges.sort_by_key(|edge| (edge.src, edge.dst, edge.edge_type));

        let count = |event_type| events.iter().filter(|e| e.event_type == event_type).count() as f64;
        let costs = Costs {
            tokens: events.iter().filter_map(|e| e.tokens).sum::<i64>() as f64,
            wall_clock_s: seconds(wall_clock_ms),
            tool_calls: Some(count(EventType::ToolCall)),
            messages: Some(count(EventType::Message)),
            other: Vec::new(),
        };
        let success = if rewards[0].1 > 0.5 { 1.0 } else { 0.0 };
        let config = self.config;
        let task_id = format!("task-{}-{:05}", config.seed, self.index / config.group_size);
        Trace {
            trace_id: format!("sim-{}-{:06}", config.seed, self.index),
            group_id: None, // the group is the task: GRPO rollouts of one prompt
            task_id,
            system: Some("masreplay.sim".into()),
            topology: Some(if config.depth == 1 { Topology::Centralized } else { Topology::Hierarchical }),
            policy_version: Some(0),
            counterfactual_of: None,
            events,
            edges,
            rewards,
            costs,
            metrics: Some(vec![("task_success".into(), success)]),
            attributes: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use super::*;
    use crate::validate::trace_from_json;

    fn config(n_traces: usize, seed: u64) -> SimConfig {
        SimConfig { n_traces, seed, ..SimConfig::default() }
    }

    fn kimi_scale() -> SimConfig {
        SimConfig {
            n_traces: 1,
            agents: (300, 300),
            fan_out: (20, 100),
            events_per_agent: (10, 14),
            ..SimConfig::default()
        }
    }

    fn reward(numbers: &Option<NamedNumbers>, channel: &str) -> Option<f64> {
        numbers.as_ref()?.iter().find(|(key, _)| key == channel).map(|&(_, value)| value)
    }

    #[test]
    fn same_seed_gives_the_same_traces() {
        assert_eq!(generate(&config(16, 7)).unwrap(), generate(&config(16, 7)).unwrap());
    }

    #[test]
    fn different_seeds_give_different_traces() {
        let (a, b) = (generate(&config(4, 1)).unwrap(), generate(&config(4, 2)).unwrap());
        assert!(a.iter().zip(&b).all(|(a, b)| a.events != b.events));
    }

    #[test]
    fn thread_count_does_not_change_the_traces() {
        let run = |threads| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| generate(&SimConfig { depth: 3, ..config(32, 5) }).unwrap())
        };
        assert_eq!(run(1), run(4));
    }

    #[test]
    fn consecutive_traces_form_groups() {
        let traces = generate(&SimConfig { group_size: 3, ..config(10, 9) }).unwrap();
        for (index, trace) in traces.iter().enumerate() {
            assert_eq!(trace.trace_id, format!("sim-9-{index:06}"));
            assert_eq!(trace.task_id, format!("task-9-{:05}", index / 3));
            assert_eq!(trace.group_id(), trace.task_id);
        }
        let groups: HashSet<&str> = traces.iter().map(Trace::group_id).collect();
        assert_eq!(groups.len(), 4);
    }

    #[test]
    fn groups_have_reward_variance() {
        let traces = generate(&SimConfig { group_size: 8, ..config(64, 3) }).unwrap();
        let varied = traces.chunks(8).filter(|group| group.iter().any(|t| t.rewards[0].1 != group[0].rewards[0].1));
        assert_eq!(varied.count(), 8);
    }

    #[test]
    fn every_trace_survives_validation_unchanged() {
        let configs = [
            config(64, 0),
            SimConfig { depth: 3, agents: (5, 30), events_per_agent: (0, 8), ..config(64, 1) },
            SimConfig { agents: (1, 1), fan_out: (1, 1), events_per_agent: (0, 0), ..config(16, 2) },
            kimi_scale(),
        ];
        for config in configs {
            for trace in generate(&config).unwrap() {
                let parsed = trace_from_json(&trace.to_json(false), Default::default());
                assert_eq!(parsed.as_ref(), Ok(&trace), "{}", trace.trace_id);
            }
        }
    }

    #[test]
    fn edges_run_forward_in_time_between_the_right_events() {
        let traces = generate(&SimConfig { depth: 2, agents: (4, 12), ..config(64, 4) }).unwrap();
        for trace in &traces {
            for edge in &trace.edges {
                let (src, dst) = (&trace.events[edge.src as usize], &trace.events[edge.dst as usize]);
                assert!(edge.src < edge.dst && src.t < dst.t, "{edge:?} in {}", trace.trace_id);
                let expected = match edge.edge_type {
                    EdgeType::Spawn => Some((EventType::Spawn, None)),
                    EdgeType::ToolDependency => Some((EventType::ToolCall, Some(EventType::ToolResult))),
                    EdgeType::Return => Some((EventType::Return, Some(EventType::Aggregate))),
                    EdgeType::Aggregate => Some((EventType::Aggregate, Some(EventType::Aggregate))),
                    EdgeType::Message => Some((EventType::Message, None)),
                    _ => None,
                };
                if let Some((src_type, dst_type)) = expected {
                    assert_eq!(src.event_type, src_type);
                    assert!(dst_type.is_none_or(|t| t == dst.event_type));
                }
            }
        }
    }

    #[test]
    fn rewards_and_costs_are_consistent() {
        for trace in generate(&SimConfig { depth: 2, ..config(64, 6) }).unwrap() {
            let team = trace.rewards[0].1;
            assert_eq!(trace.rewards[0].0, "team");
            assert!((0.0..=1.0).contains(&team));
            assert_eq!(reward(&trace.metrics, "task_success"), Some(if team > 0.5 { 1.0 } else { 0.0 }));
            let tokens: i64 = trace.events.iter().map(|e| e.tokens.unwrap()).sum();
            assert_eq!(trace.costs.tokens, tokens as f64);
            let end = trace.events.iter().map(|e| e.t + e.duration_s.unwrap()).fold(0.0, f64::max);
            assert!((trace.costs.wall_clock_s - end).abs() < 1e-9);
            for event in &trace.events {
                match event.event_type {
                    EventType::ToolResult => assert!(matches!(reward(&event.reward, "tool"), Some(0.0 | 1.0))),
                    EventType::Return => {
                        assert!(reward(&event.reward, "process").is_some_and(|p| (0.0..=1.0).contains(&p)))
                    }
                    _ => assert!(event.reward.is_none()),
                }
            }
        }
    }

    #[test]
    fn rare_interruptions_feed_the_orchestrator() {
        let traces = generate(&config(400, 11)).unwrap();
        for kind in [EventType::SafetyEvent, EventType::HumanIntervention] {
            let found: Vec<(&Trace, usize)> = traces
                .iter()
                .flat_map(|t| {
                    t.events.iter().enumerate().filter(|(_, e)| e.event_type == kind).map(move |(i, _)| (t, i))
                })
                .collect();
            assert!(!found.is_empty() && found.len() < 20, "{} {kind:?} events", found.len());
            for (trace, index) in found {
                let feeds = trace.edges.iter().filter(|e| e.src as usize == index);
                assert!(feeds.map(|e| &trace.events[e.dst as usize].agent).all(|agent| agent == "orchestrator"));
            }
        }
    }

    #[test]
    fn kimi_scale_trace_spawns_three_hundred_agents() {
        let trace = generate(&kimi_scale()).unwrap().remove(0);
        let spawned: HashSet<&str> =
            trace.events.iter().filter(|e| e.event_type == EventType::Spawn).filter_map(|e| e.to.as_deref()).collect();
        assert_eq!(spawned.len(), 300);
        assert!(trace.events.len() >= 3000, "{} events", trace.events.len());
        assert_eq!(trace.topology, Some(Topology::Centralized));
    }

    #[test]
    fn kimi_scale_trace_models_unfinished_agents_and_redundant_messages() {
        let trace = generate(&kimi_scale()).unwrap().remove(0);
        let returns = trace.events.iter().filter(|e| e.event_type == EventType::Return).count();
        assert!((200..300).contains(&returns), "{returns} of 300 returned");
        let mut contents: HashMap<&str, usize> = HashMap::new();
        for event in trace.events.iter().filter(|e| e.event_type == EventType::Message) {
            *contents.entry(event.content_ref.as_deref().unwrap()).or_default() += 1;
        }
        assert!(contents.values().any(|&n| n > 1));
    }

    #[test]
    fn deeper_trees_nest_spawns_within_the_depth() {
        let traces = generate(&SimConfig { depth: 3, agents: (10, 20), ..config(16, 8) }).unwrap();
        let spawns = traces.iter().flat_map(|t| &t.events).filter(|e| e.event_type == EventType::Spawn);
        let nested: Vec<&Event> = spawns.filter(|e| e.agent != "orchestrator").collect();
        assert!(!nested.is_empty());
        for spawn in nested {
            let child = spawn.to.as_deref().unwrap();
            assert_eq!(child.rsplit_once('.').map(|(parent, _)| parent), Some(spawn.agent.as_str()));
            assert!(child.matches('.').count() <= 2, "{child} is deeper than 3");
        }
        assert!(traces.iter().all(|t| t.topology == Some(Topology::Hierarchical)));
    }

    #[test]
    fn bad_configs_are_rejected_by_name() {
        let cases = [
            (SimConfig { agents: (4, 2), ..SimConfig::default() }, "agents"),
            (SimConfig { agents: (0, 2), ..SimConfig::default() }, "agents"),
            (SimConfig { fan_out: (0, 3), ..SimConfig::default() }, "fan_out"),
            (SimConfig { events_per_agent: (5, 1), ..SimConfig::default() }, "events_per_agent"),
            (SimConfig { depth: 0, ..SimConfig::default() }, "depth"),
            (SimConfig { group_size: 0, ..SimConfig::default() }, "group_size"),
        ];
        for (config, name) in cases {
            let error = generate(&config).unwrap_err().to_string();
            assert!(error.starts_with(name), "{error:?} should name {name}");
        }
        assert_eq!(generate(&SimConfig { n_traces: 0, ..SimConfig::default() }).unwrap(), Vec::new());
    }
}
