//! `masreplay._core`: thin PyO3 bindings over masreplay-core. No logic lives here: arguments
//! are converted, long work runs with the GIL released, and errors are mapped once.

mod advantage;
mod batch;
mod buffer;
mod convert;
mod counterfactual;
mod errors;
mod interrupt;
mod metrics;
mod objects;
mod shapley;

use std::path::PathBuf;

use masreplay_core::advantage::{Estimator, ReturnKind, Stratum};
use masreplay_core::buffer::Sampler;
use masreplay_core::counterfactual::Baseline;
use masreplay_core::parallel::min_piece;
use masreplay_core::shapley::{Method, MsrSurrogate};
use masreplay_core::sim::{SimConfig, generate};
use masreplay_core::trace::{CounterfactualKind, EdgeType, EventType, Topology, Unit};
use masreplay_core::validate::{ValidateOptions, parse_documents};
use masreplay_core::{MasreplayError, Named, Trace, TraceBatch, ValidationError, split_outcomes};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use rayon::prelude::*;

use batch::PyTraceBatch;
use errors::{OrRaise, validation_error};
use interrupt::{arrow_values, file_values, interruptible, json_values, simulated_values};

// Ingest allocates many small strings from several threads, where mimalloc is much faster than
// the system allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

unsafe extern "C" {
    fn mi_option_set(option: std::os::raw::c_int, value: std::os::raw::c_long);
}

/// Ingest frees hundreds of MB that the next call allocates again. mimalloc purges freed memory
/// by decommitting it (MADV_DONTNEED), and every page of the next call then faults and is zeroed
/// again (a tenth of the CPU time of loading dicts); resetting it instead (MADV_FREE) leaves it
/// mapped until the system needs it. A choice made in the environment is left as it is.
fn purge_by_reset() {
    /// `mi_option_purge_decommits` in mimalloc.h's `mi_option_e` (v2 and v3).
    const MI_OPTION_PURGE_DECOMMITS: std::os::raw::c_int = 5;
    let chosen =
        ["MIMALLOC_PURGE_DECOMMITS", "MIMALLOC_RESET_DECOMMITS"].iter().any(|name| std::env::var_os(name).is_some());
    if !chosen {
        // SAFETY: mimalloc's options may be set at any time, from any thread.
        unsafe { mi_option_set(MI_OPTION_PURGE_DECOMMITS, 0) }
    }
}

/// A rejected trace as Python sees it: (position in the input, trace_id, exception).
pub(crate) type Rejected = Vec<(usize, Option<String>, PyErr)>;

pub(crate) fn rejected_from(py: Python<'_>, errors: Vec<(usize, ValidationError)>) -> Rejected {
    errors
        .into_iter()
        .map(|(position, error)| (position, error.trace_id.clone(), validation_error(py, &error)))
        .collect()
}

/// Builds the batch of the accepted traces and reports the rejected ones.
fn batch_of_outcomes(
    py: Python<'_>,
    outcomes: Vec<Result<Trace, ValidationError>>,
) -> PyResult<(PyTraceBatch, Rejected)> {
    let (traces, errors) = split_outcomes(outcomes);
    let inner = py
        .detach(|| {
            let batch = TraceBatch::from_traces(&traces);
            // Freeing the traces is many small frees: off the GIL, and spread over the pool.
            let events = traces.iter().map(|trace| trace.events.len()).sum();
            traces.into_par_iter().with_min_len(min_piece(events)).for_each(drop);
            batch
        })
        .or_raise(py)?;
    Ok((PyTraceBatch { inner }, rejected_from(py, errors)))
}

/// Parses JSON, a JSON array of traces, or JSON Lines.
#[pyfunction]
#[pyo3(signature = (data, *, strict_seed=false))]
fn parse_json(py: Python<'_>, data: &[u8], strict_seed: bool) -> PyResult<(PyTraceBatch, Rejected)> {
    let outcomes = interruptible(py, json_values(data), || parse_documents(data, ValidateOptions { strict_seed }))?
        .or_raise(py)?;
    batch_of_outcomes(py, outcomes)
}

/// Checks and stores Python objects (each a dict shaped like a trace).
#[pyfunction]
#[pyo3(signature = (objects, *, strict_seed=false))]
fn parse_objects(
    py: Python<'_>,
    objects: Vec<Bound<'_, PyAny>>,
    strict_seed: bool,
) -> PyResult<(PyTraceBatch, Rejected)> {
    let outcomes = objects::read_traces(py, &objects, ValidateOptions { strict_seed })?;
    batch_of_outcomes(py, outcomes)
}

/// Checks Arrow data (anything with `__arrow_c_stream__`) in the canonical layout.
#[pyfunction]
fn ingest_arrow(py: Python<'_>, table: Bound<'_, PyAny>) -> PyResult<(PyTraceBatch, Rejected)> {
    let batches = batch::arrow_input(py, &table)?;
    let (inner, errors) =
        interruptible(py, arrow_values(&batches), || TraceBatch::from_arrow(&batches))?.or_raise(py)?;
    Ok((PyTraceBatch { inner }, rejected_from(py, errors)))
}

