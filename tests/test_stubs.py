"""The type stubs of the compiled core name exactly what the extension exports."""

from __future__ import annotations

import ast
from pathlib import Path

import masreplay
from masreplay import _core

STUBS = Path(masreplay.__file__).with_name("_core.pyi")


def _stubbed() -> dict[str, set[str] | None]:
    names: dict[str, set[str] | None] = {}
    for node in ast.parse(STUBS.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef):
            names[node.name] = {item.name for item in node.body if isinstance(item, ast.FunctionDef)}
        elif isinstance(node, ast.FunctionDef):
            names[node.name] = None
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = None
    return names


def test_every_stub_exists_at_runtime():
    for name, methods in _stubbed().items():
        if name.startswith("_"):
            continue
        assert hasattr(_core, name), f"_core.pyi declares {name}, which the extension lacks"
        for method in methods or ():
            assert hasattr(getattr(_core, name), method), f"_core.pyi declares {name}.{method}"


def test_every_public_export_has_a_stub():
    stubbed = _stubbed()
    public = {name for name in dir(_core) if not name.startswith("_")}
    assert public <= set(stubbed), f"missing from _core.pyi: {sorted(public - set(stubbed))}"
    for name in public:
        runtime = getattr(_core, name)
        if isinstance(runtime, type):
            methods = {
                m for m in vars(runtime) if not m.startswith("_") or m in {"__len__", "__contains__", "__arrow_c_stream__"}
            }
            assert methods <= stubbed[name], f"{name} methods missing from the stubs: {sorted(methods - stubbed[name])}"
