//! The little dense linear algebra the regressions need: Cholesky factorisation of a
//! symmetric positive definite matrix (row-major) and the two triangular solves.

/// Lanes of the dot product's partial sums: independent accumulators let the compiler use
/// vector registers (a single running sum is a chain of dependent additions it may not reorder).
const LANES: usize = 8;

/// x . y over the shorter length, summed in [`LANES`] interleaved partial sums.
fn dot(x: &[f64], y: &[f64]) -> f64 {
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

/// Lower factor L with A = L L', or None when A is not positive definite.
pub fn cholesky(n: usize, mut a: Vec<f64>) -> Option<Vec<f64>> {
    for j in 0..n {
        let rest = &mut a[j * n..];
        let row_j = &rest[..n];
        let d = row_j[j] - dot(&row_j[..j], &row_j[..j]);
        if d <= 0.0 || !d.is_finite() {
            return None;
        }
        let d = d.sqrt();
        rest[j] = d;
        let (row_j, below) = rest.split_at_mut(n);
        for i in 0..n - j - 1 {
            let row_i = &mut below[i * n..(i + 1) * n];
            row_i[j] = (row_i[j] - dot(&row_i[..j], &row_j[..j])) / d;
        }
    }
    Some(a)
}

/// Solves L L' x = b.
pub fn solve(n: usize, l: &[f64], b: &[f64]) -> Vec<f64> {
    let mut y = b.to_vec();
    for i in 0..n {
        y[i] = (y[i] - dot(&l[i * n..i * n + i], &y[..i])) / l[i * n + i];
    }
    for i in (0..n).rev() {
        for k in i + 1..n {
            y[i] -= l[k * n + i] * y[k];
        }
        y[i] /= l[i * n + i];
    }
    y
}
