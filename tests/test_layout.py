"""The package's layers: every import of every module, those inside functions too, goes down or across, never up,
and no two modules import each other, however indirectly (issue #30; ARCHITECTURE.md draws the layers)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "thunder_nb"

#: The layers, bottom first: a module may import modules of its own layer and the layers below it. A name ending in
#: ``.*`` stands for every module of that package.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("thunder_nb.internals",),  # thunder's and torch's private names, adapted: nothing of thunder-nb
    ("thunder_nb.diagnosis.plans", "thunder_nb.diagnosis.rules", "thunder_nb.diagnosis.model",
     "thunder_nb.diagnosis.ops", "thunder_nb.diagnosis.protocols"),  # the shared vocabulary, what the diagnosis reads
    ("thunder_nb.cudagraph.*", "thunder_nb.step_report"),  # the runtime: it records what the diagnosis reads
    ("thunder_nb.diagnosis.*", "thunder_nb.render.*"),  # reading what the runtime did, and drawing it
    ("thunder_nb.fix", "thunder_nb.step", "thunder_nb.step_capture", "thunder_nb.step_guard", "thunder_nb.step_graph",
     "thunder_nb.step_compare"),  # the transforms and the whole-step graph: the front doors of the runtime
    ("thunder_nb.notebook.*",),  # compare, the widget, exported pages
    ("thunder_nb", "thunder_nb.magics", "thunder_nb.__main__", "thunder_nb.testing.*"),  # the front doors
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    base = PACKAGE.parent.joinpath(*name.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def _imports(path: Path) -> set[str]:
    """The thunder_nb modules ``path`` imports, anywhere in it (``from . import x`` is module ``x`` if it is one)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "thunder_nb"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.split(".")[0] == "thunder_nb":
                target = node.module
            else:
                continue
            subs = [f"{target}.{a.name}" for a in node.names if _is_module(f"{target}.{a.name}")]
            found |= set(subs) if subs and len(subs) == len(node.names) else {target, *subs}
    found.discard(name)
    return found


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def _layer(module: str) -> int:
    """The layer of ``module``: where it is named, else where its package is (``pkg.*``, the package itself too)."""
    for i, members in enumerate(LAYERS):
        if module in members:
            return i
    for i, members in enumerate(LAYERS):
        if any(m.endswith(".*") and f"{module}.".startswith(m[:-1]) for m in members):
            return i
    raise AssertionError(f"{module} is in no layer of tests/test_layout.py: place it")


def test_every_module_has_a_layer():
    for module in _graph():
        _layer(module)


def test_no_module_imports_a_layer_above_its_own():
    upward = [f"{m} (layer {_layer(m)}) imports {t} (layer {_layer(t)})"
              for m, targets in _graph().items() for t in sorted(targets) if _layer(t) > _layer(m)]
    assert upward == []


def test_no_import_cycles():
    graph = _graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                cycles.append(" -> ".join(path[path.index(t):] + [t]) if t in path else f"{m} -> {t}")
            elif t in graph and state.get(t) is None:
                visit(t, path + [t])
        state[m] = 2

    for m in sorted(graph):
        if state.get(m) is None:
            visit(m, [m])
    assert cycles == []


@pytest.mark.parametrize("package", ["cudagraph", "diagnosis", "notebook", "render"])
def test_the_library_never_imports_its_test_helpers(package):
    offenders = [m for m, targets in _graph().items() if m.startswith(f"thunder_nb.{package}")
                 and any(t.startswith("thunder_nb.testing") for t in targets)]
    assert offenders == []
