//! A JSON value as a converter reads it: strings borrowed from the input where they have no
//! escapes, objects as key lists (small, read by a few keys), and Python's view of the values
//! (a foreign record may also come from Python objects, so its type names, truthiness and
//! equality are Python's: the converters' errors and choices read the same either way).

use std::borrow::Cow;
use std::fmt;

use serde_core::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

pub(crate) mod scan;

#[derive(Clone, Debug)]
pub enum Json<'a> {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(Cow<'a, str>),
    Array(Vec<Json<'a>>),
    /// Keys are unique (a repeated key keeps its first place and its last value, as a Python
    /// dict built from the document does).
    Object(Vec<(Cow<'a, str>, Json<'a>)>),
    /// A Python object with no JSON form, by its type's name (in-memory records only).
    Other(String),
}

impl<'a> Json<'a> {
    /// `record.get(key)` of an object: `None` when absent, or when `self` is no object.
    pub fn get(&self, key: &str) -> Option<&Json<'a>> {
        match self {
            Json::Object(entries) => entries.iter().find(|(name, _)| name == key).map(|(_, value)| value),
            _ => None,
        }
    }

    /// `record.get(key)` with JSON null read as absent (Python's `is not None` tests).
    pub fn field(&self, key: &str) -> Option<&Json<'a>> {
        self.get(key).filter(|value| !matches!(value, Json::Null))
    }

    /// The text at `key`, when it is text.
    pub fn str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Json::as_str)
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(text) => Some(text),
            _ => None,
        }
    }

    pub fn is_object(&self) -> bool {
        matches!(self, Json::Object(_))
    }

    /// Python's truthiness of the value.
    pub fn truthy(&self) -> bool {
        match self {
            Json::Null => false,
            Json::Bool(flag) => *flag,
            Json::Int(n) => *n != 0,
            Json::UInt(n) => *n != 0,
            Json::Float(x) => *x != 0.0,
            Json::Str(text) => !text.is_empty(),
            Json::Array(items) => !items.is_empty(),
            Json::Object(entries) => !entries.is_empty(),
            Json::Other(_) => true,
        }
    }

    /// `get(key)` when truthy (Python's `record.get(key) or ...`).
    pub fn truthy_field(&self, key: &str) -> Option<&Json<'a>> {
        self.get(key).filter(|value| value.truthy())
    }

    /// The value's JSON type in words (Python's type name for anything JSON cannot hold).
    pub fn describe(&self) -> &str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "a boolean",
            Json::Int(_) | Json::UInt(_) | Json::Float(_) => "a number",
            Json::Str(_) => "text",
            Json::Array(_) => "a list",
            Json::Object(_) => "an object",
            Json::Other(name) => name,
        }
    }

    /// Python's name of the value's type, as `json.loads` makes it.
    pub fn python_type(&self) -> &str {
        match self {
            Json::Null => "NoneType",
            Json::Bool(_) => "bool",
            Json::Int(_) | Json::UInt(_) => "int",
            Json::Float(_) => "float",
            Json::Str(_) => "str",
            Json::Array(_) => "list",
            Json::Object(_) => "dict",
            Json::Other(name) => name,
        }
    }

    /// An integer that is not a boolean (Python's `isinstance(v, int) and not isinstance(v, bool)`).
    pub fn as_integer(&self) -> Option<i128> {
        match self {
            Json::Int(n) => Some(i128::from(*n)),
            Json::UInt(n) => Some(i128::from(*n)),
            _ => None,
        }
    }

    /// A number, booleans included (Python's `isinstance(v, (int, float))`).
    pub fn as_number(&self) -> Option<f64> {
        match self {
            Json::Bool(flag) => Some(f64::from(u8::from(*flag))),
            Json::Int(n) => Some(*n as f64),
            Json::UInt(n) => Some(*n as f64),
            Json::Float(x) => Some(*x),
            _ => None,
        }
    }

    /// A finite number that is not a boolean.
    pub fn as_finite(&self) -> Option<f64> {
        match self {
            Json::Int(_) | Json::UInt(_) | Json::Float(_) => self.as_number().filter(|x| x.is_finite()),
            _ => None,
        }
    }

    /// Python's `==`: numbers compare by value across int, float and bool; objects ignore order.
    pub fn py_eq(&self, other: &Json<'_>) -> bool {
        match (self, other) {
            (Json::Null, Json::Null) => true,
            (Json::Str(a), Json::Str(b)) => a == b,
            (Json::Array(a), Json::Array(b)) => a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.py_eq(y)),
            (Json::Object(a), Json::Object(b)) => {
                a.len() == b.len() && a.iter().all(|(key, x)| other.get(key).is_some_and(|y| x.py_eq(y)))
            }
            (Json::Other(_), _) | (_, Json::Other(_)) => false,
            _ => match (self.as_integer_or_bool(), other.as_integer_or_bool()) {
                (Some(a), Some(b)) => a == b,
                _ => match (self.as_number(), other.as_number()) {
                    (Some(a), Some(b)) => a == b,
                    _ => false,
                },
            },
        }
    }

    fn as_integer_or_bool(&self) -> Option<i128> {
        match self {
            Json::Bool(flag) => Some(i128::from(*flag)),
            _ => self.as_integer(),
        }
    }

    /// The value as serde_json holds it, for a trace's value at nesting `level` (the trace
    /// object is level 1). `Err` carries the JSON pointer (below the value) and the reason of
    /// what a trace cannot hold, as `load_traces` words it for Python objects.
    pub fn to_value(&self, level: usize) -> Result<Value, (String, String)> {
        if matches!(self, Json::Array(_) | Json::Object(_)) && level > crate::validate::MAX_DEPTH {
            return Err((String::new(), crate::validate::depth_error()));
        }
        Ok(match self {
            Json::Null => Value::Null,
            Json::Bool(flag) => Value::Bool(*flag),
            Json::Int(n) => Value::from(*n),
            Json::UInt(n) => Value::from(*n),
            Json::Float(x) => match Number::from_f64(*x) {
                Some(number) => Value::Number(number),
                None => return Err((String::new(), format!("{x} is not a finite number"))),
            },
            Json::Str(text) => Value::String(text.to_string()),
            Json::Array(items) => Value::Array(
                items
                    .iter()
                    .enumerate()
                    .map(|(index, item)| item.to_value(level + 1).map_err(|(at, why)| (format!("/{index}{at}"), why)))
                    .collect::<Result<_, _>>()?,
            ),
            Json::Object(entries) => {
                let mut map = Map::with_capacity(entries.len());
                for (key, item) in entries {
                    let value = item
                        .to_value(level + 1)
                        .map_err(|(at, why)| (format!("/{}{at}", crate::validate::pointer_segment(key)), why))?;
                    map.insert(key.to_string(), value);
                }
                Value::Object(map)
            }
            Json::Other(name) => return Err((String::new(), format!("a Python {name} has no JSON form"))),
        })
    }

    /// Writes the value as JSON text, as serde_json writes what [`Json::to_value`] makes of
    /// it; `Err` (the text then cut short) where `to_value` fails, with the same pointer and
    /// reason.
    pub fn write_json(&self, level: usize, text: &mut Vec<u8>) -> Result<(), (String, String)> {
        if matches!(self, Json::Array(_) | Json::Object(_)) && level > crate::validate::MAX_DEPTH {
            return Err((String::new(), crate::validate::depth_error()));
        }
        match self {
            Json::Null => text.extend_from_slice(b"null"),
            Json::Bool(flag) => text.extend_from_slice(if *flag { b"true" } else { b"false" }),
            Json::Int(n) => write_serialized(text, n),
            Json::UInt(n) => write_serialized(text, n),
            Json::Float(x) if x.is_finite() => write_serialized(text, x),
            Json::Float(x) => return Err((String::new(), format!("{x} is not a finite number"))),
            Json::Str(value) => write_str(text, value),
            Json::Array(items) => {
                text.push(b'[');
                for (index, item) in items.iter().enumerate() {
                    if index > 0 {
                        text.push(b',');
                    }
                    item.write_json(level + 1, text).map_err(|(at, why)| (format!("/{index}{at}"), why))?;
                }
                text.push(b']');
            }
            Json::Object(entries) => {
                text.push(b'{');
                for (index, (key, item)) in entries.iter().enumerate() {
                    if index > 0 {
                        text.push(b',');
                    }
                    write_str(text, key);
                    text.push(b':');
                    item.write_json(level + 1, text)
                        .map_err(|(at, why)| (format!("/{}{at}", crate::validate::pointer_segment(key)), why))?;
                }
                text.push(b'}');
            }
            Json::Other(name) => return Err((String::new(), format!("a Python {name} has no JSON form"))),
        }
        Ok(())
    }

    /// An object's entry, replacing an earlier one of the same key in its place.
    pub fn insert(entries: &mut Vec<(Cow<'a, str>, Json<'a>)>, key: Cow<'a, str>, value: Json<'a>) {
        match entries.iter_mut().find(|(name, _)| *name == key) {
            Some(entry) => entry.1 = value,
            None => entries.push((key, value)),
        }
    }
}

