//! An OTLP JSON export read straight into spans, in one pass over the text: no value tree of
//! the whole document (its objects for every attribute pair and value were most of a
//! conversion's reading, and a tenth more to free).
//!
//! Only the shape exporters write is read this way: each field of the type it should have,
//! each once, every attribute value one of OTLP's kinds. Anything else (JSON Lines, flat
//! spans, a repeated key, a value of an odd type, a span the converter refuses) stops the
//! reading with no verdict, and [`super::convert_text`] reads the text the general way,
//! whose answer (spans or the error naming the first bad place) is the converter's. What
//! this reading accepts, it reads as the general one does: the same functions make each
//! span's ids, times, status and values.
//!
//! The text is read by a [`Cursor`] that knows the shape, not through serde's visitors
//! (whose calls were most of this reading's time). It takes JSON's grammar strictly and
//! leaves the strings with escapes and the numbers other than small integers to serde_json,
//! so what it reads is what serde_json reads; what it is unsure of stops the reading.

use std::borrow::Cow;

use super::{MAX_NESTING, Span, Where, hex_id, is_error_status, seconds, whole_number};
use crate::convert::json::scan::{number, number_length};
use crate::convert::json::{Json, first_special};

/// The spans of an OTLP export in `text` (or of JSON Lines of exports, as the Collector's
/// file exporter writes them) as the general reading would find them, or `None` when the text
/// is not in the common shape (or holds something the converter refuses).
pub(super) fn spans<'r>(source: &'r str, bytes: &'r [u8]) -> Option<Vec<Span<'r>>> {
    let text = std::str::from_utf8(bytes).ok()?;
    let whole = Where { source, line: None, item: None, otlp: None };
    // Room for a span every 256 bytes, more than exporters write (ids and times alone are ~150
    // bytes): the list is not copied as it grows, and the room it leaves is never touched.
    let mut found = Vec::with_capacity(bytes.len() / 256);
    if export(text, whole, &mut found).is_some() {
        return Some(found);
    }
    // Two or more exports, one a line, are no single document: the general reading reads them
    // as JSON Lines, numbered as `json_lines` numbers them (one line alone would have been the
    // document itself).
    found.clear();
    let mut exports = 0;
    for (index, line) in text.split('\n').enumerate() {
        if line.bytes().all(|byte| matches!(byte, b' ' | b'\t' | b'\r' | 0x0b | 0x0c)) {
            continue;
        }
        exports += 1;
        export(line, Where { line: Some(index + 1), ..whole }, &mut found)?;
    }
    (exports > 1).then_some(found)
}

// ---- the export's nesting: resourceSpans / scopeSpans / spans -----------------------------

/// The spans of one export, added to `found`; `None` when it is not in the common shape.
fn export<'r>(text: &'r str, at: Where<'r>, found: &mut Vec<Span<'r>>) -> Option<()> {
    let mut cursor = Cursor { text, at: 0, depth: 0 };
    let resources = list_member(&mut cursor, "resourceSpans", |cursor, resource| {
        list_member(cursor, "scopeSpans", |cursor, scope| scope_spans(cursor, at, (resource, scope), found))?;
        Some(())
    })?;
    (resources == 1 && cursor.end()).then_some(())
}

/// The spans of scope `scope` of resource `resource` in the export read from `at`, added to
/// `found`.
fn scope_spans<'r>(
    cursor: &mut Cursor<'r>,
    at: Where<'r>,
    (resource, scope): (usize, usize),
    found: &mut Vec<Span<'r>>,
) -> Option<()> {
    list_member(cursor, "spans", |cursor, index| {
        found.push(span(cursor, Where { otlp: Some((resource, scope, index)), ..at })?);
        Some(())
    })?;
    Some(())
}

/// An object of which only member `name` is read, a list whose items `item` reads (the other
/// members skipped); how many times `name` came (0 or 1: a second is odd).
fn list_member<'r>(
    cursor: &mut Cursor<'r>,
    name: &str,
    mut item: impl FnMut(&mut Cursor<'r>, usize) -> Option<()>,
) -> Option<u16> {
    let mut seen = 0;
    cursor.object(|cursor, key| {
        if key != name {
            return cursor.skip();
        }
        first(&mut seen, 1)?;
        cursor.list(&mut item)
    })?;
    Some(seen)
}

