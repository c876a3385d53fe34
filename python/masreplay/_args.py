"""Arguments checked once where they enter the package, each refusal naming the argument.

The core takes unsigned or bounded integers: a negative or oversized value would surface as
an ``OverflowError`` that names no argument, and a fractional float would be truncated
without a word. Public functions pass their counts, sizes, seeds and indices through
:func:`whole` (or :func:`optional_whole`); functions of many numeric settings (the recipes)
take :func:`checked`, which derives every check from the function's own annotations.
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import math
import operator
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from masreplay.errors import InvalidArgumentError

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
        raise InvalidArgumentError(f"{name} must be a whole number, got {value!r}")
    if isinstance(value, (float, np.floating)):
        if not float(value).is_integer():
            raise InvalidArgumentError(f"{name} must be a whole number, got {value!r}")
        number = int(value)
    else:
        try:
            number = operator.index(value)
        except TypeError:
            raise InvalidArgumentError(f"{name} must be a whole number, got {type(value).__name__} {value!r}") from None
    if not low <= number <= high:
        raise InvalidArgumentError(f"{name} must be an integer in [{_bound(low)}, {_bound(high)}], got {number}")
    return number


def _bound(limit: int) -> str:
    """A range's end as a reader checks it: 2**64 - 1 rather than its twenty digits."""
    return {U64_MAX: "2**64 - 1", I64_MAX: "2**63 - 1", I32_MAX: "2**31 - 1"}.get(limit, str(limit))


def optional_whole(name: str, value: Any, *, low: int = 0, high: int = U64_MAX) -> int | None:
    """:func:`whole`, with None passed through (the argument's default)."""
    return None if value is None else whole(name, value, low=low, high=high)


def real(name: str, value: Any, *, low: float = -math.inf, high: float = math.inf, above: bool = False) -> float:
    """``value`` as a finite float in [low, high] (in (low, high] when ``above``)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidArgumentError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    number = float(value)
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


#: Ranges of the parameters that share a meaning wherever they appear (beyond their type).
RANGES: dict[str, dict[str, Any]] = {
    "gamma": {"low": 0.0, "high": 1.0},  # a discount
    "lam": {"low": 0.0, "high": 1.0},  # GAE's lambda
    "eps": {"low": 0.0},  # a denominator's floor (0: none, as in exactness tests)
    "step": {"low": 0.0, "above": True},  # a finite-difference step
    "max_path": {"low": 1},
    "sub_calls": {"low": 1},
}


def checked(function: Callable[..., T]) -> Callable[..., T]:
    """``function`` with its arguments checked against its own annotations on every call,
    before any work: ``float`` a finite number, ``int`` a whole number, ``bool`` and ``str``
    themselves, fixed tuples and sequences of floats element by element, a mapping of names
    to floats, ``X | None`` either; each within :data:`RANGES` where its name is there. The
    annotations are the one list of what a function takes, so its signature, its type hints
    and its checks cannot drift apart."""
    hints = typing.get_type_hints(function)
    parameters = inspect.signature(function).parameters.values()
    # (label, rule) of each checked parameter, in the signature's order, and of each
    # positional place (None where nothing is checked).
    checks: dict[str, tuple[str, Rule]] = {}
    for parameter in parameters:
        if (rule := _rule(hints.get(parameter.name), RANGES.get(parameter.name, {}))) is not None:
            checks[parameter.name] = (f"{function.__name__}: {parameter.name}", rule)
    by_place = [checks.get(p.name) for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]

    # The arguments are matched to parameters by place and by name without binding a
    # signature (which took 13 us a call, three times a small group_normalize); an argument
    # given twice or unknown is the function's own TypeError, as without the checks.
    @functools.wraps(function)
    def with_checks(*args: Any, **kwargs: Any) -> T:
        args = (
            tuple(value if check is None else check[1](check[0], value) for check, value in zip(by_place, args, strict=False))
            + args[len(by_place) :]
        )
        for name, (label, rule) in checks.items():
            if name in kwargs:
                kwargs[name] = rule(label, kwargs[name])
        return function(*args, **kwargs)

    return with_checks


Rule = Callable[[str, Any], Any]


def _rule(hint: Any, limits: dict[str, Any]) -> Rule | None:
    """The check an annotation stands for (None: the function checks that argument itself)."""
    origin, parts = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and type(None) in parts:
        inner = _rule(typing.Union[tuple(p for p in parts if p is not type(None))], limits)  # noqa: UP007
        return None if inner is None else lambda name, value: None if value is None else inner(name, value)
    if hint is float:
        return lambda name, value: real(name, value, **limits)
    if hint is int:
        return lambda name, value: whole(name, value, **limits)
    if hint is bool:
        return _boolean
    if hint is str:
        return _string
    if origin is tuple and parts and all(p is float for p in parts):
        return lambda name, value: _reals(name, value, len(parts))
    if origin in (tuple, collections.abc.Sequence) and parts in ((float, ...), (float,)):
        return lambda name, value: _reals(name, value, None)
    if origin is collections.abc.Mapping and parts == (str, float):
        return _named_reals
    return None


def _boolean(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidArgumentError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _string(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{name} must be a string, got {type(value).__name__} {value!r}")
    return value


def _reals(name: str, value: Any, length: int | None) -> tuple[float, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (collections.abc.Sequence, np.ndarray)):
        raise InvalidArgumentError(f"{name} must be a sequence of numbers, got {type(value).__name__} {value!r}")
    if length is not None and len(value) != length:
        raise InvalidArgumentError(f"{name} must hold {length} numbers, got {len(value)}")
    return tuple(real(f"{name}[{i}]", item) for i, item in enumerate(value))


def _named_reals(name: str, value: Any) -> dict[str, float]:
    if not isinstance(value, collections.abc.Mapping):
        raise InvalidArgumentError(f"{name} must be a mapping of names to numbers, got {type(value).__name__} {value!r}")
    return {_string(f"{name} key", key): real(f"{name}[{key!r}]", item) for key, item in value.items()}
