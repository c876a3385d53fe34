//! Sorting a short slice of distinct integers by rank: each key's place is the number of
//! keys below it. That is n² comparisons, but without a branch and in the widest vectors
//! the CPU has, so for the few dozen keys of a trace it beats a comparison sort, whose
//! branches on shuffled keys the CPU mispredicts about once per comparison.

/// The longest slice sorted by rank; longer ones go to `sort_unstable`.
pub(crate) const RANKED_MAX: usize = 128;

/// Sorts `keys`, which must be distinct (equal keys would take the same place).
pub(crate) fn sort_distinct(keys: &mut [u64]) {
    if keys.len() > RANKED_MAX {
        keys.sort_unstable();
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: `sort_by_rank_avx2` needs AVX2 and nothing else, and the CPU has it.
        unsafe { sort_by_rank_avx2(keys) };
        return;
    }
    sort_by_rank(keys);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn sort_by_rank_avx2(keys: &mut [u64]) {
    sort_by_rank(keys);
}

/// The body of [`sort_distinct`] for at most [`RANKED_MAX`] keys. The keys are copied into a
/// block padded to whole vectors with `u64::MAX`, which is below no key, so the counting
/// loop has no remainder to finish one key at a time.
#[inline(always)]
fn sort_by_rank(keys: &mut [u64]) {
    const LANES: usize = 8;
    let n = keys.len();
    let mut block = [u64::MAX; RANKED_MAX];
    block[..n].copy_from_slice(keys);
    let block = &block[..n.next_multiple_of(LANES)];
    for &key in block.iter().take(n) {
        let rank: u64 = block.iter().map(|&other| (other < key) as u64).sum();
        keys[rank as usize] = key;
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
        for n in 0..=RANKED_MAX + 3 {
            // Wide keys, keys at the top of the range (u64::MAX included: the padding must
            // not count as below it), and keys that differ in the low bits only.
            let mut keys: Vec<u64> = (0..n as u64)
                .map(|i| match i % 3 {
                    0 => rng.random(),
                    1 => u64::MAX - i,
                    _ => 1 << 40 | i,
                })
                .collect();
            keys.sort_unstable();
            let sorted = keys.clone();
            keys.shuffle(&mut rng);
            let mut portable = keys.clone();
            sort_distinct(&mut keys);
            assert_eq!(keys, sorted, "{n} keys");
            // The portable body too, whatever this CPU dispatches to.
            if n <= RANKED_MAX {
                sort_by_rank(&mut portable);
                assert_eq!(portable, sorted, "{n} keys, portable");
            }
        }
    }
}