/// Marks `field` as read; a field read twice is odd (the general reading keeps the last).
fn first(seen: &mut u16, field: u16) -> Option<()> {
    if *seen & field != 0 {
        return None;
    }
    *seen |= field;
    Some(())
}

// ---- one span ------------------------------------------------------------------------------

const TRACE_ID: u16 = 1;
const SPAN_ID: u16 = 2;
const PARENT: u16 = 4;
const NAME: u16 = 8;
const START: u16 = 16;
const END: u16 = 32;
const ATTRIBUTES: u16 = 64;
const STATUS: u16 = 128;
const EVENTS: u16 = 256;
const LINKS: u16 = 512;

/// A span's fields, made into a [`Span`] by the functions the general reading uses.
fn span<'r>(cursor: &mut Cursor<'r>, at: Where<'r>) -> Option<Span<'r>> {
    let (mut trace, mut id, mut parent, mut start, mut end) = (None, None, None, None, None);
    let (mut name, mut attributes, mut error, mut events, mut links) = ("", Vec::new(), false, Vec::new(), 0);
    let mut seen = 0;
    cursor.object(|cursor, key| {
        let field = match key {
            "traceId" => TRACE_ID,
            "spanId" => SPAN_ID,
            "parentSpanId" => PARENT,
            "name" => NAME,
            "startTimeUnixNano" => START,
            "endTimeUnixNano" => END,
            "attributes" => ATTRIBUTES,
            "status" => STATUS,
            "events" => EVENTS,
            "links" => LINKS,
            _ => return cursor.skip(),
        };
        first(&mut seen, field)?;
        match field {
            TRACE_ID => trace = Some(cursor.scalar()?),
            SPAN_ID => id = Some(cursor.scalar()?),
            PARENT => parent = Some(cursor.scalar()?),
            NAME => name = borrowed_text(cursor.scalar()?)?,
            START => start = Some(cursor.scalar()?),
            END => end = Some(cursor.scalar()?),
            ATTRIBUTES => attributes = pairs(cursor, 0)?,
            STATUS => error = status(cursor)?,
            EVENTS => events = span_events(cursor)?,
            _ => links = span_links(cursor)?,
        }
        Some(())
    })?;
    let id_of = |value: Option<Json<'r>>, place| hex_id(value.as_ref(), &at, place).ok().flatten();
    let (Some(trace), Some(id)) = (id_of(trace, "/traceId"), id_of(id, "/spanId")) else { return None };
    if trace.is_empty() || id.is_empty() {
        return None;
    }
    let parent = hex_id(parent.as_ref(), &at, "/parentSpanId").ok()?;
    let start = seconds(start.as_ref(), &at).ok()?;
    let end = seconds(end.as_ref(), &at).ok()?;
    let attributes = Cow::Owned(Json::Object(attributes));
    Span { trace, id, parent, name, start, end, attributes, error, at, events, links }.checked().ok()
}

/// A name as the span keeps it: borrowed text, or "" for null.
fn borrowed_text(value: Json<'_>) -> Option<&str> {
    match value {
        Json::Str(Cow::Borrowed(text)) => Some(text),
        Json::Null => Some(""),
        _ => None,
    }
}

/// A span's status: whether its code is OpenTelemetry's error code.
fn status(cursor: &mut Cursor<'_>) -> Option<bool> {
    let (mut code, mut seen) = (None, 0);
    cursor.object(|cursor, key| {
        if key != "code" {
            return cursor.skip();
        }
        first(&mut seen, 1)?;
        code = Some(cursor.scalar()?);
        Some(())
    })?;
    Some(is_error_status(code.as_ref()))
}

