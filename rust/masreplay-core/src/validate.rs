//! Every check of the data contract, with typed errors that name the trace, a JSON pointer and
//! the reason. JSON documents are checked while they are turned into [`Trace`]s; the columnar
//! ingest in `store` reuses the value rules and graph check defined here.
//!
//! JSON text takes a fast path first (`direct`: no DOM, no error reports); whatever it
//! declines goes through the `Reader` over a `serde_json::Value`, which alone words errors.

mod direct;
pub(crate) mod non_finite;
mod split;
pub mod tape;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

use rayon::prelude::*;
use serde_core::Deserialize;
use serde_json::{Map, Number, Value};

use crate::error::{MasreplayError, ValidationError};
use crate::graph;
use crate::interrupt::Checkpoint;
use crate::trace::{
    Costs, CounterfactualKind, CounterfactualOf, Edge, EdgeType, Event, EventType, NamedNumbers, Topology, Trace,
};
use tape::Tape;

#[derive(Clone, Copy, Debug, Default)]
pub struct ValidateOptions {
    /// Accept exactly the seed schema: masreplay's top-level additions and unknown top-level
    /// keys are errors instead of being kept.
    pub strict_seed: bool,
}

const TOP_LEVEL_SEED_KEYS: &[&str] =
    &["trace_id", "task_id", "system", "topology", "events", "edges", "rewards", "costs", "metrics"];
const TOP_LEVEL_MASREPLAY_KEYS: &[&str] = &["schema_version", "group_id", "policy_version", "counterfactual_of"];

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

/// A JSON number read as an integer: an integer, or a float with no fraction below 9e15 (the
/// form `1.0` that JSON writers produce for whole floats).
fn whole_number(number: &Number) -> Option<i64> {
    number.as_i64().or_else(|| number.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15).map(|f| f as i64))
}

/// How deep a trace may nest: levels of objects and arrays, the trace object being level 1.
/// One rule for every input form (JSON text, Python objects, the attributes text of Arrow
/// tables, Parquet files and saved buffers), set below serde_json's recursion limit (128) so
/// that whatever is accepted in one form is read back in every other.
pub const MAX_DEPTH: usize = 100;

/// The reason given for a value that nests deeper than [`MAX_DEPTH`].
pub fn depth_error() -> String {
    format!(
        "nests deeper than {MAX_DEPTH} levels of objects and arrays, the limit for a trace \
         (a dict or list that contains itself never ends)"
    )
}

/// Levels of objects and arrays in `value`, 0 for a scalar. Values come from serde_json (at
/// most 128 levels) or from Python objects cut at [`MAX_DEPTH`]: the recursion is bounded.
fn nesting(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(nesting).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(nesting).max().unwrap_or(0),
        _ => 0,
    }
}

/// The first attribute that nests too deep, for attributes that are keys of an object at
/// `level` (1: the trace, 3: an event).
pub(crate) fn too_deep_attribute(attributes: &Map<String, Value>, level: usize) -> Option<&str> {
    attributes.iter().find(|(_, value)| level + nesting(value) > MAX_DEPTH).map(|(key, _)| key.as_str())
}

/// Whether the attributes of an object at `level`, stored as the JSON text of one object (the
/// columnar form), fit in [`MAX_DEPTH`].
pub(crate) fn attributes_fit(attributes: &Map<String, Value>, level: usize) -> bool {
    too_deep_attribute(attributes, level).is_none()
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
/// `edges` are (src, dst) local event indices; errors point into `/edges/{k}`. Returns the
/// graph's shape, which the same pass settles.
pub fn check_graph(
    trace_id: Option<&str>,
    event_ids: &dyn Fn(usize) -> String,
    n_events: usize,
    edges: &[(u32, u32)],
) -> Result<graph::Shape, ValidationError> {
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
    graph::acyclic_shape(n_events, edges).map_err(|cycle| {
        let names: Vec<String> = cycle.events.iter().map(|&e| format!("{:?}", event_ids(e as usize))).collect();
        ValidationError::new(
            trace_id,
            format!("/edges/{}", cycle.edge_index),
            format!("edges form a cycle: {} -> {}", names.join(" -> "), names[0]),
        )
    })
}

/// Event ids to indices. Every event and edge goes through it, so it hashes with foldhash
/// (serde_json's own hasher, randomly seeded) rather than the slower SipHash.
type EventIndex<'a> = HashMap<&'a str, u32, foldhash::fast::RandomState>;

/// Maps each event id to its index; a repeated id is returned as (its index, the first one's).
fn index_events(events: &[Event]) -> Result<EventIndex<'_>, (usize, u32)> {
    let mut index_of = EventIndex::with_capacity_and_hasher(events.len(), Default::default());
    for (i, event) in events.iter().enumerate() {
        if let Some(first) = index_of.insert(event.id.as_str(), i as u32) {
            return Err((i, first));
        }
    }
    Ok(index_of)
}

