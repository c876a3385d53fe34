//! `masreplay._core.TraceBatch`: a frozen handle on a core batch. Arrow leaves through the
//! PyCapsule stream interface (no copy); offsets leave as numpy arrays that own their Vec.

use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{ArrayRef, RecordBatch, StructArray};
use arrow_schema::Field;
use masreplay_core::TraceBatch;
use masreplay_core::store::{batches_or_empty, take_texts};
use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use pyo3_arrow::ffi::{ArrayIterator, to_stream_pycapsule};
use pyo3_arrow::{PyArray, PyTable};

use crate::errors::OrRaise;
use crate::interrupt::{arrow_values, interruptible};

#[pyclass(module = "masreplay._core", name = "TraceBatch", frozen)]
pub struct PyTraceBatch {
    pub inner: TraceBatch,
}

/// Exports record batches as an Arrow C stream capsule.
pub fn stream_capsule<'py>(
    py: Python<'py>,
    batch: &RecordBatch,
    requested_schema: Option<Bound<'py, PyCapsule>>,
) -> PyResult<Bound<'py, PyCapsule>> {
    let schema = batch.schema();
    let array: ArrayRef = Arc::new(StructArray::from(batch.clone()));
    let field = Field::new_struct("", schema.fields().clone(), false).with_metadata(schema.metadata().clone());
    let reader = Box::new(ArrayIterator::new(std::iter::once(Ok(array)), Arc::new(field)));
    Ok(to_stream_pycapsule(py, reader, requested_schema)?)
}

/// The record batches of Arrow input (anything with `__arrow_c_stream__`). Importing can fail
/// on data that breaks its own schema (nulls in a non-null column): a DataFormatError. Nothing
/// is read from the arrays yet; the core checks them in full before use.
pub fn arrow_input(py: Python<'_>, table: &Bound<'_, PyAny>) -> PyResult<Vec<RecordBatch>> {
    let not_arrow = |reason: String| {
        let reason = arrow_schema::ArrowError::InvalidArgumentError(reason);
        crate::errors::to_py(py, masreplay_core::MasreplayError::Arrow(reason))
    };
    // The importer panics on some malformed schemas (a field name that is not UTF-8): caught
    // here as a last resort, and said to be a bug.
    match masreplay_core::error::catch_panic(|| table.extract::<PyTable>()) {
        Ok(Ok(table)) => {
            let (batches, schema) = table.into_inner();
            Ok(batches_or_empty(batches, schema))
        }
        Ok(Err(error)) => Err(not_arrow(error.to_string())),
        Err(message) => Err(not_arrow(format!(
            "the Arrow importer panicked on this data ({message}); a panic caught is a bug, please report it to masreplay"
        ))),
    }
}

fn table(batch: RecordBatch) -> PyResult<PyTable> {
    let schema = batch.schema();
    PyTable::try_new(vec![batch], schema)
}

#[pymethods]
impl PyTraceBatch {
    fn __len__(&self) -> usize {
        self.inner.len()
    }

    #[getter]
    fn trace_ids(&self) -> Vec<&str> {
        self.inner.trace_ids()
    }

    #[getter]
    fn event_offsets<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        self.inner.event_offsets().into_pyarray(py)
    }

    #[getter]
    fn edge_offsets<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        self.inner.edge_offsets().into_pyarray(py)
    }

    #[getter]
    fn num_events(&self) -> usize {
        self.inner.num_events()
    }

    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyCapsule>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        stream_capsule(py, self.inner.record_batch(), requested_schema)
    }

    /// One row per event (`trace_index`, `trace_id`, then the event fields).
    fn events(&self, py: Python<'_>) -> PyResult<PyTable> {
        table(self.inner.events().or_raise(py)?)
    }

    /// One per-trace column as an Arrow array (zero-copy).
    fn trace_field(&self, py: Python<'_>, name: &str) -> PyResult<PyArray> {
        let array = self.inner.trace_field(name).or_raise(py)?;
        Ok(PyArray::from_array_ref(array))
    }

    /// One per-event field as an Arrow array (zero-copy), aligned with `events()`.
    fn event_field(&self, py: Python<'_>, name: &str) -> PyResult<PyArray> {
        let array = self.inner.event_field(name).or_raise(py)?;
        Ok(PyArray::from_array_ref(array))
    }

    /// The event ids at `positions` among the batch's events (credit tables' `event_id`):
    /// gathered with their offsets and bytes requested ahead (see `take_texts`).
    fn event_ids_at(&self, py: Python<'_>, positions: PyReadonlyArray1<'_, u64>) -> PyResult<PyArray> {
        let positions = positions.as_slice().map_err(|error| PyValueError::new_err(format!("positions: {error}")))?;
        let ids = self.inner.event_field("id").or_raise(py)?;
        let ids = ids.as_string_opt::<i32>().ok_or_else(|| PyValueError::new_err("event ids are not text"))?;
        let ids = py.detach(|| take_texts(ids, positions)).or_raise(py)?;
        Ok(PyArray::from_array_ref(Arc::new(ids)))
    }

    fn edges(&self, py: Python<'_>) -> PyResult<PyTable> {
        table(self.inner.edges().or_raise(py)?)
    }

    /// The trace at `index` as JSON text; `strict_seed` keeps only what the seed schema allows.
    fn trace_json(&self, py: Python<'_>, index: usize, strict_seed: bool) -> PyResult<String> {
        Ok(self.inner.trace(index).or_raise(py)?.to_json(strict_seed).to_string())
    }

    fn take(&self, py: Python<'_>, indices: Vec<usize>) -> PyResult<Self> {
        Ok(PyTraceBatch { inner: self.inner.take(&indices).or_raise(py)? })
    }

    /// A batch from Arrow data that must hold only valid traces (unpickled state): checked in
    /// full, and the first invalid trace raises.
    #[staticmethod]
    fn restore(py: Python<'_>, table: Bound<'_, PyAny>) -> PyResult<Self> {
        let batches = arrow_input(py, &table)?;
        let inner =
            interruptible(py, arrow_values(&batches), || TraceBatch::from_arrow_strict(&batches))?.or_raise(py)?;
        Ok(PyTraceBatch { inner })
    }

    /// A batch from Arrow data in the canonical layout that masreplay validated in another
    /// process, whose bytes the caller authenticated: only the layout is checked.
    #[staticmethod]
    fn restore_validated(py: Python<'_>, table: Bound<'_, PyAny>) -> PyResult<Self> {
        let batches = arrow_input(py, &table)?;
        let inner = py.detach(|| TraceBatch::from_validated_canonical(&batches)).or_raise(py)?;
        Ok(PyTraceBatch { inner })
    }

    #[staticmethod]
    fn concat(py: Python<'_>, batches: Vec<PyRef<'_, PyTraceBatch>>) -> PyResult<Self> {
        let inner: Vec<&TraceBatch> = batches.iter().map(|b| &b.inner).collect();
        Ok(PyTraceBatch { inner: TraceBatch::concat(&inner).or_raise(py)? })
    }

    fn write_parquet(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let batch = self.inner.record_batch();
        py.detach(|| masreplay_core::store::write_parquet(batch, &path)).or_raise(py)
    }
}