/// A span's events as (name, attributes).
fn span_events<'r>(cursor: &mut Cursor<'r>) -> Option<Vec<(&'r str, Cow<'r, Json<'r>>)>> {
    let mut events = Vec::new();
    cursor.list(|cursor, _| {
        let (mut name, mut attributes, mut seen) = ("", Vec::new(), 0);
        cursor.object(|cursor, key| {
            match key {
                "name" => {
                    first(&mut seen, 1)?;
                    name = borrowed_text(cursor.scalar()?)?;
                }
                "attributes" => {
                    first(&mut seen, 2)?;
                    attributes = pairs(cursor, 0)?;
                }
                _ => cursor.skip()?,
            }
            Some(())
        })?;
        events.push((name, Cow::Owned(Json::Object(attributes))));
        Some(())
    })?;
    Some(events)
}

/// A span's links, counted (each must be an object; what it holds is not read).
fn span_links(cursor: &mut Cursor<'_>) -> Option<usize> {
    let mut count = 0;
    cursor.list(|cursor, _| {
        count += 1;
        cursor.object(|cursor, _| cursor.skip())
    })?;
    Some(count)
}

// ---- attributes ----------------------------------------------------------------------------

type Entries<'r> = Vec<(Cow<'r, str>, Json<'r>)>;

/// OTLP key-value pairs at nesting `depth` as an object's entries (a repeated key takes its
/// earlier one's place, as in the general reading).
fn pairs<'r>(cursor: &mut Cursor<'r>, depth: usize) -> Option<Entries<'r>> {
    // Spans carry a handful of attributes.
    let mut entries = Vec::with_capacity(8);
    // The key lengths seen (modulo 64): a key of a length not seen yet is new, with no look
    // at the earlier ones.
    let mut lengths = 0u64;
    cursor.list(|cursor, _| {
        let (key, value) = pair(cursor, depth)?;
        let length = 1 << (key.len() % 64);
        if lengths & length == 0 {
            entries.push((key, value));
        } else {
            Json::insert(&mut entries, key, value);
        }
        lengths |= length;
        Some(())
    })?;
    Some(entries)
}

/// One `{"key": ..., "value": {...}}` pair at nesting `depth`.
fn pair<'r>(cursor: &mut Cursor<'r>, depth: usize) -> Option<(Cow<'r, str>, Json<'r>)> {
    let (mut key, mut value, mut seen) = (None, Json::Null, 0);
    cursor.object(|cursor, name| {
        match name {
            "key" => {
                first(&mut seen, 1)?;
                key = Some(cursor.string()?);
            }
            "value" => {
                first(&mut seen, 2)?;
                value = any_value(cursor, depth)?;
            }
            _ => cursor.skip()?,
        }
        Some(())
    })?;
    Some((key?, value))
}

/// An OTLP AnyValue at nesting `depth` with one of its kinds (or none), as a plain value (as
/// `any_value` makes it).
fn any_value<'r>(cursor: &mut Cursor<'r>, depth: usize) -> Option<Json<'r>> {
    if depth > MAX_NESTING {
        return None;
    }
    // No kind at all: null, as in the general reading; a second kind is odd.
    let mut value = None;
    cursor.object(|cursor, kind| {
        if value.is_some() {
            return None;
        }
        value = Some(match kind {
            "stringValue" | "bytesValue" => Json::Str(cursor.string()?),
            "boolValue" => match cursor.scalar()? {
                flag @ Json::Bool(_) => flag,
                _ => return None,
            },
            "intValue" => whole_number(&cursor.scalar()?)?,
            "doubleValue" => match cursor.scalar()? {
                text @ Json::Str(_) => text,
                number => Json::Float(number.as_finite()?),
            },
            "arrayValue" => Json::Array(values(cursor, |cursor| {
                let mut items = Vec::new();
                cursor.list(|cursor, _| {
                    items.push(any_value(cursor, depth + 1)?);
                    Some(())
                })?;
                Some(items)
            })?),
            "kvlistValue" => Json::Object(values(cursor, |cursor| pairs(cursor, depth + 1))?),
            _ => return None,
        });
        Some(())
    })?;
    Some(value.unwrap_or(Json::Null))
}

