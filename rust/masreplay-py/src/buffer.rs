//! `masreplay._core.GraphBuffer`: the core buffer behind a mutex, so rollout threads may add
//! while a trainer thread samples. No call holds the GIL while it waits for the lock (a
//! thread waiting on a long add must not hold up every other Python thread), and every call
//! that does more than read a counter releases it while it holds the lock.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, TryLockError};

use masreplay_core::buffer::{
    self, Gather, Gathered, GraphBuffer, PadValue, Padded, PaddedNumbers, Sampler, ShapeFilter, Unit,
};
use masreplay_core::{MasreplayError, TraceBatch, ensure};
use numpy::{Element, IntoPyArray, PyArray1, PyArray2, PyArrayMethods};
use pyo3::prelude::*;
use pyo3_arrow::{PyArray, PyTable};

use crate::batch::PyTraceBatch;
use crate::errors::{Arg, OrRaise};
use crate::interrupt::{arrow_values, file_values, interruptible};

/// A pad value: Python ints first (a bool is one), then floats.
#[derive(FromPyObject)]
enum Pad {
    Int(i64),
    Float(f64),
}

impl From<Pad> for PadValue {
    fn from(pad: Pad) -> Self {
        match pad {
            Pad::Int(value) => PadValue::Int(value),
            Pad::Float(value) => PadValue::Float(value),
        }
    }
}

/// (values, mask, lengths) of `TraceBatch.padded`.
type PaddedArrays<'py> = (Bound<'py, PyAny>, Bound<'py, PyArray2<bool>>, Bound<'py, PyArray1<i64>>);

fn padded_arrays<N: Element>(py: Python<'_>, padded: Padded<N>) -> PyResult<PaddedArrays<'_>> {
    let shape = [padded.lengths.len(), padded.width];
    let values = padded.values.into_pyarray(py).reshape(shape)?;
    Ok((values.into_any(), padded.mask.into_pyarray(py).reshape(shape)?, padded.lengths.into_pyarray(py)))
}

#[pyclass(module = "masreplay._core", name = "GraphBuffer", frozen)]
pub struct PyGraphBuffer {
    inner: Mutex<GraphBuffer>,
}

impl PyGraphBuffer {
    fn lock(&self) -> MutexGuard<'_, GraphBuffer> {
        // A panic cannot leave the buffer half-changed (every mutation checks first), so a
        // poisoned lock still guards consistent data.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `work` on the locked buffer, with the GIL released.
    fn locked<T: Send>(&self, py: Python<'_>, work: impl FnOnce(&mut GraphBuffer) -> T + Send) -> T {
        py.detach(|| work(&mut self.lock()))
    }

    /// An O(1) `work` (a counter, a setting, an index lookup): run at once, GIL held, when the
    /// lock is free, since releasing the GIL costs more than the work; when another thread
    /// holds the lock, the GIL is released while waiting for it.
    fn quick<T: Send>(&self, py: Python<'_>, work: impl FnOnce(&mut GraphBuffer) -> T + Send) -> T {
        match self.inner.try_lock() {
            Ok(mut buffer) => work(&mut buffer),
            Err(TryLockError::Poisoned(poisoned)) => work(&mut poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => self.locked(py, work),
        }
    }

    fn with<T: Send>(
        &self,
        py: Python<'_>,
        work: impl FnOnce(&mut GraphBuffer) -> Result<T, MasreplayError> + Send,
    ) -> PyResult<T> {
        self.locked(py, work).or_raise(py)
    }

    fn batch(py: Python<'_>, batch: Result<TraceBatch, MasreplayError>) -> PyResult<PyTraceBatch> {
        Ok(PyTraceBatch { inner: batch.or_raise(py)? })
    }
}

/// Traces picked by a sampler: answers shape queries and single event fields by copying only
/// what is asked; `collect` copies the whole canonical batch.
#[pyclass(module = "masreplay._core", name = "TraceSelection", frozen)]
pub struct PyTraceSelection {
    inner: Gather,
}

#[pymethods]
impl PyTraceSelection {
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
    fn num_events(&self) -> usize {
        self.inner.num_events()
    }

    fn event_field(&self, py: Python<'_>, name: &str) -> PyResult<PyArray> {
        let array = py.detach(|| self.inner.event_field(name)).or_raise(py)?;
        Ok(PyArray::from_array_ref(array))
    }

    /// One per-event field and the event offsets in one call, for `TraceBatch.flat`: a
    /// 64-bit number field without nulls comes as a numpy array that owns the gathered copy
    /// (no Arrow export), any other field as an Arrow array.
    fn flat<'py>(&self, py: Python<'py>, name: &str) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyArray1<i64>>)> {
        let values = match py.detach(|| self.inner.gather_event_field(name)).or_raise(py)? {
            Gathered::Int64(values) => values.into_pyarray(py).into_any(),
            Gathered::Float64(values) => values.into_pyarray(py).into_any(),
            Gathered::Array(array) => PyArray::from_array_ref(array).into_pyobject(py)?.into_any(),
        };
        Ok((values, self.event_offsets(py)))
    }

    /// `TraceBatch.padded`'s fast path: a 64-bit number field without nulls padded straight
    /// from the chunks, as (values, mask, lengths); None where the caller pads the gathered
    /// field itself.
    fn padded<'py>(&self, py: Python<'py>, name: &str, pad: Pad) -> PyResult<Option<PaddedArrays<'py>>> {
        match py.detach(|| self.inner.padded_numbers(name, pad.into())).or_raise(py)? {
            Some(PaddedNumbers::Int64(padded)) => padded_arrays(py, padded).map(Some),
            Some(PaddedNumbers::Float64(padded)) => padded_arrays(py, padded).map(Some),
            None => Ok(None),
        }
    }

    fn collect(&self, py: Python<'_>) -> PyResult<PyTraceBatch> {
        PyGraphBuffer::batch(py, py.detach(|| self.inner.collect()))
    }

    /// Traces of several batches, nothing copied until read: trace i is row `rows[i]` of
    /// `batches[sources[i]]`.
    #[staticmethod]
    fn of_batches(
        py: Python<'_>,
        batches: Vec<PyRef<'_, PyTraceBatch>>,
        sources: Vec<usize>,
        rows: Vec<usize>,
    ) -> PyResult<Self> {
        let batches: Vec<TraceBatch> = batches.iter().map(|b| b.inner.clone()).collect();
        let gather = || {
            ensure!(sources.len() == rows.len(), "{} sources but {} rows", sources.len(), rows.len());
            let picks: Vec<(usize, usize)> = sources.into_iter().zip(rows).collect();
            Gather::of_batches(&batches, &picks)
        };
        Ok(PyTraceSelection { inner: gather().or_raise(py)? })
    }
}

