//! Noisy value functions: each evaluation of a coalition is a fresh rollout, so values are
//! random and a coalition valued twice gives two different numbers.
//!
//! Two regimes, chosen by the budget:
//! - every coalition fits the budget at least once (twice when the noise is to be estimated):
//!   exact enumeration, each coalition valued `repeats` times and averaged. The estimate is
//!   linear in the values, phi_i = sum_T w_iT v(T), so with independent noise of standard
//!   deviation sigma its standard error is sigma * sqrt(sum_T w_iT^2 / repeats), where
//!   sum_T w_iT^2 = 2 sum_s C(n-1, s) w(s)^2 for every player. Re-evaluating is then the best
//!   use of budget: there is no sampling error left to spend it on. With `target_stderr`,
//!   repeats are added in rounds until the target is met.
//! - otherwise: the ordering samplers (permutation, precedence, permission, Owen), every
//!   coalition of every ordering drawn afresh (the empty and grand coalitions too), so the
//!   orderings stay independent and their spread holds the sampling error and the noise
//!   alike; `target_stderr` stops on it as without noise. A new ordering both samples and
//!   averages noise, so `repeats` defaults to 1 there.
//!
//! KernelSHAP and stratified sampling are refused: their standard errors leave out the noise
//! of the coalitions they enumerate. Values are not projected onto a noisy v(N) - v(empty)
//! (the exact and ordering estimates are efficient towards their own draws of those two);
//! `efficiency_gap` is NaN. The noise is the given sigma, or with `Noise::Auto` the pooled
//! spread of the coalitions valued more than once.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::coalition::{CoalitionMap, Coalitions};
use super::exact::{MAX_EXACT_PLAYERS, coalitions_needed, shapley_weights};
use super::forest::{Forest, ln_factorials};
use super::game::Game;
use super::games::RestrictedGame;
use super::owen::Hierarchy;
use super::{Estimate, Method, ShapleyOptions, ShapleyResult, Stopping, exact, permutation, sampling};
use crate::error::{MasreplayError, Result};

/// The standard deviation of one evaluation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Noise {
    /// Known.
    Known(f64),
    /// Estimated from coalitions valued more than once.
    Auto,
}

/// Count, sum and sum of squares of one coalition's draws.
#[derive(Clone, Copy, Default)]
struct Tally {
    count: u64,
    sum: f64,
    sum_squares: f64,
}

/// A noisy game seen by the estimators: each coalition asked for is drawn `repeats` times
/// from the inner game (which must draw afresh on every row) and averaged. With `pooled`,
/// the value returned is the mean of every draw of that coalition so far (exact rounds);
/// otherwise the mean of this request's draws (independent samples).
struct Draws<'a> {
    inner: &'a dyn Game,
    repeats: AtomicU64,
    pooled: bool,
    tallies: Mutex<CoalitionMap<Tally>>,
    draws: AtomicU64,
}

impl<'a> Draws<'a> {
    fn new(inner: &'a dyn Game, repeats: u64, pooled: bool) -> Self {
        Draws {
            inner,
            repeats: AtomicU64::new(repeats),
            pooled,
            tallies: Mutex::new(CoalitionMap::default()),
            draws: AtomicU64::new(0),
        }
    }

    fn tallies(&self) -> std::sync::MutexGuard<'_, CoalitionMap<Tally>> {
        self.tallies.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The pooled standard deviation of one draw over coalitions drawn more than once (NaN
    /// when none was).
    fn sigma(&self) -> f64 {
        let (mut squares, mut freedom) = (0.0, 0u64);
        for tally in self.tallies().values().filter(|t| t.count > 1) {
            squares += (tally.sum_squares - tally.sum * tally.sum / tally.count as f64).max(0.0);
            freedom += tally.count - 1;
        }
        if freedom == 0 { f64::NAN } else { (squares / freedom as f64).sqrt() }
    }
}

impl Game for Draws<'_> {
    fn n_players(&self) -> usize {
        self.inner.n_players()
    }

