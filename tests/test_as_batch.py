"""masreplay.as_batch, the one reading of "a TraceBatch or anything load_traces accepts", and
the arguments refused with InvalidArgumentError (a ValueError, so older ``except ValueError``
callers keep working)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import masreplay
from masreplay.bands import band_limits
from masreplay.errors import InvalidArgumentError, TraceValidationError
from masreplay.rewards import Schedule, compose


def test_a_batch_is_returned_as_it_is(seed_example):
    batch = masreplay.load_traces(seed_example)
    assert masreplay.as_batch(batch) is batch


def test_anything_load_traces_accepts_is_loaded(seed_example, tmp_path):
    path = tmp_path / "trace.parquet"
    masreplay.load_traces(seed_example).write_parquet(path)
    for source in (seed_example, [seed_example], path, str(path), masreplay.load_traces(path).to_arrow()):
        batch = masreplay.as_batch(source)
        assert isinstance(batch, masreplay.TraceBatch)
        assert batch.trace_ids == [seed_example["trace_id"]]


def test_an_invalid_trace_raises_like_load_traces(seed_example):
    broken = copy.deepcopy(seed_example)
    broken["events"][0]["type"] = "telepathy"
    with pytest.raises(TraceValidationError) as raised:
        masreplay.as_batch(broken)
    assert raised.value.path == "/events/0/type"


def test_the_functions_that_take_any_source_agree_with_as_batch(seed_example):
    batch = masreplay.as_batch(seed_example)
    assert masreplay.metrics(seed_example).equals(masreplay.metrics(batch))
    assert np.array_equal(masreplay.advantages(seed_example).per_event, masreplay.advantages(batch).per_event)
    parl = masreplay.rewards.parl
    assert np.array_equal(parl(seed_example, 0.3, 0.2), parl(batch, 0.3, 0.2))


def test_invalid_arguments_are_invalid_argument_errors(seed_example):
    assert issubclass(InvalidArgumentError, ValueError)
    batch = masreplay.load_traces(seed_example)
    refusals = [
        lambda: band_limits(50),
        lambda: masreplay.load_traces(seed_example, on_error="ignore"),
        lambda: batch.flat("tokens"),  # the example records no tokens: an int column of nulls
        lambda: Schedule("sawtooth", {}),
        lambda: Schedule.step([1.0], [5]),
        lambda: Schedule.step([1.0, 2.0, 3.0], [5, 5]),
        lambda: Schedule.linear(1.0, 0.0, -1),
        lambda: compose({"team": [1.0]}, {"team": 1.0}, balance="max"),
        lambda: compose({"team": [1.0]}, {"team": Schedule.constant(1.0)}),
        lambda: compose({"team": [1.0]}, {}),
    ]
    for refuse in refusals:
        with pytest.raises(InvalidArgumentError):
            refuse()