#[pymethods]
impl PyGraphBuffer {
    #[new]
    #[pyo3(signature = (capacity, *, unit=Arg(Unit::Traces), seed=0, max_staleness=None))]
    fn new(py: Python<'_>, capacity: usize, unit: Arg<Unit>, seed: u64, max_staleness: Option<u64>) -> PyResult<Self> {
        let mut buffer = GraphBuffer::new(capacity, unit.0, seed).or_raise(py)?;
        buffer.set_max_staleness(max_staleness);
        Ok(PyGraphBuffer { inner: Mutex::new(buffer) })
    }

    #[getter]
    fn policy_version(&self, py: Python<'_>) -> i64 {
        self.quick(py, |buffer| buffer.policy_version())
    }

    #[setter]
    fn set_policy_version(&self, py: Python<'_>, version: i64) -> PyResult<()> {
        self.quick(py, |buffer| buffer.set_policy_version(version)).or_raise(py)
    }

    fn advance(&self, py: Python<'_>, version: i64) -> PyResult<()> {
        self.quick(py, |buffer| buffer.advance(version)).or_raise(py)
    }

    #[getter]
    fn max_staleness(&self, py: Python<'_>) -> Option<u64> {
        self.quick(py, |buffer| buffer.max_staleness())
    }

    #[pyo3(signature = (max_staleness=None))]
    fn evict_stale(&self, py: Python<'_>, max_staleness: Option<u64>) -> PyResult<usize> {
        self.with(py, move |buffer| buffer.evict_stale(max_staleness))
    }

    /// (count, total priority) of the traces a sample may draw.
    #[pyo3(signature = (*, min_events=None, max_events=None, max_staleness=None))]
    fn eligible(
        &self,
        py: Python<'_>,
        min_events: Option<usize>,
        max_events: Option<usize>,
        max_staleness: Option<u64>,
    ) -> (usize, f64) {
        let filter = ShapeFilter { min_events, max_events };
        self.locked(py, |buffer| buffer.eligible(&filter, max_staleness))
    }

