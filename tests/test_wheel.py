"""The release path: ``maturin build --release`` makes an abi3 manylinux wheel, and that wheel
installs and runs in a fresh virtual environment where no Rust toolchain is on PATH.

Needs maturin and cargo to build the wheel (both come with a source checkout's toolchain);
the build reuses ``target/``, so after ``pip install .`` it only packages."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
WHEEL_NAME = re.compile(r"masreplay-[^-]+-cp311-abi3-(?P<platform>[^.]+)\.whl$")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    for tool in ("maturin", "cargo"):
        if shutil.which(tool) is None:
            pytest.skip(f"building the wheel needs {tool} on PATH")
    out = tmp_path_factory.mktemp("wheels")
    done = subprocess.run(
        ["maturin", "build", "--release", "--out", str(out)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, f"maturin build failed:\n{done.stderr[-4000:]}"
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_the_wheel_is_abi3_and_manylinux(wheel):
    match = WHEEL_NAME.search(wheel.name)
    assert match, f"not a cp311-abi3 wheel: {wheel.name}"
    # maturin audits the extension's glibc symbol versions and refuses a tag it cannot honour.
    assert match["platform"].startswith(("manylinux_2_", "manylinux2014_")), wheel.name


def test_the_wheel_runs_without_rust(wheel, tmp_path):
    environment = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(environment)
    python = environment / "bin" / "python"
    # numpy and pyarrow come from this interpreter's site-packages (no download), after the
    # venv's own: masreplay itself must come from the wheel.
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], capture_output=True, text=True, check=True
    ).stdout.strip()
    outer = [path for path in sys.path if path.endswith("site-packages")]
    Path(purelib, "_outer_site_packages.pth").write_text("\n".join(outer) + "\n")
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall", str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    bare = {
        **{key: value for key, value in os.environ.items() if not key.startswith(("CARGO", "RUSTUP", "PYTHONPATH"))},
        "PATH": f"{environment / 'bin'}:/usr/bin:/bin",
    }
    assert shutil.which("cargo", path=bare["PATH"]) is None, "cargo must not be reachable for this test"
    smoke = (
        "import masreplay, sys; "
        f"assert masreplay.__file__.startswith({str(environment)!r}), masreplay.__file__; "
        "buf = masreplay.GraphBuffer(100, seed=0); buf.add(masreplay.sim.generate(16, group_size=4, seed=1)); "
        "assert len(buf.sample(8)) == 8 and len(masreplay.advantages(buf.sample_groups(2, group_size=4)).per_trace) == 8"
    )
    for command in ([str(python), "-c", smoke], [str(environment / "bin" / "masreplay"), "demo"]):
        done = subprocess.run(command, cwd=tmp_path, env=bare, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{command[-1]} failed:\n{done.stderr[-3000:]}"
    assert "== 11." in done.stdout
