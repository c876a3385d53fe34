//! OpenTelemetry GenAI spans (OTLP JSON, the SDK's span JSON, Agent Lightning dumps) -> traces.
//!
//! One trace per OpenTelemetry trace (per Agent Lightning rollout when spans name one). Spans
//! map by `gen_ai.operation.name`: `create_agent` -> spawn of `gen_ai.agent.name`;
//! `invoke_agent` -> a message to the agent when the run starts and its return when it ends,
//! with the spans inside as that agent's events; `execute_tool` and `retrieval` -> tool_call +
//! tool_result; `chat` / `text_completion` / `generate_content` -> message; `apply_guardrail`
//! -> safety_event. `gen_ai.usage.input_tokens` + `output_tokens` are the tokens of the span's
//! first event, on every span that carries them. A span's `exception` events become that
//! event's `exceptions` (type and message); its other events and its links are counted in the
//! report's `ignored`. `parent_span_id` gives causal edges (parent -> child, child -> its
//! parent's return) and siblings that ran one after the other are linked by temporal edges.
//! Agent Lightning `agentlightning.reward` spans are reward channels: the last one is the
//! trace's rewards and each also rewards the event that finished just before it. Spans with no
//! GenAI operation are counted in the report and see-through: their children hang on the
//! nearest mapped ancestor.
//!
//! Roles: an agent invoked by no other agent is an `orchestrator`, an agent invoked inside
//! another's run a `sub-agent`; the spawns and invoking messages of the caller outside every
//! agent run (`user`) have the role `user`; tool results `tool`. A field of the wrong type is
//! a [`ConversionError`] naming the place; a span that repeats the id of an earlier one is set
//! aside with a report warning. The Python module `masreplay.convert.otel` documents the
//! mapping for users; this is its implementation.

use std::borrow::Cow;
use std::cmp::Ordering::Equal;
use std::collections::hash_map::Entry;
use std::fmt;

// Span ids and trace ids are hashed a few times each: foldhash, not SipHash.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

use serde_json::{Map, Value};

use super::builder::{Builder, Head, Out, integer, set_reward};
use super::json::{Json, Keep, py_repr, py_str, repr};
use super::{ConversionError, Document, Report, iso_time};
use crate::error::ValidationError;
use crate::store::TraceBatch;
use crate::trace::{EdgeType, EventType, NamedNumbers, Topology, Trace};

const USER: &str = "user";
const ORCHESTRATOR: &str = "orchestrator";
const SUB_AGENT: &str = "sub-agent";
const TOOL: &str = "tool";
/// Deeper OTLP values than the core stores in a trace document (validate/split.rs) are refused.
pub const MAX_NESTING: usize = 100;
const REWARD_SPAN: &str = "agentlightning.reward";
const MESSAGE_OPERATIONS: [&str; 3] = ["chat", "text_completion", "generate_content"];
/// A retrieval is a call to a data source: a tool call whose result comes back.
const TOOL_OPERATIONS: [&str; 2] = ["execute_tool", "retrieval"];
/// Agent Lightning bookkeeping spans: understood, nothing to learn from.
const IGNORED_SPANS: [&str; 4] =
    ["agentlightning.message", "agentlightning.object", "agentlightning.virtual", "agentlightning.operation"];
const USAGE_KEYS: [&str; 2] = ["gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"];
const EXCEPTION_EVENT: &str = "exception";
const TRACES_PER_SHARE: usize = 4;

/// The parts of a file's records the converter reads: an OTLP export (resource and scope
/// descriptions skipped unread) or a span as the SDK's `to_json` or Agent Lightning writes it.
const RECORD: Keep = Keep::Fields(&[
    ("resourceSpans", Keep::Items(&RESOURCE_SPANS)),
    ("context", Keep::Fields(&[("trace_id", Keep::All), ("span_id", Keep::All)])),
    ("parent_id", Keep::All),
    ("parent", Keep::Fields(&[("span_id", Keep::All)])),
    ("rollout_id", Keep::All),
    ("trace_id", Keep::All),
    ("span_id", Keep::All),
    ("status", Keep::Fields(&[("status_code", Keep::All)])),
    ("name", Keep::All),
    ("start_time", Keep::All),
    ("end_time", Keep::All),
    ("attributes", Keep::All),
    ("events", Keep::Items(&SPAN_EVENT)),
    ("links", Keep::Items(&TYPE_ONLY)),
]);
const RESOURCE_SPANS: Keep = Keep::Fields(&[("scopeSpans", Keep::Items(&SCOPE_SPANS))]);
const SCOPE_SPANS: Keep = Keep::Fields(&[("spans", Keep::Items(&OTLP_SPAN))]);
const OTLP_SPAN: Keep = Keep::Fields(&[
    ("traceId", Keep::All),
    ("spanId", Keep::All),
    ("parentSpanId", Keep::All),
    ("name", Keep::All),
    ("startTimeUnixNano", Keep::All),
    ("endTimeUnixNano", Keep::All),
    ("attributes", Keep::All),
    ("status", Keep::Fields(&[("code", Keep::All)])),
    ("events", Keep::Items(&SPAN_EVENT)),
    ("links", Keep::Items(&TYPE_ONLY)),
]);
const SPAN_EVENT: Keep = Keep::Fields(&[("name", Keep::All), ("attributes", Keep::All)]);
/// Links are only counted: each one's type is all that is read.
const TYPE_ONLY: Keep = Keep::Fields(&[]);

/// A file of spans: one JSON document (an OTLP export, or a list of spans) or JSON Lines of
/// them (the Collector's file exporter writes one export a line).
pub fn read<'a>(name: &str, bytes: &'a [u8]) -> Result<Document<'a>, ConversionError> {
    super::json_document(name, bytes, &RECORD)
}

mod typed;

type Failure = Box<ConversionError>;
type Outcome<T> = Result<T, Failure>;

/// Each event's attributes as the JSON text of one object (or none), in the order of a trace's
/// events.
pub type Attributes = crate::store::AttributeTexts;

/// Converted traces whose events' attributes are written beside them as JSON text (the text a
/// batch stores; the traces' events hold none): no map made and freed per event.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Converted {
    pub traces: Vec<Trace>,
    /// Each trace's events' attributes.
    pub attributes: Vec<Attributes>,
}

impl Converted {
    /// The traces as a batch, each event with its attributes.
    pub fn batch(&self) -> crate::error::Result<TraceBatch> {
        TraceBatch::from_traces_and_attributes(&self.traces, &self.attributes)
    }

