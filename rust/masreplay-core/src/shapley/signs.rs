//! A feature whose values are +1 or -1 (a triple's character, surrogate.rs) held as its sign
//! bits, one per sample instead of eight bytes, with the products the surrogate's fit takes
//! of it. Each gives the same bits as its dense twin in linalg.rs ([`dot`](super::linalg::dot),
//! [`sub_scaled_then_dot`](super::linalg::sub_scaled_then_dot)) on the feature as numbers and
//! its weighted copy w x: multiplying by +-1 is exact and flips a sign bit, and a product's
//! rounding does not depend on its factors' signs. The fit then reads a bit per sample and the
//! weights (shared by every feature) in place of two vectors per feature, which at hundreds
//! of features do not stay in cache.

use super::linalg::dot;

/// Lanes of the partial sums, as in linalg.rs's [`dot`]: a byte of sign bits per chunk.
const LANES: usize = 8;

/// Each byte's bits as the sign bits of eight f64s, lowest bit first.
const SIGN_LANES: [[u64; LANES]; 256] = {
    let mut table = [[0; LANES]; 256];
    let mut byte = 0;
    while byte < 256 {
        let mut bit = 0;
        while bit < LANES {
            table[byte][bit] = ((byte >> bit) as u64 & 1) << 63;
            bit += 1;
        }
        byte += 1;
    }
    table
};

/// x_j = -1 where bit j of `negative` is set, +1 elsewhere (sample j at byte j / 8, bit j % 8).
pub(super) struct Signs {
    negative: Vec<u8>,
}

/// `a` times the sign of element `j`.
#[inline(always)]
fn signed(a: f64, negative: &[u8], j: usize) -> f64 {
    f64::from_bits(a.to_bits() ^ (u64::from(negative[j / 8] >> (j % 8) & 1) << 63))
}

/// `a` times the signs of a chunk's eight elements.
#[inline(always)]
fn signed_lane(a: f64, signs: &[u64; LANES], lane: usize) -> f64 {
    f64::from_bits(a.to_bits() ^ signs[lane])
}

impl Signs {
    /// From words of bits, a bit per sample, set where the feature is -1.
    pub fn from_words(words: impl Iterator<Item = u64>) -> Self {
        Signs { negative: words.flat_map(u64::to_le_bytes).collect() }
    }

    /// x . (w x), the weighted sum of squares: x (w x) = w, so [`dot`] of the weights and ones.
    pub fn norm(weights: &[f64]) -> f64 {
        dot(weights, &vec![1.0; weights.len()])
    }

    /// y += a x, element by element.
    pub fn add_scaled(&self, y: &mut [f64], a: f64) {
        let body = y.len() - y.len() % LANES;
        for (chunk, &byte) in y.chunks_exact_mut(LANES).zip(&self.negative) {
            let signs = &SIGN_LANES[byte as usize];
            (0..LANES).for_each(|lane| chunk[lane] += signed_lane(a, signs, lane));
        }
        (body..y.len()).for_each(|j| y[j] += signed(a, &self.negative, j));
    }

    /// (w x) . y, the same bits as [`dot`] of the weighted copy w x and y.
    pub fn weighted_dot(&self, weights: &[f64], y: &[f64]) -> f64 {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the processor has AVX2, checked just above.
            return unsafe { weighted_dot_avx2(self, weights, y) };
        }
        weighted_dot_lanes(self, weights, y)
    }

    /// y -= a p (p = `previous`), then (w x) . y: the same bits as
    /// [`sub_scaled_then_dot`](super::linalg::sub_scaled_then_dot) of p and w x.
    pub fn sub_scaled_then_dot(y: &mut [f64], a: f64, previous: &Signs, this: &Signs, weights: &[f64]) -> f64 {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the processor has AVX2, checked just above.
            return unsafe { sub_scaled_then_dot_avx2(y, a, previous, this, weights) };
        }
        sub_scaled_then_dot_lanes(y, a, previous, this, weights)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn weighted_dot_avx2(x: &Signs, weights: &[f64], y: &[f64]) -> f64 {
    weighted_dot_lanes(x, weights, y)
}

