//! Shapley credit: games (values of coalitions of players) and estimators behind one entry
//! point, [`shapley`]. Estimators: exact enumeration, antithetic permutation sampling,
//! paired KernelSHAP regression, stratified SVARM, regression-adjusted MSR, precedence
//! (spawn-tree) Shapley, the permission value of the restricted game, and Owen values of
//! nested unions. Every sampled estimator stops at a
//! budget of coalition evaluations or a target standard error, and is deterministic by seed
//! at any thread count. Results are projected onto v(N) - v(empty), so efficiency holds to
//! rounding for every method; the gap the projection closed is reported
//! ([`ShapleyResult::efficiency_gap`]): rounding-sized for the estimators efficient by
//! construction (all but stratified), a measured error for the others.

mod census;
pub mod coalition;
pub mod columns;
mod exact;
pub mod forest;
pub mod game;
pub mod games;
mod kernel;
pub(crate) mod linalg;
mod msr;
mod noise;
mod owen;
mod permutation;
mod pipeline;
mod players;
mod precedence;
mod precedence_msr;
pub mod sampling;
mod signs;
mod stratified;
mod surrogate;
mod threshold;
pub mod traces;

pub use coalition::Coalitions;
pub use exact::MAX_EXACT_PLAYERS;
pub use forest::Forest;
pub use game::Game;
pub use noise::Noise;
pub use owen::{Hierarchy, Union};

use crate::error::{MasreplayError, Result};
use crate::names::named_enum;
use games::RestrictedGame;

/// Evaluations spent when neither a budget nor a target standard error is given.
pub const DEFAULT_BUDGET: u64 = 10_000;
/// The most evaluations a run chasing a target standard error may spend without a budget.
pub const TARGET_ONLY_BUDGET: u64 = 100_000_000;
/// Exact enumeration of down-sets (precedence) or predecessor sets (Owen) is used when it
/// needs at most this many evaluations and the budget allows.
const EXACT_STRUCTURE_LIMIT: f64 = (1u64 << 22) as f64;

named_enum!(
    /// The estimator a Shapley run uses (see the Python module's docstring for each).
    Method as "method" {
        Auto = "auto", Exact = "exact", Permutation = "permutation", Kernel = "kernel",
        Precedence = "precedence", Permission = "permission", Owen = "owen", Stratified = "stratified",
        Msr = "msr", Census = "census",
    }
);

named_enum!(
    /// MSR's surrogate: linear in the members with size-varying slopes, or that plus
    /// interaction features screened on its residuals (surrogate.rs); `auto` by
    /// [`msr_extras`] (with a step on two-valued games, threshold.rs).
    MsrSurrogate as "surrogate" { Auto = "auto", Linear = "linear", Interactions = "interactions" }
);

#[derive(Clone, Debug)]
pub struct ShapleyOptions {
    pub method: Method,
    pub budget: Option<u64>,
    pub target_stderr: Option<f64>,
    pub seed: u64,
    /// `parents[i]`: the player that spawned i, or -1 for a root.
    pub parents: Option<Vec<i64>>,
    pub unions: Option<Vec<Union>>,
    pub n_threads: Option<usize>,
    /// Antithetic pairs of orderings for the permutation and permission samplers.
    pub antithetic: bool,
    /// Players always present (their worth goes into the baseline v(fixed)) and players
    /// never present; both get no credit (see [`players`]).
    pub fixed: Vec<u32>,
    pub exclude: Vec<u32>,
    /// A noisy game: each evaluation a fresh draw (see [`noise`]); None for a deterministic one.
    pub noise: Option<Noise>,
    /// Draws per coalition under noise (None: all the budget allows when every coalition
    /// fits it, else 1).
    pub repeats: Option<u64>,
    /// MSR's surrogate (method `msr`, and `auto` or `permission` where they run MSR).
    pub surrogate: MsrSurrogate,
    /// Whether MSR may choose coalitions after seeing values (its pilot on a two-valued game,
    /// msr.rs); off for a recording pass, which values the coalitions only once every
    /// estimator has asked for them.
    pub adaptive: bool,
}

