"""The package's layers: every import of every module, those inside functions too, goes down or across, never up,
and no two modules import each other, however indirectly (issue #30; ARCHITECTURE.md draws the layers). The folders
keep the same order; no private name (``_x``) is imported from another thunder-nb module; and thunder's and torch's
private names are used in `thunder_nb.internals` alone (issue #51)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "thunder_nb"

#: The layers, bottom first: a module may import modules of its own layer and the layers below it. A name ending in
#: ``.*`` stands for every module of that package.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("thunder_nb.internals.*",),  # thunder's and torch's private names, adapted: nothing of thunder-nb
    ("thunder_nb.diagnosis.plans", "thunder_nb.diagnosis.rules", "thunder_nb.diagnosis.model",
     "thunder_nb.diagnosis.trace_parts", "thunder_nb.diagnosis.ops",
     "thunder_nb.diagnosis.protocols"),  # the shared vocabulary, what the diagnosis reads
    ("thunder_nb.diagnosis.*",),  # reading what the runtime did, through the protocols: never the runtime itself
    ("thunder_nb.cudagraph.*", "thunder_nb.render.*"),  # the runtime (it records what the diagnosis reads); the drawing
    ("thunder_nb.fix", "thunder_nb.step.*"),  # the transforms and the whole-step graph: the front doors of the runtime
    ("thunder_nb.notebook.*",),  # compare, the widget, exported pages
    ("thunder_nb", "thunder_nb.magics", "thunder_nb.__main__", "thunder_nb.testing.*"),  # the front doors
)


@functools.cache
def _tree(path: Path) -> ast.Module:
    """``path`` parsed once for all the checks (each reads every module)."""
    return ast.parse(path.read_text(encoding="utf-8"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    base = PACKAGE.parent.joinpath(*name.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def _from_target(node: ast.ImportFrom, package: str) -> str | None:
    """The thunder_nb module a ``from ... import`` in ``package`` reads from (relative ones resolved); None: another
    library's."""
    if node.level:
        base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))
    if node.module and node.module.split(".")[0] == "thunder_nb":
        return node.module
    return None


def _imports(path: Path) -> set[str]:
    """The thunder_nb modules ``path`` imports, anywhere in it (``from . import x`` is module ``x`` if it is one)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "thunder_nb"}
        elif isinstance(node, ast.ImportFrom):
            target = _from_target(node, package)
            if target is None:
                continue
            subs = [f"{target}.{a.name}" for a in node.names if _is_module(f"{target}.{a.name}")]
            found |= set(subs) if subs and len(subs) == len(node.names) else {target, *subs}
    found.discard(name)
    return found


@functools.cache
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


# --- folders ------------------------------------------------------------------------------------------------------

#: The folders of ``thunder_nb/`` (a top-level module is a folder of its own; ``thunder_nb`` is its ``__init__``),
#: bottom first, in the order of `LAYERS`: a module imports from its own folder and the folders of the levels below;
#: folders side by side import each other only at the front doors (the last level).
FOLDERS: tuple[tuple[str, ...], ...] = (
    ("internals",),
    ("diagnosis",),  # never the runtime: it reads what cudagraph/ did through diagnosis.protocols
    ("cudagraph", "render"),
    ("fix", "step"),
    ("notebook",),
    ("thunder_nb", "magics", "__main__", "testing"),
)


def _folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _folder_level(folder: str) -> int:
    for i, members in enumerate(FOLDERS):
        if folder in members:
            return i
    raise AssertionError(f"thunder_nb/{folder} is in no level of tests/test_layout.py's FOLDERS: place it")


def test_every_folder_has_a_level():
    for module in _graph():
        _folder_level(_folder(module))


def test_no_folder_imports_a_folder_above_or_beside_it():
    front = len(FOLDERS) - 1
    wrong = []
    for m, targets in _graph().items():
        for t in sorted(targets):
            a, b = _folder(m), _folder(t)
            la, lb = _folder_level(a), _folder_level(b)
            if a != b and (lb > la or (lb == la and la != front)):
                wrong.append(f"{m} (thunder_nb/{a}, level {la}) imports {t} (thunder_nb/{b}, level {lb})")
    assert wrong == []


# --- private names --------------------------------------------------------------------------------------------------


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


#: Private names imported from another thunder-nb module, each with why it stays for now. Every other one fails.
PRIVATE_IMPORTS_ALLOWED: dict[str, str] = {
    # NOTE: none of cudagraph/: the runner's memory is cudagraph/memory.py's GraphMemory, read through its methods
    # NOTE: tests/notebook/test_comparison.py reads verdict._failure_phrase too; rename it with that test
    "thunder_nb.notebook.compared imports thunder_nb.notebook.verdict._failure_phrase": "a test reads it by this name",
}


def _private_imports(path: Path) -> list[str]:
    """``importer imports module._name`` for each private name ``path`` takes from another thunder-nb module, by an
    import or as an attribute of a module it imported (``from . import verdict`` ... ``verdict._phrase``)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = _tree(path)
    found, modules = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = _from_target(node, package)
            if target is None:
                continue
            for a in node.names:
                if _is_module(f"{target}.{a.name}"):
                    modules[a.asname or a.name] = f"{target}.{a.name}"
                elif _private(a.name):
                    found.append(f"{name} imports {target}.{a.name}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "thunder_nb" and a.asname:
                    modules[a.asname] = a.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
                and node.value.id in modules and modules[node.value.id] != name):
            found.append(f"{name} imports {modules[node.value.id]}.{node.attr}")
    return found


