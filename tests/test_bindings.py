"""The thin bindings: what a Python callback raises comes back through the core unchanged
(the very exception object, whatever its class), AddReport is one type, and importing the
package loads no optional package."""

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import masreplay


class JudgeDown(Exception):
    """Not a masreplay error, not a builtin one: the class must survive the trip."""


def test_a_game_function_error_comes_back_as_raised():
    raised = JudgeDown("judge model unreachable")

    def value(masks):
        raise raised

    with pytest.raises(JudgeDown) as caught:
        masreplay.shapley(value, 3, budget=16)
    assert caught.value is raised


def test_a_value_function_error_comes_back_as_raised_from_every_trace():
    batch = masreplay.sim.generate(6, seed=3)
    raised = JudgeDown("judge model unreachable")
    calls = []

    def value(trace_index, masks):
        calls.append(len(masks))
        raise raised

    with pytest.raises(JudgeDown) as caught:
        masreplay.trace_shapley(batch, value, budget=32, chunk_size=4)
    assert caught.value is raised and calls == [4]


def test_add_returns_an_add_report_either_way():
    buffer = masreplay.GraphBuffer(100)
    traces = masreplay.sim.generate(5, seed=1)
    report = buffer.add(traces)
    assert isinstance(report, masreplay.AddReport) and report == report.added == 5 and report.rejected == []
    skipped = buffer.add(masreplay.sim.generate(7, seed=1), on_error="skip")
    assert isinstance(skipped, masreplay.AddReport) and skipped.added == 2
    assert [position for position, _, _ in skipped.rejected] == [0, 1, 2, 3, 4]
    again = pickle.loads(pickle.dumps(report))
    assert (again.added, again.rejected, type(again)) == (5, [], masreplay.AddReport)
    assert sum(np.int64(r) for r in (report, skipped)) == 7


def test_importing_masreplay_loads_no_optional_package():
    # Optional packages load when a feature needs them, not with the package: pyarrow's
    # pa.table() imports pandas, which at import time cost every process a quarter second.
    optional = ("pandas", "polars", "torch", "ray", "scipy")
    code = f"import sys, masreplay; print([m for m in {optional!r} if m in sys.modules])"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, check=True)
    assert loaded.stdout.strip() == "[]"
