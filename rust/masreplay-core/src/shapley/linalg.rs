//! The little dense linear algebra the regressions need: Cholesky factorisation of a
//! symmetric positive definite matrix (row-major) and the two triangular solves.

/// Lanes of the dot product's partial sums: independent accumulators let the compiler use
/// vector registers (a single running sum is a chain of dependent additions it may not reorder).
const LANES: usize = 8;

/// x . y over the shorter length, summed in [`LANES`] interleaved partial sums: with 256-bit
/// vector registers where the processor has them (each lane's products and sums are rounded
/// one by one either way, no fused multiply-add, so the result is the same bits).
fn dot(x: &[f64], y: &[f64]) -> f64 {
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
pub fn cholesky(n: usize, mut a: Vec<f64>) -> Option<Factor> {
    let first: Vec<usize> = (0..n).map(|i| a[i * n..i * n + i].iter().position(|&v| v != 0.0).unwrap_or(i)).collect();
    for j in 0..n {
        let rest = &mut a[j * n..];
        let row_j = &rest[..n];
        let d = row_j[j] - dot(&row_j[first[j]..j], &row_j[first[j]..j]);
        if d <= 0.0 || !d.is_finite() {
            return None;
        }
        let d = d.sqrt();
        rest[j] = d;
        let (row_j, below) = rest.split_at_mut(n);
        for (i, &first_i) in first[j + 1..].iter().enumerate().filter(|&(_, &f)| f <= j) {
            let start = first_i.max(first[j]);
            let row_i = &mut below[i * n..(i + 1) * n];
            row_i[j] = (row_i[j] - dot(&row_i[start..j], &row_j[start..j])) / d;
        }
    }
    Some(Factor { n, l: a, first })
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