impl ShapleyOptions {
    /// The budget a call spends at most: the one given, else the default (larger with only a
    /// target standard error to stop on).
    pub fn budget_or_default(&self) -> u64 {
        self.budget.unwrap_or(if self.target_stderr.is_some() { TARGET_ONLY_BUDGET } else { DEFAULT_BUDGET })
    }
}

impl Default for ShapleyOptions {
    fn default() -> Self {
        ShapleyOptions {
            method: Method::Auto,
            budget: None,
            target_stderr: None,
            seed: 0,
            parents: None,
            unions: None,
            n_threads: None,
            antithetic: true,
            fixed: Vec::new(),
            exclude: Vec::new(),
            noise: None,
            repeats: None,
            surrogate: MsrSurrogate::Auto,
            adaptive: true,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ShapleyResult {
    pub values: Vec<f64>,
    /// Standard error of each value (0 when exact).
    pub stderr: Vec<f64>,
    /// Coalitions valued (distinct ones, for games that count them).
    pub evaluations: u64,
    /// Exact, or the target standard error was reached.
    pub converged: bool,
    /// The estimator that ran (what `auto` picked).
    pub method: Method,
    /// Computed exactly rather than sampled.
    pub exact: bool,
    /// v(N) - v(empty) minus the sum of the estimator's values before they were projected
    /// onto efficiency (the projection adds a share of it to every value).
    pub efficiency_gap: f64,
    /// Under noise: the standard deviation of one evaluation (given, or estimated; NaN when
    /// no coalition was valued twice). None for a deterministic game.
    pub noise: Option<f64>,
}

/// When to stop sampling.
#[derive(Clone, Debug)]
pub struct Stopping {
    pub budget: u64,
    pub target_stderr: Option<f64>,
    pub seed: u64,
    /// Evaluations a request of a coalition costs: `repeats` on a noisy game, where `budget`
    /// counts requests; 1 otherwise.
    pub per_request: u64,
}

impl Stopping {
    /// `requests` in the caller's unit, evaluations.
    fn evaluations(&self, requests: u64) -> u64 {
        requests.saturating_mul(self.per_request)
    }

    /// The budget as a refusal quotes it: in evaluations, with the requests they buy when a
    /// request costs more than one.
    fn quoted_budget(&self) -> String {
        match self.per_request {
            1 => format!("{} evaluations", self.budget),
            per => {
                format!("{} evaluations ({} requests of {per} draws each)", self.evaluations(self.budget), self.budget)
            }
        }
    }

    fn converged(&self, stderr: &[f64]) -> bool {
        self.target_stderr.is_some_and(|target| stderr.iter().all(|&e| e <= target))
    }
}

/// What an estimator returns before the dispatcher adds the method and the projection.
pub struct Estimate {
    pub values: Vec<f64>,
    pub stderr: Vec<f64>,
    pub evaluations: u64,
    pub converged: bool,
    pub exact: bool,
}

impl Estimate {
    /// A game of one player: v(N) - v(empty), exactly, from the two bounds.
    fn of_one_player(delta: f64) -> Self {
        Estimate { values: vec![delta], stderr: vec![0.0], evaluations: 2, converged: true, exact: true }
    }

    fn with_target(mut self, stopping: &Stopping) -> Self {
        self.converged = self.exact || stopping.converged(&self.stderr);
        self
    }
}

/// Most threads a call may ask for: the pool starts them all at once, and a count far beyond
/// the machine's (say a typo of 10^6) would spend minutes starting threads before failing.
pub const MAX_THREADS: usize = 1024;

/// Most players of a game: a coalition is a bit set of n / 64 words, and an estimator holds
/// thousands of them (2^20 players: 128 KiB a coalition).
pub const MAX_PLAYERS: usize = 1 << 20;

/// Runs `work` on a pool of `n_threads` threads (the global pool when None).
pub fn in_pool<T: Send>(n_threads: Option<usize>, work: impl FnOnce() -> T + Send) -> Result<T> {
    match n_threads {
        None => Ok(work()),
        Some(n) if !(1..=MAX_THREADS).contains(&n) => {
            Err(MasreplayError::InvalidArgument(format!("n_threads must be in 1..={MAX_THREADS}, got {n}")))
        }
        Some(n) => {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .map_err(|e| MasreplayError::InvalidArgument(format!("n_threads: {e}")))?;
            Ok(pool.install(work))
        }
    }
}

/// Shapley values of `game` with the estimator and stopping rule of `options`.
pub fn shapley(game: &dyn Game, options: &ShapleyOptions) -> Result<ShapleyResult> {
    let n = game.n_players();
    if n == 0 {
        return Err(MasreplayError::InvalidArgument("the game has no players".into()));
    }
    if n > MAX_PLAYERS {
        return Err(MasreplayError::InvalidArgument(format!("the game has {n} players, more than {MAX_PLAYERS}")));
    }
    if players::any(options) {
        return players::shapley_among_free(game, options);
    }
    match options.noise {
        Some(noise) => return noise::shapley_under_noise(game, options, noise),
        None if options.repeats.is_some() => {
            return Err(MasreplayError::InvalidArgument(
                "repeats: only a noisy game (noise=...) values a coalition twice".into(),
            ));
        }
        None => {}
    }
    if let Some(target) = options.target_stderr
        && !(target > 0.0 && target.is_finite())
    {
        return Err(MasreplayError::InvalidArgument(format!("target_stderr must be positive, got {target}")));
    }
    if options.budget == Some(0) {
        return Err(MasreplayError::InvalidArgument("budget must be at least 1".into()));
    }
    let budget = options.budget_or_default();
    let stopping = Stopping { budget, target_stderr: options.target_stderr, seed: options.seed, per_request: 1 };
    let forest = match &options.parents {
        Some(parents) if parents.len() != n => {
            return Err(MasreplayError::InvalidArgument(format!(
                "parents has {} entries for a game of {n} players",
                parents.len()
            )));
        }
        Some(parents) => Some(Forest::new(parents)?),
        None => None,
    };
    let hierarchy = options.unions.clone().map(|unions| Hierarchy::new(n, unions)).transpose()?;
    let method = match options.method {
        Method::Auto if forest.is_some() => Method::Precedence,
        Method::Auto if hierarchy.is_some() => Method::Owen,
        Method::Auto => unstructured_choice(n, budget),
        chosen => chosen,
    };
    let needs = |what: &str| MasreplayError::InvalidArgument(format!("method={:?} needs {what}", method.as_str()));
    if method == Method::Exact
        && let Some(cap) = options.budget
        && exact::coalitions_needed(n) > cap as f64
    {
        return Err(MasreplayError::InvalidArgument(format!(
            "budget: method='exact' values all 2^{n} coalitions, more than budget={cap}"
        )));
    }
    let mut extras = msr_extras(options.surrogate, n);
    extras.settle &= options.adaptive;
    in_pool(options.n_threads, || -> Result<ShapleyResult> {
        let estimate = match method {
            Method::Exact => exact::exact(game, &stopping)?,
            Method::Permutation => permutation_estimate(game, &stopping, options.antithetic)?,
            Method::Kernel => kernel::kernel(game, &stopping)?,
            Method::Census => census::census(game, &stopping)?,
            Method::Stratified => stratified::stratified(game, &stopping)?,
            Method::Msr => msr::msr(game, &stopping, extras)?,
            Method::Precedence => {
                let forest = forest.as_ref().ok_or_else(|| needs("parents"))?;
                match forest.downsets(budget.min(EXACT_STRUCTURE_LIMIT as u64) as usize) {
                    Some(downsets) => precedence::exact_precedence(game, forest, downsets, &stopping)?,
                    None => sampling::estimate_by_orderings(game, forest, &stopping)?,
                }
            }
            Method::Permission => {
                let forest = forest.as_ref().ok_or_else(|| needs("parents"))?;
                let restricted = RestrictedGame::new(game, forest);
                // The permission value is the Shapley value of the restricted game: every
                // unstructured estimator applies as it is.
                match unstructured_choice(n, budget) {
                    Method::Exact => exact::exact(&restricted, &stopping)?,
                    Method::Census => census::census(&restricted, &stopping)?,
                    // No step: on a restricted voting game (the calibration test's) it fits
                    // roughly, and the rare pairs it misclassifies leave the standard errors
                    // too small (coverage 0.78).
                    Method::Msr => {
                        msr::msr(&restricted, &stopping, msr::Extras { threshold: false, settle: false, ..extras })?
                    }
                    _ => permutation_estimate(&restricted, &stopping, options.antithetic)?,
                }
            }
            Method::Owen => {
                let hierarchy = hierarchy.as_ref().ok_or_else(|| needs("unions"))?;
                let cost = hierarchy.exact_cost();
                if cost <= budget as f64 && cost <= EXACT_STRUCTURE_LIMIT {
                    owen::exact_owen(game, hierarchy, &stopping)?
                } else {
                    sampling::estimate_by_orderings(game, hierarchy, &stopping)?
                }
            }
            Method::Auto => unreachable!("auto is resolved above"),
        };
        let (empty, full) = game::bounds(game)?;
        Ok(finish(estimate, full - empty, method, game))
    })?
}

/// Evaluations per player from which `auto` prefers regression-adjusted MSR to antithetic
/// permutations (see [`unstructured_choice`]).
const MSR_FROM_EVALUATIONS_PER_PLAYER: u64 = 30;

/// The share of all 2^n coalitions from which `auto` prefers near-complete enumeration
/// (census.rs) to MSR. KernelSHAP held this regime before (measured at n = 6-14, 20 seeds: at
/// 90-98% of 2^n 1.03-5.5x lower error than MSR on every family; at 80%, n = 12, MSR ahead);
/// the census, whose surrogate holds the interactions KernelSHAP's additive fit leaves out,
/// is 4-8x below KernelSHAP there (n = 10, 1,000 evaluations, the bench's families, 5 seeds:
/// full order 0.0033 -> 0.00053, voting 0.00073 -> 0.00009, low order and trace games exact to
/// rounding where KernelSHAP left 0.0021 and 0.00025). Not moved below 90%: at n = 12 and 61%
/// MSR's step was ahead on voting and trace games.
const CENSUS_FROM_SHARE_OF_COALITIONS: f64 = 0.9;

/// `auto` without structure, by rules measured on the benchmark families (SOUM of low and of
/// full order, weighted voting, additive + pairwise; n = 12-100, budgets 1,000-10,000, 3-5
/// seeds; benches/RESULTS.md): exact when the budget covers all 2^n coalitions; the census
/// from 90% of them ([`CENSUS_FROM_SHARE_OF_COALITIONS`]); else MSR from
/// 30 evaluations per player, where it came within 15% of the best estimator on low-order
/// games (ahead at n = 30), beat permutations 3x or more on full-order and voting games, beat
/// KernelSHAP at n = 14-16 on all but low order (a tie), and is exact on pairwise games like
/// antithetic permutations; else antithetic permutations, which at 10 evaluations per player
/// (n = 100, budget 1,000) won on low-order and pairwise games, where MSR's surrogate has too
/// few pairs to fit. On sparse low-order games (100 terms over n = 300 players) MSR with a
/// linear surrogate stays 1.5x behind permutations from 33 to 133 evaluations per player, but
/// with interaction features ([`INTERACTIONS_UP_TO_PLAYERS`]) it is 2.5x ahead at 33 per
/// player (benches/RESULTS.md, 2026-11-27), as on full-order and voting games (3x).
fn unstructured_choice(n: usize, budget: u64) -> Method {
    let share_of_all = if n <= MAX_EXACT_PLAYERS { budget as f64 / exact::coalitions_needed(n) } else { 0.0 };
    if share_of_all >= 1.0 {
        Method::Exact
    } else if share_of_all >= CENSUS_FROM_SHARE_OF_COALITIONS {
        Method::Census
    } else if budget >= MSR_FROM_EVALUATIONS_PER_PLAYER.saturating_mul(n as u64) {
        Method::Msr
    } else {
        Method::Permutation
    }
}

/// Players up to which `surrogate="auto"` gives MSR's surrogate interaction features
/// (measured on the benchmark families at n = 30-300, 10,000 evaluations, 5 seeds: MAE on
/// sparse low-order SOUM 0.0083 -> 0.0013 (n = 30), 0.0108 -> 0.0020 (100), 0.0122 -> 0.0029
/// (300); trace games 0.0061 -> 0.0002, 0.0145 -> 0.0017, 0.0286 -> 0.0086; full-order,
/// voting and pairwise games unchanged (nothing passes the screening, or what does fits
/// little); at 1,000 evaluations trace games at n = 30 0.0243 -> 0.0158, the rest as
/// before). Beyond it the screening's pair statistics
/// (n^2 per fold, s^2 / 2 per coalition) cost more than the fits, unmeasured: ask for
/// `interactions` by name.
const INTERACTIONS_UP_TO_PLAYERS: usize = 300;

/// What MSR's surrogate holds beside its linear part: interaction features (see
/// [`INTERACTIONS_UP_TO_PLAYERS`]) and, for `auto`, a step or staircase when the game's
/// evaluations take two values only (threshold.rs): a step where one separates the training
/// coalitions, else a staircase (the share of high values at each integer weighted sum). Each
/// fold keeps it only where one fitted without one of its training folds, with the linear part
/// refitted to what it leaves, leaves that held-out fold less than the linear part alone. A
/// staircase is right on average where a step errs, so its residuals are not the rare large
/// misses that left a nearly right step's intervals under-covering (a voting game with real
/// weights, n = 14, 3,000 evaluations, 200 seeds: coverage 0.932 with such steps kept; 0.942
/// with staircases, which halve the error there). On the bench's weighted voting games at
/// 10,000 evaluations (5 seeds, MAE before projection): n = 30 0.00191 -> 0.00021 (two seeds
/// exact), n = 100 0.00196 -> 0.00157, n = 300 unchanged (no fold keeps one). CPU per run
/// (median of 3 passes, load 2-4): 0.81 s at n = 30, 1.96 s at n = 100 (a kept staircase is
/// fitted again on all training folds: twice the step's 0.98 s), 1.76 s at n = 300 (2.28 s
/// with the step's grids up to 64); two-valued games only. On those games `auto`'s MSR also
/// spends fewer draws on the sizes a pilot finds settled (msr.rs, `settled_sizes`).
fn msr_extras(surrogate: MsrSurrogate, n: usize) -> msr::Extras {
    match surrogate {
        MsrSurrogate::Auto => {
            msr::Extras { interactions: n <= INTERACTIONS_UP_TO_PLAYERS, threshold: true, settle: true }
        }
        MsrSurrogate::Linear => msr::Extras { interactions: false, threshold: false, settle: false },
        MsrSurrogate::Interactions => msr::Extras { interactions: true, threshold: false, settle: false },
    }
}

fn permutation_estimate(game: &dyn Game, stopping: &Stopping, antithetic: bool) -> Result<Estimate> {
    let sampler = permutation::UniformOrderings { n_players: game.n_players(), antithetic };
    sampling::estimate_by_orderings(game, &sampler, stopping)
}

/// Projects onto sum = v(N) - v(empty), recording the gap it closed (rounding-sized for the
/// estimators efficient by construction; stratified's is an estimation error), and fills in
/// what the caller sees.
fn finish(estimate: Estimate, total: f64, method: Method, game: &dyn Game) -> ShapleyResult {
    let mut values = estimate.values;
    let efficiency_gap = total - values.iter().sum::<f64>();
    let share = efficiency_gap / values.len() as f64;
    values.iter_mut().for_each(|v| *v += share);
    ShapleyResult {
        efficiency_gap,
        values,
        stderr: estimate.stderr,
        evaluations: game.evaluations().unwrap_or(estimate.evaluations),
        converged: estimate.converged,
        method,
        exact: estimate.exact,
        noise: None,
    }
}
