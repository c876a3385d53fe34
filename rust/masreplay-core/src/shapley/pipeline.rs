//! Drawing and summing coalitions while the game values them.
//!
//! A sequential game (a Python callable) is valued one chunk at a time on the calling thread,
//! where it holds the interpreter lock on one core. The estimator's own work runs meanwhile
//! on a second thread: drawing the coalitions (each chunk goes to the game as soon as it is
//! drawn) and then summing the values of the chunks already valued (per-player sums, Gram
//! entries). With a core to spare the wall time approaches the game's own; the CPU time does
//! not change. The game gets the same chunks, and the estimator sees the same values in the
//! same order, as when the whole batch is drawn and valued first: results do not depend on
//! the pipelining. If the game fails, the worker stops and is joined before the error is
//! returned.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use foldhash::fast::FixedState;
use hashbrown::HashTable;

use super::coalition::Coalitions;
use super::game::Game;
use super::sampling::map_items;
use crate::bail;
use crate::error::{MasreplayError, Result};
use crate::interrupt::Checkpoint;

/// The coalitions an estimator draws, in order, with the distinct ones numbered in order of
/// first appearance and handed to the game `chunk` at a time as they fill up. For a noisy game
/// (every request a fresh draw) each position is a coalition of its own: two draws of one
/// coalition are two independent evaluations, not one value read twice.
pub struct Sink {
    chunk: usize,
    fresh: bool,
    batch: Coalitions,
    distinct: Coalitions,
    numbers: HashTable<usize>,
    hasher: FixedState,
    /// The number of each position's coalition among the distinct ones.
    index: Vec<usize>,
    /// Distinct coalitions already handed out.
    sent: usize,
    out: Option<mpsc::Sender<Coalitions>>,
    /// The flag of the call, polled every [`POLL_EVERY`] pushes: drawing 10^8 coalitions takes
    /// half a minute before the game values the first.
    checkpoint: Checkpoint,
    stopped: bool,
}

/// Pushes between two polls of the call's stop flag (a few milliseconds of drawing).
const POLL_EVERY: usize = 1 << 14;

/// Most coalitions a sink reserves room for up front: `planned` is an upper bound (a budget
/// far beyond what can be drawn must not reserve memory for all of it); past this the
/// vectors grow as they fill.
const MOST_RESERVED: usize = 1 << 20;

impl Sink {
    fn new(
        n_players: usize,
        fresh: bool,
        chunk: usize,
        capacity: usize,
        out: Option<mpsc::Sender<Coalitions>>,
        checkpoint: Checkpoint,
    ) -> Self {
        let capacity = capacity.min(MOST_RESERVED);
        Sink {
            chunk,
            fresh,
            batch: Coalitions::with_capacity(n_players, capacity),
            distinct: Coalitions::with_capacity(n_players, capacity),
            numbers: HashTable::with_capacity(capacity),
            hasher: FixedState::default(),
            index: Vec::with_capacity(capacity),
            sent: 0,
            out,
            checkpoint,
            stopped: false,
        }
    }

    /// Whether the call was interrupted while drawing: later pushes are dropped, the draw
    /// loop may end early, and the valuation returns [`MasreplayError::Interrupted`].
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    pub fn n_players(&self) -> usize {
        self.batch.n_players()
    }

    /// Words per coalition.
    pub fn words(&self) -> usize {
        self.batch.words()
    }

    /// The coalitions so far, position by position.
    pub fn batch(&self) -> &Coalitions {
        &self.batch
    }

    pub fn push(&mut self, set: &[u64]) {
        if self.stopped || (self.batch.len().is_multiple_of(POLL_EVERY) && self.checkpoint.check().is_err()) {
            self.stopped = true;
            return;
        }
        let number = if self.fresh {
            self.distinct.push(set);
            self.distinct.len() - 1
        } else {
            self.number_of(set)
        };
        self.batch.push(set);
        self.index.push(number);
        if self.distinct.len() - self.sent >= self.chunk {
            self.hand_out();
        }
    }

    /// The number of `set` among the distinct coalitions, a new one if it is new.
    fn number_of(&mut self, set: &[u64]) -> usize {
        let Sink { numbers, distinct, hasher, .. } = self;
        let hash = hasher.hash_one(set);
        match numbers.find(hash, |&k| distinct.get(k) == set) {
            Some(&k) => k,
            None => {
                let k = distinct.len();
                distinct.push(set);
                numbers.insert_unique(hash, k, |&k| hasher.hash_one(distinct.get(k)));
                k
            }
        }
    }

    /// Sends the distinct coalitions not yet sent (when valued in a pipeline). A closed
    /// channel means the valuation stopped: what is drawn after it is never valued.
    fn hand_out(&mut self) {
        if self.sent == self.distinct.len() {
            return;
        }
        if let Some(out) = &self.out {
            let mut piece = Coalitions::with_capacity(self.distinct.n_players(), self.distinct.len() - self.sent);
            (self.sent..self.distinct.len()).for_each(|k| piece.push(self.distinct.get(k)));
            if out.send(piece).is_err() {
                self.out = None;
            }
        }
        self.sent = self.distinct.len();
    }
}

