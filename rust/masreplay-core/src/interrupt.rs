//! Stopping a long call early. A binding that can tell when its caller wants to stop (Python's
//! Ctrl-C) runs the call under a [`StopFlag`], and raises the flag from outside; the long loops
//! of the core poll it at their chunk, row or batch boundaries and return
//! [`MasreplayError::Interrupted`]. A call changes stored data only after its last poll, so an
//! interrupted call leaves everything as it was.
//!
//! The flag follows the call on the thread that runs it, rather than through every function's
//! arguments: a loop reads it there with [`checkpoint`], or takes a [`Checkpoint`] there to poll
//! from the pool's threads. Without a flag (every call of a program that never interrupts) a poll
//! reads an empty thread-local slot.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{MasreplayError, Result};

thread_local! {
    /// The flag of the call this thread runs, if it runs one under a flag.
    static CURRENT: RefCell<Option<Arc<AtomicBool>>> = const { RefCell::new(None) };
}

/// Raised from outside a call to ask it to stop.
#[derive(Clone, Debug, Default)]
pub struct StopFlag(Arc<AtomicBool>);

impl StopFlag {
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks the call run under this flag to stop at its next poll.
    pub fn raise(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Runs `work` on this thread with this flag as the one its loops poll.
    pub fn run<T>(&self, work: impl FnOnce() -> T) -> T {
        /// Puts the previous flag back however `work` ends (a panic included).
        struct Restore(Option<Arc<AtomicBool>>);
        impl Drop for Restore {
            fn drop(&mut self) {
                CURRENT.with(|current| *current.borrow_mut() = self.0.take());
            }
        }
        let _restore = Restore(CURRENT.with(|current| current.borrow_mut().replace(self.0.clone())));
        work()
    }
}

/// The flag of the call running on this thread, taken to poll it from other threads (a
/// parallel loop's closures, which run on the pool).
#[derive(Clone, Debug, Default)]
pub struct Checkpoint(Option<Arc<AtomicBool>>);

impl Checkpoint {
    /// The flag of the call this thread runs (none outside [`StopFlag::run`]).
    pub fn here() -> Self {
        Checkpoint(CURRENT.with(|current| current.borrow().clone()))
    }

    /// Whether there is a flag to poll (false on a call no one can interrupt).
    pub fn is_armed(&self) -> bool {
        self.0.is_some()
    }

    /// `Err(Interrupted)` once the flag is raised.
    #[inline]
    pub fn check(&self) -> Result<()> {
        stopped(self.0.as_deref())
    }
}

/// `Err(Interrupted)` once the flag of the call this thread runs is raised.
pub fn checkpoint() -> Result<()> {
    CURRENT.with(|current| stopped(current.borrow().as_deref()))
}

#[inline]
fn stopped(flag: Option<&AtomicBool>) -> Result<()> {
    match flag {
        Some(flag) if flag.load(Ordering::Relaxed) => Err(MasreplayError::Interrupted),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poll_sees_only_the_flag_of_its_own_call() {
        let flag = StopFlag::new();
        flag.raise();
        assert!(checkpoint().is_ok(), "no call runs under a flag here");
        assert!(matches!(flag.run(checkpoint), Err(MasreplayError::Interrupted)));
        let taken = flag.run(Checkpoint::here);
        assert!(taken.is_armed() && !Checkpoint::here().is_armed());
        assert!(std::thread::spawn(move || taken.check()).join().unwrap().is_err(), "taken to another thread");
        assert!(checkpoint().is_ok(), "the flag is put back when the call ends");
        assert!(StopFlag::new().run(checkpoint).is_ok(), "a flag not raised");
    }

    #[test]
    fn long_calls_stop_once_their_flag_is_raised() {
        use crate::TraceBatch;
        use crate::sim::{SimConfig, generate};
        let config = SimConfig { n_traces: 64, ..SimConfig::default() };
        let batch = TraceBatch::from_traces(&generate(&config).unwrap()).unwrap();
        let raised = StopFlag::new();
        raised.raise();
        let stopped = |outcome: Result<()>| matches!(outcome, Err(MasreplayError::Interrupted));
        assert!(stopped(raised.run(|| generate(&config).map(drop))));
        assert!(stopped(raised.run(|| TraceBatch::from_arrow(&[batch.record_batch().clone()]).map(drop))));
        assert!(stopped(raised.run(|| crate::metrics::metrics_table(&batch).map(drop))));
        let channel = "team";
        let baseline = crate::counterfactual::Baseline::LeaveOneOut;
        assert!(stopped(raised.run(|| crate::counterfactual::branch_credit(&batch, channel, baseline).map(drop))));
        let folder = std::env::temp_dir().join(format!("masreplay-interrupt-{}", std::process::id()));
        std::fs::create_dir_all(&folder).unwrap();
        let file = folder.join("batch.parquet");
        crate::store::write_parquet(batch.record_batch(), &file).unwrap();
        let files = [file];
        assert!(stopped(raised.run(|| TraceBatch::from_parquet_files(&files).map(drop))));
        let (read, _) = StopFlag::new().run(|| TraceBatch::from_parquet_files(&files)).unwrap();
        assert_eq!(read.record_batch(), batch.record_batch());
        std::fs::remove_dir_all(&folder).unwrap();
        // Not raised: the same calls run to the end.
        let (again, rejected) =
            StopFlag::new().run(|| TraceBatch::from_arrow(&[batch.record_batch().clone()])).unwrap();
        assert!(rejected.is_empty());
        assert_eq!(again.record_batch(), batch.record_batch());
    }

    #[test]
    fn the_flag_is_put_back_after_a_panic() {
        let flag = StopFlag::new();
        flag.raise();
        assert!(std::panic::catch_unwind(|| flag.run(|| panic!("in the call"))).is_err());
        assert!(checkpoint().is_ok());
    }
}
