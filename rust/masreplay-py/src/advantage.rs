//! `masreplay._core` advantage functions: numpy in, numpy out, the work in
//! masreplay_core::advantage with the GIL released.

use masreplay_core::advantage::{
    self, AdvantageFloat, BatchOptions, Compat, Estimator, ReturnKind, Scale, Spec, SqrtKernel, Stratum, Unit,
    dense_codes,
};
use masreplay_core::{MasreplayError, bail, ensure};
use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;

use crate::batch::PyTraceBatch;
use crate::errors::{Arg, OrRaise};

fn slice<'a, T: numpy::Element>(name: &str, array: &'a PyReadonlyArray1<'_, T>) -> Result<&'a [T], MasreplayError> {
    let Ok(values) = array.as_slice() else { bail!("{name} must be a contiguous 1-D array") };
    Ok(values)
}

/// A C-contiguous 2-D array as (its values row by row, the row width).
fn matrix<'a>(name: &str, array: &'a PyReadonlyArray2<'_, f32>) -> Result<(&'a [f32], usize), MasreplayError> {
    let Ok(values) = array.as_slice() else { bail!("{name} must be a C-contiguous 2-D array") };
    Ok((values, array.shape()[1]))
}

fn spec(
    py: Python<'_>,
    estimator: Arg<Estimator>,
    std: Arg<Scale>,
    eps: Option<f64>,
    compat: Option<Arg<Compat>>,
) -> PyResult<Spec> {
    let compat = compat.map_or(Compat::Native, |compat| compat.0);
    Spec::new(estimator.0, std.0, eps, compat).or_raise(py)
}

fn strata(names: Vec<Arg<Stratum>>) -> Vec<Stratum> {
    names.into_iter().map(|name| name.0).collect()
}

fn to_numpy<'py, T: AdvantageFloat + numpy::Element>(py: Python<'py>, values: Vec<T>) -> Bound<'py, PyAny> {
    values.into_pyarray(py).into_any()
}

/// Advantages of rows: `groups` and `strata` are any int64 keys (grouping by value).
#[pyfunction]
#[pyo3(signature = (values, groups, *, strata=None, lengths=None, mask=None, estimator=Arg(Estimator::Grpo), std=Arg(Scale::Group), eps=None, compat=None, float32=true, torch_threads=1))]
#[allow(clippy::too_many_arguments)]
pub fn group_normalize<'py>(
    py: Python<'py>,
    values: PyReadonlyArray1<'py, f64>,
    groups: PyReadonlyArray1<'py, i64>,
    strata: Option<PyReadonlyArray1<'py, i64>>,
    lengths: Option<PyReadonlyArray1<'py, f64>>,
    mask: Option<PyReadonlyArray2<'py, f32>>,
    estimator: Arg<Estimator>,
    std: Arg<Scale>,
    eps: Option<f64>,
    compat: Option<Arg<Compat>>,
    float32: bool,
    torch_threads: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let spec = spec(py, estimator, std, eps, compat)?.with_torch_threads(torch_threads);
    let tokens = mask.as_ref().map(|m| matrix("mask", m)).transpose().or_raise(py)?;
    let values = slice("values", &values).or_raise(py)?;
    let groups = slice("groups", &groups).or_raise(py)?;
    let strata = strata.as_ref().map(|s| slice("strata", s)).transpose().or_raise(py)?;
    let lengths = lengths.as_ref().map(|l| slice("lengths", l)).transpose().or_raise(py)?;
    let run = || -> Result<Result<Vec<f32>, Vec<f64>>, MasreplayError> {
        Ok(if float32 {
            Ok(advantage::normalize_labels::<f32>(values, groups, strata, lengths, tokens, &spec)?)
        } else {
            Err(advantage::normalize_labels::<f64>(values, groups, strata, lengths, tokens, &spec)?)
        })
    };
    Ok(match py.detach(run).or_raise(py)? {
        Ok(single) => to_numpy(py, single),
        Err(double) => to_numpy(py, double),
    })
}

type Array<'py> = Bound<'py, PyArray1<f64>>;
type Results<'py> = (Array<'py>, Array<'py>, Array<'py>, Bound<'py, PyArray1<i64>>);

