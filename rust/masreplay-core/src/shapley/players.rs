//! Fixed and excluded players. A fixed player is always present (an orchestrator, a harness
//! the team cannot run without), an excluded one never: the estimators then play the game
//! among the other players, v'(S) = v(S + fixed), and spend no evaluation on coalitions that
//! lack a fixed player or hold an excluded one. Its Shapley values sum to
//! v(N - excluded) - v(fixed); fixed and excluded players get no credit (0, stderr 0).

use super::coalition::{Coalitions, contains, insert, words_for};
use super::game::{Game, forward_bookkeeping};
use super::{ShapleyOptions, ShapleyResult, Union, shapley};
use crate::error::{MasreplayError, Result};

/// What each player of the full game is in the game among the rest.
#[derive(Clone, Copy, PartialEq)]
enum Part {
    Fixed,
    Excluded,
    /// Its index among the free players.
    Free(u32),
}

/// The game among the free players: a coalition of them is valued with every fixed player
/// added, in the full game's numbering.
pub struct SubGame<'a> {
    inner: &'a dyn Game,
    /// Full-game index of each free player.
    free: Vec<usize>,
    /// The fixed players, as a coalition of the full game.
    base: Vec<u64>,
}

impl Game for SubGame<'_> {
    fn n_players(&self) -> usize {
        self.free.len()
    }

    fn values(&self, coalitions: &Coalitions) -> Result<Vec<f64>> {
        let mut full = Coalitions::with_capacity(self.inner.n_players(), coalitions.len());
        for set in coalitions.iter() {
            let row = full.push_empty();
            row.copy_from_slice(&self.base);
            for (p, &player) in self.free.iter().enumerate() {
                if contains(set, p) {
                    insert(row, player);
                }
            }
        }
        self.inner.values(&full)
    }

    forward_bookkeeping!(inner);
}

/// The part each of `n` players plays, checking the lists.
fn parts(n: usize, fixed: &[u32], exclude: &[u32]) -> Result<Vec<Part>> {
    let mut parts = vec![Part::Free(0); n];
    for (list, part, name) in [(fixed, Part::Fixed, "fixed"), (exclude, Part::Excluded, "exclude")] {
        for &p in list {
            let slot = parts.get_mut(p as usize).ok_or_else(|| {
                MasreplayError::InvalidArgument(format!("{name}: player {p} out of range for {n} players"))
            })?;
            if *slot != Part::Free(0) && *slot != part {
                return Err(MasreplayError::InvalidArgument(format!("player {p} is both fixed and excluded")));
            }
            *slot = part;
        }
    }
    let mut next = 0;
    for part in parts.iter_mut().filter(|part| matches!(part, Part::Free(_))) {
        *part = Part::Free(next);
        next += 1;
    }
    if next == 0 {
        return Err(MasreplayError::InvalidArgument("every player is fixed or excluded: nothing to credit".into()));
    }
    Ok(parts)
}

/// Parents among the free players: a fixed spawner is always present, so its children become
/// roots; an excluded spawner would keep its children out for good, which the caller must say.
fn free_parents(parents: &[i64], parts: &[Part]) -> Result<Vec<i64>> {
    let n = parts.len();
    if parents.len() != n {
        return Err(MasreplayError::InvalidArgument(format!(
            "parents has {} entries for a game of {n} players",
            parents.len()
        )));
    }
    let mut out = Vec::new();
    for (child, (&parent, &part)) in parents.iter().zip(parts).enumerate() {
        if !matches!(part, Part::Free(_)) {
            continue;
        }
        let parent_part = usize::try_from(parent).ok().and_then(|q| parts.get(q));
        out.push(match parent_part {
            Some(Part::Free(q)) => i64::from(*q),
            Some(Part::Excluded) => {
                return Err(MasreplayError::InvalidArgument(format!(
                    "player {child} was spawned by excluded player {parent}: exclude it too, or fix its spawner"
                )));
            }
            // A root, a fixed spawner, or an index out of range (reported as the forest's).
            Some(Part::Fixed) => -1,
            None if parent < 0 => -1,
            None => parent,
        });
    }
    Ok(out)
}

/// Unions among the free players: fixed and excluded players leave, and so do unions left empty.
fn free_unions(unions: &[Union], parts: &[Part]) -> Result<Vec<Union>> {
    let mut out = Vec::new();
    for union in unions {
        match union {
            Union::Player(p) => match parts.get(*p as usize) {
                Some(Part::Free(q)) => out.push(Union::Player(*q)),
                Some(_) => {}
                None => {
                    return Err(MasreplayError::InvalidArgument(format!(
                        "unions: player {p} out of range for {} players",
                        parts.len()
                    )));
                }
            },
            Union::Group(children) => {
                let kept = free_unions(children, parts)?;
                if !kept.is_empty() {
                    out.push(Union::Group(kept));
                }
            }
        }
    }
    Ok(out)
}

/// Shapley values of the game among the players neither fixed nor excluded, laid out over
/// all players of `game` (0 for the others).
pub(super) fn shapley_among_free(game: &dyn Game, options: &ShapleyOptions) -> Result<ShapleyResult> {
    let n = game.n_players();
    let parts = parts(n, &options.fixed, &options.exclude)?;
    let mut base = vec![0u64; words_for(n)];
    let mut free = Vec::new();
    for (p, part) in parts.iter().enumerate() {
        match part {
            Part::Fixed => insert(&mut base, p),
            Part::Free(_) => free.push(p),
            Part::Excluded => {}
        }
    }
    let sub = SubGame { inner: game, free, base };
    let local = ShapleyOptions {
        fixed: Vec::new(),
        exclude: Vec::new(),
        parents: options.parents.as_deref().map(|parents| free_parents(parents, &parts)).transpose()?,
        unions: options.unions.as_deref().map(|unions| free_unions(unions, &parts)).transpose()?,
        ..options.clone()
    };
    let result = shapley(&sub, &local)?;
    let mut values = vec![0.0; n];
    let mut stderr = vec![0.0; n];
    for (k, &p) in sub.free.iter().enumerate() {
        values[p] = result.values[k];
        stderr[p] = result.stderr[k];
    }
    Ok(ShapleyResult { values, stderr, ..result })
}

/// True when the options fix or exclude a player.
pub(super) fn any(options: &ShapleyOptions) -> bool {
    !options.fixed.is_empty() || !options.exclude.is_empty()
}
