"""Arguments out of their range or of the wrong kind (whole numbers above all): every public entry point
refuses them with an InvalidArgumentError that names the argument, before any work, never
with an OverflowError from the binding edge, a silent truncation or a hang."""

from __future__ import annotations

import re

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

import masreplay
from masreplay import GraphBuffer, games, sim
from masreplay.errors import ArgumentTypeError, InvalidArgumentError

SOUM = games.soum(6, 5, 3, seed=1)


def _buffer() -> GraphBuffer:
    buffer = GraphBuffer(100)
    buffer.add(sim.generate(8, seed=3))
    return buffer


def _zeros(masks):
    return np.zeros(len(masks))


# (label, call with the bad value, the argument's name as the error must say it)
CALLS = {
    "shapley budget": (lambda bad: masreplay.shapley(SOUM, budget=bad), "budget"),
    "shapley seed": (lambda bad: masreplay.shapley(SOUM, budget=100, seed=bad), "seed"),
    "shapley n_threads": (lambda bad: masreplay.shapley(SOUM, budget=100, n_threads=bad), "n_threads"),
    "shapley chunk_size": (lambda bad: masreplay.shapley(_zeros, 4, budget=100, chunk_size=bad), "chunk_size"),
    "shapley n_players": (lambda bad: masreplay.shapley(_zeros, bad, budget=100), "n_players"),
    "shapley repeats": (lambda bad: masreplay.shapley(_zeros, 4, budget=100, noise=0.1, repeats=bad), "repeats"),
    "shapley parents": (lambda bad: masreplay.shapley(SOUM, budget=100, parents=[bad, -1, -1, -1, -1, -1]), "parents[0]"),
    "shapley fixed": (lambda bad: masreplay.shapley(SOUM, budget=100, fixed=[bad]), "fixed"),
    "shapley unions": (lambda bad: masreplay.shapley(SOUM, budget=100, unions=[[0, bad], [2]]), "unions"),
    "shapley prior_budget": (lambda bad: masreplay.shapley(SOUM, budget=100, prior=SOUM, prior_budget=bad), "prior_budget"),
    "trace_shapley budget": (
        lambda bad: masreplay.trace_shapley(sim.generate(2, seed=1), lambda t, m: np.zeros(len(m)), budget=bad),
        "budget",
    ),
    "soum n": (lambda bad: games.soum(bad, 5, 3), "n"),
    "soum terms": (lambda bad: games.soum(6, bad, 3), "terms"),
    "soum seed": (lambda bad: games.soum(6, 5, 3, seed=bad), "seed"),
    "function n_players": (lambda bad: games.function(_zeros, bad), "n_players"),
    "noisy seed": (lambda bad: games.noisy(SOUM, 0.1, seed=bad), "seed"),
    "GraphBuffer capacity": (lambda bad: GraphBuffer(bad), "capacity"),
    "GraphBuffer seed": (lambda bad: GraphBuffer(10, seed=bad), "seed"),
    "sample batch_size": (lambda bad: _buffer().sample(bad), "batch_size"),
    "sample seed": (lambda bad: _buffer().sample(4, seed=bad), "seed"),
    "sample min_events": (lambda bad: _buffer().sample(4, min_events=bad), "min_events"),
    "sample_groups num_groups": (lambda bad: _buffer().sample_groups(bad), "num_groups"),
    "sample_groups group_size": (lambda bad: _buffer().sample_groups(1, group_size=bad), "group_size"),
    "advance": (lambda bad: _buffer().advance(bad), "policy_version"),
    "sim.generate n_traces": (lambda bad: sim.generate(bad), "n_traces"),
}

BAD = {"negative": -3, "beyond 64 bits": 2**70, "fractional": 2.5, "text": "7", "bool": True}


@pytest.mark.parametrize("bad", list(BAD.values()), ids=list(BAD))
@pytest.mark.parametrize("label", list(CALLS))
def test_a_bad_whole_number_is_refused_by_name(label, bad):
    call, name = CALLS[label]
    with pytest.raises(InvalidArgumentError, match=name.replace("[", r"\[").replace("]", r"\]")):
        call(bad)


def test_an_integral_float_reads_as_its_whole_number():
    assert (
        masreplay.shapley(SOUM, budget=2e2, seed=1.0).values.tolist()
        == masreplay.shapley(SOUM, budget=200, seed=1).values.tolist()
    )
    assert len(_buffer().sample(4.0, seed=0)) == 4


