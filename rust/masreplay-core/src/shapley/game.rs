//! The game trait: the value of a batch of coalitions. Estimators only ever talk to this.

use super::coalition::Coalitions;
use crate::error::Result;

/// A cooperative game over players `0..n_players()`.
pub trait Game: Sync {
    fn n_players(&self) -> usize;

    /// The value of every coalition of the batch, in order.
    fn values(&self, coalitions: &Coalitions) -> Result<Vec<f64>>;

    /// Values of every prefix of `order` (`out[k]` = value of its first `k` players; `out`
    /// has `order.len() + 1` slots), for games that update a value player by player faster
    /// than they value a coalition from scratch. Returns false when the game cannot, and the
    /// estimator then values the prefixes as a batch.
    fn walk(&self, _order: &[u32], _out: &mut [f64]) -> bool {
        false
    }

    /// True when batches must be valued one at a time, in order, on the calling thread (a
    /// Python callable: threads would only queue for the interpreter lock, and the
    /// evaluation count of its cache would depend on their timing).
    fn sequential(&self) -> bool {
        false
    }

    /// Coalitions per batch the game prefers (a callable's chunk size).
    fn preferred_batch(&self) -> usize {
        4096
    }

    /// Distinct coalitions valued so far, for games that count them (caching games).
    fn evaluations(&self) -> Option<u64> {
        None
    }

    /// For a noisy game, where every coalition asked for is a fresh evaluation (asked twice,
    /// valued twice): the draws each request costs. None for a deterministic game, which
    /// values a coalition once however often an estimator asks for it.
    fn draws_per_request(&self) -> Option<u64> {
        None
    }
}

/// The bookkeeping methods of a game that plays another (`self.$inner`): how it is called,
/// what it counts and what a request costs are the inner game's.
macro_rules! forward_bookkeeping {
    ($inner:ident) => {
        fn sequential(&self) -> bool {
            self.$inner.sequential()
        }

        fn preferred_batch(&self) -> usize {
            self.$inner.preferred_batch()
        }

        fn evaluations(&self) -> Option<u64> {
            self.$inner.evaluations()
        }

        fn draws_per_request(&self) -> Option<u64> {
            self.$inner.draws_per_request()
        }
    };
}
pub(crate) use forward_bookkeeping;

/// The values of the empty and the grand coalition.
pub fn bounds(game: &dyn Game) -> Result<(f64, f64)> {
    let n = game.n_players();
    let mut batch = Coalitions::new(n);
    batch.push_empty();
    batch.push_players(0..n);
    let values = game.values(&batch)?;
    Ok((values[0], values[1]))
}

/// Values of the prefixes of several orders, `order.len() + 1` per order, walking where the
/// game can and batching otherwise.
pub fn prefix_values(game: &dyn Game, orders: &[Vec<u32>]) -> Result<Vec<f64>> {
    let n = game.n_players();
    let mut out = vec![0.0; orders.len() * (n + 1)];
    let mut walked = true;
    for (order, slot) in orders.iter().zip(out.chunks_exact_mut(n + 1)) {
        if !game.walk(order, slot) {
            walked = false;
            break;
        }
    }
    if walked {
        return Ok(out);
    }
    let mut batch = Coalitions::with_capacity(n, orders.len() * (n + 1));
    for order in orders {
        let mut set = vec![0u64; batch.words()];
        batch.push(&set);
        for &player in order {
            super::coalition::insert(&mut set, player as usize);
            batch.push(&set);
        }
    }
    game.values(&batch)
}
