//! A game whose values come from a batch callback (in practice a Python callable), with a
//! cache so that a coalition is valued once however often an estimator asks for it, and
//! optionally a canonical form under which coalitions that play the same are valued once
//! (absent players fall back to a default: an orchestrator without its workers plays as
//! nobody).

use std::borrow::Cow;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::bail;
use crate::error::Result;
use crate::shapley::coalition::{CoalitionMap, CoalitionSet, Coalitions};
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
    cache: Mutex<CoalitionMap<f64>>,
    evaluations: AtomicU64,
}

impl<'a, F: Fn(&Coalitions) -> Result<Vec<f64>> + Sync> CachedCallback<'a, F> {
    /// `callback` receives at most `chunk` distinct, not yet valued coalitions per call.
    pub fn new(n_players: usize, chunk: usize, callback: F) -> Result<Self> {
        if n_players == 0 {
            bail!("n_players must be at least 1");
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
            cache: Mutex::new(CoalitionMap::default()),
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

    /// Calls the callback on `coalitions`, at most `chunk` at a time, checking what it returns.
    fn call(&self, coalitions: &Coalitions) -> Result<Vec<f64>> {
        let mut out = Vec::with_capacity(coalitions.len());
        let mut start = 0;
        while start < coalitions.len() {
            let end = (start + self.chunk).min(coalitions.len());
            let mut part = Coalitions::with_capacity(self.n_players, end - start);
            (start..end).for_each(|i| part.push(coalitions.get(i)));
            let values = (self.callback)(&part)?;
            if values.len() != part.len() {
                bail!("the game returned {} values for {} coalitions", values.len(), part.len());
            }
            if let Some(bad) = values.iter().position(|v| !v.is_finite()) {
                bail!("the game returned a non-finite value ({}) for a coalition", values[bad]);
            }
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

    fn cache(&self) -> std::sync::MutexGuard<'_, CoalitionMap<f64>> {
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
            return self.call(coalitions);
        }
        let keys = self.keys(coalitions)?;
        let coalitions = keys.as_ref();
        let mut missing = Coalitions::new(self.n_players);
        {
            let cache = self.cache();
            let mut queued = CoalitionSet::default();
            for set in coalitions.iter() {
                if !cache.contains_key(set) && queued.insert(set) {
                    missing.push(set);
                }
            }
        }
        let values = self.call(&missing)?;
        let mut cache = self.cache();
        for (set, value) in missing.iter().zip(values) {
            cache.insert(set.to_vec(), value);
        }
        drop(cache);
        let cache = self.cache();
        Ok(coalitions.iter().map(|set| cache[set]).collect())
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