/// Splits the named costs into the schema's fields; a missing required one is returned by name.
fn split_costs(all: NamedNumbers) -> Result<Costs, &'static str> {
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
    match (has_tokens, has_wall_clock) {
        (false, _) => Err("tokens"),
        (_, false) => Err("wall_clock_s"),
        _ => Ok(costs),
    }
}

// ---- JSON documents ------------------------------------------------------------------------

/// Parses JSON text holding one trace, an array of traces, or JSON Lines / concatenated
/// traces. Each trace is checked on its own (in parallel); a syntax error ends a document,
/// but in JSON Lines it only costs its own line. Polls the call's stop flag before each trace
/// ([`MasreplayError::Interrupted`]); one document the Reader must take whole (a syntax error
/// in a single trace or array) is read without a poll.
pub fn parse_documents(bytes: &[u8], options: ValidateOptions) -> Result<Vec<Outcome>, MasreplayError> {
    let checkpoint = Checkpoint::here();
    if let Some(lines) = json_lines(bytes) {
        return lines
            .par_iter()
            .map(|&(number, line)| {
                checkpoint.check()?;
                Ok(read_text(line, options).unwrap_or_else(|error| {
                    let outcome = match non_finite::read_marked(line, &error, options) {
                        Some(mut outcomes) if outcomes.len() == 1 => outcomes.remove(0),
                        _ => Err(syntax_error(line, &error)),
                    };
                    outcome.map_err(|mut error| {
                        error.reason = format!("line {number}: {}", error.reason);
                        error
                    })
                }))
            })
            .collect();
    }
    // Traces are parsed while the rest of the document is still being cut into them (par_bridge).
    // A syntax error is positioned in the whole document, so it sends the document to the Reader.
    let mut outcomes: Vec<(usize, Option<Outcome>)> = split::trace_texts(bytes)
        .enumerate()
        .par_bridge()
        .map(|(index, text)| checkpoint.check().map(|()| (index, text.and_then(|text| read_text(text, options).ok()))))
        .collect::<Result<_, _>>()?;
    outcomes.sort_unstable_by_key(|&(index, _)| index);
    match outcomes.into_iter().map(|(_, outcome)| outcome).collect::<Option<Vec<_>>>() {
        Some(outcomes) if !outcomes.is_empty() => Ok(outcomes),
        _ => read_documents(bytes, options),
    }
}

/// A trace read from JSON, or why it was rejected.
pub type Outcome = Result<Trace, ValidationError>;

/// Checks the one trace in `text`: fast when it is valid, through the Reader otherwise.
fn read_text(text: &[u8], options: ValidateOptions) -> Result<Result<Trace, ValidationError>, serde_json::Error> {
    match direct::read_trace(text, options) {
        Some(trace) => Ok(Ok(trace)),
        None => serde_json::from_slice::<Value>(text).map(|value| trace_from_json(&value, options)),
    }
}

