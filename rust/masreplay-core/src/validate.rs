//! Every check of the data contract, with typed errors that name the trace, a JSON pointer and
//! the reason. JSON documents are checked while they are turned into [`Trace`]s; the columnar
//! ingest in `store` reuses the value rules and graph check defined here.

use std::collections::HashMap;

use rayon::prelude::*;
use serde_json::{Map, Value};

use crate::error::ValidationError;
use crate::graph;
use crate::trace::{
    Costs, CounterfactualKind, CounterfactualOf, Edge, EdgeType, Event, EventType, NamedNumbers, Topology, Trace,
};

#[derive(Clone, Copy, Debug, Default)]
pub struct ValidateOptions {
    /// Accept exactly the seed schema: masreplay's top-level additions and unknown top-level
    /// keys are errors instead of being kept.
    pub strict_seed: bool,
}

const TOP_LEVEL_SEED_KEYS: &[&str] =
    &["trace_id", "task_id", "system", "topology", "events", "edges", "rewards", "costs", "metrics"];
const TOP_LEVEL_MASREPLAY_KEYS: &[&str] = &["schema_version", "group_id", "policy_version", "counterfactual_of"];
const EVENT_KEYS: &[&str] = &[
    "id",
    "t",
    "type",
    "agent",
    "role",
    "from",
    "to",
    "tool",
    "content_ref",
    "trusted",
    "reward",
    "tokens",
    "duration_s",
    "logprob",
];

// ---- value rules shared by the JSON and the columnar paths -------------------------------

pub(crate) fn check_finite(value: f64) -> Result<(), String> {
    if value.is_finite() { Ok(()) } else { Err(format!("{value} is not a finite number")) }
}

pub(crate) fn check_non_negative(value: f64) -> Result<(), String> {
    check_finite(value)?;
    if value < 0.0 { Err(format!("{value} is negative; it must be >= 0")) } else { Ok(()) }
}

pub(crate) fn check_logprob(value: f64) -> Result<(), String> {
    check_finite(value)?;
    if value > 0.0 { Err(format!("log-probability {value} is positive")) } else { Ok(()) }
}

pub(crate) fn check_non_empty(text: &str) -> Result<(), String> {
    if text.is_empty() { Err("must be a non-empty string".into()) } else { Ok(()) }
}

pub(crate) fn check_schema_version(version: i64) -> Result<(), String> {
    if (1..=crate::trace::SCHEMA_VERSION).contains(&version) {
        Ok(())
    } else {
        Err(format!(
            "unsupported schema_version {version}; this masreplay reads versions 1..={}",
            crate::trace::SCHEMA_VERSION
        ))
    }
}

