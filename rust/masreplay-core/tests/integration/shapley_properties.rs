//! Properties of the Shapley estimators: efficiency, symmetry, null player, linearity,
//! closed forms, brute force over orderings, the anchors' worked example, uniformity of the
//! sampled spawn-tree orderings, and error shrinking with the budget.

use masreplay_core::shapley::coalition::{Coalitions, contains, insert};
use masreplay_core::shapley::games::{AdditiveGame, EmpiricalGame, SoumGame, TableGame};
use masreplay_core::shapley::{
    Forest, Game, Method, MsrSurrogate, ShapleyOptions, ShapleyResult, Union, sampling, shapley,
};
use masreplay_core::{MasreplayError, Result};
use proptest::prelude::*;

fn run(game: &dyn Game, method: Method, budget: u64, seed: u64) -> ShapleyResult {
    let options = ShapleyOptions { method, budget: Some(budget), seed, ..Default::default() };
    shapley(game, &options).expect("shapley runs")
}

fn with(options: ShapleyOptions, game: &dyn Game) -> ShapleyResult {
    shapley(game, &options).expect("shapley runs")
}

fn value_of(game: &dyn Game, players: &[usize]) -> f64 {
    let mut batch = Coalitions::new(game.n_players());
    batch.push_players(players.iter().copied());
    game.values(&batch).unwrap()[0]
}

fn assert_close(a: &[f64], b: &[f64], tolerance: f64) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tolerance, "player {i}: {x} vs {y} (tolerance {tolerance})\n{a:?}\n{b:?}");
    }
}

fn efficiency_gap(game: &dyn Game, result: &ShapleyResult) -> f64 {
    let n = game.n_players();
    let total = value_of(game, &(0..n).collect::<Vec<_>>()) - value_of(game, &[]);
    (result.values.iter().sum::<f64>() - total).abs()
}

/// All permutations of 0..n (n small).
fn permutations(n: usize) -> Vec<Vec<u32>> {
    let mut out = Vec::new();
    let mut current: Vec<u32> = (0..n as u32).collect();
    fn heap(k: usize, current: &mut Vec<u32>, out: &mut Vec<Vec<u32>>) {
        if k <= 1 {
            out.push(current.clone());
            return;
        }
        for i in 0..k {
            heap(k - 1, current, out);
            let j = if k.is_multiple_of(2) { i } else { 0 };
            current.swap(j, k - 1);
        }
    }
    heap(n, &mut current, &mut out);
    out
}

/// Mean marginal contributions over the orderings `keep` accepts.
fn brute_over_orderings(game: &dyn Game, keep: impl Fn(&[u32]) -> bool) -> (Vec<f64>, usize) {
    let n = game.n_players();
    let mut phi = vec![0.0; n];
    let mut count = 0;
    for order in permutations(n).into_iter().filter(|o| keep(o)) {
        count += 1;
        let mut set = Vec::new();
        let mut before = value_of(game, &set);
        for &p in &order {
            set.push(p as usize);
            let after = value_of(game, &set);
            phi[p as usize] += after - before;
            before = after;
        }
    }
    (phi.iter().map(|v| v / count as f64).collect(), count)
}

fn parents_first(parents: &[i64]) -> impl Fn(&[u32]) -> bool + '_ {
    move |order: &[u32]| {
        let mut position = vec![0; order.len()];
        order.iter().enumerate().for_each(|(k, &p)| position[p as usize] = k);
        parents.iter().enumerate().all(|(i, &p)| p < 0 || position[p as usize] < position[i])
    }
}

/// `game` made symmetric in players 0 and 1 (each term also appears with the two swapped),
/// with `null_players` more players that no term contains.
fn symmetrised(game: &SoumGame, null_players: usize) -> SoumGame {
    let swap = |p: u32| match p {
        0 => 1,
        1 => 0,
        p => p,
    };
    let terms: Vec<(Vec<u32>, f64)> = game
        .terms()
        .into_iter()
        .flat_map(|(members, c)| [(members.iter().map(|&p| swap(p)).collect(), c / 2.0), (members, c / 2.0)])
        .collect();
    SoumGame::new(game.n_players() + null_players, terms).unwrap()
}