def test_none_is_a_root_in_parents_as_minus_one_is():
    with_none = masreplay.shapley(SOUM, budget=200, parents=[None, 0, 0, None, 3, 3])
    with_minus_one = masreplay.shapley(SOUM, budget=200, parents=[-1, 0, 0, -1, 3, 3])
    assert with_none.values.tolist() == with_minus_one.values.tolist()


def test_a_thread_count_beyond_any_machine_is_refused_at_once():
    # Was a pool that spent minutes starting threads before it failed.
    with pytest.raises(InvalidArgumentError, match=r"n_threads must be in 1\.\.=1024, got 1000000"):
        masreplay.shapley(SOUM, budget=100, n_threads=10**6)


def test_a_prior_budget_out_of_range_spends_no_live_evaluation():
    calls = []

    def live(masks):
        calls.append(len(masks))
        return SOUM.values(masks)

    with pytest.raises(InvalidArgumentError, match="prior_budget"):
        masreplay.shapley(live, 6, budget=100, prior=SOUM, prior_budget=-1)
    assert calls == []


@pytest.mark.parametrize(
    ("returned", "kind"),
    [(lambda m: ["a"] * len(m), "list"), (lambda m: {"values": 1}, "dict"), (lambda m: np.array(["x"] * len(m)), "ndarray")],
)
def test_a_value_function_returning_no_numbers_is_an_invalid_argument(returned, kind):
    with pytest.raises(InvalidArgumentError, match=f"the function returned a {kind} that is not an array of float64"):
        masreplay.shapley(games.function(returned, 4), budget=100)


def test_complex_values_are_refused_not_cut_to_their_real_part():
    complex_game = games.function(lambda m: m.sum(axis=1) + 1j, 4)
    with pytest.raises(InvalidArgumentError, match="complex"):
        masreplay.shapley(complex_game, budget=100)
    with pytest.raises(InvalidArgumentError, match="complex"):
        games.evaluate(complex_game, np.ones((2, 4), dtype=bool))
    with pytest.raises(InvalidArgumentError, match="complex"):
        masreplay.trace_shapley(sim.generate(3, seed=2), lambda t, m: np.zeros(len(t)) + 1j)


def test_a_non_finite_value_names_its_trace():
    batch = sim.generate(4, seed=2)
    third = batch.trace_ids[2]

    def value_fn(trace_index, masks):
        return np.where(trace_index == 2, np.nan, masks.sum(axis=1))

    with pytest.raises(InvalidArgumentError, match=re.escape(f'non-finite value (NaN) for a coalition of trace "{third}"')):
        masreplay.trace_shapley(batch, value_fn)

    def too_large(trace_index, masks):
        return np.where(trace_index == 2, -1e300, masks.sum(axis=1))

    with pytest.raises(InvalidArgumentError, match=re.escape(f'value out of range (-1e300) for a coalition of trace "{third}"')):
        masreplay.trace_shapley(batch, too_large)


def test_what_the_value_function_raises_comes_out_unchanged():
    class Refused(Exception):
        pass

    def game(masks):
        raise Refused("no rollout today")

    with pytest.raises(Refused, match="no rollout today"):
        masreplay.shapley(games.function(game, 4), budget=100)


@pytest.mark.parametrize("key", [1.5, [0, 1.5], "0"])
def test_a_trace_index_that_is_no_integer_is_a_type_error(key):
    batch = sim.generate(3, seed=2)
    with pytest.raises(TypeError, match="integer"):
        batch[key]


@pytest.mark.parametrize("workers", [0, -1, 1.5])
def test_a_dump_refuses_a_worker_count_below_one_for_any_engine(tmp_path, workers):
    source = tmp_path / "dump.parquet"
    sim.generate(4, seed=1).write_parquet(source)
    with pytest.raises(InvalidArgumentError, match="workers"):
        masreplay.credit_dump(source, tmp_path / "out", metrics=True, workers=workers, progress=False)


def test_a_dump_whose_destination_is_a_file_is_a_storage_error_naming_it(tmp_path):
    source = tmp_path / "dump.parquet"
    sim.generate(4, seed=1).write_parquet(source)
    with pytest.raises(masreplay.StorageError, match="destination cannot be a directory") as raised:
        masreplay.credit_dump(source, source, metrics=True, progress=False)
    assert raised.value.filename == str(source)


@pytest.mark.parametrize(
    "call",
    [
        lambda: _buffer().sample(2**40),
        lambda: _buffer().sample_groups(2**40),
        lambda: sim.generate(10**12),
        lambda: sim.branches(1, branches=10**12),
    ],
    ids=["sample", "sample_groups", "generate", "branches"],
)
def test_a_count_no_batch_can_hold_is_refused_before_any_allocation(call):
    # A batch holds at most 2**31 - 1 traces (32-bit Arrow offsets); these used to abort the
    # process on a failed allocation (the buffer's contents with it).
    with pytest.raises(InvalidArgumentError, match=r"2\*\*31 - 1"):
        call()