    fn values(&self, coalitions: &Coalitions) -> Result<Vec<f64>> {
        let repeats = self.repeats.load(Ordering::Relaxed);
        let mut batch = Coalitions::with_capacity(coalitions.n_players(), coalitions.len() * repeats as usize);
        for set in coalitions.iter() {
            (0..repeats).for_each(|_| batch.push(set));
        }
        let drawn = self.inner.values(&batch)?;
        if let Some(bad) = drawn.iter().find(|v| !v.is_finite()) {
            return Err(MasreplayError::InvalidArgument(format!("the game returned a non-finite value ({bad})")));
        }
        self.draws.fetch_add(batch.len() as u64, Ordering::Relaxed);
        let mut tallies = self.tallies();
        Ok(coalitions
            .iter()
            .zip(drawn.chunks_exact(repeats as usize))
            .map(|(set, draws)| {
                let tally = tallies.entry(set.to_vec()).or_default();
                tally.count += repeats;
                tally.sum += draws.iter().sum::<f64>();
                tally.sum_squares += draws.iter().map(|v| v * v).sum::<f64>();
                if self.pooled { tally.sum / tally.count as f64 } else { draws.iter().sum::<f64>() / repeats as f64 }
            })
            .collect())
    }

    fn sequential(&self) -> bool {
        // The draws of a random game depend on the order it is called in.
        true
    }

    fn preferred_batch(&self) -> usize {
        self.inner.preferred_batch()
    }

    fn evaluations(&self) -> Option<u64> {
        Some(self.draws.load(Ordering::Relaxed))
    }

    fn draws_per_request(&self) -> Option<u64> {
        Some(self.repeats.load(Ordering::Relaxed))
    }
}

/// sqrt(sum_T w_iT^2) of exact Shapley over n players: the standard error of a value per
/// unit of noise on every coalition.
fn exact_noise_factor(n: usize) -> f64 {
    let weights = shapley_weights(n);
    let ln = ln_factorials(n);
    let sum: f64 = (0..n).map(|s| (ln[n - 1] - ln[s] - ln[n - 1 - s]).exp() * weights[s] * weights[s]).sum();
    (2.0 * sum).sqrt()
}