    /// The traces with their events' attributes in them, as a batch of them reads them back.
    pub fn into_traces(self) -> Vec<Trace> {
        let mut traces = self.traces;
        for (trace, attributes) in traces.iter_mut().zip(self.attributes) {
            for (event, text) in trace.events.iter_mut().zip(attributes.texts()) {
                // Text written from values a trace holds: it reads back.
                event.attributes = text.and_then(|text| serde_json::from_str(text).ok());
            }
        }
        traces
    }
}

/// Converts the spans of `document` (read from the file or source named `name`): the traces,
/// and the report of what was read, set aside and found suspicious. A trace the data contract
/// refuses is an error naming the record its first span came from (once every trace is made:
/// what cannot be read at all is named first).
pub fn convert(name: &str, document: &Document<'_>) -> Outcome<(Converted, Report)> {
    traces(name, spans(name, document)?)
}

/// Converts the spans of a file's text: [`convert`] of what [`read`] makes of it, with the
/// same traces, report and errors. An OTLP export in the shape exporters write is read
/// straight into spans, with no value tree of the whole document.
pub fn convert_text(name: &str, bytes: &[u8]) -> Outcome<(Converted, Report)> {
    match typed::spans(name, bytes) {
        Some(spans) => traces(name, spans),
        None => convert(name, &read(name, bytes)?),
    }
}

/// The traces of the spans read from `name`, and the report.
fn traces(name: &str, spans: Vec<Span<'_>>) -> Outcome<(Converted, Report)> {
    let mut report = Report { records: spans.len(), ..Report::default() };
    let mut groups: Vec<(&str, Vec<&Span<'_>>)> = Vec::new();
    let mut group_of: HashMap<&str, usize> = HashMap::default();
    let mut last: Option<(&str, usize)> = None;
    for span in &spans {
        // A trace's spans mostly come one after the other: the last span's trace id is
        // compared before the map hashes the id.
        let at = match last {
            Some((trace, at)) if trace == span.trace => at,
            _ => *group_of.entry(span.trace.as_ref()).or_insert_with(|| {
                groups.push((span.trace.as_ref(), Vec::new()));
                groups.len() - 1
            }),
        };
        last = Some((span.trace.as_ref(), at));
        groups[at].1.push(span);
    }
    // Traces are made in parallel, each with a report of its own, read back in order: the
    // first error and the merged report are those of one pass in trace order.
    // A few traces a share: traces differ in size, and the threads finish together.
    let made = super::shared_map(&groups, TRACES_PER_SHARE, |(trace_id, members)| {
        let mut own = Report::default();
        let trace = OtelTrace::new(trace_id, members, &mut own).build();
        (trace, own)
    });
    let mut built = Vec::with_capacity(groups.len());
    for ((trace_id, members), (trace, own)) in groups.iter().zip(made) {
        report.merge(own);
        match trace? {
            Some(trace) => built.push((trace, members[0].at.line)),
            None => report.warnings.push(format!("{name}: trace {} has no GenAI spans; no trace made", repr(trace_id))),
        }
    }
    let mut converted = Converted::default();
    for (made, line) in built {
        let (trace, attributes) = made.map_err(|cause| Box::new(ConversionError::invalid_trace(name, line, cause)))?;
        converted.traces.push(trace);
        converted.attributes.push(attributes);
    }
    Ok((converted, report))
}

// ---- where a span was read -----------------------------------------------------------------

/// Where a span was read: the source, its line for JSON Lines input, its item in a list given
/// whole, and its place in an OTLP export.
#[derive(Clone, Copy)]
struct Where<'n> {
    source: &'n str,
    line: Option<usize>,
    item: Option<usize>,
    otlp: Option<(usize, usize, usize)>,
}

impl Where<'_> {
    fn pointer(&self) -> String {
        let mut pointer = self.item.map_or_else(String::new, |item| format!("/{item}"));
        if let Some((resource, scope, span)) = self.otlp {
            pointer += &format!("/resourceSpans/{resource}/scopeSpans/{scope}/spans/{span}");
        }
        pointer
    }

    /// The error; a reason that starts with a pointer continues this one.
    fn fail(&self, reason: impl fmt::Display) -> Failure {
        let pointer = self.pointer();
        let reason = reason.to_string();
        let reason = if pointer.is_empty() {
            reason
        } else if reason.starts_with('/') {
            format!("{pointer}{reason}")
        } else {
            format!("{pointer}: {reason}")
        };
        Box::new(ConversionError::new(self.source, self.line, reason))
    }
}

impl fmt::Display for Where<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}{}", self.source, self.pointer()),
            None => write!(f, "{}{}", self.source, self.pointer()),
        }
    }
}

/// A JSON pointer inside a span, formatted only when an error names it.
#[derive(Clone, Copy)]
enum Place<'p> {
    Root(&'p str),
    Key(&'p Place<'p>, &'p str),
    Index(&'p Place<'p>, usize),
}

impl fmt::Display for Place<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Root(text) => f.write_str(text),
            Place::Key(parent, key) => write!(f, "{parent}/{key}"),
            Place::Index(parent, index) => write!(f, "{parent}/{index}"),
        }
    }
}

// ---- the shape of the records --------------------------------------------------------------

#[derive(Clone, Copy)]
enum Kind {
    Text,
    Object,
    List,
    Bool,
}

impl Kind {
    fn holds(self, value: &Json<'_>) -> bool {
        matches!(
            (self, value),
            (Kind::Text, Json::Str(_))
                | (Kind::Object, Json::Object(_))
                | (Kind::List, Json::Array(_))
                | (Kind::Bool, Json::Bool(_))
        )
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Text => "text",
            Kind::Object => "an object",
            Kind::List => "a list",
            Kind::Bool => "a boolean",
        }
    }
}

/// A value's JSON type in words, `null` when absent.
fn describe<'v>(value: Option<&'v Json<'_>>) -> &'v str {
    value.map_or("null", Json::describe)
}

/// `record[key]` when it is of `kind`; `None` when absent or null; anything else fails,
/// naming `place/key`.
fn typed<'r>(
    record: &'r Json<'r>,
    key: &str,
    kind: Kind,
    at: &Where<'_>,
    place: &Place<'_>,
) -> Outcome<Option<&'r Json<'r>>> {
    match record.field(key) {
        None => Ok(None),
        Some(value) if kind.holds(value) => Ok(Some(value)),
        Some(value) => Err(at.fail(format_args!("{place}/{key} is {}, expected {}", value.describe(), kind.name()))),
    }
}