/// `a` and `b` differ by at most four of their combined standard errors: a sampled
/// estimator keeps symmetry and the null player in expectation, and a test at four sigma
/// fails by chance about once in 16,000 draws (a t law of a few dozen units a little more).
fn within_noise(a: f64, b: f64, stderr_a: f64, stderr_b: f64) -> bool {
    (a - b).abs() <= 4.0 * (stderr_a * stderr_a + stderr_b * stderr_b).sqrt() + 1e-9
}

fn soum_strategy(max_n: usize) -> impl Strategy<Value = SoumGame> {
    (2..=max_n, 1usize..12, any::<u64>()).prop_map(|(n, terms, seed)| SoumGame::random(n, terms, n, seed).unwrap())
}

/// A random forest: each player's parent is an earlier player or none.
fn forest_strategy(n: usize) -> impl Strategy<Value = Vec<i64>> {
    prop::collection::vec(any::<u32>(), n).prop_map(|draws| {
        draws.iter().enumerate().map(|(i, d)| if i == 0 || d % 4 == 0 { -1 } else { (d % i as u32) as i64 }).collect()
    })
}

fn nested_unions(n: usize) -> Vec<Union> {
    // ((0 1) 2) (3 4 ...) : two levels on the first union.
    let players: Vec<Union> = (0..n as u32).map(Union::Player).collect();
    let split = n / 2;
    let mut first = players[..split].to_vec();
    if first.len() >= 2 {
        let inner = first.drain(..2).collect();
        first.insert(0, Union::Group(inner));
    }
    vec![Union::Group(first), Union::Group(players[split..].to_vec())]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn exact_matches_the_soum_closed_form(game in soum_strategy(10)) {
        let result = run(&game, Method::Exact, 1 << 12, 0);
        assert_close(&result.values, &game.shapley_values(), 1e-10);
        prop_assert!(result.exact && result.converged);
    }

    #[test]
    fn every_method_is_efficient(game in soum_strategy(12), seed in any::<u64>(), tree in forest_strategy(12)) {
        // The projection makes every sum efficient; the gap it closed is the test: rounding
        // for the estimators efficient by construction, in the sampling and the exact regime.
        let n = game.n_players();
        let parents = tree[..n].to_vec();
        let rounding = |result: &ShapleyResult| 1e-9 * (1.0 + result.values.iter().map(|v| v.abs()).sum::<f64>());
        for method in [Method::Exact, Method::Permutation, Method::Kernel, Method::Stratified, Method::Msr, Method::Auto] {
            let result = run(&game, method, if method == Method::Exact { 1 << 12 } else { 500 }, seed);
            prop_assert!(efficiency_gap(&game, &result) < 1e-9, "{method:?}");
            if method != Method::Stratified {
                prop_assert!(result.efficiency_gap.abs() < rounding(&result), "{method:?}: gap {}", result.efficiency_gap);
            }
        }
        for method in [Method::Precedence, Method::Permission] {
            for budget in [40, 5000] {
                let options = ShapleyOptions { method, budget: Some(budget), seed, parents: Some(parents.clone()), ..Default::default() };
                let result = with(options, &game);
                prop_assert!(efficiency_gap(&game, &result) < 1e-9, "{method:?} at {budget}");
                prop_assert!(result.efficiency_gap.abs() < rounding(&result), "{method:?} at {budget}: gap {}", result.efficiency_gap);
            }
        }
        for budget in [60, 100_000] {
            let options = ShapleyOptions { method: Method::Owen, budget: Some(budget), seed, unions: Some(nested_unions(n)), ..Default::default() };
            let result = with(options, &game);
            prop_assert!(efficiency_gap(&game, &result) < 1e-9);
            prop_assert!(result.efficiency_gap.abs() < rounding(&result), "owen at {budget}: gap {}", result.efficiency_gap);
        }
    }

    #[test]
    fn symmetric_players_get_equal_values(game in soum_strategy(9)) {
        let symmetric = symmetrised(&game, 0);
        for method in [Method::Exact, Method::Kernel] {
            let result = run(&symmetric, method, 1 << 12, 3);
            prop_assert!((result.values[0] - result.values[1]).abs() < 1e-9, "{method:?}");
        }
    }

    #[test]
    fn a_null_player_gets_zero(game in soum_strategy(9), seed in any::<u64>()) {
        // A new last player that no term contains.
        let n = game.n_players() + 1;
        let padded = SoumGame::new(n, game.terms()).unwrap();
        for method in [Method::Exact, Method::Permutation] {
            let result = run(&padded, method, 2000, seed);
            prop_assert!(result.values[n - 1].abs() < 1e-12, "{method:?}: {}", result.values[n - 1]);
        }
        let chain: Vec<i64> = (0..n as i64).map(|i| i - 1).collect();
        let options = ShapleyOptions { method: Method::Precedence, budget: Some(1000), seed, parents: Some(chain), ..Default::default() };
        prop_assert!(with(options, &padded).values[n - 1].abs() < 1e-12);
    }

    #[test]
    fn linear_under_the_same_random_stream(v in soum_strategy(20), w in soum_strategy(20), a in -3.0f64..3.0, b in -3.0f64..3.0, seed in any::<u64>()) {
        let n = v.n_players().max(w.n_players());
        let v = SoumGame::new(n, v.terms()).unwrap();
        let w = SoumGame::new(n, w.terms()).unwrap();
        let combined: Vec<(Vec<u32>, f64)> = v.terms().into_iter().map(|(m, c)| (m, a * c))
            .chain(w.terms().into_iter().map(|(m, c)| (m, b * c))).collect();
        let combined = SoumGame::new(n, combined).unwrap();
        // MSR too: its coalitions depend on the seed only and its linear surrogate is a
        // least-squares fit (interaction features are chosen by the values: not linear in them).
        for method in [Method::Permutation, Method::Kernel, Method::Msr, Method::Exact] {
            let budget = if method == Method::Exact { 1 << 20 } else { 3000 };
            if method == Method::Exact && n > 14 { continue; }
            let options = ShapleyOptions { method, budget: Some(budget), seed, surrogate: MsrSurrogate::Linear, ..Default::default() };
            let (pv, pw, pc) = (with(options.clone(), &v), with(options.clone(), &w), with(options, &combined));
            let expected: Vec<f64> = pv.values.iter().zip(&pw.values).map(|(x, y)| a * x + b * y).collect();
            assert_close(&pc.values, &expected, 1e-9);
        }
    }

    #[test]
    fn precedence_and_permission_match_brute_force(game in soum_strategy(6), tree in forest_strategy(6), seed in any::<u64>()) {
        let n = game.n_players();
        let parents = tree[..n].to_vec();
        let (expected, count) = brute_over_orderings(&game, parents_first(&parents));
        let forest = Forest::new(&parents).unwrap();
        // Hook-length formula for forests: n! / prod of subtree sizes.
        prop_assert!((forest.ln_orderings().exp() - count as f64).abs() < 1e-6);
        let options = ShapleyOptions { method: Method::Precedence, seed, parents: Some(parents.clone()), ..Default::default() };
        let result = with(options.clone(), &game);
        prop_assert!(result.exact);
        assert_close(&result.values, &expected, 1e-10);
        // Permission value: ordinary Shapley of v'(S) = v(largest down-set in S).
        let restricted = TableGame::dense(&(0u64..1 << n).map(|mask| {
            let mut set = [mask];
            let mut down = [0u64];
            forest.largest_downset(&set, &mut down);
            set[0] = down[0];
            value_of(&game, &(0..n).filter(|&p| contains(&set, p)).collect::<Vec<_>>())
        }).collect::<Vec<_>>()).unwrap();
        let permission = with(ShapleyOptions { method: Method::Permission, ..options }, &game);
        assert_close(&permission.values, &run(&restricted, Method::Exact, 1 << 12, 0).values, 1e-10);
    }

    #[test]
    fn owen_matches_brute_force_and_splits_the_quotient_game(game in soum_strategy(7)) {
        let n = game.n_players();
        let unions = nested_unions(n);
        let options = ShapleyOptions { method: Method::Owen, budget: Some(1 << 20), unions: Some(unions.clone()), ..Default::default() };
        let result = with(options, &game);
        prop_assert!(result.exact);
        let split = n / 2;
        let contiguous = |order: &[u32]| {
            // Both top unions contiguous, and {0, 1} contiguous inside the first when it is nested.
            let position = |p: u32| order.iter().position(|&q| q == p).unwrap();
            let run_of = |players: &[u32]| {
                let mut at: Vec<usize> = players.iter().map(|&p| position(p)).collect();
                at.sort();
                at.windows(2).all(|w| w[1] == w[0] + 1)
            };
            let first: Vec<u32> = (0..split as u32).collect();
            let second: Vec<u32> = (split as u32..n as u32).collect();
            run_of(&first) && run_of(&second) && (split < 2 || run_of(&[0, 1]))
        };
        let (expected, _) = brute_over_orderings(&game, contiguous);
        assert_close(&result.values, &expected, 1e-10);
        // Sums within each union are the union's Shapley value in the quotient game.
        let quotient = TableGame::dense(&(0u64..4).map(|mask| {
            let players: Vec<usize> = (0..n).filter(|&p| if p < split { mask & 1 == 1 } else { mask & 2 == 2 }).collect();
            value_of(&game, &players)
        }).collect::<Vec<_>>()).unwrap();
        let q = run(&quotient, Method::Exact, 4, 0).values;
        prop_assert!((result.values[..split].iter().sum::<f64>() - q[0]).abs() < 1e-10);
        prop_assert!((result.values[split..].iter().sum::<f64>() - q[1]).abs() < 1e-10);
    }

    #[test]
    fn complete_kernel_is_exact(game in soum_strategy(8)) {
        let result = run(&game, Method::Kernel, 1 << 8, 0);
        prop_assert!(result.exact);
        assert_close(&result.values, &game.shapley_values(), 1e-8);
    }
}

