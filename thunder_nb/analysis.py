"""Build the model (`Report`) from thunder traces or generated source, and check it for defects.

The checker works on generated Python source: the top-level function of a trace
(``trace.python()``) and each region function (``inspect.getsource`` of the runner's callable).
Thunder writes a type comment after every assignment (``# t9: "cuda:0 f32[]"``) and the user's
source line before each statement (``# /path/f.py:4: \\ty = x.sin()``), so the source alone holds
what the rules need. Traces add exact types, the DEVICE_SYNC_OP tag and the static-input masks.

`classify_op` is the one place that decides what must never be captured; `thunder_nb.fix` uses it
for bound symbols, the checker for statements.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .model import Defect, GraphRecord, Island, Op, Region, Report, Site, TraceReport, TypeInfo, Value

__all__ = [
    "analyze",
    "analyze_trace",
    "analyze_source",
    "check",
    "classify_op",
    "classify_bsym",
    "parse_type",
    "REGION_NAME",
]

REGION_NAME = re.compile(r"^CUDAGraph\d+$")

#: Ops whose result is read by the host: never capturable, whatever their tags say.
HOST_SYNC_NAMES = frozenset(
    {
        "item",
        "_local_scalar_dense",
        "tolist",
        "numpy",
        "nonzero",
        "masked_select",
        "unique",
        "bincount",
        "equal",
        "get_and_update_rng_state",
    }
)
#: Ops that change device by name.
TRANSFER_NAMES = frozenset({"cpu", "cuda", "device_put"})
#: Ops that take a tensor and yield numbers from metadata only (no host sync).
METADATA_NAMES = frozenset(
    {"shape", "size", "numel", "dim", "ndim", "stride", "is_contiguous", "element_size", "storage_offset", "get_device"}
)
#: Trace bookkeeping that stays at top level.
BOOKKEEPING_NAMES = frozenset(
    {"unpack_trivial", "unpack_sequence", "unpack_key", "unpack_empty_dict", "unpack_attr", "return", "python_return"}
)
COLLECTION_NAMES = frozenset({"clear_mutable_collection"})

_TYPE_COMMENT = re.compile(r"#\s*([A-Za-z_]\w*): \"([^\"]*)\"")
_USER_LINE = re.compile(r"^\s*# (?P<file>[^\s:][^:]*):(?P<line>\d+): ?\t?(?P<code>.*)$")
_TENSOR_TYPE = re.compile(r"^(?P<device>\S+) (?P<dtype>[a-z]+\d*)\[(?P<shape>[^\]]*)\]$")
_NUMBER_TYPES = {"float", "int", "bool", "complex"}


# ---------------------------------------------------------------------------------------------------
# Types and op classification (the one implementation shared with fix.py)


def parse_type(text: str) -> TypeInfo:
    """Parse a thunder type comment such as ``"cuda:0 f32[8, 16]"``, ``"float ?"`` or ``"Collection"``."""
    text = text.strip()
    m = _TENSOR_TYPE.match(text)
    if m:
        dims = tuple(int(d) for d in m.group("shape").replace(" ", "").split(",") if d.strip().lstrip("-").isdigit())
        return TypeInfo("tensor", m.group("dtype"), dims, m.group("device"), text)
    head = text.split(" ", 1)[0]
    if head in _NUMBER_TYPES:
        return TypeInfo("number", head, None, None, text)
    if head == "Collection":
        return TypeInfo("collection", None, None, None, text)
    return TypeInfo("other", None, None, None, text)


def type_of_proxy(p: Any) -> TypeInfo:
    """Return the `TypeInfo` of a thunder proxy (or a constant)."""
    from thunder.core.proxies import CollectionProxy, NumberProxy, TensorProxy

    if isinstance(p, TensorProxy):
        dtype = getattr(p.dtype, "shortname", lambda: str(p.dtype))()
        dev = str(p.device.device_str()) if hasattr(p.device, "device_str") else str(p.device)
        shape = tuple(int(s) if isinstance(s, int) else -1 for s in p.shape)
        dims = ", ".join(str(s) for s in shape)
        return TypeInfo("tensor", dtype, shape, dev, f"{dev} {dtype}[{dims}]")
    if isinstance(p, NumberProxy):
        py = getattr(p, "python_type", None)
        name = py.__name__ if isinstance(py, type) else "number"
        return TypeInfo("number", name, None, None, f"{name} ?")
    if isinstance(p, CollectionProxy):
        return TypeInfo("collection", None, None, None, "Collection")
    if isinstance(p, (bool, int, float, complex)):
        return TypeInfo("number", type(p).__name__, None, None, f"{type(p).__name__} {p}")
    return TypeInfo("other", None, None, None, type(p).__name__)


def classify_op(
    name: str,
    in_types: Sequence[TypeInfo],
    out_types: Sequence[TypeInfo],
    *,
    sync_tag: bool = False,
    cuda_trace: bool = False,
) -> tuple[str, str] | None:
    """Decide whether an op must stay outside CUDA graphs.

    Args:
        name: the op's name as thunder prints or names it (``"Tensor.item"``, ``"item"``, ``"torch.sin"``).
        in_types: types of its arguments.
        out_types: types of its results.
        sync_tag: the op (or a subsymbol) carries thunder's DEVICE_SYNC_OP tag.
        cuda_trace: the trace computes on a CUDA device (then CPU tensor ops cannot be replayed).

    Returns:
        ``(reason, detail)`` with reason one of ``"host-sync"``, ``"device-transfer"``, ``"cpu-op"``;
        None when the op can be captured.
    """
    base = name.rsplit(".", 1)[-1]
    if base in BOOKKEEPING_NAMES or base in COLLECTION_NAMES or base in ("del", "python_del"):
        return None
    tensors_in = [t for t in in_types if t.kind == "tensor"]
    tensors_out = [t for t in out_types if t.kind == "tensor"]
    if sync_tag or base in HOST_SYNC_NAMES:
        return ("host-sync", base)
    if tensors_in and any(t.kind == "number" for t in out_types) and base not in METADATA_NAMES:
        return ("host-sync", base)
    devs_in = sorted({t.device for t in tensors_in if t.device})
    devs_out = sorted({t.device for t in tensors_out if t.device})
    if devs_in and devs_out and devs_in != devs_out:
        return ("device-transfer", f"{','.join(devs_in)} -> {','.join(devs_out)}")
    if base in TRANSFER_NAMES and tensors_in:
        return ("device-transfer", base)
    if cuda_trace and any(t.device == "cpu" for t in tensors_in + tensors_out):
        return ("cpu-op", base)
    return None


def classify_bsym(bsym: Any, *, cuda_trace: bool = False) -> tuple[str, str] | None:
    """`classify_op` for a thunder bound symbol (what `thunder_nb.fix` calls)."""
    from thunder.core.prims import OpTags
    from thunder.core.symbol import has_tags

    try:
        tagged = has_tags(bsym, {OpTags.DEVICE_SYNC_OP})
    except Exception:  # NOTE: a symbol without tag info is judged by name and types alone
        tagged = False
    return classify_op(
        bsym.sym.name,
        [type_of_proxy(a) for a in bsym.flat_proxy_args],
        [type_of_proxy(o) for o in bsym.flat_proxy_outs],
        sync_tag=tagged,
        cuda_trace=cuda_trace,
    )


# ---------------------------------------------------------------------------------------------------
# Generated source -> statements


@dataclass(slots=True)
class _Fn:
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


def _user_lines(lines: list[str]) -> dict[int, str]:
    """Map each line number to the user source comment that precedes it (1-based)."""
    current: str | None = None
    result: dict[int, str] = {}
    for i, text in enumerate(lines, start=1):
        m = _USER_LINE.match(text)
        if m and not _TYPE_COMMENT.search(text):
            if not _is_library_file(m.group("file")):
                current = f"{m.group('file')}:{m.group('line')}: {m.group('code').strip()}"
            # NOTE: a line inside thunder or torch is an implementation detail: keep the user's line before it
        elif text.strip().startswith("def "):
            current = None
        if current is not None:
            result[i] = current
    return result


_LIBRARY_DIRS = ("/thunder/", "/torch/", "/site-packages/", "/dist-packages/")


def _is_library_file(path: str) -> bool:
    return any(d in path for d in _LIBRARY_DIRS)


def parse_functions(source: str) -> list[_Fn]:
    """Parse generated source into functions of statements (`Op`), in order."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ValueError(f"not valid Python source: {e.msg} (line {e.lineno})") from None
    lines = source.splitlines()
    user = _user_lines(lines)
    fns: list[_Fn] = []
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
        fns.append(_Fn(node.name, params, ops, source, node.lineno))
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


