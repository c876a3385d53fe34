//! torch's fp32 `sqrt` on the CPU, for TRL's `nanstd`. torch's x86 wheels hand it to MKL's
//! `vsSqrt` (VML_HA), and MKL picks the kernel by CPU; two of its kernels are not correctly
//! rounded. Found by calling each kernel in torch 2.15's MKL 2024.2 directly and comparing
//! with these emulations over every non-negative fp32 value (2^31 inputs, 0 differences):
//! - CPUs not made by Intel (seen on an AMD EPYC): MKL's generic SSE kernel, `rsqrtps` then
//!   one Goldschmidt step in separately rounded multiplies and adds; up to 0.75 ulp, 17% of
//!   results differ from the correctly rounded root. `rsqrtps` is the CPU's own
//!   approximation (it differs between vendors), so the emulation runs the same instruction.
//! - Intel CPUs with AVX-512: `vrsqrt14ps` (defined bit for bit by Intel) then one step with
//!   FMA; 0.6% of results differ.
//! - Intel CPUs with AVX2 only: correctly rounded from 2^-100 up (that kernel's rescaled path
//!   below it is not emulated); other CPUs, and torch without MKL: correctly rounded.
//!
//! Which kernel MKL picks on Intel CPUs is inferred from its kernel names and was not
//! observed (the development machine is an AMD EPYC); `MKL_ENABLE_INSTRUCTIONS` and
//! `MKL_CBWR` change MKL's choice and are not followed.

use crate::names::named_enum;
use std::sync::OnceLock;

named_enum!(
    /// The square root torch computes on this CPU.
    SqrtKernel as "kernel" {
        CorrectlyRounded = "correctly-rounded",
        /// MKL's generic SSE kernel (CPUs not made by Intel; its emulation runs on them only).
        MklGeneric = "mkl-generic",
        /// MKL's AVX-512 kernel (Intel CPUs with AVX-512).
        MklAvx512 = "mkl-avx512",
    }
);

impl SqrtKernel {
    /// The kernel torch's MKL runs on this CPU.
    pub fn detect() -> Self {
        static DETECTED: OnceLock<SqrtKernel> = OnceLock::new();
        *DETECTED.get_or_init(detect)
    }

