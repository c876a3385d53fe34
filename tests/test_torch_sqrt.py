"""compat="trl" reproduces torch.sqrt bit for bit through emulations of MKL's kernels. Those
emulations are held here to outputs captured from torch and from each MKL kernel
(tests/data/torch_sqrt/, made by capture.py there), so they are checked independently of
masreplay's own code even where torch is not installed."""

from pathlib import Path

import numpy as np
import pytest

from masreplay import _core
from masreplay.errors import InvalidArgumentError

FIXTURE = np.load(Path(__file__).parent / "data" / "torch_sqrt" / "mkl_sqrt_fp32.npz")
KERNELS = sorted(key.removeprefix("kernel:") for key in FIXTURE.files if key.startswith("kernel:"))


def test_fixture_holds_every_emulated_kernel():
    assert KERNELS == ["correctly-rounded", "mkl-avx512", "mkl-generic"]
    # The capture CPU's own torch.sqrt ran one of the captured kernels.
    assert any(np.array_equal(FIXTURE["torch_sqrt"], FIXTURE[f"kernel:{name}"]) for name in KERNELS)


@pytest.mark.parametrize("kernel", KERNELS)
def test_emulation_matches_captured_kernel(kernel):
    inputs = FIXTURE["inputs"].view(np.float32)
    try:
        ours, name = _core.torch_sqrt(inputs, kernel)
    except InvalidArgumentError:
        pytest.skip(
            f"this CPU cannot run the {kernel} emulation (mkl-generic needs an x86-64 CPU not made by Intel, "
            "its rsqrtps being the vendor's own; mkl-avx512 needs AVX-512)"
        )
    assert name == kernel
    expected = FIXTURE[f"kernel:{kernel}"]
    differ = np.flatnonzero(ours.view(np.uint32) != expected)
    assert differ.size == 0, f"{kernel}: {differ.size} of {inputs.size} roots differ, first at {inputs[differ[:5]]}"


def test_captured_kernels_are_not_all_correctly_rounded():
    """The fixture can tell the kernels apart: a fixture of correctly rounded roots only would
    let a wrong emulation pass."""
    exact = np.sqrt(FIXTURE["inputs"].view(np.float32)).view(np.uint32)
    assert np.array_equal(FIXTURE["kernel:correctly-rounded"], exact)
    assert (FIXTURE["kernel:mkl-generic"] != exact).sum() > 1000
    assert (FIXTURE["kernel:mkl-avx512"] != exact).sum() > 100
