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

use std::borrow::Cow;
use std::fmt;

use serde_core::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::{MAX_NESTING, Span, Where, hex_id, is_error_status, seconds, whole_number};
use crate::convert::json::Json;

/// The spans of an OTLP export in `text` (or of JSON Lines of exports, as the Collector's
/// file exporter writes them) as the general reading would find them, or `None` when the text
/// is not in the common shape (or holds something the converter refuses).
pub(super) fn spans<'r>(source: &'r str, bytes: &'r [u8]) -> Option<Vec<Span<'r>>> {
    let text = std::str::from_utf8(bytes).ok()?;
    let whole = Where { source, line: None, item: None, otlp: None };
    let mut found = Vec::new();
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

/// The spans of one export, added to `found`; `None` when it is not in the common shape.
fn export<'r>(text: &'r str, at: Where<'r>, found: &mut Vec<Span<'r>>) -> Option<()> {
    // serde_json's recursion limit (128 levels) stays on: text nested deeper, which the general
    // reading may refuse, is odd here, skipped values included (see `Skip`).
    let mut deserializer = serde_json::Deserializer::from_str(text);
    Export { at, found }.deserialize(&mut deserializer).ok()?;
    deserializer.end().ok()
}

/// Not the common shape: the general reading decides.
fn odd<E: de::Error>() -> E {
    E::custom("not in the common OTLP shape")
}

/// Marks `field` as read; a field read twice is odd (the general reading keeps the last).
fn first<E: de::Error>(seen: &mut u16, field: u16) -> Result<(), E> {
    if *seen & field != 0 {
        return Err(odd());
    }
    *seen |= field;
    Ok(())
}

/// A map's keys, borrowed (a key with escapes is odd).
fn next_key<'r, A: MapAccess<'r>>(map: &mut A) -> Result<Option<&'r str>, A::Error> {
    map.next_key::<&'r str>()
}

// ---- the export's nesting: resourceSpans / scopeSpans / spans -----------------------------

/// An export read from `at` (its source and line).
struct Export<'f, 'r> {
    at: Where<'r>,
    found: &'f mut Vec<Span<'r>>,
}

impl<'r> DeserializeSeed<'r> for Export<'_, 'r> {
    type Value = ();

    fn deserialize<D: Deserializer<'r>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'r> Visitor<'r> for Export<'_, 'r> {
    type Value = ();

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("an OTLP export")
    }

    fn visit_map<A: MapAccess<'r>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = 0;
        while let Some(key) = next_key(&mut map)? {
            if key == "resourceSpans" {
                first(&mut seen, 1)?;
                map.next_value_seed(Nested {
                    level: Level::Resources,
                    at: (0, 0),
                    outer: &mut *self.found,
                    export: self.at,
                })?;
            } else {
                map.next_value_seed(Skip)?;
            }
        }
        if seen == 0 { Err(odd()) } else { Ok(()) }
    }
}

/// Which list of the export is read: resources, a resource's scopes, a scope's spans.
#[derive(Clone, Copy)]
enum Level {
    Resources,
    Scopes,
    Spans,
}

/// A list of the export (`level`) inside resource and scope `at`, each item an object.
struct Nested<'f, 'r> {
    level: Level,
    at: (usize, usize),
    outer: &'f mut Vec<Span<'r>>,
    export: Where<'r>,
}

impl<'r> DeserializeSeed<'r> for Nested<'_, 'r> {
    type Value = ();

    fn deserialize<D: Deserializer<'r>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'r> Visitor<'r> for Nested<'_, 'r> {
    type Value = ();

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a list of OTLP objects")
    }

    fn visit_seq<A: SeqAccess<'r>>(self, mut seq: A) -> Result<(), A::Error> {
        let (resource, scope) = self.at;
        for index in 0.. {
            let item =
                Item { level: self.level, at: (resource, scope, index), found: &mut *self.outer, export: self.export };
            if seq.next_element_seed(item)?.is_none() {
                break;
            }
        }
        Ok(())
    }
}

/// One object of a list: a resource (its `scopeSpans` read), a scope (its `spans`) or a span.
struct Item<'f, 'r> {
    level: Level,
    at: (usize, usize, usize),
    found: &'f mut Vec<Span<'r>>,
    export: Where<'r>,
}

impl<'r> DeserializeSeed<'r> for Item<'_, 'r> {
    type Value = ();