    #[pyo3(signature = (*, group_size=None, max_staleness=None))]
    fn eligible_group_count(&self, py: Python<'_>, group_size: Option<usize>, max_staleness: Option<u64>) -> usize {
        self.locked(py, |buffer| buffer.eligible_group_count(group_size, max_staleness))
    }

    /// Which of `trace_ids` are stored, as a numpy bool array.
    fn contains_many<'py>(&self, py: Python<'py>, trace_ids: Vec<String>) -> Bound<'py, PyArray1<bool>> {
        let found: Vec<bool> = self.locked(py, |buffer| trace_ids.iter().map(|id| buffer.contains(id)).collect());
        found.into_pyarray(py)
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        self.quick(py, |buffer| buffer.len())
    }

    fn __contains__(&self, py: Python<'_>, trace_id: &str) -> bool {
        self.quick(py, |buffer| buffer.contains(trace_id))
    }

    #[getter]
    fn num_events(&self, py: Python<'_>) -> usize {
        self.quick(py, |buffer| buffer.num_events())
    }

    #[getter]
    fn nbytes(&self, py: Python<'_>) -> usize {
        self.locked(py, |buffer| buffer.nbytes())
    }

    #[getter]
    fn num_groups(&self, py: Python<'_>) -> usize {
        self.quick(py, |buffer| buffer.num_groups())
    }

    #[getter]
    fn capacity(&self, py: Python<'_>) -> usize {
        self.quick(py, |buffer| buffer.capacity())
    }

    #[getter]
    fn unit(&self, py: Python<'_>) -> &'static str {
        self.quick(py, |buffer| buffer.unit().as_str())
    }

    #[getter]
    fn seed(&self, py: Python<'_>) -> u64 {
        self.quick(py, |buffer| buffer.seed())
    }

    /// Adds a validated batch. With `skip_invalid`, traces that cannot be added (duplicate ids,
    /// larger than the capacity) are left out and reported; otherwise the first one raises and
    /// nothing is added.
    #[pyo3(signature = (batch, *, skip_invalid=false))]
    fn add(
        &self,
        py: Python<'_>,
        batch: PyRef<'_, PyTraceBatch>,
        skip_invalid: bool,
    ) -> PyResult<(usize, crate::Rejected)> {
        let batch = &batch.inner;
        if !skip_invalid {
            return Ok((self.with(py, |buffer| buffer.add(batch))?, Vec::new()));
        }
        let (added, problems) = self.with(py, |buffer| buffer.add_valid(batch))?;
        Ok((added, crate::rejected_from(py, problems)))
    }

    #[pyo3(signature = (batch_size, *, sampler=Arg(Sampler::Uniform), min_events=None, max_events=None, seed=None, with_branches=false, max_staleness=None))]
    #[allow(clippy::too_many_arguments)]
    fn sample<'py>(
        &self,
        py: Python<'py>,
        batch_size: usize,
        sampler: Arg<Sampler>,
        min_events: Option<usize>,
        max_events: Option<usize>,
        seed: Option<u64>,
        with_branches: bool,
        max_staleness: Option<u64>,
    ) -> PyResult<(PyTraceSelection, Bound<'py, PyArray1<f64>>)> {
        let sampler = sampler.0;
        let filter = ShapeFilter { min_events, max_events };
        let sample = self
            .with(py, move |buffer| buffer.sample(batch_size, sampler, filter, seed, with_branches, max_staleness))?;
        Ok((PyTraceSelection { inner: sample.traces }, sample.probabilities.into_pyarray(py)))
    }

    #[pyo3(signature = (num_groups, *, group_size=None, seed=None, max_staleness=None))]
    fn sample_groups(
        &self,
        py: Python<'_>,
        num_groups: usize,
        group_size: Option<usize>,
        seed: Option<u64>,
        max_staleness: Option<u64>,
    ) -> PyResult<PyTraceSelection> {
        let traces = self.with(py, move |buffer| buffer.sample_groups(num_groups, group_size, seed, max_staleness))?;
        Ok(PyTraceSelection { inner: traces })
    }

    #[pyo3(signature = (trace_ids, priorities, *, skip_missing=false))]
    fn update_priorities(
        &self,
        py: Python<'_>,
        trace_ids: Vec<String>,
        priorities: Vec<f64>,
        skip_missing: bool,
    ) -> PyResult<usize> {
        self.with(py, move |buffer| {
            let ids: Vec<&str> = trace_ids.iter().map(String::as_str).collect();
            buffer.update_priorities(&ids, &priorities, skip_missing)
        })
    }

    /// Priorities of the stored traces, in insertion order.
    fn priorities<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<f64>> {
        self.locked(py, |buffer| buffer.priorities_in_order()).into_pyarray(py)
    }

    fn to_batch(&self, py: Python<'_>) -> PyResult<PyTraceBatch> {
        Self::batch(py, self.locked(py, |buffer| buffer.to_batch()))
    }

    fn get(&self, py: Python<'_>, trace_id: &str) -> PyResult<PyTraceBatch> {
        Self::batch(py, self.locked(py, |buffer| buffer.get(trace_id)))
    }

    #[pyo3(signature = (trace_id, event_id=None))]
    fn branches(&self, py: Python<'_>, trace_id: &str, event_id: Option<&str>) -> PyResult<PyTraceBatch> {
        Self::batch(py, self.locked(py, |buffer| buffer.branches_of(trace_id, event_id)))
    }

    fn ancestors(&self, py: Python<'_>, trace_id: &str, event_id: &str) -> PyResult<Vec<String>> {
        self.with(py, |buffer| buffer.ancestors(trace_id, event_id))
    }

    fn descendants(&self, py: Python<'_>, trace_id: &str, event_id: &str) -> PyResult<Vec<String>> {
        self.with(py, |buffer| buffer.descendants(trace_id, event_id))
    }

    fn subgraph(&self, py: Python<'_>, trace_id: &str, event_ids: Vec<String>) -> PyResult<PyTraceBatch> {
        let ids: Vec<&str> = event_ids.iter().map(String::as_str).collect();
        Self::batch(py, self.locked(py, |buffer| buffer.subgraph(trace_id, &ids)))
    }

    fn agent_view(&self, py: Python<'_>, trace_id: &str, agent: &str) -> PyResult<PyTraceBatch> {
        Self::batch(py, self.locked(py, |buffer| buffer.agent_view(trace_id, agent)))
    }

    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        self.with(py, move |buffer| buffer::save(buffer, &path))
    }

    #[staticmethod]
    fn load(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let values = file_values(std::slice::from_ref(&path));
        let buffer = interruptible(py, values, || buffer::load(&path))?.or_raise(py)?;
        Ok(PyGraphBuffer { inner: Mutex::new(buffer) })
    }

    /// The buffer as one Arrow table (traces, priorities, settings in the metadata).
    fn persisted(&self, py: Python<'_>) -> PyResult<PyTable> {
        let batch = self.with(py, |buffer| buffer.persisted_batch())?;
        let schema = batch.schema();
        PyTable::try_new(vec![batch], schema)
    }

    /// A buffer from [`Self::persisted`] output (unpickled state), checked in full.
    #[staticmethod]
    fn restore(py: Python<'_>, table: Bound<'_, PyAny>) -> PyResult<Self> {
        let batches = crate::batch::arrow_input(py, &table)?;
        let buffer = interruptible(py, arrow_values(&batches), || GraphBuffer::restore(&batches))?.or_raise(py)?;
        Ok(PyGraphBuffer { inner: Mutex::new(buffer) })
    }
}

/// The shard of every trace of `batch` in a buffer of `shards` shards (see
/// `masreplay_core::buffer::route_to_shards`); `known_ids[i]` is stored in `known_shards[i]`.
/// A branch whose factual trace is neither in the batch nor known gets 2**32 - 1.
#[pyfunction]
pub fn route_to_shards<'py>(
    py: Python<'py>,
    batch: PyRef<'_, PyTraceBatch>,
    shards: u32,
    known_ids: Vec<String>,
    known_shards: Vec<u32>,
) -> PyResult<Bound<'py, PyArray1<u32>>> {
    let known = known_ids.iter().map(String::as_str).zip(known_shards).collect();
    let routes = buffer::route_to_shards(&batch.inner, shards, &known).or_raise(py)?;
    Ok(routes.into_pyarray(py))
}
