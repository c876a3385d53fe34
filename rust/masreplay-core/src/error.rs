//! The one error type of the core. The binding crate maps each variant to a Python exception.

use std::fmt;

/// A trace that breaks the data contract: which trace, where (a JSON pointer into the trace,
/// e.g. `/events/3/type`), and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidationError {
    pub trace_id: Option<String>,
    pub path: String,
    pub reason: String,
}

impl ValidationError {
    pub fn new(trace_id: Option<&str>, path: impl Into<String>, reason: impl Into<String>) -> Self {
        ValidationError { trace_id: trace_id.map(str::to_owned), path: path.into(), reason: reason.into() }
    }
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let trace = self.trace_id.as_deref().unwrap_or("<unknown>");
        let path = if self.path.is_empty() { "/" } else { &self.path };
        write!(f, "trace {trace:?} at {path}: {}", self.reason)
    }
}

impl std::error::Error for ValidationError {}

#[derive(Debug, thiserror::Error)]
pub enum MasreplayError {
    #[error(transparent)]
    Validation(#[from] ValidationError),
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("Arrow: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    #[error("Parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    /// A file that is not readable data in the canonical layout (corrupted, truncated, ...).
    #[error("{path}: {reason}")]
    DataFormat { path: String, reason: String },
    /// A well-formed call with an argument outside its domain (an index past the end, ...).
    #[error("{0}")]
    InvalidArgument(String),
    /// A trace asked for by id that the buffer does not hold. Told apart from
    /// `InvalidArgument` so that a lookup racing an eviction is refused as the lookup of any
    /// absent trace is, whichever thread wins the buffer's lock.
    #[error("no trace {0:?} in the buffer")]
    TraceNotFound(String),
    /// An error raised by a function the caller handed in (a value function, a game),
    /// carried back unchanged: a binding puts its own error type in and takes it out again
    /// (Python's exception), so the core stays free of any binding's types.
    #[error("{0}")]
    Callback(Box<dyn std::error::Error + Send + Sync>),
    /// The call was asked to stop (see [`crate::interrupt`]) and stopped before changing
    /// anything.
    #[error("interrupted")]
    Interrupted,
}

/// `bail!("n_players must be at least 1, got {n}")` returns an `InvalidArgument` error (the
/// arguments are `format!`'s).
#[macro_export]
macro_rules! bail {
    ($($message:tt)+) => {
        return Err($crate::MasreplayError::InvalidArgument(format!($($message)+)))
    };
}

/// `ensure!(gamma <= 1.0, "gamma must be at most 1, got {gamma}")`: [`bail!`] unless the
/// condition holds.
#[macro_export]
macro_rules! ensure {
    ($condition:expr, $($message:tt)+) => {
        if !$condition {
            $crate::bail!($($message)+);
        }
    };
}

/// Per-input outcomes split into the accepted values and the (input position, error) of the
/// refused inputs, both in input order (how every skip-invalid reader reports).
pub fn split_outcomes<T, E>(outcomes: Vec<Result<T, E>>) -> (Vec<T>, Vec<(usize, E)>) {
    let mut accepted = Vec::with_capacity(outcomes.len());
    let mut refused = Vec::new();
    for (position, outcome) in outcomes.into_iter().enumerate() {
        match outcome {
            Ok(value) => accepted.push(value),
            Err(error) => refused.push((position, error)),
        }
    }
    (accepted, refused)
}

thread_local! {
    /// Set while [`catch_panic`] runs on this thread: the panic hook stays silent there.
    static CATCHING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` as a last resort against a dependency that panics on input it should refuse
/// (Arrow's importers on malformed schemas): the panic's message, for an error that names the
/// input. The panic hook does not report such a panic (a message and, with RUST_BACKTRACE, a
/// backtrace on stderr for what the caller turns into an input error); every other panic is
/// reported by the hook that was installed before, as it was.
pub fn catch_panic<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    static QUIET_HOOK: std::sync::Once = std::sync::Once::new();
    QUIET_HOOK.call_once(|| {
        let reporting = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !CATCHING.with(std::cell::Cell::get) {
                reporting(info);
            }
        }));
    });
    let outer = CATCHING.with(|catching| catching.replace(true));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    CATCHING.with(|catching| catching.set(outer));
    outcome.map_err(|payload| {
        let message =
            payload.downcast_ref::<String>().map(String::as_str).or_else(|| payload.downcast_ref::<&str>().copied());
        message.unwrap_or("no message").to_owned()
    })
}

pub type Result<T, E = MasreplayError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::{CATCHING, catch_panic};

    #[test]
    fn a_caught_panic_is_its_message_and_the_thread_reports_again_after() {
        assert_eq!(catch_panic(|| 7), Ok(7));
        assert_eq!(catch_panic::<()>(|| panic!("boom {}", 1)), Err("boom 1".to_owned()));
        assert_eq!(catch_panic(|| catch_panic::<()>(|| panic!("inner"))), Ok(Err("inner".to_owned())));
        assert!(!CATCHING.with(std::cell::Cell::get));
    }
}
