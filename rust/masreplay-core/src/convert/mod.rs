//! Converters from foreign trace formats. A converter reads the source's records (JSON Lines
//! read here with borrowed strings, or records a binding made from its own objects), builds
//! one trace per conversion and checks it as a JSON trace is checked (`validate::event_from_parts`,
//! `trace_from_parts`: the same rules and words, no JSON document in between). What it
//! set aside is counted in a [`Report`]; what it cannot read is a [`ConversionError`] naming
//! the file and line.

mod builder;
pub mod claude_code;
mod iso_time;
pub mod json;
pub mod marble;
pub mod otel;
#[cfg(test)]
mod tests;

use std::borrow::Cow;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::error::ValidationError;
use crate::validate::non_finite;
pub use json::{Json, Keep};

/// The source name used in errors and reports for records given as objects.
pub const IN_MEMORY: &str = "<object>";

/// A record that cannot be read, or a converted trace the data contract rejects (`cause`).
#[derive(Clone, Debug, PartialEq)]
pub struct ConversionError {
    pub source: String,
    pub line: Option<usize>,
    pub reason: String,
    pub cause: Option<Box<ValidationError>>,
}

impl ConversionError {
    pub fn new(source: &str, line: Option<usize>, reason: impl Into<String>) -> Self {
        ConversionError { source: source.to_owned(), line, reason: reason.into(), cause: None }
    }

    /// A converted trace the data contract refuses (`cause`), named by the record it came from.
    pub fn invalid_trace(source: &str, line: Option<usize>, cause: ValidationError) -> Self {
        let trace_id = json::repr_opt(cause.trace_id.as_deref());
        let shown = if cause.path.is_empty() { "/" } else { cause.path.as_str() };
        let reason = format!("converted trace {trace_id} is invalid at {shown}: {}", cause.reason);
        ConversionError { source: source.to_owned(), line, reason, cause: Some(Box::new(cause)) }
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
    /// Counts one more of the key spelled by `parts` (joined only when it is new).
    pub(crate) fn count(counts: &mut Vec<(String, usize)>, parts: &[&str]) {
        Report::add(counts, parts, 1);
    }

    /// Adds the counts and warnings of `other` (a part of the same conversion, made apart).
    pub(crate) fn merge(&mut self, other: Report) {
        for (key, n) in &other.ignored {
            Report::add(&mut self.ignored, &[key], *n);
        }
        for (key, n) in &other.unknown {
            Report::add(&mut self.unknown, &[key], *n);
        }
        self.records += other.records;
        self.warnings.extend(other.warnings);
    }

    /// Counts `n` more of the key spelled by `parts` (joined only when it is new).
    pub(crate) fn add(counts: &mut Vec<(String, usize)>, parts: &[&str], n: usize) {
        let spells = |name: &str| {
            let mut rest = name;
            parts.iter().all(|part| rest.strip_prefix(part).map(|tail| rest = tail).is_some()) && rest.is_empty()
        };
        match counts.iter_mut().find(|(name, _)| spells(name)) {
            Some(entry) => entry.1 += n,
            None => counts.push((parts.concat(), n)),
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
    pub records: Vec<Record<'a>>,
}

/// One record of a source.
#[derive(Debug)]
pub struct Record<'a> {
    /// 1-based, the line number in the file (or the position in the list given).
    pub line: usize,
    /// The record, or the parts of it the converter reads (see [`Keep`]).
    pub value: Json<'a>,
    /// The line's text, when the record came from one (to read it whole when needed).
    pub text: Option<&'a [u8]>,
}

impl<'a> Record<'a> {
    /// The whole record (read again from its text when only parts of it were kept).
    pub fn whole(&self) -> Cow<'_, Json<'a>> {
        match self.text.map(|text| parse_line(text, &Keep::All)) {
            Some(Ok(value)) => Cow::Owned(value),
            _ => Cow::Borrowed(&self.value),
        }
    }
}

/// The records of JSON Lines text: each non-blank line, which must hold a JSON object. Lines
/// are parsed in parallel; the first broken one (in line order) is the error.
pub fn json_lines<'a>(name: &str, bytes: &'a [u8], keep: &Keep) -> Result<Vec<Record<'a>>, ConversionError> {
    Ok(json_lines_of(&[(name, bytes)], keep)?.pop().unwrap_or_default())
}