def test_no_private_name_crosses_a_module():
    found = [f for p in sorted(PACKAGE.rglob("*.py")) for f in _private_imports(p)]
    assert sorted(set(found) - set(PRIVATE_IMPORTS_ALLOWED)) == []
    assert sorted(set(PRIVATE_IMPORTS_ALLOWED) - set(found)) == [], "allowed but gone: take it off the list"


#: Private attributes of other libraries than thunder and torch that thunder-nb reads, and why.
OTHER_LIBRARIES = {
    "_fields": "a namedtuple's field names: public API despite the underscore",
    "_actions": "argparse's declarations of the magic's options (magics.options_markdown)",
    "_filename_map": "IPython's file names of its cells (diagnosis.failures)",
}

#: thunder's and torch's private names used outside `thunder_nb.internals`, each ``module: name``, with why it stays.
PRIVATE_THUNDER_TORCH_ALLOWED: dict[str, str] = {}


def _defined_names() -> set[str]:
    """Every name thunder-nb defines itself: functions, classes, variables, arguments, ``__slots__`` entries and the
    attributes it sets on ``self`` or ``cls`` (also by ``setattr``)."""
    names = set()
    for p in PACKAGE.rglob("*.py"):
        for node in ast.walk(_tree(p)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                names.add(node.attr)
            elif (isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)) and len(node.args) > 1
                  and getattr(node.func, "id", getattr(node.func, "attr", None)) in ("setattr", "__setattr__")
                  and isinstance(node.args[0], ast.Name) and node.args[0].id in ("self", "cls")
                  and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
                names.add(node.args[1].value)  # NOTE: a frozen dataclass's object.__setattr__(self, "_x", ...)
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__"
                                                      for t in node.targets):
                names.update(c.value for c in ast.walk(node.value)
                             if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return names


def _private_thunder_torch(path: Path, own: set[str]) -> list[str]:
    """``module: name`` for each private thunder or torch name ``path`` uses: a private module or name imported from
    thunder or torch (``torch._dynamo``, ``from thunder.core.transforms import _grad_fn_map``); a private attribute
    reached from a thunder or torch name (``torch._C``, ``torch.Tensor._use_count``); and a private attribute of any
    object, read or set (also by ``getattr``'s string), or passed as a keyword argument, that thunder-nb itself never
    defines (``bsym._call_ctx``, ``jfn._lc_transforms``, ``BoundSymbol(..., _call_ctx=...)``): another library's,
    thunder's or torch's unless `OTHER_LIBRARIES` names it. A private name used as a dict key
    (``m.__dict__["_modules"]``) is not seen."""
    name = _module_name(path)
    tree = _tree(path)
    found, roots = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in ("thunder", "torch"):
                    roots.add(a.asname or a.name.split(".")[0])
                    found += [f"{name}: {a.name}"] if any(_private(x) for x in a.name.split(".")) else []
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.split(".")[0] in ("thunder", "torch"):
                found += [f"{name}: {node.module}"] if any(_private(x) for x in node.module.split(".")) else []
                for a in node.names:
                    roots.add(a.asname or a.name)
                    found += [f"{name}: {node.module}.{a.name}"] if _private(a.name) else []
    for node in ast.walk(tree):
        attr = None
        if isinstance(node, ast.Attribute) and _private(node.attr):
            attr, base = node.attr, node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in roots:
                found.append(f"{name}: {ast.unparse(node)}")
                continue
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr", "delattr") and len(node.args) > 1
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and _private(node.args[1].value)):
            attr = node.args[1].value
        elif isinstance(node, ast.keyword) and node.arg is not None and _private(node.arg):
            attr = node.arg
        if (attr is not None and attr not in own and attr not in OTHER_LIBRARIES
                and not attr.startswith("_thunder_nb")):
            found.append(f"{name}: {attr}")
    return found


def test_private_thunder_and_torch_names_only_in_internals():
    own = _defined_names()
    found = {f for p in sorted(PACKAGE.rglob("*.py")) if PACKAGE / "internals" not in p.parents
             for f in _private_thunder_torch(p, own)}
    assert sorted(found - set(PRIVATE_THUNDER_TORCH_ALLOWED)) == []
    assert sorted(set(PRIVATE_THUNDER_TORCH_ALLOWED) - found) == [], "allowed but gone: take it off the list"



#: The most lines a module of the package may have (issue 51): past it, a module holds more than one job.
MAX_MODULE_LINES = 400


def test_no_module_is_over_the_line_limit():
    long = {str(p.relative_to(PACKAGE)): n for p in sorted(PACKAGE.rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by job): {long}"
