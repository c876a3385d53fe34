//! The trace model: the seed orchestration-trace schema plus masreplay's optional additions.
//!
//! Ids are strings here (as users write them); edges already point at events by local index,
//! which is what the columnar layout stores.

use serde_json::{Map, Value, json};

use crate::names::named_enum;

/// The masreplay schema version written into every file and non-strict export.
pub const SCHEMA_VERSION: i64 = 1;

named_enum!(
    /// The ten event types of the seed schema.
    EventType as "event type" {
        OrchestratorDecision = "orchestrator_decision", Spawn = "spawn", Despawn = "despawn",
        Message = "message", ToolCall = "tool_call", ToolResult = "tool_result",
        Return = "return", Aggregate = "aggregate", HumanIntervention = "human_intervention",
        SafetyEvent = "safety_event",
    }
);

named_enum!(
    /// The eight edge types of the seed schema.
    EdgeType as "edge type" {
        Temporal = "temporal", Causal = "causal", Spawn = "spawn", Message = "message",
        ToolDependency = "tool_dependency", Return = "return", Aggregate = "aggregate", SafetyFlow = "safety_flow",
    }
);

named_enum!(
    /// The topology enum of the seed schema.
    Topology as "topology" {
        Centralized = "centralized", PlannerExecutorCritic = "planner_executor_critic", Debate = "debate",
        Swarm = "swarm", Hierarchical = "hierarchical", Harness = "harness", Mixed = "mixed", Unknown = "unknown",
    }
);

named_enum!(
    /// What a branch rollout changed relative to its factual trace.
    CounterfactualKind as "counterfactual kind" {
        Substitute = "substitute", Ablate = "ablate", NoSpawn = "no_spawn",
    }
);

named_enum!(
    /// What a count counts: whole traces, or their events (a buffer's capacity, the rows of
    /// the advantage statistics).
    Unit as "unit" {
        Traces = "traces", Events = "events",
    }
);

/// A map of named numbers (reward channels, costs, metrics), in the order the user wrote them.
pub type NamedNumbers = Vec<(String, f64)>;

#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub id: String,
    pub t: f64,
    pub event_type: EventType,
    pub agent: String,
    pub role: Option<String>,
    pub from: Option<String>,
    pub to: Option<String>,
    pub tool: Option<String>,
    pub content_ref: Option<String>,
    pub trusted: Option<bool>,
    /// Per-event reward channels (process, tool, verifier signals).
    pub reward: Option<NamedNumbers>,
    pub tokens: Option<i64>,
    pub duration_s: Option<f64>,
    /// Behaviour-policy log-probability of the decision this event records.
    pub logprob: Option<f64>,
    /// Every other key of the event, kept verbatim.
    pub attributes: Option<Map<String, Value>>,
}

impl Event {
    /// A minimal event; the optional fields start empty.
    pub fn new(id: impl Into<String>, t: f64, event_type: EventType, agent: impl Into<String>) -> Self {
        Event {
            id: id.into(),
            t,
            event_type,
            agent: agent.into(),
            role: None,
            from: None,
            to: None,
            tool: None,
            content_ref: None,
            trusted: None,
            reward: None,
            tokens: None,
            duration_s: None,
            logprob: None,
            attributes: None,
        }
    }
}

/// An edge between two events of the same trace, by their local index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Edge {
    pub src: u32,
    pub dst: u32,
    pub edge_type: EdgeType,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Costs {
    pub tokens: f64,
    pub wall_clock_s: f64,
    pub tool_calls: Option<f64>,
    pub messages: Option<f64>,
    /// Further cost keys (the seed schema allows any number-valued key).
    pub other: NamedNumbers,
}

#[derive(Clone, Debug, PartialEq)]
pub struct CounterfactualOf {
    pub trace_id: String,
    pub event_id: String,
    pub kind: CounterfactualKind,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    pub trace_id: String,
    pub task_id: String,
    /// The GRPO group; `None` means "same as task_id" (a group equal to the task is stored as `None`).
    pub group_id: Option<String>,
    pub system: Option<String>,
    pub topology: Option<Topology>,
    pub policy_version: Option<i64>,
    pub counterfactual_of: Option<CounterfactualOf>,
    pub events: Vec<Event>,
    pub edges: Vec<Edge>,
    pub rewards: NamedNumbers,
    pub costs: Costs,
    pub metrics: Option<NamedNumbers>,
    /// Unknown top-level keys (accepted outside strict-seed mode), kept verbatim.
    pub attributes: Option<Map<String, Value>>,
}