# ---------------------------------------------------------------------------------------------------
# The checker and the model builder, over parsed functions


_UNKNOWN = TypeInfo("other")


@dataclass(slots=True)
class _TraceInput:
    kind: str
    name: str
    provenance: str
    top: _Fn | None
    regions: dict[str, _Fn]
    types: dict[str, TypeInfo]
    static_masks: dict[str, tuple[bool, ...]] = field(default_factory=dict)
    sync_outputs: frozenset[str] = frozenset()
    graphs: dict[str, tuple[GraphRecord, ...]] = field(default_factory=dict)
    captured: dict[str, bool | None] = field(default_factory=dict)
    handoffs: dict[str, tuple[str, ...]] = field(default_factory=dict)
    aliases: frozenset[str] = frozenset()  # results of in-place copies: the destination's memory, not new memory
    write_back: dict[str, frozenset[str]] = field(default_factory=dict)  # region -> inputs the runner writes back
    held_calls: dict[str, int] = field(default_factory=dict)  # region -> calls run without the graph (held outputs)


#: Ops whose result is (an alias of) an argument updated in place: no new memory.
IN_PLACE_NAMES = frozenset({"copy_", "update_aliases"})


def _alias_names(fns: Iterable[_Fn]) -> frozenset[str]:
    return frozenset(
        n for fn in fns for op in fn.ops if op.callee.rsplit(".", 1)[-1] in IN_PLACE_NAMES for n in op.outputs
    )