    fn deserialize<D: Deserializer<'r>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'r> Visitor<'r> for Item<'_, 'r> {
    type Value = ();

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("an OTLP object")
    }

    fn visit_map<A: MapAccess<'r>>(self, mut map: A) -> Result<(), A::Error> {
        let (resource, scope, index) = self.at;
        let (list, inner, at) = match self.level {
            Level::Resources => ("scopeSpans", Level::Scopes, (index, 0)),
            Level::Scopes => ("spans", Level::Spans, (resource, index)),
            Level::Spans => {
                let at = Where { otlp: Some((resource, scope, index)), ..self.export };
                let span = span(&mut map, at)?;
                self.found.push(span);
                return Ok(());
            }
        };
        let mut seen = 0;
        while let Some(key) = next_key(&mut map)? {
            if key == list {
                first(&mut seen, 1)?;
                map.next_value_seed(Nested { level: inner, at, outer: &mut *self.found, export: self.export })?;
            } else {
                map.next_value_seed(Skip)?;
            }
        }
        Ok(())
    }
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
fn span<'r, A: MapAccess<'r>>(map: &mut A, at: Where<'r>) -> Result<Span<'r>, A::Error> {
    let (mut trace, mut id, mut parent, mut start, mut end) = (None, None, None, None, None);
    let (mut name, mut attributes, mut error, mut events, mut links) = ("", Vec::new(), false, Vec::new(), 0);
    let mut seen = 0;
    while let Some(key) = next_key(map)? {
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
            _ => {
                map.next_value_seed(Skip)?;
                continue;
            }
        };
        first(&mut seen, field)?;
        match field {
            TRACE_ID => trace = Some(map.next_value_seed(Scalar)?),
            SPAN_ID => id = Some(map.next_value_seed(Scalar)?),
            PARENT => parent = Some(map.next_value_seed(Scalar)?),
            NAME => name = borrowed_text(map.next_value_seed(Scalar)?)?,
            START => start = Some(map.next_value_seed(Scalar)?),
            END => end = Some(map.next_value_seed(Scalar)?),
            ATTRIBUTES => attributes = map.next_value_seed(Pairs(0))?,
            STATUS => error = map.next_value_seed(Status)?,
            EVENTS => events = map.next_value_seed(Events)?,
            _ => links = map.next_value_seed(Links)?,
        }
    }
    let id_of = |value: Option<Json<'r>>, place| hex_id(value.as_ref(), &at, place).ok().flatten();
    let (Some(trace), Some(id)) = (id_of(trace, "/traceId"), id_of(id, "/spanId")) else { return Err(odd()) };
    if trace.is_empty() || id.is_empty() {
        return Err(odd());
    }
    let parent = hex_id(parent.as_ref(), &at, "/parentSpanId").map_err(|_| odd())?;
    let start = seconds(start.as_ref(), &at).map_err(|_| odd())?;
    let end = seconds(end.as_ref(), &at).map_err(|_| odd())?;
    let attributes = Cow::Owned(Json::Object(attributes));
    Span { trace, id, parent, name, start, end, attributes, error, at, events, links }.checked().map_err(|_| odd())
}

/// A name as the span keeps it: borrowed text, or "" for null.
fn borrowed_text<'r, E: de::Error>(value: Json<'r>) -> Result<&'r str, E> {
    match value {
        Json::Str(Cow::Borrowed(text)) => Ok(text),
        Json::Null => Ok(""),
        _ => Err(odd()),
    }
}

/// A span's status: whether its code is OpenTelemetry's error code.
struct Status;

impl<'r> DeserializeSeed<'r> for Status {
    type Value = bool;

    fn deserialize<D: Deserializer<'r>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'r> Visitor<'r> for Status {
    type Value = bool;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("an OTLP status")
    }

    fn visit_map<A: MapAccess<'r>>(self, mut map: A) -> Result<bool, A::Error> {
        let (mut code, mut seen) = (None, 0);
        while let Some(key) = next_key(&mut map)? {
            if key == "code" {
                first(&mut seen, 1)?;
                code = Some(map.next_value_seed(Scalar)?);
            } else {
                map.next_value_seed(Skip)?;
            }
        }
        Ok(is_error_status(code.as_ref()))
    }
}

/// A span's events as (name, attributes).
struct Events;

impl<'r> DeserializeSeed<'r> for Events {
    type Value = Vec<(&'r str, Cow<'r, Json<'r>>)>;

    fn deserialize<D: Deserializer<'r>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'r> Visitor<'r> for Events {
    type Value = Vec<(&'r str, Cow<'r, Json<'r>>)>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a list of span events")
    }

    fn visit_seq<A: SeqAccess<'r>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut events = Vec::new();
        while let Some(event) = seq.next_element_seed(Event)? {
            events.push(event);
        }
        Ok(events)
    }
}

struct Event;

