//! Interaction features for MSR's surrogate (see msr.rs): what a linear surrogate cannot
//! absorb in a sparse game is the odd part of its terms of three or more players. A
//! complementary pair's half difference y(S) = (v(S) - v(N - S)) / 2 of a unanimity term on
//! T = {i, j, k} is, in the players' signs x_p = +1 (in S) / -1 (out),
//! (x_i + x_j + x_k + x_i x_j x_k) / 8: linear, plus the odd character chi_T = x_i x_j x_k.
//! A term of four players adds the characters of its four triples, and so on.
//!
//! The features are those characters. Their MSR means are exact: E_s[chi_T a_i] depends only
//! on whether i is in T (the law of |T & S| is hypergeometric), so a feature adds a known
//! closed-form term, and the estimate keeps MSR's promises (unbiased when fitted without the
//! pairs it adjusts; values summing to v(N) - v(empty), as the terms sum to zero over the
//! players). They are fitted jointly with the linear part, by turns: the features'
//! coefficients on what the linear part leaves (coordinate descent), then the linear part on
//! what the features leave. A joint fit matters: chi_T's projection on the memberships at size
//! s is a + b(s) t, t = |T & S|, with b(s) curved in s, which slopes that are constant (n = 300)
//! or piecewise linear in s cannot follow; features fitted on the linear part's residuals
//! alone (the per-size orthogonal phi_T below, before 2026-11-27) left that part over, about a
//! third of the linear surrogate's residual on a sparse low-order game at n = 300 with every
//! true triple found.
//!
//! Which triples: screened on the residuals of the linear surrogate (the training folds
//! only), with the per-size orthogonal feature phi_T(S) = psi_s(t): chi_T less its
//! least-squares fit by a + b t under the uniform law of the coalitions of size s. A pair of
//! players {i, j} in a term with a third shows where both are in S (t = 2, where psi_s is far
//! from its fit): its statistic is the residuals' mean over the coalitions holding both,
//! weighted by psi_s(2) over the residuals' variance at size s, as a z score. The strongest
//! pairs past [`PAIR_Z`], at most n, are edges; each edge with every third player is a
//! candidate triple (a true triple needs one of its three pairs among the edges, where two
//! meeting at a player found half of a sparse game's triples at n = 300), scored by its own
//! feature's z score over all the training coalitions and kept past the largest z of as many
//! null candidates (sqrt(2 ln candidates)). The screening runs again on what the kept
//! features leave, three rounds in all.
//!
//! Hubs: in an orchestration game one player (the orchestrator) is in nearly every term, so
//! nearly every triple holds it, and the pair edges cannot point at them all (a trace game at
//! n = 300 has some 170 triples around its orchestrator; the edges found a third of their
//! weight). A player in a large share of the screened triples is a hub, and every triple
//! holding it is scored at once from one table of pair sums ([`hub_triples`]), in greedy
//! rounds: the strongest few past the null bar join the model, a turn of the joint fit
//! follows, and the next round screens what is left (characters sharing two players are
//! strongly correlated in the small coalitions, so taking all past the bar at once keeps
//! false ones: a numpy check at n = 300 kept 67, 29 of them true; rounds of 20 kept 95, 93
//! true).

use super::coalition::{Coalitions, contains, for_each_member, members_of};
use super::linalg::{dot, sub_scaled_then_dot, sum_start};
use super::signs::Signs;

/// Residual sums of squares below this share of the values' leave nothing worth a feature (a
/// pairwise game: what is left is the linear fit's ridge and rounding).
const NEGLIGIBLE: f64 = 1e-12;
/// Rounds of screening.
const ROUNDS: usize = 3;
/// Turns of the joint fit of the features and the linear part (trace games at n = 100, 10,000
/// evaluations, 5 seeds: MAE 0.00530 after 4 turns, 0.00487 after 6, 0.00454 after 8).
const TURNS: usize = 8;
/// A turn that moves no coefficient by more than this share of the largest ends the joint fit
/// (n = 100, 10,000 evaluations, 5 seeds: the same MAE to 1% on low-order and trace games as
/// all eight turns; 0.1 left trace games 22% more error).
const SETTLED: f64 = 0.01;
/// Edges of the screening: pairs whose z score is past this, the strongest n of them (n
/// players). At n = 100 and 300, 10,000 evaluations, 5 seeds: n / 2 edges left 17-24% more
/// error on low-order games, 2n edges 1-15% less for 15-35% more CPU; the bar (2.0, 1.0 or
/// none, with 2n edges) moved the error by under 1%.
const PAIR_Z: f64 = 2.0;
/// Training coalitions per kept feature, at least.
const COALITIONS_PER_FEATURE: usize = 10;
/// Most training coalitions screened and fitted on.
const MAX_SAMPLES: usize = 16_384;
/// Most features kept (the fit costs features x coalitions a pass; the bench families' sparse
/// games hold at most a few hundred triples).
const MAX_FEATURES: usize = 256;
/// Most passes of coordinate descent over the kept features in a turn of the joint fit, and
/// the step (relative to the largest coefficient) below which a pass ends it.
const MAX_PASSES: usize = 5;
const CONVERGED: f64 = 1e-9;
/// A hub is a player in at least this share of the screened triples, and in at least
/// [`HUB_MIN`] of them (bench families, kept triples per fold: the orchestrator of a trace
/// game is in 48-80%; the most frequent player of a random SOUM or voting game in at most
/// 39%, or in fewer than 8).
const HUB_SHARE: f64 = 0.45;
const HUB_MIN: usize = 12;
/// Most hubs, rounds of a hub's screening, and triples kept in a round (trace games at
/// n = 300, 10,000 evaluations, 5 seeds: MAE 0.0103 after 6 rounds, 0.0093 after 10 to 24,
/// where nothing more passes the bar; 10 or 40 a round instead of 20: 0.0095, 0.0102).
const MAX_HUBS: usize = 2;
const HUB_ROUNDS: usize = 12;
const HUB_KEEP: usize = 20;

/// The law of t = |T & S| for a triple T and a uniform coalition S of size s among n players
/// (hypergeometric): P(t) = C(3, t) s^(t) (n - s)^(3 - t) / n^(3), x^(k) the falling power.
fn triple_law(n: usize, s: usize) -> [f64; 4] {
    [0, 1, 2, 3].map(|t| hypergeometric(3, n, s, t))
}