#[test]
fn stratified_reports_the_gap_it_leaves() {
    // Stratified estimates every player from different coalitions, so its sum misses
    // v(N) - v(empty) by an estimation error, which the result reports before projecting.
    let game = SoumGame::random(30, 60, 30, 3).unwrap();
    let result = run(&game, Method::Stratified, 2_000, 1);
    let spread = result.stderr.iter().map(|e| e * e).sum::<f64>().sqrt();
    assert!(result.efficiency_gap.abs() > 1e-6 * spread, "gap {} against stderr {spread}", result.efficiency_gap);
    assert!(efficiency_gap(&game, &result) < 1e-9);
}

#[test]
fn precedence_on_a_chain_equals_the_increments() {
    let game = SoumGame::random(9, 30, 9, 7).unwrap();
    let parents: Vec<i64> = (0..9).map(|i| i - 1).collect();
    let options = ShapleyOptions { method: Method::Precedence, parents: Some(parents), ..Default::default() };
    let result = with(options, &game);
    let increments: Vec<f64> = (0..9)
        .map(|i| value_of(&game, &(0..=i).collect::<Vec<_>>()) - value_of(&game, &(0..i).collect::<Vec<_>>()))
        .collect();
    assert_close(&result.values, &increments, 1e-12);
    assert_eq!(result.evaluations, 10, "a chain of 9 has 10 down-sets");
}

