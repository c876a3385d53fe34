//! Finding a branch's factual trace by id, for batches where branches sit anywhere. On a
//! large batch a lookup waits for memory: the table slot, and for an id longer than a slot
//! holds ([`INLINE`] bytes), the id's text. Done one after the other these misses would
//! dominate branch credit, so lookups are pipelined ([`FactualIndex::find_each`]): the slots
//! of [`GROUP`] queries (then their long ids' texts) are requested together before the first
//! is answered. Ids of up to [`INLINE`] bytes (counter ids such as
//! `sim-61-027794`) are confirmed from the slot alone: one miss per lookup.

use std::hash::BuildHasher;

use foldhash::fast::RandomState;
use rayon::prelude::*;

use super::head_word;
use crate::prefetch::prefetch;
use crate::store::same_text;

/// Ids inserted together (their slots loaded first, see [`FactualIndex::warm`]).
const BLOCK: usize = 16;
/// Queries whose slots are requested together (see [`FactualIndex::find_each`]).
const GROUP: usize = 32;
/// The most queries waiting for their group's probes (see [`FactualIndex::find_each`]).
const PENDING: usize = 1024;
/// How many ids ahead an id's text is requested while keys are computed.
const TEXT_AHEAD: usize = 16;
/// Bytes of an id a slot holds: longer ids are confirmed against their text.
const INLINE: usize = 16;

/// What a lookup compares: the id's hash, its length and two words of its first [`INLINE`]
/// bytes (see [`FactualIndex::key`]).
#[derive(Clone, Copy)]
struct Key {
    hash: u64,
    head: [u64; 2],
    len: u32,
}

/// One slot of the open-addressing table (linear probing): two to a cache line.
#[derive(Clone, Copy)]
#[repr(align(32))]
struct Slot {
    hash: u64,
    head: [u64; 2],
    len: u32,
    /// The id's rank; [`EMPTY`] marks a free slot.
    rank: u32,
}

impl Slot {
    fn holds(&self, key: &Key) -> bool {
        self.hash == key.hash && self.head == key.head && self.len == key.len
    }
}

const EMPTY: u32 = u32::MAX;

/// The ids of a batch's factual traces, by rank (their order in the batch), and a hash index
/// from id to rank. A repeated id names its first factual trace; the later ones are listed in
/// [`FactualIndex::repeats`].
pub(super) struct FactualIndex {
    /// Every id longer than [`INLINE`] bytes, one after the other, so a long id is confirmed
    /// from a compact buffer rather than the whole batch's id column; `starts[rank]` is where
    /// id `rank` begins. Shorter ids are confirmed from their slot and not copied (an empty
    /// text here): copying them cost a cache miss per factual trace of a scattered batch.
    ids: String,
    starts: Vec<usize>,
    slots: Vec<Slot>,
    mask: usize,
    hasher: RandomState,
    /// (rank, rank of the first trace with its id) of every factual trace whose id an earlier
    /// one has, in rank order.
    repeats: Vec<(u32, u32)>,
}