/// The chance that `t` of `order` given players are among `s` drawn uniformly from `n`:
/// C(order, t) s^(t) (n - s)^(order - t) / n^(order), x^(k) the falling power.
fn hypergeometric(order: usize, n: usize, s: usize, t: usize) -> f64 {
    let falling = |a: usize, k: usize| (0..k).map(|i| a as f64 - i as f64).product::<f64>();
    let choose = falling(order, t) / falling(t, t);
    choose * falling(s, t) * falling(n - s, order - t) / falling(n, order)
}

/// psi_s(t) for t = 0..=3 at every size s (index s), for triples among `n` players: chi(t) =
/// (-1)^(3 - t) less its least-squares line in t under the law of t ([`triple_law`]).
fn psi_tables(n: usize) -> Vec<[f64; 4]> {
    (0..=n)
        .map(|s| {
            let p = triple_law(n, s);
            let chi = [-1.0, 1.0, -1.0, 1.0];
            let mean_t: f64 = (0..4).map(|t| p[t] * t as f64).sum();
            let mean_chi: f64 = (0..4).map(|t| p[t] * chi[t]).sum();
            let var_t: f64 = (0..4).map(|t| p[t] * (t as f64 - mean_t).powi(2)).sum();
            let cov: f64 = (0..4).map(|t| p[t] * (t as f64 - mean_t) * (chi[t] - mean_chi)).sum();
            let slope = if var_t > 0.0 { cov / var_t } else { 0.0 };
            let mut psi = [0.0; 4];
            (0..4).for_each(|t| psi[t] = chi[t] - mean_chi - slope * (t as f64 - mean_t));
            psi
        })
        .collect()
}

/// A function f of t = |T & S| for a triple T in the basis of the binomials C(t, k), k = 0..=3
/// (the numbers of T's members, pairs and triples inside S): f(t) = sum_k c_k C(t, k). A sum of
/// f over coalitions then splits into sums over the coalitions holding a player, a pair and
/// the whole triple, and the first two are shared by every triple.
fn binomial_basis(f: [f64; 4]) -> [f64; 4] {
    let c1 = f[1] - f[0];
    let c2 = f[2] - f[0] - 2.0 * c1;
    let c3 = f[3] - f[0] - 3.0 * c1 - 3.0 * c2;
    [f[0], c1, c2, c3]
}

/// The coalitions of one size: `sets[j]`, its value `values[j]` (the pair's half
/// difference) and the residual `residuals[j]` of the linear surrogate (read at the training
/// coalitions only).
pub(super) struct Stratum<'a> {
    pub size: usize,
    pub sets: &'a Coalitions,
    pub values: &'a [f64],
    pub residuals: Vec<f64>,
    /// Weight of a coalition of this size in the fit (msr's `fit_weight`).
    pub weight: f64,
}

/// The training coalitions (samples) of a fit, with each player's membership as a column of
/// bits (a bit per sample): a triple's counts t = |T & S| are then three columns read in
/// order, and the samples holding a whole triple the AND of three columns.
struct Training<'a> {
    n: usize,
    sets: Vec<&'a [u64]>,
    /// Per sample its stratum and its place there.
    origin: Vec<(usize, usize)>,
    sizes: Vec<usize>,
    weights: Vec<f64>,
    /// The linear surrogate's residuals.
    linear: Vec<f64>,
    /// The values' sum of squares.
    scale: f64,
    words: usize,
    columns: Vec<u64>,
    /// Whether every training coalition is a sample (no stride).
    every: bool,
}

impl<'a> Training<'a> {
    /// The coalitions `train` keeps, every stride-th of them at large budgets (the screening
    /// and the fit cost a pass over them per candidate and per feature).
    fn new(n: usize, strata: &'a [Stratum], train: impl Fn(usize) -> bool) -> Self {
        let training: usize = strata.iter().map(|st| (0..st.sets.len()).filter(|&j| train(j)).count()).sum();
        let stride = training.div_ceil(MAX_SAMPLES).max(1);
        let mut samples = Training {
            n,
            sets: Vec::new(),
            origin: Vec::new(),
            sizes: Vec::new(),
            weights: Vec::new(),
            linear: Vec::new(),
            scale: 0.0,
            words: 0,
            columns: Vec::new(),
            every: stride == 1,
        };
        let mut seen = 0;
        for (k, st) in strata.iter().enumerate() {
            for (j, (set, (&r, &v))) in st.sets.iter().zip(st.residuals.iter().zip(st.values)).enumerate() {
                if train(j) {
                    if seen % stride == 0 {
                        samples.sets.push(set);
                        samples.origin.push((k, j));
                        samples.sizes.push(st.size);
                        samples.weights.push(st.weight);
                        samples.linear.push(r);
                        samples.scale += v * v;
                    }
                    seen += 1;
                }
            }
        }
        samples.words = samples.sets.len().div_ceil(64);
        samples.columns = vec![0; n * samples.words];
        let mut members = Vec::with_capacity(n);
        for (j, set) in samples.sets.iter().enumerate() {
            members_of(set, &mut members);
            members.iter().for_each(|&p| samples.columns[p * samples.words + j / 64] |= 1 << (j % 64));
        }
        samples
    }

    fn len(&self) -> usize {
        self.sets.len()
    }

    fn column(&self, player: usize) -> &[u64] {
        &self.columns[player * self.words..(player + 1) * self.words]
    }

    /// The linear part's residuals refitted (per stratum, every coalition), at the samples.
    fn set_linear(&mut self, residuals: &[Vec<f64>]) {
        self.linear = self.origin.iter().map(|&(k, j)| residuals[k][j]).collect();
    }

    /// The features' part of `model` at every training coalition, per stratum (zero at the
    /// others): read from the features at the samples when every training coalition is one
    /// ([`Model::part`]), else from the coalitions.
    fn part_at_coalitions(
        &self,
        model: &Model<Signs>,
        strata: &[Stratum],
        train: impl Fn(usize) -> bool,
    ) -> Vec<Vec<f64>> {
        let mut part: Vec<Vec<f64>> = strata.iter().map(|st| vec![0.0; st.sets.len()]).collect();
        if self.every {
            self.origin.iter().zip(model.part(self.len())).for_each(|(&(k, j), value)| part[k][j] = value);
        } else {
            let features = model.interactions();
            for (part, st) in part.iter_mut().zip(strata) {
                let training = st.sets.iter().enumerate().filter(|&(j, _)| train(j));
                training.for_each(|(j, set)| part[j] = features.value(set));
            }
        }
        part
    }