# ---- names, flags, sequences and paths ----------------------------------------------------

BRANCHED = sim.branches(4, seed=1, branches=2).batch

# (label, call with the bad value, the refusal as the message must say it)
NAMED_CALLS = {
    "counterfactual_credit channel": (lambda bad: masreplay.counterfactual_credit(BRANCHED, channel=bad), "channel"),
    "counterfactual_credit baseline": (lambda bad: masreplay.counterfactual_credit(BRANCHED, baseline=bad), "baseline"),
    "same_prefix_credit signature": (lambda bad: masreplay.same_prefix_credit(BRANCHED, signature=[bad]), r"signature\[0\]"),
    "shapley method": (lambda bad: masreplay.shapley(SOUM, budget=100, method=bad), "method"),
    "shapley surrogate": (lambda bad: masreplay.shapley(SOUM, budget=100, method="msr", surrogate=bad), "surrogate"),
    "trace_shapley method": (
        lambda bad: masreplay.trace_shapley(sim.generate(2, seed=1), lambda t, m: np.zeros(len(m)), method=bad),
        "method",
    ),
    "trace_shapley players": (
        lambda bad: masreplay.trace_shapley(sim.generate(2, seed=1), lambda t, m: np.zeros(len(m)), players=bad),
        "players",
    ),
    "trace_players players": (lambda bad: masreplay.trace_players(sim.generate(2, seed=1), players=bad), "players"),
    "advantages estimator": (lambda bad: masreplay.advantages(sim.generate(4, seed=1), bad), "estimator"),
    "advantages normalize_by": (lambda bad: masreplay.advantages(sim.generate(4, seed=1), normalize_by=bad), "normalize_by"),
    "advantages unit": (lambda bad: masreplay.advantages(sim.generate(4, seed=1), unit=bad), "unit"),
    "advantages std": (lambda bad: masreplay.advantages(sim.generate(4, seed=1), std=bad), "std"),
    "group_normalize estimator": (lambda bad: masreplay.group_normalize([1.0, 2.0], [0, 0], estimator=bad), "estimator"),
    "group_normalize compat": (lambda bad: masreplay.group_normalize([1.0, 2.0], [0, 0], compat=bad), "compat"),
    "graph_returns kind": (lambda bad: masreplay.graph_returns(sim.generate(2, seed=1), "process", kind=bad), "kind"),
    "event_rewards channel": (lambda bad: masreplay.event_rewards(sim.generate(2, seed=1), bad), "channel"),
    "load_traces on_error": (lambda bad: masreplay.load_traces(sim.generate(2, seed=1), on_error=bad), "on_error"),
    "GraphBuffer unit": (lambda bad: GraphBuffer(10, unit=bad), "unit"),
    "sample sampler": (lambda bad: _buffer().sample(2, sampler=bad), "sampler"),
    "add on_error": (lambda bad: _buffer().add(sim.generate(2, seed=9), on_error=bad), "on_error"),
    "get trace_id": (lambda bad: _buffer().get(bad), "trace_id"),
    "flat column": (lambda bad: sim.generate(2, seed=1).flat(bad), "column"),
    "parl perf": (lambda bad: masreplay.rewards.parl(sim.generate(2, seed=1), 0.1, 0.1, perf=bad), "perf"),
}


