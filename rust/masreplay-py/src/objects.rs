//! Python objects (dicts, lists, numbers, ...) -> a JSON tape (`masreplay_core::validate::tape`),
//! with the JSON pointer of any value JSON cannot hold (NaN, infinities, non-string keys, foreign
//! types) or that nests deeper than a trace may ([`MAX_DEPTH`], which also ends a dict or list
//! that contains itself).
//!
//! Copying needs the GIL; checking the copy does not. The objects are copied in chunks: while
//! the pool checks one chunk's tape, this thread copies the next (two tapes, reused, so the
//! copies stay small and in cache), and it waits for the pool with the GIL released.
//!
//! Python code runs while a value is read (`__index__`, `__float__`, `__iter__`), and it may
//! change the containers: each dict and list is read from a snapshot of its items, taken
//! before any of them is read, never iterated live.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use rayon::prelude::*;

use masreplay_core::validate::tape::Tape;
use masreplay_core::validate::{MAX_DEPTH, ValidateOptions, depth_error, pointer_segment, trace_from_tape};
use masreplay_core::{Trace, ValidationError};

/// The nodes of one chunk's tape (about 1.5 MB, and its text): enough traces to spread over the
/// pool, few enough to stay in cache.
const CHUNK_NODES: usize = 1 << 16;

/// Checks Python objects (each a dict shaped like a trace), in order.
pub fn read_traces(
    py: Python<'_>,
    objects: &[Bound<'_, PyAny>],
    options: ValidateOptions,
) -> Vec<Result<Trace, ValidationError>> {
    let mut outcomes = Vec::with_capacity(objects.len());
    let (mut filling, mut checking) = (Chunk::default(), Chunk::default());
    let mut items = Items::new();
    let mut rest = filling.fill(objects, &mut items);
    while !rest.is_empty() {
        std::mem::swap(&mut filling, &mut checking);
        let mut checked = rayon::in_place_scope(|scope| {
            let (sender, receiver) = std::sync::mpsc::sync_channel(1);
            let checking = &mut checking;
            scope.spawn(move |_| _ = sender.send(checking.check(options)));
            rest = filling.fill(rest, &mut items); // on this thread, which holds the GIL
            // Waiting for the pool does not need the GIL. (A panic there resumes when the
            // scope ends, so an empty result is never used.)
            py.detach(move || receiver.recv()).unwrap_or_default()
        });
        outcomes.append(&mut checked);
    }
    outcomes.append(&mut py.detach(|| filling.check(options)));
    outcomes
}

/// Documents copied onto one tape: each trace's root node, or why it is not JSON.
#[derive(Default)]
struct Chunk {
    tape: Tape,
    roots: Vec<Result<usize, ValidationError>>,
}

impl Chunk {
    /// Copies objects until the tape is full; returns those left.
    fn fill<'a, 'py>(&mut self, objects: &'a [Bound<'py, PyAny>], items: &mut Items<'py>) -> &'a [Bound<'py, PyAny>] {
        self.tape.clear();
        self.roots.clear();
        for (i, object) in objects.iter().enumerate() {
            if self.tape.mark() >= CHUNK_NODES {
                return &objects[i..];
            }
            let root = self.tape.mark();
            let written = write_trace(object, &mut self.tape, items).map(|()| root).map_err(|not_json| {
                self.tape.truncate(root);
                ValidationError::new(trace_id_of(object).as_deref(), not_json.path, not_json.reason)
            });
            self.roots.push(written);
        }
        &[]
    }

    fn check(&mut self, options: ValidateOptions) -> Vec<Result<Trace, ValidationError>> {
        let tape = &self.tape;
        std::mem::take(&mut self.roots)
            .into_par_iter()
            .map(|root| root.and_then(|root| trace_from_tape(tape, root, options)))
            .collect()
    }
}

/// The trace id of an object that is not JSON, for its error (when it has a usable one).
fn trace_id_of(object: &Bound<'_, PyAny>) -> Option<String> {
    object
        .cast::<PyDict>()
        .ok()
        .and_then(|dict| dict.get_item(intern!(object.py(), "trace_id")).ok().flatten())
        .and_then(|id| id.cast::<PyString>().ok().map(|s| s.to_string()))
        .filter(|id| !id.is_empty())
}

/// Where and why a Python object is not JSON.
pub struct NotJson {
    pub path: String,
    pub reason: String,
}

/// Why a value is not JSON, with the pointer segments from that value up to the trace
/// (innermost first): the pointer is only spelled out when something fails.
struct Failure {
    segments: Vec<String>,
    reason: String,
}

impl Failure {
    fn new(reason: String) -> Self {
        Failure { segments: Vec::new(), reason }
    }

    fn within(mut self, segment: String) -> Self {
        self.segments.push(segment);
        self
    }
}

/// The snapshots of the containers being read, one above the other (a dict's as key, value,
/// key, value, ...): one buffer for all of them, so that reading a container allocates nothing.
type Items<'py> = Vec<Bound<'py, PyAny>>;

/// Writes the trace object onto `tape` (level 1 of [`MAX_DEPTH`]). On failure the tape holds a
/// partial document, which the caller truncates.
fn write_trace<'py>(object: &Bound<'py, PyAny>, tape: &mut Tape, items: &mut Items<'py>) -> Result<(), NotJson> {
    items.clear();
    write(object, tape, items, 1).map_err(|failure| NotJson {
        path: failure.segments.iter().rev().map(|segment| format!("/{segment}")).collect(),
        reason: failure.reason,
    })
}

