"""Parse thunder's generated Python source into functions of statements, with types and user lines."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass

from .model import Op, SourceLine, TypeInfo
from .ops import parse_type

__all__ = ["REGION_NAME", "ParsedFunction", "parse_functions", "comment_types"]

#: thunder's name of a CUDA-graph region function.
REGION_NAME = re.compile(r"^CUDAGraph\d+$")

_TYPE_COMMENT = re.compile(r"#\s*([A-Za-z_]\w*): \"([^\"]*)\"")
_USER_LINE = re.compile(r"^\s*# (?P<file>[^\s:][^:]*):(?P<line>\d+): ?\t?(?P<code>.*)$")


@dataclass(slots=True)
class ParsedFunction:
    """One generated function: its name, parameters and statements."""

    name: str
    params: tuple[str, ...]
    ops: list[Op]
    source: str
    first_line: int  # line of the `def` in `source`


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _loaded_names(node: ast.AST) -> list[str]:
    """Names read by an expression, callee paths (``torch.sum``, ``torch.device``) left out."""
    out: list[str] = []

    def visit(n: ast.AST) -> None:
        if isinstance(n, ast.Call):
            if _dotted(n.func) is None:
                visit(n.func)
            for a in n.args:
                visit(a)
            for k in n.keywords:
                visit(k.value)
            return
        if isinstance(n, ast.Attribute):
            # `dtypes.float32`, `torch.float32`: module constants, not values of the trace
            if _dotted(n) is None:
                visit(n.value)
            return
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            out.append(n.id)
            return
        for c in ast.iter_child_nodes(n):
            visit(c)

    visit(node)
    return list(dict.fromkeys(out))


def _target_names(targets: Iterable[ast.AST]) -> list[str]:
    out: list[str] = []
    for t in targets:
        for n in ast.walk(t):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                out.append(n.id)
    return out


def _user_lines(lines: list[str]) -> dict[int, SourceLine]:
    """Map each line number to the user source comment that precedes it (1-based)."""
    current: SourceLine | None = None
    result: dict[int, SourceLine] = {}
    for i, text in enumerate(lines, start=1):
        m = _USER_LINE.match(text)
        if m and not _TYPE_COMMENT.search(text):
            if not _is_library_file(m.group("file")):
                current = SourceLine(m.group("file"), int(m.group("line")), m.group("code").strip())
            # NOTE: a line inside thunder or torch is an implementation detail: keep the user's line before it
        elif text.strip().startswith("def "):
            current = None
        if current is not None:
            result[i] = current
    return result


_LIBRARY_DIRS = ("/thunder/", "/torch/", "/site-packages/", "/dist-packages/")


def _is_library_file(path: str) -> bool:
    return any(d in path for d in _LIBRARY_DIRS)


def parse_functions(source: str) -> list[ParsedFunction]:
    """Parse generated source into functions of statements (`Op`), in order."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ValueError(f"not valid Python source: {e.msg} (line {e.lineno})") from None
    lines = source.splitlines()
    user = _user_lines(lines)
    fns: list[ParsedFunction] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef):
            continue
        params = tuple(a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs)
        ops: list[Op] = []
        for st in node.body:
            text = "\n".join(lines[st.lineno - 1 : (st.end_lineno or st.lineno)]).strip()
            text = _TYPE_COMMENT.sub("", text).rstrip().rstrip("#").rstrip()
            ul = user.get(st.lineno)
            if isinstance(st, ast.Delete):
                names = tuple(_target_names(st.targets)) or tuple(_loaded_names(st))
                names = tuple(n for t in st.targets for n in _del_names(t))
                ops.append(Op("del", "del", (), names, st.lineno, text, ul))
            elif isinstance(st, ast.Return):
                ins = tuple(_loaded_names(st.value)) if st.value is not None else ()
                ops.append(Op("return", "return", (), ins, st.lineno, text, ul))
            elif isinstance(st, (ast.Assign, ast.AnnAssign, ast.Expr)):
                value = st.value
                targets = st.targets if isinstance(st, ast.Assign) else ([st.target] if isinstance(st, ast.AnnAssign) else [])
                outs = tuple(_target_names(targets))
                if isinstance(value, ast.Call):
                    callee = _dotted(value.func) or "<call>"
                    kind = "region" if REGION_NAME.match(callee) else "call"
                    ops.append(Op(kind, callee, outs, tuple(_loaded_names(value)), st.lineno, text, ul))
                elif value is not None:
                    ops.append(Op("unpack", "unpack", outs, tuple(_loaded_names(value)), st.lineno, text, ul))
            else:
                # NOTE: generated traces are straight-line; anything else is read as a plain statement
                outs = tuple(_target_names([st]))
                ops.append(Op("call", type(st).__name__, outs, tuple(_loaded_names(st)), st.lineno, text, ul))
        fns.append(ParsedFunction(node.name, params, ops, source, node.lineno))
    return fns


def _del_names(t: ast.AST) -> list[str]:
    if isinstance(t, ast.Name):
        return [t.id]
    if isinstance(t, (ast.Tuple, ast.List)):
        return [n for e in t.elts for n in _del_names(e)]
    return []


def comment_types(source: str) -> dict[str, TypeInfo]:
    """Collect the type comments (``# t9: "cpu f32[]"``) of generated source."""
    return {m.group(1): parse_type(m.group(2)) for m in _TYPE_COMMENT.finditer(source)}
