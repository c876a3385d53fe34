//! A sequential game (a Python callable) of several chunks is valued while the estimator
//! works on the chunks already in (shapley/pipeline.rs): the results must be the bits of the
//! same estimator on the same game valued all at once, and a game that fails mid-run must
//! end the run with its error.

use std::sync::atomic::{AtomicUsize, Ordering};

use masreplay_core::shapley::coalition::Coalitions;
use masreplay_core::shapley::games::{SoumGame, WeightedVotingGame};
use masreplay_core::shapley::{Game, Method, ShapleyOptions, shapley};
use masreplay_core::{MasreplayError, Result};

/// `inner` valued one small chunk at a time on the calling thread, as a callable is; fails
/// from call `fail_at` on when given.
struct Sequential<'a> {
    inner: &'a dyn Game,
    chunk: usize,
    calls: AtomicUsize,
    fail_at: Option<usize>,
}

impl<'a> Sequential<'a> {
    fn new(inner: &'a dyn Game, chunk: usize, fail_at: Option<usize>) -> Self {
        Sequential { inner, chunk, calls: AtomicUsize::new(0), fail_at }
    }
}

impl Game for Sequential<'_> {
    fn n_players(&self) -> usize {
        self.inner.n_players()
    }

    fn values(&self, coalitions: &Coalitions) -> Result<Vec<f64>> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        if self.fail_at.is_some_and(|at| call >= at) {
            return Err(MasreplayError::InvalidArgument(format!("the judge is down (call {call})")));
        }
        self.inner.values(coalitions)
    }

    fn sequential(&self) -> bool {
        true
    }

    fn preferred_batch(&self) -> usize {
        self.chunk
    }
}

fn cases() -> Vec<ShapleyOptions> {
    let mut out = Vec::new();
    for method in [Method::Msr, Method::Kernel, Method::Stratified] {
        for (budget, seed) in [(6_000, 0), (1_500, 3)] {
            out.push(ShapleyOptions { method, budget: Some(budget), seed, ..Default::default() });
        }
    }
    // Rounds that grow the sample until a target is met (each round a valuation of its own).
    out.push(ShapleyOptions { method: Method::Msr, target_stderr: Some(0.05), seed: 2, ..Default::default() });
    out
}

#[test]
fn pipelined_valuation_gives_the_same_bits_as_valuing_at_once() {
    let soum = SoumGame::random(60, 90, 4, 5).unwrap();
    let weights: Vec<f64> = (0..30).map(|i| 1.0 + (i * 7 % 11) as f64).collect();
    let quota = 0.55 * weights.iter().sum::<f64>();
    let voting = WeightedVotingGame::new(weights, quota).unwrap();
    for game in [&soum as &dyn Game, &voting] {
        for options in cases() {
            let at_once = shapley(game, &options).unwrap();
            // Chunks of 97 coalitions: every batch spans many chunks, and the chunks cut
            // strata and complementary pairs anywhere.
            let sequential = Sequential::new(game, 97, None);
            let pipelined = shapley(&sequential, &options).unwrap();
            assert!(sequential.calls.load(Ordering::SeqCst) > 10, "{:?}: the pipeline was not used", options.method);
            assert_eq!(pipelined, at_once, "{:?} budget {:?}", options.method, options.budget);
        }
    }
}

#[test]
fn a_game_failing_mid_run_ends_the_run_with_its_error() {
    let game = SoumGame::random(60, 90, 4, 5).unwrap();
    for options in cases() {
        let failing = Sequential::new(&game, 97, Some(6));
        let error = shapley(&failing, &options).unwrap_err().to_string();
        assert!(error.contains("the judge is down (call 6)"), "{:?}: {error}", options.method);
        // The run stopped at the failure: no chunk was asked for after it.
        assert_eq!(failing.calls.load(Ordering::SeqCst), 7, "{:?}", options.method);
    }
}