impl<'r> DeserializeSeed<'r> for Event {
    type Value = (&'r str, Cow<'r, Json<'r>>);

    fn deserialize<D: Deserializer<'r>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'r> Visitor<'r> for Event {
    type Value = (&'r str, Cow<'r, Json<'r>>);

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a span event")
    }

    fn visit_map<A: MapAccess<'r>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut name, mut attributes, mut seen) = ("", Vec::new(), 0);
        while let Some(key) = next_key(&mut map)? {
            match key {
                "name" => {
                    first(&mut seen, 1)?;
                    name = borrowed_text(map.next_value_seed(Scalar)?)?;
                }
                "attributes" => {
                    first(&mut seen, 2)?;
                    attributes = map.next_value_seed(Pairs(0))?;
                }
                _ => {
                    map.next_value_seed(Skip)?;
                }
            }
        }
        Ok((name, Cow::Owned(Json::Object(attributes))))
    }
}

/// A span's links, counted (each must be an object; what it holds is not read).
struct Links;

impl<'r> DeserializeSeed<'r> for Links {
    type Value = usize;

    fn deserialize<D: Deserializer<'r>>(self, deserializer: D) -> Result<usize, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'r> Visitor<'r> for Links {
    type Value = usize;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a list of span links")
    }

    fn visit_seq<A: SeqAccess<'r>>(self, mut seq: A) -> Result<usize, A::Error> {
        let mut count = 0;
        while seq.next_element_seed(Link)?.is_some() {
            count += 1;
        }
        Ok(count)
    }
}

struct Link;

impl<'r> DeserializeSeed<'r> for Link {
    type Value = ();

    fn deserialize<D: Deserializer<'r>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'r> Visitor<'r> for Link {
    type Value = ();

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a span link")
    }

    fn visit_map<A: MapAccess<'r>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_key_seed(Skip)?.is_some() {
            map.next_value_seed(Skip)?;
        }
        Ok(())
    }
}

// ---- attributes ----------------------------------------------------------------------------

/// OTLP key-value pairs at nesting `.0` as an object's entries (a repeated key takes its
/// earlier one's place, as in the general reading).
struct Pairs(usize);

type Entries<'r> = Vec<(Cow<'r, str>, Json<'r>)>;

impl<'r> DeserializeSeed<'r> for Pairs {
    type Value = Entries<'r>;

    fn deserialize<D: Deserializer<'r>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'r> Visitor<'r> for Pairs {
    type Value = Entries<'r>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a list of OTLP key-value pairs")
    }

    fn visit_seq<A: SeqAccess<'r>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        // Spans carry a handful of attributes (serde_json gives no size hint).
        let mut entries = Vec::with_capacity(seq.size_hint().unwrap_or(8));
        while let Some((key, value)) = seq.next_element_seed(Pair(self.0))? {
            Json::insert(&mut entries, key, value);
        }
        Ok(entries)
    }
}

/// One `{"key": ..., "value": {...}}` pair at nesting `.0`.
struct Pair(usize);

impl<'r> DeserializeSeed<'r> for Pair {
    type Value = (Cow<'r, str>, Json<'r>);

    fn deserialize<D: Deserializer<'r>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'r> Visitor<'r> for Pair {
    type Value = (Cow<'r, str>, Json<'r>);

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("an OTLP key-value pair")
    }

    fn visit_map<A: MapAccess<'r>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut key, mut value, mut seen) = (None, Json::Null, 0);
        while let Some(name) = next_key(&mut map)? {
            match name {
                "key" => {
                    first(&mut seen, 1)?;
                    key = match map.next_value_seed(Scalar)? {
                        Json::Str(text) => Some(text),
                        _ => return Err(odd()),
                    };
                }
                "value" => {
                    first(&mut seen, 2)?;
                    value = map.next_value_seed(AnyValue(self.0))?;
                }
                _ => {
                    map.next_value_seed(Skip)?;
                }
            }
        }
        key.map(|key| (key, value)).ok_or_else(odd)
    }
}

/// An OTLP AnyValue at nesting `.0` with one of its kinds (or none), as a plain value (as
/// `any_value` makes it).
struct AnyValue(usize);

impl<'r> DeserializeSeed<'r> for AnyValue {
    type Value = Json<'r>;

    fn deserialize<D: Deserializer<'r>>(self, deserializer: D) -> Result<Json<'r>, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'r> Visitor<'r> for AnyValue {
    type Value = Json<'r>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("an OTLP value")
    }