/// `{"values": [...]}` of an arrayValue or kvlistValue, the list read by `read`.
fn values<'r, T>(cursor: &mut Cursor<'r>, read: impl FnOnce(&mut Cursor<'r>) -> Option<T>) -> Option<T> {
    let (mut read, mut found) = (Some(read), None);
    cursor.object(|cursor, key| {
        // `values` alone: another key, or a second one, is odd.
        let read = read.take().filter(|_| key == "values")?;
        found = Some(read(cursor)?);
        Some(())
    })?;
    found
}

// ---- the text ------------------------------------------------------------------------------

/// Levels of objects and arrays the cursor reads (serde_json's recursion limit): deeper text,
/// which the general reading may refuse, is odd here, skipped values included.
const MAX_DEPTH: usize = 128;

/// A position in the text of one export, inside `depth` objects and arrays.
struct Cursor<'r> {
    text: &'r str,
    at: usize,
    depth: usize,
}

impl<'r> Cursor<'r> {
    /// The byte at the current position, past JSON's whitespace.
    fn peek(&mut self) -> Option<u8> {
        let bytes = self.text.as_bytes();
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = bytes.get(self.at) {
            self.at += 1;
        }
        bytes.get(self.at).copied()
    }

    /// Past `byte`, when it comes next.
    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// Whether only whitespace is left.
    fn end(&mut self) -> bool {
        self.peek().is_none()
    }

    /// The array or object that comes next (bracketed by `open` and `close`), each of its
    /// members read by `member`.
    fn container(&mut self, open: u8, close: u8, mut member: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.eat(open)?;
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return None;
        }
        if self.eat(close).is_none() {
            loop {
                member(self)?;
                match self.peek()? {
                    b',' => self.at += 1,
                    byte if byte == close => {
                        self.at += 1;
                        break;
                    }
                    _ => return None,
                }
            }
        }
        self.depth -= 1;
        Some(())
    }

    /// The object that comes next, each member's value read by `member` given its key (a key
    /// with escapes is odd).
    fn object(&mut self, mut member: impl FnMut(&mut Self, &'r str) -> Option<()>) -> Option<()> {
        self.container(b'{', b'}', |cursor| {
            let Cow::Borrowed(key) = cursor.string()? else { return None };
            cursor.eat(b':')?;
            member(cursor, key)
        })
    }

    /// The array that comes next, each item read by `item` given its index.
    fn list(&mut self, mut item: impl FnMut(&mut Self, usize) -> Option<()>) -> Option<()> {
        let mut index = 0;
        self.container(b'[', b']', |cursor| {
            item(cursor, index)?;
            index += 1;
            Some(())
        })
    }

    /// The string that comes next: borrowed when it has no escapes, else as serde_json
    /// decodes it (a bad escape or a lone surrogate is odd).
    fn string(&mut self) -> Option<Cow<'r, str>> {
        self.eat(b'"')?;
        let start = self.at;
        let mut escaped = false;
        loop {
            let at = self.at + first_special(self.text.as_bytes().get(self.at..)?)?;
            match self.text.as_bytes().get(at)? {
                b'"' => {
                    self.at = at + 1;
                    break;
                }
                // The escaped byte is stepped over here and checked by serde_json below.
                b'\\' => {
                    escaped = true;
                    self.at = at + 2;
                }
                // A control character, which JSON text holds only escaped.
                _ => return None,
            }
        }
        if !escaped {
            return self.text.get(start..self.at - 1).map(Cow::Borrowed);
        }
        serde_json::from_str::<String>(self.text.get(start - 1..self.at)?).ok().map(Cow::Owned)
    }

    /// The string, number or literal that comes next (an array or object is odd).
    fn scalar(&mut self) -> Option<Json<'r>> {
        if self.peek()? == b'"' {
            return self.string().map(Json::Str);
        }
        let rest = self.text.as_bytes().get(self.at..)?;
        let (value, length) = match rest.first()? {
            b'n' if rest.starts_with(b"null") => (Json::Null, 4),
            b't' if rest.starts_with(b"true") => (Json::Bool(true), 4),
            b'f' if rest.starts_with(b"false") => (Json::Bool(false), 5),
            _ => {
                let length = number_length(rest)?;
                (number(self.text.get(self.at..self.at + length)?)?, length)
            }
        };
        self.at += length;
        Some(value)
    }

    /// Steps over the value that comes next, checking it is JSON.
    fn skip(&mut self) -> Option<()> {
        match self.peek()? {
            b'{' => self.object(|cursor, _| cursor.skip()),
            b'[' => self.list(|cursor, _| cursor.skip()),
            _ => self.scalar().map(drop),
        }
    }
}

