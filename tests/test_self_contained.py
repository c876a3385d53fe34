"""The repository is all a user has: no file under tests/, python/, benches/ or examples/ may
read from outside it (a clone has no ``../shared``). Scans the code's string literals and its
``Path(__file__).parents[k]`` hops, so a new escape fails here before it fails on a clone."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SCANNED = ["tests", "python", "benches", "examples"]


def python_files() -> list[Path]:
    this = Path(__file__).resolve()  # it spells the escapes it looks for
    return sorted(path for folder in SCANNED for path in (REPO_ROOT / folder).rglob("*.py") if path.resolve() != this)


def docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (prose may name ../shared; code may not)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                found.add(id(first.value))
    return found


def escapes(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    prose = docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            text = node.value
            parts = text.replace("\\", "/").split("/")
            if ".." in parts or ("shared" in parts and len(parts) > 1) or text == "shared":
                found.append(f"line {node.lineno}: string {text!r} points outside the repository")
        # Path(__file__).resolve().parents[k]: k + 1 levels up from the file's folder.
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "parents"
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, int)
            and "__file__" in ast.unparse(node.value)
        ):
            target = path.resolve().parents[node.slice.value]
            if not target.is_relative_to(REPO_ROOT):
                found.append(f"line {node.lineno}: {ast.unparse(node)} is {target}, outside the repository")
    return found


def test_the_scan_sees_python_files():
    assert len(python_files()) > 20


@pytest.mark.parametrize("path", python_files(), ids=lambda path: str(path.relative_to(REPO_ROOT)))
def test_reads_nothing_outside_the_repository(path):
    assert escapes(path) == []


def test_the_scan_catches_an_escape(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('from pathlib import Path\nA = Path(__file__).resolve().parents[2] / "x"\nB = "../shared/traces"\n')
    assert len(escapes(probe)) == 2