/// Writes `object`, at nesting `level` (the trace object is level 1).
fn write<'py>(
    object: &Bound<'py, PyAny>,
    tape: &mut Tape,
    items: &mut Items<'py>,
    level: usize,
) -> Result<(), Failure> {
    if object.is_none() {
        tape.null();
        return Ok(());
    }
    if let Ok(flag) = object.cast::<PyBool>() {
        tape.bool(flag.is_true());
        return Ok(());
    }
    if let Ok(text) = object.cast::<PyString>() {
        let text = text.to_str().map_err(|e| Failure::new(format!("string is not valid UTF-8: {e}")))?;
        tape.str(text);
        return Ok(());
    }
    if let Ok(float) = object.cast::<PyFloat>() {
        return write_float(tape, float.value());
    }
    // Plain containers cannot have `__index__`: skipping the lookup keeps them cheap.
    let plain_container = object.is_exact_instance_of::<PyDict>()
        || object.is_exact_instance_of::<PyList>()
        || object.is_exact_instance_of::<PyTuple>();
    if !plain_container
        && (object.cast::<PyInt>().is_ok() || object.hasattr(intern!(object.py(), "__index__")).unwrap_or(false))
    {
        return write_integer(object, tape);
    }
    let container = plain_container
        || object.cast::<PyDict>().is_ok()
        || object.cast::<PyList>().is_ok()
        || object.cast::<PyTuple>().is_ok();
    if container && level > MAX_DEPTH {
        return Err(Failure::new(depth_error()));
    }
    if let Ok(dict) = object.cast::<PyDict>() {
        // Collecting the items runs no Python code, so nothing can change the dict meanwhile.
        let base = items.len();
        items.extend(dict.iter().flat_map(|(key, value)| [key, value]));
        let len = (items.len() - base) / 2;
        let open = tape.open_object();
        for i in 0..len {
            let (key, value) = (items[base + 2 * i].clone(), items[base + 2 * i + 1].clone());
            let Ok(key) = key.cast::<PyString>() else {
                return Err(Failure::new(format!("object keys must be strings, got {}", type_name(&key))));
            };
            let key = key.to_string_lossy();
            tape.str(&key);
            write(&value, tape, items, level + 1).map_err(|failure| failure.within(pointer_segment(&key)))?;
        }
        items.truncate(base);
        tape.close(open, len);
        return Ok(());
    }
    if container {
        let base = items.len();
        match object.cast_exact::<PyList>() {
            Ok(list) => items.extend(list.iter()),
            Err(_) => {
                for item in object.try_iter().map_err(|e| Failure::new(e.to_string()))? {
                    items.push(item.map_err(|e| Failure::new(e.to_string()))?);
                }
            }
        }
        let len = items.len() - base;
        let open = tape.open_array();
        for i in 0..len {
            let item = items[base + i].clone();
            write(&item, tape, items, level + 1).map_err(|failure| failure.within(i.to_string()))?;
        }
        items.truncate(base);
        tape.close(open, len);
        return Ok(());
    }
    if object.hasattr(intern!(object.py(), "__float__")).unwrap_or(false) {
        let value: f64 = object.extract().map_err(|e: PyErr| Failure::new(e.to_string()))?;
        return write_float(tape, value);
    }
    Err(Failure::new(format!("{} is not a JSON value", type_name(object))))
}

fn write_integer(object: &Bound<'_, PyAny>, tape: &mut Tape) -> Result<(), Failure> {
    if let Ok(n) = object.extract::<i64>() {
        tape.int(n);
        return Ok(());
    }
    if let Ok(n) = object.extract::<u64>() {
        tape.uint(n);
        return Ok(());
    }
    // Wider integers become the nearest double, as a JSON parser reads them.
    let wide: f64 = object.extract().map_err(|e: PyErr| Failure::new(e.to_string()))?;
    write_float(tape, wide)
}

fn write_float(tape: &mut Tape, value: f64) -> Result<(), Failure> {
    if !value.is_finite() {
        return Err(Failure::new(format!("{value} is not a finite number")));
    }
    tape.float(value);
    Ok(())
}

fn type_name(object: &Bound<'_, PyAny>) -> String {
    object.get_type().name().map(|n| format!("a value of type {n}")).unwrap_or_else(|_| "a value".into())
}
