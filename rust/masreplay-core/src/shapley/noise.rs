//! Noisy value functions: each evaluation of a coalition is a fresh rollout, so values are
//! random and a coalition valued twice gives two different numbers.
//!
//! Three regimes, chosen by the budget:
//! - every coalition fits the budget at least once (twice when the noise is to be estimated),
//!   and exact's noise variance, known in closed form, is no more than MSR's noise alone at
//!   that budget ([`exact_beats_msr`]; at n = 8 from 384 evaluations, not 256, where drawing
//!   every coalition once was noisier than MSR just below): exact enumeration, each coalition
//!   drawn several times and averaged. The estimate is
//!   linear in the values, phi_i = sum_T w_iT v(T), so with independent noise of standard
//!   deviation sigma and r(T) draws of T its standard error is
//!   sigma * sqrt(sum_T w_iT^2 / r(T)), the same for every player when r depends on the size
//!   only. The budget is spread over sizes to minimise it (Neyman allocation, [`shares`]):
//!   re-evaluating is the best use of budget there, as no sampling error is left to spend it
//!   on. With `target_stderr`, draws are added in rounds until the target is met.
//! - otherwise, with a budget of at least 10 requests a player (evaluations over `repeats`)
//!   and no structure (or permission's, a restricted game): MSR (msr.rs), every requested
//!   coalition a fresh draw; precedence values take MSR's reuse over down-sets
//!   (precedence_msr.rs) the same way.
//!   Each evaluation informs every player, so the noise variance in a value is
//!   4 sigma^2 Z^2 / budget, Z = sum_{s <= n/2} 1 / sqrt(s (n - s)) -> pi / 2 (msr.rs's
//!   allocation), where an ordering sampler's is 2 sigma^2 n / budget. The
//!   empty and grand coalitions and the census of the smallest and largest sizes are drawn
//!   repeatedly, as many times as Neyman's rule gives them ([`msr::Plan::noisy`]), and their
//!   noise, known in closed form from sigma, is added to the standard errors; the sampled
//!   draws' spread holds theirs. With `target_stderr`, independent rounds ([`in_rounds`]).
//! - otherwise: the ordering samplers (permutation, precedence, permission, Owen), every
//!   coalition of every ordering drawn afresh (the empty and grand coalitions too), so the
//!   orderings stay independent and their spread holds the sampling error and the noise
//!   alike; `target_stderr` stops on it as without noise. A new ordering both samples and
//!   averages noise, so `repeats` defaults to 1 there.
//!
//! KernelSHAP and stratified sampling are refused: their standard errors leave out the noise
//! of the coalitions they enumerate. Values are not projected onto a noisy v(N) - v(empty)
//! (the exact, MSR and ordering estimates are efficient towards their own draws of those two);
//! `efficiency_gap` is NaN. The noise is the given sigma, or with `Noise::Auto` the pooled
//! spread of the coalitions valued more than once.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use rand::Rng;

use super::coalition::{CoalitionMap, Coalitions};
use super::exact::{MAX_EXACT_PLAYERS, coalitions_needed, shapley_weights};
use super::forest::{Forest, ln_factorials};
use super::game::Game;
use super::games::RestrictedGame;
use super::owen::Hierarchy;
use super::{
    Estimate, Method, ShapleyOptions, ShapleyResult, Stopping, exact, msr, permutation, precedence_msr, sampling,
};
use crate::error::{MasreplayError, Result};
use crate::limit::check_game_values;
use crate::rng::stream;

/// The standard deviation of one evaluation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Noise {
    /// Known.
    Known(f64),
    /// Estimated from coalitions valued more than once.
    Auto,
}

/// The domain of the rounds' seeds (see [`in_rounds`]).
const ROUND_SEEDS: u64 = 0x524f_554e_4453;

/// Requests per player (evaluations over `repeats`) from which `auto` runs MSR on a noisy game
/// (30 evaluations without noise): on the benchmark's noisy games (sigma a tenth of the value
/// range) at 10 a player, MSR's error is 2.2-4.3x below antithetic permutations' at n = 30 and
/// 100, its intervals covering 93-95% (40 and 20 seeds); at 3.3 a player (n = 300, 1,000
/// evaluations) it is as often above as below. Counted in requests: a repeat averages noise but
/// samples nothing, and MSR's strata need samples (precedence's, four down-sets of each size).
const MSR_FROM_REQUESTS_PER_PLAYER: u64 = 10;

