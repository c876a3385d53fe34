//! Sorting a short slice of distinct 31-bit keys by rank: each key's place is the number of
//! keys below it. That is n² comparisons, but without a branch and eight to a vector (AVX2
//! where the CPU has it), so for the few dozen keys of a trace it beats a comparison sort,
//! whose branches on shuffled keys the CPU mispredicts about once per comparison.

/// The longest slice sorted by rank.
pub(crate) const RANKED_MAX: usize = 128;

/// The largest key: keys are compared as `i32`, which AVX2 compares directly.
pub(crate) const KEY_MAX: u32 = i32::MAX as u32;

/// Writes the first `sorted.len()` of `keys` (at most [`RANKED_MAX`], distinct: equal keys
/// would take the same place; none above [`KEY_MAX`]) to `sorted` in increasing order. The
/// keys past them are padding that vectors may read but whose places are never written.
pub(crate) fn sort_distinct(keys: &[u32; RANKED_MAX], sorted: &mut [u32]) {
    assert!(sorted.len() <= RANKED_MAX, "rank sort of {} keys", sorted.len());
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: `sort_by_rank_avx2` needs AVX2 and nothing else, and the CPU has it.
        unsafe { sort_by_rank_avx2(keys, sorted) };
        return;
    }
    sort_by_rank(keys, sorted);
}

/// [`sort_distinct`] without vectors.
fn sort_by_rank(keys: &[u32; RANKED_MAX], sorted: &mut [u32]) {
    let keys = &keys[..sorted.len()];
    for &key in keys {
        sorted[keys.iter().filter(|&&other| other < key).count()] = key;
    }
}

/// [`sort_distinct`] eight keys at a time: each lane counts the keys below its own, one
/// broadcast key per step, so no count is summed across lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn sort_by_rank_avx2(keys: &[u32; RANKED_MAX], sorted: &mut [u32]) {
    use std::arch::x86_64::{
        __m256i, _mm256_cmpgt_epi32, _mm256_loadu_si256, _mm256_set1_epi32, _mm256_setzero_si256, _mm256_storeu_si256,
        _mm256_sub_epi32,
    };
    const LANES: usize = 8;
    let n = sorted.len();
    for (first, own) in (0..n).step_by(LANES).zip(keys.chunks_exact(LANES)) {
        // SAFETY: `own` is LANES u32s, one unaligned 256-bit load.
        let own_keys = unsafe { _mm256_loadu_si256(own.as_ptr().cast::<__m256i>()) };
        let mut below = _mm256_setzero_si256();
        for &other in &keys[..n] {
            // Lanes whose key is above `other` are -1: subtracting counts them. Keys fit
            // in 31 bits, so comparing them as i32 is comparing them as u32.
            below = _mm256_sub_epi32(below, _mm256_cmpgt_epi32(own_keys, _mm256_set1_epi32(other as i32)));
        }
        let mut ranks = [0u32; LANES];
        // SAFETY: `ranks` is LANES u32s, one unaligned 256-bit store.
        unsafe { _mm256_storeu_si256(ranks.as_mut_ptr().cast::<__m256i>(), below) };
        for (&key, &rank) in own.iter().zip(&ranks).take(n - first) {
            sorted[rank as usize] = key;
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::RngExt;
    use rand::seq::SliceRandom;

    use super::*;

    #[test]
    fn sorts_every_length_as_sort_unstable_does() {
        let mut rng = crate::rng::stream(7, 0);
        for n in 0..=RANKED_MAX {
            // Wide keys, keys at the top of the range, and keys that differ in the low bits
            // only.
            let mut keys: Vec<u32> = (0..n as u32)
                .map(|i| match i % 3 {
                    0 => rng.random_range(0..=KEY_MAX),
                    1 => KEY_MAX - i,
                    _ => 1 << 20 | i,
                })
                .collect();
            keys.sort_unstable();
            keys.dedup();
            let sorted = keys.clone();
            keys.shuffle(&mut rng);
            // Padding that is not zero, to show it is never sorted in.
            let mut padded = [KEY_MAX; RANKED_MAX];
            padded[..keys.len()].copy_from_slice(&keys);
            let mut dispatched = vec![0; keys.len()];
            sort_distinct(&padded, &mut dispatched);
            assert_eq!(dispatched, sorted, "{n} keys");
            // The portable body too, whatever this CPU dispatches to.
            let mut portable = vec![0; keys.len()];
            sort_by_rank(&padded, &mut portable);
            assert_eq!(portable, sorted, "{n} keys, portable");
        }
    }
}
