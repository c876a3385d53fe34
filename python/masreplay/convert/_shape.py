"""The shape of foreign records: a field of the wrong type is a ConversionError naming it.

Converters read fields with :func:`field` instead of ``record.get`` wherever the value is
then hashed, iterated or called on, so a list where an id belongs, or an object where a list
belongs, is reported with its place instead of surfacing as a TypeError deep inside.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from masreplay.errors import ConversionError

#: Makes the error for a reason; it knows the source, the line and the place in the record.
Fail = Callable[[str], ConversionError]

#: ``kind`` for a finite number that is not a boolean.
NUMBER = "number"
_NAMES = {str: "text", dict: "an object", list: "a list", bool: "a boolean", NUMBER: "a finite number"}


def describe(value: Any) -> str:
    """A value's JSON type in words (Python's name for anything JSON cannot hold)."""
    for kind, name in ((bool, "a boolean"), (str, "text"), (dict, "an object"), (list, "a list"), ((int, float), "a number")):
        if isinstance(value, kind):
            return name
    return "null" if value is None else type(value).__name__


def is_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond any float
        return False


def field(record: dict[Any, Any], key: str, kind: Any, fail: Fail, place: str = "") -> Any:
    """``record[key]`` when it is of ``kind`` (a type, or NUMBER); None when absent or null;
    anything else fails, naming ``place/key``."""
    value = record.get(key)
    if value is None:
        return None
    if is_number(value) if kind is NUMBER else isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool):
        return value
    raise fail(f"{place}/{key} is {describe(value)}, expected {_NAMES[kind]}")