/// What an estimate under noise cost, and the noise it assumed.
struct Spent {
    evaluations: u64,
    sigma: f64,
}

/// Count, sum and sum of squares of one coalition's draws.
#[derive(Clone, Copy, Default)]
struct Tally {
    count: u64,
    sum: f64,
    sum_squares: f64,
}

/// A noisy game seen by the estimators: each coalition asked for is drawn `repeats[size]`
/// times from the inner game (which must draw afresh on every row) and averaged. With
/// `pooled`, the value returned is the mean of every draw of that coalition so far (exact
/// rounds); otherwise the mean of this request's draws (independent samples).
struct Draws<'a> {
    inner: &'a dyn Game,
    /// Draws per request, by coalition size (the same for every size when sampling).
    repeats: Mutex<Vec<u64>>,
    pooled: bool,
    tallies: Mutex<CoalitionMap<Tally>>,
    draws: AtomicU64,
}

impl<'a> Draws<'a> {
    fn new(inner: &'a dyn Game, repeats: Vec<u64>, pooled: bool) -> Self {
        Draws {
            inner,
            repeats: Mutex::new(repeats),
            pooled,
            tallies: Mutex::new(CoalitionMap::default()),
            draws: AtomicU64::new(0),
        }
    }

    fn repeats(&self) -> std::sync::MutexGuard<'_, Vec<u64>> {
        self.repeats.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn tallies(&self) -> std::sync::MutexGuard<'_, CoalitionMap<Tally>> {
        self.tallies.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The draws made so far and the noise: the given sigma, or the one estimated.
    fn spent(&self, noise: Noise) -> Spent {
        let sigma = match noise {
            Noise::Known(sigma) => sigma,
            Noise::Auto => self.sigma(),
        };
        Spent { evaluations: self.draws.load(Ordering::Relaxed), sigma }
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
        let counts: Vec<u64> = {
            let repeats = self.repeats();
            coalitions.iter().map(|set| repeats[size(set)]).collect()
        };
        let mut batch = Coalitions::with_capacity(coalitions.n_players(), counts.iter().sum::<u64>() as usize);
        for (set, &count) in coalitions.iter().zip(&counts) {
            (0..count).for_each(|_| batch.push(set));
        }
        let drawn = self.inner.values(&batch)?;
        check_game_values(&drawn, "the game", "a coalition")?;
        self.draws.fetch_add(batch.len() as u64, Ordering::Relaxed);
        let mut tallies = self.tallies();
        let mut next = 0;
        Ok(coalitions
            .iter()
            .zip(counts)
            .map(|(set, count)| {
                let draws = &drawn[next..next + count as usize];
                next += count as usize;
                let tally = tallies.entry(set.to_vec()).or_default();
                tally.count += count;
                tally.sum += draws.iter().sum::<f64>();
                tally.sum_squares += draws.iter().map(|v| v * v).sum::<f64>();
                if self.pooled { tally.sum / tally.count as f64 } else { draws.iter().sum::<f64>() / count as f64 }
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
        self.repeats().first().copied()
    }
}

/// Per coalition size s, the variance one player's exact Shapley value takes from the noise
/// of the size-s coalitions, each drawn once, per unit of sigma^2:
/// c(s) = C(n-1, s-1) w(s-1)^2 + C(n-1, s) w(s)^2 (the coalitions with the player, and without).
fn size_variances(n: usize) -> Vec<f64> {
    let weights = shapley_weights(n);
    let ln = ln_factorials(n);
    let choose = |k: usize| (ln[n - 1] - ln[k] - ln[n - 1 - k]).exp();
    (0..=n)
        .map(|s| {
            let with = if s > 0 { choose(s - 1) * weights[s - 1].powi(2) } else { 0.0 };
            let without = if s < n { choose(s) * weights[s].powi(2) } else { 0.0 };
            with + without
        })
        .collect()
}

/// Per size s: the number of coalitions, C(n, s), and the share of draws each gets when the
/// draws minimise the values' noise, proportional to sqrt(c(s) / C(n, s)) (Neyman
/// allocation; the empty and grand coalitions, weighted 1/n in every value, get the most).
fn shares(n: usize, variances: &[f64]) -> Vec<(f64, f64)> {
    let ln = ln_factorials(n);
    (0..=n)
        .map(|s| {
            let count = (ln[n] - ln[s] - ln[n - s]).exp().round();
            (count, (variances[s] / count).sqrt())
        })
        .collect()
}

/// Draws per coalition of each size beyond `done` (the draws each coalition of that size has
/// had): `least` each, the rest of `spend` as [`shares`] says, and what rounding those down
/// leaves (up to one draw of every coalition, a quarter of the budget at n = 8) one size at a
/// time while it fits, each to the size whose next draw of every coalition takes the most
/// noise variance off per evaluation.
fn allocate(n: usize, variances: &[f64], done: &[u64], least: u64, spend: u64) -> Vec<u64> {
    let shares = shares(n, variances);
    let total: f64 = shares.iter().map(|(count, share)| count * share).sum();
    let free = spend.saturating_sub(least << n) as f64;
    let mut more: Vec<u64> = shares.iter().map(|(_, share)| least + (free * share / total).floor() as u64).collect();
    let spent: f64 = more.iter().zip(&shares).map(|(&m, (count, _))| m as f64 * count).sum();
    let mut left = (spend as f64 - spent).max(0.0);
    // c(s) (1/r - 1/(r + 1)) / C(n, s), with r >= 1 draws so far.
    let gain = |s: usize, more: &[u64]| {
        let r = (done[s] + more[s]).max(1) as f64;
        variances[s] / (r * (r + 1.0) * shares[s].0)
    };
    while let Some(s) =
        (0..=n).filter(|&s| shares[s].0 <= left).max_by(|&a, &b| gain(a, &more).total_cmp(&gain(b, &more)))
    {
        more[s] += 1;
        left -= shares[s].0;
    }
    more
}

/// Draws per coalition of each size that bring the standard error to `target`: with
/// r(s) = t share(s), sigma^2 sum c(s) / r(s) = target^2.
fn repeats_for_target(n: usize, variances: &[f64], sigma: f64, target: f64) -> Vec<u64> {
    let shares = shares(n, variances);
    let t =
        sigma * sigma * shares.iter().zip(variances).map(|((_, share), c)| c / share).sum::<f64>() / (target * target);
    // Capped far beyond any budget, so that the cost below cannot overflow.
    shares.iter().map(|(_, share)| (t * share).ceil().min(1e12) as u64).collect()
}

fn size(set: &[u64]) -> usize {
    super::coalition::size(set)
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
    let budget = options.budget_or_default();
    let stopping = Stopping { budget, target_stderr: options.target_stderr, seed: options.seed, per_request: 1 };
    let forest = options.parents.as_deref().map(Forest::new).transpose()?;
    if forest.as_ref().is_some_and(|f| f.len() != n) {
        return Err(MasreplayError::InvalidArgument(format!("parents has the wrong length for {n} players")));
    }
    let hierarchy = options.unions.clone().map(|unions| Hierarchy::new(n, unions)).transpose()?;
    let all = coalitions_needed(n);
    // Each coalition valued twice when the noise is to be estimated from the repeats.
    let least = if noise == Noise::Auto { 2.0 } else { 1.0 };
    let exact_draws = options.repeats.unwrap_or(least as u64).max(least as u64);
    let exact_fits = n <= MAX_EXACT_PLAYERS && all * exact_draws as f64 <= budget as f64;
    let msr_least = (MSR_FROM_REQUESTS_PER_PLAYER * n as u64).saturating_mul(options.repeats.unwrap_or(1));
    let msr_fits = budget >= msr_least;
    // With a target, the exact regime's rounds are sized from it, and with `repeats` it draws
    // every coalition that often: neither spends the budget as the comparison assumes.
    let budget_spent = options.target_stderr.is_none() && options.repeats.is_none();
    let exact_preferred = exact_fits && (!msr_fits || !budget_spent || exact_beats_msr(n, budget, noise));
    let method = match options.method {
        Method::Auto if forest.is_some() => Method::Precedence,
        Method::Auto if hierarchy.is_some() => Method::Owen,
        Method::Auto if exact_preferred => Method::Exact,
        Method::Auto if msr_fits => Method::Msr,
        Method::Auto => Method::Permutation,
        Method::Kernel | Method::Stratified | Method::Census => {
            return Err(MasreplayError::InvalidArgument(format!(
                "method={:?} under noise: its standard errors would leave out the noise of the coalitions it \
                 enumerates; use 'exact', 'msr', 'permutation', 'precedence', 'permission' or 'owen'",
                options.method.as_str()
            )));
        }
        chosen => chosen,
    };
    let needs = |what: &str| MasreplayError::InvalidArgument(format!("method={:?} needs {what}", method.as_str()));
    let mut extras = super::msr_extras(options.surrogate, n);
    extras.settle &= options.adaptive;
    let (estimate, spent) = match method {
        Method::Exact if !exact_fits => {
            return Err(MasreplayError::InvalidArgument(format!(
                "budget: method='exact' under noise values all 2^{n} coalitions {exact_draws} times, more than \
                 budget={budget}"
            )));
        }
        Method::Exact => exact_with_repeats(game, options, noise, &stopping)?,
        Method::Msr => {
            in_rounds(&stopping, n, msr_least, |round| msr_with_repeats(game, options, noise, round, extras))?
        }
        Method::Precedence if msr_fits => {
            let forest = forest.as_ref().ok_or_else(|| needs("parents"))?;
            in_rounds(&stopping, n, msr_least, |round| precedence_with_repeats(game, forest, options, noise, round))?
        }
        // Permission values are the Shapley values of the restricted game, as without noise.
        Method::Permission if msr_fits => {
            let restricted = RestrictedGame::new(game, forest.as_ref().ok_or_else(|| needs("parents"))?);
            let extras = msr::Extras { threshold: false, settle: false, ..extras };
            in_rounds(&stopping, n, msr_least, |round| msr_with_repeats(&restricted, options, noise, round, extras))?
        }
        _ => {
            // The spread of the orderings holds the noise: it takes two of them.
            let two_orderings = 2 * (n as u64 + 1) * options.repeats.unwrap_or(1);
            if stopping.budget < two_orderings {
                return Err(MasreplayError::InvalidArgument(format!(
                    "budget: {budget} evaluations draw fewer than two orderings, whose spread is the noise's only \
                     measure under method={:?}; give at least {two_orderings}",
                    method.as_str()
                )));
            }
            let draws = Draws::new(game, vec![options.repeats.unwrap_or(1); n + 1], false);
            let estimate = match method {
                Method::Permutation => {
                    let sampler = permutation::UniformOrderings { n_players: n, antithetic: options.antithetic };
                    sampling::estimate_by_orderings(&draws, &sampler, &stopping)?
                }
                Method::Precedence => sampling::estimate_by_orderings(
                    &draws,
                    forest.as_ref().ok_or_else(|| needs("parents"))?,
                    &stopping,
                )?,
                Method::Permission => {
                    let forest = forest.as_ref().ok_or_else(|| needs("parents"))?;
                    let sampler = permutation::UniformOrderings { n_players: n, antithetic: options.antithetic };
                    sampling::estimate_by_orderings(&RestrictedGame::new(&draws, forest), &sampler, &stopping)?
                }
                Method::Owen => sampling::estimate_by_orderings(
                    &draws,
                    hierarchy.as_ref().ok_or_else(|| needs("unions"))?,
                    &stopping,
                )?,
                _ => return Err(needs("a noise-free game")),
            };
            (estimate, draws.spent(noise))
        }
    };
    Ok(ShapleyResult {
        values: estimate.values,
        stderr: estimate.stderr,
        evaluations: spent.evaluations,
        converged: estimate.converged,
        method,
        exact: false,
        efficiency_gap: f64::NAN,
        noise: Some(spent.sigma),
    })
}

/// Whether exact enumeration at this budget leaves less noise variance than MSR's noise alone
/// would ([`msr::Plan::noise_variance`], which MSR's sampling error only adds to): both are
/// known in closed form per unit of sigma^2. Just above 2^n, exact draws every coalition once,
/// the empty and grand coalitions too, where Neyman's rule gives them many draws: at n = 8,
/// 256 evaluations, exact's variance is 0.076 sigma^2 and MSR's noise 0.023 sigma^2 (its
/// sampling error 0.03 sigma^2 on a SOUM game), so exact at 256 lost to MSR at 255; by this
/// rule exact takes over at 384. The rule costs the nearly noiseless games, where MSR's
/// sampling error dominates, in that window.
fn exact_beats_msr(n: usize, budget: u64, noise: Noise) -> bool {
    let variances = size_variances(n);
    let least = if noise == Noise::Auto { 2 } else { 1 };
    let draws = allocate(n, &variances, &vec![0; n + 1], least, budget);
    let exact: f64 = variances.iter().zip(&draws).map(|(c, &r)| c / r as f64).sum();
    let plan = msr::Plan::noisy(n, budget, least);
    // A plan that enumerates every size is exact enumeration too, its draws spread by sizes
    // in pairs: exact's own allocation, by single sizes, is the finer one.
    plan.samples_nothing() || exact <= plan.noise_variance()
}

/// An estimate under noise that stops on `target_stderr` (otherwise one `round` of the whole
/// budget): independent rounds, each a fresh estimate with a seed of its own, the first a
/// pilot of `least` (the smallest budget MSR is chosen at; a fixed first round of
/// max(4096, 40 n) spent 4,028 rollouts at n = 8 whatever the target), each next one as large
/// as the combination's worst standard error says the target needs (10% more), at least
/// `least` and at most what is spent so far: the worst of n standard errors read from a pilot's
/// few degrees of freedom, t-scaled, overstates the need (sized from it alone, rounds at n = 8,
/// target 0.05 spent up to 11,128). The rounds are combined with
/// weights in proportion to their budgets, the inverse-variance weights when a round's
/// variance falls like 1 / budget. Each round is unbiased and its budget is set before its
/// values are seen; when to stop depends on them, as with any stop on a running standard
/// error (the ordering samplers' too), which the coverage tests bound.
fn in_rounds(
    stopping: &Stopping,
    n: usize,
    least: u64,
    mut round: impl FnMut(&Stopping) -> Result<(Estimate, Spent)>,
) -> Result<(Estimate, Spent)> {
    let Some(target) = stopping.target_stderr else { return round(stopping) };
    let mut next = least.min(stopping.budget);
    let mut rounds: Vec<(u64, Estimate)> = Vec::new();
    let mut evaluations = 0;
    loop {
        let seed = match rounds.len() {
            0 => stopping.seed,
            r => stream(stopping.seed ^ ROUND_SEEDS, r as u64).next_u64(),
        };
        let (estimate, spent) = round(&Stopping { budget: next, target_stderr: None, seed, per_request: 1 })?;
        evaluations += spent.evaluations;
        rounds.push((next, estimate));
        let total: u64 = rounds.iter().map(|(budget, _)| budget).sum();
        let (mut values, mut variance) = (vec![0.0; n], vec![0.0; n]);
        for (budget, estimate) in &rounds {
            let weight = *budget as f64 / total as f64;
            values.iter_mut().zip(&estimate.values).for_each(|(v, x)| *v += weight * x);
            variance.iter_mut().zip(&estimate.stderr).for_each(|(v, e)| *v += weight * weight * e * e);
        }
        let stderr: Vec<f64> = variance.iter().map(|v| v.sqrt()).collect();
        let worst = stderr.iter().fold(0.0f64, |a, &b| a.max(b));
        let left = stopping.budget.saturating_sub(total);
        if worst <= target || left < least {
            let converged = worst <= target;
            let estimate = Estimate { values, stderr, evaluations, converged, exact: false };
            return Ok((estimate, Spent { evaluations, sigma: spent.sigma }));
        }
        let needed = (1.1 * total as f64 * (worst / target).powi(2)).ceil() as u64;
        next = needed.saturating_sub(total).min(total).clamp(least, left);
    }
}

/// MSR on a noisy game: the budget spent as [`msr::Plan::noisy`] says, each request drawn
/// `repeats` times more (default once). The sampled strata's spread holds their noise; the
/// noise of the repeated empty and grand coalitions and of the census, known in closed form
/// from sigma, is added to every standard error.
fn msr_with_repeats(
    game: &dyn Game,
    options: &ShapleyOptions,
    noise: Noise,
    stopping: &Stopping,
    extras: msr::Extras,
) -> Result<(Estimate, Spent)> {
    let n = game.n_players();
    let per_request = options.repeats.unwrap_or(1);
    // One draw a request estimates no noise: the repeated coalitions must be drawn twice.
    let least = if noise == Noise::Auto && per_request == 1 { 2 } else { 1 };
    let requests = Stopping { budget: stopping.budget / per_request, per_request, ..stopping.clone() };
    let plan = msr::Plan::noisy(n, requests.budget, least);
    bounds_affordable(plan.repeats()[0], least, stopping.budget)?;
    let fixed = plan.fixed_noise_variance() / per_request as f64;
    let draws = Draws::new(game, plan.repeats().iter().map(|r| r * per_request).collect(), false);
    let mut estimate = msr::msr_planned(&draws, &requests, extras, plan)?;
    let spent = draws.spent(noise);
    estimate.stderr.iter_mut().for_each(|e| *e = (*e * *e + spent.sigma * spent.sigma * fixed).sqrt());
    Ok((estimate, spent))
}

/// Precedence values on a noisy game by MSR over down-sets (precedence_msr.rs), each request
/// drawn `repeats` times (default once) and the empty and grand coalitions as often as
/// Neyman's rule gives them; their noise, sigma^2 / draws times each player's squared weights
/// of the two, is added to every standard error.
fn precedence_with_repeats(
    game: &dyn Game,
    forest: &Forest,
    options: &ShapleyOptions,
    noise: Noise,
    stopping: &Stopping,
) -> Result<(Estimate, Spent)> {
    let n = game.n_players();
    let per_request = options.repeats.unwrap_or(1);
    let least = if noise == Noise::Auto && per_request == 1 { 2 } else { 1 };
    let requests = Stopping { budget: stopping.budget / per_request, per_request, ..stopping.clone() };
    let weights = precedence_msr::BoundWeights::of(forest);
    let bound_draws = weights.draws(requests.budget, least);
    bounds_affordable(bound_draws, least, stopping.budget)?;
    let mut repeats = vec![per_request; n + 1];
    (repeats[0], repeats[n]) = (bound_draws * per_request, bound_draws * per_request);
    let draws = Draws::new(game, repeats, false);
    let mut estimate = precedence_msr::precedence_msr(&draws, forest, &weights, &requests, bound_draws)?;
    let spent = draws.spent(noise);
    let per_draw = spent.sigma * spent.sigma / (bound_draws * per_request) as f64;
    for ((e, a), b) in estimate.stderr.iter_mut().zip(&weights.empty).zip(&weights.full) {
        *e = (*e * *e + per_draw * (a * a + b * b)).sqrt();
    }
    Ok((estimate, spent))
}

/// Refuses a budget that cannot draw the empty and the grand coalition `least` times each.
fn bounds_affordable(draws: u64, least: u64, budget: u64) -> Result<()> {
    if draws < least.max(1) {
        return Err(MasreplayError::InvalidArgument(format!(
            "budget: {budget} evaluations cannot draw the empty and the grand coalition {} times each",
            least.max(1)
        )));
    }
    Ok(())
}

/// Exact enumeration with every coalition drawn several times: as many as given, or the
/// budget spread by [`allocate`]; with a target standard error, in rounds until it is met.
fn exact_with_repeats(
    game: &dyn Game,
    options: &ShapleyOptions,
    noise: Noise,
    stopping: &Stopping,
) -> Result<(Estimate, Spent)> {
    let n = game.n_players();
    let variances = size_variances(n);
    let least = if noise == Noise::Auto { 2 } else { 1 };
    let first = match (options.repeats, stopping.target_stderr) {
        (Some(repeats), _) if repeats < least => {
            return Err(MasreplayError::InvalidArgument(format!(
                "repeats={repeats} with noise='auto': exact enumeration draws each coalition `repeats` times and \
                 estimates sigma from them; give repeats >= 2, or the noise's sigma"
            )));
        }
        (Some(repeats), _) => vec![repeats; n + 1],
        (None, None) => allocate(n, &variances, &vec![0; n + 1], least, stopping.budget),
        (None, Some(_)) => vec![least; n + 1],
    };
    let draws = Draws::new(game, first.clone(), true);
    let mut done = first;
    loop {
        let estimate = exact::exact(&draws, stopping)?;
        let sigma = draws.spent(noise).sigma;
        let stderr = sigma * (0..=n).map(|s| variances[s] / done[s] as f64).sum::<f64>().sqrt();
        let met = stopping.target_stderr.is_some_and(|target| stderr <= target);
        let left = stopping.budget.saturating_sub(draws.draws.load(Ordering::Relaxed));
        let more = match stopping.target_stderr {
            Some(target) if !met && options.repeats.is_none() && sigma.is_finite() => {
                // Draws that meet the target at this sigma, spread as `allocate` spreads them.
                let wanted = repeats_for_target(n, &variances, sigma, target);
                let extra: Vec<u64> = wanted.iter().zip(&done).map(|(w, d)| w.saturating_sub(*d)).collect();
                let cost: f64 = extra.iter().zip(shares(n, &variances)).map(|(e, (count, _))| *e as f64 * count).sum();
                if cost <= left as f64 { extra } else { allocate(n, &variances, &done, 0, left) }
            }
            _ => vec![0; n + 1],
        };
        if met || more.iter().all(|&m| m == 0) {
            let estimate = Estimate { stderr: vec![stderr; n], converged: met, exact: false, ..estimate };
            return Ok((estimate, draws.spent(noise)));
        }
        done.iter_mut().zip(&more).for_each(|(d, m)| *d += m);
        *draws.repeats() = more;
    }
}
