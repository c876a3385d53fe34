"""NumPy forms and interrupted streams at the package's edge (the fuzz4 session): an array that
holds the same numbers in another layout gives the same result, and one that holds no real
numbers (text, None, complex, dates, masked entries), a 0-d array where a sequence goes, or a
stream that breaks midway is refused by name, never converted without a word nor answered by
a builtin exception from inside."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import masreplay
from masreplay import games
from masreplay.errors import ArgumentTypeError, DataFormatError, InvalidArgumentError

VALUES = np.array([1.0, 2.0, 0.5, 3.0, 2.0, 1.0])
GROUPS = np.array([0, 0, 1, 1, 2, 2])


def misaligned(array: np.ndarray) -> np.ndarray:
    """`array`'s numbers in a contiguous view one byte off alignment (np.frombuffer of a packed
    record)."""
    raw = bytearray(array.nbytes + 1)
    view = np.frombuffer(raw, dtype=array.dtype, offset=1, count=array.size).reshape(array.shape)
    view[...] = array
    assert not view.flags.aligned and view.flags.c_contiguous
    return view


def test_misaligned_arrays_give_the_plain_result():
    plain = masreplay.group_normalize(VALUES, GROUPS)
    np.testing.assert_array_equal(masreplay.group_normalize(misaligned(VALUES), GROUPS), plain)
    np.testing.assert_array_equal(masreplay.group_normalize(VALUES, misaligned(GROUPS)), plain)
    batch = masreplay.sim.generate(4, seed=1)
    rewards = np.linspace(-1, 1, batch.num_events)
    np.testing.assert_array_equal(masreplay.graph_returns(batch, misaligned(rewards)), masreplay.graph_returns(batch, rewards))


@pytest.mark.parametrize(
    ("form", "reason"),
    [
        (VALUES.astype(str), "holds no real numbers"),
        (VALUES.astype(bytes), "holds no real numbers"),
        ([None, *VALUES[1:]], "None is not a real number"),
        (VALUES + 1j, "holds no real numbers"),
        (VALUES.astype(np.int64).astype("m8[s]"), "holds no real numbers"),
        (np.ma.masked_array(VALUES, mask=[1, 0, 0, 0, 0, 0]), "masked entries"),
    ],
    ids=["text", "bytes", "None", "complex", "timedelta", "masked"],
)
def test_arrays_of_no_real_numbers_are_refused_by_name(form, reason):
    """NumPy reads "1.5" as 1.5, None as NaN (a missing value), drops an imaginary part and a
    mask: each was a silent conversion."""
    with pytest.raises(InvalidArgumentError, match=f"values .*{reason}"):
        masreplay.group_normalize(form, GROUPS)
    buffer = masreplay.GraphBuffer(10)
    buffer.add(masreplay.sim.generate(6, seed=2))
    before = buffer.priorities()
    with pytest.raises(InvalidArgumentError, match=f"priorities .*{reason}"):
        buffer.update_priorities(buffer.to_batch().trace_ids, form)
    np.testing.assert_array_equal(buffer.priorities(), before)


def test_an_unmasked_masked_array_is_its_data():
    plain = masreplay.group_normalize(VALUES, GROUPS)
    np.testing.assert_array_equal(masreplay.group_normalize(np.ma.masked_array(VALUES), GROUPS), plain)
    with pytest.raises(InvalidArgumentError, match=r"groups has masked entries"):
        masreplay.group_normalize(VALUES, np.ma.masked_array(GROUPS, mask=[0, 1, 0, 0, 0, 0]))
    game = games.soum(4, 6, 2, seed=3)
    with pytest.raises(InvalidArgumentError, match=r"fixed has masked entries"):
        masreplay.shapley(game, fixed=np.ma.masked_array([1, 2], mask=[0, 1]), method="exact")
    with pytest.raises(InvalidArgumentError, match=r"masks has masked entries"):
        games.evaluate(game, np.ma.masked_array(np.ones((1, 4), bool), mask=[[0, 1, 0, 0]]))


def test_game_values_refuse_masked_entries_and_read_an_unmasked_masked_array():
    game = games.soum(4, 6, 2, seed=3)
    masks = np.array([[True, False, True, True], [False, True, False, False]])
    with pytest.raises(InvalidArgumentError, match=r"masks has masked entries"):
        game.values(np.ma.masked_array(masks, mask=[[0, 1, 0, 0], [0, 0, 0, 0]]))
    np.testing.assert_array_equal(game.values(np.ma.masked_array(masks)), game.values(masks))


def test_whole_numbers_beyond_int64_are_refused_not_wrapped():
    q = np.array([[1.0, 2.0], [0.5, 0.25]])
    pi = np.array([[0.5, 0.5], [1.0, 0.0]])
    for chosen in (np.array([2**64 - 1, 0], dtype=np.uint64), [2.0**63, 0]):
        with pytest.raises(InvalidArgumentError, match=r"chosen must hold numbers: a value beyond"):
            masreplay.coma_credit(q, pi, chosen)


def test_empirical_coalitions_take_booleans_or_zeros_and_ones_only():
    coalitions = np.array([[1, 0, 1], [1, 1, 0], [0, 1, 1], [1, 1, 1]], dtype=bool)
    rewards = [1.0, 2.0, 3.0, 4.0]
    plain = games.empirical(coalitions, rewards).values(coalitions)
    as_ints = games.empirical(coalitions.astype(np.int8), rewards).values(coalitions)
    np.testing.assert_array_equal(as_ints, plain)
    # NumPy's cast to bool made every nonzero number and every non-empty string a member.
    for form in (coalitions * 2.5, coalitions.astype(str), coalitions + 1j):
        with pytest.raises(InvalidArgumentError, match=r"empirical: coalitions must be a boolean array"):
            games.empirical(form, rewards)
    with pytest.raises(InvalidArgumentError, match=r"empirical: coalitions must be a boolean array"):
        games.empirical([[True], [True, False]], [1.0, 2.0])


def test_game_values_refuse_other_than_a_boolean_array_by_name():
    game = games.additive([1.0, 2.0])
    with pytest.raises(ArgumentTypeError, match=r"masks must be a boolean array .*got list"):
        game.values([[True, False]])
    with pytest.raises(ArgumentTypeError, match=r"masks must be a boolean array .*got ndarray"):
        game.values(np.ones((1, 2), dtype=np.int64))


def test_zero_d_arrays():
    """A 0-d array is one item: NumPy's scalar index, never a sequence to iterate (iterating
    one raised TypeError from inside)."""
    batch = masreplay.sim.generate(5, seed=3)
    assert batch[np.array(3)] == batch[3]
    with pytest.raises(ArgumentTypeError, match=r"players must be a sequence"):
        masreplay.difference_rewards(games.additive([1.0, 2.0]), np.array(1))
    buffer = masreplay.GraphBuffer(10)
    buffer.add(batch)
    with pytest.raises(ArgumentTypeError, match=r"trace_ids must be a sequence of ids"):
        buffer.update_priorities(np.array(batch.trace_ids[0]), [1.0])
    game = games.soum(4, 6, 2, seed=3)
    owen = masreplay.shapley(game, unions=[np.array(0), [1, 2, 3]], method="owen", budget=200).values
    np.testing.assert_array_equal(owen, masreplay.shapley(game, unions=[0, [1, 2, 3]], method="owen", budget=200).values)
    fixed = masreplay.shapley(game, fixed=np.array(1), method="exact").values
    np.testing.assert_array_equal(fixed, masreplay.shapley(game, fixed=1, method="exact").values)


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_numpy_matrix_and_timedelta_indices():
    game = games.soum(4, 6, 2, seed=3)
    plain = masreplay.shapley(game, unions=[[0, 1], [2, 3]], method="owen", budget=400).values
    # A matrix's rows are matrices again: unions recursed until RecursionError.
    matrix = masreplay.shapley(game, unions=np.asmatrix([[0, 1], [2, 3]]), method="owen", budget=400).values
    np.testing.assert_array_equal(matrix, plain)
    # timedelta64 is a NumPy integer that int() refuses.
    with pytest.raises(ArgumentTypeError, match=r"trace index must be an integer"):
        masreplay.sim.generate(3, seed=1)[[np.timedelta64(1, "s")]]
    with pytest.raises(InvalidArgumentError, match=r"unions: .* is neither a player index nor a list"):
        masreplay.shapley(game, unions=[[np.timedelta64(0, "s"), 1], [2, 3]], method="owen", budget=200)
    with pytest.raises(ArgumentTypeError, match=r"group_normalize: eps must be a number, got timedelta64"):
        masreplay.group_normalize(VALUES, GROUPS, eps=np.timedelta64(1, "s"))


def test_update_priorities_refuses_a_set_of_ids():
    """A set's order is its hash table's: its ids were paired with the wrong priorities."""
    buffer = masreplay.GraphBuffer(10)
    batch = masreplay.sim.generate(4, seed=4)
    buffer.add(batch)
    with pytest.raises(ArgumentTypeError, match=r"trace_ids must be ids in the order of their priorities"):
        buffer.update_priorities(set(batch.trace_ids), [1.0, 2.0, 3.0, 4.0])


def test_running_std_update_checks_its_values_first():
    state = masreplay.rewards.RunningStd()
    state.update("team", np.array([1.0, 2.0]))
    saved = state.to_dict()
    for values, error in (
        ([1.0, np.inf], InvalidArgumentError),
        (["1", "2"], InvalidArgumentError),
        ([[1.0]], InvalidArgumentError),
    ):
        with pytest.raises(error, match=r"RunningStd.update: channel 'team'"):
            state.update("team", values)
    with pytest.raises(ArgumentTypeError, match=r"RunningStd.update: channel must be a string"):
        state.update(3, [1.0])
    assert state.to_dict() == saved
    state.update("team", [3.0])  # a list, as compose's channels may be
    assert state.channels["team"][0] == 3


def test_a_stream_that_changes_schema_midway_is_a_data_format_error(tmp_path):
    table = masreplay.sim.generate(10, seed=5).to_arrow()

    def batches():
        yield table.to_batches()[0]
        yield pa.record_batch([pa.array([1, 2])], names=["x"])

    buffer = masreplay.GraphBuffer(100)
    buffer.add(masreplay.sim.generate(3, seed=6))
    buffer.save(tmp_path / "before.parquet")
    for call in (masreplay.load_traces, buffer.add, masreplay.metrics):
        with pytest.raises(DataFormatError, match=r"invalid Arrow stream: Schema at index 1 was different"):
            call(pa.RecordBatchReader.from_batches(table.schema, batches()))
    buffer.save(tmp_path / "after.parquet")
    assert (tmp_path / "after.parquet").read_bytes() == (tmp_path / "before.parquet").read_bytes()


def test_a_stream_whose_producer_raises_passes_its_error_and_adds_nothing(tmp_path):
    table = masreplay.sim.generate(10, seed=5).to_arrow()

    def batches():
        yield from table.to_batches(max_chunksize=3)[:2]
        raise LookupError("the producer's own error")

    buffer = masreplay.GraphBuffer(100)
    buffer.save(tmp_path / "before.parquet")
    with pytest.raises(LookupError, match=r"the producer's own error"):
        buffer.add(pa.RecordBatchReader.from_batches(table.schema, batches()))
    buffer.save(tmp_path / "after.parquet")
    assert (tmp_path / "after.parquet").read_bytes() == (tmp_path / "before.parquet").read_bytes()


def _value_raising(hook: str, error: BaseException) -> object:
    """A value whose ``hook`` (``__float__``, ``__index__``) raises ``error``, as a Ctrl-C
    landing in it would."""

    def raise_error(self):
        raise error

    return type("Value", (), {hook: raise_error})()


@pytest.mark.parametrize("hook", ["__float__", "__index__"])
@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_while_reading_python_objects_is_raised_not_taken_for_bad_data(hook, interrupt, tmp_path):
    """Python code a value runs may be where Ctrl-C lands: the reader took the KeyboardInterrupt
    for the value's fault, refused the trace and, with on_error="skip", went on loading."""
    docs = [masreplay.sim.generate(3, seed=1)[i] for i in range(3)]
    docs[1]["events"][0]["t"] = _value_raising(hook, interrupt("Ctrl-C"))
    buffer = masreplay.GraphBuffer(10)
    buffer.save(tmp_path / "before.parquet")
    with pytest.raises(interrupt, match="Ctrl-C"):
        masreplay.load_traces(docs, on_error="skip")
    with pytest.raises(interrupt, match="Ctrl-C"):
        buffer.add(docs, on_error="skip")
    buffer.save(tmp_path / "after.parquet")
    assert (tmp_path / "after.parquet").read_bytes() == (tmp_path / "before.parquet").read_bytes()
    # An Exception there is the value's own failure: the trace is refused by pointer.
    docs[1]["events"][0]["t"] = _value_raising(hook, ValueError("no number"))
    loaded = masreplay.load_traces(docs, on_error="skip")
    assert len(loaded) == 2
    assert str(loaded.rejected[0][2]).endswith("at /events/0/t: ValueError: no number")


