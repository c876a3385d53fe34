//! The fast path from JSON text to a [`Trace`]: serde visitors build the model while the text is
//! parsed, with no `serde_json::Value` in between. It applies the Reader's rules (the same
//! functions) but words no errors: on anything the Reader would reject, and on a repeated key
//! (which a DOM resolves to its last value), it declines and leaves the verdict to the Reader.
//! The text is parsed by serde_json in both, so both accept exactly the same JSON.

use std::borrow::Cow;
use std::fmt;

use serde_core::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use super::{
    TOP_LEVEL_SEED_KEYS, ValidateOptions, attributes_fit, check_finite, check_graph, check_logprob, check_non_empty,
    check_non_negative, check_schema_version, index_events, split_costs, whole_number,
};
use crate::trace::{
    CounterfactualKind, CounterfactualOf, Edge, EdgeType, Event, EventType, NamedNumbers, Topology, Trace,
};

/// The trace in `json` when it passes every rule; `None` when the Reader must judge it.
pub(super) fn read_trace(json: &[u8], options: ValidateOptions) -> Option<Trace> {
    // One UTF-8 check of the whole text is cheaper than one per string; text that fails it is
    // left to the Reader, which parses the bytes and says where the encoding breaks.
    let json = std::str::from_utf8(json).ok()?;
    let mut deserializer = serde_json::Deserializer::from_str(json);
    let parts = deserializer.deserialize_map(TraceVisitor { options }).ok()?;
    deserializer.end().ok()?;
    parts.into_trace()
}

/// The trace in a document of another format (a [`super::tape::Tape`]), as [`read_trace`].
pub(super) fn read_document<'de, D: Deserializer<'de>>(document: D, options: ValidateOptions) -> Option<Trace> {
    document.deserialize_map(TraceVisitor { options }).ok()?.into_trace()
}

/// The error that ends the fast path; its text is never shown.
fn decline<E: de::Error>() -> E {
    E::custom("declined by the fast path")
}

/// Applies one of the Reader's value rules; a broken rule declines.
fn rule<T: Copy, E: de::Error>(value: T, check: fn(T) -> Result<(), String>) -> Result<T, E> {
    check(value).map(|()| value).map_err(|_| decline())
}

/// The known keys of one object already read, by bit; a repeat declines.
#[derive(Default)]
struct Seen(u32);

impl Seen {
    fn first<E: de::Error>(&mut self, bit: u32) -> Result<(), E> {
        if self.0 & (1 << bit) != 0 {
            return Err(decline());
        }
        self.0 |= 1 << bit;
        Ok(())
    }

    fn all<E: de::Error>(&self, bits: u32) -> Result<(), E> {
        if self.0 & bits == bits { Ok(()) } else { Err(decline()) }
    }
}

// ---- scalars -------------------------------------------------------------------------------

/// A JSON string, borrowed from the text when it holds no escape.
struct Text<'de>(Cow<'de, str>);

impl Text<'_> {
    fn non_empty<E: de::Error>(self) -> Result<String, E> {
        check_non_empty(&self.0).map_err(|_| decline())?;
        Ok(self.0.into_owned())
    }

    fn enumerated<T, E: de::Error>(&self, parse: fn(&str) -> Option<T>) -> Result<T, E> {
        parse(&self.0).ok_or_else(decline)
    }
}

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl<'de> Visitor<'de> for TextVisitor {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(text)))
            }
            fn visit_str<E>(self, text: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(text.to_owned())))
            }
        }
        deserializer.deserialize_str(TextVisitor)
    }
}

/// A JSON number, held as `serde_json::Value` holds it, so the Reader's conversions apply.
struct Num(Number);

impl Num {
    fn float<E: de::Error>(&self) -> Result<f64, E> {
        self.0.as_f64().ok_or_else(decline)
    }

    fn whole<E: de::Error>(&self) -> Result<i64, E> {
        whole_number(&self.0).ok_or_else(decline)
    }
}

