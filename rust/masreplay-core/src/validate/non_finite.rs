//! NaN and Infinity literals: not JSON, but Python's `json.dump` writes them. A document that is
//! readable but for such literals is read again with each literal swapped for a marker string;
//! every trace that holds one is then rejected by its id at the JSON pointer of the value, and
//! the other traces are checked as usual.

use rayon::prelude::*;
use serde_json::Value;

use super::{ValidateOptions, pointer_segment, trace_from_json};
use crate::error::ValidationError;
use crate::trace::Trace;

const LITERALS: [&str; 3] = ["NaN", "-Infinity", "Infinity"];

/// Marks a swapped literal; the NUL makes a clash with real text implausible.
pub(crate) const MARKER: &str = "\u{0}masreplay-non-finite:";

/// The literal at the position of `error` in `bytes`, if the error is one.
pub(crate) fn literal_at(bytes: &[u8], error: &serde_json::Error) -> Option<&'static str> {
    // serde_json counts lines from 1 and columns (bytes) from 1, pointing at or just after
    // the first byte it could not take.
    let line_start = if error.line() <= 1 {
        0
    } else {
        memchr::memchr_iter(b'\n', bytes).nth(error.line() - 2).map(|newline| newline + 1)?
    };
    let at = line_start + error.column().saturating_sub(1);
    (at.saturating_sub(1)..=at).find_map(|start| literal_starting(bytes, start))
}

fn literal_starting(bytes: &[u8], start: usize) -> Option<&'static str> {
    let rest = bytes.get(start..)?;
    LITERALS.into_iter().find(|literal| rest.starts_with(literal.as_bytes()))
}

/// Follows JSON text byte by byte to tell which bytes belong to a string literal.
#[derive(Default)]
pub(crate) struct JsonStrings {
    in_string: bool,
    escaped: bool,
}

impl JsonStrings {
    /// Whether `byte`, the next byte of the text, belongs to a string (its quotes included).
    pub(crate) fn holds(&mut self, byte: u8) -> bool {
        if self.in_string {
            match (self.escaped, byte) {
                (true, _) => self.escaped = false,
                (false, b'\\') => self.escaped = true,
                (false, b'"') => self.in_string = false,
                _ => {}
            }
            true
        } else {
            self.in_string = byte == b'"';
            self.in_string
        }
    }
}

/// `bytes` with every NaN / Infinity literal outside strings swapped for a marker string;
/// `None` when there is none.
pub(crate) fn with_markers(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(bytes.len() + 64);
    let (mut strings, mut swapped) = (JsonStrings::default(), false);
    let mut at = 0;
    while at < bytes.len() {
        let byte = bytes[at];
        // A literal holds no quote: skipping its bytes leaves the string state as it is.
        if !strings.holds(byte)
            && let Some(literal) = literal_starting(bytes, at)
        {
            out.extend_from_slice(format!("\"\\u0000{}{literal}\"", &MARKER[1..]).as_bytes());
            at += literal.len();
            swapped = true;
            continue;
        }
        out.push(byte);
        at += 1;
    }
    swapped.then_some(out)
}

/// The pointer and literal of the first marker in `value`.
fn first_marker(value: &Value, path: &mut String) -> Option<(String, String)> {
    match value {
        Value::String(text) => text.strip_prefix(MARKER).map(|literal| (path.clone(), literal.to_owned())),
        Value::Array(items) => items.iter().enumerate().find_map(|(i, item)| {
            let depth = path.len();
            path.push_str(&format!("/{i}"));
            let found = first_marker(item, path);
            path.truncate(depth);
            found
        }),
        Value::Object(map) => map.iter().find_map(|(key, item)| {
            let depth = path.len();
            path.push('/');
            path.push_str(&pointer_segment(key));
            let found = first_marker(item, path);
            path.truncate(depth);
            found
        }),
        _ => None,
    }
}

fn check(value: &Value, options: ValidateOptions) -> Result<Trace, ValidationError> {
    match first_marker(value, &mut String::new()) {
        Some((path, literal)) => {
            let trace_id = value.get("trace_id").and_then(Value::as_str).filter(|id| !id.is_empty());
            Err(ValidationError::new(
                trace_id,
                path,
                format!("{literal} is not a JSON number (write null or a finite number)"),
            ))
        }
        None => trace_from_json(value, options),
    }
}

/// The outcomes of the documents in `bytes` when `error` is a NaN / Infinity literal and the
/// text is readable once the literals are marked; `None` otherwise.
pub(super) fn read_marked(
    bytes: &[u8],
    error: &serde_json::Error,
    options: ValidateOptions,
) -> Option<Vec<Result<Trace, ValidationError>>> {
    literal_at(bytes, error)?;
    let marked = with_markers(bytes)?;
    let mut results = Vec::new();
    for document in serde_json::Deserializer::from_slice(&marked).into_iter::<Value>() {
        match document.ok()? {
            Value::Array(items) => results.par_extend(items.par_iter().map(|item| check(item, options))),
            value => results.push(check(&value, options)),
        }
    }
    Some(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_outside_strings_are_marked() {
        let marked = with_markers(br#"{"a": NaN, "b": "NaN", "c": [-Infinity, "\"Infinity"]}"#).unwrap();
        let value: Value = serde_json::from_slice(&marked).unwrap();
        assert_eq!(value["a"], Value::String(format!("{MARKER}NaN")));
        assert_eq!(value["b"], "NaN");
        assert_eq!(value["c"][0], Value::String(format!("{MARKER}-Infinity")));
        assert_eq!(value["c"][1], "\"Infinity");
        assert_eq!(first_marker(&value, &mut String::new()), Some(("/a".into(), "NaN".into())));
        assert!(with_markers(br#"{"a": "NaN"}"#).is_none());
    }
}
