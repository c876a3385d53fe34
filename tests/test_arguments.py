"""Arguments out of their range or of the wrong kind (whole numbers above all): every public entry point
refuses them with an InvalidArgumentError that names the argument, before any work, never
with an OverflowError from the binding edge, a silent truncation or a hang."""

from __future__ import annotations

import numpy as np
import pytest

import masreplay
from masreplay import GraphBuffer, games, sim
from masreplay.errors import InvalidArgumentError

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