/// The documents of `bytes` through the Reader alone: the reference behaviour, and the fallback
/// for documents that [`split::trace_texts`] does not take apart or that hold a syntax error.
fn read_documents(bytes: &[u8], options: ValidateOptions) -> Result<Vec<Outcome>, MasreplayError> {
    let checkpoint = Checkpoint::here();
    let mut results = Vec::new();
    let mut stream = serde_json::Deserializer::from_slice(bytes).into_iter::<Value>();
    loop {
        checkpoint.check()?;
        match stream.next() {
            None => break,
            Some(Ok(Value::Array(items))) => {
                let read: Vec<Outcome> = items
                    .par_iter()
                    .map(|item| checkpoint.check().map(|()| trace_from_json(item, options)))
                    .collect::<Result<_, _>>()?;
                results.extend(read);
            }
            Some(Ok(value)) => results.push(trace_from_json(&value, options)),
            Some(Err(error)) => {
                // Only NaN / Infinity literals in an otherwise readable document: each trace that
                // holds one is rejected with its id and the pointer of the value.
                if let Some(marked) = non_finite::read_marked(bytes, &error, options) {
                    return Ok(marked);
                }
                results.push(Err(syntax_error(bytes, &error)));
                break;
            }
        }
    }
    if results.is_empty() {
        results.push(Err(ValidationError::new(None, "", "the input holds no trace (empty document)")));
    }
    Ok(results)
}

/// The numbered non-blank lines of `bytes`, when it is JSON Lines: more than one line, each
/// one braced like a whole object (a pretty-printed document's lines are not). A broken line
/// then costs only itself.
fn json_lines(bytes: &[u8]) -> Option<Vec<(usize, &[u8])>> {
    let mut lines = Vec::new();
    let mut start = 0;
    for (i, end) in memchr::memchr_iter(b'\n', bytes).chain([bytes.len()]).enumerate() {
        let line = bytes[start..end].trim_ascii();
        start = end + 1;
        if line.is_empty() {
            continue;
        }
        if line.first() != Some(&b'{') || line.last() != Some(&b'}') {
            return None;
        }
        lines.push((i + 1, line));
    }
    (lines.len() > 1).then_some(lines)
}

/// A syntax error in words that say what is wrong.
fn syntax_error(bytes: &[u8], error: &serde_json::Error) -> ValidationError {
    use serde_json::error::Category;
    let reason = if error.classify() == Category::Eof {
        format!("invalid JSON: the text ends before its value does ({error})")
    } else if error.classify() == Category::Syntax && std::str::from_utf8(bytes).is_err() {
        format!("the input is not valid UTF-8: {error}")
    } else if error.to_string().starts_with("recursion limit exceeded") {
        format!(
            "the JSON text nests too deep ({error}); a trace nests at most {MAX_DEPTH} levels of objects and arrays"
        )
    } else if let Some(literal) = non_finite::literal_at(bytes, error) {
        format!("invalid JSON: {literal} is not a JSON number (write null or a finite number; {error})")
    } else {
        format!("invalid JSON: {error}")
    };
    ValidationError::new(None, "", reason)
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

/// Checks the document at `root` of `tape` against the data contract and builds the trace:
/// through the fast path when it passes, through the Reader (the words of any error) otherwise.
pub fn trace_from_tape(tape: &Tape, root: usize, options: ValidateOptions) -> Result<Trace, ValidationError> {
    if let Some(trace) = direct::read_document(tape.document(root), options) {
        return Ok(trace);
    }
    match Value::deserialize(tape.document(root)) {
        Ok(value) => trace_from_json(&value, options),
        Err(error) => Err(ValidationError::new(None, "", format!("unreadable document: {error}"))),
    }
}

// ---- traces built in Rust (converters): the same checks without a JSON document ----------

/// An event made by a converter, checked as the Reader checks event `index` of a JSON trace
/// with the keys id, t, type, agent, then `fields` in their order.
pub(crate) fn event_from_parts(
    trace_id: &str,
    index: usize,
    (id, t, event_type, agent): (String, f64, EventType, &str),
    fields: Vec<(&str, Value)>,
) -> Result<Event, ValidationError> {
    let reader = Reader { trace_id: Some(trace_id) };
    let events_at = Loc::Root.key("events");
    let at = events_at.index(index);
    reader.rule(&at.key("id"), check_non_empty(&id))?;
    // A time JSON cannot hold is null there.
    let t = reader.number(&Value::from(t), &at.key("t"))?;
    reader.rule(&at.key("t"), check_non_negative(t))?;
    reader.rule(&at.key("agent"), check_non_empty(agent))?;
    let mut event = Event::new(id, t, event_type, agent);
    let mut extra = Map::new();
    for (key, value) in fields {
        // Text fields take the converter's text itself (the Reader copies it from a document).
        let value = match (text_field(&mut event, key), value) {
            (Some(field), Value::String(text)) => {
                *field = Some(text);
                continue;
            }
            (_, value) => value,
        };
        if !reader.field(&mut event, key, &value, &at)? {
            extra.insert(key.to_owned(), value);
        }
    }
    reader.attach(event, extra, &at)
}

/// The event fields of the schema besides id, t, type and agent: what `Reader::field` sets.
const EVENT_FIELDS: [&str; 10] =
    ["role", "from", "to", "tool", "content_ref", "trusted", "reward", "tokens", "duration_s", "logprob"];

/// Whether `key` names a field of an event's schema that [`event_from_parts`] checks and sets
/// (any other key of its fields is one of the event's attributes).
pub(crate) fn is_event_field(key: &str) -> bool {
    EVENT_FIELDS.contains(&key)
}

/// The text field of `event` that `key` names, if it names one (the one list of them).
fn text_field<'e>(event: &'e mut Event, key: &str) -> Option<&'e mut Option<String>> {
    match key {
        "role" => Some(&mut event.role),
        "from" => Some(&mut event.from),
        "to" => Some(&mut event.to),
        "tool" => Some(&mut event.tool),
        "content_ref" => Some(&mut event.content_ref),
        _ => None,
    }
}