/// The records of several JSON Lines files (name, text), as [`json_lines`] reads each. The
/// lines of all of them are parsed in one parallel pass ([`shared_map`]); the first broken
/// line, in file then line order, is the error.
pub fn json_lines_of<'a>(files: &[(&str, &'a [u8])], keep: &Keep) -> Result<Vec<Vec<Record<'a>>>, ConversionError> {
    let mut lines: Vec<(usize, usize, &[u8])> = Vec::new();
    for (file, (_, bytes)) in files.iter().enumerate() {
        // memchr finds the line ends 16-32 bytes at a time (a byte-by-byte split was a tenth
        // of a conversion).
        let ends = memchr::memchr_iter(b'\n', bytes).chain(std::iter::once(bytes.len()));
        let mut start = 0;
        lines.extend(
            ends.enumerate()
                .map(|(index, end)| {
                    let raw = &bytes[start..end];
                    start = end + 1;
                    (file, index + 1, raw)
                })
                .filter(|(_, _, raw)| !raw.iter().all(|byte| matches!(byte, b' ' | b'\t' | b'\r' | 0x0b | 0x0c))),
        );
    }
    let bytes: usize = lines.iter().map(|(_, _, raw)| raw.len()).sum();
    let share = (SHARE_BYTES * lines.len() / bytes.max(1)).clamp(1, SHARE);
    let parsed = shared_map(&lines, share, |&(file, number, raw)| {
        let name = files[file].0;
        let record = match parse_line(raw, keep) {
            Ok(Json::Object(entries)) => Ok(Record { line: number, value: Json::Object(entries), text: Some(raw) }),
            Ok(other) => Err(ConversionError::new(
                name,
                Some(number),
                format!("expected a JSON object, got {}", other.python_type()),
            )),
            Err(reason) => Err(ConversionError::new(name, Some(number), reason)),
        };
        (file, record)
    });
    let mut records: Vec<Vec<Record<'a>>> = files.iter().map(|_| Vec::new()).collect();
    for (file, record) in parsed {
        records[file].push(record?);
    }
    Ok(records)
}

/// A file that holds one JSON document, or JSON Lines of them.
#[derive(Debug)]
pub enum Document<'a> {
    One(Json<'a>),
    /// Each non-blank line's object (the text was no single document).
    Lines(Vec<Record<'a>>),
}

/// The text as one JSON document, as Python's `json.loads` of the decoded text reads it; when
/// it is none and spans several lines, as JSON Lines (each line an object). Text that is not
/// UTF-8 fails at the line of its first bad byte.
pub fn json_document<'a>(name: &str, bytes: &'a [u8], keep: &Keep) -> Result<Document<'a>, ConversionError> {
    let text = std::str::from_utf8(bytes).map_err(|error| {
        let start = error.valid_up_to();
        let line = memchr::memchr_iter(b'\n', &bytes[..start]).count() + 1;
        let reason = utf8_reason(bytes, start, error.error_len());
        ConversionError::new(name, Some(line), format!("not UTF-8 text (byte {start}: {reason})"))
    })?;
    // Python reads the decoded text, where a byte-order mark is an error (a line read as
    // bytes skips it).
    let whole = if text.starts_with('\u{feff}') {
        Err("not valid JSON (Unexpected UTF-8 BOM (decode using utf-8-sig): line 1 column 1 (char 0))".to_owned())
    } else {
        parse_line(bytes, keep)
    };
    match whole {
        Ok(value) => Ok(Document::One(value)),
        // Python's str.strip: Unicode whitespace and the four ASCII separators.
        Err(reason)
            if !text.trim_matches(|c: char| c.is_whitespace() || ('\x1c'..='\x1f').contains(&c)).contains('\n') =>
        {
            Err(ConversionError::new(name, None, reason))
        }
        Err(_) => Ok(Document::Lines(json_lines(name, bytes, keep)?)),
    }
}

/// Lines per share of [`shared_map`] at most, and bytes of lines per share: about 50 µs of
/// lines, the longest the calling thread waits for a pool thread that took a share and lost
/// its core. Long lines (MARBLE episodes of 20-90 kB) make shares of fewer lines.
const SHARE: usize = 32;
const SHARE_BYTES: usize = 64 << 10;

