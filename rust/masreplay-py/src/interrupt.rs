//! Ctrl-C during a long call. CPython runs signal handlers on the main thread only, when that
//! thread holds the interpreter lock and checks for them; a call that runs without the lock sees
//! none until it returns, seconds or minutes later. A long call therefore runs on a worker
//! thread under a core [`StopFlag`] while the calling thread waits in short slices and runs the
//! handlers between them. When a handler raises (KeyboardInterrupt, or whatever a custom handler
//! raises), the flag stops the work at its next poll, the worker is joined (nothing of it
//! outlives the call), and the handler's exception is raised. A handler that returns lets the
//! work go on.
//!
//! Small inputs run on the calling thread, as `py.detach` runs them: starting a thread costs
//! more than their work, and they end before a person notices the wait.

use std::sync::Mutex;
use std::sync::mpsc::{RecvTimeoutError, sync_channel};
use std::time::Duration;

use masreplay_core::interrupt::StopFlag;
use pyo3::prelude::*;

/// Inputs of fewer values than this (events, rows, evaluations) run on the calling thread.
pub const INLINE_BELOW: usize = 1 << 16;

/// How long the calling thread waits between two runs of the signal handlers.
const SLICE: Duration = Duration::from_millis(20);

/// The worker's stack: the main thread's usual 8 MiB, so that deep recursion (nested JSON)
/// has the room it had on the calling thread.
const WORKER_STACK: usize = 8 << 20;

/// Runs `work` without the interpreter lock, on a worker thread for an input of `size` values
/// or more; returns what it returned, or what a signal handler raised meanwhile (the work
/// is stopped and joined first). A panic in `work` resumes on the calling thread.
pub fn interruptible<T: Send>(py: Python<'_>, size: usize, work: impl FnOnce() -> T + Send) -> PyResult<T> {
    if size < INLINE_BELOW {
        return Ok(py.detach(work));
    }
    let flag = StopFlag::new();
    // Taken back to run inline if no thread can be started.
    let slot = Mutex::new(Some(work));
    let take = || slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
    std::thread::scope(|scope| {
        let (done, finished) = sync_channel::<()>(0);
        let worker = std::thread::Builder::new().name("masreplay-call".into()).stack_size(WORKER_STACK).spawn_scoped(
            scope,
            || {
                // Dropped when the work ends, however it ends: the wait below then stops.
                let _done = done;
                take().map(|work| flag.run(work))
            },
        );
        let Ok(worker) = worker else {
            return Ok(py.detach(|| take().map(|work| work())).expect("the work is taken once"));
        };
        let mut finished = finished;
        let raised = loop {
            let (receiver, waited) = py.detach(move || {
                let waited = finished.recv_timeout(SLICE);
                (finished, waited)
            });
            finished = receiver;
            if waited != Err(RecvTimeoutError::Timeout) {
                break None;
            }
            if let Err(raised) = py.check_signals() {
                flag.raise();
                break Some(raised);
            }
        };
        let outcome = py.detach(|| worker.join());
        match (raised, outcome) {
            (Some(raised), _) => Err(raised),
            (None, Ok(returned)) => Ok(returned.expect("the work is taken once")),
            (None, Err(panic)) => std::panic::resume_unwind(panic),
        }
    })
}

/// The size of Arrow input in values: its 8-byte words.
pub fn arrow_values(batches: &[arrow_array::RecordBatch]) -> usize {
    batches.iter().map(arrow_array::RecordBatch::get_array_memory_size).sum::<usize>() / 8
}

/// The size of JSON text in values: one per 16 bytes (a key, a number or a short string), so
/// that text under 1 MiB (a few milliseconds of parsing) runs inline.
pub fn json_values(bytes: &[u8]) -> usize {
    bytes.len() / 16
}

/// The size of Parquet files in values: their bytes (compressed, each holds several values).
pub fn file_values(paths: &[std::path::PathBuf]) -> usize {
    paths.iter().filter_map(|path| std::fs::metadata(path).ok()).map(|found| found.len() as usize).sum()
}

/// The size of `n_traces` simulated traces in values (a trace's events and their fields).
pub fn simulated_values(n_traces: usize) -> usize {
    n_traces.saturating_mul(256)
}