/// The text at `key` ("" when absent or null), which must be text.
fn text<'r>(record: &'r Json<'r>, key: &str, at: &Where<'_>, place: &Place<'_>) -> Outcome<&'r str> {
    Ok(typed(record, key, Kind::Text, at, place)?.and_then(Json::as_str).unwrap_or(""))
}

static EMPTY: Json<'static> = Json::Object(Vec::new());

/// The object at `key` (an empty one when absent, null or empty), which must be an object.
fn object<'r>(record: &'r Json<'r>, key: &str, at: &Where<'_>, place: &Place<'_>) -> Outcome<&'r Json<'r>> {
    Ok(typed(record, key, Kind::Object, at, place)?.unwrap_or(&EMPTY))
}

/// A list of objects (absent or null as empty); anything else fails, naming the offending item.
fn objects<'r>(value: Option<&'r Json<'r>>, at: &Where<'_>, place: &Place<'_>) -> Outcome<&'r [Json<'r>]> {
    match value {
        None | Some(Json::Null) => Ok(&[]),
        Some(Json::Array(items)) => {
            if let Some((index, item)) = items.iter().enumerate().find(|(_, item)| !item.is_object()) {
                return Err(at.fail(format_args!("{place}/{index} is {}, expected an object", item.describe())));
            }
            Ok(items)
        }
        Some(other) => Err(at.fail(format_args!("{place} is {}, expected a list", other.describe()))),
    }
}

/// A finite number that is not a boolean.
fn number(value: Option<&Json<'_>>) -> Option<f64> {
    value?.as_finite()
}

/// `value in (2, "STATUS_CODE_ERROR", "ERROR")`: an OpenTelemetry error status.
fn is_error_status(value: Option<&Json<'_>>) -> bool {
    value.is_some_and(|code| matches!(code.as_str(), Some("STATUS_CODE_ERROR" | "ERROR")) || code.py_eq(&Json::Int(2)))
}

/// An OTLP AnyValue (`{"stringValue": ...}`, `{"intValue": "3"}`, ...) as a plain value.
/// Protobuf's JSON mapping writes 64-bit integers as text, and non-finite doubles as
/// "NaN"/"Infinity", which are kept as text (a trace holds finite numbers only).
fn any_value<'r>(value: &'r Json<'r>, at: &Where<'_>, place: &Place<'_>, depth: usize) -> Outcome<Json<'r>> {
    if !value.is_object() {
        return Err(at.fail(format_args!("{place} is {}, expected an OTLP value object", value.describe())));
    }
    if depth > MAX_NESTING {
        return Err(at.fail(format_args!("{place} nests values deeper than {MAX_NESTING} levels")));
    }
    let has = |key: &str| value.get(key).is_some();
    if has("stringValue") || has("bytesValue") {
        let key = if has("stringValue") { "stringValue" } else { "bytesValue" };
        return Ok(typed(value, key, Kind::Text, at, place)?.cloned().unwrap_or(Json::Null));
    }
    if has("boolValue") {
        return Ok(typed(value, "boolValue", Kind::Bool, at, place)?.cloned().unwrap_or(Json::Null));
    }
    if let Some(number) = value.get("intValue") {
        return whole_number(number)
            .ok_or_else(|| at.fail(format_args!("{place}/intValue is {}, expected a whole number", py_repr(number))));
    }
    if let Some(number) = value.get("doubleValue") {
        return match number {
            Json::Str(_) => Ok(number.clone()),
            _ => self::number(Some(number)).map(Json::Float).ok_or_else(|| {
                at.fail(format_args!("{place}/doubleValue is {}, expected a number", number.describe()))
            }),
        };
    }
    if has("arrayValue") {
        let array = object(value, "arrayValue", at, place)?;
        let inner = Place::Key(place, "arrayValue");
        let items = typed(array, "values", Kind::List, at, &inner)?.map_or(&[][..], |items| match items {
            Json::Array(items) => items.as_slice(),
            _ => &[],
        });
        let values = Place::Key(&inner, "values");
        return items
            .iter()
            .enumerate()
            .map(|(index, item)| any_value(item, at, &Place::Index(&values, index), depth + 1))
            .collect::<Outcome<_>>()
            .map(Json::Array);
    }
    if has("kvlistValue") {
        let kvlist = object(value, "kvlistValue", at, place)?;
        let inner = Place::Key(place, "kvlistValue");
        return otlp_attributes(kvlist.get("values"), at, &Place::Key(&inner, "values"), depth + 1).map(Json::Object);
    }
    Ok(Json::Null)
}

/// An OTLP intValue: digits as text (an optional minus first) or a number with no fraction.
fn whole_number<'r>(number: &Json<'r>) -> Option<Json<'r>> {
    match number {
        Json::Int(_) | Json::UInt(_) => Some(number.clone()),
        Json::Str(text) => {
            let digits = text.strip_prefix('-').unwrap_or(text);
            if digits.is_empty() || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
                return None;
            }
            Some(text.parse::<i64>().map(Json::Int).or_else(|_| text.parse::<u64>().map(Json::UInt)).unwrap_or_else(
                // Beyond 64 bits: a float, which the trace refuses as no whole number would be.
                |_| Json::Float(text.parse::<f64>().unwrap_or(f64::INFINITY)),
            ))
        }
        Json::Float(x) if x.is_finite() && x.fract() == 0.0 => Some(if x.abs() < 9.2e18 {
            Json::Int(*x as i64)
        } else if (0.0..1.8e19).contains(x) {
            Json::UInt(*x as u64)
        } else {
            Json::Float(*x)
        }),
        _ => None,
    }
}

/// OTLP key-value pairs as an object's entries; each pair needs a text `key`.
fn otlp_attributes<'r>(
    values: Option<&'r Json<'r>>,
    at: &Where<'_>,
    place: &Place<'_>,
    depth: usize,
) -> Outcome<Vec<(Cow<'r, str>, Json<'r>)>> {
    let pairs = objects(values, at, place)?;
    let mut entries = Vec::with_capacity(pairs.len());
    for (index, pair) in pairs.iter().enumerate() {
        let item = Place::Index(place, index);
        let Some(Json::Str(key)) = pair.get("key") else {
            return Err(at.fail(format_args!("{item}/key is {}, expected text", describe(pair.get("key")))));
        };
        let value = match pair.field("value") {
            None => Json::Null,
            Some(value) => any_value(value, at, &Place::Key(&item, "value"), depth)?,
        };
        Json::insert(&mut entries, key.clone(), value);
    }
    Ok(entries)
}

