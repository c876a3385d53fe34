"""Fuzzing that stays (issue 22): dicts, Arrow tables, Parquet bytes and pickled state, each
target in its own interpreter (fuzz_worker.py) so that a segfault fails the test. The budget
is a few seconds per target; set MASREPLAY_FUZZ_SECONDS to run each target that long."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import masreplay

WORKER = Path(__file__).with_name("fuzz_worker.py")
SECONDS = float(os.environ.get("MASREPLAY_FUZZ_SECONDS", "8"))


@pytest.mark.parametrize("target", ["dicts", "arrow", "parquet", "pickled_state", "recipes"])
def test_fuzz(target):
    env = {**os.environ, "PYTHONPATH": str(Path(masreplay.__file__).resolve().parents[1])}
    result = subprocess.run(
        [sys.executable, str(WORKER), target, str(SECONDS)],
        capture_output=True,
        text=True,
        env=env,
        timeout=SECONDS * 4 + 120,
    )
    assert result.returncode == 0, (
        f"fuzz target {target} ended with {result.returncode} (a negative code is a signal: a crash)\n"
        f"{result.stdout[-4000:]}\n{result.stderr[-8000:]}"
    )
