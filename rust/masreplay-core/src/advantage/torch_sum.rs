//! torch's fp32 summation order on the CPU, so the trainer modes round exactly as torch does.
//!
//! `torch.sum` / `mean` / `nansum` over a contiguous dimension (ATen's `cascade_sum`): with at
//! least 8 values, 8 lanes each sum every 8th value (`row_sum` below over the lane's values),
//! then a scalar sum of the leftover tail, to which the 8 lane sums are added in order; with
//! fewer, `row_sum` directly. `row_sum` keeps 4 interleaved accumulators (values 4i..4i+3),
//! adds a tail to the first, and folds the others into it; above 16 rows per accumulator it
//! cascades partial sums over 4 levels to bound the error. Checked against torch 2.15 for
//! sizes 2..5000 (the AVX2 and AVX-512 builds both sum 8 lanes here).

const LANES: usize = 8;
const ILP: usize = 4;
const LEVELS: usize = 4;

fn ceil_log2(x: usize) -> usize {
    if x <= 1 { 0 } else { (usize::BITS - (x - 1).leading_zeros()) as usize }
}

/// ATen's `multi_row_sum` with 4 columns over `rows` rows; `at(i, k)` is row i, column k.
/// Indexed loops on purpose: they mirror ATen's, whose order is the point.
#[allow(clippy::needless_range_loop)]
fn multi_row_sum(rows: usize, at: impl Fn(usize, usize) -> f32) -> [f32; ILP] {
    let level_power = 4.max(ceil_log2(rows) / LEVELS);
    let level_step = 1usize << level_power;
    let level_mask = level_step - 1;
    let mut acc = [[0f32; ILP]; LEVELS];
    let mut i = 0;
    while i + level_step <= rows {
        for _ in 0..level_step {
            for (k, slot) in acc[0].iter_mut().enumerate() {
                *slot += at(i, k);
            }
            i += 1;
        }
        for j in 1..LEVELS {
            for k in 0..ILP {
                acc[j][k] += acc[j - 1][k];
                acc[j - 1][k] = 0.0;
            }
            if i & (level_mask << (j * level_power)) != 0 {
                break;
            }
        }
    }
    while i < rows {
        for (k, slot) in acc[0].iter_mut().enumerate() {
            *slot += at(i, k);
        }
        i += 1;
    }
    for j in 1..LEVELS {
        for k in 0..ILP {
            acc[0][k] += acc[j][k];
        }
    }
    acc[0]
}

/// ATen's scalar `row_sum` of `size` values `value(i)`.
fn row_sum(size: usize, value: impl Fn(usize) -> f32) -> f32 {
    let rows = size / ILP;
    let mut partial = multi_row_sum(rows, |i, k| value(i * ILP + k));
    for i in rows * ILP..size {
        partial[0] += value(i);
    }
    for k in 1..ILP {
        partial[0] += partial[k];
    }
    partial[0]
}

/// `torch.sum` of `values` (fp32, contiguous, one thread), NaN read as 0 when `skip_nan`
/// (`torch.nansum`).
pub(crate) fn torch_sum(values: &[f32], skip_nan: bool) -> f32 {
    torch_sum_threads(values, skip_nan, 1)
}

/// [`torch_sum`] of the `n` values `load(0..n)`, for tensors never built.
fn torch_sum_of(n: usize, load: impl Fn(usize) -> f32) -> f32 {
    if n < LANES {
        return row_sum(n, load);
    }
    let vectors = n / LANES;
    let mut total = 0f32;
    for i in vectors * LANES..n {
        total += load(i);
    }
    for lane in 0..LANES {
        total += row_sum(vectors, |i| load(i * LANES + lane));
    }
    total
}

/// ATen's `internal::GRAIN_SIZE`: a whole-tensor sum this long or longer is split between
/// threads.
const GRAIN: usize = 32768;

/// `torch.sum` of a whole tensor (`values`, contiguous) on `threads` intra-op threads: from
/// [`GRAIN`] values up, ATen's two-pass reduction gives each of `min(threads, n / GRAIN
/// rounded up)` tasks an equal contiguous chunk (the last shorter), sums each as above into
/// a buffer of `threads` slots (unused ones 0), then sums the buffer.
pub(crate) fn torch_sum_threads(values: &[f32], skip_nan: bool, threads: usize) -> f32 {
    let load = |x: f32| if skip_nan && x.is_nan() { 0.0 } else { x };
    if (LANES..SHORT).contains(&values.len()) {
        return short_sum(values, load);
    }
    torch_sum_threads_of(values.len(), threads, |i| load(values[i]))
}

