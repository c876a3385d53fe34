//! Core errors -> the Python exception hierarchy of `masreplay.errors` (rooted at
//! `MasreplayError`). The classes live in Python so they can inherit from both
//! `MasreplayError` and the matching builtin (`ValueError`, `OSError`). Also the way in:
//! named arguments (estimator, unit, ...) are parsed here, once, into the core's enums.

use masreplay_core::{MasreplayError, Named, ValidationError};
use pyo3::prelude::*;
use pyo3::types::PyString;

fn exception<'py, A: pyo3::call::PyCallArgs<'py>>(py: Python<'py>, class: &str, args: A) -> PyErr {
    let made =
        py.import("masreplay.errors").and_then(|module| module.getattr(class)).and_then(|class| class.call1(args));
    match made {
        Ok(instance) => PyErr::from_value(instance),
        Err(import_failure) => import_failure,
    }
}

/// The `TraceValidationError` instance for one rejected trace.
pub fn validation_error(py: Python<'_>, error: &ValidationError) -> PyErr {
    exception(py, "TraceValidationError", (error.trace_id.clone(), error.path.clone(), error.reason.clone()))
}

/// The `ConversionError` instance for a record a converter cannot read, with the trace's
/// `TraceValidationError` as its cause when the converted trace broke the data contract.
pub fn conversion_error(py: Python<'_>, error: &masreplay_core::convert::ConversionError) -> PyErr {
    let raised = exception(py, "ConversionError", (error.source.clone(), error.line, error.reason.clone()));
    if let Some(cause) = &error.cause {
        raised.set_cause(py, Some(validation_error(py, cause)));
    }
    raised
}

/// The `ArgumentTypeError` (an `InvalidArgumentError` and a `TypeError`) for an argument of
/// the wrong type; `message` names the argument and what it takes.
pub fn wrong_type(py: Python<'_>, message: String) -> PyErr {
    exception(py, "ArgumentTypeError", (message,))
}

pub fn to_py(py: Python<'_>, error: MasreplayError) -> PyErr {
    let error = match error {
        // What a Python callback raised, re-raised as it was.
        MasreplayError::Callback(raised) => match raised.downcast::<PyErr>() {
            Ok(raised) => return *raised,
            Err(other) => MasreplayError::Callback(other),
        },
        other => other,
    };
    match &error {
        MasreplayError::Validation(inner) => validation_error(py, inner),
        MasreplayError::Io { path, source } => {
            exception(py, "StorageError", (source.raw_os_error().unwrap_or(0), source.to_string(), path.clone()))
        }
        MasreplayError::Arrow(_) | MasreplayError::Parquet(_) | MasreplayError::DataFormat { .. } => {
            exception(py, "DataFormatError", (error.to_string(),))
        }
        MasreplayError::InvalidArgument(message) => exception(py, "InvalidArgumentError", (message.clone(),)),
        MasreplayError::TraceNotFound(trace_id) => exception(py, "TraceNotFoundError", (trace_id.clone(),)),
        MasreplayError::Callback(other) => pyo3::exceptions::PyRuntimeError::new_err(other.to_string()),
        // Only a call run by `interrupt::interruptible` is stopped, and it raises what the
        // signal handler raised instead; this stands in should a stop ever reach here.
        MasreplayError::Interrupted => pyo3::exceptions::PyKeyboardInterrupt::new_err(error.to_string()),
    }
}

/// A Python exception raised inside a callback the core runs, carried through the core.
pub fn from_callback(raised: PyErr) -> MasreplayError {
    MasreplayError::Callback(Box::new(raised))
}

/// A named argument (`estimator="grpo"`, `unit="events"`, ...) as the core's enum: parsed as
/// the call's arguments are converted, so an unknown name raises InvalidArgumentError before
/// any work starts, with the core's message.
pub struct Arg<T>(pub T);

impl<T: Named> FromPyObject<'_, '_> for Arg<T> {
    type Error = PyErr;

    fn extract(object: pyo3::Borrowed<'_, '_, PyAny>) -> PyResult<Self> {
        let text = object.cast::<PyString>()?;
        T::parse(&text.to_cow()?).map(Arg).or_raise(object.py())
    }
}

/// `result.or_raise(py)?` turns a core result into a Python exception.
pub trait OrRaise<T> {
    fn or_raise(self, py: Python<'_>) -> PyResult<T>;
}

impl<T, E: Into<MasreplayError>> OrRaise<T> for Result<T, E> {
    fn or_raise(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|error| to_py(py, error.into()))
    }
}
