//! Counterfactual credit and the simulator's ground-truth branches. Credit leaves as five
//! numpy arrays over the credited events only: (event position, trace row, credit, stderr,
//! n_branches).

use masreplay_core::counterfactual::{Baseline, Credit, Signature, branch_credit, same_prefix_credit};
use masreplay_core::sim::branches::{BranchConfig, generate_with_branches};
use masreplay_core::{MasreplayError, TraceBatch};
use numpy::{IntoPyArray, PyArray1};
use pyo3::prelude::*;

use crate::SimShape;
use crate::batch::PyTraceBatch;
use crate::errors::{Arg, OrRaise};
use crate::interrupt::{interruptible, simulated_values};

type CreditArrays<'py> = (
    Bound<'py, PyArray1<u64>>,
    Bound<'py, PyArray1<u32>>,
    Bound<'py, PyArray1<f64>>,
    Bound<'py, PyArray1<f64>>,
    Bound<'py, PyArray1<u32>>,
);

fn to_numpy(py: Python<'_>, credit: Credit) -> CreditArrays<'_> {
    let Credit { event, trace, credit, stderr, n_branches } = credit;
    let (event, trace) = (event.into_pyarray(py), trace.into_pyarray(py));
    (event, trace, credit.into_pyarray(py), stderr.into_pyarray(py), n_branches.into_pyarray(py))
}

#[pyfunction]
#[pyo3(signature = (batch, *, channel, baseline))]
pub fn counterfactual_credit<'py>(
    py: Python<'py>,
    batch: PyRef<'_, PyTraceBatch>,
    channel: &str,
    baseline: Arg<Baseline>,
) -> PyResult<CreditArrays<'py>> {
    let inner = &batch.inner;
    let credit = interruptible(py, inner.num_events(), || branch_credit(inner, channel, baseline.0))?.or_raise(py)?;
    Ok(to_numpy(py, credit))
}

#[pyfunction]
#[pyo3(signature = (batch, *, channel, signature, importance_weighting))]
pub fn same_prefix_credit_arrays<'py>(
    py: Python<'py>,
    batch: PyRef<'_, PyTraceBatch>,
    channel: &str,
    signature: Option<Vec<String>>,
    importance_weighting: bool,
) -> PyResult<CreditArrays<'py>> {
    let signature = signature.map(Signature::new).transpose().or_raise(py)?.unwrap_or_default();
    let inner = &batch.inner;
    let credit =
        interruptible(py, inner.num_events(), || same_prefix_credit(inner, channel, &signature, importance_weighting))?
            .or_raise(py)?;
    Ok(to_numpy(py, credit))
}

/// (trace_id, event_id, kind, effect) of every branch point.
type Effects = Vec<(String, String, &'static str, f64)>;
/// (trace_id, agent, value) of every agent.
type AgentValues = Vec<(String, String, f64)>;

#[pyfunction]
#[pyo3(signature = (n_traces, shape, *, branches, branch_points, noise))]
pub fn simulate_branches(
    py: Python<'_>,
    n_traces: usize,
    shape: SimShape,
    branches: usize,
    branch_points: usize,
    noise: f64,
) -> PyResult<(PyTraceBatch, Effects, AgentValues)> {
    let config = BranchConfig { base: shape.config(n_traces), branches, branch_points, noise };
    let values = simulated_values(n_traces).saturating_mul(branches.saturating_add(1));
    let (inner, truth) = interruptible(py, values, || -> Result<_, MasreplayError> {
        let truth = generate_with_branches(&config)?;
        Ok((TraceBatch::from_traces(&truth.traces)?, truth))
    })?
    .or_raise(py)?;
    let effects = truth.effects.into_iter().map(|e| (e.trace_id, e.event_id, e.kind.as_str(), e.effect)).collect();
    let values = truth.agent_values.into_iter().map(|v| (v.trace_id, v.agent, v.value)).collect();
    Ok((PyTraceBatch { inner }, effects, values))
}
