//! What keeps the per-trace check of Arrow input cheap: batch-wide passes that prove a
//! per-event rule holds for every event of a column, so the per-trace check skips it (each
//! pass reads one contiguous buffer, which the compiler vectorises; a column that fails its
//! pass is checked event by event, which finds and names the first offending event), and
//! per-trace sets keyed by event index or dictionary key rather than by owned strings.

use std::collections::HashMap;
use std::hash::BuildHasher;

use arrow_array::cast::AsArray;
use arrow_array::types::{ArrowDictionaryKeyType, Float64Type};
use arrow_array::{Array, ArrowPrimitiveType, DictionaryArray, MapArray, PrimitiveArray, StringArray};
use arrow_buffer::ArrowNativeType;
use hashbrown::hash_table::{Entry, HashTable};
use rayon::prelude::*;

use super::schema::EventColumns;
use crate::parallel::min_piece;

/// Values per task of a parallel pass.
const PASS_CHUNK: usize = 1 << 16;

/// Which per-event rules hold for every event of the batch.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CleanColumns {
    pub events_present: bool,
    pub ids: bool,
    pub t: bool,
    /// Every type is in the vocabulary (set by the ingest, which holds the vocabularies).
    pub types: bool,
    pub agents: bool,
    pub reward: bool,
    pub tokens: bool,
    pub duration_s: bool,
    pub logprob: bool,
    pub attributes: bool,
}

impl CleanColumns {
    pub fn of(events: &dyn Array, columns: &EventColumns) -> Self {
        CleanColumns {
            events_present: events.null_count() == 0,
            ids: columns.id.null_count() == 0 && no_empty_text(columns.id),
            t: columns.t.null_count() == 0 && every_value(columns.t, finite_non_negative),
            types: false,
            agents: columns.agent.null_count() == 0 && every_key_names_text(columns.agent),
            reward: numbers_all_finite(columns.reward),
            tokens: every_value(columns.tokens, |v| v >= 0),
            duration_s: every_value(columns.duration_s, finite_non_negative),
            logprob: every_value(columns.logprob, |v| v <= 0.0 && v > f64::NEG_INFINITY),
            attributes: columns.attributes.null_count() == columns.attributes.len(),
        }
    }
}

impl CleanColumns {
    /// Whether every per-event rule holds batch-wide.
    pub fn everywhere(&self) -> bool {
        self.events_present
            && self.ids
            && self.t
            && self.types
            && self.agents
            && self.reward
            && self.tokens
            && self.duration_s
            && self.logprob
            && self.attributes
    }
}

/// `check_non_negative` as a predicate (NaN is outside every range).
fn finite_non_negative(value: f64) -> bool {
    (0.0..f64::INFINITY).contains(&value)
}

/// Whether `rule` holds for every non-null value (NaN fails any comparison).
fn every_value<T: ArrowPrimitiveType>(array: &PrimitiveArray<T>, rule: impl Fn(T::Native) -> bool + Sync) -> bool {
    let values = array.values();
    match array.nulls() {
        None => values.par_chunks(PASS_CHUNK).all(|chunk| chunk.iter().fold(true, |ok, &v| ok & rule(v))),
        Some(nulls) if nulls.null_count() == nulls.len() => true,
        Some(nulls) => nulls.valid_indices().all(|i| rule(values[i])),
    }
}

fn no_empty_text(array: &StringArray) -> bool {
    array.offsets().par_windows(2).with_min_len(min_piece(array.len())).all(|pair| pair[0] < pair[1])
}

/// Every key of a column without nulls names a non-empty string. Ingested columns are
/// well-formed (`store/structure.rs` proves it first): the key of every non-null slot indexes
/// its dictionary, so when every string is usable, no key needs reading.
fn every_key_names_text<K: ArrowDictionaryKeyType>(array: &DictionaryArray<K>) -> bool {
    let texts = array.values().as_string::<i32>();
    let usable: Vec<bool> = (0..texts.len()).map(|k| texts.is_valid(k) && !texts.value(k).is_empty()).collect();
    usable.iter().all(|&u| u)
        || array.keys().values().iter().all(|key| usable.get(key.as_usize()).copied().unwrap_or(false))
}

