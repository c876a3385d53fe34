//! The agents of one trace: who authored what, who spawned whom, the spawn tree and the
//! orchestrator. Conventions, shared by every estimator:
//! - a tool_result's `agent` names the tool, so tool results have no author here;
//! - a *sub-agent* is an agent named by the `to` of a spawn event other than its author; its
//!   *parent* is the author of its earliest spawn in time order ((t, id));
//! - the *orchestrator* is read from the events' `role` (see [`super::Role`]): the author of
//!   the earliest event whose role is `orchestrator` or `lead` (a spawn's `role` is not read:
//!   the seed schema's example gives it the spawned agent's role); in a trace without such a
//!   role, the author of the earliest event that an agent could have decided (not a
//!   human_intervention or safety_event, not by a `human`, `user`, `harness`, `monitor` or
//!   `tool` role) among agents nobody spawned (among every such author when all were spawned,
//!   as in a spawn cycle). A human is never the orchestrator.
//!
//! [`TraceAgents`] is filled by offering it the events in time order ([`TraceAgents::see`]),
//! so a caller walking the events for its own reasons (the metrics) fills it on the way.

use super::{BatchView, NONE, Role};
use crate::stamped::StampedIndex;
use crate::trace::EventType;

/// What one event says about its author being the orchestrator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claim {
    /// Its role says orchestrator (and it is not a spawn).
    pub orchestrator: bool,
    /// An agent could have decided it: a candidate in a trace without an orchestrator role.
    pub candidate: bool,
}

impl Claim {
    /// What an event of `event_type` by an author in `role` claims.
    #[inline]
    pub fn of(role: Role, event_type: EventType) -> Claim {
        Claim {
            orchestrator: role == Role::Orchestrator && event_type != EventType::Spawn,
            candidate: role != Role::NotAnAgent
                && !matches!(event_type, EventType::HumanIntervention | EventType::SafetyEvent),
        }
    }
}

impl BatchView<'_> {
    /// What event `e` says about its author being the orchestrator.
    #[inline]
    pub fn claim(&self, e: usize) -> Claim {
        Claim::of(self.role(e), self.event_type(e))
    }

    /// The agent number spawn event `e` brings in: its `to`, unless that is its author.
    #[inline]
    pub fn spawned_agent(&self, e: usize) -> Option<u32> {
        self.to(e).filter(|&child| child != self.agent(e))
    }
}

/// What [`TraceAgents::see`] read in one event (agents by local index).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    pub event_type: EventType,
    /// Its author; [`NONE`] for a tool_result.
    pub author: u32,
    /// For a spawn that is its sub-agent's earliest: the sub-agent.
    pub spawned: Option<u32>,
    /// For a despawn: the agent it addresses.
    pub despawned: Option<u32>,
}

/// One agent of a trace, by local index, with what a caller keeps for it (`data`: the
/// metrics keep their own figures there, so one agent's record is one piece of memory).
#[derive(Clone, Copy, Debug)]
pub struct TraceAgent<X = ()> {
    /// Its agent number in the view.
    pub agent: u32,
    /// Local index of its parent, or [`NONE`].
    pub parent: u32,
    /// Local event index of its earliest spawn, or [`NONE`].
    pub spawn_event: u32,
    /// Sub-agents whose earliest spawn it authored.
    pub n_children: u32,
    /// Time-order position of its first event claiming orchestrator, or [`NONE`].
    orchestrator_event: u32,
    /// Time-order position of its first candidate event, or [`NONE`].
    candidate_event: u32,
    pub data: X,
}

/// The agents of one trace, numbered locally in order of first sight; the tables are kept
/// from trace to trace (cleared, not freed), so a thread reuses one for all its traces.
pub struct TraceAgents<X = ()> {
    /// Agent number -> local index.
    local_of: StampedIndex,
    /// The agents by local index.
    pub agents: Vec<TraceAgent<X>>,
    child_offsets: Vec<u32>,
    children: Vec<u32>,
    /// The spawn tree in breadth-first order from its root, after [`Self::spawn_tree`].
    pub tree: Vec<u32>,
    /// Each agent's level in the spawn tree below its root; [`NONE`] when not reached.
    pub level: Vec<u32>,
}

/// Tables for a view without agents; [`TraceAgents::new`] makes them for a view.
impl<X: Copy + Default> Default for TraceAgents<X> {
    fn default() -> Self {
        TraceAgents::new(0)
    }
}

impl<X: Copy + Default> TraceAgents<X> {
    /// Tables for the traces of a view with `n_agent_names` agent numbers.
    pub fn new(n_agent_names: usize) -> Self {
        TraceAgents {
            local_of: StampedIndex::new(n_agent_names),
            agents: Vec::new(),
            child_offsets: Vec::new(),
            children: Vec::new(),
            tree: Vec::new(),
            level: Vec::new(),
        }
    }

    /// Forgets the previous trace.
    pub fn clear(&mut self) {
        self.local_of.clear();
        self.agents.clear();
        self.tree.clear();
        self.level.clear();
    }

