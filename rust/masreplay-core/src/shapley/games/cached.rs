//! A game whose values come from a batch callback (in practice a Python callable), with a
//! cache so that a coalition is valued once however often an estimator asks for it, and
//! optionally a canonical form under which coalitions that play the same are valued once
//! (absent players fall back to a default: an orchestrator without its workers plays as
//! nobody).

use std::borrow::Cow;
use std::hash::BuildHasher;
use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use foldhash::fast::FixedState;
use hashbrown::HashTable;

use crate::bail;
use crate::error::Result;
use crate::limit::check_game_values;
use crate::shapley::MAX_PLAYERS;
use crate::shapley::coalition::Coalitions;
use crate::shapley::game::Game;

/// Maps each coalition of a batch to the coalition it plays as.
pub type Canonical<'a> = Box<dyn Fn(&Coalitions) -> Result<Coalitions> + Sync + 'a>;

pub struct CachedCallback<'a, F> {
    n_players: usize,
    chunk: usize,
    callback: F,
    canonical: Option<Canonical<'a>>,
    /// Every row a fresh evaluation, nothing cached (a noisy game).
    fresh: bool,
    cache: Mutex<Cache>,
    evaluations: AtomicU64,
}

/// The coalitions valued so far, numbered in order, and their values: a coalition asked for
/// is hashed once, to find its number or to give it the next one.
struct Cache {
    numbers: HashTable<usize>,
    hasher: FixedState,
    sets: Coalitions,
    values: Vec<f64>,
}

impl Cache {
    fn new(n_players: usize) -> Self {
        Cache {
            numbers: HashTable::new(),
            hasher: FixedState::default(),
            sets: Coalitions::new(n_players),
            values: Vec::new(),
        }
    }

    /// The number of `set`, numbering it next when it is new.
    fn number(&mut self, set: &[u64]) -> usize {
        let Cache { numbers, hasher, sets, .. } = self;
        let hash = hasher.hash_one(set);
        if let Some(&k) = numbers.find(hash, |&k| sets.get(k) == set) {
            return k;
        }
        let k = sets.len();
        sets.push(set);
        numbers.insert_unique(hash, k, |&k| hasher.hash_one(sets.get(k)));
        k
    }

    /// Forgets the coalitions numbered from `known` on (their valuation failed).
    fn forget_from(&mut self, known: usize) {
        self.numbers.retain(|k| *k < known);
        self.sets.truncate(known);
        self.values.truncate(known);
    }
}

impl<'a, F: Fn(&Coalitions) -> Result<Vec<f64>> + Sync> CachedCallback<'a, F> {
    /// `callback` receives at most `chunk` distinct, not yet valued coalitions per call.
    pub fn new(n_players: usize, chunk: usize, callback: F) -> Result<Self> {
        if !(1..=MAX_PLAYERS).contains(&n_players) {
            bail!("n_players must be in 1..={MAX_PLAYERS}, got {n_players}");
        }
        if chunk == 0 {
            bail!("chunk_size must be at least 1");
        }
        Ok(CachedCallback {
            n_players,
            chunk,
            callback,
            canonical: None,
            fresh: false,
            cache: Mutex::new(Cache::new(n_players)),
            evaluations: AtomicU64::new(0),
        })
    }

    /// Values each coalition as `canonical` maps it: coalitions with the same image are
    /// valued once, and count as one evaluation.
    pub fn with_canonical(mut self, canonical: Canonical<'a>) -> Self {
        self.canonical = Some(canonical);
        self
    }

    /// Values every row asked for afresh, repeats included: a noisy callable, each call a new
    /// rollout.
    pub fn fresh(mut self) -> Self {
        self.fresh = true;
        self
    }

    /// Calls the callback on the coalitions `rows` of `coalitions`, at most `chunk` at a time,
    /// checking what it returns.
    fn call(&self, coalitions: &Coalitions, rows: Range<usize>) -> Result<Vec<f64>> {
        let mut out = Vec::with_capacity(rows.len());
        let mut start = rows.start;
        while start < rows.end {
            let end = (start + self.chunk).min(rows.end);
            let part = coalitions.slice(start..end);
            let values = (self.callback)(&part)?;
            if values.len() != part.len() {
                bail!("the game returned {} values for {} coalitions", values.len(), part.len());
            }
            check_game_values(&values, "the game", "a coalition")?;
            self.evaluations.fetch_add(part.len() as u64, Ordering::Relaxed);
            out.extend(values);
            start = end;
        }
        Ok(out)
    }

    /// The coalitions the cache is keyed by: `coalitions`, or their canonical forms.
    fn keys<'c>(&self, coalitions: &'c Coalitions) -> Result<Cow<'c, Coalitions>> {
        let Some(canonical) = &self.canonical else { return Ok(Cow::Borrowed(coalitions)) };
        let mapped = canonical(coalitions)?;
        if mapped.len() != coalitions.len() || mapped.n_players() != self.n_players {
            bail!(
                "canonical returned {} coalitions of {} players for {} of {}",
                mapped.len(),
                mapped.n_players(),
                coalitions.len(),
                self.n_players
            );
        }
        Ok(Cow::Owned(mapped))
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        // A panic while holding the lock cannot leave a half-written entry behind.
        self.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl<F: Fn(&Coalitions) -> Result<Vec<f64>> + Sync> Game for CachedCallback<'_, F> {
    fn n_players(&self) -> usize {
        self.n_players
    }

    fn values(&self, coalitions: &Coalitions) -> Result<Vec<f64>> {
        if self.fresh {
            return self.call(coalitions, 0..coalitions.len());
        }
        let keys = self.keys(coalitions)?;
        // Held through the valuation: batches of one game are valued one after another.
        let mut cache = self.cache();
        let known = cache.values.len();
        let numbers: Vec<usize> = keys.iter().map(|set| cache.number(set)).collect();
        match self.call(&cache.sets, known..cache.sets.len()) {
            Ok(values) => cache.values.extend(values),
            Err(error) => {
                cache.forget_from(known);
                return Err(error);
            }
        }
        Ok(numbers.iter().map(|&k| cache.values[k]).collect())
    }

    fn sequential(&self) -> bool {
        true
    }

    fn preferred_batch(&self) -> usize {
        self.chunk
    }

    fn evaluations(&self) -> Option<u64> {
        Some(self.evaluations.load(Ordering::Relaxed))
    }
}
