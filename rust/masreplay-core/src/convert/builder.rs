//! The trace a converter builds: events checked as a JSON trace's would be, as they come
//! (`validate::event_from_parts`), edges between them by index, and the whole checked at the
//! end (`validate::trace_from_parts`), with no JSON document in between.

use serde_json::{Map, Value};

use super::json::{Json, write_serialized, write_str};
use crate::error::ValidationError;
use crate::store::AttributeTexts;
use crate::trace::{Edge, EdgeType, Event, EventType, NamedNumbers, Topology, Trace};
use crate::validate;

// Each event's index is hashed once per edge: foldhash, not SipHash.
type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// A field of an event: made here, or a value of the input passed through.
pub(crate) enum Out<'r> {
    Text(String),
    /// Text of the input, copied only where the event keeps it.
    Str(&'r str),
    Value(Value),
    Float(f64),
    Raw(Option<&'r Json<'r>>),
    /// A value made of the input's (passed through as `Raw` is).
    Json(Json<'r>),
}

/// What a trace holds besides its events and edges.
pub(crate) struct Head<'a> {
    pub task_id: &'a str,
    pub system: &'a str,
    pub topology: Topology,
    pub wall_clock_s: f64,
    /// The token cost the source states; `None`: the events' `tokens`, summed.
    pub tokens: Option<Value>,
    pub rewards: NamedNumbers,
    pub metrics: Option<NamedNumbers>,
    /// Top-level keys outside the schema, kept as the trace's attributes.
    pub attributes: Map<String, Value>,
}

/// Collects events and edges (checked as a JSON trace's would be); drops unset optional
/// fields and repeated or self edges.
pub(crate) struct Builder<'t> {
    trace_id: &'t str,
    pub events: Vec<Event>,
    tokens: i128,
    edges: Vec<Edge>,
    edge_keys: HashSet<(usize, usize)>,
    /// The first value the trace cannot hold (not finite, nested too deep): named before
    /// anything else, as the seed JSON it would be written to could not hold it either.
    unfit: Option<(String, String)>,
    /// The first event the data contract refuses.
    invalid: Option<ValidationError>,
    /// Each event's attributes as the JSON text of one object, when they are written as the
    /// events are made (see [`Builder::writing_attributes`]); the events then hold none.
    written: Option<Written>,
}

/// The attributes of a trace's events written so far: one text for all, and where each
/// event's is in it.
#[derive(Default)]
struct Written {
    text: Vec<u8>,
    ranges: Vec<Option<(usize, usize)>>,
}

impl Written {
    /// The texts as `AttributeTexts`. They are written from `&str`s and serde_json's output, so
    /// UTF-8 (checked once for the whole trace, a word at a time); were an event's not, it is
    /// named rather than mended, as a mended text would no longer fit `ranges`.
    fn into_texts(self, trace_id: &str) -> Result<AttributeTexts, ValidationError> {
        let Written { text, ranges } = self;
        let text = String::from_utf8(text).map_err(|error| {
            let at = error.utf8_error().valid_up_to();
            let event = ranges.iter().position(|range| range.is_some_and(|(start, end)| (start..end).contains(&at)));
            let path = event.map_or_else(|| "/events".to_owned(), |event| format!("/events/{event}/attributes"));
            ValidationError::new(Some(trace_id), path, format!("the text written at byte {at} is not UTF-8"))
        })?;
        Ok(AttributeTexts::new(text, ranges))
    }
}

impl<'t> Builder<'t> {
    pub fn new(trace_id: &'t str) -> Self {
        Builder {
            trace_id,
            events: Vec::new(),
            tokens: 0,
            edges: Vec::new(),
            edge_keys: HashSet::default(),
            unfit: None,
            invalid: None,
            written: None,
        }
    }

    /// A builder that writes each event's attributes as JSON text (what a batch's attributes
    /// column stores) instead of keeping them in the event: no map made and freed per event.
    /// The text is the one the event's map would be written as; [`Builder::take_written`]
    /// hands it over.
    pub fn writing_attributes(trace_id: &'t str) -> Self {
        Builder { written: Some(Written::default()), ..Builder::new(trace_id) }
    }

    /// Room for `events` more events (their attributes' texts, and two edges each), made one
    /// at a time.
    pub fn reserve(&mut self, events: usize) {
        self.events.reserve(events);
        self.edges.reserve(2 * events);
        self.edge_keys.reserve(2 * events);
        if let Some(written) = &mut self.written {
            written.ranges.reserve(events);
        }
    }