/// `value` as serde_json writes it, added to `text`.
pub(crate) fn write_serialized(text: &mut Vec<u8>, value: &(impl serde_core::Serialize + ?Sized)) {
    // Into memory, serde_json's writing of a scalar or of a value it made cannot fail.
    let _ = serde_json::to_writer(text, value);
}

/// `value` as serde_json writes a string, added to `text`: as it is, quoted, when it holds
/// nothing to escape (serde_json looks at it a byte at a time).
pub(crate) fn write_str(text: &mut Vec<u8>, value: &str) {
    if first_special(value.as_bytes()).is_some() {
        return write_serialized(text, value);
    }
    text.reserve(value.len() + 2);
    text.push(b'"');
    text.extend_from_slice(value.as_bytes());
    text.push(b'"');
}

/// Where the first byte of `bytes` is that a JSON string holds only escaped (a quote, a
/// backslash, a control character): a string's end, an escape, or text JSON refuses; eight
/// bytes at a time.
pub(crate) fn first_special(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    // The bytes of `word` below `n` (at most 0x80) set their high bit in this; a byte above
    // the first such byte may be set too, by its borrow, but the first set is the first below.
    let below = |word: u64, n: u8| word.wrapping_sub(ONES * u64::from(n)) & !word & (ONES << 7);
    let mut words = bytes.chunks_exact(8);
    for (index, word) in (&mut words).enumerate() {
        let word = u64::from_le_bytes(word.try_into().ok()?);
        let quote = word ^ (ONES * u64::from(b'"'));
        let backslash = word ^ (ONES * u64::from(b'\\'));
        let found = below(quote, 1) | below(backslash, 1) | below(word, 0x20);
        if found != 0 {
            return Some(index * 8 + found.trailing_zeros() as usize / 8);
        }
    }
    let rest = words.remainder();
    let at = rest.iter().position(|&byte| matches!(byte, b'"' | b'\\' | 0..0x20))?;
    Some(bytes.len() - rest.len() + at)
}

