//! Seeded random streams. Work that runs in parallel draws from one stream per work item, so
//! its results are the same at any thread count and in any order the items run.

use rand::SeedableRng;
use rand_xoshiro::Xoshiro256PlusPlus;

/// The increment of SplitMix64 (2^64 / golden ratio, odd).
const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output mix (Steele, Lea and Flood, "Fast splittable pseudorandom number
/// generators", OOPSLA 2014; constants from Vigna's splitmix64.c): a bijection on u64 in
/// which every input bit reaches every output bit, so neighbouring inputs give unrelated
/// outputs.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One step of SplitMix64 from state `x`.
fn splitmix64(x: u64) -> u64 {
    mix64(x.wrapping_add(GOLDEN_GAMMA))
}

/// The random stream of work item `index` under `seed`. Callers that need several families
/// of streams from one seed xor a domain tag into `seed`.
pub fn stream(seed: u64, index: u64) -> Xoshiro256PlusPlus {
    Xoshiro256PlusPlus::seed_from_u64(splitmix64(splitmix64(seed) ^ index))
}

/// The stream of the `call`-th sample of a seeded buffer: one SplitMix64 mix of the seed and
/// the spread call number. (A different recipe from [`stream`], kept because a saved buffer
/// must go on drawing the samples it would have drawn before.)
pub fn call_stream(seed: u64, call: u64) -> Xoshiro256PlusPlus {
    Xoshiro256PlusPlus::seed_from_u64(mix64(seed ^ call.wrapping_add(1).wrapping_mul(GOLDEN_GAMMA)))
}
