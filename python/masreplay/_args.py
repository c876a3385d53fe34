"""Arguments checked once where they enter the package, each refusal naming the argument.

The core takes unsigned or bounded integers: a negative or oversized value would surface as
an ``OverflowError`` that names no argument, and a fractional float would be truncated
without a word. Public functions pass their counts, sizes, seeds and indices through
:func:`whole` (or :func:`optional_whole`); functions of many numeric settings (the recipes)
take :func:`checked`, which derives every check from the function's own annotations:
numbers, flags, strings, paths, the closed vocabularies (``Literal``: the accepted names are
in the refusal) and sequences of them. A value of the wrong type is an
:class:`~masreplay.errors.ArgumentTypeError`, an ``InvalidArgumentError`` that is also the
``TypeError`` Python raises for one; a value of the right type outside its domain is an
``InvalidArgumentError``.
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import math
import operator
import os
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from masreplay._core import VALUE_BOUND
from masreplay.errors import ArgumentTypeError, InvalidArgumentError

T = TypeVar("T")

#: Largest value of the core's unsigned 64-bit counts and seeds.
U64_MAX = 2**64 - 1
#: Largest player, trace or event index the core takes (a signed 64-bit index).
I64_MAX = 2**63 - 1
#: Most traces (and events) one batch holds: Arrow's list offsets are 32-bit. A count above
#: it can never be met, and asking for it (say a byte count passed as a trace count) would
#: otherwise spend all memory before failing.
I32_MAX = 2**31 - 1


def whole(name: str, value: Any, *, low: int = 0, high: int = U64_MAX) -> int:
    """``value`` as an int in [low, high]: an int, a NumPy integer or an integral float (so
    ``budget=1e4`` reads as 10,000); bools, fractions and other types are refused."""
    if isinstance(value, (bool, np.bool_)):
        raise wrong_type(name, "a whole number", value)
    if isinstance(value, (float, np.floating)):
        if not float(value).is_integer():
            raise InvalidArgumentError(f"{name} must be a whole number, got {value!r}")
        number = int(value)
    else:
        try:
            number = operator.index(value)
        except TypeError:
            raise wrong_type(name, "a whole number", value) from None
    if not low <= number <= high:
        raise InvalidArgumentError(f"{name} must be an integer in [{_bound(low)}, {_bound(high)}], got {number}")
    return number


def numbers(name: str, value: Any, dtype: Any = np.float64) -> np.ndarray:
    """``value`` (a list, an array, anything NumPy reads) as a contiguous, aligned array of
    ``dtype``: text, None, complex numbers, dates and durations, masked entries, items that
    are no numbers and (for an integer ``dtype``) fractions or integers beyond its range are
    refused by name, rather than by NumPy's error or a silent conversion (NumPy reads "1.5"
    as 1.5, None as NaN, drops an imaginary part and a mask, and wraps 2**64 - 1 to -1)."""
    if value is None or isinstance(value, (str, bytes)):
        raise wrong_type(name, "numbers (a sequence or an array)", value)
    refuse_masked(name, value)
    try:
        raw = np.asarray(value)
        if raw.dtype.kind not in "biuf":
            _check_items(raw)
        if np.dtype(dtype).kind in "iu":
            _check_whole(raw, np.iinfo(dtype))
        array = np.asarray(raw, dtype=dtype, order="C")  # a scalar stays 0-d, refused by shape
    except (TypeError, ValueError, OverflowError) as error:
        raise InvalidArgumentError(f"{name} must hold numbers: {error}") from None
    return aligned(array)


def aligned(array: np.ndarray) -> np.ndarray:
    """``array``, copied if it is unaligned: a view at an odd byte offset (np.frombuffer of a
    packed record) is contiguous but unaligned, which the core cannot read in place."""
    return array if array.flags.aligned else array.copy()


def refuse_masked(name: str, value: Any) -> None:
    """Refuses a masked array with masked entries, whose mask NumPy's conversion drops."""
    if isinstance(value, np.ma.MaskedArray) and np.ma.is_masked(value):
        raise InvalidArgumentError(f"{name} has masked entries: fill them or leave them out")