    /// chi_T at every sample, as sign bits: chi_T = -1 where an even number of T's members
    /// are in the sample, where the XOR of their columns is clear.
    fn signs(&self, triple: &[usize; 3]) -> Signs {
        let [a, b, c] = triple.map(|p| self.column(p));
        Signs::from_words(a.iter().zip(b).zip(c).map(|((a, b), c)| !(a ^ b ^ c)))
    }

    /// phi_T at every sample: psi of its size at t = |T & S|.
    fn feature(&self, triple: &[usize; 3], psi: &[[f64; 4]]) -> Dense {
        let [a, b, c] = triple.map(|p| self.column(p));
        let values = (0..self.len())
            .map(|j| {
                let (w, bit) = (j / 64, j % 64);
                let t = (a[w] >> bit & 1) + (b[w] >> bit & 1) + (c[w] >> bit & 1);
                psi[self.sizes[j]][t as usize]
            })
            .collect();
        Dense::new(values, &self.weights)
    }
}

/// A round's screening statistics of the residuals r, each coalition weighted by one over its
/// size's residual variance (u = r / variance): per pair of players the sums over the
/// coalitions holding both that make its edge score, and for every triple's score the parts of
/// sum psi_s(t) u and sum (psi_s(t) u)^2 in the binomial basis ([`binomial_basis`]) that are
/// shared between triples (all coalitions, per player, per pair); the part over the coalitions
/// holding the whole triple is summed per triple from `whole`.
struct Screen {
    n: usize,
    /// Per sample: the C(t, 3) coefficients times u and times u^2.
    whole: Vec<[f64; 2]>,
    all: [f64; 2],
    single: Vec<[f64; 2]>,
    /// Per pair (i, j), i < j, at [`pair_at`]: the edge's sum and sum of squares (of psi_s(2) u),
    /// then the C(t, 2) coefficients times u and times u^2.
    pair: Vec<[f64; 4]>,
}

impl Screen {
    /// The statistics of `residuals`, the pairs' sums for the pairs holding a player `around`
    /// marks only (those that extensions of the edges between such players read), or for every
    /// pair.
    fn new(
        training: &Training,
        residuals: &[f64],
        psi: &[[f64; 4]],
        bases: &[[[f64; 4]; 2]],
        around: Option<&[bool]>,
    ) -> Self {
        let n = training.n;
        let spread = spreads(n, &training.sizes, residuals);
        let mut screen =
            Screen { n, whole: Vec::new(), all: [0.0; 2], single: vec![[0.0; 2]; n], pair: vec![[0.0; 4]; pairs(n)] };
        let (mut members, mut marked) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for ((&set, &s), &r) in training.sets.iter().zip(&training.sizes).zip(residuals) {
            let variance = spread[s];
            let u = if variance > 0.0 { r / variance } else { 0.0 };
            let ([c, d], u2) = (bases[s], u * u);
            screen.whole.push([c[3] * u, d[3] * u2]);
            if u == 0.0 {
                continue;
            }
            screen.all[0] += c[0] * u;
            screen.all[1] += d[0] * u2;
            let edge = psi[s][2] * u;
            let at_pair = [edge, edge * edge, c[2] * u, d[2] * u2];
            members_of(set, &mut members);
            for &p in &members {
                screen.single[p][0] += c[1] * u;
                screen.single[p][1] += d[1] * u2;
            }
            if let Some(around) = around {
                marked.clear();
                marked.extend(members.iter().filter(|&&p| around[p]));
            }
            add_to_pairs(&mut screen.pair, n, &members, around.map(|around| (around, &marked[..])), at_pair);
        }
        screen
    }