#[cfg(test)]
mod tests {
    //! The typed reading against the general one: on an export in every span form the
    //! converter maps, and on thousands of mutations of it (a value of another type, a key
    //! dropped, added or repeated, text with escapes, nesting, broken text), both give the
    //! same traces and report, or the same error.

    use rand::{RngExt, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;
    use serde_json::{Value, json};

    use super::super::{convert, convert_text, read};

    fn attribute(key: &str, value: Value) -> Value {
        json!({"key": key, "value": value})
    }

    fn text(value: &str) -> Value {
        json!({"stringValue": value})
    }

    /// An export with each operation, every kind of OTLP value, events, links and statuses.
    fn export() -> Value {
        let span = |id: &str, parent: Option<&str>, start: u64, end: u64, attributes: Vec<Value>| {
            let mut span = json!({
                "traceId": "5B8EFFF798038103D269B633813FC60C", "spanId": id, "name": format!("span {id}"),
                "kind": 1, "startTimeUnixNano": format!("{start}000000000"),
                "endTimeUnixNano": format!("{end}000000000"), "attributes": attributes,
            });
            if let Some(parent) = parent {
                span["parentSpanId"] = json!(parent);
            }
            span
        };
        let mut spans = vec![
            span(
                "0000000000000001",
                None,
                1,
                20,
                vec![
                    attribute("gen_ai.operation.name", text("invoke_agent")),
                    attribute("gen_ai.agent.name", text("lead")),
                    attribute("gen_ai.usage.input_tokens", json!({"intValue": "12"})),
                    attribute("gen_ai.usage.output_tokens", json!({"intValue": 3})),
                ],
            ),
            span(
                "0000000000000002",
                Some("0000000000000001"),
                2,
                3,
                vec![
                    attribute("gen_ai.operation.name", text("create_agent")),
                    attribute("gen_ai.agent.name", text("helper")),
                ],
            ),
            span(
                "0000000000000003",
                Some("0000000000000001"),
                4,
                9,
                vec![
                    attribute("gen_ai.operation.name", text("invoke_agent")),
                    attribute("gen_ai.agent.id", text("helper")),
                    attribute(
                        "list",
                        json!({"arrayValue": {"values": [text("a"), {"boolValue": true}, {"doubleValue": 1.5}]}}),
                    ),
                    attribute(
                        "map",
                        json!({"kvlistValue": {"values": [attribute("inner", json!({"doubleValue": "NaN"}))]}}),
                    ),
                ],
            ),
            span(
                "0000000000000004",
                Some("0000000000000003"),
                5,
                6,
                vec![
                    attribute("gen_ai.operation.name", text("execute_tool")),
                    attribute("gen_ai.tool.name", text("search\n\"quoted\"")),
                ],
            ),
            span(
                "0000000000000005",
                Some("0000000000000003"),
                6,
                8,
                vec![
                    attribute("gen_ai.operation.name", text("chat")),
                    attribute("gen_ai.request.model", text("m-1")),
                    attribute("bytes", json!({"bytesValue": "AAE="})),
                ],
            ),
            span(
                "0000000000000006",
                Some("0000000000000001"),
                10,
                11,
                vec![attribute("gen_ai.operation.name", text("apply_guardrail"))],
            ),
            span(
                "0000000000000007",
                Some("0000000000000001"),
                12,
                13,
                vec![
                    attribute("gen_ai.operation.name", text("retrieval")),
                    attribute("gen_ai.data_source.id", json!({"intValue": "-4"})),
                ],
            ),
            span("0000000000000008", None, 14, 15, vec![attribute("other", json!({}))]),
        ];
        spans[3]["status"] = json!({"code": 2, "message": "failed"});
        spans[3]["events"] = json!([
            {"name": "exception", "attributes": [
                attribute("exception.type", text("ValueError")), attribute("exception.message", text("bad"))]},
            {"name": "retry", "timeUnixNano": "5"},
        ]);
        spans[4]["links"] = json!([{"traceId": "01", "spanId": "02"}]);
        spans[4]["status"] = json!({"code": "STATUS_CODE_OK"});
        let mut reward = span(
            "0000000000000009",
            None,
            16,
            17,
            vec![
                attribute("agentlightning.reward.0.name", text("team")),
                attribute("agentlightning.reward.0.value", json!({"doubleValue": 1.0})),
            ],
        );
        reward["name"] = json!("agentlightning.reward");
        spans.push(reward);
        json!({"resourceSpans": [
            {"resource": {"attributes": [attribute("service.name", text("s"))]},
             "scopeSpans": [{"scope": {"name": "x"}, "spans": spans[..5]}, {"spans": []}]},
            {"scopeSpans": [{"spans": spans[5..]}]},
        ]})
    }

    /// Both readings of `bytes`: the same traces and report, or the same error.
    fn same(bytes: &[u8]) {
        let general = read("f", bytes).map_err(Box::new).and_then(|document| convert("f", &document));
        let typed = convert_text("f", bytes);
        assert_eq!(typed, general, "{}", String::from_utf8_lossy(bytes));
    }

    #[test]
    fn the_export_reads_the_same_both_ways() {
        let bytes = serde_json::to_vec(&export()).expect("json");
        assert!(super::spans("f", &bytes).is_some(), "read the typed way");
        let (traces, report) = convert_text("f", &bytes).expect("converts");
        assert_eq!((traces.traces.len(), report.records), (1, 9));
        same(&bytes);
        // The events' attributes stored as written are those of the traces holding them.
        let batch = traces.batch().expect("a batch");
        let whole = crate::store::TraceBatch::from_traces(&traces.clone().into_traces()).expect("a batch");
        assert_eq!(batch.record_batch(), whole.record_batch());
        assert!(traces.into_traces()[0].events.iter().any(|event| event.attributes.is_some()));
        let one = whole.trace(0).expect("a trace");
        let no_attributes = super::super::Converted { traces: vec![one], attributes: Vec::new() };
        assert!(no_attributes.batch().is_err(), "attributes for no event of one trace");
        // The Collector's file exporter: one export a line (here one resource each).
        let mut lines = String::new();
        for resource in export()["resourceSpans"].as_array().expect("resources") {
            lines += &format!("{}\r\n\n", json!({"resourceSpans": [resource]}));
        }
        assert!(super::spans("f", lines.as_bytes()).is_some(), "JSON Lines read the typed way");
        same(lines.as_bytes());
    }

    fn paths(value: &Value, at: &mut Vec<Value>, found: &mut Vec<Vec<Value>>) {
        let children: Vec<(Value, &Value)> = match value {
            Value::Object(map) => map.iter().map(|(key, item)| (json!(key), item)).collect(),
            Value::Array(items) => items.iter().enumerate().map(|(index, item)| (json!(index), item)).collect(),
            _ => return,
        };
        found.push(at.clone());
        for (key, item) in children {
            at.push(key);
            paths(item, at, found);
            at.pop();
        }
    }

    fn at<'v>(value: &'v mut Value, path: &[Value]) -> &'v mut Value {
        path.iter().fold(value, |value, key| match key {
            Value::String(key) => &mut value[key.as_str()],
            _ => &mut value[key.as_u64().unwrap_or(0) as usize],
        })
    }

    fn scalar(rng: &mut Xoshiro256PlusPlus) -> Value {
        let choices = [
            json!(null),
            json!(true),
            json!(false),
            json!(0),
            json!(2),
            json!(-1),
            json!(1.5),
            json!(1e300),
            json!(u64::MAX),
            json!(""),
            json!("0x1F"),
            json!("AAAAAAAAAAI="),
            json!("1700000000000000000"),
            json!("2026-01-01T00:00:00Z"),
            json!("line\nbreak"),
            json!("ERROR"),
            json!("chat"),
            json!("invoke_agent"),
            json!({}),
            json!([]),
            json!({"stringValue": "x"}),
            json!({"intValue": "9"}),
            json!([{"key": "k", "value": {"boolValue": false}}]),
        ];
        choices[rng.random_range(0..choices.len())].clone()
    }

    const KEYS: [&str; 14] = [
        "traceId",
        "spanId",
        "parentSpanId",
        "name",
        "startTimeUnixNano",
        "endTimeUnixNano",
        "attributes",
        "status",
        "events",
        "links",
        "code",
        "values",
        "stringValue",
        "key",
    ];

    /// `value` changed at one to three places.
    fn mutate(value: &mut Value, rng: &mut Xoshiro256PlusPlus) {
        for _ in 0..rng.random_range(1..4) {
            let mut found = Vec::new();
            paths(value, &mut Vec::new(), &mut found);
            let container = at(value, &found[rng.random_range(0..found.len())]);
            let new = scalar(rng);
            match container {
                Value::Object(map) => {
                    let keys: Vec<String> = map.keys().cloned().collect();
                    match (rng.random_range(0..4), keys.is_empty()) {
                        (0, false) => drop(map.shift_remove(&keys[rng.random_range(0..keys.len())])),
                        (1, false) => {
                            let key = &keys[rng.random_range(0..keys.len())];
                            map[key] = new;
                        }
                        (2, false) => {
                            let key = &keys[rng.random_range(0..keys.len())];
                            let item = map[key].take();
                            map[key] = json!([item]);
                        }
                        _ => drop(map.insert(KEYS[rng.random_range(0..KEYS.len())].to_owned(), new)),
                    }
                }
                Value::Array(items) if !items.is_empty() && rng.random_range(0..2) == 0 => {
                    let index = rng.random_range(0..items.len());
                    items[index] = new;
                }
                Value::Array(items) => items.push(new),
                _ => {}
            }
        }
    }

    /// A change to the text itself: a key repeated, a number spelled NaN, the text cut short.
    fn mutate_text(text: &mut String, rng: &mut Xoshiro256PlusPlus) {
        match rng.random_range(0..4) {
            0 => {
                let key = KEYS[rng.random_range(0..KEYS.len())];
                let spelled = format!("\"{key}\":");
                if let Some(place) = text.find(&spelled) {
                    text.insert_str(place, &format!("{spelled}\"0A\","));
                }
            }
            1 => *text = text.replacen("1.5", "NaN", 1),
            // Past the general reading's depth, inside a value the typed reading skips.
            2 if rng.random_range(0..2) == 0 => {
                *text = text.replacen("\"kind\":1", &format!("\"kind\":{}1{}", "[".repeat(995), "]".repeat(995)), 1)
            }
            2 => text.truncate(rng.random_range(0..text.len())),
            _ => text.push_str("\n{\"resourceSpans\": []}"),
        }
    }

    #[test]
    fn mutated_exports_read_the_same_both_ways() {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(18);
        let valid = export();
        let mut typed = 0;
        for round in 0..3000 {
            let mut value = valid.clone();
            mutate(&mut value, &mut rng);
            let mut text = serde_json::to_string(&value).expect("json");
            if round % 5 == 0 {
                mutate_text(&mut text, &mut rng);
            }
            typed += usize::from(super::spans("f", text.as_bytes()).is_some());
            same(text.as_bytes());
        }
        // Most mutations keep the common shape somewhere the typed reading still reads.
        assert!(typed > 300, "{typed} of 3000 read the typed way");
    }
}