impl<'de> Deserialize<'de> for Num {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NumVisitor;
        impl Visitor<'_> for NumVisitor {
            type Value = Num;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number")
            }
            fn visit_u64<E>(self, n: u64) -> Result<Num, E> {
                Ok(Num(n.into()))
            }
            fn visit_i64<E>(self, n: i64) -> Result<Num, E> {
                Ok(Num(n.into()))
            }
            fn visit_f64<E: de::Error>(self, n: f64) -> Result<Num, E> {
                Number::from_f64(n).map(Num).ok_or_else(decline)
            }
        }
        deserializer.deserialize_any(NumVisitor)
    }
}

// ---- maps of named numbers -----------------------------------------------------------------

/// Reward channels, costs or metrics: finite numbers (non-negative ones when asked), in order.
struct Numbers {
    non_negative: bool,
}

impl<'de> Visitor<'de> for Numbers {
    type Value = NamedNumbers;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object of numbers")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NamedNumbers, A::Error> {
        let check = if self.non_negative { check_non_negative } else { check_finite };
        let mut numbers = NamedNumbers::new();
        while let Some(Text(key)) = map.next_key()? {
            let number = rule(map.next_value::<Num>()?.float()?, check)?;
            numbers.push((key.into_owned(), number));
        }
        if repeats(numbers.iter().map(|(key, _)| key.as_str())) {
            return Err(decline());
        }
        Ok(numbers)
    }
}

/// Whether a key comes twice (sorting, so that a map of many keys costs no more than a sort).
fn repeats<'a>(keys: impl ExactSizeIterator<Item = &'a str>) -> bool {
    if keys.len() < 2 {
        return false;
    }
    let mut keys: Vec<&str> = keys.collect();
    keys.sort_unstable();
    keys.windows(2).any(|pair| pair[0] == pair[1])
}

// ---- events and edges ----------------------------------------------------------------------

struct Events;

impl<'de> Visitor<'de> for Events {
    type Value = Vec<Event>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of events")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Event>, A::Error> {
        let mut events = Vec::new();
        while seq.next_element_seed(Object(EventVisitor { events: &mut events }))?.is_some() {}
        Ok(events)
    }
}

/// Reads one event and pushes it: an event is large, and returning it would copy it at every
/// level of the deserializer.
struct EventVisitor<'a> {
    events: &'a mut Vec<Event>,
}

impl<'de> Visitor<'de> for EventVisitor<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an event")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut event = Event::new(String::new(), 0.0, EventType::OrchestratorDecision, String::new());
        let mut seen = Seen::default(); // bits 0-3: the required id, t, type and agent
        let mut extra = Map::new();
        while let Some(Text(key)) = map.next_key()? {
            let optional_text = |seen: &mut Seen, bit, map: &mut A| -> Result<_, A::Error> {
                seen.first(bit)?;
                Ok(Some(map.next_value::<Text>()?.0.into_owned()))
            };
            match &*key {
                "id" => {
                    seen.first(0)?;
                    event.id = map.next_value::<Text>()?.non_empty()?;
                }
                "t" => {
                    seen.first(1)?;
                    event.t = rule(map.next_value::<Num>()?.float()?, check_non_negative)?;
                }
                "type" => {
                    seen.first(2)?;
                    event.event_type = map.next_value::<Text>()?.enumerated(EventType::from_name)?;
                }
                "agent" => {
                    seen.first(3)?;
                    event.agent = map.next_value::<Text>()?.non_empty()?;
                }
                "role" => event.role = optional_text(&mut seen, 4, &mut map)?,
                "from" => event.from = optional_text(&mut seen, 5, &mut map)?,
                "to" => event.to = optional_text(&mut seen, 6, &mut map)?,
                "tool" => event.tool = optional_text(&mut seen, 7, &mut map)?,
                "content_ref" => event.content_ref = optional_text(&mut seen, 8, &mut map)?,
                "trusted" => {
                    seen.first(9)?;
                    event.trusted = Some(map.next_value()?);
                }
                "reward" => {
                    seen.first(10)?;
                    event.reward = Some(map.next_value_seed(Object(Numbers { non_negative: false }))?);
                }
                "tokens" => {
                    seen.first(11)?;
                    let tokens = map.next_value::<Num>()?.whole()?;
                    rule(tokens as f64, check_non_negative)?;
                    event.tokens = Some(tokens);
                }
                "duration_s" => {
                    seen.first(12)?;
                    event.duration_s = Some(rule(map.next_value::<Num>()?.float()?, check_non_negative)?);
                }
                "logprob" => {
                    seen.first(13)?;
                    event.logprob = Some(rule(map.next_value::<Num>()?.float()?, check_logprob)?);
                }
                // A repeated other key resolves as in the Reader: Map keeps the last value.
                _ => _ = extra.insert(key.into_owned(), map.next_value()?),
            }
        }
        seen.all(0b1111)?; // id, t, type, agent
        if !attributes_fit(&extra, 3) {
            return Err(decline());
        }
        event.attributes = (!extra.is_empty()).then_some(extra);
        self.events.push(event);
        Ok(())
    }
}

