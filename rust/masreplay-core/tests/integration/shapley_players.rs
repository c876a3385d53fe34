//! Fixed and excluded players, and canonical forms of coalitions: the game among the free
//! players, its efficiency target v(N - excluded) - v(fixed), the spawn tree and unions
//! carried over, evaluation counts, and bad input.

use masreplay_core::shapley::coalition::{Coalitions, contains};
use masreplay_core::shapley::games::{CachedCallback, SoumGame, TableGame};
use masreplay_core::shapley::{Game, Method, ShapleyOptions, Union, shapley};
use masreplay_core::{MasreplayError, Result};

fn value_of(game: &dyn Game, players: &[usize]) -> f64 {
    let mut batch = Coalitions::new(game.n_players());
    batch.push_players(players.iter().copied());
    game.values(&batch).expect("values")[0]
}

/// The dense table of `game` restricted to `free` players, with `fixed` always added.
fn subgame_table(game: &dyn Game, free: &[usize], fixed: &[usize]) -> TableGame {
    let values: Vec<f64> = (0..1u64 << free.len())
        .map(|mask| {
            let mut members: Vec<usize> = fixed.to_vec();
            members.extend(free.iter().enumerate().filter(|(k, _)| mask >> k & 1 == 1).map(|(_, &p)| p));
            value_of(game, &members)
        })
        .collect();
    TableGame::dense(&values).expect("table")
}

fn exact(game: &dyn Game, options: ShapleyOptions) -> Vec<f64> {
    shapley(game, &ShapleyOptions { method: Method::Exact, ..options }).expect("shapley runs").values
}

fn assert_close(a: &[f64], b: &[f64]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() < 1e-9, "{a:?}\n{b:?}");
    }
}

#[test]
fn fixed_and_excluded_players_leave_the_game_among_the_rest() {
    let game = SoumGame::random(7, 30, 7, 3).expect("soum");
    for seed in 0..4u64 {
        let fixed = vec![(seed % 7) as u32];
        let exclude = vec![((seed + 3) % 7) as u32, ((seed + 5) % 7) as u32];
        let free: Vec<usize> =
            (0..7).filter(|p| !fixed.contains(&(*p as u32)) && !exclude.contains(&(*p as u32))).collect();
        let fixed_players: Vec<usize> = fixed.iter().map(|&p| p as usize).collect();
        let expected = exact(&subgame_table(&game, &free, &fixed_players), ShapleyOptions::default());
        let options = ShapleyOptions { fixed: fixed.clone(), exclude: exclude.clone(), ..Default::default() };
        let got = exact(&game, options.clone());
        let picked: Vec<f64> = free.iter().map(|&p| got[p]).collect();
        assert_close(&picked, &expected);
        for p in fixed.iter().chain(&exclude) {
            assert_eq!(got[*p as usize], 0.0);
        }
        // Efficiency against v(N - excluded) - v(fixed), for the sampled estimators too.
        let target = value_of(&game, &free.iter().chain(&fixed_players).copied().collect::<Vec<_>>())
            - value_of(&game, &fixed_players);
        for method in [Method::Permutation, Method::Kernel, Method::Auto] {
            let result =
                shapley(&game, &ShapleyOptions { method, budget: Some(200), seed, ..options.clone() }).expect("runs");
            assert!((result.values.iter().sum::<f64>() - target).abs() < 1e-9);
        }
    }
}

#[test]
fn a_fixed_spawner_frees_its_children_and_an_excluded_one_is_refused() {
    // Player 0 orchestrates 1..4; 4 also spawned 5.
    let game = SoumGame::random(6, 25, 6, 9).expect("soum");
    let parents = vec![-1, 0, 0, 0, 0, 4];
    let options = ShapleyOptions {
        method: Method::Precedence,
        parents: Some(parents.clone()),
        fixed: vec![0],
        ..Default::default()
    };
    let got = shapley(&game, &options).expect("runs").values;
    // Among 1..5 with 0 present, the tree is 1, 2, 3, 4 roots and 5 under 4.
    let table = subgame_table(&game, &[1, 2, 3, 4, 5], &[0]);
    let sub =
        ShapleyOptions { method: Method::Precedence, parents: Some(vec![-1, -1, -1, -1, 3]), ..Default::default() };
    let expected = shapley(&table, &sub).expect("runs").values;
    assert_close(&got[1..], &expected);
    let refused = shapley(&game, &ShapleyOptions { exclude: vec![4], ..options });
    assert!(matches!(refused, Err(MasreplayError::InvalidArgument(m)) if m.contains("excluded player 4")));
}