#[test]
fn the_worked_example_of_the_anchors() {
    let game = AdditiveGame::new(vec![0.1, 0.2, 0.3, 0.4]).unwrap();
    let parents = vec![-1, 0, 0, 1];
    let forest = Forest::new(&parents).unwrap();
    assert!((forest.ln_orderings().exp() - 3.0).abs() < 1e-9, "3 valid orderings");
    let base = ShapleyOptions { parents: Some(parents), ..Default::default() };
    let precedence = with(ShapleyOptions { method: Method::Precedence, ..base.clone() }, &game);
    assert_close(&precedence.values, &[0.1, 0.2, 0.3, 0.4], 1e-12);
    let permission = with(ShapleyOptions { method: Method::Permission, ..base.clone() }, &game);
    assert_close(&permission.values, &[0.48333333333333334, 0.23333333333333334, 0.15, 0.13333333333333333], 1e-12);
    // Sampled (forced by a budget below the feasible coalitions) agrees within its error.
    let sampled = with(ShapleyOptions { method: Method::Permission, budget: Some(15), seed: 1, ..base.clone() }, &game);
    assert!(!sampled.exact);
    let many = with(ShapleyOptions { method: Method::Permission, budget: Some(12), seed: 1, ..base.clone() }, &game);
    assert!((many.values.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    assert_eq!(with(ShapleyOptions { method: Method::Auto, ..base }, &game).method, Method::Precedence);
}

#[test]
fn sampled_spawn_tree_orderings_are_uniform() {
    // A forest with 6 players: 0 -> {1, 2}, 1 -> {3}, and 4 -> {5}.
    let parents = vec![-1, 0, 0, 1, -1, 4];
    let forest = Forest::new(&parents).unwrap();
    let valid: Vec<Vec<u32>> = permutations(6).into_iter().filter(|o| parents_first(&parents)(o)).collect();
    // Hook-length count: 6! / (4 * 2 * 1 * 1 * 2 * 1) = 45.
    assert_eq!(valid.len(), 45);
    assert!((forest.ln_orderings().exp() - 45.0).abs() < 1e-9);
    let draws = 45 * 400;
    let mut counts = std::collections::HashMap::new();
    let mut rng = sampling::stream(2024, 0);
    let (mut order, mut scratch) = (Vec::new(), Vec::new());
    for _ in 0..draws {
        forest.sample_ordering(&mut rng, &mut order, &mut scratch);
        assert!(parents_first(&parents)(&order), "sampled {order:?}");
        *counts.entry(order.clone()).or_insert(0u32) += 1;
    }
    assert_eq!(counts.len(), 45);
    let expected = draws as f64 / 45.0;
    let chi_square: f64 = counts.values().map(|&c| (c as f64 - expected).powi(2) / expected).sum();
    // 44 degrees of freedom: the 99.9% quantile is 78.7.
    assert!(chi_square < 78.7, "chi-square {chi_square}");
}

fn mean_absolute_error(estimate: &[f64], truth: &[f64]) -> f64 {
    estimate.iter().zip(truth).map(|(a, b)| (a - b).abs()).sum::<f64>() / truth.len() as f64
}

#[test]
fn error_shrinks_with_the_budget() {
    for (method, max_order) in [
        (Method::Permutation, 3),
        (Method::Permutation, 30),
        (Method::Kernel, 3),
        (Method::Stratified, 30),
        (Method::Msr, 3),
        (Method::Msr, 30),
    ] {
        let (mut small, mut large) = (0.0, 0.0);
        for seed in 0..4 {
            let game = SoumGame::random(30, 60, max_order, seed).unwrap();
            let truth = game.shapley_values();
            small += mean_absolute_error(&run(&game, method, 1_000, seed).values, &truth);
            large += mean_absolute_error(&run(&game, method, 50_000, seed).values, &truth);
        }
        assert!(large < 0.4 * small, "{method:?} order {max_order}: {small} -> {large}");
    }
    // Sampled precedence on a wide random tree, against exact precedence.
    let game = SoumGame::random(16, 40, 4, 5).unwrap();
    // Four roots with three children each: 9^4 down-sets.
    let parents: Vec<i64> = (0..16).map(|i| if i < 4 { -1 } else { i as i64 % 4 }).collect();
    let base = ShapleyOptions { method: Method::Precedence, parents: Some(parents), ..Default::default() };
    let truth = with(ShapleyOptions { budget: Some(1 << 22), ..base.clone() }, &game);
    assert!(truth.exact);
    let error = |budget| {
        let sampled = with(ShapleyOptions { budget: Some(budget), ..base.clone() }, &game);
        assert!(!sampled.exact);
        mean_absolute_error(&sampled.values, &truth.values)
    };
    let feasible = Forest::new(base.parents.as_ref().unwrap()).unwrap().count_downsets() as u64;
    assert!(feasible > 3000, "{feasible} down-sets");
    assert!(error(feasible - 1) < 0.4 * error(300));
}

#[test]
fn same_seed_same_values_at_any_thread_count() {
    let game = SoumGame::random(40, 80, 5, 9).unwrap();
    let parents: Vec<i64> = (0..40).map(|i| i as i64 / 3 - 1).collect();
    for (method, parents) in [
        (Method::Permutation, None),
        (Method::Kernel, None),
        (Method::Stratified, None),
        (Method::Msr, None),
        (Method::Precedence, Some(parents.clone())),
        (Method::Permission, Some(parents)),
    ] {
        let results: Vec<ShapleyResult> = [1, 2, 4]
            .into_iter()
            .map(|threads| {
                let options = ShapleyOptions {
                    method,
                    budget: Some(200_000),
                    seed: 11,
                    parents: parents.clone(),
                    n_threads: Some(threads),
                    ..Default::default()
                };
                with(options, &game)
            })
            .collect();
        assert_eq!(results[0], results[1], "{method:?}");
        assert_eq!(results[0], results[2], "{method:?}");
    }
}

#[test]
fn target_stderr_stops_early_and_is_met() {
    let game = SoumGame::random(20, 40, 3, 1).unwrap();
    let options = ShapleyOptions { method: Method::Permutation, target_stderr: Some(0.01), ..Default::default() };
    let result = with(options, &game);
    assert!(result.converged);
    assert!(result.stderr.iter().all(|&e| e <= 0.01));
    assert!(result.evaluations < 1_000_000);
    let truth = game.shapley_values();
    assert!(mean_absolute_error(&result.values, &truth) < 0.03);
}

#[test]
fn msr_is_unbiased_and_meets_a_target() {
    // Unbiased: the mean over 400 seeds at a budget of 300 (an eighth of what exhausting a
    // 12-player game takes; the surrogate fits on few coalitions) is within four standard
    // errors of that mean from the truth, for every player.
    let game = SoumGame::random(12, 30, 12, 4).unwrap();
    assert_unbiased(
        (0..400).map(|seed| {
            let result = run(&game, Method::Msr, 300, seed);
            assert!(!result.exact);
            result.values
        }),
        &game.shapley_values(),
    );
    // A target standard error grows the sample in rounds and stops once it is met.
    let game = SoumGame::random(40, 60, 40, 2).unwrap();
    let options = ShapleyOptions { method: Method::Msr, target_stderr: Some(0.01), ..Default::default() };
    let result = with(options, &game);
    assert!(result.converged && result.stderr.iter().all(|&e| e <= 0.01));
    assert!(result.evaluations < 1_000_000, "{}", result.evaluations);
    // Pairwise games: the complementary pairs' half differences are linear, the surrogate
    // absorbs them, and the values are exact up to the surrogate's ridge.
    let pairwise: Vec<(Vec<u32>, f64)> = (0..30u32)
        .map(|i| (vec![i], 1.0 + i as f64 / 10.0))
        .chain((0..30u32).flat_map(|i| (i + 1..30).map(move |j| (vec![i, j], ((i * 5 + j) % 7) as f64 / 7.0 - 0.5))))
        .collect();
    let game = SoumGame::new(30, pairwise).unwrap();
    let result = run(&game, Method::Msr, 5_000, 1);
    assert!(mean_absolute_error(&result.values, &game.shapley_values()) < 1e-3);
}

/// 40 players: a singleton each and six disjoint triples (the odd part of a triple is what a
/// linear surrogate cannot absorb).
fn sparse_triples() -> SoumGame {
    let singletons = (0..40u32).map(|i| (vec![i], 0.2 + (i % 7) as f64 / 7.0));
    let triples = (0..6u32).map(|k| (vec![k, k + 13, k + 26], if k % 2 == 0 { 0.9 } else { -0.7 }));
    SoumGame::new(40, singletons.chain(triples).collect()).unwrap()
}

#[test]
fn msr_interactions_fit_sparse_triples_unbiased_and_efficient() {
    let game = sparse_triples();
    let truth = game.shapley_values();
    let msr = |surrogate, budget, seed| {
        let options =
            ShapleyOptions { method: Method::Msr, budget: Some(budget), seed, surrogate, ..Default::default() };
        with(options, &game)
    };
    let mae = |surrogate| {
        (0..5).map(|seed| mean_absolute_error(&msr(surrogate, 10_000, seed).values, &truth)).sum::<f64>() / 5.0
    };
    let (linear, interactions) = (mae(MsrSurrogate::Linear), mae(MsrSurrogate::Interactions));
    assert!(interactions < linear / 2.0, "interactions {interactions} vs linear {linear}");
    // Unbiased (the features are screened and fitted on the other folds only) and efficient
    // before the projection (they add no closed-form term): 300 seeds at 6,000 evaluations.
    let runs = (0..300).map(|seed| {
        let result = msr(MsrSurrogate::Interactions, 6_000, seed);
        assert!(result.efficiency_gap.abs() < 1e-9, "{}", result.efficiency_gap);
        result.values
    });
    assert_unbiased(runs, &truth);
}

/// The mean of `runs` is within four standard errors of that mean from `truth`, player by
/// player.
fn assert_unbiased(runs: impl Iterator<Item = Vec<f64>>, truth: &[f64]) {
    let n = truth.len();
    let (mut sum, mut squares, mut m) = (vec![0.0; n], vec![0.0; n], 0.0);
    for values in runs {
        for (i, v) in values.iter().enumerate() {
            sum[i] += v;
            squares[i] += v * v;
        }
        m += 1.0;
    }
    for i in 0..n {
        let mean = sum[i] / m;
        let stderr_of_mean = ((squares[i] / m - mean * mean) / (m - 1.0)).sqrt();
        assert!((mean - truth[i]).abs() <= 4.0 * stderr_of_mean + 1e-12, "player {i}: {mean} vs {}", truth[i]);
    }
}

#[test]
fn soum_walks_agree_with_values() {
    let game = SoumGame::random(70, 50, 70, 3).unwrap();
    let order: Vec<u32> = (0..70).rev().collect();
    let mut walked = vec![0.0; 71];
    assert!(game.walk(&order, &mut walked));
    for k in 0..=70 {
        let players: Vec<usize> = order[..k].iter().map(|&p| p as usize).collect();
        assert!((walked[k] - value_of(&game, &players)).abs() < 1e-12);
    }
    let banzhaf = game.banzhaf_values();
    assert_eq!(banzhaf.len(), 70);
}

#[test]
fn empirical_game_reads_means_and_regresses_the_rest() {
    // Additive truth 1, 2, 3 with noise-free observations of five coalitions.
    let mut observed = Coalitions::new(3);
    let mut rewards = Vec::new();
    for mask in [0b001u64, 0b010, 0b011, 0b110, 0b110, 0b000] {
        observed.push_mask(mask);
        rewards.push((0..3).filter(|p| mask >> p & 1 == 1).map(|p| (p + 1) as f64).sum());
    }
    let game = EmpiricalGame::new(&observed, &rewards, 1).unwrap();
    assert_eq!(game.n_observed(), 5);
    let mut unseen = [0u64];
    insert(&mut unseen, 0);
    insert(&mut unseen, 2);
    assert!((game.predict(&unseen) - 4.0).abs() < 1e-3);
    let result = run(&game, Method::Exact, 8, 0);
    assert_close(&result.values, &[1.0, 2.0, 3.0], 1e-3);
}

#[test]
fn bad_arguments_are_errors_not_panics() {
    let game = SoumGame::random(5, 5, 2, 0).unwrap();
    let invalid = |options: ShapleyOptions| matches!(shapley(&game, &options), Err(MasreplayError::InvalidArgument(_)));
    assert!(invalid(ShapleyOptions { parents: Some(vec![-1, 0, 1]), ..Default::default() }));
    assert!(invalid(ShapleyOptions { parents: Some(vec![1, 0, -1, -1, -1]), ..Default::default() }));
    assert!(invalid(ShapleyOptions { parents: Some(vec![-1, 7, -1, -1, -1]), ..Default::default() }));
    assert!(invalid(ShapleyOptions { method: Method::Precedence, ..Default::default() }));
    assert!(invalid(ShapleyOptions { method: Method::Owen, ..Default::default() }));
    assert!(invalid(ShapleyOptions { method: Method::Permutation, budget: Some(3), ..Default::default() }));
    assert!(invalid(ShapleyOptions { method: Method::Msr, budget: Some(3), ..Default::default() }));
    assert!(
        shapley(&big_for_msr(), &ShapleyOptions { method: Method::Msr, budget: Some(100), ..Default::default() })
            .is_err()
    );
    assert!(invalid(ShapleyOptions { target_stderr: Some(-1.0), ..Default::default() }));
    assert!(invalid(ShapleyOptions { unions: Some(vec![Union::Player(0), Union::Player(0)]), ..Default::default() }));
    assert!(invalid(ShapleyOptions { n_threads: Some(0), ..Default::default() }));
    assert!(Method::parse("monte-carlo").is_err());
    assert!(SoumGame::new(3, vec![(vec![5], 1.0)]).is_err());
    assert!(TableGame::dense(&[0.0; 3]).is_err());
    let big = SoumGame::random(40, 5, 2, 0).unwrap();
    assert!(shapley(&big, &ShapleyOptions { method: Method::Exact, ..Default::default() }).is_err());
    assert!(invalid(ShapleyOptions { method: Method::Exact, budget: Some(31), ..Default::default() }));
    let _: Result<()> = Ok(());
}

/// 60 players: 100 evaluations cannot draw two pairs of each of the sizes MSR samples.
fn big_for_msr() -> SoumGame {
    SoumGame::random(60, 5, 2, 0).unwrap()
}

proptest! {
    // A statistical check, so its draws are fixed (as the Python side's coverage tests fix
    // their seeds): a four-sigma bound over some 200 estimates of sparse games, whose errors
    // have heavier tails than a normal law, failed by chance in 2 of 60 runs that drew new
    // games (kernel at n = 11, 3.4 and 4 of its stderr off on two null players); with fixed
    // draws a failure is a change in an estimator.
    #![proptest_config(ProptestConfig {
        cases: 48,
        rng_seed: proptest::test_runner::RngSeed::Fixed(23),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn symmetry_and_null_player_hold_in_the_sampling_regime(
        game in (10usize..=13, 1usize..12, any::<u64>()).prop_map(|(n, terms, seed)| SoumGame::random(n, terms, 3, seed).unwrap()),
        seed in any::<u64>(),
    ) {
        // Players 0 and 1 are symmetric, the last is null; 2^n exceeds the budget, so every
        // estimator below samples. Terms of at most three players: a high-order term makes
        // each nonzero value a rare draw, too unreliable in variance for a four-sigma check.
        let game = symmetrised(&game, 1);
        let n = game.n_players();
        let budget = 1000;
        for method in [Method::Kernel, Method::Stratified, Method::Msr] {
            let r = run(&game, method, budget, seed);
            prop_assert!(!r.exact, "{method:?}");
            prop_assert!(within_noise(r.values[0], r.values[1], r.stderr[0], r.stderr[1]), "{method:?}: {:?} +- {:?}", r.values, r.stderr);
            prop_assert!(within_noise(r.values[n - 1], 0.0, r.stderr[n - 1], 0.0), "{method:?}: null {} +- {}", r.values[n - 1], r.stderr[n - 1]);
        }
        // Spawn tree: 0, 1 and the null player are children of player 2, the rest roots.
        let parents: Vec<i64> = (0..n).map(|i| if i < 2 || i == n - 1 { 2 } else { -1 }).collect();
        let options = ShapleyOptions { method: Method::Precedence, budget: Some(budget), seed, parents: Some(parents), ..Default::default() };
        let r = with(options, &game);
        prop_assert!(!r.exact);
        prop_assert!(within_noise(r.values[0], r.values[1], r.stderr[0], r.stderr[1]), "precedence: {:?} +- {:?}", r.values, r.stderr);
        // Every marginal contribution of a null player is zero, in every sampled ordering: its
        // stderr is the pooled floor, half the players' mean variance at most (sampling.rs), so
        // within the most uncertain player's.
        let most = r.stderr.iter().copied().fold(0.0, f64::max);
        prop_assert!(r.values[n - 1].abs() < 1e-12 && r.stderr[n - 1] <= most + 1e-15);
    }
}

#[test]
fn stratified_spends_its_whole_smallest_budget_and_refuses_less() {
    // Sizes 1 and n - 1 enumerated, two draws of each of the other n - 3: 2 + 2n + 2(n - 3).
    for n in [4, 10, 100, 300] {
        let game = SoumGame::random(n, 20, 3, 5).expect("game");
        let needed = (2 + 2 * n + 2 * (n - 3)) as u64;
        let result = run(&game, Method::Stratified, needed, 1);
        assert_eq!(result.evaluations, needed, "n = {n}");
        // Every size shows a spread: no player's value reads as exact.
        assert!(result.stderr.iter().all(|&e| e > 0.0), "n = {n}: {:?}", result.stderr);
        let options = ShapleyOptions { method: Method::Stratified, budget: Some(needed - 1), ..Default::default() };
        let refused = shapley(&game, &options).expect_err("one evaluation short");
        assert!(refused.to_string().contains(&format!("needs {needed} evaluations")), "{refused}");
    }
}