impl Trace {
    pub fn group_id(&self) -> &str {
        self.group_id.as_deref().unwrap_or(&self.task_id)
    }

    /// The trace as JSON. `strict_seed` drops everything the seed schema forbids at the top
    /// level (masreplay's additions and unknown keys); events keep their extra keys, which the
    /// seed schema allows.
    pub fn to_json(&self, strict_seed: bool) -> Value {
        let mut out = Map::new();
        if !strict_seed {
            out.insert("schema_version".into(), json!(SCHEMA_VERSION));
        }
        out.insert("trace_id".into(), json!(self.trace_id));
        out.insert("task_id".into(), json!(self.task_id));
        if let Some(system) = &self.system {
            out.insert("system".into(), json!(system));
        }
        if let Some(topology) = self.topology {
            out.insert("topology".into(), json!(topology.as_str()));
        }
        if !strict_seed {
            out.insert("group_id".into(), json!(self.group_id()));
            if let Some(version) = self.policy_version {
                out.insert("policy_version".into(), json!(version));
            }
            if let Some(cf) = &self.counterfactual_of {
                out.insert(
                    "counterfactual_of".into(),
                    json!({"trace_id": cf.trace_id, "event_id": cf.event_id, "kind": cf.kind.as_str()}),
                );
            }
        }
        let events: Vec<Value> = self.events.iter().map(event_to_json).collect();
        out.insert("events".into(), Value::Array(events));
        let edges: Vec<Value> = self
            .edges
            .iter()
            .map(|edge| {
                json!({
                    "src": self.events[edge.src as usize].id,
                    "dst": self.events[edge.dst as usize].id,
                    "type": edge.edge_type.as_str(),
                })
            })
            .collect();
        out.insert("edges".into(), Value::Array(edges));
        out.insert("rewards".into(), named_numbers_to_json(&self.rewards));
        let mut costs = Map::new();
        costs.insert("tokens".into(), number(self.costs.tokens));
        costs.insert("wall_clock_s".into(), number(self.costs.wall_clock_s));
        if let Some(v) = self.costs.tool_calls {
            costs.insert("tool_calls".into(), number(v));
        }
        if let Some(v) = self.costs.messages {
            costs.insert("messages".into(), number(v));
        }
        for (key, v) in &self.costs.other {
            costs.insert(key.clone(), number(*v));
        }
        out.insert("costs".into(), Value::Object(costs));
        if let Some(metrics) = &self.metrics {
            out.insert("metrics".into(), named_numbers_to_json(metrics));
        }
        if !strict_seed && let Some(attributes) = &self.attributes {
            for (key, value) in attributes {
                out.insert(key.clone(), value.clone());
            }
        }
        Value::Object(out)
    }
}

fn event_to_json(event: &Event) -> Value {
    let mut out = Map::new();
    out.insert("id".into(), json!(event.id));
    out.insert("t".into(), number(event.t));
    out.insert("type".into(), json!(event.event_type.as_str()));
    out.insert("agent".into(), json!(event.agent));
    let optional_strings = [
        ("role", &event.role),
        ("from", &event.from),
        ("to", &event.to),
        ("tool", &event.tool),
        ("content_ref", &event.content_ref),
    ];
    for (key, value) in optional_strings {
        if let Some(text) = value {
            out.insert(key.into(), json!(text));
        }
    }
    if let Some(trusted) = event.trusted {
        out.insert("trusted".into(), json!(trusted));
    }
    if let Some(reward) = &event.reward {
        out.insert("reward".into(), named_numbers_to_json(reward));
    }
    if let Some(tokens) = event.tokens {
        out.insert("tokens".into(), json!(tokens));
    }
    for (key, value) in [("duration_s", event.duration_s), ("logprob", event.logprob)] {
        if let Some(v) = value {
            out.insert(key.into(), number(v));
        }
    }
    if let Some(attributes) = &event.attributes {
        for (key, value) in attributes {
            out.insert(key.clone(), value.clone());
        }
    }
    Value::Object(out)
}

fn named_numbers_to_json(numbers: &NamedNumbers) -> Value {
    Value::Object(numbers.iter().map(|(k, v)| (k.clone(), number(*v))).collect())
}

/// Whole numbers go out as JSON integers so that `0` stays `0` through a round trip.
fn number(value: f64) -> Value {
    if value.fract() == 0.0 && value.abs() < 9.0e15 { json!(value as i64) } else { json!(value) }
}
