"""The converters' JSON Lines reader against ``json.loads``, on MARBLE lines broken at random.

The core reads most lines with a fast reader of its own (quotes and escapes found 64 bytes at
a time, unread values stepped over) and leaves the others to serde_json. Whatever the bytes,
a line ``json.loads`` refuses must be refused as JSON (never converted), and a line it reads
must not be refused as JSON; the two known differences of the reader (a lone surrogate in a
text it reads, a number past a float's range) are allowed where the line holds one. The
mutations land anywhere, mostly inside the long texts the converter skips.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from masreplay import ConversionError, convert

DATA = Path(__file__).resolve().parent / "data" / "marble"
LINES = [line for path in sorted(DATA.glob("*.jsonl")) for line in path.read_bytes().splitlines() if line.strip()]
SMALL = json.dumps(
    {
        "task": 't\u00e9 "q" \\ \n',
        "iterations": [
            {
                "iteration": 1,
                "task_assignments": {"agent1": 'do \\"x\\"\n\t', "agent2": "y"},
                "communications": ["From agent1 to agent2: hi"],
                "task_results": [{"agent_id": "agent1", "result": "\u2713 ok \ud83d\ude00"}, {"agent2": "done"}],
                "summary": "s",
                "continue_simulation": False,
            }
        ],
        "planning_scores": [4, -1],
        "agent_kpis": {"agent1": 1},
        "token_usage": 12,
    }
).encode()
JSON_ERRORS = ("not valid JSON", "not UTF-8 text", "JSON nested too deeply", "expected a JSON object")

#: Bytes and pieces that matter to a JSON reader: escapes (good, bad, surrogates), quotes,
#: control characters, brackets, number and literal parts, UTF-8 (broken too).
PIECES = [
    *(bytes([byte]) for byte in b'\\"u0aF9xn{}[],:-.eE +\t\x00\x1f\x7f'),
    b"\xc3\xa9",
    b"\xc3",
    b"\xff",
    b"\\u00e9",
    b"\\ud800",
    b"\\udc00",
    b"\\ud83d\\ude00",
    b"\\\\",
    b'\\"',
    b"NaN",
    b"1e400",
    b"true",
    b"null",
    b"[[[[",
]

_folder = tempfile.TemporaryDirectory(prefix="masreplay-json-reading-")


def _python_reading(line: bytes) -> tuple[bool, bool]:
    """Whether ``json.loads`` reads the line to an object, and whether what it read holds a
    lone surrogate or an infinite number (the reader's two known refusals)."""
    try:
        value = json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError):
        return False, False
    return isinstance(value, dict), _holds_known_difference(value)


def _holds_known_difference(value) -> bool:
    if isinstance(value, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, float):
        return math.isinf(value)
    if isinstance(value, list):
        return any(_holds_known_difference(item) for item in value)
    if isinstance(value, dict):
        return any(_holds_known_difference(key) or _holds_known_difference(item) for key, item in value.items())
    return False


def _reader_verdict(line: bytes) -> str | None:
    """The reason the converter refuses the line as JSON, or None when it read it."""
    path = Path(_folder.name) / "episode.jsonl"
    path.write_bytes(line)
    try:
        convert.marble(path)
    except ConversionError as error:
        reason = str(error.reason)
        return reason if reason.startswith(JSON_ERRORS) else None
    return None


@st.composite
def broken_lines(draw):
    line = bytearray(draw(st.sampled_from([SMALL, *LINES])))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(line) - 1))
        piece = draw(st.sampled_from(PIECES))
        match draw(st.sampled_from(["replace", "insert", "delete"])):
            case "replace":
                line[at : at + len(piece)] = piece
            case "insert":
                line[at:at] = piece
            case "delete":
                del line[at : at + draw(st.integers(1, 4))]
        if not line:
            line = bytearray(b"{")
    return bytes(line)


def test_the_samples_are_read():
    assert len(LINES) >= 20
    for line in [SMALL, *LINES]:
        assert _reader_verdict(line) is None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(broken_lines())
def test_broken_lines_are_refused_as_json_loads_refuses_them(line):
    reads, known_difference = _python_reading(line)
    verdict = _reader_verdict(line)
    if not reads:
        assert verdict is not None, f"json.loads refuses the line, the converter read it: {line[:200]!r}"
    elif verdict is not None:
        assert known_difference and any(word in verdict for word in ("surrogate", "hex escape", "out of range")), verdict


#: Lines the reader refuses, with its words as main's reader (serde_json alone) gave them;
#: the "x" values are skipped unread.
REFUSED = [
    (b'{"task": "a\\qb", "iterations": []}', "invalid escape at line 1 column 13"),
    (
        b'{"task": "a\x01b", "iterations": []}',
        "control character (\\u0000-\\u001F) found while parsing a string at line 1 column 12",
    ),
    (b'{"task": "a", "iterations": [],}', "trailing comma at line 1 column 32"),
    (b'{"task": "a", "iterations": []} x', "trailing characters at line 1 column 33"),
    (b'{"task": "\\ud800", "iterations": []}', "unexpected end of hex escape at line 1 column 17"),
    (b'{"task": "a", "x": "\\u12G4", "iterations": []}', "invalid escape at line 1 column 26"),
    (
        b'{"task": "a", "x": "a\tb", "iterations": []}',
        "control character (\\u0000-\\u001F) found while parsing a string at line 1 column 21",
    ),
    (b'{"task": "a", "x": 01, "iterations": []}', "invalid number at line 1 column 21"),
    (b'{"task": "a", "x": [1,], "iterations": []}', "expected value at line 1 column 23"),
]


@pytest.mark.parametrize(("line", "reason"), REFUSED)
def test_errors_keep_their_words(line, reason):
    assert _reader_verdict(line) == f"not valid JSON ({reason})"
