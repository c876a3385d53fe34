//! Finding a branch's factual trace by id, for batches where branches sit anywhere. One
//! lookup is two dependent cache misses on a large batch (the table slot, then the id's
//! text); done one after the other they would dominate branch credit. So lookups are
//! pipelined ([`FactualIndex::find_each`]): a query's slot is prefetched [`SLOT_AHEAD`]
//! queries before it is answered, its text [`TEXT_AHEAD`] queries before, and only then is
//! the id confirmed by comparing its text.

use std::hash::BuildHasher;

use foldhash::fast::RandomState;
use rayon::prelude::*;

use crate::prefetch::prefetch;
use crate::store::same_text;

/// Ids inserted together (their slots loaded first, see [`FactualIndex::warm`]).
const BLOCK: usize = 16;
/// How many queries ahead a slot is prefetched, and a text (see the module comment).
const SLOT_AHEAD: usize = 16;
const TEXT_AHEAD: usize = 8;

/// One slot of the open-addressing table (linear probing).
#[derive(Clone, Copy)]
struct Slot {
    hash: u64,
    /// The id's rank; [`EMPTY`] marks a free slot.
    rank: u32,
    len: u32,
    /// Where the id's text starts in [`FactualIndex::ids`].
    start: usize,
}

const EMPTY: u32 = u32::MAX;

/// The ids of a batch's factual traces, by rank (their order in the batch), and a hash index
/// from id to rank. A repeated id names its last factual trace.
pub(super) struct FactualIndex {
    /// Every id, one after the other, so a match is confirmed from a compact buffer rather
    /// than the whole batch's id column.
    ids: String,
    slots: Vec<Slot>,
    mask: usize,
    hasher: RandomState,
}

impl FactualIndex {
    pub(super) fn new(ids: &[&str]) -> Self {
        let size = (2 * ids.len()).next_power_of_two().max(16);
        let empty = Slot { hash: 0, rank: EMPTY, len: 0, start: 0 };
        let mut index = FactualIndex {
            ids: String::new(),
            slots: vec![empty; size],
            mask: size - 1,
            hasher: RandomState::default(),
        };
        let hashes: Vec<u64> = ids.par_iter().map(|id| index.hash(id)).collect();
        let starts: Vec<usize> = ids
            .iter()
            .map(|id| {
                index.ids.push_str(id);
                index.ids.len() - id.len()
            })
            .collect();
        for (first, block) in hashes.chunks(BLOCK).enumerate() {
            index.warm(block);
            for (k, &hash) in block.iter().enumerate() {
                let rank = first * BLOCK + k;
                let slot = index.probe(hash, ids[rank]);
                index.slots[slot] = Slot { hash, rank: rank as u32, len: ids[rank].len() as u32, start: starts[rank] };
            }
        }
        index
    }

    fn text(&self, start: usize, len: usize) -> &str {
        &self.ids[start..start + len]
    }

    pub(super) fn hash(&self, id: &str) -> u64 {
        self.hasher.hash_one(id)
    }

    /// The slot holding `id` (of hash `hash`), or the free slot where it would go.
    fn probe(&self, hash: u64, id: &str) -> usize {
        let mut at = hash as usize & self.mask;
        loop {
            let slot = &self.slots[at];
            if slot.rank == EMPTY || (slot.hash == hash && same_text(self.text(slot.start, slot.len as usize), id)) {
                return at;
            }
            at = (at + 1) & self.mask;
        }
    }

    /// Rank of the factual trace `id` (of hash `hash`), if the batch has one.
    pub(super) fn find(&self, hash: u64, id: &str) -> Option<u32> {
        let rank = self.slots[self.probe(hash, id)].rank;
        (rank != EMPTY).then_some(rank)
    }

    /// Loads into cache what finding ids of these hashes will read: their home slots, then the
    /// text of the first slot whose hash matches.
    fn warm(&self, hashes: &[u64]) {
        let mut touched = 0u64;
        for &hash in hashes {
            touched ^= self.slots[hash as usize & self.mask].hash;
        }
        std::hint::black_box(touched);
        for &hash in hashes {
            if let Some(byte) = self.ids.as_bytes().get(self.slots[self.stop(hash)].start) {
                prefetch(byte);
            }
        }
    }

    /// The first slot of the probe for `hash` that is free or holds that hash.
    fn stop(&self, hash: u64) -> usize {
        let mut at = hash as usize & self.mask;
        while self.slots[at].rank != EMPTY && self.slots[at].hash != hash {
            at = (at + 1) & self.mask;
        }
        at
    }

    /// `found(item, rank of the factual trace id)` for each `(item, id)` of `queries`, in
    /// order, the lookups pipelined (see the module comment).
    pub(super) fn find_each<'q, T: Copy>(
        &self,
        queries: impl Iterator<Item = (T, &'q str)>,
        mut found: impl FnMut(T, Option<u32>),
    ) {
        let mut pending: std::collections::VecDeque<(T, &str, u64)> =
            std::collections::VecDeque::with_capacity(SLOT_AHEAD + 1);
        let mut answer = |pending: &mut std::collections::VecDeque<(T, &str, u64)>| {
            if let Some((item, id, hash)) = pending.pop_front() {
                found(item, self.find(hash, id));
            }
        };
        for (item, id) in queries {
            let hash = self.hash(id);
            prefetch(&self.slots[hash as usize & self.mask]);
            pending.push_back((item, id, hash));
            if let Some(&(_, _, soon)) = pending.len().checked_sub(TEXT_AHEAD + 1).and_then(|k| pending.get(k))
                && let Some(byte) = self.ids.as_bytes().get(self.slots[self.stop(soon)].start)
            {
                prefetch(byte);
            }
            if pending.len() > SLOT_AHEAD {
                answer(&mut pending);
            }
        }
        while !pending.is_empty() {
            answer(&mut pending);
        }
    }
}