    /// Whether this CPU can run the kernel's emulation. The generic kernel's `rsqrtps` is the
    /// CPU vendor's own approximation: an Intel CPU's differs from the one MKL runs that kernel
    /// on (3,207 of the 43,628 captured roots differ on an Intel Xeon), so it is refused there.
    pub fn available(self) -> bool {
        match self {
            SqrtKernel::CorrectlyRounded => true,
            #[cfg(target_arch = "x86_64")]
            SqrtKernel::MklGeneric => !is_intel(),
            #[cfg(target_arch = "x86_64")]
            SqrtKernel::MklAvx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }
}

/// Whether the CPU's vendor string is "GenuineIntel".
#[cfg(target_arch = "x86_64")]
fn is_intel() -> bool {
    // SAFETY: leaf 0 exists on every x86_64 CPU (Rust versions differ on whether cpuid is an unsafe call).
    #[allow(unused_unsafe)]
    let leaf = unsafe { std::arch::x86_64::__cpuid(0) };
    (leaf.ebx, leaf.edx, leaf.ecx) == (0x756e_6547, 0x4965_6e69, 0x6c65_746e)
}

#[cfg(target_arch = "x86_64")]
fn detect() -> SqrtKernel {
    let intel = is_intel();
    let avx512 = std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512cd")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512dq")
        && std::arch::is_x86_feature_detected!("avx512vl");
    match (intel, avx512) {
        (false, _) => SqrtKernel::MklGeneric,
        (true, true) => SqrtKernel::MklAvx512,
        (true, false) => SqrtKernel::CorrectlyRounded,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> SqrtKernel {
    SqrtKernel::CorrectlyRounded
}

/// `sqrt(x)` as `kernel` rounds it; `kernel` must be [`SqrtKernel::available`].
#[inline]
pub fn torch_sqrt(x: f32, kernel: SqrtKernel) -> f32 {
    match kernel {
        SqrtKernel::CorrectlyRounded => x.sqrt(),
        #[cfg(target_arch = "x86_64")]
        SqrtKernel::MklGeneric => mkl_generic(x),
        #[cfg(target_arch = "x86_64")]
        SqrtKernel::MklAvx512 => {
            assert!(kernel.available(), "the AVX-512 square root needs a CPU with AVX-512");
            // SAFETY: the CPU has AVX-512F (checked above).
            unsafe { mkl_avx512(x) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        _ => x.sqrt(),
    }
}

#[cfg(target_arch = "x86_64")]
fn mkl_generic(x: f32) -> f32 {
    use std::arch::x86_64::{_mm_cvtss_f32, _mm_rsqrt_ss, _mm_set_ss};
    // Positive normal values up to 0x7f7ff000; MKL roots the rest exactly.
    if !(x.is_normal() && x > 0.0 && x.to_bits() <= 0x7f7f_f000) {
        return x.sqrt();
    }
    // SAFETY: SSE is part of x86_64.
    let y = unsafe { _mm_cvtss_f32(_mm_rsqrt_ss(_mm_set_ss(x))) };
    let (s, h) = (y * x, y * 0.5);
    let e = 0.5 - s * h;
    let (s, h) = (s * e + s, h * e + h);
    (x - s * s) * h + s
}

/// Needs AVX-512F (`vrsqrt14ss`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn mkl_avx512(x: f32) -> f32 {
    use std::arch::x86_64::{_mm_cvtss_f32, _mm_rsqrt14_ss, _mm_set_ss};
    if x <= 0.0 || x.is_infinite() || x.is_nan() {
        return x.sqrt();
    }
    let y = _mm_cvtss_f32(_mm_rsqrt14_ss(_mm_set_ss(x), _mm_set_ss(x)));
    let (s, h) = (y * x, y * 0.5);
    if y > 2f32.powi(39) {
        // Tiny x: the step runs on x * 2^78 so that the residual keeps its bits.
        let (xs, ss) = (x * 2f32.powi(78), s * 2f32.powi(39));
        (h * 2f32.powi(-78)).mul_add((-ss).mul_add(ss, xs), s)
    } else {
        (-s).mul_add(s, x).mul_add(h, s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_roots_squares_and_edges_exactly() {
        for kernel in [SqrtKernel::CorrectlyRounded, SqrtKernel::MklGeneric, SqrtKernel::MklAvx512] {
            if !kernel.available() {
                continue;
            }
            for k in 1..2000u32 {
                let root = k as f32 * 0.25;
                assert_eq!(torch_sqrt(root * root, kernel), root, "{kernel:?} {root}");
            }
            assert_eq!(torch_sqrt(0.0, kernel), 0.0);
            assert_eq!(torch_sqrt(f32::INFINITY, kernel), f32::INFINITY);
            assert!(torch_sqrt(f32::NAN, kernel).is_nan() && torch_sqrt(-1.0, kernel).is_nan());
            assert_eq!(SqrtKernel::from_name(kernel.as_str()), Some(kernel));
        }
    }

    #[test]
    fn the_mkl_kernels_stay_within_one_ulp() {
        for kernel in [SqrtKernel::MklGeneric, SqrtKernel::MklAvx512] {
            if !kernel.available() {
                continue;
            }
            let mut x = 1e-30f32;
            while x < 1e30 {
                let (ours, exact) = (torch_sqrt(x, kernel), x.sqrt());
                assert!((ours.to_bits() as i64 - exact.to_bits() as i64).abs() <= 1, "{kernel:?} {x}");
                x *= 1.0007;
            }
        }
    }
}