/// linalg.rs's `dot_lanes` with the weighted copy's elements made from the weights and signs.
#[inline(always)]
fn weighted_dot_lanes(x: &Signs, weights: &[f64], y: &[f64]) -> f64 {
    let len = weights.len().min(y.len());
    let (w, y, negative) = (&weights[..len], &y[..len], &x.negative);
    let body = len - len % LANES;
    let tail: f64 = (body..len).map(|j| signed(w[j], negative, j) * y[j]).sum();
    let mut lanes = [0.0; LANES];
    for ((wc, yc), &byte) in w.chunks_exact(LANES).zip(y.chunks_exact(LANES)).zip(negative) {
        let signs = &SIGN_LANES[byte as usize];
        for lane in 0..LANES {
            lanes[lane] += signed_lane(wc[lane], signs, lane) * yc[lane];
        }
    }
    lanes.iter().sum::<f64>() + tail
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn sub_scaled_then_dot_avx2(y: &mut [f64], a: f64, previous: &Signs, this: &Signs, weights: &[f64]) -> f64 {
    sub_scaled_then_dot_lanes(y, a, previous, this, weights)
}

/// linalg.rs's `sub_scaled_then_dot_lanes` with both features' elements made from signs.
#[inline(always)]
fn sub_scaled_then_dot_lanes(y: &mut [f64], a: f64, previous: &Signs, this: &Signs, weights: &[f64]) -> f64 {
    let len = y.len();
    let w = &weights[..len];
    let body = len - len % LANES;
    let mut lanes = [0.0; LANES];
    let chunks = y.chunks_exact_mut(LANES).zip(w.chunks_exact(LANES)).zip(previous.negative.iter().zip(&this.negative));
    for ((yc, wc), (&before, &byte)) in chunks {
        let (before, signs) = (&SIGN_LANES[before as usize], &SIGN_LANES[byte as usize]);
        for lane in 0..LANES {
            yc[lane] -= signed_lane(a, before, lane);
            lanes[lane] += signed_lane(wc[lane], signs, lane) * yc[lane];
        }
    }
    (body..len).for_each(|j| y[j] -= signed(a, &previous.negative, j));
    let tail: f64 = (body..len).map(|j| signed(w[j], &this.negative, j) * y[j]).sum();
    lanes.iter().sum::<f64>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shapley::linalg::sub_scaled_then_dot;

    /// Signs and the same feature as numbers, with its weighted copy.
    fn feature(len: usize, seed: u64) -> (Signs, Vec<f64>) {
        let words: Vec<u64> =
            (0..len.div_ceil(64) as u64).map(|k| (k + seed).wrapping_mul(0x9e37_79b9_7f4a_7c15)).collect();
        let values = (0..len).map(|j| if words[j / 64] >> (j % 64) & 1 == 1 { -1.0 } else { 1.0 }).collect();
        (Signs::from_words(words.into_iter()), values)
    }

    /// Every product equals its dense twin's bit for bit, at lengths around the lanes, with
    /// zero weights (signed zeros) among them.
    #[test]
    fn sign_products_equal_the_dense_ones_bit_for_bit() {
        for len in [0, 1, 7, 8, 9, 61, 64, 100, 130] {
            let weights: Vec<f64> =
                (0..len).map(|j| if j % 11 == 3 { 0.0 } else { 1.0 + (j as f64 * 0.7).sin() }).collect();
            let y: Vec<f64> = (0..len).map(|j| (j as f64 * 0.37).cos() / 3.0).collect();
            let (previous, p) = feature(len, 1);
            let (this, x) = feature(len, 5);
            let weighted: Vec<f64> = x.iter().zip(&weights).map(|(x, w)| w * x).collect();
            assert_eq!(Signs::norm(&weights).to_bits(), dot(&x, &weighted).to_bits(), "len {len}");
            assert_eq!(this.weighted_dot(&weights, &y).to_bits(), dot(&weighted, &y).to_bits(), "len {len}");
            let a = -0.123456789;
            let (mut fused, mut dense) = (y.clone(), y.clone());
            let product = sub_scaled_then_dot(&mut dense, a, &p, &weighted);
            let signed = Signs::sub_scaled_then_dot(&mut fused, a, &previous, &this, &weights);
            assert_eq!(signed.to_bits(), product.to_bits(), "len {len}");
            assert!(fused.iter().zip(&dense).all(|(f, d)| f.to_bits() == d.to_bits()), "len {len}");
            let (mut added, mut dense) = (y.clone(), y.clone());
            this.add_scaled(&mut added, a);
            dense.iter_mut().zip(&x).for_each(|(y, x)| *y += a * x);
            assert!(added.iter().zip(&dense).all(|(s, d)| s.to_bits() == d.to_bits()), "len {len}");
        }
    }
}