#[test]
fn unions_lose_their_fixed_members() {
    let game = SoumGame::random(6, 25, 6, 4).expect("soum");
    let unions = vec![
        Union::Group(vec![Union::Player(0), Union::Player(1)]),
        Union::Group(vec![Union::Player(2), Union::Group(vec![Union::Player(3), Union::Player(4)])]),
    ];
    let options =
        ShapleyOptions { method: Method::Owen, unions: Some(unions), fixed: vec![0, 3, 4], ..Default::default() };
    let got = shapley(&game, &options).expect("runs").values;
    // Left: {1} and {2}, and 5 alone: the Owen value of singletons is the Shapley value.
    let expected = exact(&subgame_table(&game, &[1, 2, 5], &[0, 3, 4]), ShapleyOptions::default());
    assert_close(&[got[1], got[2], got[5]], &expected);
}

#[test]
fn bad_fixed_and_excluded_players_are_refused() {
    let game = SoumGame::random(4, 5, 4, 1).expect("soum");
    for (fixed, exclude, says) in [
        (vec![4], vec![], "out of range"),
        (vec![1], vec![1], "both fixed and excluded"),
        (vec![0, 1], vec![2, 3], "nothing to credit"),
    ] {
        let outcome = shapley(&game, &ShapleyOptions { fixed, exclude, ..Default::default() });
        assert!(matches!(&outcome, Err(MasreplayError::InvalidArgument(m)) if m.contains(says)), "{says}");
    }
}

/// Orchestrator 0 and workers 1..=k; without any worker the team does what nobody does.
fn team_value(set: &[u64], k: usize) -> f64 {
    let workers = (1..=k).filter(|&p| contains(set, p)).count() as f64;
    if workers == 0.0 { 0.0 } else { workers + if contains(set, 0) { 2.0 } else { 0.5 } }
}

#[test]
fn coalitions_with_the_same_canonical_form_are_valued_once() {
    let k = 4;
    let rows = std::sync::atomic::AtomicU64::new(0);
    let value = |batch: &Coalitions| -> Result<Vec<f64>> {
        rows.fetch_add(batch.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(batch.iter().map(|set| team_value(set, k)).collect())
    };
    let options = ShapleyOptions { parents: Some(vec![-1, 0, 0, 0, 0]), ..Default::default() };
    let plain = CachedCallback::new(k + 1, 64, value).expect("game");
    let before = shapley(&plain, &options).expect("runs");
    assert_eq!(before.evaluations, 17);
    // The orchestrator counts only alongside a worker.
    let canonical = |batch: &Coalitions| -> Result<Coalitions> {
        let mut out = Coalitions::new(batch.n_players());
        for set in batch.iter() {
            let alone = (1..=k).all(|p| !contains(set, p));
            out.push_players((0..=k).filter(|&p| contains(set, p) && !alone));
        }
        Ok(out)
    };
    rows.store(0, std::sync::atomic::Ordering::Relaxed);
    let folded = CachedCallback::new(k + 1, 64, value).expect("game").with_canonical(Box::new(canonical));
    let after = shapley(&folded, &options).expect("runs");
    assert_eq!(after.evaluations, 16);
    assert_eq!(rows.load(std::sync::atomic::Ordering::Relaxed), 16);
    assert_close(&after.values, &before.values);
    // Fixing the orchestrator spends 16 as well.
    let fixed = CachedCallback::new(k + 1, 64, value).expect("game");
    assert_eq!(shapley(&fixed, &ShapleyOptions { fixed: vec![0], ..options }).expect("runs").evaluations, 16);
}

#[test]
fn a_canonical_form_of_the_wrong_shape_is_refused() {
    let game = CachedCallback::new(3, 8, |b: &Coalitions| Ok(vec![1.0; b.len()]))
        .expect("game")
        .with_canonical(Box::new(|_: &Coalitions| Ok(Coalitions::new(3))));
    let outcome = shapley(&game, &ShapleyOptions::default());
    assert!(matches!(outcome, Err(MasreplayError::InvalidArgument(m)) if m.contains("canonical returned")));
}