/// Python's `repr` of a value as `json.loads` made it (errors quote the value they refuse).
pub fn py_repr(value: &Json<'_>) -> String {
    match value {
        Json::Null => "None".to_owned(),
        Json::Bool(true) => "True".to_owned(),
        Json::Bool(false) => "False".to_owned(),
        Json::Int(n) => n.to_string(),
        Json::UInt(n) => n.to_string(),
        Json::Float(x) => float_repr(*x),
        Json::Str(text) => repr(text),
        Json::Array(items) => format!("[{}]", items.iter().map(py_repr).collect::<Vec<_>>().join(", ")),
        Json::Object(entries) => {
            let items: Vec<String> =
                entries.iter().map(|(key, item)| format!("{}: {}", repr(key), py_repr(item))).collect();
            format!("{{{}}}", items.join(", "))
        }
        Json::Other(name) => format!("<{name} object>"),
    }
}

/// Python's `str` of a value: text as it is, anything else as its `repr`.
pub fn py_str<'v>(value: &'v Json<'_>) -> Cow<'v, str> {
    match value {
        Json::Str(text) => Cow::Borrowed(text),
        other => Cow::Owned(py_repr(other)),
    }
}

/// Python's `repr` of a float: the shortest digits that read back the same (as Rust finds
/// them), written positionally for exponents -4 to 15 and as `d.dde+XX` beyond.
pub fn float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".to_owned();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    let scientific = format!("{:e}", x.abs());
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if x.is_sign_negative() { "-" } else { "" };
    if (-4..16).contains(&exponent) {
        let point = exponent + 1;
        if point <= 0 {
            return format!("{sign}0.{}{digits}", "0".repeat(point.unsigned_abs() as usize));
        }
        let point = point as usize;
        if digits.len() <= point {
            return format!("{sign}{digits}{}.0", "0".repeat(point - digits.len()));
        }
        return format!("{sign}{}.{}", &digits[..point], &digits[point..]);
    }
    let fraction = if digits.len() > 1 { format!(".{}", &digits[1..]) } else { String::new() };
    let exponent_sign = if exponent < 0 { '-' } else { '+' };
    format!("{sign}{}{fraction}e{exponent_sign}{:02}", &digits[..1], exponent.unsigned_abs())
}

