//! Core errors -> the Python exception hierarchy of `masreplay.errors` (rooted at
//! `MasreplayError`). The classes live in Python so they can inherit from both
//! `MasreplayError` and the matching builtin (`ValueError`, `OSError`).

use masreplay_core::{MasreplayError, ValidationError};
use pyo3::prelude::*;

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

pub fn to_py(py: Python<'_>, error: MasreplayError) -> PyErr {
    match &error {
        MasreplayError::Validation(inner) => validation_error(py, inner),
        MasreplayError::Io { path, source } => {
            exception(py, "StorageError", (source.raw_os_error().unwrap_or(0), source.to_string(), path.clone()))
        }
        MasreplayError::Arrow(_) | MasreplayError::Parquet(_) | MasreplayError::DataFormat { .. } => {
            exception(py, "DataFormatError", (error.to_string(),))
        }
        MasreplayError::InvalidArgument(message) => exception(py, "InvalidArgumentError", (message.clone(),)),
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