/// Escapes one key for use as a JSON-pointer segment (RFC 6901).
pub fn pointer_segment(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Checks the edge list of one trace as a graph: endpoints in range, no self-loops, no cycles.
/// `edges` are (src, dst) local event indices; errors point into `/edges/{k}`.
pub fn check_graph(
    trace_id: Option<&str>,
    event_ids: &dyn Fn(usize) -> String,
    n_events: usize,
    edges: &[(u32, u32)],
) -> Result<(), ValidationError> {
    for (k, &(src, dst)) in edges.iter().enumerate() {
        for (name, end) in [("src", src), ("dst", dst)] {
            if end as usize >= n_events {
                return Err(ValidationError::new(
                    trace_id,
                    format!("/edges/{k}/{name}"),
                    format!("event index {end} is out of range for a trace of {n_events} events"),
                ));
            }
        }
        if src == dst {
            return Err(ValidationError::new(
                trace_id,
                format!("/edges/{k}"),
                format!("self-loop on event {:?}", event_ids(src as usize)),
            ));
        }
    }
    if let Err(cycle) = graph::Csr::from_edges(n_events, edges).topological_order() {
        let names: Vec<String> = cycle.events.iter().map(|&e| format!("{:?}", event_ids(e as usize))).collect();
        return Err(ValidationError::new(
            trace_id,
            format!("/edges/{}", cycle.edge_index),
            format!("edges form a cycle: {} -> {}", names.join(" -> "), names[0]),
        ));
    }
    Ok(())
}

// ---- JSON documents ------------------------------------------------------------------------

/// Parses JSON text holding one trace, an array of traces, or JSON Lines / concatenated
/// traces. Each trace is checked on its own (in parallel); a syntax error ends a document,
/// but in JSON Lines it only costs its own line.
pub fn parse_documents(bytes: &[u8], options: ValidateOptions) -> Vec<Result<Trace, ValidationError>> {
    if let Some(lines) = json_lines(bytes) {
        return lines
            .par_iter()
            .map(|&(number, line)| match serde_json::from_slice::<Value>(line) {
                Ok(value) => trace_from_json(&value, options),
                Err(error) => {
                    let mut error = syntax_error(line, &error);
                    error.reason = format!("line {number}: {}", error.reason);
                    Err(error)
                }
            })
            .collect();
    }
    let mut results = Vec::new();
    let mut stream = serde_json::Deserializer::from_slice(bytes).into_iter::<Value>();
    loop {
        match stream.next() {
            None => break,
            Some(Ok(Value::Array(items))) => {
                results.par_extend(items.par_iter().map(|item| trace_from_json(item, options)));
            }
            Some(Ok(value)) => results.push(trace_from_json(&value, options)),
            Some(Err(error)) => {
                results.push(Err(syntax_error(bytes, &error)));
                break;
            }
        }
    }
    if results.is_empty() {
        results.push(Err(ValidationError::new(None, "", "the input holds no trace (empty document)")));
    }
    results
}

/// The numbered non-blank lines of `bytes`, when it is JSON Lines: more than one line, and the
/// first one a complete JSON object by itself (a pretty-printed document's first line is not).
fn json_lines(bytes: &[u8]) -> Option<Vec<(usize, &[u8])>> {
    let lines: Vec<(usize, &[u8])> = bytes
        .split(|&byte| byte == b'\n')
        .enumerate()
        .filter(|(_, line)| !line.trim_ascii().is_empty())
        .map(|(i, line)| (i + 1, line))
        .collect();
    let first = lines.first()?.1;
    let one_object = matches!(serde_json::from_slice::<Value>(first), Ok(Value::Object(_)));
    (lines.len() > 1 && one_object).then_some(lines)
}

fn syntax_error(bytes: &[u8], error: &serde_json::Error) -> ValidationError {
    let hint = if error.classify() == serde_json::error::Category::Syntax && std::str::from_utf8(bytes).is_err() {
        "the input is not valid UTF-8"
    } else {
        "invalid JSON (NaN and Infinity are not JSON numbers)"
    };
    ValidationError::new(None, "", format!("{hint}: {error}"))
}

/// Checks one JSON value against the data contract and builds the trace.
pub fn trace_from_json(value: &Value, options: ValidateOptions) -> Result<Trace, ValidationError> {
    let Value::Object(object) = value else {
        return Err(ValidationError::new(None, "", format!("a trace must be a JSON object, got {}", type_name(value))));
    };
    let trace_id = object.get("trace_id").and_then(Value::as_str).filter(|s| !s.is_empty());
    let reader = Reader { trace_id };
    reader.trace(object, options)
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

struct Reader<'a> {
    trace_id: Option<&'a str>,
}

type Checked<T> = Result<T, ValidationError>;

impl Reader<'_> {
    fn fail<T>(&self, path: &str, reason: impl Into<String>) -> Checked<T> {
        Err(ValidationError::new(self.trace_id, path, reason))
    }

    fn rule<T>(&self, path: &str, outcome: Result<T, String>) -> Checked<T> {
        outcome.or_else(|reason| self.fail(path, reason))
    }

    fn required<'v>(&self, object: &'v Map<String, Value>, key: &str, path: &str) -> Checked<&'v Value> {
        match object.get(key) {
            Some(value) => Ok(value),
            None => self.fail(path, format!("missing required field {key:?}")),
        }
    }

    fn string<'v>(&self, value: &'v Value, path: &str) -> Checked<&'v str> {
        match value {
            Value::String(text) => Ok(text),
            other => self.fail(path, format!("expected a string, got {}", type_name(other))),
        }
    }

    fn non_empty_string(&self, value: &Value, path: &str) -> Checked<String> {
        let text = self.string(value, path)?;
        self.rule(path, check_non_empty(text))?;
        Ok(text.to_owned())
    }

    fn optional_string(&self, object: &Map<String, Value>, key: &str, path: &str) -> Checked<Option<String>> {
        object.get(key).map(|value| self.string(value, &format!("{path}/{key}")).map(str::to_owned)).transpose()
    }

    fn number(&self, value: &Value, path: &str) -> Checked<f64> {
        match value.as_f64() {
            Some(number) if value.is_number() => {
                self.rule(path, check_finite(number))?;
                Ok(number)
            }
            _ => self.fail(path, format!("expected a number, got {}", type_name(value))),
        }
    }

    fn integer(&self, value: &Value, path: &str) -> Checked<i64> {
        let whole = value
            .as_i64()
            .or_else(|| value.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15).map(|f| f as i64));
        match whole {
            Some(n) => Ok(n),
            None => self.fail(path, format!("expected an integer, got {}", describe(value))),
        }
    }

    fn enumerated<E>(&self, value: &Value, path: &str, parse: fn(&str) -> Option<E>, expected: String) -> Checked<E> {
        let text = self.string(value, path)?;
        match parse(text) {
            Some(parsed) => Ok(parsed),
            None => self.fail(path, format!("unknown value {text:?}; expected one of {expected}")),
        }
    }

    fn object<'v>(&self, value: &'v Value, path: &str) -> Checked<&'v Map<String, Value>> {
        match value {
            Value::Object(object) => Ok(object),
            other => self.fail(path, format!("expected an object, got {}", type_name(other))),
        }
    }

    fn named_numbers(&self, value: &Value, path: &str, non_negative: bool) -> Checked<NamedNumbers> {
        let object = self.object(value, path)?;
        let mut numbers = Vec::with_capacity(object.len());
        for (key, item) in object {
            let item_path = format!("{path}/{}", pointer_segment(key));
            let number = self.number(item, &item_path)?;
            if non_negative {
                self.rule(&item_path, check_non_negative(number))?;
            }
            numbers.push((key.clone(), number));
        }
        Ok(numbers)
    }

    fn trace(&self, object: &Map<String, Value>, options: ValidateOptions) -> Checked<Trace> {
        let mut attributes = Map::new();
        for (key, value) in object {
            let known_seed = TOP_LEVEL_SEED_KEYS.contains(&key.as_str());
            let known_ours = TOP_LEVEL_MASREPLAY_KEYS.contains(&key.as_str());
            if options.strict_seed && !known_seed {
                return self.fail(
                    &format!("/{}", pointer_segment(key)),
                    format!("unknown top-level key {key:?}: the seed schema allows no additional properties"),
                );
            }
            if !known_seed && !known_ours {
                attributes.insert(key.clone(), value.clone());
            }
        }
        if let Some(version) = object.get("schema_version") {
            let version = self.integer(version, "/schema_version")?;
            self.rule("/schema_version", check_schema_version(version))?;
        }
        let trace_id = self.non_empty_string(self.required(object, "trace_id", "/trace_id")?, "/trace_id")?;
        let task_id = self.non_empty_string(self.required(object, "task_id", "/task_id")?, "/task_id")?;
        let group_id = object
            .get("group_id")
            .map(|v| self.non_empty_string(v, "/group_id"))
            .transpose()?
            .filter(|group| *group != task_id); // None already means "the task is the group"
        let system = self.optional_string(object, "system", "")?;
        let topology = object
            .get("topology")
            .map(|v| self.enumerated(v, "/topology", Topology::parse, Topology::expected()))
            .transpose()?;
        let policy_version = object
            .get("policy_version")
            .map(|v| {
                let version = self.integer(v, "/policy_version")?;
                self.rule("/policy_version", check_non_negative(version as f64))?;
                Ok(version)
            })
            .transpose()?;
        let counterfactual_of = object.get("counterfactual_of").map(|v| self.counterfactual_of(v)).transpose()?;

        let events_value = self.required(object, "events", "/events")?;
        let Value::Array(event_values) = events_value else {
            return self.fail("/events", format!("expected an array, got {}", type_name(events_value)));
        };
        if event_values.is_empty() {
            return self.fail("/events", "a trace needs at least one event");
        }
        let mut events = Vec::with_capacity(event_values.len());
        let mut index_of: HashMap<&str, u32> = HashMap::with_capacity(event_values.len());
        for (i, value) in event_values.iter().enumerate() {
            let event = self.event(value, &format!("/events/{i}"))?;
            events.push(event);
        }
        for (i, event) in events.iter().enumerate() {
            if let Some(first) = index_of.insert(&event.id, i as u32) {
                return self.fail(
                    &format!("/events/{i}/id"),
                    format!("duplicate event id {:?} (first used by /events/{first})", event.id),
                );
            }
        }

        let edges_value = self.required(object, "edges", "/edges")?;
        let Value::Array(edge_values) = edges_value else {
            return self.fail("/edges", format!("expected an array, got {}", type_name(edges_value)));
        };
        let mut edges = Vec::with_capacity(edge_values.len());
        for (k, value) in edge_values.iter().enumerate() {
            edges.push(self.edge(value, &format!("/edges/{k}"), &index_of)?);
        }
        let pairs: Vec<(u32, u32)> = edges.iter().map(|e| (e.src, e.dst)).collect();
        check_graph(self.trace_id, &|i| events[i].id.clone(), events.len(), &pairs)?;

        let rewards = self.named_numbers(self.required(object, "rewards", "/rewards")?, "/rewards", false)?;
        let costs = self.costs(self.required(object, "costs", "/costs")?)?;
        let metrics = object.get("metrics").map(|v| self.named_numbers(v, "/metrics", false)).transpose()?;

        Ok(Trace {
            trace_id,
            task_id,
            group_id,
            system,
            topology,
            policy_version,
            counterfactual_of,
            events,
            edges,
            rewards,
            costs,
            metrics,
            attributes: (!attributes.is_empty()).then_some(attributes),
        })
    }

    fn counterfactual_of(&self, value: &Value) -> Checked<CounterfactualOf> {
        let path = "/counterfactual_of";
        let object = self.object(value, path)?;
        let field = |key: &str| self.required(object, key, &format!("{path}/{key}"));
        Ok(CounterfactualOf {
            trace_id: self.non_empty_string(field("trace_id")?, &format!("{path}/trace_id"))?,
            event_id: self.non_empty_string(field("event_id")?, &format!("{path}/event_id"))?,
            kind: self.enumerated(
                field("kind")?,
                &format!("{path}/kind"),
                CounterfactualKind::parse,
                CounterfactualKind::expected(),
            )?,
        })
    }

    fn event(&self, value: &Value, path: &str) -> Checked<Event> {
        let object = self.object(value, path)?;
        let field = |key: &str| self.required(object, key, &format!("{path}/{key}"));
        let id = self.non_empty_string(field("id")?, &format!("{path}/id"))?;
        let t_path = format!("{path}/t");
        let t = self.number(field("t")?, &t_path)?;
        self.rule(&t_path, check_non_negative(t))?;
        let event_type =
            self.enumerated(field("type")?, &format!("{path}/type"), EventType::parse, EventType::expected())?;
        let agent = self.non_empty_string(field("agent")?, &format!("{path}/agent"))?;
        let mut event = Event::new(id, t, event_type, agent);
        event.role = self.optional_string(object, "role", path)?;
        event.from = self.optional_string(object, "from", path)?;
        event.to = self.optional_string(object, "to", path)?;
        event.tool = self.optional_string(object, "tool", path)?;
        event.content_ref = self.optional_string(object, "content_ref", path)?;
        if let Some(value) = object.get("trusted") {
            match value {
                Value::Bool(flag) => event.trusted = Some(*flag),
                other => {
                    return self
                        .fail(&format!("{path}/trusted"), format!("expected a boolean, got {}", type_name(other)));
                }
            }
        }
        if let Some(value) = object.get("reward") {
            event.reward = Some(self.named_numbers(value, &format!("{path}/reward"), false)?);
        }
        if let Some(value) = object.get("tokens") {
            let tokens_path = format!("{path}/tokens");
            let tokens = self.integer(value, &tokens_path)?;
            self.rule(&tokens_path, check_non_negative(tokens as f64))?;
            event.tokens = Some(tokens);
        }
        if let Some(value) = object.get("duration_s") {
            let duration_path = format!("{path}/duration_s");
            let duration = self.number(value, &duration_path)?;
            self.rule(&duration_path, check_non_negative(duration))?;
            event.duration_s = Some(duration);
        }
        if let Some(value) = object.get("logprob") {
            let logprob_path = format!("{path}/logprob");
            let logprob = self.number(value, &logprob_path)?;
            self.rule(&logprob_path, check_logprob(logprob))?;
            event.logprob = Some(logprob);
        }
        let extra: Map<String, Value> = object
            .iter()
            .filter(|(key, _)| !EVENT_KEYS.contains(&key.as_str()))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        event.attributes = (!extra.is_empty()).then_some(extra);
        Ok(event)
    }

    fn edge(&self, value: &Value, path: &str, index_of: &HashMap<&str, u32>) -> Checked<Edge> {
        let object = self.object(value, path)?;
        if let Some(key) = object.keys().find(|key| !["src", "dst", "type"].contains(&key.as_str())) {
            return self.fail(
                &format!("{path}/{}", pointer_segment(key)),
                format!("unknown edge key {key:?}: an edge has exactly src, dst and type"),
            );
        }
        let mut endpoints = [0u32; 2];
        for (slot, key) in endpoints.iter_mut().zip(["src", "dst"]) {
            let end_path = format!("{path}/{key}");
            let id = self.non_empty_string(self.required(object, key, &end_path)?, &end_path)?;
            match index_of.get(id.as_str()) {
                Some(&index) => *slot = index,
                None => return self.fail(&end_path, format!("edge names event {id:?}, which is not in /events")),
            }
        }
        let type_path = format!("{path}/type");
        let edge_type = self.enumerated(
            self.required(object, "type", &type_path)?,
            &type_path,
            EdgeType::parse,
            EdgeType::expected(),
        )?;
        Ok(Edge { src: endpoints[0], dst: endpoints[1], edge_type })
    }

    fn costs(&self, value: &Value) -> Checked<Costs> {
        let all = self.named_numbers(value, "/costs", true)?;
        let mut costs = Costs { tokens: 0.0, wall_clock_s: 0.0, tool_calls: None, messages: None, other: Vec::new() };
        let (mut has_tokens, mut has_wall_clock) = (false, false);
        for (key, number) in all {
            match key.as_str() {
                "tokens" => (costs.tokens, has_tokens) = (number, true),
                "wall_clock_s" => (costs.wall_clock_s, has_wall_clock) = (number, true),
                "tool_calls" => costs.tool_calls = Some(number),
                "messages" => costs.messages = Some(number),
                _ => costs.other.push((key, number)),
            }
        }
        for (present, key) in [(has_tokens, "tokens"), (has_wall_clock, "wall_clock_s")] {
            if !present {
                return self.fail(&format!("/costs/{key}"), format!("missing required field {key:?}"));
            }
        }
        Ok(costs)
    }
}

fn describe(value: &Value) -> String {
    match value {
        Value::Number(n) => format!("the number {n}"),
        other => type_name(other).to_owned(),
    }
}