/// Python's `repr` of a string (the quote it picks, its escapes), as error messages print ids.
pub fn repr(text: &str) -> String {
    let quote = if text.contains('\'') && !text.contains('"') { '"' } else { '\'' };
    let mut out = String::with_capacity(text.len() + 2);
    out.push(quote);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x100 && (c.is_control() || c == '\u{a0}' || c == '\u{ad}') => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if c.is_control() || (c.is_whitespace() && c != ' ') => {
                if (c as u32) <= 0xffff {
                    out.push_str(&format!("\\u{:04x}", c as u32));
                } else {
                    out.push_str(&format!("\\U{:08x}", c as u32));
                }
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Python's `repr` of an optional string (`None` when absent).
pub fn repr_opt(text: Option<&str>) -> String {
    text.map_or_else(|| "None".to_string(), repr)
}

/// Python's `str` of an optional string in an f-string (`None` when absent).
pub fn str_opt(text: Option<&str>) -> &str {
    text.unwrap_or("None")
}

// ---- reading JSON text ---------------------------------------------------------------------

/// An object key, borrowed when it has no escapes.
struct Key<'de>(Cow<'de, str>);
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Key<'de>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("an object key")
    }

    fn visit_borrowed_str<E: de::Error>(self, value: &'de str) -> Result<Self::Value, E> {
        Ok(Key(Cow::Borrowed(value)))
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Self::Value, E> {
        Ok(Key(Cow::Owned(value.to_owned())))
    }

    fn visit_string<E: de::Error>(self, value: String) -> Result<Self::Value, E> {
        Ok(Key(Cow::Owned(value)))
    }
}

// ---- reading only what a converter reads ---------------------------------------------------

/// Which parts of a record to keep: everything, the named keys of an object (each with what
/// to keep of it; other keys are skipped unread), the same with every other key kept too but
/// its value unread (null: for a converter that counts or names keys it does not read), or
/// each item of an array. A record read this way answers every question the converter asks
/// as the whole record would; what it leaves out (long texts nobody reads, whole tool
/// results) costs no allocation.
#[derive(Debug)]
pub enum Keep {
    All,
    Fields(&'static [(&'static str, Keep)]),
    Keys(&'static [(&'static str, Keep)]),
    Items(&'static Keep),
}

/// Levels of objects and arrays a record may nest: about where Python's `json.loads` stops
/// (its recursion limit, 1000 frames, less those of its callers).
pub const MAX_NESTING: usize = 990;

/// Reads a value at nesting `depth`, keeping what `Keep` says.
pub struct Guided<'k>(pub &'k Keep, pub usize);

impl<'de> DeserializeSeed<'de> for Guided<'_> {
    type Value = Json<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(GuidedVisitor(self.0, self.1))
    }
}

struct GuidedVisitor<'k>(&'k Keep, usize);

impl GuidedVisitor<'_> {
    /// The depth of the container being read, refused past [`MAX_NESTING`] (serde_json's own
    /// limit is off: it would stop at 128, where Python reads on).
    fn enter<E: de::Error>(&self) -> Result<usize, E> {
        if self.1 >= MAX_NESTING { Err(E::custom("recursion limit exceeded")) } else { Ok(self.1 + 1) }
    }
}

