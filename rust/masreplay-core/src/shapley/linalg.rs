//! The little dense linear algebra the regressions need: Cholesky factorisation of a
//! symmetric positive definite matrix (row-major) and the two triangular solves.

/// Lanes of the dot product's partial sums: independent accumulators let the compiler use
/// vector registers (a single running sum is a chain of dependent additions it may not reorder).
const LANES: usize = 8;

/// x . y over the shorter length.
fn dot(x: &[f64], y: &[f64]) -> f64 {
    let len = x.len().min(y.len());
    let [sum] = dots([&x[..len]], &y[..len]);
    sum
}

/// Rows whose dot products with one row are taken together in the factorisation: that row
/// is read once for all of them.
const BLOCK: usize = 4;

/// The dot product of each of `xs` with `y` (over `y`'s length; each x at least as long),
/// summed in [`LANES`] interleaved partial sums: with 256-bit vector registers where the
/// processor has them (each lane's products and sums are rounded one by one either way, no
/// fused multiply-add, so the result is the same bits, and each x's the same as alone).
fn dots<const B: usize>(xs: [&[f64]; B], y: &[f64]) -> [f64; B] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the processor has AVX2, checked just above.
        return unsafe { dots_avx2(xs, y) };
    }
    dots_lanes(xs, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn dots_avx2<const B: usize>(xs: [&[f64]; B], y: &[f64]) -> [f64; B] {
    dots_lanes(xs, y)
}

#[inline(always)]
fn dots_lanes<const B: usize>(xs: [&[f64]; B], y: &[f64]) -> [f64; B] {
    let xs = xs.map(|x| &x[..y.len()]);
    let mut lanes = [[0.0; LANES]; B];
    let y_chunks = y.chunks_exact(LANES);
    let done = y.len() - y_chunks.remainder().len();
    for (c, yc) in y_chunks.enumerate() {
        for (sums, x) in lanes.iter_mut().zip(&xs) {
            let xc = &x[c * LANES..(c + 1) * LANES];
            for lane in 0..LANES {
                sums[lane] += xc[lane] * yc[lane];
            }
        }
    }
    std::array::from_fn(|e| {
        let tail: f64 = xs[e][done..].iter().zip(&y[done..]).map(|(a, b)| a * b).sum();
        lanes[e].iter().sum::<f64>() + tail
    })
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
/// each dot product starts where both rows' nonzeros start. Column by column; the rows below
/// whose dot products start at the same column are taken [`BLOCK`] at a time.
pub fn cholesky(n: usize, mut a: Vec<f64>) -> Option<Factor> {
    let first: Vec<usize> = (0..n).map(|i| a[i * n..i * n + i].iter().position(|&v| v != 0.0).unwrap_or(i)).collect();
    let mut rows: Vec<(usize, usize)> = Vec::with_capacity(n);
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
        // The rows below that reach column j, each with where its dot product starts.
        rows.clear();
        rows.extend(first[j + 1..].iter().enumerate().filter(|&(_, &f)| f <= j).map(|(i, &f)| (i, f.max(first[j]))));
        let mut k = 0;
        while k < rows.len() {
            let start = rows[k].1;
            let same = rows[k..].iter().take(BLOCK).take_while(|&&(_, s)| s == start).count();
            if same == BLOCK {
                let xs: [&[f64]; BLOCK] = std::array::from_fn(|e| {
                    let i = rows[k + e].0;
                    &below[i * n + start..i * n + j]
                });
                let sums = dots(xs, &row_j[start..j]);
                for (e, sum) in sums.into_iter().enumerate() {
                    let cell = &mut below[rows[k + e].0 * n + j];
                    *cell = (*cell - sum) / d;
                }
            } else {
                for &(i, start) in &rows[k..k + same] {
                    let row_i = &mut below[i * n..(i + 1) * n];
                    row_i[j] = (row_i[j] - dot(&row_i[start..j], &row_j[start..j])) / d;
                }
            }
            k += same;
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
