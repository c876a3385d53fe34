//! Valuing a batch of coalitions while the estimator works on the values already in.
//!
//! A sequential game (a Python callable) is valued one chunk at a time on the calling thread,
//! where it holds the interpreter lock on one core. The estimator's work on the values of the
//! chunks already valued (per-player sums, Gram entries) runs meanwhile on a second thread, so
//! that with a core to spare the wall time approaches the game's own; the CPU time does not
//! change. The estimator sees the same values in the same order as when the whole batch is
//! valued first, so results do not depend on the pipelining. If the game fails, the worker
//! stops at its next chunk and is joined before the error is returned.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use super::coalition::Coalitions;
use super::game::Game;
use super::sampling::map_items;
use crate::bail;
use crate::error::Result;

/// The values of a batch, position by position, and how many distinct coalitions it held.
pub struct Valued {
    pub worth: Vec<f64>,
    pub distinct: usize,
}

/// Values every coalition of `batch` (each distinct one once, in chunks of the game's
/// preferred size) and calls `consume(&worth)` with the values of a growing prefix of the
/// batch (`worth[k]` the value of `batch.get(k)`); the last call has them all. For a
/// sequential game of several chunks `consume` runs on a worker thread while the calling
/// thread values the next chunk; otherwise once, on the calling thread, after the valuation.
pub fn value_streamed(game: &dyn Game, batch: &Coalitions, mut consume: impl FnMut(&[f64]) + Send) -> Result<Valued> {
    let (distinct, index) = distinct_of(batch);
    let chunk = game.preferred_batch().max(1);
    let pieces = distinct.len().div_ceil(chunk);
    let value_piece = |c: usize| -> Result<Vec<f64>> {
        let mut part = Coalitions::with_capacity(distinct.n_players(), chunk);
        (c * chunk..((c + 1) * chunk).min(distinct.len())).for_each(|i| part.push(distinct.get(i)));
        let values = game.values(&part)?;
        if values.len() != part.len() {
            bail!("the game returned {} values for {} coalitions", values.len(), part.len());
        }
        Ok(values)
    };
    if !game.sequential() || pieces <= 1 {
        let values: Vec<f64> = map_items(game.sequential(), pieces, value_piece)?.into_iter().flatten().collect();
        let worth: Vec<f64> = index.iter().map(|&k| values[k]).collect();
        consume(&worth);
        return Ok(Valued { worth, distinct: distinct.len() });
    }
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let (sender, receiver) = mpsc::channel::<Vec<f64>>();
        let (stop, index) = (&stop, &index);
        let worker = scope.spawn(move || {
            let mut values = Vec::with_capacity(index.len());
            let mut worth = Vec::with_capacity(index.len());
            for chunk in receiver {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                values.extend(chunk);
                // A position is known once its distinct coalition is: distinct coalitions are
                // numbered in order of first appearance, so the known positions are a prefix.
                let known = index[worth.len()..].iter().map_while(|&k| values.get(k).copied());
                worth.extend(known);
                consume(&worth);
            }
            worth
        });
        let mut failed = None;
        for c in 0..pieces {
            match value_piece(c) {
                Ok(values) => {
                    // A closed channel means the worker panicked: joining it below says so.
                    if sender.send(values).is_err() {
                        break;
                    }
                }
                Err(error) => {
                    stop.store(true, Ordering::Relaxed);
                    failed = Some(error);
                    break;
                }
            }
        }
        drop(sender);
        let worth = worker.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        match failed {
            Some(error) => Err(error),
            None => Ok(Valued { worth, distinct: distinct.len() }),
        }
    })
}

/// The distinct coalitions of `batch` in order of first appearance, and for each position of
/// the batch the number of its coalition among them.
fn distinct_of(batch: &Coalitions) -> (Coalitions, Vec<usize>) {
    let mut distinct = Coalitions::with_capacity(batch.n_players(), batch.len());
    let mut number: HashMap<&[u64], usize, foldhash::fast::FixedState> =
        HashMap::with_capacity_and_hasher(batch.len(), Default::default());
    let index = batch
        .iter()
        .map(|set| {
            let next = number.len();
            *number.entry(set).or_insert_with(|| {
                distinct.push(set);
                next
            })
        })
        .collect();
    (distinct, index)
}
