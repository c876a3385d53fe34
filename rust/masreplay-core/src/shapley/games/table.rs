//! A game given by its table of values: dense over all 2^n coalitions (index = bitmask of
//! the players) or sparse (listed coalitions; every other coalition is worth `default`).

use std::collections::HashMap;

use crate::bail;
use crate::error::Result;
use crate::limit::{IN_RANGE, in_range};
use crate::shapley::coalition::{Coalitions, words_for};
use crate::shapley::game::Game;

/// The most players a dense table may have (2^30 values are 8 GiB).
pub const MAX_DENSE_PLAYERS: usize = 30;

#[derive(Clone, Debug)]
pub enum TableGame {
    Dense { n_players: usize, values: Vec<f64> },
    Sparse { n_players: usize, values: HashMap<Vec<u64>, f64>, default: f64 },
}

impl TableGame {
    /// Checked before anything is copied: a table of the wrong length costs nothing.
    pub fn dense(values: &[f64]) -> Result<Self> {
        let len = values.len();
        if len < 2 || !len.is_power_of_two() || len.trailing_zeros() as usize > MAX_DENSE_PLAYERS {
            bail!("table: a dense table needs 2^n values (n in 1..={MAX_DENSE_PLAYERS}), got {len}");
        }
        if let Some(i) = values.iter().position(|&v| !in_range(v)) {
            bail!("table: value {i} must be {IN_RANGE}, got {:e}", values[i]);
        }
        Ok(TableGame::Dense { n_players: len.trailing_zeros() as usize, values: values.to_vec() })
    }

    /// `entries` are (players, value); a coalition listed twice is an error.
    pub fn sparse(n_players: usize, entries: Vec<(Vec<u32>, f64)>, default: f64) -> Result<Self> {
        if n_players == 0 {
            bail!("table: n_players must be at least 1");
        }
        let mut values = HashMap::with_capacity(entries.len());
        for (players, value) in entries {
            super::check_players("table", n_players, &players)?;
            if !in_range(value) {
                bail!("table: the value of {players:?} must be {IN_RANGE}, got {value:e}");
            }
            let mut set = vec![0u64; words_for(n_players)];
            for &p in &players {
                crate::shapley::coalition::insert(&mut set, p as usize);
            }
            if values.insert(set, value).is_some() {
                bail!("table: coalition {players:?} is listed twice");
            }
        }
        Ok(TableGame::Sparse { n_players, values, default })
    }
}

impl Game for TableGame {
    fn n_players(&self) -> usize {
        match self {
            TableGame::Dense { n_players, .. } | TableGame::Sparse { n_players, .. } => *n_players,
        }
    }

    fn values(&self, coalitions: &Coalitions) -> Result<Vec<f64>> {
        Ok(match self {
            TableGame::Dense { values, .. } => coalitions.iter().map(|set| values[set[0] as usize]).collect(),
            TableGame::Sparse { values, default, .. } => {
                coalitions.iter().map(|set| values.get(set).copied().unwrap_or(*default)).collect()
            }
        })
    }
}