/// Every number of a name -> number map column is present and finite (checked over the
/// whole entries child, so also under null rows, which can only make this answer "no").
fn numbers_all_finite(map: &MapArray) -> bool {
    if map.null_count() == map.len() {
        return true;
    }
    let values = map.values().as_primitive::<Float64Type>();
    values.null_count() == 0 && every_value(values, f64::is_finite)
}

/// Distinct agents by dictionary key: keys whose texts are equal share one index, so a trace's
/// agents are counted by comparing integers rather than strings.
pub(crate) struct AgentIndex {
    of_key: Vec<u32>,
    distinct: usize,
}

impl AgentIndex {
    pub fn new<K: ArrowDictionaryKeyType>(agents: &DictionaryArray<K>) -> Self {
        let texts = agents.values().as_string::<i32>();
        let mut first: HashMap<&str, u32, foldhash::fast::RandomState> = HashMap::default();
        let of_key = (0..texts.len())
            .map(|k| {
                let next = first.len() as u32;
                *first.entry(if texts.is_valid(k) { texts.value(k) } else { "" }).or_insert(next)
            })
            .collect();
        AgentIndex { of_key, distinct: first.len() }
    }

    /// Counts distinct agents among `keys`, marking `seen` (one slot per distinct agent, reused
    /// across traces) with `stamp`, which must differ from every earlier call's.
    pub fn count(&self, keys: impl Iterator<Item = usize>, seen: &mut Vec<u32>, stamp: u32) -> usize {
        seen.resize(self.distinct, 0);
        let mut count = 0;
        // Consecutive events mostly share their agent: skip the lookup for a repeated key.
        let mut last = usize::MAX;
        for key in keys {
            if key == last {
                continue;
            }
            last = key;
            let slot = &mut seen[self.of_key[key] as usize];
            count += (*slot != stamp) as usize;
            *slot = stamp;
        }
        count
    }
}

/// Whether the ids strictly increase by length, then bytes: then they are distinct without
/// hashing. Counters ("e0".."e9", "e10"..; zero-padded or not) and timestamps come in this
/// order; other ids fail at the first pair out of order, and are hashed.
fn in_shortlex_order(ids: &StringArray, events: std::ops::Range<usize>) -> bool {
    let (offsets, bytes) = (&ids.value_offsets()[events.start..=events.end], ids.value_data());
    // An id's first eight bytes as one big-endian word, left-aligned: for ids of equal length
    // up to eight bytes, words compare as the bytes do, with one load instead of a loop.
    let word = |start: usize, len: usize| {
        let raw = match bytes.get(start..start + 8) {
            Some(eight) => u64::from_be_bytes(eight.try_into().expect("eight bytes")),
            None => (0..8).fold(0u64, |word, k| word << 8 | *bytes.get(start + k).unwrap_or(&0) as u64),
        };
        raw & !u64::MAX.checked_shr(8 * len as u32).unwrap_or(0)
    };
    let mut before: Option<(usize, usize)> = None;
    offsets.windows(2).all(|bounds| {
        let (start, len) = (bounds[0] as usize, (bounds[1] - bounds[0]) as usize);
        let increases = before.is_none_or(|(before_start, before_len)| {
            before_len < len
                || (before_len == len
                    && if len <= 8 {
                        word(before_start, len) < word(start, len)
                    } else {
                        bytes[before_start..before_start + len] < bytes[start..start + len]
                    })
        });
        before = Some((start, len));
        increases
    })
}

/// The first repeated event id of a trace. Distinct ids (the common case) are proven so by
/// their order ([`in_shortlex_order`]) or by their 64-bit hashes all differing, with an
/// open-addressing table of hashes inlined in one loop; only when two hashes are equal (a
/// repeat, or rarely a collision) does a table of event indices compare texts to name the
/// first repeat.
#[derive(Default)]
pub(crate) struct DistinctIds {
    hashes: Vec<u64>,
    table: HashTable<u32>,
    hasher: foldhash::fast::RandomState,
}

