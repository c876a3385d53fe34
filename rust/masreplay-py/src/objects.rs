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
//! before any of them is read, never iterated live. Most traces hold only plain builtin values
//! (no Python code can run while they are read), and those are first read in place, without a
//! snapshot ([`write_plain_trace`]); a trace holding anything else is read again from snapshots.

use std::os::raw::c_int;

use pyo3::exceptions::PyException;
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use rayon::prelude::*;

use masreplay_core::parallel::min_piece;
use masreplay_core::validate::tape::Tape;
use masreplay_core::validate::{MAX_DEPTH, ValidateOptions, depth_error, pointer_segment, trace_from_tape};
use masreplay_core::{Trace, ValidationError};

/// The nodes of one chunk's tape (about 1.5 MB, and its text): enough traces to spread over the
/// pool, few enough to stay in cache.
const CHUNK_NODES: usize = 1 << 16;

/// About how many tape nodes an event takes (a dict of a few fields: a node for each key and
/// each value), to weigh a chunk's checks as [`min_piece`] counts work, in events.
const NODES_PER_EVENT: usize = 16;

/// Checks Python objects (each a dict shaped like a trace), in order. Python code a value runs
/// (`__float__`, `__index__`, `__iter__`) may raise: an `Exception` there says the value is no
/// JSON, and the trace is refused with it; anything else (`KeyboardInterrupt`, `SystemExit`)
/// is no verdict on the data, and ends the read, raised as it was, as does what a signal
/// handler raises between two chunks.
pub fn read_traces(
    py: Python<'_>,
    objects: &[Bound<'_, PyAny>],
    options: ValidateOptions,
) -> PyResult<Vec<Result<Trace, ValidationError>>> {
    let mut outcomes = Vec::with_capacity(objects.len());
    let (mut filling, mut checking) = (Chunk::default(), Chunk::default());
    let mut items = Items::new();
    let mut rest = filling.fill(objects, &mut items)?;
    while !rest.is_empty() {
        // Plain values run no Python code, so the signal handlers (Ctrl-C) run here.
        py.check_signals()?;
        std::mem::swap(&mut filling, &mut checking);
        let step = rayon::in_place_scope(|scope| {
            let (sender, receiver) = std::sync::mpsc::sync_channel(1);
            let checking = &mut checking;
            scope.spawn(move |_| _ = sender.send(checking.check(options)));
            let filled = filling.fill(rest, &mut items); // on this thread, which holds the GIL
            // Waiting for the pool does not need the GIL. (A panic there resumes when the
            // scope ends, so an empty result is never used.)
            let checked = py.detach(move || receiver.recv()).unwrap_or_default();
            filled.map(|left| (left, checked))
        });
        let (left, mut checked) = step?;
        rest = left;
        outcomes.append(&mut checked);
    }
    outcomes.append(&mut py.detach(|| filling.check(options)));
    Ok(outcomes)
}

/// Documents copied onto one tape: each trace's root node, or why it is not JSON.
#[derive(Default)]
struct Chunk {
    tape: Tape,
    roots: Vec<Result<usize, ValidationError>>,
}

impl Chunk {
    /// Copies objects until the tape is full; returns those left, or what interrupted the copy.
    fn fill<'a, 'py>(
        &mut self,
        objects: &'a [Bound<'py, PyAny>],
        items: &mut Items<'py>,
    ) -> PyResult<&'a [Bound<'py, PyAny>]> {
        self.tape.clear();
        self.roots.clear();
        for (i, object) in objects.iter().enumerate() {
            if self.tape.mark() >= CHUNK_NODES {
                return Ok(&objects[i..]);
            }
            let root = self.tape.mark();
            if write_plain_trace(object, &mut self.tape) {
                self.roots.push(Ok(root));
                continue;
            }
            self.tape.truncate(root);
            let written = match write_trace(object, &mut self.tape, items) {
                Ok(()) => Ok(root),
                Err(Failure { interrupt: Some(raised), .. }) => return Err(raised),
                Err(failure) => {
                    self.tape.truncate(root);
                    let path = failure.segments.iter().rev().map(|segment| format!("/{segment}")).collect::<String>();
                    Err(ValidationError::new(trace_id_of(object).as_deref(), path, failure.reason))
                }
            };
            self.roots.push(written);
        }
        Ok(&[])
    }

    fn check(&mut self, options: ValidateOptions) -> Vec<Result<Trace, ValidationError>> {
        let tape = &self.tape;
        std::mem::take(&mut self.roots)
            .into_par_iter()
            .with_min_len(min_piece(tape.mark() / NODES_PER_EVENT))
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

/// Why a value is not JSON, with the pointer segments from that value up to the trace
/// (innermost first): the pointer is only spelled out when something fails. `interrupt`: a
/// Python exception that is no `Exception` (`KeyboardInterrupt`, `SystemExit`) raised by code
/// the value ran, to be raised as it was rather than read as the value's fault.
struct Failure {
    segments: Vec<String>,
    reason: String,
    interrupt: Option<PyErr>,
}

impl Failure {
    fn new(reason: String) -> Self {
        Failure { segments: Vec::new(), reason, interrupt: None }
    }

    /// The failure of a value whose Python code raised `error`.
    fn raised(py: Python<'_>, error: PyErr) -> Self {
        let mut failure = Failure::new(error.to_string());
        if !error.is_instance_of::<PyException>(py) {
            failure.interrupt = Some(error);
        }
        failure
    }

    fn within(mut self, segment: String) -> Self {
        self.segments.push(segment);
        self
    }
}

/// The snapshots of the containers being read, one above the other (a dict's as key, value,
/// key, value, ...): one buffer for all of them, so that reading a container allocates nothing.
type Items<'py> = Vec<Bound<'py, PyAny>>;

/// Writes a trace that holds only plain values, reading the objects in place: exact dicts with
/// string keys, lists, tuples, strings, integers within 64 bits, finite floats, bools and None,
/// at most [`MAX_DEPTH`] levels deep. Returns false at anything else (a subclass, a foreign type,
/// NaN, a wider integer, a string that is not UTF-8, deeper nesting), the tape then holding a
/// partial document: the caller truncates it and reads the trace with [`write_trace`], which
/// says what is wrong, if anything.
fn write_plain_trace(object: &Bound<'_, PyAny>, tape: &mut Tape) -> bool {
    // SAFETY: the GIL is held (`object` is bound to it) and nothing below runs Python code or
    // releases the GIL: only exact builtin types are read, with calls that neither call back into
    // Python nor allocate Python objects (which could start the collector, and a finalizer). So
    // no code can change the containers while they are read, and the borrowed references stay
    // valid. The one call that may fail (the UTF-8 of a string with lone surrogates) creates an
    // exception, which may start the collector: the path then gives up at once, touching nothing
    // borrowed after it. (All of this rests on the GIL: a free-threaded
    // build would need the containers' critical sections.)
    unsafe { write_plain(object.as_ptr(), tape, 1) }
}

/// [`write_plain_trace`] of `object`, at nesting `level`.
///
/// # Safety
/// The GIL is held and `object` is a valid reference that stays alive while this runs.
unsafe fn write_plain(object: *mut ffi::PyObject, tape: &mut Tape, level: usize) -> bool {
    unsafe {
        let kind = ffi::Py_TYPE(object);
        if kind == &raw mut ffi::PyUnicode_Type {
            return match plain_str(object) {
                Some(text) => {
                    tape.str(text);
                    true
                }
                None => false,
            };
        }
        if kind == &raw mut ffi::PyDict_Type {
            if level > MAX_DEPTH {
                return false;
            }
            let open = tape.open_object();
            let (mut position, mut len) = (0, 0);
            let (mut key, mut value) = (std::ptr::null_mut(), std::ptr::null_mut());
            while ffi::PyDict_Next(object, &mut position, &mut key, &mut value) != 0 {
                if ffi::Py_TYPE(key) != &raw mut ffi::PyUnicode_Type {
                    return false;
                }
                let Some(key) = plain_str(key) else { return false };
                tape.str(key);
                if !write_plain(value, tape, level + 1) {
                    return false;
                }
                len += 1;
            }
            tape.close(open, len);
            return true;
        }
        if kind == &raw mut ffi::PyList_Type || kind == &raw mut ffi::PyTuple_Type {
            if level > MAX_DEPTH {
                return false;
            }
            let (size, item): (unsafe extern "C" fn(_) -> _, unsafe extern "C" fn(_, _) -> _) =
                if kind == &raw mut ffi::PyList_Type {
                    (ffi::PyList_Size, ffi::PyList_GetItem)
                } else {
                    (ffi::PyTuple_Size, ffi::PyTuple_GetItem)
                };
            let len = size(object);
            let open = tape.open_array();
            for i in 0..len {
                if !write_plain(item(object, i), tape, level + 1) {
                    return false;
                }
            }
            tape.close(open, len as usize);
            return true;
        }
        if kind == &raw mut ffi::PyFloat_Type {
            let value = ffi::PyFloat_AsDouble(object);
            if !value.is_finite() {
                return false;
            }
            tape.float(value);
            return true;
        }
        if kind == &raw mut ffi::PyLong_Type {
            let mut overflow: c_int = 0;
            let value = ffi::PyLong_AsLongLongAndOverflow(object, &mut overflow);
            if overflow != 0 {
                return false;
            }
            tape.int(value);
            return true;
        }
        if object == ffi::Py_None() {
            tape.null();
        } else if object == ffi::Py_True() || object == ffi::Py_False() {
            tape.bool(object == ffi::Py_True());
        } else {
            return false;
        }
        true
    }
}

/// The text of an exact str, or None (its error cleared) when it is not UTF-8 (lone surrogates).
///
/// # Safety
/// The GIL is held and `text` is a valid reference to an exact str, alive while the result is used.
unsafe fn plain_str<'a>(text: *mut ffi::PyObject) -> Option<&'a str> {
    unsafe {
        let mut len: ffi::Py_ssize_t = 0;
        let data = ffi::PyUnicode_AsUTF8AndSize(text, &mut len);
        if data.is_null() {
            ffi::PyErr_Clear();
            return None;
        }
        // Python keeps a str's UTF-8 form with the str, and it is valid UTF-8.
        Some(std::str::from_utf8_unchecked(std::slice::from_raw_parts(data.cast::<u8>(), len as usize)))
    }
}

/// Writes the trace object onto `tape` (level 1 of [`MAX_DEPTH`]). On failure the tape holds a
/// partial document, which the caller truncates.
fn write_trace<'py>(object: &Bound<'py, PyAny>, tape: &mut Tape, items: &mut Items<'py>) -> Result<(), Failure> {
    items.clear();
    write(object, tape, items, 1)
}