/// Advantages of a batch: (per_trace, per_event, weights), all float64, and the trace of
/// each event (int64).
#[pyfunction]
#[pyo3(signature = (batch, trace_values, groups, *, credit=None, normalize_by=Vec::new(), unit=Arg(Unit::Traces), estimator=Arg(Estimator::Grpo), std=Arg(Scale::Group), eps=None, compat=None, weight_by=Vec::new()))]
#[allow(clippy::too_many_arguments)]
pub fn batch_advantages<'py>(
    py: Python<'py>,
    batch: PyRef<'py, PyTraceBatch>,
    trace_values: PyReadonlyArray1<'py, f64>,
    groups: PyReadonlyArray1<'py, i64>,
    credit: Option<PyReadonlyArray1<'py, f64>>,
    normalize_by: Vec<Arg<Stratum>>,
    unit: Arg<Unit>,
    estimator: Arg<Estimator>,
    std: Arg<Scale>,
    eps: Option<f64>,
    compat: Option<Arg<Compat>>,
    weight_by: Vec<Arg<Stratum>>,
) -> PyResult<Results<'py>> {
    let spec = spec(py, estimator, std, eps, compat)?;
    let (normalize_by, weight_by) = (strata(normalize_by), strata(weight_by));
    let trace_values = slice("trace_values", &trace_values).or_raise(py)?;
    let groups = slice("groups", &groups).or_raise(py)?;
    let credit = credit.as_ref().map(|c| slice("credit", c)).transpose().or_raise(py)?;
    let inner = &batch.inner;
    let result = py
        .detach(|| {
            let (codes, n_groups) = dense_codes(groups);
            let options = BatchOptions {
                trace_values,
                event_values: credit,
                groups: &codes,
                n_groups,
                normalize_by: &normalize_by,
                unit: unit.0,
                spec,
                weight_by: &weight_by,
            };
            advantage::batch_advantages(inner, &options)
        })
        .or_raise(py)?;
    let trace_index: Vec<i64> = result.trace_of_event.iter().map(|&t| i64::from(t)).collect();
    Ok((
        result.per_trace.into_pyarray(py),
        result.per_event.into_pyarray(py),
        result.weights.into_pyarray(py),
        trace_index.into_pyarray(py),
    ))
}

/// The named channel of every trace's rewards (NaN where missing).
#[pyfunction]
pub fn trace_channel<'py>(
    py: Python<'py>,
    batch: PyRef<'py, PyTraceBatch>,
    channel: &str,
) -> Bound<'py, PyArray1<f64>> {
    advantage::trace_channel(&batch.inner, channel).into_pyarray(py)
}

/// Codes `0..` of a per-trace text column, in order of first appearance.
#[pyfunction]
pub fn trace_text_codes<'py>(
    py: Python<'py>,
    batch: PyRef<'py, PyTraceBatch>,
    field: &str,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    Ok(advantage::trace_text_codes(&batch.inner, field).or_raise(py)?.into_pyarray(py))
}

/// Per-event graph returns of per-event rewards.
#[pyfunction]
#[pyo3(signature = (batch, rewards, *, gamma, kind))]
pub fn graph_returns<'py>(
    py: Python<'py>,
    batch: PyRef<'py, PyTraceBatch>,
    rewards: PyReadonlyArray1<'py, f64>,
    gamma: f64,
    kind: Arg<ReturnKind>,
) -> PyResult<Bound<'py, PyArray1<f64>>> {
    let rewards = slice("rewards", &rewards).or_raise(py)?;
    let inner = &batch.inner;
    let returns = py.detach(|| advantage::graph_returns(inner, rewards, gamma, kind.0)).or_raise(py)?;
    Ok(returns.into_pyarray(py))
}

/// GAE over the event graph: (advantages, returns).
#[pyfunction]
#[pyo3(signature = (batch, rewards, values, *, gamma, lam))]
pub fn graph_gae<'py>(
    py: Python<'py>,
    batch: PyRef<'py, PyTraceBatch>,
    rewards: PyReadonlyArray1<'py, f64>,
    values: PyReadonlyArray1<'py, f64>,
    gamma: f64,
    lam: f64,
) -> PyResult<(Array<'py>, Array<'py>)> {
    let rewards = slice("rewards", &rewards).or_raise(py)?;
    let values = slice("values", &values).or_raise(py)?;
    let inner = &batch.inner;
    let (advantages, returns) = py.detach(|| advantage::graph_gae(inner, rewards, values, gamma, lam)).or_raise(py)?;
    Ok((advantages.into_pyarray(py), returns.into_pyarray(py)))
}

/// torch's fp32 `sqrt` as `kernel` (one of `SqrtKernel::NAMES`, default: the one torch's MKL
/// runs on this CPU) rounds it: what compat="trl" divides by, exposed so a test can hold
/// the emulation against `torch.sqrt` on every input.
#[pyfunction]
#[pyo3(signature = (values, kernel=None))]
pub fn torch_sqrt<'py>(
    py: Python<'py>,
    values: PyReadonlyArray1<'py, f32>,
    kernel: Option<Arg<SqrtKernel>>,
) -> PyResult<(Bound<'py, PyArray1<f32>>, &'static str)> {
    let kernel = kernel.map_or_else(SqrtKernel::detect, |kernel| kernel.0);
    let values = slice("values", &values).or_raise(py)?;
    let roots = py.detach(|| -> Result<Vec<f32>, MasreplayError> {
        ensure!(kernel.available(), "kernel '{}' cannot run on this CPU", kernel.as_str());
        Ok(values.iter().map(|&x| advantage::torch_sqrt(x, kernel)).collect())
    });
    Ok((roots.or_raise(py)?.into_pyarray(py), kernel.as_str()))
}

pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    crate::add_functions!(
        module,
        group_normalize,
        batch_advantages,
        trace_channel,
        trace_text_codes,
        graph_returns,
        graph_gae,
        torch_sqrt
    );
    Ok(())
}