/// Trace and span ids as lowercase hex, whichever way the writer spelled them: OTLP JSON uses
/// hex, protobuf's JSON mapping base64, the SDK's span JSON a 0x prefix. Other text is kept.
fn hex_id<'r>(value: Option<&Json<'r>>, at: &Where<'_>, place: &str) -> Outcome<Option<Cow<'r, str>>> {
    let Some(value) = value.filter(|value| value.truthy()) else { return Ok(None) };
    let text: Cow<'r, str> = match value {
        Json::Str(Cow::Borrowed(text)) => Cow::Borrowed(text),
        Json::Str(Cow::Owned(text)) => Cow::Owned(text.clone()),
        Json::Int(n) => Cow::Owned(n.to_string()),
        Json::UInt(n) => Cow::Owned(n.to_string()),
        other => return Err(at.fail(format_args!("{place} is {}, expected an id", other.describe()))),
    };
    // Lowercase hex (as OTLP exporters write ids) is kept as written: one look at each byte,
    // with no branch (a tenth of the reading took two with a branch each).
    if text.bytes().fold(true, |hex, byte| hex & matches!(byte, b'0'..=b'9' | b'a'..=b'f')) {
        return Ok(Some(text));
    }
    // Hex digits after an optional 0x (either case), lowercased in one copy.
    let prefix = if matches!(text.as_bytes(), [b'0', b'x' | b'X', ..]) { 2 } else { 0 };
    let digits = &text[prefix..];
    if digits.bytes().all(|byte| byte.is_ascii_hexdigit()) {
        return Ok(Some(Cow::Owned(digits.to_ascii_lowercase())));
    }
    Ok(Some(match base64(&text) {
        Some(raw) if raw.len() == 8 || raw.len() == 16 => {
            Cow::Owned(raw.iter().map(|byte| format!("{byte:02x}")).collect())
        }
        _ => text,
    }))
}

/// Standard base64 as Python's `b64decode(text, validate=True)` reads it: the alphabet only,
/// whole quads, padding only at the end and only where it completes the last quad.
fn base64(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(4) || bytes.first() == Some(&b'=') {
        return None;
    }
    let padding = bytes.iter().rev().take_while(|&&byte| byte == b'=').count();
    if padding > 2 {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    let (mut bits, mut count) = (0u32, 0u32);
    for &byte in &bytes[..bytes.len() - padding] {
        let value = match byte {
            b'A'..=b'Z' => byte - b'A',
            b'a'..=b'z' => byte - b'a' + 26,
            b'0'..=b'9' => byte - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        bits = (bits << 6) | u32::from(value);
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
        }
    }
    Some(out)
}

/// Epoch seconds from unix nanoseconds (OTLP), float seconds (Agent Lightning) or ISO-8601
/// (SDK JSON).
fn seconds(value: Option<&Json<'_>>, at: &Where<'_>) -> Outcome<f64> {
    let unreadable = |value: &Json<'_>| {
        at.fail(format_args!("time {} is neither nanoseconds, seconds nor ISO-8601", py_repr(value)))
    };
    match value {
        Some(value @ Json::Str(text)) if !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit()) => {
            // float(int(text)): the digits correctly rounded, like Python's.
            let nanoseconds = text.parse::<f64>().ok().filter(|x| x.is_finite()).ok_or_else(|| unreadable(value))?;
            in_range(nanoseconds / 1e9, value, at)
        }
        Some(value @ Json::Str(text)) => iso_time::seconds(text).ok_or_else(|| unreadable(value)),
        Some(value) => match number(Some(value)) {
            Some(x) => {
                let nanoseconds = match value {
                    Json::Int(n) => *n > 100_000_000_000_000,
                    Json::UInt(n) => *n > 100_000_000_000_000,
                    _ => x > 1e14,
                };
                in_range(if nanoseconds { x / 1e9 } else { x }, value, at)
            }
            None => Err(at.fail("missing or unreadable span time")),
        },
        None => Err(at.fail("missing or unreadable span time")),
    }
}

fn in_range(seconds: f64, value: &Json<'_>, at: &Where<'_>) -> Outcome<f64> {
    // Beyond the year 33000: not a time any exporter wrote.
    if (0.0..1e12).contains(&seconds) {
        Ok(seconds)
    } else {
        Err(at.fail(format_args!("time {} is out of range", py_repr(value))))
    }
}

// ---- spans ---------------------------------------------------------------------------------

struct Span<'r> {
    trace: Cow<'r, str>,
    id: Cow<'r, str>,
    parent: Option<Cow<'r, str>>,
    name: &'r str,
    start: f64,
    end: f64,
    attributes: Cow<'r, Json<'r>>,
    error: bool,
    at: Where<'r>,
    /// Span events as (name, attributes).
    events: Vec<(&'r str, Cow<'r, Json<'r>>)>,
    links: usize,
}

impl<'r> Span<'r> {
    /// The attributes the converter reads have the types it reads them as.
    fn checked(self) -> Outcome<Self> {
        let place = Place::Root("/attributes");
        typed(&self.attributes, "gen_ai.operation.name", Kind::Text, &self.at, &place)?;
        for key in ["gen_ai.agent.name", "gen_ai.agent.id"] {
            match self.attributes.field(key) {
                None | Some(Json::Str(_) | Json::Int(_) | Json::UInt(_) | Json::Bool(_)) => {}
                Some(other) => {
                    return Err(self.at.fail(format_args!("/attributes/{key} is {}, expected text", other.describe())));
                }
            }
        }
        for key in USAGE_KEYS {
            if let Some(count) = self.attributes.field(key)
                && token_count(count).is_none()
            {
                return Err(self
                    .at
                    .fail(format_args!("/attributes/{key} is {}, expected a whole number of tokens", py_repr(count))));
            }
        }
        Ok(self)
    }

    fn operation(&self) -> Option<&str> {
        self.attributes.str("gen_ai.operation.name")
    }