/// Below this many values no lane of [`torch_sum_of`] has 16 rows of accumulators, so none
/// cascades: every sum of a group of rollouts.
const SHORT: usize = LANES * ILP * 16;

/// [`torch_sum_of`] of `LANES..SHORT` values, each read through `load`, in the same order but
/// as one block of `LANES * ILP` accumulators (`acc[k * LANES + lane]` is the lane's
/// accumulator `k`), which vectorises. ATen's upper levels stay 0 below 16 rows; folding
/// them in changes nothing, as a sum begun at +0 is never -0.
fn short_sum(values: &[f32], load: impl Fn(f32) -> f32) -> f32 {
    let vectors = values.len() / LANES;
    let rows = vectors / ILP;
    let (blocks, rest) = values.split_at(rows * LANES * ILP);
    let (lane_tails, tail) = rest.split_at((vectors - rows * ILP) * LANES);
    let mut acc = [0f32; LANES * ILP];
    for block in blocks.chunks_exact(LANES * ILP) {
        acc.iter_mut().zip(block).for_each(|(a, &x)| *a += load(x));
    }
    for row in lane_tails.chunks_exact(LANES) {
        acc.iter_mut().zip(row).for_each(|(a, &x)| *a += load(x));
    }
    let mut total = tail.iter().fold(0f32, |total, &x| total + load(x));
    for lane in 0..LANES {
        total += ((acc[lane] + acc[LANES + lane]) + acc[2 * LANES + lane]) + acc[3 * LANES + lane];
    }
    total
}

/// [`torch_sum_threads`] of the `n` values `load(0..n)`.
pub(crate) fn torch_sum_threads_of(n: usize, threads: usize, load: impl Fn(usize) -> f32) -> f32 {
    if threads <= 1 || n < GRAIN {
        return torch_sum_of(n, load);
    }
    let tasks = threads.min(n.div_ceil(GRAIN));
    let chunk = n.div_ceil(tasks);
    let mut partials = vec![0f32; threads];
    for (task, slot) in partials.iter_mut().enumerate().take(tasks) {
        let start = task * chunk;
        *slot = torch_sum_of(chunk.min(n.saturating_sub(start)), |i| load(start + i));
    }
    torch_sum(&partials, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_sums_follow_the_accumulator_order() {
        // Fewer than 8 values: accumulators (x0 + x4), x1, x2, x3 folded in order.
        let x = [1e8f32, 1.0, -1e8, 1.0, 1.0];
        let expected: f32 = (((1e8f32 + 1.0) + 1.0) + -1e8) + 1.0;
        assert_eq!(torch_sum(&x, false), expected);
        assert_eq!(torch_sum(&[f32::NAN, 2.0], true), 2.0);
        assert_eq!(torch_sum(&[], false), 0.0);
    }

    #[test]
    fn short_sums_take_the_general_order() {
        // Values of mixed scales, so that any other order rounds differently; every length
        // the short path takes and a few past it; NaN skipped or kept.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let scale = [1e-3f32, 1.0, 1e4][(state % 3) as usize];
            ((state >> 11) as f32 / (1u64 << 53) as f32 - 0.5) * scale
        };
        let mut values: Vec<f32> = (0..SHORT + 40).map(|_| next()).collect();
        values[5] = f32::NAN;
        values[300] = -0.0;
        for n in 0..values.len() {
            let values = &values[..n];
            for skip_nan in [true, false] {
                let load = |i: usize| if skip_nan && values[i].is_nan() { 0.0 } else { values[i] };
                let (ours, general) = (torch_sum_threads(values, skip_nan, 1), torch_sum_of(n, load));
                assert_eq!(ours.to_bits(), general.to_bits(), "{n} values, skip_nan {skip_nan}");
            }
        }
    }

    #[test]
    fn exact_for_integers() {
        let x: Vec<f32> = (0..5000).map(|i| (i % 7) as f32).collect();
        assert_eq!(torch_sum(&x, false), x.iter().map(|&v| v as f64).sum::<f64>() as f32);
    }
}
