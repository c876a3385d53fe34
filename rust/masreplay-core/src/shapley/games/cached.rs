//! A game whose values come from a batch callback (in practice a Python callable), with a
//! cache so that a coalition is valued once however often an estimator asks for it.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::bail;
use crate::error::Result;
use crate::shapley::coalition::{CoalitionMap, CoalitionSet, Coalitions};
use crate::shapley::game::Game;

pub struct CachedCallback<F> {
    n_players: usize,
    chunk: usize,
    callback: F,
    cache: Mutex<CoalitionMap<f64>>,
    evaluations: AtomicU64,
}

impl<F: Fn(&Coalitions) -> Result<Vec<f64>> + Sync> CachedCallback<F> {
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
            cache: Mutex::new(CoalitionMap::default()),
            evaluations: AtomicU64::new(0),
        })
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, CoalitionMap<f64>> {
        // A panic while holding the lock cannot leave a half-written entry behind.
        self.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl<F: Fn(&Coalitions) -> Result<Vec<f64>> + Sync> Game for CachedCallback<F> {
    fn n_players(&self) -> usize {
        self.n_players
    }

    fn values(&self, coalitions: &Coalitions) -> Result<Vec<f64>> {
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
        let mut start = 0;
        while start < missing.len() {
            let end = (start + self.chunk).min(missing.len());
            let mut part = Coalitions::with_capacity(self.n_players, end - start);
            (start..end).for_each(|i| part.push(missing.get(i)));
            let values = (self.callback)(&part)?;
            if values.len() != part.len() {
                bail!("the game returned {} values for {} coalitions", values.len(), part.len());
            }
            if let Some(bad) = values.iter().position(|v| !v.is_finite()) {
                bail!("the game returned a non-finite value ({}) for a coalition", values[bad]);
            }
            self.evaluations.fetch_add(part.len() as u64, Ordering::Relaxed);
            let mut cache = self.cache();
            for (set, value) in part.iter().zip(values) {
                cache.insert(set.to_vec(), value);
            }
            start = end;
        }
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