/// A trace a converter made of events from [`event_from_parts`] and edges between them, with
/// the checks `trace_from_json` makes of the whole (at least one event, distinct ids, an
/// acyclic graph) and of its rewards, costs, metrics and attributes, in the order it makes
/// them. The ids given are non-empty.
pub(crate) fn trace_from_parts(
    (trace_id, task_id, system, topology): (&str, &str, &str, Topology),
    events: Vec<Event>,
    edges: Vec<Edge>,
    (rewards, costs, metrics): (JsonMap, JsonMap, Option<JsonMap>),
    attributes: JsonMap,
) -> Result<Trace, ValidationError> {
    let reader = Reader { trace_id: Some(trace_id) };
    if let Some(key) = too_deep_attribute(&attributes, 1) {
        return reader.fail(&Loc::Root.key(key), depth_error());
    }
    if events.is_empty() {
        return reader.fail(&Loc::Root.key("events"), NO_EVENTS);
    }
    reader.distinct_ids(&events)?;
    let pairs: Vec<(u32, u32)> = edges.iter().map(|e| (e.src, e.dst)).collect();
    check_graph(Some(trace_id), &|i| events[i].id.clone(), events.len(), &pairs)?;
    let rewards = reader.named_numbers(&Value::Object(rewards), &Loc::Root.key("rewards"), false)?;
    let costs = reader.costs(&Value::Object(costs))?;
    let metrics = metrics
        .map(|metrics| reader.named_numbers(&Value::Object(metrics), &Loc::Root.key("metrics"), false))
        .transpose()?;
    Ok(Trace {
        trace_id: trace_id.to_owned(),
        task_id: task_id.to_owned(),
        group_id: None,
        system: Some(system.to_owned()),
        topology: Some(topology),
        policy_version: None,
        counterfactual_of: None,
        events,
        edges,
        rewards,
        costs,
        metrics,
        attributes: (!attributes.is_empty()).then_some(attributes),
    })
}

type JsonMap = Map<String, Value>;

const NO_EVENTS: &str = "a trace needs at least one event";

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

/// A JSON pointer built only when an error needs it: validating a good trace formats no path.
#[derive(Clone, Copy)]
enum Loc<'a> {
    Root,
    Key(&'a Loc<'a>, &'a str),
    Index(&'a Loc<'a>, usize),
}

impl Loc<'_> {
    fn key<'b>(&'b self, key: &'b str) -> Loc<'b> {
        Loc::Key(self, key)
    }

    fn index(&self, index: usize) -> Loc<'_> {
        Loc::Index(self, index)
    }
}

impl std::fmt::Display for Loc<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Loc::Root => Ok(()),
            Loc::Key(parent, key) => write!(f, "{parent}/{}", pointer_segment(key)),
            Loc::Index(parent, index) => write!(f, "{parent}/{index}"),
        }
    }
}

struct Reader<'a> {
    trace_id: Option<&'a str>,
}

type Checked<T> = Result<T, ValidationError>;