def _classify_stmt(op: Op, ti: _TraceInput, cuda: bool) -> tuple[str, str] | None:
    return classify_op(
        op.callee,
        [ti.types.get(n, _UNKNOWN) for n in op.inputs],
        [ti.types.get(n, _UNKNOWN) for n in op.outputs],
        sync_tag=any(o in ti.sync_outputs for o in op.outputs),
        cuda_trace=cuda,
    )


def _is_cuda(types: Mapping[str, TypeInfo]) -> bool:
    return any(t.kind == "tensor" and (t.device or "").startswith("cuda") for t in types.values())


def _check_fn(fn: _Fn, ti: _TraceInput, *, region: bool, cuda: bool) -> list[Defect]:
    """Apply every rule to one function (the top level, or one region)."""
    out: list[Defect] = []
    where = fn.name if region else None

    def add(rule: str, value: str | None, line: int | None, message: str, hint: str) -> None:
        out.append(Defect(rule, ti.kind, where, value, line, message, hint))

    deleted: dict[str, int] = {}
    reported_uad: set[str] = set()
    returned: set[str] = set()
    for op in fn.ops:
        if op.kind == "return":
            returned.update(op.inputs)
    params = set(fn.params)
    uses: dict[str, int] = {}

    for op in fn.ops:
        if op.kind == "del":
            for n in op.inputs:
                if n in deleted:
                    add("double-del", n, op.line, f"{n} is deleted twice (first on line {deleted[n]})",
                        "delete each name once, after its last use")
                    continue
                deleted[n] = op.line
                if region and n in returned:
                    add("region-deletes-output", n, op.line, f"{fn.name} deletes {n}, one of its own outputs",
                        "protect region outputs from the region's del pass")
                elif region and n in params:
                    add("region-deletes-outside-value", n, op.line,
                        f"{fn.name} deletes {n}, which was produced outside the region",
                        "delete values produced outside a region at top level, after their last consumer")
            continue
        for n in op.inputs:
            if n in deleted and n not in reported_uad:
                reported_uad.add(n)
                add("use-after-del", n, op.line, f"{n} is used after `del {n}` on line {deleted[n]}",
                    "move the del after the last use (or drop it from the region)")
            if op.kind != "return" or not region:
                uses[n] = uses.get(n, 0) + 1
            elif op.kind == "return":
                uses[n] = uses.get(n, 0) + 1
        for n in op.outputs:
            deleted.pop(n, None)
            reported_uad.discard(n)
        if region and op.kind == "call":
            c = _classify_stmt(op, ti, cuda)
            if c is not None:
                reason, detail = c
                what = ", ".join(op.outputs) or op.callee
                if reason == "host-sync":
                    add("host-sync-in-region", what, op.line,
                        f"{op.callee} ({detail}) reads a device value on the host inside {fn.name}",
                        "keep data-dependent ops out of regions (an island)")
                else:
                    add("cpu-op-in-region", what, op.line,
                        f"{op.callee} ({detail}) inside {fn.name} runs once at capture, never on replay",
                        "keep device transfers and CPU ops out of regions")

    if region:
        mask = ti.static_masks.get(fn.name, ())
        static = {p for p, m in zip(fn.params, mask) if m}
        kept = ti.write_back.get(fn.name, frozenset())
        for op, p in _in_place_updates_of_params(fn):
            if p not in static and p not in kept:
                add("region-updates-input", p, op.line,
                    f"{fn.name} updates its input {p} in place: under capture the update lands in the runner's "
                    f"static copy and the caller's {p} keeps its old values",
                    "write the static copy back after replay (FixedCUDAGraphTransform does), or keep the update out of the region")
        for i, p in enumerate(fn.params):
            if uses.get(p, 0) == 0:
                add("dead-region-input", p, fn.first_line,
                    f"{fn.name} takes {p} but uses it for nothing but a del" if p in deleted
                    else f"{fn.name} takes {p} but never uses it",
                    "pass a region only the values it computes with")
            handed = {h.split(" -> ", 1)[0] for h in ti.handoffs.get(fn.name, ())}
            if ti.types.get(p, _UNKNOWN).is_scalar and p not in handed:
                add("scalar-region-input", p, fn.first_line,
                    f"{fn.name} takes the Python number {p}: each new value captures a new graph",
                    "hand the number over as a 0-d device tensor")
    else:
        defined: dict[str, int] = {}
        top_dels: set[str] = set()
        for op in fn.ops:
            if op.kind == "del":
                top_dels.update(op.inputs)
            for n in op.outputs:
                defined.setdefault(n, op.line)
        for n, line in defined.items():
            if n in params or n in returned or n in top_dels or n in ti.aliases or n == "_":
                continue  # NOTE: `_` is thunder's placeholder for a None (e.g. a missing cotangent)
            t = ti.types.get(n, _UNKNOWN)
            if not (t.kind == "tensor" or (t.kind == "other" and not t.text)):
                continue  # NOTE: numbers, collections and placeholders (`_`, typed None) hold no memory
            add("never-freed", n, line, f"{n} is never deleted at top level: it stays alive until the function returns",
                "delete it right after its last consumer")
    return out