@pytest.mark.parametrize("bad", [5, 2.5, b"team", {"team"}], ids=["int", "float", "bytes", "set"])
@pytest.mark.parametrize("label", list(NAMED_CALLS))
def test_a_name_of_the_wrong_type_is_refused_by_name_and_is_a_type_error(label, bad):
    # Was pyo3's "TypeError: 'int' object is not an instance of 'str'", naming no argument.
    call, name = NAMED_CALLS[label]
    with pytest.raises(masreplay.ArgumentTypeError, match=f"{name} must be .*, got {type(bad).__name__}") as raised:
        call(bad)
    assert isinstance(raised.value, TypeError) and isinstance(raised.value, InvalidArgumentError)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: masreplay.shapley(SOUM, budget=100, method="fastest"), "shapley: method must be one of 'auto', 'exact', "),
        (
            lambda: _buffer().sample(2, sampler="greedy"),
            r"GraphBuffer\.sample: sampler must be one of 'uniform', 'prioritized', got 'greedy'",
        ),
        (lambda: GraphBuffer(10, unit="bytes"), "GraphBuffer: unit must be one of 'traces', 'events', got 'bytes'"),
        (
            lambda: masreplay.counterfactual_credit(BRANCHED, baseline="median"),
            "baseline must be one of 'mean', 'loo', got 'median'",
        ),
        (
            lambda: masreplay.advantages(sim.generate(4, seed=1), normalize_by=["agent", "team"]),
            r"normalize_by\[1\] must be one of 'agent', ",
        ),
        (
            lambda: masreplay.group_normalize([1.0, 2.0], [0, 0], compat="torch"),
            "compat must be one of 'verl', 'trl', 'openrlhf', got 'torch'",
        ),
    ],
    ids=["method", "sampler", "unit", "baseline", "normalize_by item", "compat"],
)
def test_an_unknown_name_is_refused_with_the_names_accepted(call, message):
    with pytest.raises(InvalidArgumentError, match=message):
        call()


@pytest.mark.parametrize("bad", ["yes", 1, None], ids=["str", "int", "None"])
def test_a_flag_is_true_or_false_not_anything_truthy(bad):
    # aligned="x" used to run, read as True without a word.
    with pytest.raises(InvalidArgumentError, match="counterfactual_credit: aligned must be True or False"):
        masreplay.counterfactual_credit(BRANCHED, aligned=bad)
    with pytest.raises(InvalidArgumentError, match=r"GraphBuffer\.sample: with_branches must be True or False"):
        _buffer().sample(2, with_branches=bad)


def test_normalize_by_that_is_no_name_nor_list_is_refused_by_name():
    # Was "TypeError: 'int' object is not iterable".
    with pytest.raises(
        masreplay.ArgumentTypeError,
        match=r"advantages: normalize_by must be one of .* or a sequence of names among .* or None, got int 5",
    ):
        masreplay.advantages(sim.generate(4, seed=1), normalize_by=5)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: masreplay.group_normalize(["x", 1.0], [0, 0]), "values"),
        (lambda: masreplay.group_normalize([1.0, 2.0], [0, 0], lengths="12"), "lengths"),
        (lambda: masreplay.group_normalize([1.0, 2.0], [0, 0], lengths=5), "lengths"),
        (lambda: masreplay.group_normalize([1.0, 2.0], [0, 0], mask=[["a"], ["b"]]), "mask"),
        (lambda: masreplay.group_normalize([1.0, 2.0], [0, 0], dtype="float16x"), "dtype"),
        (lambda: masreplay.coma_credit(np.ones((2, 2)), np.full((2, 2), 0.5), [0.5, 1]), "chosen"),
        (lambda: masreplay.difference_rewards(SOUM, players=[0, 1.5]), "players"),
        (lambda: masreplay.difference_rewards(SOUM, replaced="default"), "replaced"),
        (lambda: masreplay.shapley(SOUM, budget=100, prior="logged"), "prior"),
        (lambda: masreplay.shapley(SOUM, budget=100, parents=3), "parents"),
        (lambda: masreplay.shapley(SOUM, budget=100, fixed=2.5), "fixed"),
        (lambda: masreplay.trace_shapley(sim.generate(2, seed=1), 5), "value_fn"),
        (lambda: masreplay.graph_gae(sim.generate(2, seed=1), "process", ["x"]), "values"),
        (lambda: games.additive(["a", "b"]), "weights"),
        (lambda: games.noisy(_zeros, 0.1), "game"),
        (lambda: games.soum(4, [([0, 1], 0.5), "x"]), r"terms\[1\]"),
        (lambda: games.evaluate(SOUM, [[True] * 5]), "masks"),
        (lambda: sim.generate(2, agents=[2]), "agents"),
        (lambda: sim.branches(2, noise=True), "noise"),
        (lambda: masreplay.rewards.compose(5, {"a": 1.0}), "channels"),
        (lambda: masreplay.rewards.compose({"a": np.ones(2)}, {"a": 1.0}, balance="max"), "balance"),
        (lambda: masreplay.rewards.compose({"a": np.ones(2)}, {"a": 1.0}, step=2.5), "step"),
        (lambda: masreplay.TraceBatch.concat(5), "batches"),
        (lambda: sim.generate(2, seed=1)[b"\x00"], "trace key"),
        (lambda: sim.generate(2, seed=1).to_seed_json(0.0), "trace index"),
        (lambda: masreplay.view(sim.generate(2, seed=1), 0, group="no"), "group"),
        (lambda: masreplay.credit_dump(5, "out", metrics=True, progress=False), "source"),
        (lambda: masreplay.read_credit(None), "destination"),
        (lambda: masreplay.convert.write(sim.generate(2, seed=1), 5), "path"),
        # A file descriptor number: an int (or True) path wrote to that descriptor, then closed it.
        (lambda: masreplay.convert.to_otel(sim.generate(2, seed=1), 2.5), "to_otel: path"),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_every_argument_that_is_no_value_of_its_kind_is_refused_by_name(call, name):
    with pytest.raises(InvalidArgumentError, match=name):
        call()


