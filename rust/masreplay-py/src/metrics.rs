//! `masreplay._core.metrics`: the per-trace orchestration metrics as an Arrow table.

use masreplay_core::metrics::metrics_table;
use pyo3::prelude::*;
use pyo3_arrow::PyTable;

use crate::batch::PyTraceBatch;
use crate::errors::OrRaise;
use crate::interrupt::interruptible;

/// One row per trace of `batch` (see masreplay_core::metrics::TraceMetrics); runs in Rust
/// with the GIL released.
#[pyfunction]
pub fn metrics(py: Python<'_>, batch: PyRef<'_, PyTraceBatch>) -> PyResult<PyTable> {
    let inner = &batch.inner;
    let table = interruptible(py, inner.num_events(), || metrics_table(inner))?.or_raise(py)?;
    let schema = table.schema();
    PyTable::try_new(vec![table], schema)
}