def test_padded_gives_a_sample_and_its_collected_batch_the_same_answer():
    """A lazy sample pads a 64-bit column in the binding, a batch through Arrow and NumPy: an
    int pad from 2**32 on made an int64 column float64 on the batch (NumPy reads the pad as
    uint64) and stayed int64 on the sample; a pad a double cannot hold, or a bool in an int
    column, was refused on the batch and taken on the sample."""
    buffer = masreplay.GraphBuffer(50)
    buffer.add(masreplay.sim.generate(30, seed=8))

    def padded(collected: bool, column: str, pad: object) -> object:
        sample = buffer.sample(7, seed=1)
        batch = masreplay.TraceBatch(sample._core) if collected else sample
        try:
            values, mask, _ = batch.padded(column, pad)
        except InvalidArgumentError as error:
            return type(error)
        return values.dtype, values[~mask].tolist()

    for column, pad in (("tokens", 2**40), ("tokens", 2**63 - 1), ("t", 2**53 + 1), ("t", -(2**63)), ("tokens", True)):
        assert padded(True, column, pad) == padded(False, column, pad), (column, pad)
    assert padded(True, "tokens", 2**40)[0] == np.int64
    with pytest.raises(ArgumentTypeError, match=r"pad_value must be a number or a flag"):
        buffer.sample(3, seed=1).padded("t", np.timedelta64(1, "s"))


def test_view_credit_of_no_real_numbers_is_refused():
    """The viewer read credit with NumPy's cast: text as numbers, None as NaN, complex without
    its imaginary part."""
    batch = masreplay.sim.generate(3, seed=1)
    plain = np.linspace(-1, 1, batch.num_events)
    masreplay.view(batch, 0, credit=plain)
    for form, reason in (
        (plain.astype(str), "holds no real numbers"),
        ([None] * batch.num_events, "None"),
        (plain + 1j, "complex"),
    ):
        with pytest.raises(InvalidArgumentError, match=f"credit must hold numbers: .*{reason}"):
            masreplay.view(batch, 0, credit=form)
