"""Every Python block of the README runs as written, each in a fresh interpreter in an empty
folder (a block states its own setup). A block whose first line is ``# needs: PKG[, PKG]`` runs
only where those packages import, and is skipped naming them otherwise."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
NEEDS = re.compile(r"#\s*needs:\s*(.+)")


def python_blocks() -> list[tuple[int, str]]:
    """(line number, code) of each ```python block."""
    text = README.read_text(encoding="utf-8")
    return [(text.count("\n", 0, match.start()) + 1, match.group(1)) for match in BLOCK.finditer(text)]


def test_the_readme_has_python_blocks():
    assert len(python_blocks()) >= 6


@pytest.mark.parametrize(("line", "code"), python_blocks(), ids=lambda value: f"line{value}" if isinstance(value, int) else "")
def test_readme_block_runs(line, code, tmp_path):
    first = code.splitlines()[0] if code.strip() else ""
    needed = NEEDS.match(first)
    if needed:
        missing = [name.strip() for name in needed.group(1).split(",") if importlib.util.find_spec(name.strip()) is None]
        if missing:
            pytest.skip(f"README block at line {line} needs {', '.join(missing)} (not installed)")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"README.md block at line {line} failed:\n{done.stderr[-3000:]}"