def test_a_refusal_leaves_the_buffer_and_its_random_stream_as_they_were():
    buffer, twin = _buffer(), _buffer()
    ids = buffer.to_batch().trace_ids
    before = (len(buffer), buffer.priorities().tolist(), buffer.to_arrow())
    refused = [
        lambda: buffer.sample(2, sampler=5),
        lambda: buffer.sample(2, with_branches="yes"),
        lambda: buffer.add(sim.generate(2, seed=9), on_error="ignore"),
        lambda: buffer.update_priorities(ids[0], [2.0]),  # a lone id would be read as its characters
        lambda: buffer.update_priorities(ids[:2], ["high", 1.0]),
        lambda: buffer.subgraph(ids[0], "e0"),
        lambda: buffer.get(5),
    ]
    for call in refused:
        with pytest.raises(InvalidArgumentError):
            call()
    assert (len(buffer), buffer.priorities().tolist()) == before[:2] and buffer.to_arrow().equals(before[2])
    assert buffer.sample(3).trace_ids == twin.sample(3).trace_ids  # no draw was spent


def test_ids_are_text_and_anything_else_is_refused_by_position():
    """str() made b"x", None and 7 into ids no trace has, so an update that skips missing
    traces set nothing and said nothing."""
    buffer = _buffer()
    ids = buffer.to_batch().trace_ids
    before = buffer.priorities().tolist()
    for bad, shown in ((ids[0].encode(), "bytes"), (None, "NoneType"), (7, "int")):
        with pytest.raises(ArgumentTypeError, match=rf"trace_ids\[1\] must be an id \(str\), got {shown}"):
            buffer.update_priorities([ids[0], bad], [2.0, 3.0], missing="skip")
    with pytest.raises(ArgumentTypeError, match=r"trace_ids\[1\] must be an id \(str\), got NoneType"):
        buffer.update_priorities(pa.array([ids[0], None]), [2.0, 3.0])
    with pytest.raises(ArgumentTypeError, match=r"event_ids\[0\] must be an id \(str\), got int"):
        buffer.subgraph(ids[0], [0])
    assert buffer.priorities().tolist() == before
    # Ids as NumPy, Arrow (one chunk or many) and Polars hold them are text.
    halves = pa.chunked_array([ids[:1], ids[1:2]])
    for form in (np.array(ids[:2]), pa.array(ids[:2]), halves, pl.Series(ids[:2])):
        assert buffer.update_priorities(form, [2.0, 3.0]) == 2
    assert buffer.priorities().tolist()[:2] == [2.0, 3.0]


def test_a_column_that_does_not_exist_is_a_key_error_of_the_package():
    batch = sim.generate(2, seed=1)
    for call in (lambda: batch.flat("nope"), lambda: batch.padded("nope")):
        with pytest.raises(masreplay.ColumnNotFoundError) as raised:
            call()
        assert isinstance(raised.value, KeyError) and raised.value.column == "nope"
        assert str(raised.value).startswith("no per-event column 'nope'; events have ['id', ")


def test_a_path_the_writers_cannot_write_is_a_storage_error_naming_it(tmp_path):
    batch = sim.generate(2, seed=1)
    for call in (
        lambda: masreplay.convert.to_otel(batch, tmp_path),
        lambda: masreplay.convert.write(batch, tmp_path / "missing" / "traces.jsonl"),
        lambda: masreplay.view(batch, 0).save(tmp_path),
    ):
        with pytest.raises(masreplay.StorageError) as raised:
            call()
        assert str(tmp_path) in raised.value.filename


def test_a_batch_argument_of_no_accepted_kind_is_refused_by_its_name():
    """Functions taking a batch name the argument, not only load_traces' list of kinds."""
    with pytest.raises(masreplay.ArgumentTypeError, match=r"^batch: load_traces takes .* got int"):
        masreplay.advantages(5)
    with pytest.raises(masreplay.ArgumentTypeError, match=r"^source: load_traces takes .* got float"):
        masreplay.metrics(1.5)