impl FactualIndex {
    pub(super) fn new(ids: &[&str]) -> Self {
        let size = (2 * ids.len()).next_power_of_two().max(16);
        let empty = Slot { hash: 0, head: [0; 2], len: 0, rank: EMPTY };
        let mut index = FactualIndex {
            ids: String::new(),
            starts: Vec::with_capacity(ids.len()),
            slots: vec![empty; size],
            mask: size - 1,
            hasher: RandomState::default(),
            repeats: Vec::new(),
        };
        // Ids of factual traces scattered through a batch are far apart: their text is
        // requested ahead of hashing, and a long one copied while it is in cache.
        let parts: Vec<(Vec<Key>, String, Vec<usize>)> = ids
            .par_chunks(1 << 12)
            .enumerate()
            .map(|(chunk, part)| {
                let start = chunk << 12;
                let (mut keys, mut text, mut starts) = (Vec::with_capacity(part.len()), String::new(), Vec::new());
                for (k, id) in part.iter().enumerate() {
                    if let Some(byte) = ids.get(start + k + TEXT_AHEAD).and_then(|ahead| ahead.as_bytes().first()) {
                        prefetch(byte);
                    }
                    keys.push(index.key(id));
                    starts.push(text.len());
                    if id.len() > INLINE {
                        text.push_str(id);
                    }
                }
                (keys, text, starts)
            })
            .collect();
        let mut keys = Vec::with_capacity(ids.len());
        for (part_keys, text, starts) in parts {
            let base = index.ids.len();
            index.starts.extend(starts.into_iter().map(|start| base + start));
            index.ids.push_str(&text);
            keys.extend(part_keys);
        }
        for (first, block) in keys.chunks(BLOCK).enumerate() {
            index.warm(block);
            for (k, key) in block.iter().enumerate() {
                let rank = first * BLOCK + k;
                let slot = index.probe(key, ids[rank]);
                match index.slots[slot].rank {
                    EMPTY => {
                        let Key { hash, head, len } = *key;
                        index.slots[slot] = Slot { hash, head, len, rank: rank as u32 };
                    }
                    first => index.repeats.push((rank as u32, first)),
                }
            }
        }
        index
    }

    /// (rank, rank of the first trace with its id) of every repeated id, in rank order.
    pub(super) fn repeats(&self) -> &[(u32, u32)] {
        &self.repeats
    }

    /// An id of up to [`INLINE`] bytes is hashed from its head words and length, which tell
    /// it apart (the second word overlaps the first below sixteen bytes): no loop over its
    /// bytes.
    fn key(&self, id: &str) -> Key {
        let bytes = id.as_bytes();
        let len = bytes.len();
        let second = match len {
            0..=8 => 0,
            _ => head_word(&bytes[len.min(INLINE) - 8..]),
        };
        let head = [head_word(bytes), second];
        let hash = if len <= INLINE { self.hasher.hash_one((head[0], head[1], len)) } else { self.hasher.hash_one(id) };
        Key { hash, head, len: len as u32 }
    }

    /// The text of id `rank` if it is longer than [`INLINE`] bytes (empty otherwise).
    fn text(&self, rank: u32) -> &str {
        let end = self.starts.get(rank as usize + 1).copied().unwrap_or(self.ids.len());
        &self.ids[self.starts[rank as usize]..end]
    }

    /// The slot holding `id` (of key `key`), or the free slot where it would go.
    fn probe(&self, key: &Key, id: &str) -> usize {
        let mut at = key.hash as usize & self.mask;
        loop {
            let slot = &self.slots[at];
            if slot.rank == EMPTY || (slot.holds(key) && (id.len() <= INLINE || same_text(self.text(slot.rank), id))) {
                return at;
            }
            at = (at + 1) & self.mask;
        }
    }

    /// Loads into cache what finding ids of these keys will read: their home slots, then the
    /// text of long ids.
    fn warm(&self, keys: &[Key]) {
        let mut touched = 0u64;
        for key in keys {
            touched ^= self.slots[key.hash as usize & self.mask].hash;
        }
        std::hint::black_box(touched);
        for key in keys {
            self.warm_text(key);
        }
    }

    /// Prefetches the text that an id of key `key` longer than [`INLINE`] bytes is compared
    /// with: that of the first slot of its probe that is free or holds its hash.
    fn warm_text(&self, key: &Key) {
        if key.len as usize <= INLINE {
            return;
        }
        let mut at = key.hash as usize & self.mask;
        while self.slots[at].rank != EMPTY && self.slots[at].hash != key.hash {
            at = (at + 1) & self.mask;
        }
        let start = self.starts.get(self.slots[at].rank as usize);
        if let Some(byte) = start.and_then(|&start| self.ids.as_bytes().get(start)) {
            prefetch(byte);
        }
    }

