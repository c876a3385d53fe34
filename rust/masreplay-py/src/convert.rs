//! Converters: each source as the core reads it (a file's bytes, borrowed; records given as
//! Python objects, copied while the GIL is held), converted with the GIL released.

use std::borrow::Cow;

use masreplay_core::TraceBatch;
use masreplay_core::convert::{ConversionError, Json, Record, Report, Source};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString};

use crate::batch::PyTraceBatch;
use crate::errors::conversion_error;

/// Levels of nesting copied from Python objects: past it (a list that contains itself), a
/// value stands for no JSON at all, which the trace then refuses if it is ever read into it.
const MAX_COPY_DEPTH: usize = 1000;

/// A source as Python passes it: (name, label for content references, bytes of JSON Lines or a
/// list of dicts, numbered from 1).
type PySource<'py> = (String, String, Bound<'py, PyAny>);

/// (batch, records read, ignored counts, unknown counts, warnings).
type Converted = (PyTraceBatch, usize, Vec<(String, usize)>, Vec<(String, usize)>, Vec<String>);

/// A source's data as the core reads it: a file's bytes (borrowed), or records copied from
/// Python objects (numbered from 1).
enum Input<'a> {
    Text(&'a [u8]),
    Records(Vec<Record<'static>>),
}

impl<'a> Input<'a> {
    fn of(data: &'a Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(match data.cast::<PyBytes>() {
            Ok(bytes) => Input::Text(bytes.as_bytes()),
            Err(_) => Input::Records(
                data.try_iter()?
                    .enumerate()
                    .map(|(index, item)| {
                        item.map(|item| Record { line: index + 1, value: json_of(&item, 0), text: None })
                    })
                    .collect::<PyResult<_>>()?,
            ),
        })
    }

    fn bytes(&self) -> Option<&'a [u8]> {
        match self {
            Input::Text(bytes) => Some(bytes),
            Input::Records(_) => None,
        }
    }
}