/// Shapley values of a noisy game (see the module's docstring).
pub(super) fn shapley_under_noise(game: &dyn Game, options: &ShapleyOptions, noise: Noise) -> Result<ShapleyResult> {
    let n = game.n_players();
    if let Noise::Known(sigma) = noise
        && !(sigma >= 0.0 && sigma.is_finite())
    {
        return Err(MasreplayError::InvalidArgument(format!("noise must be 'auto' or a sigma >= 0, got {sigma}")));
    }
    if options.repeats == Some(0) {
        return Err(MasreplayError::InvalidArgument("repeats must be at least 1".into()));
    }
    let budget = options.budget.unwrap_or(if options.target_stderr.is_some() {
        super::TARGET_ONLY_BUDGET
    } else {
        super::DEFAULT_BUDGET
    });
    let stopping = Stopping { budget, target_stderr: options.target_stderr, seed: options.seed };
    let forest = options.parents.as_deref().map(Forest::new).transpose()?;
    if forest.as_ref().is_some_and(|f| f.len() != n) {
        return Err(MasreplayError::InvalidArgument(format!("parents has the wrong length for {n} players")));
    }
    let hierarchy = options.unions.clone().map(|unions| Hierarchy::new(n, unions)).transpose()?;
    let all = coalitions_needed(n);
    // Each coalition valued twice when the noise is to be estimated from the repeats.
    let least = if noise == Noise::Auto { 2.0 } else { 1.0 };
    let exact_fits = n <= MAX_EXACT_PLAYERS
        && all * options.repeats.unwrap_or(least as u64).max(least as u64) as f64 <= budget as f64;
    let method = match options.method {
        Method::Auto if forest.is_some() => Method::Precedence,
        Method::Auto if hierarchy.is_some() => Method::Owen,
        Method::Auto if exact_fits => Method::Exact,
        Method::Auto => Method::Permutation,
        Method::Kernel | Method::Stratified => {
            return Err(MasreplayError::InvalidArgument(format!(
                "method={:?} under noise: its standard errors would leave out the noise of the coalitions it \
                 enumerates; use 'exact', 'permutation', 'precedence', 'permission' or 'owen'",
                options.method.as_str()
            )));
        }
        chosen => chosen,
    };
    let needs = |what: &str| MasreplayError::InvalidArgument(format!("method={:?} needs {what}", method.as_str()));
    let (estimate, draws) = if method == Method::Exact {
        if !exact_fits {
            return Err(MasreplayError::InvalidArgument(format!(
                "budget: method='exact' under noise values all 2^{n} coalitions {} times, more than budget={budget}",
                least
            )));
        }
        exact_with_repeats(game, options, noise, &stopping)?
    } else {
        let draws = Draws::new(game, options.repeats.unwrap_or(1), false);
        let estimate = match method {
            Method::Permutation => {
                let sampler = permutation::UniformOrderings { n_players: n, antithetic: options.antithetic };
                sampling::estimate_by_orderings(&draws, &sampler, &stopping)?
            }
            Method::Precedence => {
                sampling::estimate_by_orderings(&draws, forest.as_ref().ok_or_else(|| needs("parents"))?, &stopping)?
            }
            Method::Permission => {
                let forest = forest.as_ref().ok_or_else(|| needs("parents"))?;
                let sampler = permutation::UniformOrderings { n_players: n, antithetic: options.antithetic };
                sampling::estimate_by_orderings(&RestrictedGame::new(&draws, forest), &sampler, &stopping)?
            }
            Method::Owen => {
                sampling::estimate_by_orderings(&draws, hierarchy.as_ref().ok_or_else(|| needs("unions"))?, &stopping)?
            }
            _ => return Err(needs("a noise-free game")),
        };
        (estimate, draws)
    };
    let sigma = match noise {
        Noise::Known(sigma) => sigma,
        Noise::Auto => draws.sigma(),
    };
    Ok(ShapleyResult {
        values: estimate.values,
        stderr: estimate.stderr,
        evaluations: draws.draws.load(Ordering::Relaxed),
        converged: estimate.converged,
        method,
        exact: false,
        efficiency_gap: f64::NAN,
        noise: Some(sigma),
    })
}

/// Exact enumeration with every coalition valued `repeats` times (all the budget allows by
/// default), in rounds while a target standard error is not met.
fn exact_with_repeats<'a>(
    game: &'a dyn Game,
    options: &ShapleyOptions,
    noise: Noise,
    stopping: &Stopping,
) -> Result<(Estimate, Draws<'a>)> {
    let n = game.n_players();
    let all = 1u64 << n;
    let affordable = stopping.budget / all;
    let least = if noise == Noise::Auto { 2 } else { 1 };
    let first = match (options.repeats, stopping.target_stderr) {
        (Some(repeats), _) => repeats,
        (None, None) => affordable,
        (None, Some(_)) => least,
    };
    let draws = Draws::new(game, first, true);
    let factor = exact_noise_factor(n);
    let mut done = first;
    loop {
        let estimate = exact::exact(&draws, stopping)?;
        let sigma = match noise {
            Noise::Known(sigma) => sigma,
            Noise::Auto => draws.sigma(),
        };
        let stderr = factor * sigma / (done as f64).sqrt();
        let met = stopping.target_stderr.is_some_and(|target| stderr <= target);
        // Repeats that meet the target at this sigma, capped by the budget.
        let wanted = stopping
            .target_stderr
            .map_or(done, |target| ((factor * sigma / target).powi(2).ceil() as u64).max(done + 1));
        let more = wanted.min(affordable).saturating_sub(done);
        if met || more == 0 || options.repeats.is_some() {
            let estimate = Estimate { stderr: vec![stderr; n], converged: met, exact: false, ..estimate };
            return Ok((estimate, draws));
        }
        draws.repeats.store(more, Ordering::Relaxed);
        done += more;
    }
}