    fn visit_map<A: MapAccess<'r>>(self, mut map: A) -> Result<Json<'r>, A::Error> {
        if self.0 > MAX_NESTING {
            return Err(odd());
        }
        // No kind at all: null, as in the general reading.
        let Some(kind) = next_key(&mut map)? else { return Ok(Json::Null) };
        let value = match kind {
            "stringValue" | "bytesValue" => match map.next_value_seed(Scalar)? {
                text @ Json::Str(_) => text,
                _ => return Err(odd()),
            },
            "boolValue" => match map.next_value_seed(Scalar)? {
                flag @ Json::Bool(_) => flag,
                _ => return Err(odd()),
            },
            "intValue" => whole_number(&map.next_value_seed(Scalar)?).ok_or_else(odd)?,
            "doubleValue" => match map.next_value_seed(Scalar)? {
                text @ Json::Str(_) => text,
                number => Json::Float(number.as_finite().ok_or_else(odd)?),
            },
            "arrayValue" => Json::Array(map.next_value_seed(Values(Inner::Array(self.0 + 1)))?.0),
            "kvlistValue" => Json::Object(map.next_value_seed(Values(Inner::Pairs(self.0 + 1)))?.1),
            _ => return Err(odd()),
        };
        if next_key(&mut map)?.is_some() {
            return Err(odd());
        }
        Ok(value)
    }
}

/// What an arrayValue (values) or a kvlistValue (pairs) holds, at its nesting.
#[derive(Clone, Copy)]
enum Inner {
    Array(usize),
    Pairs(usize),
}

/// `{"values": [...]}` of an arrayValue or kvlistValue.
struct Values(Inner);

impl<'r> DeserializeSeed<'r> for Values {
    type Value = (Vec<Json<'r>>, Entries<'r>);

    fn deserialize<D: Deserializer<'r>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'r> Visitor<'r> for Values {
    type Value = (Vec<Json<'r>>, Entries<'r>);

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("OTLP values")
    }

    fn visit_map<A: MapAccess<'r>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        if next_key(&mut map)? != Some("values") {
            return Err(odd());
        }
        let read = match self.0 {
            Inner::Array(depth) => (map.next_value_seed(Array(depth))?, Vec::new()),
            Inner::Pairs(depth) => (Vec::new(), map.next_value_seed(Pairs(depth))?),
        };
        if next_key(&mut map)?.is_some() {
            return Err(odd());
        }
        Ok(read)
    }
}

/// The values of an arrayValue at nesting `.0`.
struct Array(usize);

impl<'r> DeserializeSeed<'r> for Array {
    type Value = Vec<Json<'r>>;

    fn deserialize<D: Deserializer<'r>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'r> Visitor<'r> for Array {
    type Value = Vec<Json<'r>>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a list of OTLP values")
    }

    fn visit_seq<A: SeqAccess<'r>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut values = Vec::new();
        while let Some(value) = seq.next_element_seed(AnyValue(self.0))? {
            values.push(value);
        }
        Ok(values)
    }
}

/// A value passed over unread. Unlike serde's `IgnoredAny` (which serde_json skips at any
/// depth), each level counts against the recursion limit.
struct Skip;

impl<'r> DeserializeSeed<'r> for Skip {
    type Value = ();

    fn deserialize<D: Deserializer<'r>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'r> Visitor<'r> for Skip {
    type Value = ();

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'r>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Skip)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'r>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_key_seed(Skip)?.is_some() {
            map.next_value_seed(Skip)?;
        }
        Ok(())
    }
}

/// A JSON scalar as the general reading holds it (text borrowed when it has no escapes); a
/// list or object is odd where a scalar is read.
struct Scalar;

impl<'r> DeserializeSeed<'r> for Scalar {
    type Value = Json<'r>;

    fn deserialize<D: Deserializer<'r>>(self, deserializer: D) -> Result<Json<'r>, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'r> Visitor<'r> for Scalar {
    type Value = Json<'r>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a JSON scalar")
    }

    fn visit_unit<E>(self) -> Result<Json<'r>, E> {
        Ok(Json::Null)
    }

    fn visit_bool<E>(self, value: bool) -> Result<Json<'r>, E> {
        Ok(Json::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Json<'r>, E> {
        Ok(Json::Int(value))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Json<'r>, E> {
        Ok(i64::try_from(value).map_or(Json::UInt(value), Json::Int))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Json<'r>, E> {
        Ok(Json::Float(value))
    }

    fn visit_borrowed_str<E>(self, value: &'r str) -> Result<Json<'r>, E> {
        Ok(Json::Str(Cow::Borrowed(value)))
    }

    fn visit_str<E>(self, value: &str) -> Result<Json<'r>, E> {
        Ok(Json::Str(Cow::Owned(value.to_owned())))
    }

    fn visit_string<E>(self, value: String) -> Result<Json<'r>, E> {
        Ok(Json::Str(Cow::Owned(value)))
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