    pub fn event<'k>(
        &mut self,
        id: String,
        t: f64,
        kind: EventType,
        agent: &str,
        fields: impl IntoIterator<Item = (&'k str, Out<'k>)>,
    ) -> usize {
        let index = self.events.len();
        let fields = fields.into_iter();
        let mut values = Vec::with_capacity(fields.size_hint().0);
        // Taken out while the fields are written (`write` needs the builder too).
        let mut written = self.written.take();
        let start = written.as_ref().map_or(0, |written| written.text.len());
        for (key, value) in fields {
            if let Some(written) = written.as_mut().filter(|_| !validate::is_event_field(key)) {
                self.write(&mut written.text, start, index, key, value);
                continue;
            }
            let value = match value {
                Out::Text(text) => Value::String(text),
                Out::Str(text) => Value::String(text.to_owned()),
                Out::Value(value) => value,
                Out::Float(x) => match serde_json::Number::from_f64(x) {
                    Some(number) => Value::Number(number),
                    None => {
                        self.unfit
                            .get_or_insert((format!("/events/{index}/{key}"), format!("{x} is not a finite number")));
                        Value::Null
                    }
                },
                Out::Raw(None | Some(Json::Null)) | Out::Json(Json::Null) => continue,
                Out::Raw(Some(json)) => self.passed(index, key, json),
                Out::Json(json) => self.passed(index, key, &json),
            };
            if key == "tokens" {
                self.tokens += value.as_i64().map(i128::from).or_else(|| value.as_u64().map(i128::from)).unwrap_or(0);
            }
            values.push((key, value));
        }
        let event = match validate::event_from_parts(self.trace_id, index, (id, t.max(0.0), kind, agent), values) {
            Ok(event) => event,
            Err(error) => {
                // A stand-in keeps the event's place, so that the rest is built and an unfit
                // value further on is still found (the trace is refused: nothing reads it).
                self.invalid.get_or_insert(error);
                Event::new(String::new(), 0.0, kind, String::new())
            }
        };
        self.events.push(event);
        if let Some(mut written) = written {
            let range = (written.text.len() > start).then(|| {
                written.text.push(b'}');
                (start, written.text.len())
            });
            written.ranges.push(range);
            self.written = Some(written);
        }
        index
    }

    /// Writes field `key` of event `index` into the JSON text of its attributes (begun at
    /// `begun` of `text`), as the event's map would be written (a value the trace cannot hold
    /// is null beside the first such place, as in the map).
    fn write(&mut self, text: &mut Vec<u8>, begun: usize, index: usize, key: &str, value: Out<'_>) {
        if matches!(value, Out::Raw(None | Some(Json::Null)) | Out::Json(Json::Null)) {
            return;
        }
        text.push(if text.len() == begun { b'{' } else { b',' });
        write_str(text, key);
        text.push(b':');
        let start = text.len();
        let unfit = match value {
            Out::Text(value) => Json::Str(value.into()).write_json(4, text),
            Out::Str(value) => Json::Str(value.into()).write_json(4, text),
            Out::Value(value) => {
                write_serialized(text, &value);
                Ok(())
            }
            Out::Float(x) => Json::Float(x).write_json(4, text),
            Out::Raw(json) => json.map_or(Ok(()), |json| json.write_json(4, text)),
            Out::Json(json) => json.write_json(4, text),
        };
        if let Err((at, why)) = unfit {
            self.unfit.get_or_insert((format!("/events/{index}/{key}{at}"), why));
            text.truncate(start);
            text.extend_from_slice(b"null");
        }
    }

    /// A value of the input as an event field, or null beside the first place that the trace
    /// cannot hold (an event's fields are at level 4: trace, events, event, field).
    fn passed(&mut self, index: usize, key: &str, json: &Json<'_>) -> Value {
        json.to_value(4).unwrap_or_else(|(at, why)| {
            self.unfit.get_or_insert((format!("/events/{index}/{key}{at}"), why));
            Value::Null
        })
    }

    pub fn edge(&mut self, src: Option<usize>, dst: Option<usize>, kind: EdgeType) {
        let (Some(src), Some(dst)) = (src, dst) else { return };
        // Events of one id make the trace invalid (`trace_from_parts`), so indices stand for ids.
        if src != dst && self.edge_keys.insert((src, dst)) {
            self.edges.push(Edge { src: src as u32, dst: dst as u32, edge_type: kind });
        }
    }

    /// Sets (or adds to) event `index`'s `reward`: channels already there keep their place
    /// and take the new value, new ones come after (a Python dict's `update`).
    pub fn add_reward(&mut self, index: usize, rewards: &NamedNumbers) {
        let Some(event) = self.events.get_mut(index) else { return };
        let reward = event.reward.get_or_insert_with(Vec::new);
        for (name, value) in rewards {
            set_reward(reward, name, *value);
        }
    }

    /// The trace, or the first thing in it the data contract refuses.
    /// [`Builder::build`] of a builder made by [`Builder::writing_attributes`], with the
    /// attributes it wrote: one text per event (`None`: no attributes).
    pub fn build_with_attributes(mut self, head: Head<'_>) -> Result<(Trace, AttributeTexts), ValidationError> {
        let trace_id = self.trace_id;
        let written = self.written.take().unwrap_or_default();
        let trace = self.build(head)?;
        Ok((trace, written.into_texts(trace_id)?))
    }

    pub fn build(mut self, head: Head<'_>) -> Result<Trace, ValidationError> {
        let rewards = self.numbers("rewards", head.rewards);
        let metrics = head.metrics.map(|metrics| self.numbers("metrics", metrics));
        if let Some((path, reason)) = self.unfit {
            return Err(ValidationError::new(Some(self.trace_id), path, reason));
        }
        if let Some(invalid) = self.invalid {
            return Err(invalid);
        }
        let count = |kind: EventType| self.events.iter().filter(|event| event.event_type == kind).count();
        let mut costs = Map::new();
        costs.insert("tokens".into(), head.tokens.unwrap_or_else(|| integer(self.tokens)));
        costs.insert("wall_clock_s".into(), Value::from(head.wall_clock_s.max(0.0)));
        costs.insert("tool_calls".into(), Value::from(count(EventType::ToolCall)));
        costs.insert("messages".into(), Value::from(count(EventType::Message)));
        let parts = (self.trace_id, head.task_id, head.system, head.topology);
        validate::trace_from_parts(parts, self.events, self.edges, (rewards, costs, metrics), head.attributes)
    }

    /// Named numbers as JSON (a number JSON cannot hold is the trace's first unfit value
    /// after the events', as it comes after them in the trace).
    fn numbers(&mut self, name: &str, numbers: NamedNumbers) -> Map<String, Value> {
        let mut map = Map::with_capacity(numbers.len());
        for (key, x) in numbers {
            let value = serde_json::Number::from_f64(x).map_or_else(
                || {
                    self.unfit.get_or_insert((
                        format!("/{name}/{}", validate::pointer_segment(&key)),
                        format!("{x} is not a finite number"),
                    ));
                    Value::Null
                },
                Value::Number,
            );
            map.insert(key, value);
        }
        map
    }
}