/// `items` mapped in order, by the calling thread and the pool's other threads together, each
/// taking the next `share` items until none is left. The calling thread works instead of
/// waiting: on a machine whose cores are busy with other work, a pool thread that starts late
/// finds nothing left (a parallel iterator would wait for the share it was given).
pub(crate) fn shared_map<T: Sync, R: Send>(items: &[T], share: usize, map: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<(usize, Vec<R>)>> = Mutex::new(Vec::new());
    let work = || {
        let mut mine = Vec::new();
        loop {
            let taken = next.fetch_add(1, Ordering::Relaxed);
            let Some(part) = items.chunks(share.max(1)).nth(taken) else { break };
            mine.push((taken, part.iter().map(&map).collect::<Vec<R>>()));
        }
        done.lock().unwrap_or_else(PoisonError::into_inner).extend(mine);
    };
    // No more helpers than shares past the caller's first: the scope waits for every helper
    // to be scheduled, which on a busy machine can take longer than a small input's work.
    let helpers = rayon::current_num_threads().min(items.len().div_ceil(share.max(1))).saturating_sub(1);
    rayon::in_place_scope(|scope| {
        for _ in 0..helpers {
            scope.spawn(|_| work());
        }
        work();
    });
    let mut shares = done.into_inner().unwrap_or_else(PoisonError::into_inner);
    shares.sort_unstable_by_key(|(taken, _)| *taken);
    shares.into_iter().flat_map(|(_, results)| results).collect()
}

/// One line as Python's `json.loads` reads bytes: UTF-8 (a leading byte-order mark skipped),
/// NaN and Infinity literals accepted; the error in the converters' words.
fn parse_line<'a>(raw: &'a [u8], keep: &Keep) -> Result<Json<'a>, String> {
    let bytes = raw.strip_prefix(b"\xef\xbb\xbf").unwrap_or(raw);
    // Checked whole here: serde_json does not check the text it skips.
    let text = std::str::from_utf8(bytes).map_err(|error| {
        let start = error.valid_up_to() + (raw.len() - bytes.len());
        format!("not UTF-8 text (byte {start}: {})", utf8_reason(raw, start, error.error_len()))
    })?;
    // Most lines are read by the fast reader; it leaves the rest (and every error) to serde_json.
    if let Some(value) = json::scan::read(text, keep) {
        return Ok(value);
    }
    if nests_too_deep(bytes) {
        return Err("JSON nested too deeply to read".to_owned());
    }
    read(text, keep).or_else(|error| {
        if non_finite::literal_at(bytes, &error).is_some()
            && let Some(marked) = non_finite::with_markers(bytes).and_then(|marked| String::from_utf8(marked).ok())
            && let Ok(value) = read(&marked, keep)
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

/// One JSON value, keeping what `keep` says.
fn read<'a>(text: &'a str, keep: &Keep) -> Result<Json<'a>, serde_json::Error> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    // Kept values count their own depth (`Guided`); skipped ones are skipped without recursion.
    deserializer.disable_recursion_limit();
    let value = serde_core::de::DeserializeSeed::deserialize(json::Guided(keep, 0), &mut deserializer)?;
    deserializer.end()?;
    Ok(value)
}

/// Whether the text opens more than [`json::MAX_NESTING`] arrays and objects inside one
/// another (Python would not read it; serde_json skips unread values at any depth). Counting
/// the brackets first settles nearly every line without following strings.
fn nests_too_deep(bytes: &[u8]) -> bool {
    if opening_brackets(bytes) <= json::MAX_NESTING {
        return false;
    }
    let (mut depth, mut strings) = (0usize, non_finite::JsonStrings::default());
    for &byte in bytes {
        if strings.holds(byte) {
            continue;
        }
        match byte {
            b'[' | b'{' => {
                depth += 1;
                if depth > json::MAX_NESTING {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// How many `[` and `{` the bytes hold (in strings too). Counted in blocks of 255 bytes into
/// a byte-wide sum, which the compiler turns into one compare and add per 16 bytes.
fn opening_brackets(bytes: &[u8]) -> usize {
    bytes
        .chunks(255)
        .map(|block| {
            let count = block.iter().fold(0u8, |count, &byte| count + u8::from(byte == b'[' || byte == b'{'));
            usize::from(count)
        })
        .sum()
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
