//! Staleness control for asynchronous RL: every trace may carry the `policy_version` that
//! produced it, the buffer knows the trainer's current version, and a sample draws only
//! traces at most `max_staleness` versions behind it (AReaL's max_head_offpolicyness,
//! prime-rl's max_off_policy_steps).
//!
//! A trace without policy_version is never stale (offline data, demonstrations); a buffer
//! built with a `max_staleness` refuses such traces instead, so a rollout worker that forgot
//! the version fails loudly rather than feeding the trainer forever.

use std::ops::Range;

use super::GraphBuffer;
use crate::bail;
use crate::error::{MasreplayError, Result};

/// The version an entry holds for a trace without policy_version: newer than any version.
pub const UNVERSIONED: i64 = i64::MAX;

/// Placeholders a buffer keeps before it compacts, whatever it stores.
pub(super) const COMPACT_AFTER: usize = 1024;

/// Whether a trace of `version` may be drawn under `bound` (the oldest version allowed).
pub(super) fn fresh(version: i64, bound: Option<i64>) -> bool {
    bound.is_none_or(|bound| version >= bound)
}

impl GraphBuffer {
    /// The trainer's current policy version (0 until set).
    pub fn policy_version(&self) -> i64 {
        self.policy_version
    }

    /// Sets the current policy version to any version >= 0 (a resumed or restarted trainer).
    pub fn set_policy_version(&mut self, version: i64) -> Result<()> {
        if version < 0 {
            bail!("policy_version must be >= 0, not {version}");
        }
        self.policy_version = version;
        Ok(())
    }

    /// Moves the current policy version forward to `version`; it never goes back.
    pub fn advance(&mut self, version: i64) -> Result<()> {
        if version < self.policy_version {
            bail!(
                "advance({version}) would move the policy version back from {}; versions only grow \
                 (set policy_version to reset it)",
                self.policy_version
            );
        }
        self.set_policy_version(version)
    }

    /// The staleness bound samples use when their call gives none.
    pub fn max_staleness(&self) -> Option<u64> {
        self.max_staleness
    }

    /// Sets the buffer's own staleness bound; from then on every added trace must carry a
    /// policy_version.
    pub fn set_max_staleness(&mut self, max_staleness: Option<u64>) {
        self.max_staleness = max_staleness;
    }

    /// The oldest policy version a draw may pick under `max_staleness` (else the buffer's
    /// own bound); None when nothing bounds it.
    pub(super) fn version_bound(&self, max_staleness: Option<u64>) -> Option<i64> {
        let staleness = max_staleness.or(self.max_staleness)?;
        Some(self.policy_version.saturating_sub(i64::try_from(staleness).unwrap_or(i64::MAX)))
    }

    /// Whether versions rise (or stay) along insertion order over every entry kept.
    pub(super) fn versions_in_order(&self) -> bool {
        self.newest_inversion.is_none_or(|seq| seq <= self.first_seq)
    }

    pub(super) fn end_seq(&self) -> u64 {
        self.first_seq + self.entries.len() as u64
    }

    /// Consecutive sequence numbers holding exactly the entries no older than `bound`, when
    /// they are consecutive: always without a bound, and when versions arrive in order (the
    /// fresh entries are then a suffix, found by binary search). None otherwise.
    pub(super) fn fresh_range(&self, bound: Option<i64>) -> Option<Range<u64>> {
        let Some(bound) = bound else { return Some(self.first_seq..self.end_seq()) };
        if !self.versions_in_order() {
            return None;
        }
        let stale = self.entries.partition_point(|entry| entry.version < bound);
        Some(self.first_seq + stale as u64..self.end_seq())
    }

    /// Where a scan for traces no older than `bound` must look.
    pub(super) fn search_range(&self, bound: Option<i64>) -> Range<u64> {
        self.fresh_range(bound).unwrap_or(self.first_seq..self.end_seq())
    }

    /// Removes the traces more than `max_staleness` versions behind the current one (the
    /// buffer's own bound when None), each with its branch rollouts; returns how many traces
    /// left. O(removed) when versions arrive in order, else one scan.
    pub fn evict_stale(&mut self, max_staleness: Option<u64>) -> Result<usize> {
        let bound = self.version_bound(max_staleness).ok_or_else(|| {
            MasreplayError::InvalidArgument(
                "evict_stale needs max_staleness: pass it, or build the buffer with one".to_owned(),
            )
        })?;
        let before = self.live;
        if self.versions_in_order() {
            while self.entries.front().is_some_and(|entry| entry.version < bound) {
                self.evict_oldest();
            }
        } else {
            let stale: Vec<u64> = self.stored_seqs().filter(|&seq| self.entry(seq).version < bound).collect();
            for seq in stale {
                // A stale branch may have left already with its factual trace.
                if !self.entry(seq).removed {
                    self.forget(seq);
                }
            }
            self.drop_removed_front();
            self.compact_if_sparse();
        }
        Ok(before - self.live)
    }

    /// Traces removed out of order leave placeholders (and their chunks) behind the oldest
    /// stored trace until it leaves; one that never does (a demonstration without
    /// policy_version in a buffer kept under capacity by `evict_stale`) would keep every trace
    /// added after it. Once the placeholders outnumber the stored traces (and
    /// [`COMPACT_AFTER`]), the stored traces are renumbered into fresh chunks, as a reload
    /// would: memory follows what is stored, and each compaction's copy is paid for by as
    /// many removals.
    fn compact_if_sparse(&mut self) {
        if self.entries.len() - self.live > self.live.max(COMPACT_AFTER) {
            // Compaction only frees memory: if it cannot be done the buffer stays as it is.
            if let Ok(compacted) = self.compacted() {
                *self = compacted;
            }
        }
    }

    /// The stored traces in insertion order, with their priorities, in a new buffer with the
    /// same settings and sampling state, and its groups listed in the same order (group draws
    /// pick by position in that list).
    pub(super) fn compacted(&self) -> Result<Self> {
        let mut buffer = GraphBuffer {
            calls: self.calls,
            max_priority: self.max_priority,
            policy_version: self.policy_version,
            max_staleness: self.max_staleness,
            ..GraphBuffer::new(self.capacity, self.unit, self.seed)?
        };
        buffer.add_with_priorities(&self.to_batch()?, Some(&self.priorities_in_order()))?;
        buffer.groups.list_as(&self.groups)?;
        Ok(buffer)
    }
}