    /// `found(item, rank of the factual trace id)` for each `(item, id)` of `queries`, in
    /// order, the lookups pipelined (see the module comment): queries are taken until
    /// [`GROUP`] of them need a probe (or [`PENDING`] are waiting), the slots of those
    /// requested (then their long ids' texts) before the first is answered. A query for the
    /// same id as the query before it (branches of one factual trace stored one after the
    /// other) takes that answer without a hash or a probe, so it does not count towards the
    /// group: runs of branches still keep [`GROUP`] probes in flight.
    pub(super) fn find_each<'q, T: Copy>(
        &self,
        mut queries: impl Iterator<Item = (T, &'q str)>,
        mut found: impl FnMut(T, Option<u32>),
    ) {
        // The waiting queries, each marked with whether it starts a new id, and the keys and
        // ids of those that do.
        let mut pending: Vec<(T, bool)> = Vec::with_capacity(PENDING);
        let mut probes: Vec<(Key, &str)> = Vec::with_capacity(GROUP);
        let (mut previous, mut answer) = (None::<&str>, None::<u32>);
        loop {
            pending.clear();
            probes.clear();
            while probes.len() < GROUP && pending.len() < PENDING {
                let Some((item, id)) = queries.next() else { break };
                let new = previous.is_none_or(|previous| !same_text(previous, id));
                if new {
                    let key = self.key(id);
                    prefetch(&self.slots[key.hash as usize & self.mask]);
                    probes.push((key, id));
                }
                pending.push((item, new));
                previous = Some(id);
            }
            if pending.is_empty() {
                return;
            }
            for (key, _) in &probes {
                self.warm_text(key);
            }
            let mut probed = probes.iter();
            for &(item, new) in &pending {
                if new && let Some((key, id)) = probed.next() {
                    let rank = self.slots[self.probe(key, id)].rank;
                    answer = (rank != EMPTY).then_some(rank);
                }
                found(item, answer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids that share their first bytes, up to and past what a slot holds, a repeated id, the
    /// empty id and prefixes of ids: each found at its first rank, absent ones not found; the
    /// repeated one listed with its first rank.
    #[test]
    fn finds_ids_of_every_length() {
        let long = "factual-trace-with-a-long-shared-prefix";
        let mut ids: Vec<String> = (0..40).map(|k| format!("{}{k}", &long[..k % long.len()])).collect();
        ids.extend((0..3000).map(|k| format!("{long}-{k}")));
        ids.push(String::new());
        ids.push(ids[7].clone());
        let index = FactualIndex::new(&ids.iter().map(String::as_str).collect::<Vec<_>>());
        let mut queries: Vec<String> = ids.clone();
        queries.extend(["factual-tra", "x", long].map(String::from));
        queries.extend(ids.iter().map(|id| format!("{id}!")));
        // Runs of one id (a factual trace's branches stored together), found and not found.
        queries.extend(ids.iter().step_by(97).flat_map(|id| [id.clone(), id.clone(), id.clone()]));
        queries.extend(["absent", "absent", "absent"].map(String::from));
        // A run longer than the queries a group holds waiting for its probes.
        queries.extend(std::iter::repeat_n(ids[3000].clone(), PENDING + 7));
        queries.push(ids[11].clone());
        let mut answers = Vec::new();
        index.find_each(queries.iter().enumerate().map(|(k, id)| (k, id.as_str())), |k, rank| answers.push((k, rank)));
        assert_eq!(answers.iter().map(|&(k, _)| k).collect::<Vec<_>>(), (0..queries.len()).collect::<Vec<_>>());
        for (k, rank) in answers {
            let expected = ids.iter().position(|id| *id == queries[k]).map(|rank| rank as u32);
            assert_eq!(rank, expected, "query {:?}", queries[k]);
        }
        assert_eq!(index.repeats(), [(ids.len() as u32 - 1, 7)]);
    }
}