/// An edge whose endpoints are still event ids: the events may come after the edges.
struct NamedEdge<'de> {
    src: Cow<'de, str>,
    dst: Cow<'de, str>,
    edge_type: EdgeType,
}

impl<'de> Deserialize<'de> for NamedEdge<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EdgeVisitor;
        impl<'de> Visitor<'de> for EdgeVisitor {
            type Value = NamedEdge<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an edge")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NamedEdge<'de>, A::Error> {
                let mut edge =
                    NamedEdge { src: Cow::Borrowed(""), dst: Cow::Borrowed(""), edge_type: EdgeType::Temporal };
                let mut seen = Seen::default();
                while let Some(Text(key)) = map.next_key()? {
                    match &*key {
                        "src" => {
                            seen.first(0)?;
                            edge.src = map.next_value::<Text>()?.0;
                        }
                        "dst" => {
                            seen.first(1)?;
                            edge.dst = map.next_value::<Text>()?.0;
                        }
                        "type" => {
                            seen.first(2)?;
                            edge.edge_type = map.next_value::<Text>()?.enumerated(EdgeType::from_name)?;
                        }
                        _ => return Err(decline()),
                    }
                }
                seen.all(0b111)?;
                Ok(edge)
            }
        }
        deserializer.deserialize_map(EdgeVisitor)
    }
}

// ---- the trace -----------------------------------------------------------------------------

struct CounterfactualVisitor;

impl<'de> Visitor<'de> for CounterfactualVisitor {
    type Value = CounterfactualOf;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("counterfactual_of")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<CounterfactualOf, A::Error> {
        let mut of =
            CounterfactualOf { trace_id: String::new(), event_id: String::new(), kind: CounterfactualKind::Substitute };
        let mut seen = Seen::default();
        while let Some(Text(key)) = map.next_key()? {
            match &*key {
                "trace_id" => {
                    seen.first(0)?;
                    of.trace_id = map.next_value::<Text>()?.non_empty()?;
                }
                "event_id" => {
                    seen.first(1)?;
                    of.event_id = map.next_value::<Text>()?.non_empty()?;
                }
                "kind" => {
                    seen.first(2)?;
                    of.kind = map.next_value::<Text>()?.enumerated(CounterfactualKind::from_name)?;
                }
                // The Reader ignores other keys, but its DOM parsed their values in full.
                _ => _ = map.next_value::<Value>()?,
            }
        }
        seen.all(0b111)?;
        Ok(of)
    }
}

/// The fields of a trace as read, before the checks that need all of them.
#[derive(Default)]
struct Parts<'de> {
    trace_id: Option<String>,
    task_id: Option<String>,
    group_id: Option<String>,
    system: Option<String>,
    topology: Option<Topology>,
    policy_version: Option<i64>,
    counterfactual_of: Option<CounterfactualOf>,
    events: Option<Vec<Event>>,
    edges: Option<Vec<NamedEdge<'de>>>,
    rewards: Option<NamedNumbers>,
    costs: Option<NamedNumbers>,
    metrics: Option<NamedNumbers>,
    attributes: Map<String, Value>,
}