/// Converts a Claude Code session: the main transcript, then each sub-agent file.
#[pyfunction]
#[pyo3(name = "convert_claude_code", signature = (sources, *, folder=None, trace_id=None, task_id=None))]
pub fn claude_code(
    py: Python<'_>,
    sources: Vec<PySource<'_>>,
    folder: Option<String>,
    trace_id: Option<String>,
    task_id: Option<String>,
) -> PyResult<Converted> {
    let inputs: Vec<(String, String, Input<'_>)> = sources
        .iter()
        .map(|(name, label, data)| Ok((name.clone(), label.clone(), Input::of(data)?)))
        .collect::<PyResult<_>>()?;
    let options = masreplay_core::convert::claude_code::Options { trace_id, task_id, folder };
    let outcome = py.detach(move || -> Result<(TraceBatch, Report), Box<ConversionError>> {
        let texts: Vec<(&str, &[u8])> =
            inputs.iter().filter_map(|(name, _, input)| Some((name.as_str(), input.bytes()?))).collect();
        let mut parsed = masreplay_core::convert::claude_code::read_files(&texts)?.into_iter();
        let mut read = Vec::with_capacity(inputs.len());
        for (name, label, input) in inputs {
            let records = match input {
                Input::Text(_) => parsed.next().unwrap_or_default(),
                Input::Records(records) => records,
            };
            read.push(Source { name, label, records });
        }
        let (trace, report) = masreplay_core::convert::claude_code::convert(&read, &options)?;
        let main = read.first().map_or(masreplay_core::convert::IN_MEMORY, |source| source.name.as_str());
        Ok((batch_of(main, std::slice::from_ref(&trace))?, report))
    });
    let (inner, report) = outcome.map_err(|error| conversion_error(py, &error))?;
    Ok((PyTraceBatch { inner }, report.records, report.ignored, report.unknown, report.warnings))
}

/// Converts MARBLE episodes: one result log (JSON Lines) or records, one trace per episode.
#[pyfunction]
#[pyo3(name = "convert_marble")]
pub fn marble(py: Python<'_>, source: PySource<'_>) -> PyResult<Converted> {
    let (name, label, data) = source;
    let input = Input::of(&data)?;
    let outcome = py.detach(move || -> Result<(TraceBatch, Report), Box<ConversionError>> {
        let records = match input {
            Input::Text(bytes) => masreplay_core::convert::marble::read(&name, bytes).map_err(Box::new)?,
            Input::Records(records) => records,
        };
        let source = Source { name, label, records };
        let (traces, report) = masreplay_core::convert::marble::convert(&source)?;
        Ok((batch_of(&source.name, &traces)?, report))
    });
    let (inner, report) = outcome.map_err(|error| conversion_error(py, &error))?;
    Ok((PyTraceBatch { inner }, report.records, report.ignored, report.unknown, report.warnings))
}

/// The converted traces as a batch.
fn batch_of(source: &str, traces: &[masreplay_core::Trace]) -> Result<TraceBatch, Box<ConversionError>> {
    TraceBatch::from_traces(traces)
        .map_err(|error| Box::new(ConversionError::new(source, None, format!("converted traces rejected: {error}"))))
}

/// A Python object as the JSON value `json.loads` would have made of it; what JSON cannot
/// hold keeps its type's name (keys that are not text are left out).
fn json_of(object: &Bound<'_, PyAny>, depth: usize) -> Json<'static> {
    if object.is_none() {
        return Json::Null;
    }
    if let Ok(flag) = object.cast::<PyBool>() {
        return Json::Bool(flag.is_true());
    }
    if let Ok(text) = object.cast::<PyString>() {
        return Json::Str(Cow::Owned(text.to_string_lossy().into_owned()));
    }
    if let Ok(number) = object.cast::<PyFloat>() {
        return Json::Float(number.value());
    }
    if let Ok(number) = object.cast::<PyInt>() {
        return match (number.extract::<i64>(), number.extract::<u64>()) {
            (Ok(n), _) => Json::Int(n),
            (_, Ok(n)) => Json::UInt(n),
            _ => number.extract::<f64>().map_or(Json::Float(f64::INFINITY), Json::Float),
        };
    }
    let type_name = || object.get_type().name().map_or_else(|_| "object".to_owned(), |name| name.to_string());
    if depth >= MAX_COPY_DEPTH {
        return Json::Other(type_name());
    }
    if let Ok(dict) = object.cast::<PyDict>() {
        let mut entries = Vec::with_capacity(dict.len());
        for (key, value) in dict.iter() {
            if let Ok(key) = key.cast::<PyString>() {
                entries.push((Cow::Owned(key.to_string_lossy().into_owned()), json_of(&value, depth + 1)));
            }
        }
        return Json::Object(entries);
    }
    if let Ok(list) = object.cast::<PyList>() {
        return Json::Array(list.iter().map(|item| json_of(&item, depth + 1)).collect());
    }
    Json::Other(type_name())
}

/// Converts OpenTelemetry spans: `text`, a file's bytes (one JSON document or JSON Lines of
/// them), or else `document`, the parsed objects themselves.
#[pyfunction]
#[pyo3(name = "convert_otel", signature = (name, document, *, text=None))]
pub fn otel(
    py: Python<'_>,
    name: String,
    document: &Bound<'_, PyAny>,
    text: Option<&Bound<'_, PyBytes>>,
) -> PyResult<Converted> {
    use masreplay_core::convert::{Document, otel};
    let given = match text {
        Some(_) => None,
        None => Some(json_of(document, 0)),
    };
    let bytes = text.map(|text| text.as_bytes());
    let outcome = py.detach(move || -> Result<(TraceBatch, Report), Box<ConversionError>> {
        let (converted, report) = match given {
            Some(value) => otel::convert(&name, &Document::One(value))?,
            None => otel::convert_text(&name, bytes.unwrap_or_default())?,
        };
        let batch = converted.batch().map_err(|error| {
            Box::new(ConversionError::new(&name, None, format!("converted traces rejected: {error}")))
        })?;
        // The traces are in the batch now. Freed here, on the thread that made most of them
        // (mimalloc frees a block of another thread's with an atomic hand-back that its owner
        // collects later: 7% of a one-thread conversion when a pool thread freed them).
        drop(converted);
        Ok((batch, report))
    });
    let (inner, report) = outcome.map_err(|error| conversion_error(py, &error))?;
    Ok((PyTraceBatch { inner }, report.records, report.ignored, report.unknown, report.warnings))
}