def _check_items(raw: np.ndarray) -> None:
    """Raises ValueError unless every item of an array that is not of a real number dtype is
    a real number: NumPy would convert text, None, complex numbers and dates without a word."""
    if raw.dtype.kind != "O":
        raise ValueError(f"an array of {raw.dtype} holds no real numbers")
    for item in raw.flat:
        if item is None or isinstance(item, (str, bytes, complex, np.complexfloating, np.datetime64, np.timedelta64)):
            raise ValueError(f"{item!r} is not a real number")


def _check_whole(raw: np.ndarray, limits: np.iinfo) -> None:
    """Raises ValueError unless every value of ``raw`` is a whole number ``limits`` holds
    (NumPy's cast would truncate a fraction and wrap an integer beyond the range)."""
    if raw.dtype.kind in "fO" and not np.all(np.mod(raw.astype(np.float64), 1) == 0):
        raise ValueError("a fraction or a NaN where a whole number goes")
    if raw.dtype.kind == "f" and raw.size:  # float(2**63 - 1) rounds up to 2**63, which wraps
        inside = float(limits.min) <= raw.min() and raw.max() < float(limits.max) + 1
    else:
        inside = raw.dtype.kind != "u" or not raw.size or raw.max() <= limits.max
    if not inside:
        raise ValueError(f"a value beyond [{limits.min}, {limits.max}] where a whole number goes")


def unsummable(values: np.ndarray, *, missing: bool = True) -> np.ndarray:
    """Where ``values`` holds a number masreplay must not sum: infinite or of magnitude 2^49 or
    more (the README's bound on summed inputs, beyond which sums lose their units), or NaN
    unless ``missing`` lets NaN mark a missing value. Callers name the first in their error."""
    beyond = ~(np.abs(values) < VALUE_BOUND)  # NaN compares false, so it lands here too
    return beyond & ~np.isnan(values) if missing else beyond


def ids(name: str, value: Any) -> list[str]:
    """Trace or event ids from any iterable of them, but not from a lone string, which would
    be read as its characters."""
    one_item = isinstance(value, np.ndarray) and value.ndim == 0  # iterating it raises TypeError
    if isinstance(value, (str, bytes)) or one_item or not isinstance(value, collections.abc.Iterable):
        raise wrong_type(name, "a sequence of ids", value)
    # An Arrow array iterates as scalars: its Python values are the ids (and None for a null).
    items = value.to_pylist() if callable(getattr(value, "to_pylist", None)) else list(value)
    # An id is text: str() would turn b"x", None or 7 into ids no trace has ("b'x'", "None"),
    # quietly matching nothing where a missing trace is skipped. NumPy's str_ is a str.
    if not all(type(item) is str for item in items):
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise wrong_type(f"{name}[{i}]", "an id (str)", item)
        items = [str(item) for item in items]
    # ASCII ids (the common case) checked in one C-level pass; an id is named only when refused.
    if not all(map(str.isascii, items)):
        for i in (i for i, item in enumerate(items) if not is_text(item)):
            text(f"{name}[{i}]", items[i])
    return items


def is_text(value: str) -> bool:
    """Whether the core can take ``value``: UTF-8, so no lone surrogate (``"\\ud800"``, or a
    path's undecodable byte as ``os.fsdecode`` escapes it), on which the binding raises a
    ``UnicodeEncodeError`` that names no argument."""
    if value.isascii():  # the common case, a flag CPython keeps: no encoding
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def text(name: str, value: str) -> str:
    """``value``, refused by name unless :func:`is_text`."""
    if not is_text(value):
        raise InvalidArgumentError(f"{name} must be UTF-8 text (no lone surrogate), got {value[:40]!r}")
    return value


def wrong_type(name: str, expected: str, value: Any) -> ArgumentTypeError:
    """The refusal of a value of the wrong type: ``name must be <expected>, got <type> <value>``."""
    return ArgumentTypeError(f"{name} must be {expected}, got {type(value).__name__} {value!r}")


def _bound(limit: int) -> str:
    """A range's end as a reader checks it: 2**64 - 1 rather than its twenty digits."""
    return {U64_MAX: "2**64 - 1", I64_MAX: "2**63 - 1", I32_MAX: "2**31 - 1"}.get(limit, str(limit))