/// Reads Parquet files in the canonical layout, checking them like any Arrow input.
#[pyfunction]
fn read_parquet(py: Python<'_>, paths: Vec<PathBuf>) -> PyResult<(PyTraceBatch, Rejected)> {
    let (inner, errors) =
        interruptible(py, file_values(&paths), || TraceBatch::from_parquet_files(&paths))?.or_raise(py)?;
    Ok((PyTraceBatch { inner }, rejected_from(py, errors)))
}

/// An empty batch (its Arrow schema is the canonical one).
#[pyfunction]
fn empty_batch() -> PyTraceBatch {
    PyTraceBatch { inner: TraceBatch::empty() }
}

/// The simulator's shape as `masreplay.sim` passes it: a dict of values it has checked.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct SimShape {
    agents: (usize, usize),
    depth: usize,
    fan_out: (usize, usize),
    events_per_agent: (usize, usize),
    group_size: usize,
    seed: u64,
}

impl SimShape {
    fn config(self, n_traces: usize) -> SimConfig {
        let SimShape { agents, depth, fan_out, events_per_agent, group_size, seed } = self;
        SimConfig { n_traces, agents, depth, fan_out, events_per_agent, group_size, seed }
    }
}

#[pyfunction]
fn simulate(py: Python<'_>, n_traces: usize, shape: SimShape) -> PyResult<PyTraceBatch> {
    let config = shape.config(n_traces);
    let inner = interruptible(py, simulated_values(n_traces), || -> Result<TraceBatch, MasreplayError> {
        let traces = generate(&config)?;
        TraceBatch::from_traces(&traces)
    })?
    .or_raise(py)?;
    Ok(PyTraceBatch { inner })
}

/// Adds `T`'s names as the tuple `name` (masreplay.vocabulary writes the same lists as
/// Literal types; tests/test_vocabulary.py holds the two equal).
fn add_names<T: Named>(module: &Bound<'_, PyModule>, name: &str) -> PyResult<()> {
    module.add(name, PyTuple::new(module.py(), T::NAMES)?)
}

fn add_vocabularies(module: &Bound<'_, PyModule>) -> PyResult<()> {
    add_names::<EventType>(module, "EVENT_TYPES")?;
    add_names::<EdgeType>(module, "EDGE_TYPES")?;
    add_names::<Topology>(module, "TOPOLOGIES")?;
    add_names::<CounterfactualKind>(module, "COUNTERFACTUAL_KINDS")?;
    add_names::<Estimator>(module, "ESTIMATORS")?;
    add_names::<Stratum>(module, "STRATA")?;
    add_names::<Unit>(module, "UNITS")?;
    add_names::<ReturnKind>(module, "RETURN_KINDS")?;
    add_names::<Sampler>(module, "SAMPLERS")?;
    add_names::<Baseline>(module, "BASELINES")?;
    add_names::<Method>(module, "SHAPLEY_METHODS")?;
    add_names::<MsrSurrogate>(module, "SHAPLEY_SURROGATES")
}

/// Adds each `#[pyfunction]` to the module.
macro_rules! add_functions {
    ($module:expr, $($function:path),+ $(,)?) => {
        $($module.add_function(wrap_pyfunction!($function, $module)?)?;)+
    };
}
pub(crate) use add_functions;

#[pymodule]
fn _core(module: &Bound<'_, PyModule>) -> PyResult<()> {
    purge_by_reset();
    module.add_class::<PyTraceBatch>()?;
    module.add_class::<buffer::PyGraphBuffer>()?;
    module.add_class::<buffer::PyTraceSelection>()?;
    add_functions!(
        module,
        buffer::route_to_shards,
        parse_json,
        parse_objects,
        ingest_arrow,
        read_parquet,
        empty_batch,
        simulate,
        convert::claude_code,
        convert::marble,
        convert::otel,
        metrics::metrics,
        counterfactual::counterfactual_credit,
        counterfactual::same_prefix_credit_arrays,
        counterfactual::simulate_branches,
    );
    advantage::register(module)?;
    // Shapley credit (games, estimators, per-trace credit)
    module.add_class::<shapley::PyGame>()?;
    for function in [
        wrap_pyfunction!(shapley::check_game_values, module)?,
        wrap_pyfunction!(shapley::soum_game, module)?,
        wrap_pyfunction!(shapley::dense_table_game, module)?,
        wrap_pyfunction!(shapley::sparse_table_game, module)?,
        wrap_pyfunction!(shapley::additive_game, module)?,
        wrap_pyfunction!(shapley::weighted_voting_game, module)?,
        wrap_pyfunction!(shapley::empirical_game, module)?,
        wrap_pyfunction!(shapley::shapley, module)?,
        wrap_pyfunction!(shapley::trace_players, module)?,
        wrap_pyfunction!(shapley::trace_shapley, module)?,
    ] {
        module.add_function(function)?;
    }
    module.add("SCHEMA_VERSION", masreplay_core::trace::SCHEMA_VERSION)?;
    module.add("MAX_PRIORITY", masreplay_core::buffer::MAX_PRIORITY)?;
    module.add("VALUE_BOUND", masreplay_core::limit::BOUND)?;
    add_vocabularies(module)?;
    Ok(())
}