def alias_root(groups: Iterable[Sequence[str]]) -> Callable[[str], str]:
    """A function from a name to the root of its alias group, where each of ``groups`` is one group.

    thunder passes a whole alias group to each ``update_aliases`` call (a tensor and its views), so
    every argument and result of one call is the same memory, or part of it: pass each call's names.
    """
    parent: dict[str, str] = {}

    def find(n: str) -> str:
        while parent.get(n, n) != n:
            n = parent[n]
        return n

    for names in groups:
        for n in names[1:]:
            a, b = find(names[0]), find(n)
            if a != b:
                parent[a] = b
    return find


def _in_place_updates_of_params(fn: _Fn) -> list[tuple[Op, str]]:
    """``copy_`` statements that write (through an alias or a view) into a parameter."""
    find = alias_root(
        [*op.inputs, *op.outputs] for op in fn.ops if op.callee.rsplit(".", 1)[-1] == "update_aliases"
    )
    found = []
    for op in fn.ops:
        if op.callee.rsplit(".", 1)[-1] == "copy_" and len(op.inputs) > 1:
            group = find(op.inputs[1])
            found += [(op, p) for p in fn.params if find(p) == group]
    return found


def _check_trace(ti: _TraceInput) -> list[Defect]:
    cuda = _is_cuda(ti.types)
    ti.aliases = _alias_names(([ti.top] if ti.top else []) + list(ti.regions.values()))
    out: list[Defect] = []
    if ti.top is not None:
        out += _check_fn(ti.top, ti, region=False, cuda=cuda)
    for fn in ti.regions.values():
        out += _check_fn(fn, ti, region=True, cuda=cuda)
    return out