impl Parts<'_> {
    fn into_trace(self) -> Option<Trace> {
        let task_id = self.task_id?;
        if !attributes_fit(&self.attributes, 1) {
            return None;
        }
        let group_id = self.group_id.filter(|group| *group != task_id);
        let events = self.events.filter(|events| !events.is_empty())?;
        let edges = {
            let index_of = index_events(&events).ok()?;
            let index = |id: &str| index_of.get(id).copied();
            let named = self.edges?;
            let edges = named
                .iter()
                .map(|edge| Some(Edge { src: index(&edge.src)?, dst: index(&edge.dst)?, edge_type: edge.edge_type }));
            edges.collect::<Option<Vec<Edge>>>()?
        };
        let pairs: Vec<(u32, u32)> = edges.iter().map(|e| (e.src, e.dst)).collect();
        check_graph(None, &|i| events[i].id.clone(), events.len(), &pairs).ok()?;
        Some(Trace {
            trace_id: self.trace_id?,
            task_id,
            group_id,
            system: self.system,
            topology: self.topology,
            policy_version: self.policy_version,
            counterfactual_of: self.counterfactual_of,
            events,
            edges,
            rewards: self.rewards?,
            costs: split_costs(self.costs?).ok()?,
            metrics: self.metrics,
            attributes: (!self.attributes.is_empty()).then_some(self.attributes),
        })
    }
}

struct TraceVisitor {
    options: ValidateOptions,
}

/// Stores a field read once; a repeated key declines.
fn once<T, E: de::Error>(slot: &mut Option<T>, value: T) -> Result<(), E> {
    match slot.replace(value) {
        None => Ok(()),
        Some(_) => Err(decline()),
    }
}

impl<'de> Visitor<'de> for TraceVisitor {
    type Value = Parts<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a trace")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Parts<'de>, A::Error> {
        let mut parts = Parts::default();
        let mut schema_version = None; // checked, not kept: the model has no field for it
        while let Some(Text(key)) = map.next_key()? {
            if self.options.strict_seed && !TOP_LEVEL_SEED_KEYS.contains(&&*key) {
                return Err(decline());
            }
            match &*key {
                "trace_id" => once(&mut parts.trace_id, map.next_value::<Text>()?.non_empty()?)?,
                "task_id" => once(&mut parts.task_id, map.next_value::<Text>()?.non_empty()?)?,
                "system" => once(&mut parts.system, map.next_value::<Text>()?.0.into_owned())?,
                "topology" => once(&mut parts.topology, map.next_value::<Text>()?.enumerated(Topology::from_name)?)?,
                "events" => once(&mut parts.events, map.next_value_seed(Seq(Events))?)?,
                "edges" => once(&mut parts.edges, map.next_value()?)?,
                "rewards" => once(&mut parts.rewards, map.next_value_seed(Object(Numbers { non_negative: false }))?)?,
                "costs" => once(&mut parts.costs, map.next_value_seed(Object(Numbers { non_negative: true }))?)?,
                "metrics" => once(&mut parts.metrics, map.next_value_seed(Object(Numbers { non_negative: false }))?)?,
                "schema_version" => {
                    once(&mut schema_version, rule(map.next_value::<Num>()?.whole()?, check_schema_version)?)?
                }
                "group_id" => once(&mut parts.group_id, map.next_value::<Text>()?.non_empty()?)?,
                "policy_version" => {
                    let version = map.next_value::<Num>()?.whole()?;
                    rule(version as f64, check_non_negative)?;
                    once(&mut parts.policy_version, version)?
                }
                "counterfactual_of" => {
                    once(&mut parts.counterfactual_of, map.next_value_seed(Object(CounterfactualVisitor))?)?
                }
                // A repeated other key resolves as in the Reader: Map keeps the last value.
                _ => _ = parts.attributes.insert(key.into_owned(), map.next_value()?),
            }
        }
        Ok(parts)
    }
}

/// Reads a JSON array with the wrapped visitor (`deserialize_seq` takes nothing else).
struct Seq<V>(V);

impl<'de, V: Visitor<'de>> DeserializeSeed<'de> for Seq<V> {
    type Value = V::Value;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<V::Value, D::Error> {
        deserializer.deserialize_seq(self.0)
    }
}

/// Reads a JSON object with the wrapped visitor (`deserialize_map` takes nothing else).
struct Object<V>(V);

impl<'de, V: Visitor<'de>> DeserializeSeed<'de> for Object<V> {
    type Value = V::Value;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<V::Value, D::Error> {
        deserializer.deserialize_map(self.0)
    }
}
