//! `masreplay._core` Shapley bindings: native games as one `Game` class, `shapley` over a
//! native game or a batched Python callable, and per-trace credit. The work runs in the core
//! with the GIL released; a Python callable re-takes it for each batch it values.

use masreplay_core::interrupt::Checkpoint;
use masreplay_core::shapley::coalition::Coalitions;
use masreplay_core::shapley::columns::CreditColumns;
use masreplay_core::shapley::games::{
    AdditiveGame, CachedCallback, Canonical, EmpiricalGame, SoumGame, TableGame, WeightedVotingGame,
};
use masreplay_core::shapley::traces::{
    FixedPlayers, TraceCallback, trace_players as core_trace_players, trace_shapley as core_trace_shapley,
};
use masreplay_core::shapley::{
    Game, Method, MsrSurrogate, Noise, ShapleyOptions, ShapleyResult, Union, shapley as core_shapley,
};
use masreplay_core::{MasreplayError, bail, ensure};
use numpy::{IntoPyArray, PyArray1, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArray};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::batch::PyTraceBatch;
use crate::errors::{Arg, OrRaise, from_callback};
use crate::interrupt::interruptible;

enum Native {
    Soum(SoumGame),
    Table(TableGame),
    Additive(AdditiveGame),
    WeightedVoting(WeightedVotingGame),
    Empirical(EmpiricalGame),
}

/// A native game: valued in Rust, so estimators run at full speed on it.
#[pyclass(module = "masreplay._core", name = "Game", frozen)]
pub struct PyGame {
    inner: Native,
    kind: &'static str,
}

impl PyGame {
    fn game(&self) -> &dyn Game {
        match &self.inner {
            Native::Soum(g) => g,
            Native::Table(g) => g,
            Native::Additive(g) => g,
            Native::WeightedVoting(g) => g,
            Native::Empirical(g) => g,
        }
    }
}

fn coalitions_from_masks(masks: &PyReadonlyArray2<'_, bool>) -> Result<Coalitions, MasreplayError> {
    let view = masks.as_array();
    let (rows, n) = view.dim();
    if n == 0 {
        bail!("masks: need at least one player column");
    }
    let mut out = Coalitions::with_capacity(n, rows);
    for row in view.rows() {
        out.push_players(row.iter().enumerate().filter(|(_, present)| **present).map(|(p, _)| p));
    }
    Ok(out)
}

fn masks_array<'py>(py: Python<'py>, coalitions: &Coalitions) -> PyResult<Bound<'py, PyAny>> {
    let (rows, n) = (coalitions.len(), coalitions.n_players());
    Ok(coalitions.to_bools().into_pyarray(py).reshape([rows, n])?.into_any())
}

#[pymethods]
impl PyGame {
    #[getter]
    fn n_players(&self) -> usize {
        self.game().n_players()
    }

    #[getter]
    fn kind(&self) -> &'static str {
        self.kind
    }

    /// Values of coalitions given as a boolean array (m, n_players).
    fn values<'py>(&self, py: Python<'py>, masks: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyArray1<f64>>> {
        // Not a typed parameter: pyo3's refusal of another value names neither the argument nor
        // what it takes ("'list' object is not an instance of 'ndarray'").
        if !masks.is_exact_instance_of::<PyUntypedArray>() {
            // A masked array's mask would be dropped: refused as every array argument is.
            py.import("masreplay._args")?.call_method1("refuse_masked", ("masks", masks))?;
        }
        let Ok(masks) = masks.extract::<PyReadonlyArray2<'py, bool>>() else {
            let got = masks.get_type().name()?;
            return Err(crate::errors::wrong_type(
                py,
                format!("masks must be a boolean array (coalitions, players), got {got}"),
            ));
        };
        let coalitions = coalitions_from_masks(&masks).or_raise(py)?;
        let n = self.n_players();
        let values = py.detach(|| {
            ensure!(coalitions.n_players() == n, "masks: {} columns for a game of {n} players", coalitions.n_players());
            self.game().values(&coalitions)
        });
        Ok(values.or_raise(py)?.into_pyarray(py))
    }

    /// Closed-form Shapley values (SOUM games only; None otherwise).
    fn shapley_values<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyArray1<f64>>> {
        match &self.inner {
            Native::Soum(g) => Some(g.shapley_values().into_pyarray(py)),
            Native::Additive(g) => Some(g.weights.clone().into_pyarray(py)),
            _ => None,
        }
    }

    /// Closed-form Banzhaf values (SOUM games only; None otherwise).
    fn banzhaf_values<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyArray1<f64>>> {
        match &self.inner {
            Native::Soum(g) => Some(g.banzhaf_values().into_pyarray(py)),
            _ => None,
        }
    }

    /// The unanimity terms (players, coefficient) of a SOUM game; None for other games.
    fn terms(&self) -> Option<Vec<(Vec<u32>, f64)>> {
        match &self.inner {
            Native::Soum(g) => Some(g.terms()),
            _ => None,
        }
    }

    fn __repr__(&self) -> String {
        format!("Game({}, n_players={})", self.kind, self.n_players())
    }
}