def optional_whole(name: str, value: Any, *, low: int = 0, high: int = U64_MAX) -> int | None:
    """:func:`whole`, with None passed through (the argument's default)."""
    return None if value is None else whole(name, value, low=low, high=high)


def real(
    name: str, value: Any, *, low: float = -math.inf, high: float = math.inf, above: bool = False, nan: bool = False
) -> float:
    """``value`` as a finite float in [low, high] (in (low, high] when ``above``; NaN too
    when ``nan``, where it means a missing value)."""
    if type(value) is not float and not _is_number(value):  # a float, the common case, skips the test
        raise wrong_type(name, "a number", value)
    number = float(value)
    if nan and math.isnan(number):
        return number
    inside = (low < number if above else low <= number) and number <= high
    if not (math.isfinite(number) and inside):
        raise InvalidArgumentError(f"{name} must be {_interval(low, high, above)}, got {value!r}")
    return number


def _interval(low: float, high: float, above: bool) -> str:
    if math.isinf(low) and math.isinf(high):
        return "a finite number"
    if math.isinf(high):
        return f"a number {'>' if above else '>='} {low:g}"
    return f"a number in {'(' if above else '['}{low:g}, {high:g}]"


#: Ranges of the parameters that share a meaning wherever they appear with that type (beyond
#: the type): a float ``step`` is a finite difference, an int ``step`` a schedule's count.
RANGES: dict[tuple[str, type], dict[str, Any]] = {
    ("gamma", float): {"low": 0.0, "high": 1.0},  # a discount
    ("lam", float): {"low": 0.0, "high": 1.0},  # GAE's lambda
    ("eps", float): {"low": 0.0},  # a denominator's floor (0: none, as in exactness tests)
    ("step", float): {"low": 0.0, "above": True},  # a finite-difference step
    ("max_path", int): {"low": 1},
    ("sub_calls", int): {"low": 1},
    # The value of an event without the channel (NaN keeps it missing): a reward, summed, so
    # of magnitude below the bound on summed numbers.
    ("fill", float): {"nan": True, "low": -math.nextafter(VALUE_BOUND, 0), "high": math.nextafter(VALUE_BOUND, 0)},
    # Weights of summed reward terms: within the README's 2^49 bound on summed numbers, past
    # which a group's std overflows and its advantages come out as silent near-zeros.
    **{
        (name, float): {"low": -(2.0**49), "high": 2.0**49}
        for name in ("lambda_shapley", "lambda_tool", "lambda_parallel", "lambda_finish")
    },
}


def checked(function: Callable[..., T]) -> Callable[..., T]:
    """``function`` with its arguments checked against its own annotations on every call,
    before any work: ``float`` a finite number, ``int`` a whole number, ``bool`` and ``str``
    themselves, ``os.PathLike`` a path, a ``Literal`` one of its names, fixed tuples and
    sequences element by element, a mapping of names to floats, ``X | None`` either, and a
    union the alternative of the value's kind; each within :data:`RANGES` where its name and
    type are there. The annotations are the one list of what a function takes, so its signature, its
    type hints and its checks cannot drift apart. An annotation without a check here
    (``Any``, an array) leaves that argument to the function."""
    hints = _parameter_hints(function)
    parameters = inspect.signature(function).parameters.values()
    # (label, rule) of each checked parameter, and (place, label, rule) of each checked
    # positional place.
    checks: dict[str, tuple[str, Rule]] = {}
    caller = function.__qualname__.removesuffix(".__init__")  # GraphBuffer.sample, GraphBuffer
    for parameter in parameters:
        if (check := _check(hints.get(parameter.name), parameter.name)) is not None:
            checks[parameter.name] = (f"{caller}: {parameter.name}", check.rule)
    places = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    by_place = [(place, *checks[name]) for place, name in enumerate(places) if name in checks]

    # The arguments are matched to parameters by place and by name without binding a
    # signature (which took 13 us a call, three times a small group_normalize), and only
    # those given are looked at; an argument given twice or unknown is the function's own
    # TypeError, as without the checks.
    @functools.wraps(function)
    def with_checks(*args: Any, **kwargs: Any) -> T:
        if by_place and len(args) > by_place[0][0]:
            args = list(args)
            for place, label, rule in by_place:
                if place < len(args):
                    args[place] = rule(label, args[place])
        for name, value in kwargs.items():
            if (check := checks.get(name)) is not None:
                kwargs[name] = check[1](check[0], value)  # a value replaced, no key added
        return function(*args, **kwargs)

    return with_checks


