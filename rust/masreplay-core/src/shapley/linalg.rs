//! The little dense linear algebra the regressions need: Cholesky factorisation of a
//! symmetric positive definite matrix (row-major), the two triangular solves, and products
//! with a symmetric matrix given by its lower triangle.

/// Lanes of the dot product's partial sums: independent accumulators let the compiler use
/// vector registers (a single running sum is a chain of dependent additions it may not reorder).
const LANES: usize = 8;
/// Rows of the factor computed together (see [`cholesky`]).
const ROWS: usize = 4;

/// x . y over the shorter length, summed in [`LANES`] interleaved partial sums: with 256-bit
/// vector registers where the processor has them (each lane's products and sums are rounded
/// one by one either way, no fused multiply-add, so the result is the same bits).
pub(super) fn dot(x: &[f64], y: &[f64]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the processor has AVX2, checked just above.
        return unsafe { dot_avx2(x, y) };
    }
    dot_lanes(x, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn dot_avx2(x: &[f64], y: &[f64]) -> f64 {
    dot_lanes(x, y)
}

#[inline(always)]
fn dot_lanes(x: &[f64], y: &[f64]) -> f64 {
    let len = x.len().min(y.len());
    let (x, y) = (&x[..len], &y[..len]);
    let mut lanes = [0.0; LANES];
    let (x_chunks, y_chunks) = (x.chunks_exact(LANES), y.chunks_exact(LANES));
    let tail: f64 = x_chunks.remainder().iter().zip(y_chunks.remainder()).map(|(a, b)| a * b).sum();
    for (xc, yc) in x_chunks.zip(y_chunks) {
        for lane in 0..LANES {
            lanes[lane] += xc[lane] * yc[lane];
        }
    }
    lanes.iter().sum::<f64>() + tail
}

/// y -= a x, then z . y over y's length: the same bits as the update followed by [`dot`], in
/// one pass over y.
pub(super) fn sub_scaled_then_dot(y: &mut [f64], a: f64, x: &[f64], z: &[f64]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the processor has AVX2, checked just above.
        return unsafe { sub_scaled_then_dot_avx2(y, a, x, z) };
    }
    sub_scaled_then_dot_lanes(y, a, x, z)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn sub_scaled_then_dot_avx2(y: &mut [f64], a: f64, x: &[f64], z: &[f64]) -> f64 {
    sub_scaled_then_dot_lanes(y, a, x, z)
}

/// [`dot_lanes`]' partial sums, each element of y updated just before it is read.
#[inline(always)]
fn sub_scaled_then_dot_lanes(y: &mut [f64], a: f64, x: &[f64], z: &[f64]) -> f64 {
    let len = y.len();
    let (x, z) = (&x[..len], &z[..len]);
    let mut lanes = [0.0; LANES];
    let (mut y_chunks, x_chunks, z_chunks) = (y.chunks_exact_mut(LANES), x.chunks_exact(LANES), z.chunks_exact(LANES));
    let (x_tail, z_tail) = (x_chunks.remainder(), z_chunks.remainder());
    for ((yc, xc), zc) in (&mut y_chunks).zip(x_chunks).zip(z_chunks) {
        for lane in 0..LANES {
            yc[lane] -= a * xc[lane];
            lanes[lane] += zc[lane] * yc[lane];
        }
    }
    let y_tail = y_chunks.into_remainder();
    y_tail.iter_mut().zip(x_tail).for_each(|(y, x)| *y -= a * x);
    let tail: f64 = z_tail.iter().zip(y_tail.iter()).map(|(a, b)| a * b).sum();
    lanes.iter().sum::<f64>() + tail
}

/// The lower Cholesky factor L of A = L L' (row-major), with the column where each of its
/// rows' nonzeros start.
pub struct Factor {
    n: usize,
    l: Vec<f64>,
    first: Vec<usize>,
}

/// Factors A, or None when it is not positive definite. Reads the lower triangle of A only.
/// Zeros at the start of A's rows stay zeros in L (a banded Gram matrix keeps its band), so
/// each dot product starts where both rows' nonzeros start.
///
/// L is built [`ROWS`] rows at a time: their entries left of the block from the finished rows
/// above, each finished row read once for all of them (and their dot products' additions
/// interleaved, not one dependent chain after another), then the block's own triangle. Every
/// entry is the same expression of the same numbers as column by column, so the same bits:
/// L_ij = (A_ij - L_i. L_j.) / L_jj over the columns before j, L_jj = sqrt(A_jj - L_j. L_j.).
pub fn cholesky(n: usize, mut a: Vec<f64>) -> Option<Factor> {
    let first: Vec<usize> = (0..n).map(|i| a[i * n..i * n + i].iter().position(|&v| v != 0.0).unwrap_or(i)).collect();
    let mut top = 0;
    while top < n {
        let bottom = (top + ROWS).min(n);
        let (done, block) = a.split_at_mut(top * n);
        let block = &mut block[..(bottom - top) * n];
        let firsts = &first[top..bottom];
        let same_first = bottom - top == ROWS && firsts.iter().all(|&f| f == firsts[0]);
        let leftmost = firsts.iter().copied().min().unwrap_or(top);
        // Rows starting at the same column share each dot product's range, so one pass over a
        // finished row serves all of them.
        for j in leftmost..top {
            let row_j = &done[j * n..(j + 1) * n];
            if same_first && firsts[0] <= j {
                let start = firsts[0].max(first[j]);
                let products = dots4(
                    [
                        &block[start..j],
                        &block[n + start..n + j],
                        &block[2 * n + start..2 * n + j],
                        &block[3 * n + start..3 * n + j],
                    ],
                    &row_j[start..j],
                );
                let d = row_j[j];
                for (r, product) in products.into_iter().enumerate() {
                    block[r * n + j] = (block[r * n + j] - product) / d;
                }
                continue;
            }
            for (r, &first_i) in firsts.iter().enumerate() {
                if first_i <= j {
                    let start = first_i.max(first[j]);
                    let product = dot(&block[r * n + start..r * n + j], &row_j[start..j]);
                    block[r * n + j] = (block[r * n + j] - product) / row_j[j];
                }
            }
        }
        for (r, i) in (top..bottom).enumerate() {
            for (q, j) in (top..i).enumerate() {
                if first[i] <= j {
                    let start = first[i].max(first[j]);
                    let product = dot(&block[r * n + start..r * n + j], &block[q * n + start..q * n + j]);
                    block[r * n + j] = (block[r * n + j] - product) / block[q * n + j];
                }
            }
            let row_i = &block[r * n..(r + 1) * n];
            let d = row_i[i] - dot(&row_i[first[i]..i], &row_i[first[i]..i]);
            if d <= 0.0 || !d.is_finite() {
                return None;
            }
            block[r * n + i] = d.sqrt();
        }
        top = bottom;
    }
    Some(Factor { n, l: a, first })
}

/// [`dot`] of each of four rows with y (each as long as y), the same bits as four calls.
fn dots4(xs: [&[f64]; 4], y: &[f64]) -> [f64; 4] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the processor has AVX2, checked just above.
        return unsafe { dots4_avx2(xs, y) };
    }
    [dot(xs[0], y), dot(xs[1], y), dot(xs[2], y), dot(xs[3], y)]
}

