//! Converters from foreign trace formats. A converter reads the source's records (JSON Lines
//! read here with borrowed strings, or records a binding made from its own objects), builds
//! one trace per conversion as the seed JSON form and checks it like any JSON trace. What it
//! set aside is counted in a [`Report`]; what it cannot read is a [`ConversionError`] naming
//! the file and line.

pub mod claude_code;
mod iso_time;
pub mod json;

use std::borrow::Cow;

use rayon::prelude::*;

use crate::error::ValidationError;
use crate::validate::non_finite;
pub use json::Json;

/// The source name used in errors and reports for records given as objects.
pub const IN_MEMORY: &str = "<object>";

/// A record that cannot be read, or a converted trace the data contract rejects (`cause`).
#[derive(Clone, Debug, PartialEq)]
pub struct ConversionError {
    pub source: String,
    pub line: Option<usize>,
    pub reason: String,
    pub cause: Option<ValidationError>,
}

impl ConversionError {
    pub fn new(source: &str, line: Option<usize>, reason: impl Into<String>) -> Self {
        ConversionError { source: source.to_owned(), line, reason: reason.into(), cause: None }
    }
}

/// What a conversion read, set aside on purpose (`ignored`), did not understand (`unknown`),
/// and found suspicious (`warnings`); counts keep the order in which their keys first came.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    pub records: usize,
    pub ignored: Vec<(String, usize)>,
    pub unknown: Vec<(String, usize)>,
    pub warnings: Vec<String>,
}

impl Report {
    pub(crate) fn count(counts: &mut Vec<(String, usize)>, key: &str) {
        match counts.iter_mut().find(|(name, _)| name == key) {
            Some(entry) => entry.1 += 1,
            None => counts.push((key.to_owned(), 1)),
        }
    }
}

/// One input file (or the records given in memory) of a conversion.
#[derive(Debug)]
pub struct Source<'a> {
    /// The name errors and the report use (the path, or `<object>`).
    pub name: String,
    /// The name `content_ref` pointers use (relative to the session folder, for instance).
    pub label: String,
    /// Each record with its 1-based line number.
    pub records: Vec<(usize, Json<'a>)>,
}

/// The records of JSON Lines text: each non-blank line, which must hold a JSON object. Lines
/// are parsed in parallel; the first broken one (in line order) is the error.
pub fn json_lines<'a>(name: &str, bytes: &'a [u8]) -> Result<Vec<(usize, Json<'a>)>, ConversionError> {
    let lines: Vec<(usize, &[u8])> = bytes
        .split(|&byte| byte == b'\n')
        .enumerate()
        .filter(|(_, raw)| !raw.iter().all(|byte| matches!(byte, b' ' | b'\t' | b'\r' | 0x0b | 0x0c)))
        .map(|(index, raw)| (index + 1, raw))
        .collect();
    let parsed: Vec<Result<(usize, Json<'a>), ConversionError>> = lines
        .into_par_iter()
        .map(|(number, raw)| match parse_line(raw) {
            Ok(Json::Object(entries)) => Ok((number, Json::Object(entries))),
            Ok(other) => Err(ConversionError::new(
                name,
                Some(number),
                format!("expected a JSON object, got {}", other.python_type()),
            )),
            Err(reason) => Err(ConversionError::new(name, Some(number), reason)),
        })
        .collect();
    parsed.into_iter().collect()
}

/// One line as Python's `json.loads` reads bytes: UTF-8 (a leading byte-order mark skipped),
/// NaN and Infinity literals accepted; the error in the converters' words.
fn parse_line(raw: &[u8]) -> Result<Json<'_>, String> {
    let text = raw.strip_prefix(b"\xef\xbb\xbf").unwrap_or(raw);
    if let Err(error) = std::str::from_utf8(text) {
        let start = error.valid_up_to() + (raw.len() - text.len());
        return Err(format!("not UTF-8 text (byte {start}: {})", utf8_reason(raw, start, error.error_len())));
    }
    serde_json::from_slice::<Json<'_>>(text).or_else(|error| {
        if non_finite::literal_at(text, &error).is_some()
            && let Some(marked) = non_finite::with_markers(text)
            && let Ok(value) = serde_json::from_slice::<Json<'_>>(&marked)
        {
            return Ok(value.into_owned_non_finite());
        }
        Err(if error.to_string().starts_with("recursion limit exceeded") {
            "JSON nested too deeply to read".to_owned()
        } else {
            format!("not valid JSON ({error})")
        })
    })
}

/// Python's words for the first byte its UTF-8 decoder refuses.
fn utf8_reason(raw: &[u8], start: usize, error_len: Option<usize>) -> &'static str {
    match (error_len, raw.get(start)) {
        (None, _) => "unexpected end of data",
        (Some(_), Some(&byte)) if (0xc2..=0xf4).contains(&byte) => "invalid continuation byte",
        _ => "invalid start byte",
    }
}

impl Json<'_> {
    /// The value with no borrowed text, each NaN / Infinity marker (see `non_finite`) read
    /// back as the number it stands for.
    fn into_owned_non_finite(self) -> Json<'static> {
        match self {
            Json::Str(text) => match text.strip_prefix(non_finite::MARKER) {
                Some("NaN") => Json::Float(f64::NAN),
                Some("Infinity") => Json::Float(f64::INFINITY),
                Some("-Infinity") => Json::Float(f64::NEG_INFINITY),
                _ => Json::Str(Cow::Owned(text.into_owned())),
            },
            Json::Array(items) => Json::Array(items.into_iter().map(Json::into_owned_non_finite).collect()),
            Json::Object(entries) => Json::Object(
                entries
                    .into_iter()
                    .map(|(key, value)| (Cow::Owned(key.into_owned()), value.into_owned_non_finite()))
                    .collect(),
            ),
            Json::Null => Json::Null,
            Json::Bool(flag) => Json::Bool(flag),
            Json::Int(n) => Json::Int(n),
            Json::UInt(n) => Json::UInt(n),
            Json::Float(x) => Json::Float(x),
            Json::Other(name) => Json::Other(name),
        }
    }
}