    /// Pairs {i < j} whose edge z score is past [`PAIR_Z`], with that score: the strongest n
    /// (one per player).
    fn edges(&self) -> Vec<(f64, usize, usize)> {
        let n = self.n;
        let mut edges = Vec::new();
        for i in 0..n {
            for j in i + 1..n {
                let [sum, square, ..] = self.pair[pair_at(n, i, j)];
                if square > 0.0 {
                    let z = sum.abs() / square.sqrt();
                    if z > PAIR_Z {
                        edges.push((z, i, j));
                    }
                }
            }
        }
        edges.sort_by(|a, b| b.0.total_cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
        edges.truncate(n);
        edges
    }

    /// Candidate triples with their z scores ([`Screen::z_of`]): each of `edges` (distinct
    /// pairs) with every third player, in no particular order. The part over the coalitions
    /// holding a whole triple is summed for every third player at once, from the coalitions
    /// holding the edge.
    fn extensions(&self, training: &Training, edges: &[(f64, usize, usize)]) -> Vec<(f64, [usize; 3])> {
        let n = self.n;
        // A triple reached from two or three of its edges has the same score each time: it is
        // scored from the first of them (`rank`: an edge's place in `edges`, from 1; 0 for a
        // pair that is none).
        let mut rank = vec![0; pairs(n)];
        edges.iter().enumerate().for_each(|(place, &(_, i, j))| rank[pair_at(n, i.min(j), i.max(j))] = place + 1);
        let earlier = |place: usize, a: usize, b: usize| (1..=place).contains(&rank[pair_at(n, a.min(b), a.max(b))]);
        let mut whole = vec![[0.0; 2]; n];
        let mut scored = Vec::with_capacity(edges.len() * n);
        for (place, &(_, i, j)) in edges.iter().enumerate() {
            whole.fill([0.0; 2]);
            for (w, (a, b)) in training.column(i).iter().zip(training.column(j)).enumerate() {
                let mut bits = a & b;
                while bits != 0 {
                    let sample = w * 64 + bits.trailing_zeros() as usize;
                    let [sum, square] = self.whole[sample];
                    for_each_member(training.sets[sample], |k| {
                        whole[k][0] += sum;
                        whole[k][1] += square;
                    });
                    bits &= bits - 1;
                }
            }
            for (k, &part) in whole.iter().enumerate() {
                if k != i && k != j && !earlier(place, i, k) && !earlier(place, j, k) {
                    let mut triple = [i, j, k];
                    triple.sort_unstable();
                    scored.push((self.z_of(&triple, part), triple));
                }
            }
        }
        scored
    }

    /// The z score of a triple's feature against the residuals, sum psi_s(t) u over the root
    /// of sum (psi_s(t) u)^2, given the part of those sums over the coalitions holding it whole.
    fn z_of(&self, triple: &[usize; 3], whole: [f64; 2]) -> f64 {
        let n = self.n;
        let [i, j, k] = *triple;
        let mut total = self.all;
        for part in [self.single[i], self.single[j], self.single[k], whole] {
            total[0] += part[0];
            total[1] += part[1];
        }
        for part in [self.pair[pair_at(n, i, j)], self.pair[pair_at(n, i, k)], self.pair[pair_at(n, j, k)]] {
            total[0] += part[2];
            total[1] += part[3];
        }
        if total[1] > 0.0 { total[0].abs() / total[1].sqrt() } else { 0.0 }
    }
}

/// Places in a table of the pairs {i < j} of `n` players, row by row (and the unused (i, i)):
/// half of an n x n table, which stays in a core's cache at n = 300 where the full one of the
/// screening's four sums does not.
fn pairs(n: usize) -> usize {
    n * (n + 1) / 2
}

/// The place of pair (i, j), i <= j, in a table of [`pairs`]: the rows of n - i places (j from
/// i) one after another, so that the pairs (i, j) are a slice indexed by j as in an n x n table.
fn pair_at(n: usize, i: usize, j: usize) -> usize {
    i * n - i * (i + 1) / 2 + j
}

/// The players a screening sums the pairs around, and those of them among a coalition's
/// members (increasing).
type Around<'a> = Option<(&'a [bool], &'a [usize])>;

/// Adds `at_pair` to every pair of `members` (increasing) in the table `pair` ([`pair_at`]), or
/// to those holding a player `around` marks: the screening's inner loop, a 256-bit add per
/// pair where the processor has AVX2 (element by element: the same bits either way).
fn add_to_pairs(pair: &mut [[f64; 4]], n: usize, members: &[usize], around: Around, at_pair: [f64; 4]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the processor has AVX2, checked just above.
        return unsafe { add_to_pairs_avx2(pair, n, members, around, at_pair) };
    }
    add_to_pairs_lanes(pair, n, members, around, at_pair)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn add_to_pairs_avx2(pair: &mut [[f64; 4]], n: usize, members: &[usize], around: Around, at_pair: [f64; 4]) {
    add_to_pairs_lanes(pair, n, members, around, at_pair)
}

#[inline(always)]
fn add_to_pairs_lanes(pair: &mut [[f64; 4]], n: usize, members: &[usize], around: Around, at_pair: [f64; 4]) {
    for (k, &p) in members.iter().enumerate() {
        let row = &mut pair[pair_at(n, p, 0)..pair_at(n, p, n)];
        // A pair (p, q), p < q, holds a marked player where p is one or q is.
        let others = match around {
            Some((is_marked, marked)) if !is_marked[p] => &marked[marked.partition_point(|&q| q < p)..],
            _ => &members[k + 1..],
        };
        for &q in others {
            let cell = &mut row[q];
            (0..4).for_each(|m| cell[m] += at_pair[m]);
        }
    }
}

/// sum over kept triples T of coef_T chi_T(S); none kept: zero.
pub(super) struct Interactions {
    triples: Vec<[usize; 3]>,
    coef: Vec<f64>,
}

impl Interactions {
    pub fn none() -> Self {
        Interactions { triples: Vec::new(), coef: Vec::new() }
    }

    /// The features' part of the surrogate at coalition `set`.
    pub fn value(&self, set: &[u64]) -> f64 {
        self.triples.iter().zip(&self.coef).map(|(triple, c)| c * parity(triple, set)).sum()
    }

    /// E_s[g a_i] of the features' part g for every player, added to `terms` times `scale`.
    /// For a triple T, E_s[chi_T a_i] = (E[chi_T | i in S] - E[chi_T | i out]) / n: the
    /// same for the three members and the same for everyone else, and those sum to zero.
    pub fn add_terms(&self, n: usize, s: usize, scale: f64, terms: &mut [f64]) {
        if self.triples.is_empty() {
            return;
        }
        let (member, other) = parity_means(n, s);
        let total: f64 = self.coef.iter().sum();
        terms.iter_mut().for_each(|t| *t += scale * other * total);
        for (triple, c) in self.triples.iter().zip(&self.coef) {
            triple.iter().for_each(|&p| terms[p] += scale * (member - other) * c);
        }
    }

