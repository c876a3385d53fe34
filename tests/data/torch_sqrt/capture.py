"""Captures the fp32 square roots torch and its MKL kernels compute, for tests/test_torch_sqrt.py.

Run with torch installed (x86-64): `python tests/data/torch_sqrt/capture.py`. It calls each
single-precision VML_HA square-root kernel that torch's bundled MKL exports, plus torch.sqrt
itself, on a fixed input set, and writes their outputs as raw bits to `mkl_sqrt_fp32.npz`
beside this file. The test then holds masreplay's emulations to these outputs without torch.
"""

import ctypes
import platform
from pathlib import Path

import numpy as np
import torch

# MKL's kernel suffixes: CPU dispatch level + accuracy (HA = high accuracy, what vsSqrt runs).
# Matched to masreplay's emulation names by comparing outputs (E2 is an older SSE2 kernel
# MKL no longer dispatches to on these CPUs; it is not emulated and not captured).
KERNELS = {
    "EXHAynn": "mkl-generic",  # CPUs not made by Intel
    "L9HAynn": "correctly-rounded",  # Intel AVX2
    "Z0HAynn": "mkl-avx512",  # Intel AVX-512
}


def inputs() -> np.ndarray:
    """Every 499th mantissa of [1, 4) (both exponent parities), random fp32 bit patterns of the
    non-negative finite range from 2^-100 up (below it the AVX2 kernel rescales, not emulated),
    and the edges of the range."""
    mantissas = np.arange(0x3F800000, 0x40800000, 499, dtype=np.uint32)
    rng = np.random.default_rng(20261125)
    wide = rng.integers(np.float32(2.0**-100).view(np.uint32), 0x7F800000, 10_000, dtype=np.uint32)
    edges = np.array([0x0D800000, 0x3F800000, 0x3F800001, 0x407FFFFF, 0x7F7FF000, 0x7F7FFFFF], np.uint32)
    return np.concatenate([mantissas, wide, edges]).view(np.float32)


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def main() -> None:
    library = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
    x = inputs()
    outputs = {}
    for suffix, name in KERNELS.items():
        kernel = getattr(library, f"mkl_vml_kernel_sSqrt_{suffix}")
        out = np.empty_like(x)
        kernel(ctypes.c_longlong(x.size), x.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p))
        outputs[name] = out.view(np.uint32)
    np.savez_compressed(
        Path(__file__).with_name("mkl_sqrt_fp32.npz"),
        inputs=x.view(np.uint32),
        torch_sqrt=torch.sqrt(torch.from_numpy(x)).numpy().view(np.uint32),
        captured_on=np.array(f"torch {torch.__version__} on {cpu_name()}"),
        **{f"kernel:{name}": bits for name, bits in outputs.items()},
    )


if __name__ == "__main__":
    main()