/// A native game whose estimator stops at its next batch once the call is interrupted (see
/// `crate::interrupt`): every estimator values coalitions through `values` or `walk`.
struct Stoppable<'a> {
    game: &'a dyn Game,
    checkpoint: Checkpoint,
}

impl<'a> Stoppable<'a> {
    /// Polls the flag of the call running on this thread.
    fn new(game: &'a dyn Game) -> Self {
        Stoppable { game, checkpoint: Checkpoint::here() }
    }
}

impl Game for Stoppable<'_> {
    fn n_players(&self) -> usize {
        self.game.n_players()
    }

    fn values(&self, coalitions: &Coalitions) -> Result<Vec<f64>, MasreplayError> {
        self.checkpoint.check()?;
        self.game.values(coalitions)
    }

    /// Declined once interrupted, so that the estimator asks `values`, which says so.
    fn walk(&self, order: &[u32], out: &mut [f64]) -> bool {
        self.checkpoint.check().is_ok() && self.game.walk(order, out)
    }

    fn sequential(&self) -> bool {
        self.game.sequential()
    }

    fn preferred_batch(&self) -> usize {
        self.game.preferred_batch()
    }

    fn evaluations(&self) -> Option<u64> {
        self.game.evaluations()
    }

    fn draws_per_request(&self) -> Option<u64> {
        self.game.draws_per_request()
    }
}

fn wrap(py: Python<'_>, game: Result<Native, MasreplayError>, kind: &'static str) -> PyResult<PyGame> {
    Ok(PyGame { inner: game.or_raise(py)?, kind })
}

#[pyfunction]
pub fn soum_game(
    py: Python<'_>,
    n: usize,
    terms: Bound<'_, PyAny>,
    max_order: Option<usize>,
    seed: u64,
) -> PyResult<PyGame> {
    let game = if let Ok(count) = terms.extract::<usize>() {
        SoumGame::random(n, count, max_order.unwrap_or(n), seed)
    } else {
        let listed: Vec<(Vec<u32>, f64)> = terms.extract()?;
        SoumGame::new(n, listed)
    };
    wrap(py, game.map(Native::Soum), "soum")
}

/// The core's range check of what a game returned, for games valued from Python.
#[pyfunction]
pub fn check_game_values(
    py: Python<'_>,
    values: PyReadonlyArray1<'_, f64>,
    function: &str,
    whom: &str,
) -> PyResult<()> {
    masreplay_core::limit::check_game_values(values.as_slice()?, function, whom).or_raise(py)
}

#[pyfunction]
pub fn dense_table_game(py: Python<'_>, values: PyReadonlyArray1<'_, f64>) -> PyResult<PyGame> {
    let values = values.as_slice()?;
    // Checking and copying up to 2^30 values (8 GiB) needs no Python.
    let table = py.detach(|| TableGame::dense(values));
    wrap(py, table.map(Native::Table), "table")
}

#[pyfunction]
pub fn sparse_table_game(
    py: Python<'_>,
    n_players: usize,
    entries: Vec<(Vec<u32>, f64)>,
    default: f64,
) -> PyResult<PyGame> {
    wrap(py, TableGame::sparse(n_players, entries, default).map(Native::Table), "table")
}

#[pyfunction]
pub fn additive_game(py: Python<'_>, weights: Vec<f64>) -> PyResult<PyGame> {
    wrap(py, AdditiveGame::new(weights).map(Native::Additive), "additive")
}

