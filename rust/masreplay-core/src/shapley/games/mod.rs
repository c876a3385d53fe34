//! Native games: closed-form test games (SOUM), tables, additive and weighted-voting games,
//! the empirical game of logged traces, the permission (restricted) game of a spawn forest,
//! and a cached batch callback (the shape a Python callable takes).

mod cached;
mod empirical;
mod restricted;
mod simple;
mod soum;
mod table;

pub use cached::{CachedCallback, Canonical};
pub use empirical::EmpiricalGame;
pub use restricted::RestrictedGame;
pub use simple::{AdditiveGame, WeightedVotingGame};
pub use soum::SoumGame;
pub use table::TableGame;

use crate::bail;
use crate::error::Result;

/// Checks that a game has at least one player and every index is in range.
fn check_players(what: &str, n_players: usize, players: &[u32]) -> Result<()> {
    if let Some(&bad) = players.iter().find(|&&p| p as usize >= n_players) {
        bail!("{what}: player {bad} out of range for {n_players} players");
    }
    Ok(())
}