/// [`dots4`] in 256-bit registers: lanes 0-3 and 4-7 of [`dot_lanes`]'s partial sums, per
/// row, each product and sum rounded one by one as there (no fused multiply-add).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn dots4_avx2(xs: [&[f64]; 4], y: &[f64]) -> [f64; 4] {
    use std::arch::x86_64::*;
    let len = y.len();
    let body = len - len % LANES;
    let [x0, x1, x2, x3] = xs;
    let (x0, x1, x2, x3) = (&x0[..len], &x1[..len], &x2[..len], &x3[..len]);
    let z = _mm256_setzero_pd();
    let (mut a0, mut b0, mut a1, mut b1, mut a2, mut b2, mut a3, mut b3) = (z, z, z, z, z, z, z, z);
    let mut c = 0;
    while c < body {
        // SAFETY: c + 8 <= body <= the length of every slice.
        unsafe {
            let y0 = _mm256_loadu_pd(y.as_ptr().add(c));
            let y1 = _mm256_loadu_pd(y.as_ptr().add(c + 4));
            a0 = _mm256_add_pd(a0, _mm256_mul_pd(_mm256_loadu_pd(x0.as_ptr().add(c)), y0));
            b0 = _mm256_add_pd(b0, _mm256_mul_pd(_mm256_loadu_pd(x0.as_ptr().add(c + 4)), y1));
            a1 = _mm256_add_pd(a1, _mm256_mul_pd(_mm256_loadu_pd(x1.as_ptr().add(c)), y0));
            b1 = _mm256_add_pd(b1, _mm256_mul_pd(_mm256_loadu_pd(x1.as_ptr().add(c + 4)), y1));
            a2 = _mm256_add_pd(a2, _mm256_mul_pd(_mm256_loadu_pd(x2.as_ptr().add(c)), y0));
            b2 = _mm256_add_pd(b2, _mm256_mul_pd(_mm256_loadu_pd(x2.as_ptr().add(c + 4)), y1));
            a3 = _mm256_add_pd(a3, _mm256_mul_pd(_mm256_loadu_pd(x3.as_ptr().add(c)), y0));
            b3 = _mm256_add_pd(b3, _mm256_mul_pd(_mm256_loadu_pd(x3.as_ptr().add(c + 4)), y1));
        }
        c += LANES;
    }
    let finish = |lo: __m256d, hi: __m256d, x: &[f64]| -> f64 {
        let mut lanes = [0.0; LANES];
        // SAFETY: lanes holds 8 doubles.
        unsafe {
            _mm256_storeu_pd(lanes.as_mut_ptr(), lo);
            _mm256_storeu_pd(lanes.as_mut_ptr().add(4), hi);
        }
        let tail: f64 = x[body..].iter().zip(&y[body..]).map(|(a, b)| a * b).sum();
        lanes.iter().sum::<f64>() + tail
    };
    [finish(a0, b0, x0), finish(a1, b1, x1), finish(a2, b2, x2), finish(a3, b3, x3)]
}

