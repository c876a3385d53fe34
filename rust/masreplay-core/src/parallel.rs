//! When a parallel loop pays for rayon's hand-off.
//!
//! A parallel loop started on a thread outside rayon's pool (every call from Python) injects
//! its job into the pool and sleeps until a worker has run it: wake-ups that cost tens of
//! microseconds, more than the work of a batch of a few traces (a rollout worker adds 8 at a
//! time). Loops over such small inputs run on the calling thread instead. A parallel iterator
//! whose pieces may not be shorter than `usize::MAX` is never split, and rayon runs an unsplit
//! iterator in place, without the hand-off.

/// Inputs of fewer values than this (traces, events, array slots) are not worth the pool.
pub const SEQUENTIAL_BELOW: usize = 1 << 12;

/// The shortest piece a parallel loop over an input of `values` values may be split into:
/// never split (run on the calling thread) below [`SEQUENTIAL_BELOW`], else any.
pub fn min_piece(values: usize) -> usize {
    if values < SEQUENTIAL_BELOW { usize::MAX } else { 1 }
}

/// The shortest piece, in items, of a parallel loop over `items` items (traces) holding
/// `values` values (events) in all: pieces of [`SEQUENTIAL_BELOW`] values or more on average,
/// so that a loop over fewer than twice that many values runs on the calling thread.
pub fn min_items(items: usize, values: usize) -> usize {
    (SEQUENTIAL_BELOW * items).div_ceil(values.max(1)).max(1)
}

/// `rayon::join` of `a` and `b` for an input of `values` values: one after the other on the
/// calling thread below [`SEQUENTIAL_BELOW`].
pub fn join<RA: Send, RB: Send>(
    values: usize,
    a: impl FnOnce() -> RA + Send,
    b: impl FnOnce() -> RB + Send,
) -> (RA, RB) {
    if values < SEQUENTIAL_BELOW { (a(), b()) } else { rayon::join(a, b) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loop_of_under_two_pieces_of_values_is_never_split() {
        // A step of 256 traces, 5,123 events: a piece needs 205 traces, and 256 / 2 < 205.
        assert_eq!(min_items(256, 5_123), 205);
        assert_eq!(min_items(125_000, 1_000_000), 512);
        assert!(min_items(10, 100) > 10);
        assert_eq!(min_items(0, 0), 1);
    }
}