impl<'de> Visitor<'de> for GuidedVisitor<'_> {
    type Value = Json<'de>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Json::Null)
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(Json::Null)
    }

    fn visit_bool<E>(self, value: bool) -> Result<Self::Value, E> {
        Ok(Json::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Self::Value, E> {
        Ok(Json::Int(value))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Self::Value, E> {
        Ok(i64::try_from(value).map_or(Json::UInt(value), Json::Int))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Self::Value, E> {
        Ok(Json::Float(value))
    }

    fn visit_borrowed_str<E>(self, value: &'de str) -> Result<Self::Value, E> {
        Ok(Json::Str(Cow::Borrowed(value)))
    }

    fn visit_str<E>(self, value: &str) -> Result<Self::Value, E> {
        Ok(Json::Str(Cow::Owned(value.to_owned())))
    }

    fn visit_string<E>(self, value: String) -> Result<Self::Value, E> {
        Ok(Json::Str(Cow::Owned(value)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let depth = self.enter()?;
        let item = match self.0 {
            Keep::Items(item) => item,
            keep => keep,
        };
        let mut items = Vec::new();
        while let Some(value) = seq.next_element_seed(Guided(item, depth))? {
            items.push(value);
        }
        Ok(Json::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let depth = self.enter()?;
        let mut entries = Entries::new(self.0);
        while let Some(Key(key)) = map.next_key_seed(KeySeed)? {
            match entries.slot(&key) {
                Some((keep, bit)) => {
                    let value = map.next_value_seed(Guided(keep, depth))?;
                    entries.put(key, value, bit);
                }
                None => {
                    map.next_value::<de::IgnoredAny>()?;
                    entries.skipped(key);
                }
            }
        }
        Ok(Json::Object(entries.into_entries()))
    }
}

/// The entries of an object being read as a [`Keep`] says.
pub(crate) struct Entries<'k, 'a> {
    /// The named fields to keep (`None`: every key, all of its value).
    fields: Option<&'k [(&'static str, Keep)]>,
    /// Whether a key not named is kept too, its value unread (null).
    other_keys: bool,
    /// The named fields seen so far (a bit each), so that only a repeated one looks for its
    /// earlier entry.
    seen: u64,
    entries: Vec<(Cow<'a, str>, Json<'a>)>,
}

impl<'k, 'a> Entries<'k, 'a> {
    pub(crate) fn new(keep: &'k Keep) -> Self {
        let (fields, other_keys): (Option<&[(&str, Keep)]>, bool) = match keep {
            Keep::All => (None, false),
            Keep::Fields(fields) => (Some(fields), false),
            Keep::Keys(fields) => (Some(fields), true),
            // An object where items were expected: only its type is read.
            Keep::Items(_) => (Some(&[]), false),
        };
        // Room for every kept field at once.
        Entries { fields, other_keys, seen: 0, entries: Vec::with_capacity(fields.map_or(0, <[_]>::len)) }
    }

    /// What to keep of the value at `key`, and the key's bit for [`Entries::put`]; `None`
    /// when the value is to be skipped.
    pub(crate) fn slot(&self, key: &str) -> Option<(&'k Keep, u64)> {
        let Some(fields) = self.fields else { return Some((&Keep::All, 0)) };
        let at = fields.iter().position(|(name, _)| *name == key)?;
        Some((&fields[at].1, 1u64.checked_shl(at as u32).unwrap_or(0)))
    }

    /// The value read at `key` (its bit from [`Entries::slot`]).
    pub(crate) fn put(&mut self, key: Cow<'a, str>, value: Json<'a>, bit: u64) {
        let first = bit != 0 && self.seen & bit == 0;
        self.seen |= bit;
        if first {
            self.entries.push((key, value));
        } else {
            Json::insert(&mut self.entries, key, value);
        }
    }

    /// A key whose value was skipped.
    pub(crate) fn skipped(&mut self, key: Cow<'a, str>) {
        if self.other_keys {
            Json::insert(&mut self.entries, key, Json::Null);
        }
    }

    pub(crate) fn into_entries(self) -> Vec<(Cow<'a, str>, Json<'a>)> {
        self.entries
    }
}