    /// `gen_ai.agent.name or gen_ai.agent.id`, as text.
    fn agent_name(&self) -> Option<Cow<'_, str>> {
        let name = self
            .attributes
            .truthy_field("gen_ai.agent.name")
            .or_else(|| self.attributes.get("gen_ai.agent.id"))
            .filter(|name| !matches!(name, Json::Null))?;
        Some(match name {
            Json::Bool(flag) => Cow::Borrowed(if *flag { "True" } else { "False" }),
            other => py_str(other),
        })
    }

    /// Input + output tokens, on whatever span reports them; `None` when it reports none.
    fn tokens(&self) -> Option<i128> {
        USAGE_KEYS
            .iter()
            .filter_map(|key| self.attributes.field(key).and_then(token_count))
            .fold(None, |sum, count| Some(sum.unwrap_or(0) + count))
    }

    /// The span's recorded exceptions (OpenTelemetry's `exception` events), type and message.
    fn exceptions(&self) -> Option<Json<'r>> {
        let found: Vec<Json<'r>> = self
            .events
            .iter()
            .filter(|(name, _)| *name == EXCEPTION_EVENT)
            .map(|(_, attributes)| {
                let entries = ["type", "message"]
                    .iter()
                    .filter_map(|key| {
                        let value = attributes.get(&format!("exception.{key}"))?;
                        Some((Cow::Borrowed(*key), value.clone()))
                    })
                    .collect();
                Json::Object(entries)
            })
            .collect();
        (!found.is_empty()).then_some(Json::Array(found))
    }
}

/// A token count: a whole, non-negative, finite number.
fn token_count(count: &Json<'_>) -> Option<i128> {
    match count {
        Json::Int(n) if *n >= 0 => Some(i128::from(*n)),
        Json::UInt(n) => Some(i128::from(*n)),
        Json::Float(x) if x.is_finite() && *x >= 0.0 && x.fract() == 0.0 => Some(*x as i128),
        _ => None,
    }
}

/// A span found in a document, read (in parallel with the others) once all are found.
enum Found<'r> {
    Otlp(Where<'r>, &'r Json<'r>),
    Flat(Where<'r>, &'r Json<'r>),
}

/// The spans of a document, in the order they were read. Errors come in document order: the
/// first broken span, or the first record or list of spans that is no object or list.
fn spans<'r>(name: &'r str, document: &'r Document<'r>) -> Outcome<Vec<Span<'r>>> {
    let at = Where { source: name, line: None, item: None, otlp: None };
    let items: Vec<(Where<'r>, &'r Json<'r>)> = match document {
        Document::One(Json::Array(items)) => {
            items.iter().enumerate().map(|(index, item)| (Where { item: Some(index), ..at }, item)).collect()
        }
        Document::One(item) => vec![(at, item)],
        Document::Lines(records) => {
            records.iter().map(|record| (Where { line: Some(record.line), ..at }, &record.value)).collect()
        }
    };
    let mut found = Vec::new();
    let mut broken = None;
    for (at, item) in items {
        let listed = if !item.is_object() {
            Err(at.fail(format_args!("expected an object, got {}", item.python_type())))
        } else if item.get("resourceSpans").is_some() {
            otlp_spans(item, at, &mut found)
        } else {
            found.push(Found::Flat(at, item));
            Ok(())
        };
        if let Err(error) = listed {
            broken = Some(error);
            break;
        }
    }
    let read = super::shared_map(&found, super::SHARE, |found| match *found {
        Found::Otlp(at, span) => otlp_span(span, at),
        Found::Flat(at, record) => flat_span(record, at),
    });
    let spans = read.into_iter().collect::<Outcome<Vec<_>>>()?;
    broken.map_or(Ok(spans), Err)
}

/// The spans of an OTLP export, found in order; a list that is not one of objects fails.
fn otlp_spans<'r>(document: &'r Json<'r>, at: Where<'r>, found: &mut Vec<Found<'r>>) -> Outcome<()> {
    let root = Place::Root("/resourceSpans");
    for (r, resource) in objects(document.get("resourceSpans"), &at, &root)?.iter().enumerate() {
        let resource_at = Place::Index(&root, r);
        let scopes_at = Place::Key(&resource_at, "scopeSpans");
        for (s, scope) in objects(resource.get("scopeSpans"), &at, &scopes_at)?.iter().enumerate() {
            let scope_at = Place::Index(&scopes_at, s);
            for (i, span) in objects(scope.get("spans"), &at, &Place::Key(&scope_at, "spans"))?.iter().enumerate() {
                found.push(Found::Otlp(Where { otlp: Some((r, s, i)), ..at }, span));
            }
        }
    }
    Ok(())
}

fn otlp_span<'r>(span: &'r Json<'r>, here: Where<'r>) -> Outcome<Span<'r>> {
    let root = Place::Root("");
    let trace = hex_id(span.get("traceId"), &here, "/traceId")?;
    let id = hex_id(span.get("spanId"), &here, "/spanId")?;
    let (Some(trace), Some(id)) = (trace.filter(|t| !t.is_empty()), id.filter(|i| !i.is_empty())) else {
        return Err(here.fail("span without traceId or spanId"));
    };
    let events_at = Place::Root("/events");
    let events = objects(span.get("events"), &here, &events_at)?;
    let parent = hex_id(span.get("parentSpanId"), &here, "/parentSpanId")?;
    let name = text(span, "name", &here, &root)?;
    let start = seconds(span.get("startTimeUnixNano"), &here)?;
    let end = seconds(span.get("endTimeUnixNano"), &here)?;
    let attributes = otlp_attributes(span.get("attributes"), &here, &Place::Root("/attributes"), 0)?;
    let error = is_error_status(object(span, "status", &here, &root)?.get("code"));
    let events = events
        .iter()
        .enumerate()
        .map(|(k, event)| {
            let event_at = Place::Index(&events_at, k);
            let name = text(event, "name", &here, &event_at)?;
            let attributes = otlp_attributes(event.get("attributes"), &here, &Place::Key(&event_at, "attributes"), 0)?;
            Ok((name, Cow::Owned(Json::Object(attributes))))
        })
        .collect::<Outcome<_>>()?;
    let links = objects(span.get("links"), &here, &Place::Root("/links"))?.len();
    Span {
        trace,
        id,
        parent,
        name,
        start,
        end,
        attributes: Cow::Owned(Json::Object(attributes)),
        error,
        at: here,
        events,
        links,
    }
    .checked()
}