impl DistinctIds {
    /// `(index, index of its first use)` of the first event whose id repeats an earlier one.
    pub fn first_repeat(&mut self, ids: &StringArray, events: std::ops::Range<usize>) -> Option<(usize, usize)> {
        if in_shortlex_order(ids, events.clone()) || self.hashes_differ(ids, events.clone()) {
            return None;
        }
        let start = events.start;
        let text = |local: u32| ids.value(start + local as usize);
        self.table.clear();
        self.table.reserve(events.len(), |&local| self.hasher.hash_one(text(local)));
        for (local, j) in events.enumerate() {
            let id = ids.value(j);
            let hash = self.hasher.hash_one(id);
            match self.table.entry(hash, |&seen| text(seen) == id, |&seen| self.hasher.hash_one(text(seen))) {
                Entry::Occupied(first) => return Some((local, *first.get() as usize)),
                Entry::Vacant(slot) => {
                    slot.insert(local as u32);
                }
            }
        }
        None
    }

    /// Whether the ids' 64-bit hashes all differ (then so do the ids).
    fn hashes_differ(&mut self, ids: &StringArray, events: std::ops::Range<usize>) -> bool {
        let size = (2 * events.len()).next_power_of_two().max(16);
        let mask = size - 1;
        self.hashes.clear();
        self.hashes.resize(size, 0); // 0: an empty slot (stored hashes have their low bit set)
        for j in events {
            let hash = self.hasher.hash_one(ids.value(j)) | 1;
            let mut slot = (hash >> 32) as usize & mask;
            loop {
                match self.hashes[slot] {
                    0 => {
                        self.hashes[slot] = hash;
                        break;
                    }
                    seen if seen == hash => return false,
                    _ => slot = (slot + 1) & mask,
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The first repeat found by comparing every pair.
    fn naive_first_repeat(ids: &[String]) -> Option<(usize, usize)> {
        (0..ids.len()).find_map(|j| (0..j).find(|&i| ids[i] == ids[j]).map(|i| (j, i)))
    }

    fn check(ids: &[String]) {
        // A prefix trace before and a suffix after, so the range is inside the column and its
        // last ids may sit fewer than eight bytes from the end of the data.
        let mut column = vec!["prefix".to_owned()];
        column.extend(ids.iter().cloned());
        let array = StringArray::from(column);
        let found = DistinctIds::default().first_repeat(&array, 1..1 + ids.len());
        assert_eq!(found, naive_first_repeat(ids), "{ids:?}");
    }

    #[test]
    fn counters_are_distinct_and_repeats_are_found_in_or_out_of_order() {
        check(&(0..30).map(|k| format!("e{k}")).collect::<Vec<_>>());
        check(&(0..30).map(|k| format!("event-{k:012}")).collect::<Vec<_>>());
        check(&["a", "b", "b"].map(String::from));
        check(&["b", "a", "b"].map(String::from));
        check(&["", "a", ""].map(String::from));
        check(&["e9", "e10", "e10"].map(String::from));
        check(&["abcdefghi", "abcdefghj", "abcdefghj"].map(String::from));
        check(&["ab\u{0}", "ab"].map(String::from));
    }

    proptest! {
        #[test]
        fn first_repeat_matches_comparing_every_pair(
            ids in prop::collection::vec("[ab\u{0}]{0,3}|e[0-9]{1,3}|[a-c]{8,10}", 0..40),
            sorted in any::<bool>(),
        ) {
            let mut ids = ids;
            if sorted {
                // Mostly in shortlex order, where the hash-free path runs.
                ids.sort_by(|a, b| a.len().cmp(&b.len()).then(a.cmp(b)));
            }
            check(&ids);
        }
    }
}