/// `Some` of what a call that runs a value's Python code returned, `None` when it raised an
/// `Exception` (the caller tries another reading, or says the value is no JSON), and the
/// interrupt when it raised anything else: a Ctrl-C must not be taken for one more attempt.
fn unless_interrupted<T>(py: Python<'_>, result: PyResult<T>) -> Result<Option<T>, Failure> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(error) if error.is_instance_of::<PyException>(py) => Ok(None),
        Err(error) => Err(Failure::raised(py, error)),
    }
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
    let py = object.py();
    if !plain_container
        && (object.cast::<PyInt>().is_ok()
            || unless_interrupted(py, object.hasattr(intern!(py, "__index__")))?.unwrap_or(false))
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
                for item in object.try_iter().map_err(|e| Failure::raised(py, e))? {
                    items.push(item.map_err(|e| Failure::raised(py, e))?);
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
    if unless_interrupted(py, object.hasattr(intern!(py, "__float__")))?.unwrap_or(false) {
        let value: f64 = object.extract().map_err(|e: PyErr| Failure::raised(py, e))?;
        return write_float(tape, value);
    }
    Err(Failure::new(format!("{} is not a JSON value", type_name(object))))
}

fn write_integer(object: &Bound<'_, PyAny>, tape: &mut Tape) -> Result<(), Failure> {
    let py = object.py();
    if let Some(n) = unless_interrupted(py, object.extract::<i64>())? {
        tape.int(n);
        return Ok(());
    }
    if let Some(n) = unless_interrupted(py, object.extract::<u64>())? {
        tape.uint(n);
        return Ok(());
    }
    // Wider integers become the nearest double, as a JSON parser reads them.
    let wide: f64 = object.extract().map_err(|e: PyErr| Failure::raised(py, e))?;
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