    /// Screens triples on `strata`'s residuals over the coalitions `train` keeps (the other
    /// folds'), in rounds (each on the residuals the features kept so far leave), then fits
    /// their characters chi_T jointly with the linear part: by turns, the features on what the
    /// linear part leaves and the linear part on what the features leave (`refit`, given the
    /// features' part at every training coalition, per stratum: the linear part's residuals
    /// there, per stratum, once that part is taken out of the values).
    pub fn fit(
        n: usize,
        strata: &[Stratum],
        train: impl Fn(usize) -> bool + Copy,
        mut refit: impl FnMut(&[Vec<f64>]) -> Vec<Vec<f64>>,
    ) -> Self {
        if n < 4 {
            return Self::none();
        }
        let mut training = Training::new(n, strata, train);
        let triples = screened(&training);
        if triples.is_empty() {
            return Self::none();
        }
        let mut model = Model::new();
        let hubs = hubs_of(&triples);
        triples.into_iter().for_each(|triple| model.add(triple, training.signs(&triple), &training));
        let most = (training.len() / COALITIONS_PER_FEATURE).min(MAX_FEATURES);
        // The linear part refitted to what the model's features leave.
        let mut refit_linear = |model: &Model<Signs>, training: &mut Training| {
            let part = training.part_at_coalitions(model, strata, train);
            training.set_linear(&refit(&part));
        };
        for &hub in &hubs {
            grow(&mut model, &mut training, &mut refit_linear, most, |training, left, known| {
                hub_triples(training, hub, left, known)
            });
        }
        if !hubs.is_empty() {
            grow(&mut model, &mut training, &mut refit_linear, most, |training, left, known| {
                below_hubs(training, left, known, &hubs)
            });
        }
        let mut fitted = Interactions::none();
        for _ in 0..TURNS {
            model.fit(&training);
            let before = fitted.coef.iter().chain(std::iter::repeat(&0.0));
            let moved = model.coef.iter().zip(before).fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
            let largest = model.coef.iter().fold(0.0f64, |m, c| m.max(c.abs()));
            fitted = model.interactions();
            refit_linear(&model, &mut training);
            if moved <= SETTLED * largest {
                break;
            }
        }
        fitted
    }
}

/// Greedy rounds of a screening: what `find` scores past its bar on the residuals the model
/// leaves joins it (within `most` features), then a turn of the joint fit, so that the next
/// round screens what both parts leave; until nothing passes or [`HUB_ROUNDS`].
fn grow(
    model: &mut Model<Signs>,
    training: &mut Training,
    refit: &mut impl FnMut(&Model<Signs>, &mut Training),
    most: usize,
    mut find: impl FnMut(&Training, &[f64], &[[usize; 3]]) -> Vec<[usize; 3]>,
) {
    for _ in 0..HUB_ROUNDS {
        let left = model.fit(training);
        let found = find(training, &left, &model.triples);
        let room = most.saturating_sub(model.triples.len());
        if found.is_empty() || room == 0 {
            break;
        }
        found.into_iter().take(room).for_each(|triple| model.add(triple, training.signs(&triple), training));
        model.fit(training);
        refit(model, training);
    }
}

/// Triples without a hub below the hub triples found: in a chain h -> a -> b -> c the triple
/// {a, b, c} holds a pair of the hub triple {h, a, b}. Each such pair with every third player
/// is a candidate, scored as the screening scores an edge's ([`Screen::extensions`]); the
/// strongest [`HUB_KEEP`] past the bar of as many null candidates, strongest first.
fn below_hubs(training: &Training, left: &[f64], known: &[[usize; 3]], hubs: &[usize]) -> Vec<[usize; 3]> {
    let mut edges: Vec<(f64, usize, usize)> = known
        .iter()
        .filter_map(|t| {
            // The triples holding one hub: their two other players.
            let mut rest = t.iter().filter(|p| !hubs.contains(p));
            let (a, b) = (*rest.next()?, *rest.next()?);
            rest.next().is_none().then_some((0.0, a, b))
        })
        .collect();
    edges.sort_by_key(|&(_, a, b)| (a, b));
    edges.dedup_by_key(|&mut (_, a, b)| (a, b));
    if edges.is_empty() {
        return Vec::new();
    }
    let (psi, bases) = screening_tables(training.n);
    let mut ends = vec![false; training.n];
    edges.iter().for_each(|&(_, a, b)| (ends[a], ends[b]) = (true, true));
    let screen = Screen::new(training, left, &psi, &bases, Some(&ends));
    let candidates = screen.extensions(training, &edges);
    let threshold = (2.0 * (candidates.len().max(2) as f64).ln()).sqrt();
    let mut kept: Vec<(f64, [usize; 3])> = candidates
        .into_iter()
        .filter(|(z, t)| *z > threshold && !t.iter().any(|p| hubs.contains(p)) && !known.contains(t))
        .collect();
    kept.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    kept.into_iter().take(HUB_KEEP).map(|(_, triple)| triple).collect()
}

/// The hubs among the screened triples: players in at least [`HUB_SHARE`] of them and in at
/// least [`HUB_MIN`], the most frequent first, at most [`MAX_HUBS`].
fn hubs_of(triples: &[[usize; 3]]) -> Vec<usize> {
    let players = triples.iter().flatten().max().map_or(0, |p| p + 1);
    let mut per_player = vec![0usize; players];
    triples.iter().flatten().for_each(|&p| per_player[p] += 1);
    let least = HUB_MIN.max((HUB_SHARE * triples.len() as f64).ceil() as usize);
    let mut counts: Vec<(usize, usize)> =
        per_player.into_iter().enumerate().filter(|&(_, count)| count >= least).collect();
    counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    counts.into_iter().take(MAX_HUBS).map(|(p, _)| p).collect()
}

/// Every triple {hub, a, b} scored at once against the residuals `left`: the weighted sum
/// sum w r chi over its root sum of squares, sum w^2 r^2 (chi^2 = 1, the same for every
/// triple), where chi = x_hub x_a x_b = x_hub (4 [a, b in S] - 2 [a in S] - 2 [b in S] + 1),
/// so one table of sums over the pairs inside each coalition serves all of them. Returns
/// the strongest [`HUB_KEEP`] not in `known` past the largest score of as many null
/// candidates (sqrt(2 ln candidates)), strongest first.
fn hub_triples(training: &Training, hub: usize, left: &[f64], known: &[[usize; 3]]) -> Vec<[usize; 3]> {
    let n = training.n;
    let (mut pairs, mut singles, mut whole, mut squares) = (vec![0.0; pairs(n)], vec![0.0; n], 0.0, 0.0);
    let mut members = Vec::with_capacity(n);
    for ((set, &r), &weight) in training.sets.iter().zip(left).zip(&training.weights) {
        let u = weight * r * if contains(set, hub) { 1.0 } else { -1.0 };
        whole += u;
        squares += u * u;
        members_of(set, &mut members);
        for (k, &a) in members.iter().enumerate() {
            singles[a] += u;
            let row = &mut pairs[pair_at(n, a, 0)..pair_at(n, a, n)];
            members[k + 1..].iter().for_each(|&b| row[b] += u);
        }
    }
    if squares <= 0.0 {
        return Vec::new();
    }
    let others = (n - 1) * (n - 2) / 2;
    let threshold = (2.0 * (others.max(2) as f64).ln()).sqrt() * squares.sqrt();
    let mut scored = Vec::new();
    for a in (0..n).filter(|&a| a != hub) {
        for b in (a + 1..n).filter(|&b| b != hub) {
            let sum = whole - 2.0 * (singles[a] + singles[b]) + 4.0 * pairs[pair_at(n, a, b)];
            let mut triple = [hub, a, b];
            triple.sort_unstable();
            if sum.abs() > threshold && !known.contains(&triple) {
                scored.push((sum.abs(), triple));
            }
        }
    }
    scored.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
    scored.into_iter().take(HUB_KEEP).map(|(_, triple)| triple).collect()
}

/// psi_s per size and the binomial bases of psi_s and psi_s^2 (see [`Screen`]).
fn screening_tables(n: usize) -> (Vec<[f64; 4]>, Vec<[[f64; 4]; 2]>) {
    let psi = psi_tables(n);
    let bases = psi.iter().map(|psi| [binomial_basis(*psi), binomial_basis(psi.map(|x| x * x))]).collect();
    (psi, bases)
}

/// The triples screened on the training samples' linear residuals in rounds: each round's
/// z scores on what the features phi_T kept so far leave.
fn screened(training: &Training) -> Vec<[usize; 3]> {
    let n = training.n;
    let (psi, bases) = screening_tables(n);
    let mut model = Model::new();
    let mut residuals = training.linear.clone();
    for _ in 0..ROUNDS {
        // A game the linear surrogate fits to rounding (pairwise) leaves nothing to screen.
        let left: f64 = residuals.iter().map(|r| r * r).sum();
        if !(left > NEGLIGIBLE * training.scale && left.is_finite()) {
            break;
        }
        let screen = Screen::new(training, &residuals, &psi, &bases, None);
        let candidates = screen.extensions(training, &screen.edges());
        let threshold = (2.0 * (candidates.len().max(2) as f64).ln()).sqrt();
        let mut kept: Vec<(f64, [usize; 3])> =
            candidates.into_iter().filter(|(z, t)| *z > threshold && !model.triples.contains(t)).collect();
        kept.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        kept.truncate((training.len() / COALITIONS_PER_FEATURE).min(MAX_FEATURES).saturating_sub(model.triples.len()));
        if kept.is_empty() {
            break;
        }
        kept.into_iter().for_each(|(_, triple)| model.add(triple, training.feature(&triple, &psi), training));
        residuals = model.fit(training);
    }
    model.triples
}

/// chi_T(S) = x_i x_j x_k, x = +1 in S and -1 out: -1, 1, -1, 1 for 0-3 members inside
/// (the parity of T's bits in S, read branch free).
#[inline(always)]
fn parity(triple: &[usize; 3], set: &[u64]) -> f64 {
    let odd = triple.iter().fold(0, |odd, &p| odd ^ (set[p / 64] >> (p % 64) & 1));
    2.0 * odd as f64 - 1.0
}

/// E[x_a x_b] and E[x_a x_b x_c] for given players among `n` when `s` of them are drawn
/// uniformly (hypergeometric).
fn parity_mean(order: usize, n: usize, s: usize) -> f64 {
    (0..=order)
        .map(|t| {
            let p = hypergeometric(order, n, s, t);
            if (order - t).is_multiple_of(2) { p } else { -p }
        })
        .sum()
}

/// E_s[chi_T a_i] for a member i of T and for a player outside it (see
/// [`Interactions::add_terms`]): given i in S the others are drawn s - 1 among n - 1, given
/// i out s among n - 1, and chi_T is x_i times the other two's product.
fn parity_means(n: usize, s: usize) -> (f64, f64) {
    let nf = n as f64;
    let member = (parity_mean(2, n - 1, s - 1) + parity_mean(2, n - 1, s)) / nf;
    let other = (parity_mean(3, n - 1, s - 1) - parity_mean(3, n - 1, s)) / nf;
    (member, other)
}

/// A kept feature's values at the training samples, as the fit reads them: x, its weighted
/// copy w x and its weighted sum of squares, the products of the coordinate descent.
trait Feature {
    fn norm(&self, weights: &[f64]) -> f64;
    /// y += a x.
    fn add_scaled(&self, y: &mut [f64], a: f64);
    /// (w x) . y.
    fn weighted_dot(&self, weights: &[f64], y: &[f64]) -> f64;
    /// y -= a p (p = `previous`), then (w x) . y, in one pass over y.
    fn sub_scaled_then_dot(y: &mut [f64], a: f64, previous: &Self, this: &Self, weights: &[f64]) -> f64;
}

/// Any values (the screening's phi_T), with their weighted copy computed once, when kept.
struct Dense {
    values: Vec<f64>,
    weighted: Vec<f64>,
}

impl Dense {
    fn new(values: Vec<f64>, weights: &[f64]) -> Self {
        let weighted = values.iter().zip(weights).map(|(x, w)| w * x).collect();
        Dense { values, weighted }
    }
}

impl Feature for Dense {
    fn norm(&self, _: &[f64]) -> f64 {
        dot(&self.values, &self.weighted)
    }