    pub fn len(&self) -> usize {
        self.agents.len()
    }

    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }

    /// The local index of agent number `agent`, if seen.
    #[inline]
    pub fn lookup(&self, agent: u32) -> Option<u32> {
        self.local_of.get(agent)
    }

    /// The local index of agent number `agent`, registering it on first sight.
    #[inline]
    pub fn local(&mut self, agent: u32) -> u32 {
        if let Some(local) = self.lookup(agent) {
            return local;
        }
        let local = self.agents.len() as u32;
        self.local_of.insert(agent, local);
        self.agents.push(TraceAgent {
            agent,
            parent: NONE,
            spawn_event: NONE,
            n_children: 0,
            orchestrator_event: NONE,
            candidate_event: NONE,
            data: X::default(),
        });
        local
    }

    /// Reads event `e` (batch position; local index `j` in its trace), the `position`-th of
    /// its trace in time order. Events must come in time order: the first spawn of an agent
    /// offered is its earliest.
    #[inline]
    pub fn see(&mut self, view: &BatchView, e: usize, j: u32, position: u32) -> Seen {
        let event_type = view.event_type(e);
        let mut seen = Seen { event_type, author: NONE, spawned: None, despawned: None };
        if event_type == EventType::ToolResult {
            return seen;
        }
        let author = self.local(view.agent(e));
        seen.author = author;
        let claim = Claim::of(view.role(e), event_type);
        let this = &mut self.agents[author as usize];
        if claim.orchestrator && this.orchestrator_event == NONE {
            this.orchestrator_event = position;
        }
        if claim.candidate && this.candidate_event == NONE {
            this.candidate_event = position;
        }
        match event_type {
            EventType::Spawn => {
                if let Some(child) = view.spawned_agent(e).map(|agent| self.local(agent))
                    && self.agents[child as usize].parent == NONE
                {
                    let sub_agent = &mut self.agents[child as usize];
                    sub_agent.parent = author;
                    sub_agent.spawn_event = j;
                    self.agents[author as usize].n_children += 1;
                    seen.spawned = Some(child);
                }
            }
            EventType::Despawn => seen.despawned = view.to(e).map(|agent| self.local(agent)),
            _ => {}
        }
        seen
    }

    /// Clears the tables and reads every event of `trace`; `order` is its time order.
    pub fn read(&mut self, view: &BatchView, trace: usize, order: &[u32]) {
        self.clear();
        let start = view.events_of(trace).start;
        for (position, &j) in order.iter().enumerate() {
            self.see(view, start + j as usize, j, position as u32);
        }
    }

    /// The orchestrator's local index (see the module's conventions); None when no agent
    /// qualifies (a trace of human and safety events only).
    pub fn orchestrator(&self) -> Option<u32> {
        let agents = || (0..self.len() as u32).map(|local| (local, &self.agents[local as usize]));
        agents()
            .filter(|(_, agent)| agent.orchestrator_event != NONE)
            .min_by_key(|(_, agent)| agent.orchestrator_event)
            .or_else(|| {
                agents()
                    .filter(|(_, agent)| agent.candidate_event != NONE)
                    .min_by_key(|(_, agent)| (agent.parent != NONE, agent.candidate_event))
            })
            .map(|(local, _)| local)
    }

    /// The spawn tree below `root`: `tree` lists the agents reached, breadth-first (each
    /// after its parent), and `level` their levels. A spawn cycle cannot loop (levels mark
    /// visits).
    pub fn spawn_tree(&mut self, root: u32) {
        let n = self.len();
        self.child_offsets.clear();
        self.child_offsets.resize(n + 1, 0);
        for agent in self.agents.iter().filter(|agent| agent.parent != NONE) {
            self.child_offsets[agent.parent as usize + 1] += 1;
        }
        for i in 1..=n {
            self.child_offsets[i] += self.child_offsets[i - 1];
        }
        self.children.clear();
        self.children.resize(self.child_offsets[n] as usize, 0);
        // `level` serves as the fill cursor before it holds the levels.
        self.level.clear();
        self.level.extend_from_slice(&self.child_offsets[..n]);
        for (child, agent) in self.agents.iter().enumerate().filter(|(_, agent)| agent.parent != NONE) {
            let slot = &mut self.level[agent.parent as usize];
            self.children[*slot as usize] = child as u32;
            *slot += 1;
        }
        self.level.fill(NONE);
        self.tree.clear();
        self.tree.push(root);
        self.level[root as usize] = 0;
        let mut head = 0;
        while let Some(&agent) = self.tree.get(head) {
            head += 1;
            let (agent, below) = (agent as usize, self.level[agent as usize] + 1);
            let children = self.child_offsets[agent] as usize..self.child_offsets[agent + 1] as usize;
            for &child in &self.children[children] {
                if self.level[child as usize] == NONE {
                    self.level[child as usize] = below;
                    self.tree.push(child);
                }
            }
        }
    }
}