def _parameter_hints(function: Callable[..., Any]) -> dict[str, Any]:
    """The parameters' annotations, evaluated in the function's module: not the return
    annotation, which may name the class a method is being defined in."""
    annotations = {name: hint for name, hint in function.__annotations__.items() if name != "return"}
    # eval of the module's own annotation text (``from __future__ import annotations``), as
    # typing.get_type_hints does.
    return {name: eval(hint, function.__globals__) if isinstance(hint, str) else hint for name, hint in annotations.items()}


Rule = Callable[[str, Any], Any]


class Check(typing.NamedTuple):
    """What an annotation asks of a value: ``kind`` tells whether a value is of the
    annotation's type (which alternative of a union it is meant for), ``rule`` checks it
    (refusing it by name, or returning the value as the function takes it), ``expected``
    says what is accepted, in words (``many``: several of them, for a sequence's)."""

    kind: Callable[[Any], bool]
    rule: Rule
    expected: str
    many: str


def _check(hint: Any, parameter: str = "") -> Check | None:
    """The check an annotation of ``parameter`` stands for (None: the function checks that
    argument itself)."""
    origin, parts = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return _union([p for p in parts if p is not type(None)], type(None) in parts, parameter)
    if hint is float:
        limits = RANGES.get((parameter, float), {})
        return Check(_is_number, lambda name, value: real(name, value, **limits), "a number", "numbers")
    if hint is int:
        limits = RANGES.get((parameter, int), {})
        return Check(_is_number, lambda name, value: whole(name, value, **limits), "a whole number", "whole numbers")
    if hint is bool:
        return Check(_is_flag, flag, "True or False", "flags")
    if hint is str:
        return Check(_is_string, _string, "a string", "strings")
    if hint is os.PathLike or origin is os.PathLike:
        return Check(_is_path, _path, "a path", "paths")
    if origin is typing.Literal and all(isinstance(p, str) for p in parts):
        return _names(parts)
    if origin is tuple and parts and all(p is float for p in parts):
        length = len(parts)
        return Check(is_sequence, lambda name, value: _items(name, value, REAL, length), f"{length} numbers", "tuples")
    if origin in (tuple, collections.abc.Sequence) and parts in ((float, ...), (float,)):
        return Check(is_sequence, lambda name, value: _items(name, value, REAL, None), "a sequence of numbers", "sequences")
    if origin is collections.abc.Sequence and (item := _check(parts[0])) is not None:
        items = f"a sequence of {item.many}"
        return Check(is_sequence, lambda name, value: list(_items(name, value, item, None)), items, "sequences")
    if origin is collections.abc.Mapping and parts == (str, float):
        return Check(_is_mapping, _named_reals, "a mapping of names to numbers", "mappings")
    if collections.abc.Mapping in (hint, origin):
        return Check(_is_mapping, _mapping, "a mapping", "mappings")
    if collections.abc.Callable in (hint, origin):
        return Check(callable, _callable, "a callable", "callables")
    return None


def _union(options: list[Any], optional: bool, parameter: str) -> Check | None:
    """A union's check: the value goes to the alternative of its kind (a string to ``str``
    or a ``Literal``, a list to ``Sequence``), whose refusal names what it expected; a value
    of no alternative's kind is refused with all of them. None passes where it is allowed."""
    alternatives = [_check(option, parameter) for option in options]
    if not alternatives or any(a is None for a in alternatives):
        return None
    if len(alternatives) == 1:  # X | None: X's own refusal, and a cheaper call on a hot path
        (only,) = alternatives
        return Check(
            lambda value: value is None or only.kind(value),
            lambda name, value: None if value is None else only.rule(name, value),
            f"{only.expected} or None",
            only.many,
        )
    expected = " or ".join([a.expected for a in alternatives] + (["None"] if optional else []))
    many = " or ".join(a.many for a in alternatives)

    def rule(name: str, value: Any) -> Any:
        if value is None and optional:
            return None
        for alternative in alternatives:
            if alternative.kind(value):
                return alternative.rule(name, value)
        raise wrong_type(name, expected, value)

    def kind(value: Any) -> bool:
        return (value is None and optional) or any(a.kind(value) for a in alternatives)

    return Check(kind, rule, expected, many)


