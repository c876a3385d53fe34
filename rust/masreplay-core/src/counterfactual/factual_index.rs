//! Finding a branch's factual trace by id, for batches where branches sit anywhere. One
//! lookup is three dependent cache misses on a large batch (the table slot, then the id's
//! text); done one after the other they would dominate branch credit. So lookups come in
//! blocks: the slots of a whole block are loaded first, then the texts they point at, so the
//! misses of a block overlap, and only then is each id confirmed by comparing its text.

use std::hash::BuildHasher;

use foldhash::fast::RandomState;

use crate::store::same_text;

/// Ids looked up together (see the module comment).
pub(super) const BLOCK: usize = 16;

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
    pub(super) fn new<'i>(ids: impl ExactSizeIterator<Item = &'i str>) -> Self {
        let size = (2 * ids.len()).next_power_of_two().max(16);
        let empty = Slot { hash: 0, rank: EMPTY, len: 0, start: 0 };
        let mut index = FactualIndex {
            ids: String::new(),
            slots: vec![empty; size],
            mask: size - 1,
            hasher: RandomState::default(),
        };
        let mut texts = Vec::with_capacity(ids.len());
        for id in ids {
            texts.push((index.ids.len(), id.len()));
            index.ids.push_str(id);
        }
        let mut hashes = Vec::with_capacity(BLOCK);
        for (first, block) in texts.chunks(BLOCK).enumerate() {
            hashes.clear();
            hashes.extend(block.iter().map(|&(start, len)| index.hash(index.text(start, len))));
            index.warm(&hashes);
            for (k, (&(start, len), &hash)) in block.iter().zip(&hashes).enumerate() {
                let rank = (first * BLOCK + k) as u32;
                let slot = index.probe(hash, index.text(start, len));
                index.slots[slot] = Slot { hash, rank, len: len as u32, start };
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
    /// text of the first slot whose hash matches (see the module comment).
    pub(super) fn warm(&self, hashes: &[u64]) {
        let mut touched = 0u64;
        for &hash in hashes {
            touched ^= self.slots[hash as usize & self.mask].hash;
        }
        std::hint::black_box(touched);
        for &hash in hashes {
            let mut at = hash as usize & self.mask;
            while self.slots[at].rank != EMPTY && self.slots[at].hash != hash {
                at = (at + 1) & self.mask;
            }
            let slot = &self.slots[at];
            touched ^= u64::from(self.ids.as_bytes().get(slot.start).copied().unwrap_or(0));
        }
        std::hint::black_box(touched);
    }
}
