//! The results of [`super::traces::trace_shapley`] as flat columns, the shape a binding hands
//! out without looping: per player of the batch (in the order of `TracePlayers::labels`) and
//! per trace.

use super::Method;
use super::traces::TraceShapley;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct CreditColumns {
    /// One per player of the batch: its Shapley value and standard error.
    pub values: Vec<f64>,
    pub stderr: Vec<f64>,
    /// One per trace: coalitions valued, the method that ran (None: a trace without players,
    /// which is exact with nothing to value) and whether it was exact.
    pub evaluations: Vec<u64>,
    pub methods: Vec<Option<Method>>,
    pub exact: Vec<bool>,
    /// One per trace under noise: the standard deviation of one evaluation (given or
    /// estimated); NaN without noise.
    pub noise: Vec<f64>,
    /// Coalitions valued by the caller's function, over all traces.
    pub total_evaluations: u64,
}

impl From<TraceShapley> for CreditColumns {
    fn from(credit: TraceShapley) -> Self {
        let n_traces = credit.results.len();
        let mut columns = CreditColumns {
            evaluations: Vec::with_capacity(n_traces),
            methods: Vec::with_capacity(n_traces),
            exact: Vec::with_capacity(n_traces),
            noise: Vec::with_capacity(n_traces),
            total_evaluations: credit.evaluations,
            ..CreditColumns::default()
        };
        for result in credit.results {
            match result {
                Some(result) => {
                    columns.values.extend(result.values);
                    columns.stderr.extend(result.stderr);
                    columns.evaluations.push(result.evaluations);
                    columns.methods.push(Some(result.method));
                    columns.exact.push(result.exact);
                    columns.noise.push(result.noise.unwrap_or(f64::NAN));
                }
                None => {
                    columns.evaluations.push(0);
                    columns.methods.push(None);
                    columns.exact.push(true);
                    columns.noise.push(f64::NAN);
                }
            }
        }
        columns
    }
}