#[pyfunction]
pub fn weighted_voting_game(py: Python<'_>, weights: Vec<f64>, quota: f64) -> PyResult<PyGame> {
    wrap(py, WeightedVotingGame::new(weights, quota).map(Native::WeightedVoting), "weighted_voting")
}

#[pyfunction]
pub fn empirical_game(
    py: Python<'_>,
    masks: PyReadonlyArray2<'_, bool>,
    rewards: Vec<f64>,
    order: usize,
) -> PyResult<PyGame> {
    let coalitions = coalitions_from_masks(&masks).or_raise(py)?;
    wrap(py, EmpiricalGame::new(&coalitions, &rewards, order).map(Native::Empirical), "empirical")
}

fn parse_union(item: &Bound<'_, PyAny>) -> PyResult<Union> {
    if let Ok(player) = item.extract::<u32>() {
        return Ok(Union::Player(player));
    }
    let list = item.cast::<PyList>().map_err(|_| {
        pyo3::exceptions::PyTypeError::new_err("unions: each item must be a player index or a list of items")
    })?;
    Ok(Union::Group(list.iter().map(|child| parse_union(&child)).collect::<PyResult<_>>()?))
}

fn result_dict<'py>(py: Python<'py>, result: ShapleyResult) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("values", result.values.into_pyarray(py))?;
    out.set_item("stderr", result.stderr.into_pyarray(py))?;
    out.set_item("evaluations", result.evaluations)?;
    out.set_item("converged", result.converged)?;
    out.set_item("method", result.method.as_str())?;
    out.set_item("exact", result.exact)?;
    out.set_item("efficiency_gap", result.efficiency_gap)?;
    out.set_item("noise", result.noise)?;
    Ok(out)
}

/// Calls a Python function on numpy masks and reads what it returns as a flat array of
/// `dtype` (numpy's name: "float64" for values, "bool_" for masks); what it raises travels
/// through the core inside its error type and comes out unchanged, while a return value
/// numpy cannot read as `dtype` is an invalid argument that says so.
fn call_python<T: numpy::Element + Copy>(
    function: &Py<PyAny>,
    dtype: &str,
    build_args: impl for<'py> FnOnce(Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>>,
) -> Result<Vec<T>, MasreplayError> {
    Python::attach(|py| {
        let args = build_args(py).and_then(|args| pyo3::types::PyTuple::new(py, args)).map_err(from_callback)?;
        let returned = function.bind(py).call1(args).map_err(from_callback)?;
        let read = || -> PyResult<Vec<T>> {
            let numpy = py.import("numpy")?;
            // numpy would drop the imaginary parts with a warning; a value is a real number.
            if numpy.call_method1("iscomplexobj", (&returned,))?.is_truthy()? {
                return Err(pyo3::exceptions::PyTypeError::new_err("complex values"));
            }
            let flat = numpy.call_method1("asarray", (&returned, numpy.getattr(dtype)?))?.call_method0("ravel")?;
            Ok(flat.extract::<PyReadonlyArray1<'_, T>>()?.as_array().to_vec())
        };
        read().map_err(|error| {
            let kind = returned.get_type().name().map_or_else(|_| "?".to_string(), |name| name.to_string());
            MasreplayError::InvalidArgument(format!(
                "the function returned a {kind} that is not an array of {dtype}: {error}"
            ))
        })
    })
}

/// A Python `canonical(masks) -> masks` as the core's canonical form of a batch.
fn canonical_of(function: &Py<PyAny>) -> Canonical<'_> {
    Box::new(move |coalitions: &Coalitions| {
        let n = coalitions.n_players();
        let flat: Vec<bool> = call_python(function, "bool_", |py| Ok(vec![masks_array(py, coalitions)?]))?;
        ensure!(
            flat.len() == coalitions.len() * n,
            "canonical returned {} booleans for {} coalitions of {n} players",
            flat.len(),
            coalitions.len()
        );
        let mut out = Coalitions::with_capacity(n, coalitions.len());
        for row in flat.chunks_exact(n) {
            out.push_players(row.iter().enumerate().filter(|(_, present)| **present).map(|(p, _)| p));
        }
        Ok(out)
    })
}