    fn add_scaled(&self, y: &mut [f64], a: f64) {
        y.iter_mut().zip(&self.values).for_each(|(y, x)| *y += a * x);
    }

    fn weighted_dot(&self, _: &[f64], y: &[f64]) -> f64 {
        dot(&self.weighted, y)
    }

    fn sub_scaled_then_dot(y: &mut [f64], a: f64, previous: &Self, this: &Self, _: &[f64]) -> f64 {
        sub_scaled_then_dot(y, a, &previous.values, &this.weighted)
    }
}

/// The characters chi_T, +1 or -1, as sign bits (signs.rs: the same products bit for bit).
impl Feature for Signs {
    fn norm(&self, weights: &[f64]) -> f64 {
        Signs::norm(weights)
    }

    fn add_scaled(&self, y: &mut [f64], a: f64) {
        Signs::add_scaled(self, y, a)
    }

    fn weighted_dot(&self, weights: &[f64], y: &[f64]) -> f64 {
        Signs::weighted_dot(self, weights, y)
    }

    fn sub_scaled_then_dot(y: &mut [f64], a: f64, previous: &Self, this: &Self, weights: &[f64]) -> f64 {
        Signs::sub_scaled_then_dot(y, a, previous, this, weights)
    }
}

/// The kept features of a fit: their triples, their values at the training samples (each
/// computed once, when kept, with its weighted sum of squares, which every fit reads) and
/// coefficients (carried from round to round).
struct Model<F> {
    triples: Vec<[usize; 3]>,
    features: Vec<F>,
    norms: Vec<f64>,
    coef: Vec<f64>,
}

impl<F: Feature> Model<F> {
    fn new() -> Self {
        Model { triples: Vec::new(), features: Vec::new(), norms: Vec::new(), coef: Vec::new() }
    }