/// A reward channel set as a Python dict sets a key (a repeated one keeps its place).
pub(crate) fn set_reward(rewards: &mut NamedNumbers, name: impl AsRef<str> + Into<String>, value: f64) {
    match rewards.iter_mut().find(|(known, _)| known == name.as_ref()) {
        Some(entry) => entry.1 = value,
        None => rewards.push((name.into(), value)),
    }
}

/// An integer as JSON: exact within 64 bits (beyond, a float the contract rejects as a count).
pub(crate) fn integer(value: i128) -> Value {
    i64::try_from(value)
        .map(Value::from)
        .or_else(|_| u64::try_from(value).map(Value::from))
        .unwrap_or_else(|_| Value::from(value as f64))
}

#[cfg(test)]
mod tests {
    use super::Written;

    #[test]
    fn written_texts_that_are_not_utf8_name_their_event_and_are_not_mended() {
        let ranges = vec![Some((0, 7)), None, Some((7, 14))];
        let valid = Written { text: br#"{"a":1}{"b":2}"#.to_vec(), ranges: ranges.clone() };
        let texts: Vec<_> =
            valid.into_texts("t1").expect("UTF-8").texts().map(|text| text.map(str::to_owned)).collect();
        assert_eq!(texts, [Some(r#"{"a":1}"#.to_owned()), None, Some(r#"{"b":2}"#.to_owned())]);

        let mut text = br#"{"a":1}{"b":"#.to_vec();
        text.extend_from_slice(b"\xff}");
        let error = Written { text, ranges }.into_texts("t1").expect_err("byte 12 is not UTF-8");
        assert_eq!(error.trace_id.as_deref(), Some("t1"));
        assert_eq!(error.path, "/events/2/attributes");
        assert!(error.reason.contains("byte 12"), "{}", error.reason);
    }
}