/// Shapley values of a native `Game`, or of a Python callable `f(masks) -> values` over
/// `n_players` players (valued in chunks of `chunk_size`, each coalition once).
#[pyfunction]
#[pyo3(signature = (game, n_players, method, budget, target_stderr, seed, parents, unions, n_threads, antithetic, chunk_size, fixed, exclude, canonical, noise, repeats, surrogate))]
#[allow(clippy::too_many_arguments)]
pub fn shapley<'py>(
    py: Python<'py>,
    game: Bound<'py, PyAny>,
    n_players: Option<usize>,
    method: Arg<Method>,
    budget: Option<u64>,
    target_stderr: Option<f64>,
    seed: u64,
    parents: Option<Vec<i64>>,
    unions: Option<Bound<'py, PyList>>,
    n_threads: Option<usize>,
    antithetic: bool,
    chunk_size: usize,
    fixed: Vec<u32>,
    exclude: Vec<u32>,
    canonical: Option<Py<PyAny>>,
    noise: Option<f64>,
    repeats: Option<u64>,
    surrogate: Arg<MsrSurrogate>,
) -> PyResult<Bound<'py, PyDict>> {
    // NaN stands for noise="auto" (the Python layer maps it), a number for a known sigma.
    let noise = noise.map(|sigma| if sigma.is_nan() { Noise::Auto } else { Noise::Known(sigma) });
    let unions =
        unions.map(|list| list.iter().map(|item| parse_union(&item)).collect::<PyResult<Vec<_>>>()).transpose()?;
    let options = ShapleyOptions {
        method: method.0,
        budget,
        target_stderr,
        seed,
        parents,
        unions,
        n_threads,
        antithetic,
        fixed,
        exclude,
        noise,
        repeats,
        surrogate: surrogate.0,
        ..Default::default()
    };
    if let Ok(native) = game.cast::<PyGame>() {
        if noise.is_some() {
            return Err(MasreplayError::InvalidArgument(
                "noise: a native game is deterministic; noise applies to a callable that draws a fresh rollout per call"
                    .into(),
            ))
            .or_raise(py);
        }
        if canonical.is_some() {
            return Err(MasreplayError::InvalidArgument(
                "canonical applies to a callable game (a native game values every coalition at no cost)".into(),
            ))
            .or_raise(py);
        }
        let native = native.get();
        // A budget of evaluations, each of a coalition of up to n players.
        let values = options.budget_or_default().saturating_mul(native.n_players() as u64);
        let result = interruptible(py, usize::try_from(values).unwrap_or(usize::MAX), || {
            if let Some(n) = n_players {
                ensure!(n == native.n_players(), "n_players={n} but the game has {} players", native.n_players());
            }
            // Run inline, the call cannot be interrupted: the game is asked directly.
            let stoppable = Stoppable::new(native.game());
            let game: &dyn Game = if stoppable.checkpoint.is_armed() { &stoppable } else { native.game() };
            core_shapley(game, &options)
        })?
        .or_raise(py)?;
        return result_dict(py, result);
    }
    let function: Py<PyAny> = game.unbind();
    let outcome = py.detach(|| {
        let Some(n) = n_players else { bail!("n_players is required for a callable game") };
        let mut callable = CachedCallback::new(n, chunk_size, |coalitions: &Coalitions| {
            call_python(&function, "float64", |py| Ok(vec![masks_array(py, coalitions)?]))
        })?;
        if let Some(canonical) = &canonical {
            callable = callable.with_canonical(canonical_of(canonical));
        }
        if noise.is_some() {
            callable = callable.fresh();
        }
        core_shapley(&callable, &options)
    });
    result_dict(py, outcome.or_raise(py)?)
}

/// The arguments of a per-trace callback: each row's trace index and the masks (rows, width).
fn trace_masks<'py>(py: Python<'py>, traces: &[u32], masks: &[bool], width: usize) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let index: Vec<i64> = traces.iter().map(|&t| t as i64).collect();
    let masks = masks.to_vec().into_pyarray(py).reshape([traces.len(), width])?;
    Ok(vec![index.into_pyarray(py).into_any(), masks.into_any()])
}

/// The players of every trace as (offsets, labels, parents, event_player).
type PlayersTuple<'py> = (Bound<'py, PyArray1<i64>>, Vec<String>, Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i64>>);