    fn interactions(&self) -> Interactions {
        Interactions { triples: self.triples.clone(), coef: self.coef.clone() }
    }

    fn add(&mut self, triple: [usize; 3], feature: F, training: &Training) {
        self.norms.push(feature.norm(&training.weights));
        self.triples.push(triple);
        self.features.push(feature);
        self.coef.push(0.0);
    }

    /// sum_T coef_T x_T at each of `len` samples, the features added in order from where
    /// `.sum()` starts: where the features are the characters, bit for bit
    /// [`Interactions::value`] at the samples.
    fn part(&self, len: usize) -> Vec<f64> {
        let mut part = vec![sum_start(); len];
        self.features.iter().zip(&self.coef).for_each(|(feature, &c)| feature.add_scaled(&mut part, c));
        part
    }

    /// Weighted least squares of the linear residuals on the features, by coordinate descent
    /// from the coefficients so far (features of triples sharing no two players are near
    /// orthogonal: a few passes converge; those sharing two take more). Returns the residuals
    /// the features leave.
    fn fit(&mut self, training: &Training) -> Vec<f64> {
        let weights = &training.weights;
        let mut left = training.linear.clone();
        // r - c x as r + (-c) x: the same bits (a difference is the sum with the negation).
        self.features.iter().zip(&self.coef).for_each(|(feature, &c)| feature.add_scaled(&mut left, -c));
        for _ in 0..MAX_PASSES {
            let mut largest_step: f64 = 0.0;
            // A feature's step is taken out of `left` in the pass over it that reads the next
            // feature's product (one pass instead of two).
            let mut pending: Option<(f64, &F)> = None;
            for ((c, feature), &norm) in self.coef.iter_mut().zip(&self.features).zip(&self.norms) {
                if norm <= 0.0 {
                    continue;
                }
                let product = match pending {
                    Some((step, previous)) => F::sub_scaled_then_dot(&mut left, step, previous, feature, weights),
                    None => feature.weighted_dot(weights, &left),
                };
                let step = product / norm;
                *c += step;
                largest_step = largest_step.max(step.abs());
                pending = Some((step, feature));
            }
            if let Some((step, previous)) = pending {
                previous.add_scaled(&mut left, -step);
            }
            if largest_step <= CONVERGED * self.coef.iter().fold(0.0, |m: f64, c| m.max(c.abs())) {
                break;
            }
        }
        left
    }
}

/// The residuals' mean square per size.
fn spreads(n: usize, sizes: &[usize], residuals: &[f64]) -> Vec<f64> {
    let (mut sums, mut counts) = (vec![0.0; n + 1], vec![0usize; n + 1]);
    for (&s, r) in sizes.iter().zip(residuals) {
        sums[s] += r * r;
        counts[s] += 1;
    }
    sums.iter().zip(&counts).map(|(s, &c)| if c > 0 { s / c as f64 } else { 0.0 }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shapley::coalition::size;
    use crate::shapley::kernel::random_subset;
    use crate::shapley::sampling::stream;

    /// `count` coalitions drawn uniformly at each of `sizes`, with the values of a residual made
    /// of the characters of `truth`'s triples.
    fn characters_sample(
        n: usize,
        truth: &[([usize; 3], f64)],
        sizes: std::ops::RangeInclusive<usize>,
        count: usize,
        seed: u64,
    ) -> (Vec<Coalitions>, Vec<Vec<f64>>) {
        let mut rng = stream(seed, 0);
        let sets: Vec<Coalitions> = sizes
            .map(|s| {
                let mut sets = Coalitions::new(n);
                (0..count).for_each(|_| sets.push(&random_subset(&mut rng, n, s, 1)));
                sets
            })
            .collect();
        let made = |set: &[u64]| truth.iter().map(|(t, c)| c * parity(t, set)).sum::<f64>();
        let values = sets.iter().map(|sets| sets.iter().map(made).collect()).collect();
        (sets, values)
    }

    /// One stratum per size of the sample, its residuals the values, every coalition weighing 1.
    fn strata_of<'a>(sets: &'a [Coalitions], values: &'a [Vec<f64>]) -> Vec<Stratum<'a>> {
        sets.iter()
            .zip(values)
            .map(|(sets, values)| {
                let size = size(sets.get(0));
                Stratum { size, sets, values, residuals: values.clone(), weight: 1.0 }
            })
            .collect()
    }

    /// Residuals that are a sum of three triples' characters (two sharing a player) are
    /// recovered: those triples are kept (with others, whose coefficients come out nil), and
    /// their part of the surrogate is reproduced on the held-out coalitions.
    #[test]
    fn recovers_the_triples_a_residual_is_made_of() {
        let n = 24;
        let truth = [([1, 5, 9], 0.8), ([1, 7, 20], -0.6), ([3, 11, 15], 0.5)];
        let (sets, values) = characters_sample(n, &truth, 2..=12, 400, 7);
        let strata = strata_of(&sets, &values);
        // Fitted without every fourth coalition, checked on those; no linear part to refit. The
        // fit stops once a turn moves no coefficient by 1% of the largest ([`SETTLED`]): close
        // to 1e-5, not to rounding.
        let fitted = Interactions::fit(n, &strata, |j| j % 4 != 0, |_| values.clone());
        for (triple, c) in fitted.triples.iter().zip(&fitted.coef) {
            let true_coef = truth.iter().find(|(t, _)| t == triple).map_or(0.0, |(_, c)| *c);
            assert!((c - true_coef).abs() < 1e-4, "{triple:?}: {c} vs {true_coef}");
        }
        assert!(truth.iter().all(|(t, _)| fitted.triples.contains(t)));
        for (sets, values) in sets.iter().zip(&values) {
            for (set, v) in sets.iter().zip(values).step_by(4) {
                assert!((fitted.value(set) - v).abs() < 1e-4, "{} vs {v}", fitted.value(set));
            }
        }
        // Nothing to find in residuals that are rounding.
        let flat: Vec<Stratum> = strata
            .iter()
            .map(|st| Stratum { residuals: vec![1e-18; st.residuals.len()], values: st.values, ..*st })
            .collect();
        assert!(Interactions::fit(n, &flat, |j| j % 4 != 0, |_| values.clone()).triples.is_empty());
    }

    /// Every triple holding the hub is scored from one table of pair sums: on a residual made
    /// of hub triples' characters (sizes near n / 2, where characters are near orthogonal), the
    /// triples found are exactly those, the strongest first.
    #[test]
    fn hub_screening_finds_the_triples_around_a_hub() {
        let n = 40;
        let truth = [([0, 3, 7], 0.9), ([0, 3, 11], -0.7), ([0, 12, 30], 0.5), ([0, 25, 39], -0.4)];
        let (sets, values) = characters_sample(n, &truth, 17..=20, 500, 11);
        let strata = strata_of(&sets, &values);
        let training = Training::new(n, &strata, |_| true);
        let found = hub_triples(&training, 0, &training.linear, &[]);
        assert_eq!(found, truth.map(|(t, _)| t).to_vec());
        // Those already in the model are not found again.
        let known = [[0, 3, 7], [0, 25, 39]];
        assert_eq!(hub_triples(&training, 0, &training.linear, &known), vec![[0, 3, 11], [0, 12, 30]]);
    }

    /// Below the hub triples {0, 3, 7} and {0, 12, 30}, a residual of the characters of
    /// {3, 7, 21} and {5, 12, 30} (deeper chains) is found from the hub triples' other pairs.
    #[test]
    fn triples_below_the_hub_triples_are_found_from_their_pairs() {
        let n = 40;
        let truth = [([3, 7, 21], 0.8), ([5, 12, 30], -0.6)];
        let (sets, values) = characters_sample(n, &truth, 17..=20, 500, 13);
        let strata = strata_of(&sets, &values);
        let training = Training::new(n, &strata, |_| true);
        let known = [[0, 3, 7], [0, 12, 30]];
        assert_eq!(below_hubs(&training, &training.linear, &known, &[0]), truth.map(|(t, _)| t).to_vec());
        // Nothing below a hub triple that is not there.
        assert!(below_hubs(&training, &training.linear, &[[0, 8, 9]], &[0]).is_empty());
    }

    /// A screening around some players sums the pairs holding one of them as the full one
    /// does, bit for bit, and so scores the extensions of the edges between them the same.
    #[test]
    fn a_screening_around_players_sums_their_pairs_as_the_full_one() {
        let n = 30;
        let truth = [([2, 5, 9], 0.8), ([5, 7, 20], -0.6)];
        let (sets, values) = characters_sample(n, &truth, 3..=15, 200, 17);
        let strata = strata_of(&sets, &values);
        let training = Training::new(n, &strata, |_| true);
        let (psi, bases) = screening_tables(n);
        let full = Screen::new(&training, &training.linear, &psi, &bases, None);
        let around: Vec<bool> = (0..n).map(|p| [2, 5, 7, 9, 29].contains(&p)).collect();
        let part = Screen::new(&training, &training.linear, &psi, &bases, Some(&around));
        for i in 0..n {
            for j in (i + 1..n).filter(|&j| around[i] || around[j]) {
                let [a, b] = [&full, &part].map(|screen| screen.pair[pair_at(n, i, j)][2..].to_vec());
                assert!(a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()), "({i}, {j})");
            }
        }
        let edges = [(0.0, 2, 5), (0.0, 7, 29), (0.0, 5, 9)];
        let [a, b] = [&full, &part].map(|screen| screen.extensions(&training, &edges));
        assert_eq!(a.len(), 3 * (n - 2) - 1);
        assert!(a.iter().zip(&b).all(|(a, b)| a.0.to_bits() == b.0.to_bits() && a.1 == b.1));
    }

    #[test]
    fn a_hub_is_in_a_large_share_of_the_screened_triples() {
        let around = |hub: usize, count: usize| (0..count).map(move |k| [hub, 100 + 2 * k, 101 + 2 * k]);
        // 0 in 20 of 24, 1 in 16.
        let mut triples: Vec<[usize; 3]> = (0..16).map(|k| [0, 1, 400 + k]).chain(around(0, 4)).collect();
        triples.extend((0..4).map(|k| [200 + 3 * k, 201 + 3 * k, 202 + 3 * k]));
        assert_eq!(hubs_of(&triples), vec![0, 1]);
        // Too small a share, or too few triples, makes no hub.
        triples.extend((0..30).map(|k| [300 + 3 * k, 301 + 3 * k, 302 + 3 * k]));
        assert_eq!(hubs_of(&triples), Vec::<usize>::new());
        assert_eq!(hubs_of(&around(5, HUB_MIN - 1).collect::<Vec<_>>()), Vec::<usize>::new());
    }

    /// The features' closed-form terms are E_s[chi_T a_i], counted over every coalition of
    /// each size, and sum to zero over the players.
    #[test]
    fn feature_terms_are_the_msr_means_of_the_characters() {
        let n = 8;
        let features = Interactions { triples: vec![[0, 2, 5], [1, 2, 7]], coef: vec![0.7, -1.3] };
        for s in 1..n {
            let mut terms = vec![0.0; n];
            features.add_terms(n, s, 1.0, &mut terms);
            let (mut exact, mut count) = (vec![0.0; n], 0.0);
            crate::shapley::kernel::for_each_subset(n, s, |set| {
                let g = features.value(set);
                (0..n).for_each(|i| {
                    exact[i] += g * if contains(set, i) { 1.0 / s as f64 } else { -1.0 / (n - s) as f64 }
                });
                count += 1.0;
            });
            for (term, exact) in terms.iter().zip(&exact) {
                assert!((term - exact / count).abs() < 1e-12, "s {s}: {term} vs {}", exact / count);
            }
            assert!(terms.iter().sum::<f64>().abs() < 1e-12);
        }
    }

    /// phi_T is orthogonal to 1 and to t under the hypergeometric law at every size: the
    /// features add nothing to MSR's closed-form term.
    #[test]
    fn features_are_orthogonal_to_affine_functions_of_the_memberships() {
        for n in [4, 7, 30, 301] {
            let psi = psi_tables(n);
            for (s, psi) in psi.iter().enumerate() {
                let p = triple_law(n, s);
                assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
                let mean: f64 = (0..4).map(|t| p[t] * psi[t]).sum();
                let against_t: f64 = (0..4).map(|t| p[t] * psi[t] * t as f64).sum();
                assert!(mean.abs() < 1e-12 && against_t.abs() < 1e-12, "n {n} s {s}: {mean} {against_t}");
            }
        }
    }
}
