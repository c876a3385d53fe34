"""A batched callable is valued one chunk at a time while the estimator works on the chunks
already valued, on a second thread (rust/masreplay-core/src/shapley/pipeline.rs). The results
must equal those of the same game valued natively (all at once, no pipeline), and a callable
that raises mid-run must end the run with its own error, leaving no thread behind."""

from __future__ import annotations

import os

import numpy as np
import pytest

import masreplay
from masreplay import games

CASES = [
    ("msr", {"budget": 6_000}),
    ("msr", {"target_stderr": 0.05}),
    ("kernel", {"budget": 6_000}),
    ("stratified", {"budget": 6_000}),
]


@pytest.mark.parametrize(("method", "stopping"), CASES, ids=[f"{m}-{next(iter(s))}" for m, s in CASES])
def test_pipelined_results_equal_the_native_game(method, stopping):
    game = games.soum(60, 90, 4, seed=5)
    calls = []

    def values(masks):
        calls.append(len(masks))
        return game.values(masks)

    native = masreplay.shapley(game, method=method, seed=3, **stopping)
    pipelined = masreplay.shapley(games.function(values, 60, chunk_size=97), method=method, seed=3, **stopping)
    assert len(calls) > 10  # many chunks: the estimator worked beside the callable
    np.testing.assert_array_equal(pipelined.values, native.values)
    np.testing.assert_array_equal(pipelined.stderr, native.stderr)
    assert pipelined.efficiency_gap == native.efficiency_gap


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts the process's threads in /proc (Linux)")
@pytest.mark.parametrize(("method", "stopping"), CASES, ids=[f"{m}-{next(iter(s))}" for m, s in CASES])
def test_a_callable_raising_mid_run_ends_the_run_and_leaves_no_thread(method, stopping):
    game = games.soum(60, 90, 4, seed=5)
    # Start the thread pool the estimators' final fits use before counting threads.
    masreplay.shapley(game, method=method, seed=3, **stopping)
    before = threads()
    calls = []

    def judge(masks):
        calls.append(len(masks))
        if len(calls) == 6:
            raise RuntimeError("the judge model is down")
        return game.values(masks)

    with pytest.raises(RuntimeError, match="judge model is down"):
        masreplay.shapley(games.function(judge, 60, chunk_size=97), method=method, seed=3, **stopping)
    assert len(calls) == 6  # no chunk asked for after the failure
    assert threads() == before