/// The players of each trace: (offsets, labels, parents, event_player).
#[pyfunction]
pub fn trace_players<'py>(
    py: Python<'py>,
    batch: PyRef<'py, PyTraceBatch>,
    players: &str,
) -> PyResult<PlayersTuple<'py>> {
    let inner = &batch.inner;
    let found = py.detach(|| core_trace_players(inner, players)).or_raise(py)?;
    let offsets = offsets_array(py, &found.offsets);
    Ok((offsets, found.labels, found.parents.into_pyarray(py), found.event_player.into_pyarray(py)))
}

fn offsets_array<'py>(py: Python<'py>, offsets: &[usize]) -> Bound<'py, PyArray1<i64>> {
    offsets.iter().map(|&o| o as i64).collect::<Vec<i64>>().into_pyarray(py)
}

/// Shapley values of every trace; `value_fn(trace_index, masks)` values coalitions of
/// several traces at once. Returns the players and flat per-player results.
#[pyfunction]
#[pyo3(signature = (batch, value_fn, players, respect_spawn_tree, method, budget, seed, n_threads, antithetic, chunk_size, fixed, exclude, canonical, noise, repeats))]
#[allow(clippy::too_many_arguments)]
pub fn trace_shapley<'py>(
    py: Python<'py>,
    batch: PyRef<'py, PyTraceBatch>,
    value_fn: Bound<'py, PyAny>,
    players: &str,
    respect_spawn_tree: bool,
    method: Arg<Method>,
    budget: Option<u64>,
    seed: u64,
    n_threads: Option<usize>,
    antithetic: bool,
    chunk_size: usize,
    fixed: Vec<String>,
    exclude: Vec<String>,
    canonical: Option<Py<PyAny>>,
    noise: Option<f64>,
    repeats: Option<u64>,
) -> PyResult<Bound<'py, PyDict>> {
    let noise = noise.map(|sigma| if sigma.is_nan() { Noise::Auto } else { Noise::Known(sigma) });
    let options = ShapleyOptions {
        method: method.0,
        budget,
        seed,
        n_threads,
        antithetic,
        noise,
        repeats,
        ..ShapleyOptions::default()
    };
    let fixed = FixedPlayers { fixed, exclude };
    let inner = &batch.inner;
    let function: Py<PyAny> = value_fn.unbind();
    let outcome = py.detach(|| -> Result<_, MasreplayError> {
        let found = core_trace_players(inner, players)?;
        let mut value_fn = |traces: &[u32], masks: &[bool], width: usize| {
            call_python(&function, "float64", |py| trace_masks(py, traces, masks, width))
        };
        let mut canonical_fn = canonical.as_ref().map(|canonical| {
            move |traces: &[u32], masks: &[bool], width: usize| {
                call_python(canonical, "bool_", |py| trace_masks(py, traces, masks, width))
            }
        });
        let canonical_fn = canonical_fn.as_mut().map(|f| f as &mut dyn TraceCallback<bool>);
        let credit =
            core_trace_shapley(&found, respect_spawn_tree, &fixed, &options, chunk_size, &mut value_fn, canonical_fn)?;
        Ok((found, CreditColumns::from(credit)))
    });
    let (found, credit) = outcome.or_raise(py)?;
    let out = PyDict::new(py);
    out.set_item("offsets", offsets_array(py, &found.offsets))?;
    out.set_item("labels", found.labels)?;
    out.set_item("parents", found.parents.into_pyarray(py))?;
    out.set_item("event_player", found.event_player.into_pyarray(py))?;
    out.set_item("values", credit.values.into_pyarray(py))?;
    out.set_item("stderr", credit.stderr.into_pyarray(py))?;
    let evaluations: Vec<i64> = credit.evaluations.iter().map(|&count| count as i64).collect();
    out.set_item("evaluations", evaluations.into_pyarray(py))?;
    out.set_item("methods", credit.methods.iter().map(|method| method.map(Method::as_str)).collect::<Vec<_>>())?;
    out.set_item("exact", credit.exact)?;
    out.set_item("noise", credit.noise.into_pyarray(py))?;
    out.set_item("total_evaluations", credit.total_evaluations)?;
    Ok(out)
}