def _island_for(op: Op, position: int, ti: _TraceInput, cuda: bool) -> Island | None:
    if op.kind in ("del", "region"):
        return None
    base = op.callee.rsplit(".", 1)[-1]
    if op.kind in ("return", "unpack") or base in BOOKKEEPING_NAMES:
        return Island(f"island{position}", position, op, "bookkeeping", base if op.kind != "unpack" else "unpack")
    if base in COLLECTION_NAMES:
        return Island(f"island{position}", position, op, "collection", ", ".join(op.inputs))
    c = _classify_stmt(op, ti, cuda)
    if c is not None:
        return Island(f"island{position}", position, op, c[0], c[1])
    if base in IN_PLACE_NAMES:
        return Island(f"island{position}", position, op, "in-place", base)
    return Island(f"island{position}", position, op, "single", base)


def _build(ti: _TraceInput) -> TraceReport:
    cuda = _is_cuda(ti.types)
    defects = tuple(_check_trace(ti))
    top = ti.top
    if top is None:  # region functions alone (source text)
        top = _Fn(ti.name, (), [], "", 0)
    regions: list[Region] = []
    islands: list[Island] = []
    # where each value lives
    defined: dict[str, tuple[Site, str]] = {}
    uses: dict[str, list[Site]] = {}
    dels: dict[str, list[Site]] = {}
    boundary: set[str] = set()
    returned: set[str] = set()

    for pos, op in enumerate(top.ops):
        site = Site(pos, None, None, op.line)
        if op.kind == "region" and op.callee in ti.regions:
            fn = ti.regions[op.callee]
            rets = next((o.inputs for o in fn.ops if o.kind == "return"), ())
            boundary.update(op.inputs)
            boundary.update(op.outputs)
            for j, inner in enumerate(fn.ops):
                isite = Site(pos, fn.name, j, inner.line)
                if inner.kind == "del":
                    for n in inner.inputs:
                        dels.setdefault(n, []).append(isite)
                elif inner.kind != "return":
                    for n in inner.inputs:
                        uses.setdefault(n, []).append(isite)
                    for n in inner.outputs:
                        defined.setdefault(n, (isite, fn.name))
            for n in op.inputs:
                uses.setdefault(n, []).append(site)
            for n in op.outputs:
                defined.setdefault(n, (site, fn.name))
            user = tuple(dict.fromkeys(o.user_line for o in fn.ops if o.user_line))
            mask = ti.static_masks.get(fn.name, tuple(False for _ in fn.params))
            regions.append(
                Region(
                    name=fn.name,
                    position=pos,
                    ops=tuple(fn.ops),
                    inputs=fn.params,
                    outputs=tuple(rets),
                    static_mask=tuple(mask),
                    source=fn.source,
                    user_lines=user,
                    captured=ti.captured.get(fn.name),
                    graphs=ti.graphs.get(fn.name, ()),
                    held_calls=ti.held_calls.get(fn.name, 0),
                    scalar_handoffs=ti.handoffs.get(fn.name, ()),
                )
            )
            continue
        if op.kind == "del":
            for n in op.inputs:
                dels.setdefault(n, []).append(site)
            continue
        isl = _island_for(op, pos, ti, cuda)
        if isl is not None:
            islands.append(isl)
        if op.kind == "return":
            returned.update(op.inputs)
        for n in op.inputs:
            uses.setdefault(n, []).append(site)
        for n in op.outputs:
            defined.setdefault(n, (site, isl.name if isl else "top"))

    # regions not called from the top level (source text of region functions alone)
    called = {r.name for r in regions}
    for name, fn in ti.regions.items():
        if name in called:
            continue
        rets = next((o.inputs for o in fn.ops if o.kind == "return"), ())
        regions.append(Region(name, -1, tuple(fn.ops), fn.params, tuple(rets), tuple(False for _ in fn.params),
                              fn.source, tuple(dict.fromkeys(o.user_line for o in fn.ops if o.user_line))))

    names = list(top.params)
    names += [n for n in defined if n not in names]
    names += [n for n in list(uses) + list(dels) if n not in names and n in ti.types]
    values = []
    for n in names:
        if n in top.params:
            d_site, d_in = None, "input"
        elif n in defined:
            d_site, d_in = defined[n]
        else:
            d_site, d_in = None, "input"
        values.append(
            Value(
                name=n,
                type=ti.types.get(n, _UNKNOWN),
                defined=d_site,
                defined_in=d_in,
                uses=tuple(uses.get(n, ())),
                dels=tuple(dels.get(n, ())),
                crosses_region_boundary=n in boundary,
                returned=n in returned,
            )
        )
    return TraceReport(
        kind=ti.kind,
        name=ti.name,
        provenance=ti.provenance,
        source=top.source,
        ops=tuple(top.ops),
        regions=tuple(regions),
        islands=tuple(islands),
        values=tuple(values),
        defects=defects,
        params=top.params,
        is_cuda=cuda,
    )