/// The values of a batch, position by position, and how many distinct coalitions it held.
pub struct Valued {
    pub worth: Vec<f64>,
    pub distinct: usize,
}

/// Values the coalitions `draw` puts into its sink (at most about `planned` of them), each
/// distinct one once, in chunks of the game's preferred size, and calls `consume(state,
/// batch, worth)` with the values of a growing prefix of the batch (`worth[k]` the value of
/// `batch.get(k)`); the batch is drawn in full before the first call (msr builds its Gram
/// matrices from it then), and the last call has every value. For a sequential game of more
/// than one chunk `draw` and `consume` run on a worker thread while the calling thread values
/// the chunks; otherwise on the calling thread, `consume` once after the valuation.
pub fn value_streamed<S: Send>(
    game: &dyn Game,
    planned: usize,
    state: &mut S,
    draw: impl FnOnce(&mut S, &mut Sink) + Send,
    mut consume: impl FnMut(&mut S, &Coalitions, &[f64]) + Send,
) -> Result<Valued> {
    let (n, chunk) = (game.n_players(), game.preferred_batch().max(1));
    let fresh = game.draws_per_request().is_some();
    let value_piece = |piece: &Coalitions| -> Result<Vec<f64>> {
        let values = game.values(piece)?;
        if values.len() != piece.len() {
            bail!("the game returned {} values for {} coalitions", values.len(), piece.len());
        }
        Ok(values)
    };
    // Taken here: the draw may run on a worker thread, which has no flag of its own.
    let checkpoint = Checkpoint::here();
    if !game.sequential() || planned <= chunk {
        let mut sink = Sink::new(n, fresh, chunk, planned, None, checkpoint);
        draw(state, &mut sink);
        if sink.stopped {
            return Err(MasreplayError::Interrupted);
        }
        let pieces = sink.distinct.len().div_ceil(chunk);
        let values: Vec<f64> = map_items(game.sequential(), pieces, |c| {
            let mut piece = Coalitions::with_capacity(n, chunk);
            (c * chunk..((c + 1) * chunk).min(sink.distinct.len())).for_each(|k| piece.push(sink.distinct.get(k)));
            value_piece(&piece)
        })?
        .into_iter()
        .flatten()
        .collect();
        let worth: Vec<f64> = sink.index.iter().map(|&k| values[k]).collect();
        consume(state, &sink.batch, &worth);
        return Ok(Valued { worth, distinct: sink.distinct.len() });
    }
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let (pieces_out, pieces_in) = mpsc::channel::<Coalitions>();
        let (values_out, values_in) = mpsc::channel::<Vec<f64>>();
        let stop = &stop;
        let worker = scope.spawn(move || {
            let mut sink = Sink::new(n, fresh, chunk, planned, Some(pieces_out), checkpoint);
            draw(state, &mut sink);
            sink.hand_out();
            // Closing the channel tells the calling thread that nothing more is coming.
            sink.out = None;
            let (mut values, mut worth) =
                (Vec::with_capacity(sink.distinct.len()), Vec::with_capacity(sink.index.len()));
            for piece in values_in {
                // An interrupted draw is never summed (its batch is not whole).
                if stop.load(Ordering::Relaxed) || sink.stopped {
                    break;
                }
                values.extend(piece);
                // A position is known once its distinct coalition is: distinct coalitions are
                // numbered in order of first appearance, so the known positions are a prefix.
                let known = sink.index[worth.len()..].iter().map_while(|&k| values.get(k).copied());
                worth.extend(known);
                consume(state, &sink.batch, &worth);
            }
            (worth, sink.distinct.len(), sink.stopped)
        });
        let mut failed = None;
        for piece in pieces_in.iter() {
            match value_piece(&piece) {
                Ok(values) => {
                    // A closed channel means the worker panicked: joining it below says so.
                    if values_out.send(values).is_err() {
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
        drop((pieces_in, values_out));
        let (worth, distinct, stopped) = worker.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        match failed {
            Some(error) => Err(error),
            None if stopped => Err(MasreplayError::Interrupted),
            None => Ok(Valued { worth, distinct }),
        }
    })
}

/// [`value_streamed`] of a batch drawn beforehand.
pub fn value_drawn<S: Send>(
    game: &dyn Game,
    batch: &Coalitions,
    state: &mut S,
    consume: impl FnMut(&mut S, &Coalitions, &[f64]) + Send,
) -> Result<Valued> {
    value_streamed(game, batch.len(), state, |_, sink| batch.iter().for_each(|set| sink.push(set)), consume)
}
