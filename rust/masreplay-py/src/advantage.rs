//! `masreplay._core` advantage functions: numpy in, numpy out, the work in
//! masreplay_core::advantage with the GIL released.

use masreplay_core::MasreplayError;
use masreplay_core::advantage::{
    self, AdvantageFloat, BatchOptions, Compat, Estimator, ReturnKind, Scale, Spec, SqrtKernel, Stratum, Unit,
    dense_codes,
};
use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;

use crate::batch::PyTraceBatch;
use crate::errors::OrRaise;

fn slice<'a, T: numpy::Element>(py: Python<'_>, name: &str, array: &'a PyReadonlyArray1<'_, T>) -> PyResult<&'a [T]> {
    array.as_slice().map_err(|_| {
        crate::errors::to_py(py, MasreplayError::InvalidArgument(format!("{name} must be a contiguous 1-D array")))
    })
}

fn spec(estimator: &str, std: &str, eps: Option<f64>, compat: Option<&str>) -> Result<Spec, MasreplayError> {
    Spec::new(Estimator::parse(estimator)?, Scale::parse(std)?, eps, Compat::parse(compat)?)
}

fn strata(names: &[String]) -> Result<Vec<Stratum>, MasreplayError> {
    names.iter().map(|name| Stratum::parse(name)).collect()
}

fn to_numpy<'py, T: AdvantageFloat + numpy::Element>(py: Python<'py>, values: Vec<T>) -> Bound<'py, PyAny> {
    values.into_pyarray(py).into_any()
}

/// Advantages of rows: `groups` and `strata` are any int64 keys (grouping by value).
#[pyfunction]
#[pyo3(signature = (values, groups, *, strata=None, lengths=None, mask=None, estimator="grpo", std="group", eps=None, compat=None, float32=true, torch_threads=1))]
#[allow(clippy::too_many_arguments)]
pub fn group_normalize<'py>(
    py: Python<'py>,
    values: PyReadonlyArray1<'py, f64>,
    groups: PyReadonlyArray1<'py, i64>,
    strata: Option<PyReadonlyArray1<'py, i64>>,
    lengths: Option<PyReadonlyArray1<'py, f64>>,
    mask: Option<PyReadonlyArray2<'py, f32>>,
    estimator: &str,
    std: &str,
    eps: Option<f64>,
    compat: Option<&str>,
    float32: bool,
    torch_threads: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let spec = spec(estimator, std, eps, compat).or_raise(py)?.with_torch_threads(torch_threads);
    let width = mask.as_ref().map_or(0, |m| m.shape()[1]);
    let mask = mask.as_ref().map(|m| m.as_slice()).transpose().map_err(|_| {
        crate::errors::to_py(py, MasreplayError::InvalidArgument("mask must be a C-contiguous 2-D array".to_owned()))
    })?;
    let tokens = mask.map(|m| (m, width));
    let values = slice(py, "values", &values)?;
    let groups = slice(py, "groups", &groups)?;
    let strata = strata.as_ref().map(|s| slice(py, "strata", s)).transpose()?;
    let lengths = lengths.as_ref().map(|l| slice(py, "lengths", l)).transpose()?;
    if groups.len() != values.len() {
        let message = format!("groups has {} entries for {} values", groups.len(), values.len());
        return Err(crate::errors::to_py(py, MasreplayError::InvalidArgument(message)));
    }
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
type Triple<'py> = (Array<'py>, Array<'py>, Array<'py>);

/// Advantages of a batch: (per_trace, per_event, weights), all float64.
#[pyfunction]
#[pyo3(signature = (batch, trace_values, groups, *, credit=None, normalize_by=vec![], unit="traces", estimator="grpo", std="group", eps=None, compat=None, weight_by=vec![]))]
#[allow(clippy::too_many_arguments)]
pub fn batch_advantages<'py>(
    py: Python<'py>,
    batch: PyRef<'py, PyTraceBatch>,
    trace_values: PyReadonlyArray1<'py, f64>,
    groups: PyReadonlyArray1<'py, i64>,
    credit: Option<PyReadonlyArray1<'py, f64>>,
    normalize_by: Vec<String>,
    unit: &str,
    estimator: &str,
    std: &str,
    eps: Option<f64>,
    compat: Option<&str>,
    weight_by: Vec<String>,
) -> PyResult<Triple<'py>> {
    let spec = spec(estimator, std, eps, compat).or_raise(py)?;
    let normalize_by = strata(&normalize_by).or_raise(py)?;
    let weight_by = strata(&weight_by).or_raise(py)?;
    let unit = Unit::parse(unit).or_raise(py)?;
    let trace_values = slice(py, "trace_values", &trace_values)?;
    let groups = slice(py, "groups", &groups)?;
    let credit = credit.as_ref().map(|c| slice(py, "credit", c)).transpose()?;
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
                unit,
                spec,
                weight_by: &weight_by,
            };
            advantage::batch_advantages(inner, &options)
        })
        .or_raise(py)?;
    Ok((result.per_trace.into_pyarray(py), result.per_event.into_pyarray(py), result.weights.into_pyarray(py)))
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

/// Per-event graph returns of per-event rewards.
#[pyfunction]
#[pyo3(signature = (batch, rewards, *, gamma, kind))]
pub fn graph_returns<'py>(
    py: Python<'py>,
    batch: PyRef<'py, PyTraceBatch>,
    rewards: PyReadonlyArray1<'py, f64>,
    gamma: f64,
    kind: &str,
) -> PyResult<Bound<'py, PyArray1<f64>>> {
    let kind = ReturnKind::parse(kind).or_raise(py)?;
    let rewards = slice(py, "rewards", &rewards)?;
    let inner = &batch.inner;
    let returns = py.detach(|| advantage::graph_returns(inner, rewards, gamma, kind)).or_raise(py)?;
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
    let rewards = slice(py, "rewards", &rewards)?;
    let values = slice(py, "values", &values)?;
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
    kernel: Option<&str>,
) -> PyResult<(Bound<'py, PyArray1<f32>>, &'static str)> {
    let kernel = match kernel {
        None => SqrtKernel::detect(),
        Some(name) => SqrtKernel::parse(name).filter(|k| k.available()).ok_or_else(|| {
            let message = format!("kernel must be one of {:?} that this CPU can run, got {name:?}", SqrtKernel::NAMES);
            crate::errors::to_py(py, MasreplayError::InvalidArgument(message))
        })?,
    };
    let values = slice(py, "values", &values)?;
    let roots: Vec<f32> = py.detach(|| values.iter().map(|&x| advantage::torch_sqrt(x, kernel)).collect());
    Ok((roots.into_pyarray(py), kernel.name()))
}

pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(group_normalize, module)?)?;
    module.add_function(wrap_pyfunction!(batch_advantages, module)?)?;
    module.add_function(wrap_pyfunction!(trace_channel, module)?)?;
    module.add_function(wrap_pyfunction!(graph_returns, module)?)?;
    module.add_function(wrap_pyfunction!(graph_gae, module)?)?;
    module.add_function(wrap_pyfunction!(torch_sqrt, module)?)?;
    Ok(())
}