# ---------------------------------------------------------------------------------------------------
# Entry points


def analyze_source(source: str, *, kind: str = "source") -> TraceReport:
    """Build a `TraceReport` from generated source text alone.

    Functions named ``CUDAGraphN`` are regions; the first other function is the top level.
    """
    fns = parse_functions(source)
    if not fns:
        raise ValueError("no function definition in the source")
    regions = {f.name: f for f in fns if REGION_NAME.match(f.name)}
    tops = [f for f in fns if not REGION_NAME.match(f.name)]
    top = tops[0] if tops else None
    name = top.name if top else next(iter(regions))
    ti = _TraceInput(kind, name, "", top, regions, comment_types(source))
    return _build(ti)


def _region_source(runner: Any, name: str) -> str:
    fn, _ = runner.python_callables[name]
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        # NOTE: the runner's callable normally has its source in linecache; rebuild it if not
        from thunder.core.trace import TraceCtx

        bsyms, inputs, outputs = runner.trace_symbols[name]
        t = TraceCtx()
        t.bound_symbols = list(bsyms)
        return t.python(include_decorators=False)


def _gather_types(bsyms: Iterable[Any], types: dict[str, TypeInfo]) -> None:
    from thunder.core.proxies import Proxy

    for b in bsyms:
        for p in list(b.flat_proxy_args) + list(b.flat_proxy_outs):
            if isinstance(p, Proxy) and p.name not in types:
                types[p.name] = type_of_proxy(p)
        if b.subsymbols:
            _gather_types(b.subsymbols, types)


def _sync_outputs(bsyms: Iterable[Any]) -> set[str]:
    from thunder.core.prims import OpTags
    from thunder.core.symbol import has_tags

    out: set[str] = set()
    for b in bsyms:
        if getattr(b.sym, "is_fusion", False):
            out |= _sync_outputs(b.subsymbols)
            continue
        try:
            if has_tags(b, {OpTags.DEVICE_SYNC_OP}):
                out.update(p.name for p in b.flat_proxy_outs)
        except Exception:
            pass
    return out