impl Factor {
    /// Solves L L' x = b.
    pub fn solve(&self, b: &[f64]) -> Vec<f64> {
        let (n, l) = (self.n, &self.l);
        let mut y = b.to_vec();
        for i in 0..n {
            let f = self.first[i];
            y[i] = (y[i] - dot(&l[i * n + f..i * n + i], &y[f..i])) / l[i * n + i];
        }
        // L' x = y by rows of L (the columns of L'): each x_k, once known, leaves the rows
        // above it.
        for k in (0..n).rev() {
            y[k] /= l[k * n + k];
            let (above, x_k) = (self.first[k], y[k]);
            y[above..k].iter_mut().zip(&l[k * n + above..k * n + k]).for_each(|(y_i, l_ki)| *y_i -= l_ki * x_k);
        }
        y
    }
}

/// The value `.sum()` of f64s starts from: a sum that must give `.sum()`'s bits in another
/// order of loops starts here.
pub(super) fn sum_start() -> f64 {
    std::iter::empty::<f64>().sum()
}

/// A x for each x of `xs`, with A symmetric and given by its lower triangle (row-major,
/// n x n; the upper one is not read). Each entry is summed over the columns in order from the
/// value `Sum` starts from: the same bits as `.sum()` of the products along A's full row.
/// [`ROWS`] rows are summed together, independent chains of additions that the processor
/// overlaps (one row after another, each addition waits on the one before).
pub fn symmetric_products<const K: usize>(n: usize, lower: &[f64], xs: [&[f64]; K]) -> [Vec<f64>; K] {
    let start = sum_start();
    let mut out = xs.map(|_| vec![0.0; n]);
    for top in (0..n).step_by(ROWS) {
        let rows = top..(top + ROWS).min(n);
        let mut sums = [[start; ROWS]; K];
        for j in 0..n {
            for (r, i) in rows.clone().enumerate() {
                let a = if j <= i { lower[i * n + j] } else { lower[j * n + i] };
                sums.iter_mut().zip(&xs).for_each(|(sum, x)| sum[r] += a * x[j]);
            }
        }
        for (products, sum) in out.iter_mut().zip(&sums) {
            products[rows.clone()].copy_from_slice(&sum[..rows.len()]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The factorisation column by column, one dot product per entry: what [`cholesky`]
    /// must equal bit for bit.
    fn by_columns(n: usize, mut a: Vec<f64>) -> Option<Vec<f64>> {
        let first: Vec<usize> =
            (0..n).map(|i| a[i * n..i * n + i].iter().position(|&v| v != 0.0).unwrap_or(i)).collect();
        for j in 0..n {
            let d = a[j * n + j] - dot(&a[j * n + first[j]..j * n + j], &a[j * n + first[j]..j * n + j]);
            if d <= 0.0 || !d.is_finite() {
                return None;
            }
            a[j * n + j] = d.sqrt();
            for i in (j + 1..n).filter(|&i| first[i] <= j) {
                let start = first[i].max(first[j]);
                let product = dot(&a[i * n + start..i * n + j], &a[j * n + start..j * n + j]);
                a[i * n + j] = (a[i * n + j] - product) / a[j * n + j];
            }
        }
        Some(a)
    }

    /// A symmetric positive definite matrix; banded in blocks of `band` rows when `band` > 0
    /// (the shape of msr's Gram matrices, whose rows start at different columns).
    fn spd(n: usize, band: usize, seed: u64) -> Vec<f64> {
        let mut state = seed;
        let mut next = || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        };
        let k = n + 3;
        let z: Vec<f64> = (0..k * n).map(|_| next()).collect();
        let mut a = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..n {
                if band == 0 || (i / band).abs_diff(j / band) <= 1 {
                    a[i * n + j] = (0..k).map(|r| z[r * n + i] * z[r * n + j]).sum::<f64>();
                }
            }
            a[i * n + i] += n as f64;
        }
        a
    }

    #[test]
    fn blocked_factor_equals_column_by_column_bit_for_bit() {
        let shapes = [(1, 0), (2, 0), (3, 0), (5, 0), (7, 0), (9, 0), (17, 0), (100, 0), (30, 5), (61, 7), (64, 10)];
        for (n, band) in shapes {
            for seed in 0..3 {
                let a = spd(n, band, seed);
                let blocked = cholesky(n, a.clone()).expect("positive definite");
                let reference = by_columns(n, a).expect("positive definite");
                let same = blocked.l.iter().zip(&reference).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "n {n} band {band} seed {seed}");
            }
        }
    }

    #[test]
    fn a_matrix_not_positive_definite_has_no_factor() {
        let mut a = spd(10, 0, 1);
        a[6 * 10 + 6] = -1.0;
        assert!(cholesky(10, a.clone()).is_none());
        assert!(by_columns(10, a).is_none());
    }

    #[test]
    fn the_fused_update_and_product_equal_the_two_passes_bit_for_bit() {
        for len in [0, 1, 7, 8, 9, 61, 100] {
            let y: Vec<f64> = (0..len).map(|i| (i as f64 * 0.37).sin()).collect();
            let x: Vec<f64> = (0..len).map(|i| if i % 3 == 0 { -1.0 } else { 1.0 / (i as f64 + 1.5) }).collect();
            let z: Vec<f64> = (0..len).map(|i| (i as f64 * 1.3).cos() / 7.0).collect();
            let a = 0.123456789;
            let mut apart = y.clone();
            apart.iter_mut().zip(&x).for_each(|(y, x)| *y -= a * x);
            let product = dot(&z, &apart);
            let mut fused = y.clone();
            assert_eq!(sub_scaled_then_dot(&mut fused, a, &x, &z).to_bits(), product.to_bits(), "len {len}");
            assert!(fused.iter().zip(&apart).all(|(f, y)| f.to_bits() == y.to_bits()), "len {len}");
        }
    }

    #[test]
    fn symmetric_products_equal_full_row_sums_bit_for_bit() {
        for n in [1, 2, 5, 9, 23, 100] {
            let a = spd(n, 0, 7);
            let mut lower = a.clone();
            (0..n).for_each(|i| (i + 1..n).for_each(|j| lower[i * n + j] = f64::NAN));
            let x: Vec<f64> = (0..n).map(|i| (i as f64 * 0.37).sin()).collect();
            let y: Vec<f64> = (0..n).map(|i| 1.0 / (i as f64 + 1.5)).collect();
            let [ax, ay] = symmetric_products(n, &lower, [&x, &y]);
            for (v, products) in [(&x, &ax), (&y, &ay)] {
                for i in 0..n {
                    let full: f64 = a[i * n..(i + 1) * n].iter().zip(v.iter()).map(|(a, v)| a * v).sum();
                    assert_eq!(full.to_bits(), products[i].to_bits(), "n {n} row {i}");
                }
            }
        }
    }

    #[test]
    fn the_factor_solves_the_system() {
        let n = 23;
        let a = spd(n, 0, 5);
        let x: Vec<f64> = (0..n).map(|i| i as f64 - 7.5).collect();
        let b: Vec<f64> = (0..n).map(|i| (0..n).map(|j| a[i * n + j] * x[j]).sum()).collect();
        let solved = cholesky(n, a).expect("positive definite").solve(&b);
        assert!(solved.iter().zip(&x).all(|(s, x)| (s - x).abs() < 1e-9));
    }
}