def _names(names: tuple[str, ...]) -> Check:
    """One of a closed vocabulary's names (a ``Literal``), parsed here, once."""
    accepted = frozenset(names)
    listed = ", ".join(repr(n) for n in names)
    expected = f"one of {listed}"

    def rule(name: str, value: Any) -> str:
        if not isinstance(value, str):
            raise wrong_type(name, expected, value)
        if value not in accepted:
            raise InvalidArgumentError(f"{name} must be {expected}, got {value!r}")
        return value

    return Check(_is_string, rule, expected, f"names among {listed}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (float, np.floating)) or is_index(value)


def _is_flag(value: Any) -> bool:
    return isinstance(value, (bool, np.bool_))


def _is_string(value: Any) -> bool:
    return isinstance(value, str)


def _is_path(value: Any) -> bool:
    return isinstance(value, (str, os.PathLike))


def is_sequence(value: Any) -> bool:
    """A list, tuple or array of items: not a str or bytes, which are sequences of characters,
    nor a 0-d array, which holds one item and cannot be iterated."""
    if isinstance(value, np.ndarray):
        return value.ndim > 0
    return isinstance(value, collections.abc.Sequence) and not isinstance(value, (str, bytes))


def item_of_0d(value: Any) -> Any:
    """A 0-d array as its one item (NumPy's scalar, ``np.array(3)`` as ``3``); any other value
    as it is."""
    return value[()] if isinstance(value, np.ndarray) and value.ndim == 0 else value


def is_index(value: Any) -> bool:
    """An int or a NumPy integer: not a bool, nor a ``timedelta64`` (a NumPy integer subclass
    that ``int()`` refuses)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_, np.timedelta64))


def _is_mapping(value: Any) -> bool:
    return isinstance(value, collections.abc.Mapping)


def flag(name: str, value: Any) -> bool:
    """``value`` as a bool: True or False (NumPy's too), not a truthy string or number."""
    if not _is_flag(value):
        raise wrong_type(name, "True or False", value)
    return bool(value)


def _of_kind(kind: Callable[[Any], bool], expected: str) -> Rule:
    """The rule that passes a value of ``kind`` as it is and refuses any other by name."""

    def rule(name: str, value: Any) -> Any:
        if not kind(value):
            raise wrong_type(name, expected, value)
        return value

    return rule


def _string(name: str, value: Any) -> str:
    if not _is_string(value):
        raise wrong_type(name, "a string", value)
    return text(name, value)


def _path(name: str, value: Any) -> Any:
    if not _is_path(value):
        raise wrong_type(name, "a path (a str or an os.PathLike)", value)
    path = os.fspath(value)
    if isinstance(path, str):  # a bytes path is the function's own to take or refuse
        text(name, path)
    return value


_mapping = _of_kind(_is_mapping, "a mapping")
_callable = _of_kind(callable, "a callable")


REAL = Check(_is_number, real, "a number", "numbers")


def _items(name: str, value: Any, item: Check, length: int | None) -> tuple[Any, ...]:
    if not is_sequence(value):
        raise wrong_type(name, f"a sequence of {item.many}", value)
    if length is not None and len(value) != length:
        raise InvalidArgumentError(f"{name} must hold {length} numbers, got {len(value)}")
    return tuple(item.rule(f"{name}[{i}]", entry) for i, entry in enumerate(value))


def _named_reals(name: str, value: Any) -> dict[str, float]:
    if not _is_mapping(value):
        raise wrong_type(name, "a mapping of names to numbers", value)
    return {_string(f"{name} key", key): real(f"{name}[{key!r}]", item) for key, item in value.items()}