impl Reader<'_> {
    fn fail<T>(&self, at: &Loc, reason: impl Into<String>) -> Checked<T> {
        Err(ValidationError::new(self.trace_id, at.to_string(), reason))
    }

    fn rule<T>(&self, at: &Loc, outcome: Result<T, String>) -> Checked<T> {
        outcome.or_else(|reason| self.fail(at, reason))
    }

    fn required<'v>(&self, object: &'v Map<String, Value>, at: &Loc) -> Checked<&'v Value> {
        let Loc::Key(_, key) = at else { unreachable!("a required field is named") };
        match object.get(*key) {
            Some(value) => Ok(value),
            None => self.fail(at, format!("missing required field {key:?}")),
        }
    }

    fn string<'v>(&self, value: &'v Value, at: &Loc) -> Checked<&'v str> {
        match value {
            Value::String(text) => Ok(text),
            other => self.fail(at, format!("expected a string, got {}", type_name(other))),
        }
    }

    fn non_empty_string(&self, value: &Value, at: &Loc) -> Checked<String> {
        let text = self.string(value, at)?;
        self.rule(at, check_non_empty(text))?;
        Ok(text.to_owned())
    }

    fn required_text(&self, object: &Map<String, Value>, at: &Loc) -> Checked<String> {
        self.non_empty_string(self.required(object, at)?, at)
    }

    fn optional_string(&self, object: &Map<String, Value>, at: &Loc) -> Checked<Option<String>> {
        let Loc::Key(_, key) = at else { unreachable!("an optional field is named") };
        object.get(*key).map(|value| self.string(value, at).map(str::to_owned)).transpose()
    }

    fn number(&self, value: &Value, at: &Loc) -> Checked<f64> {
        match value.as_f64() {
            Some(number) => {
                self.rule(at, check_finite(number))?;
                Ok(number)
            }
            None => self.fail(at, format!("expected a number, got {}", type_name(value))),
        }
    }

    fn integer(&self, value: &Value, at: &Loc) -> Checked<i64> {
        match value.as_number().and_then(whole_number) {
            Some(n) => Ok(n),
            None => self.fail(at, format!("expected an integer, got {}", describe(value))),
        }
    }

    fn enumerated<E>(
        &self,
        value: &Value,
        at: &Loc,
        parse: fn(&str) -> Option<E>,
        expected: fn() -> String,
    ) -> Checked<E> {
        let text = self.string(value, at)?;
        match parse(text) {
            Some(parsed) => Ok(parsed),
            None => self.fail(at, format!("unknown value {text:?}; expected one of {}", expected())),
        }
    }

    fn object<'v>(&self, value: &'v Value, at: &Loc) -> Checked<&'v Map<String, Value>> {
        match value {
            Value::Object(object) => Ok(object),
            other => self.fail(at, format!("expected an object, got {}", type_name(other))),
        }
    }

    fn array<'v>(&self, value: &'v Value, at: &Loc) -> Checked<&'v Vec<Value>> {
        match value {
            Value::Array(items) => Ok(items),
            other => self.fail(at, format!("expected an array, got {}", type_name(other))),
        }
    }

    fn named_numbers(&self, value: &Value, at: &Loc, non_negative: bool) -> Checked<NamedNumbers> {
        let object = self.object(value, at)?;
        let mut numbers = Vec::with_capacity(object.len());
        for (key, item) in object {
            let item_at = at.key(key);
            let number = self.number(item, &item_at)?;
            if non_negative {
                self.rule(&item_at, check_non_negative(number))?;
            }
            numbers.push((key.clone(), number));
        }
        Ok(numbers)
    }

    fn trace(&self, object: &Map<String, Value>, options: ValidateOptions) -> Checked<Trace> {
        let root = Loc::Root;
        let attributes = self.attributes(object, options)?;
        if let Some(version) = object.get("schema_version") {
            let at = root.key("schema_version");
            let version = self.integer(version, &at)?;
            self.rule(&at, check_schema_version(version))?;
        }
        let trace_id = self.required_text(object, &root.key("trace_id"))?;
        let task_id = self.required_text(object, &root.key("task_id"))?;
        let group_id = object
            .get("group_id")
            .map(|v| self.non_empty_string(v, &root.key("group_id")))
            .transpose()?
            .filter(|group| *group != task_id); // None already means "the task is the group"
        let system = self.optional_string(object, &root.key("system"))?;
        let topology = object
            .get("topology")
            .map(|v| self.enumerated(v, &root.key("topology"), Topology::from_name, Topology::expected))
            .transpose()?;
        let policy_version = object
            .get("policy_version")
            .map(|v| {
                let at = root.key("policy_version");
                let version = self.integer(v, &at)?;
                self.rule(&at, check_non_negative(version as f64))?;
                Ok(version)
            })
            .transpose()?;
        let counterfactual_of = object.get("counterfactual_of").map(|v| self.counterfactual_of(v)).transpose()?;

        let events = self.events(object)?;
        let edges = self.edges(object, &self.distinct_ids(&events)?)?;
        let pairs: Vec<(u32, u32)> = edges.iter().map(|e| (e.src, e.dst)).collect();
        check_graph(self.trace_id, &|i| events[i].id.clone(), events.len(), &pairs)?;

        let rewards_at = root.key("rewards");
        let rewards = self.named_numbers(self.required(object, &rewards_at)?, &rewards_at, false)?;
        let costs = self.costs(self.required(object, &root.key("costs"))?)?;
        let metrics = object.get("metrics").map(|v| self.named_numbers(v, &root.key("metrics"), false)).transpose()?;

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

    /// The top-level keys outside the schema, which the trace keeps as its attributes (the seed
    /// schema alone allows none).
    fn attributes(&self, object: &Map<String, Value>, options: ValidateOptions) -> Checked<Map<String, Value>> {
        let root = Loc::Root;
        let mut attributes = Map::new();
        for (key, value) in object {
            let known_seed = TOP_LEVEL_SEED_KEYS.contains(&key.as_str());
            let known_ours = TOP_LEVEL_MASREPLAY_KEYS.contains(&key.as_str());
            if options.strict_seed && !known_seed {
                return self.fail(
                    &root.key(key),
                    format!("unknown top-level key {key:?}: the seed schema allows no additional properties"),
                );
            }
            if !known_seed && !known_ours {
                attributes.insert(key.clone(), value.clone());
            }
        }
        if let Some(key) = too_deep_attribute(&attributes, 1) {
            return self.fail(&root.key(key), depth_error());
        }
        Ok(attributes)
    }

    /// `/events`: at least one, each checked.
    fn events(&self, object: &Map<String, Value>) -> Checked<Vec<Event>> {
        let events_at = Loc::Root.key("events");
        let event_values = self.array(self.required(object, &events_at)?, &events_at)?;
        if event_values.is_empty() {
            return self.fail(&events_at, NO_EVENTS);
        }
        let mut events = Vec::with_capacity(event_values.len());
        for (i, value) in event_values.iter().enumerate() {
            events.push(self.event(value, &events_at.index(i))?);
        }
        Ok(events)
    }

    /// The index of each event by id, which edges name their ends by; ids must be distinct.
    fn distinct_ids<'e>(&self, events: &'e [Event]) -> Checked<EventIndex<'e>> {
        index_events(events).or_else(|(i, first)| {
            self.fail(
                &Loc::Root.key("events").index(i).key("id"),
                format!("duplicate event id {:?} (first used by /events/{first})", events[i].id),
            )
        })
    }

    /// `/edges`, each between events of `index_of`.
    fn edges(&self, object: &Map<String, Value>, index_of: &EventIndex) -> Checked<Vec<Edge>> {
        let edges_at = Loc::Root.key("edges");
        let edge_values = self.array(self.required(object, &edges_at)?, &edges_at)?;
        let mut edges = Vec::with_capacity(edge_values.len());
        for (k, value) in edge_values.iter().enumerate() {
            edges.push(self.edge(value, &edges_at.index(k), index_of)?);
        }
        Ok(edges)
    }

    fn counterfactual_of(&self, value: &Value) -> Checked<CounterfactualOf> {
        let root = Loc::Root;
        let at = root.key("counterfactual_of");
        let object = self.object(value, &at)?;
        let kind_at = at.key("kind");
        Ok(CounterfactualOf {
            trace_id: self.required_text(object, &at.key("trace_id"))?,
            event_id: self.required_text(object, &at.key("event_id"))?,
            kind: self.enumerated(
                self.required(object, &kind_at)?,
                &kind_at,
                CounterfactualKind::from_name,
                CounterfactualKind::expected,
            )?,
        })
    }

    fn event(&self, value: &Value, at: &Loc) -> Checked<Event> {
        let object = self.object(value, at)?;
        let id = self.required_text(object, &at.key("id"))?;
        let t_at = at.key("t");
        let t = self.number(self.required(object, &t_at)?, &t_at)?;
        self.rule(&t_at, check_non_negative(t))?;
        let type_at = at.key("type");
        let event_type =
            self.enumerated(self.required(object, &type_at)?, &type_at, EventType::from_name, EventType::expected)?;
        let agent = self.required_text(object, &at.key("agent"))?;
        let mut event = Event::new(id, t, event_type, agent);
        let mut extra = Map::new();
        for (key, value) in object {
            if !matches!(key.as_str(), "id" | "t" | "type" | "agent") && !self.field(&mut event, key, value, at)? {
                extra.insert(key.clone(), value.clone());
            }
        }
        self.attach(event, extra, at)
    }

    /// Sets a field of the schema other than id, t, type and agent on `event`; `false` for a
    /// key outside the schema (an attribute).
    fn field(&self, event: &mut Event, key: &str, value: &Value, at: &Loc) -> Checked<bool> {
        let field_at = at.key(key);
        if let Some(text) = text_field(event, key) {
            *text = Some(self.string(value, &field_at)?.to_owned());
            return Ok(true);
        }
        match key {
            "trusted" => match value {
                Value::Bool(flag) => event.trusted = Some(*flag),
                other => return self.fail(&field_at, format!("expected a boolean, got {}", type_name(other))),
            },
            "reward" => event.reward = Some(self.named_numbers(value, &field_at, false)?),
            "tokens" => {
                let tokens = self.integer(value, &field_at)?;
                self.rule(&field_at, check_non_negative(tokens as f64))?;
                event.tokens = Some(tokens);
            }
            "duration_s" => {
                let duration = self.number(value, &field_at)?;
                self.rule(&field_at, check_non_negative(duration))?;
                event.duration_s = Some(duration);
            }
            "logprob" => {
                let logprob = self.number(value, &field_at)?;
                self.rule(&field_at, check_logprob(logprob))?;
                event.logprob = Some(logprob);
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The event with its attributes, which must fit in [`MAX_DEPTH`].
    fn attach(&self, mut event: Event, extra: Map<String, Value>, at: &Loc) -> Checked<Event> {
        if let Some(key) = too_deep_attribute(&extra, 3) {
            return self.fail(&at.key(key), depth_error());
        }
        event.attributes = (!extra.is_empty()).then_some(extra);
        Ok(event)
    }

    fn edge(&self, value: &Value, at: &Loc, index_of: &EventIndex) -> Checked<Edge> {
        let object = self.object(value, at)?;
        if let Some(key) = object.keys().find(|key| !["src", "dst", "type"].contains(&key.as_str())) {
            return self.fail(&at.key(key), format!("unknown edge key {key:?}: an edge has exactly src, dst and type"));
        }
        let mut endpoints = [0u32; 2];
        for (slot, key) in endpoints.iter_mut().zip(["src", "dst"]) {
            let end_at = at.key(key);
            let id = self.string(self.required(object, &end_at)?, &end_at)?;
            self.rule(&end_at, check_non_empty(id))?;
            match index_of.get(id) {
                Some(&index) => *slot = index,
                None => return self.fail(&end_at, format!("edge names event {id:?}, which is not in /events")),
            }
        }
        let type_at = at.key("type");
        let edge_type =
            self.enumerated(self.required(object, &type_at)?, &type_at, EdgeType::from_name, EdgeType::expected)?;
        Ok(Edge { src: endpoints[0], dst: endpoints[1], edge_type })
    }

    fn costs(&self, value: &Value) -> Checked<Costs> {
        let root = Loc::Root;
        let at = root.key("costs");
        let all = self.named_numbers(value, &at, true)?;
        split_costs(all).or_else(|key| self.fail(&at.key(key), format!("missing required field {key:?}")))
    }
}

fn describe(value: &Value) -> String {
    match value {
        Value::Number(n) => format!("the number {n}"),
        other => type_name(other).to_owned(),
    }
}