def analyze_trace(trace: Any, *, kind: str | None = None) -> TraceReport:
    """Build a `TraceReport` from one thunder trace (fused by a CUDA-graph transform or not)."""
    from thunder.core.proxies import Proxy

    source = trace.python()
    fns = parse_functions(source)
    top = next((f for f in fns if not REGION_NAME.match(f.name)), None)
    regions: dict[str, _Fn] = {}
    masks: dict[str, tuple[bool, ...]] = {}
    graphs: dict[str, tuple[GraphRecord, ...]] = {}
    captured: dict[str, bool | None] = {}
    held: dict[str, int] = {}
    handoffs: dict[str, tuple[str, ...]] = {}
    write_back: dict[str, frozenset[str]] = {}
    types: dict[str, TypeInfo] = {}
    for a in trace.args:
        if isinstance(a, Proxy):
            types[a.name] = type_of_proxy(a)
    _gather_types(trace.bound_symbols, types)
    for b in trace.bound_symbols:
        if not (getattr(b.sym, "is_fusion", False) and REGION_NAME.match(b.sym.name)):
            continue
        runner = getattr(b.sym.executor, "cuda_graph_runner", None)
        if runner is None or b.sym.name not in runner.python_callables:
            continue
        rsrc = _region_source(runner, b.sym.name)
        rfns = [f for f in parse_functions(rsrc) if f.name == b.sym.name]
        if rfns:
            regions[b.sym.name] = rfns[0]
        masks[b.sym.name] = tuple(runner.python_callables[b.sym.name][1] or ())
        stats = getattr(runner, "region_stats", None)
        if callable(stats):
            s = stats(b.sym.name)
            graphs[b.sym.name] = s.get("graphs", ())
            captured[b.sym.name] = s.get("captured")
            held[b.sym.name] = s.get("held_calls", 0)
        wb = getattr(runner, "write_back", {}).get(b.sym.name, ())
        if wb:
            names = runner.trace_symbols[b.sym.name][1]
            write_back[b.sym.name] = frozenset(names[i].name for i in wb)
        hand = getattr(b.sym.executor, "scalar_handoffs", {})
        if b.sym.name in hand:
            handoffs[b.sym.name] = tuple(hand[b.sym.name])
    for name, t in comment_types(source).items():
        types.setdefault(name, t)
    if kind is None:
        kind = "backward" if trace.siginfo().name == "backward_fn" else "forward"
    prov = trace.get_provenance()
    prov_text = prov.pss if prov is not None and hasattr(prov, "pss") else (str(prov) if prov else "")
    ti = _TraceInput(
        kind,
        top.name if top else trace.siginfo().name,
        prov_text.replace("# Constructed by ", "").strip(),
        top,
        regions,
        types,
        masks,
        frozenset(_sync_outputs(trace.bound_symbols)),
        graphs,
        captured,
        handoffs,
        write_back=write_back,
        held_calls=held,
    )
    return _build(ti)


def _transform_label(jfn: Any) -> str:
    import thunder

    from thunder.transforms.cudagraph import CUDAGraphTransform

    for t in thunder.compile_data(jfn).transforms or ():
        if isinstance(t, CUDAGraphTransform):
            return getattr(t, "label", "stock" if type(t) is CUDAGraphTransform else type(t).__name__)
    return "none"


def analyze(jfn: Any, *, error: BaseException | str | None = None) -> Report:
    """Build the `Report` of a ``thunder.jit`` function after a call.

    A failed call still leaves traces; pass the exception as ``error`` to keep it in the report.

    Raises:
        ValueError: the function has not been traced yet (call it first).
    """
    import thunder

    try:
        fwd = thunder.last_traces(jfn)
    except TypeError as e:
        if "called yet" in str(e):
            fwd = []
        else:
            raise ValueError(f"analyze() takes a function compiled with thunder.jit: {e}") from None
    if not fwd:
        raise ValueError("the function has no traces yet: call it once before analyze()")
    bwd = thunder.last_backward_traces(jfn) or []
    cd = thunder.compile_data(jfn)
    fn = getattr(cd, "fn", None)
    fname = getattr(fn, "__name__", type(fn).__name__ if fn is not None else "function")
    if isinstance(error, BaseException):
        error = f"{type(error).__name__}: {error}".strip().rstrip(":")
    notes = []
    if bwd and not any("CUDAGraph" in str(t.get_provenance()) for t in bwd) and _transform_label(jfn) != "none":
        notes.append("the backward trace was not fused (the transform failed on it)")
    for t in cd.transforms or ():
        notes.extend(dict.fromkeys(getattr(t, "notes", ())))
        for number, why in getattr(t, "handoff_refusals", {}).items():
            notes.append(f"{number} stays a Python number: {why}")
    return Report(
        function=fname,
        transform=_transform_label(jfn),
        forward=analyze_trace(fwd[-1], kind="forward"),
        backward=analyze_trace(bwd[-1], kind="backward") if bwd else None,
        error=error,
        notes=tuple(notes),
    )


def check(x: Any) -> list[Defect]:
    """Find the defects of the #728/#727 family in a `Report`, a thunder trace, or generated source.

    Returns:
        The defects, in trace order (top level first, then each region).
    """
    if isinstance(x, Report):
        return list(x.defects)
    if isinstance(x, TraceReport):
        return list(x.defects)
    if isinstance(x, str):
        return list(analyze_source(x).defects)
    if hasattr(x, "bound_symbols") and hasattr(x, "python"):
        return list(analyze_trace(x).defects)
    raise TypeError(f"check() takes a Report, a thunder trace or source text, not {type(x).__name__}")