/// A span as the SDK's `ReadableSpan.to_json` or Agent Lightning's `Span` writes it.
fn flat_span<'r>(record: &'r Json<'r>, at: Where<'r>) -> Outcome<Span<'r>> {
    let root = Place::Root("");
    let context = object(record, "context", &at, &root)?;
    let parent = match record.truthy_field("parent_id") {
        Some(parent) => Some(parent),
        None => object(record, "parent", &at, &root)?.get("span_id"),
    };
    let rollout =
        typed(record, "rollout_id", Kind::Text, &at, &root)?.and_then(Json::as_str).filter(|id| !id.is_empty());
    let trace = match rollout {
        Some(rollout) => Some(Cow::Borrowed(rollout)),
        None => hex_id(record.truthy_field("trace_id").or_else(|| context.get("trace_id")), &at, "/trace_id")?,
    };
    let id = hex_id(record.truthy_field("span_id").or_else(|| context.get("span_id")), &at, "/span_id")?;
    let (Some(trace), Some(id)) = (trace.filter(|t| !t.is_empty()), id.filter(|i| !i.is_empty())) else {
        return Err(at.fail("span without a trace id or span id"));
    };
    let status = object(record, "status", &at, &root)?;
    let events_at = Place::Root("/events");
    let events = objects(record.get("events"), &at, &events_at)?;
    let parent = hex_id(parent, &at, "/parent_id")?;
    let name = text(record, "name", &at, &root)?;
    let start = seconds(record.get("start_time"), &at)?;
    let end = seconds(record.get("end_time"), &at)?;
    let attributes = object(record, "attributes", &at, &root)?;
    let error = is_error_status(status.get("status_code"));
    let events = events
        .iter()
        .enumerate()
        .map(|(k, event)| {
            let event_at = Place::Index(&events_at, k);
            Ok((text(event, "name", &at, &event_at)?, Cow::Borrowed(object(event, "attributes", &at, &event_at)?)))
        })
        .collect::<Outcome<_>>()?;
    let links = match typed(record, "links", Kind::List, &at, &root)? {
        Some(Json::Array(links)) => links.len(),
        _ => 0,
    };
    Span { trace, id, parent, name, start, end, attributes: Cow::Borrowed(attributes), error, at, events, links }
        .checked()
}

/// Reward channels of an Agent Lightning reward span, across its attribute conventions.
fn rewards(span: &Span<'_>) -> Outcome<NamedNumbers> {
    let attributes = &span.attributes;
    let mut rewards: NamedNumbers = Vec::new();
    if let Json::Object(entries) = attributes.as_ref() {
        for (key, value) in entries {
            let Some(rest) = key.strip_prefix(REWARD_SPAN).and_then(|rest| rest.strip_prefix('.')) else { continue };
            if key.contains(".metadata") {
                continue;
            }
            let named =
                rest.strip_suffix(".value").and_then(|stem| attributes.get(&format!("{REWARD_SPAN}.{stem}.name")));
            if let Some(name) = named {
                let Some(value) = number(Some(value)) else {
                    return Err(span
                        .at
                        .fail(format_args!("/attributes/{key} is {}, expected a finite number", py_repr(value))));
                };
                set_reward(&mut rewards, py_str(name), value);
            } else if !rest.ends_with(".name")
                && let Some(value) = number(Some(value))
            {
                set_reward(&mut rewards, rest, value);
            }
        }
    }
    if let Some(Json::Str(output)) = attributes.get("agentops.task.output")
        && let Ok(parsed) = super::parse_line(output.as_bytes(), &Keep::All)
        && parsed.is_object()
        && parsed.get("type").is_some_and(|kind| kind.as_str() == Some("reward"))
        && let Some(value) = number(parsed.get("value"))
    {
        set_reward(&mut rewards, "primary", value);
    }
    // Python's `setdefault`: a primary channel already read keeps its value.
    if let Some(value) = number(attributes.get("reward"))
        && !rewards.iter().any(|(name, _)| name == "primary")
    {
        rewards.push(("primary".to_owned(), value));
    }
    Ok(rewards)
}

// ---- one trace -----------------------------------------------------------------------------

struct OtelTrace<'c, 'r> {
    trace_id: &'c str,
    report: &'c mut Report,
    /// The first span of each id, by start then end time.
    spans: Vec<&'c Span<'r>>,
    /// Each span's parent among `spans`, when the export holds it.
    parents: Vec<Option<usize>>,
    /// Each span's `gen_ai.operation.name` (looked up once: a span's attributes are a list).
    operations: Vec<Option<&'c str>>,
    /// The agent each invoke_agent span with an agent name runs (looked up once: ancestor
    /// walks ask for it at every step).
    runs: Vec<Option<Cow<'c, str>>>,
    start: f64,
    builder: Builder<'c>,
    /// Each span's first and last event.
    first: Vec<Option<usize>>,
    last: Vec<Option<usize>>,
    /// Spans whose usage and exceptions are on an event.
    reported: Vec<bool>,
    reward_spans: Vec<usize>,
    /// The agent each span acts for (`user` outside every agent run).
    agent_of: Vec<Cow<'c, str>>,
    roles: HashMap<Cow<'c, str>, &'static str>,
    /// Spawn events by the agent they spawn; invoking messages with the agent they invoke.
    spawns: HashMap<Cow<'c, str>, usize>,
    invocations: Vec<(usize, Cow<'c, str>)>,
    /// Marks of the spans one ancestor walk has seen (a walk's number), to stop at a loop.
    seen: Vec<u32>,
    walk: u32,
}

impl<'c, 'r> OtelTrace<'c, 'r> {
    fn new(trace_id: &'c str, members: &[&'c Span<'r>], report: &'c mut Report) -> Self {
        // Each kept span's place among the kept ones, by id (each id hashed once here, and once
        // per child naming it as its parent).
        let mut kept_at: HashMap<&str, usize> = HashMap::with_capacity_and_hasher(members.len(), Default::default());
        let mut kept: Vec<&'c Span<'r>> = Vec::with_capacity(members.len());
        for &span in members {
            match kept_at.entry(span.id.as_ref()) {
                Entry::Occupied(first) => report.warnings.push(format!(
                    "{}: span {} repeats the id of the span at {}; set aside",
                    span.at,
                    repr(&span.id),
                    kept[*first.get()].at
                )),
                Entry::Vacant(slot) => {
                    slot.insert(kept.len());
                    kept.push(span);
                }
            }
        }
        // Python's order of (start, end) pairs, stable: -0.0 and 0.0 are equal.
        let mut order: Vec<usize> = (0..kept.len()).collect();
        order.sort_by(|&a, &b| {
            let (a, b) = (kept[a], kept[b]);
            a.start.partial_cmp(&b.start).unwrap_or(Equal).then(a.end.partial_cmp(&b.end).unwrap_or(Equal))
        });
        let mut rank = vec![0; kept.len()];
        for (at, &slot) in order.iter().enumerate() {
            rank[slot] = at;
        }
        let spans: Vec<&'c Span<'r>> = order.iter().map(|&slot| kept[slot]).collect();
        let parents = spans
            .iter()
            .map(|span| {
                let parent = span.parent.as_deref().filter(|parent| !parent.is_empty())?;
                kept_at.get(parent).map(|&slot| rank[slot])
            })
            .collect();
        let operations: Vec<Option<&'c str>> = spans.iter().map(|span| span.operation()).collect();
        let runs = spans
            .iter()
            .zip(&operations)
            .map(|(span, operation)| {
                (*operation == Some("invoke_agent"))
                    .then(|| span.agent_name())
                    .flatten()
                    .filter(|name| !name.is_empty())
            })
            .collect();
        let start = spans.iter().map(|span| span.start).fold(f64::INFINITY, f64::min);
        let count = spans.len();
        let mut builder = Builder::writing_attributes(trace_id);
        // Most spans make one or two events.
        builder.reserve(2 * count);
        let mut trace = OtelTrace {
            trace_id,
            report,
            spans,
            parents,
            operations,
            runs,
            start,
            builder,
            first: vec![None; count],
            last: vec![None; count],
            reported: vec![false; count],
            reward_spans: Vec::new(),
            agent_of: Vec::with_capacity(count),
            roles: HashMap::default(),
            spawns: HashMap::default(),
            invocations: Vec::new(),
            seen: vec![0; count],
            walk: 0,
        };
        trace.agent_roles();
        trace
    }

