"""The Python package reads top to bottom: no module imports, directly or through others, a
module that imports it. Every import statement counts, wherever it stands: one inside a
function or under ``if TYPE_CHECKING:`` hides a circle from the interpreter, not from the
reader."""

from __future__ import annotations

import ast
import pathlib
import shutil

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "python" / "masreplay"


def _modules(package: pathlib.Path) -> dict[str, tuple[pathlib.Path, bool]]:
    """Dotted name -> (file, is a package's __init__). Stubs stand for extension modules
    (``_core.pyi`` for ``_core.abi3.so``), so ``from masreplay import _core`` is an import of
    ``_core``, not of the package."""
    modules = {}
    for path in sorted(package.rglob("*.py")) + sorted(package.rglob("*.pyi")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        modules.setdefault(name, (path, is_package))
    return modules


def _imported(node: ast.Import | ast.ImportFrom, name: str, is_package: bool) -> list[str]:
    """The dotted names an import statement of module ``name`` may bring in."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:  # relative: from the module's own package, up level - 1 packages
        base = name.split(".") if is_package else name.split(".")[:-1]
        base = base[: len(base) - node.level + 1]
        target = ".".join([*base, *([node.module] if node.module else [])])
    else:
        target = node.module or ""
    # ``from pkg import name`` imports the submodule pkg.name when there is one, else pkg.
    return [f"{target}.{alias.name}" for alias in node.names] + [target]


def import_graph(package: pathlib.Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports."""
    modules = _modules(package)
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        imports: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                candidates = _imported(node, name, is_package)
                submodules = [c for c in candidates[:-1] if c in modules]
                if isinstance(node, ast.Import):
                    imports.update(submodules)
                else:
                    imports.update(submodules or [c for c in candidates[-1:] if c in modules])
        imports.discard(name)
        graph[name] = imports
    return graph


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle (``[a, b, ..., a]``), or None: a depth-first search that meets a
    module still on its path."""
    state: dict[str, str] = {}  # "open" while on the path, "done" once all below it are seen
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for imported in sorted(graph[module]):
            if state.get(imported) == "open":
                return [*path[path.index(imported) :], imported]
            if imported not in state and (circle := visit(imported)):
                return circle
        path.pop()
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (circle := visit(module)):
            return circle
    return None


def test_no_import_circle_in_masreplay():
    graph = import_graph(PACKAGE)
    assert {"masreplay", "masreplay._core", "masreplay.batch", "masreplay.convert.otel"} <= set(graph)
    assert "masreplay.batch" in graph["masreplay.io"] and "masreplay._core" in graph["masreplay.batch"]
    circle = find_circle(graph)
    assert circle is None, "import circle: " + " -> ".join(circle)


def _copy_package(tmp_path: pathlib.Path) -> pathlib.Path:
    copy = tmp_path / "masreplay"
    shutil.copytree(PACKAGE, copy, ignore=lambda folder, names: [n for n in names if n.endswith((".so", ".pyd"))])
    return copy


def test_a_circle_through_a_lazy_import_is_found(tmp_path):
    """A probe: the real package with one import added deep inside a function of a module
    low in the layers, back up to the command line."""
    copy = _copy_package(tmp_path)
    errors = copy / "errors.py"
    errors.write_text(errors.read_text() + "\n\ndef _probe():\n    from masreplay.cli import main\n\n    return main\n")
    circle = find_circle(import_graph(copy))
    assert circle is not None and circle[0] == circle[-1]
    assert "masreplay.errors" in circle and "masreplay.cli" in circle


def test_a_circle_under_type_checking_and_relative_imports_is_found(tmp_path):
    probe = tmp_path / "probe"
    (probe / "inner").mkdir(parents=True)
    (probe / "__init__.py").write_text("")
    (probe / "inner" / "__init__.py").write_text("from .low import value\n")
    (probe / "inner" / "low.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from ..high import Thing\n\nvalue = 1\n"
    )
    (probe / "high.py").write_text("from probe import inner\n\nThing = inner.value\n")
    graph = import_graph(probe)
    assert graph == {
        "probe": set(),
        "probe.inner": {"probe.inner.low"},
        "probe.inner.low": {"probe.high"},
        "probe.high": {"probe.inner"},
    }
    assert find_circle(graph) == ["probe.high", "probe.inner", "probe.inner.low", "probe.high"]
    (probe / "inner" / "low.py").write_text("value = 1\n")
    assert find_circle(import_graph(probe)) is None