    /// The nearest ancestor (parent, grandparent, ...) that is `wanted`; the walk stops at a
    /// parent missing from the export (a partial export) and at a loop of parent ids.
    fn nearest(&mut self, span: usize, wanted: impl Fn(&Self, usize) -> bool) -> Option<usize> {
        self.walk += 1;
        self.seen[span] = self.walk;
        let mut at = span;
        while let Some(parent) = self.parents[at] {
            if self.seen[parent] == self.walk {
                return None;
            }
            self.seen[parent] = self.walk;
            if wanted(self, parent) {
                return Some(parent);
            }
            at = parent;
        }
        None
    }

    /// The agent each span acts for (the agent name of the nearest enclosing invoke_agent
    /// span), and each agent's role: orchestrator when some run of it is inside no other
    /// agent's, else sub-agent.
    fn agent_roles(&mut self) {
        for span in 0..self.spans.len() {
            let agent = match self.nearest(span, |trace, at| trace.runs[at].is_some()) {
                Some(run) => self.runs[run].clone().unwrap_or_default(),
                None => Cow::Borrowed(USER),
            };
            self.agent_of.push(agent);
            if let Some(name) = &self.runs[span] {
                let top = self.agent_of[span] == USER || self.roles.get(name.as_ref()) == Some(&ORCHESTRATOR);
                self.roles.insert(name.clone(), if top { ORCHESTRATOR } else { SUB_AGENT });
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn event(
        &mut self,
        span: usize,
        suffix: &str,
        t: f64,
        kind: EventType,
        agent: &str,
        fields: Vec<(&'static str, Out<'c>)>,
    ) -> usize {
        let this = self.spans[span];
        let (mut tokens, mut exceptions) = (None, None);
        if !self.reported[span] && suffix != ":start" {
            // The span's first event carries what the whole span reports: its token usage (on
            // any operation: an invoke_agent span may report usage its chats do not) and the
            // exceptions it recorded; an agent run's are on its return, the run's own work,
            // not on the message that started it.
            self.reported[span] = true;
            tokens = this.tokens().map(|tokens| ("tokens", Out::Value(integer(tokens))));
            exceptions = this.exceptions().map(|exceptions| ("exceptions", Out::Json(exceptions)));
        }
        let role = match kind {
            _ if fields.iter().any(|(key, _)| *key == "role") => None,
            EventType::ToolResult => Some(TOOL),
            _ => self.roles.get(agent).copied(),
        };
        // The fields in the event's order, handed over as they come (no list made per event).
        let all = std::iter::once(("span_name", Out::Str(this.name)))
            .chain(fields)
            .chain(tokens)
            .chain(exceptions)
            .chain(role.map(|role| ("role", Out::Str(role))));
        let id = [this.id.as_ref(), suffix].concat();
        let index = self.builder.event(id, t - self.start, kind, agent, all);
        self.first[span].get_or_insert(index);
        self.last[span] = Some(index);
        index
    }

    fn convert_span(&mut self, span: usize) {
        let this = self.spans[span];
        let caller = self.agent_of[span].clone();
        let duration = Out::Float((this.end - this.start).max(0.0));
        // The caller outside every agent run is the user (or the application) asking.
        let asking = || (caller == USER).then(|| ("role", Out::Str(USER)));
        let extra = || {
            let attributes = this.attributes.as_ref();
            let attributes = (attributes.truthy()).then_some(("span_attributes", Out::Raw(Some(attributes))));
            let error = this.error.then_some(("status_error", Out::Value(Value::Bool(true))));
            attributes.into_iter().chain(error)
        };
        match self.operations[span] {
            Some("create_agent") => {
                let to = this.agent_name();
                let mut fields: Vec<_> = to.clone().map(|to| ("to", Out::Text(to.into_owned()))).into_iter().collect();
                fields.push(("duration_s", duration));
                fields.extend(asking());
                fields.extend(extra());
                let index = self.event(span, "", this.start, EventType::Spawn, &caller, fields);
                if let Some(to) = to {
                    self.spawns.insert(to, index);
                }
            }
            Some("invoke_agent") => {
                let agent = self.runs[span].clone().unwrap_or_else(|| caller.clone());
                let mut fields = vec![
                    ("from", Out::Text(caller.to_string())),
                    ("to", Out::Text(agent.to_string())),
                    ("kind", Out::Str("invoke_agent")),
                ];
                fields.extend(asking());
                fields.extend(extra());
                let message = self.event(span, ":start", this.start, EventType::Message, &caller, fields);
                self.invocations.push((message, agent.clone()));
                let fields = vec![
                    ("from", Out::Text(agent.to_string())),
                    ("to", Out::Text(caller.to_string())),
                    ("duration_s", duration),
                ];
                self.event(span, ":end", this.end, EventType::Return, &agent, fields);
            }
            Some(operation) if TOOL_OPERATIONS.contains(&operation) => {
                let attributes = &this.attributes;
                let tool = match attributes
                    .truthy_field("gen_ai.tool.name")
                    .or_else(|| attributes.truthy_field("gen_ai.data_source.id"))
                {
                    Some(name) => py_str(name).into_owned(),
                    None => this.name.to_owned(),
                };
                let mut fields = vec![("tool", Out::Text(tool.clone()))];
                fields.extend(extra());
                let call = self.event(span, ":call", this.start, EventType::ToolCall, &caller, fields);
                let mut fields = vec![("tool", Out::Text(tool.clone())), ("duration_s", duration)];
                if this.error {
                    fields.push(("is_error", Out::Value(Value::Bool(true))));
                }
                let result = self.event(span, ":result", this.end, EventType::ToolResult, &tool, fields);
                self.builder.edge(Some(call), Some(result), EdgeType::Return);
                if this.error {
                    let fields = vec![("tool", Out::Text(tool.clone())), ("reason", Out::Str("tool_error"))];
                    let flag = self.event(span, ":error", this.end, EventType::SafetyEvent, &caller, fields);
                    self.builder.edge(Some(result), Some(flag), EdgeType::SafetyFlow);
                }
            }
            Some(operation) if MESSAGE_OPERATIONS.contains(&operation) => {
                let attributes = &this.attributes;
                let model =
                    attributes.truthy_field("gen_ai.response.model").or_else(|| attributes.get("gen_ai.request.model"));
                let mut fields =
                    vec![("from", Out::Text(caller.to_string())), ("model", Out::Raw(model)), ("duration_s", duration)];
                fields.extend(extra());
                self.event(span, "", this.start, EventType::Message, &caller, fields);
            }
            Some("apply_guardrail") => {
                let mut fields = vec![("kind", Out::Str("guardrail")), ("duration_s", duration)];
                fields.extend(extra());
                self.event(span, "", this.start, EventType::SafetyEvent, &caller, fields);
            }
            _ if this.name == REWARD_SPAN => self.reward_spans.push(span),
            None if IGNORED_SPANS.contains(&this.name) => {
                Report::count(&mut self.report.ignored, &["span ", this.name])
            }
            Some(operation) if !operation.is_empty() => {
                Report::count(&mut self.report.unknown, &["gen_ai.operation.name ", operation]);
            }
            _ => Report::count(&mut self.report.unknown, &["span without gen_ai.operation.name"]),
        }
    }

    /// Span events and links have no place in a trace: counted, so none vanish silently (a
    /// mapped span's exception events are on its first event instead).
    fn count_set_aside(&mut self, span: usize) {
        let this = self.spans[span];
        for (name, _) in &this.events {
            if *name != EXCEPTION_EVENT || !self.reported[span] {
                Report::count(&mut self.report.ignored, &["span event ", name]);
            }
        }
        if this.links > 0 {
            Report::add(&mut self.report.ignored, &["span link"], this.links);
        }
    }

    fn link(&mut self) {
        // Children of each mapped span (None: of no mapped span), in the order first seen.
        let mut children: Vec<(Option<usize>, Vec<usize>)> = Vec::with_capacity(self.spans.len());
        let mut slot: HashMap<Option<usize>, usize> =
            HashMap::with_capacity_and_hasher(self.spans.len(), Default::default());
        for span in 0..self.spans.len() {
            if self.first[span].is_some() {
                let parent = self.nearest(span, |trace, at| trace.first[at].is_some());
                let at = *slot.entry(parent).or_insert_with(|| {
                    children.push((parent, Vec::new()));
                    children.len() - 1
                });
                children[at].1.push(span);
            }
        }
        for (parent, kids) in children {
            for pair in kids.windows(2) {
                if self.spans[pair[0]].end <= self.spans[pair[1]].start {
                    self.builder.edge(self.last[pair[0]], self.first[pair[1]], EdgeType::Temporal);
                }
            }
            let Some(parent) = parent else { continue };
            for kid in kids {
                self.builder.edge(self.first[parent], self.first[kid], EdgeType::Causal);
                if self.last[parent] != self.first[parent] {
                    self.builder.edge(self.last[kid], self.last[parent], EdgeType::Return);
                }
            }
        }
        for (message, agent) in std::mem::take(&mut self.invocations) {
            if let Some(&spawn) = self.spawns.get(&agent) {
                self.builder.edge(Some(spawn), Some(message), EdgeType::Spawn);
            }
        }
    }

    /// Rewards each reward span's preceding event; the last reward span's are the trace's.
    fn reward(&mut self) -> Outcome<NamedNumbers> {
        let mut finished: Vec<(f64, usize)> =
            (0..self.spans.len()).filter_map(|span| Some((self.spans[span].end, self.last[span]?))).collect();
        finished.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(Equal));
        let mut found = Vec::new();
        for &span in &self.reward_spans {
            let this = self.spans[span];
            found = rewards(this)?;
            if found.is_empty() {
                self.report.warnings.push(format!(
                    "{}: reward span {} carries no reward value",
                    this.at,
                    repr(&this.id)
                ));
            }
            let before = finished.partition_point(|(end, _)| *end <= this.start);
            if before > 0 && !found.is_empty() {
                self.builder.add_reward(finished[before - 1].1, &found);
            }
        }
        Ok(found)
    }

    /// The trace and its events' attributes (or what the data contract refuses in the trace);
    /// `None` when no span made an event.
    fn build(mut self) -> Outcome<Option<Result<(Trace, Attributes), ValidationError>>> {
        for span in 0..self.spans.len() {
            self.convert_span(span);
            self.count_set_aside(span);
        }
        if self.builder.events.is_empty() {
            return Ok(None);
        }
        self.link();
        let rewards = self.reward()?;
        let end = self.spans.iter().map(|span| span.end).fold(f64::NEG_INFINITY, f64::max);
        let head = Head {
            task_id: self.trace_id,
            system: "opentelemetry",
            topology: Topology::Hierarchical,
            wall_clock_s: end - self.start,
            tokens: None,
            rewards,
            metrics: None,
            attributes: Map::new(),
        };
        Ok(Some(self.builder.build_with_attributes(head)))
    }
}
