"""A `TraceReport` built from the parsed statements of a trace and its facts: regions with their kernel estimates and
fused groups, what runs outside them, and each value's lifetime (`analysis` gathers the facts from thunder)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import internals
from .checker import UNKNOWN, TraceFacts, check_trace, classify_statement, is_cuda
from .model import FusedGroup, Op, Outside, Region, Site, TraceReport, TypeInfo, Value
from .rules import outside_name
from .ops import BOOKKEEPING_NAMES, COLLECTION_NAMES, METADATA_NAMES, VIEW_NAMES, base_name
from .plans import HAND_OUT_NAME, RegionStats
from .source import ParsedFunction

__all__ = [
    "LIBRARY_NAMES",
    "estimate_kernels",
    "group_kernels",
    "library_calls",
    "build",
    "fused_group",
]


#: View-like ops that copy when they change the dtype or device (``to``, ``float``, ``type_as``).
_CONVERSIONS = frozenset({"to", "float", "type_as"})
#: Ops that launch no kernel: views (``contiguous`` aside: it may copy), metadata reads, bookkeeping, aliasing.
_NO_KERNEL = (
    (VIEW_NAMES - _CONVERSIONS - {"contiguous"}) | METADATA_NAMES | BOOKKEEPING_NAMES | COLLECTION_NAMES
    | {"update_aliases", "del", "python_del"}
    # NOTE: thunder's torch executor's names for its prims: shallow_copy is an alias, reshape a view where the strides
    # allow (on a contiguous tensor, as in a trace's reshapes nearly always)
    | {"shallow_copy", "torch_prims_reshape_impl"}
)
#: Fusion symbols by name, for source text (a live trace says so itself: ``sym.is_fusion``).
_FUSION_NAME = re.compile(r"^(?:TorchCompile|nvFusion)\d+$")
#: thunder's names of the ops inductor hands to a library instead of generating a kernel for them (its extern kernels:
#: matmuls to cuBLAS, convolutions to cuDNN, attention to torch's flash or efficient kernels), by default: without
#: ``max_autotune``, which may choose a generated template instead. Each is one library call (`library_calls`).
LIBRARY_NAMES = frozenset({
    "linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm",
    "convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "convolution_backward",
    "scaled_dot_product_attention", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention_backward", "_scaled_dot_product_cudnn_attention_backward",
})
#: Of `LIBRARY_NAMES`, those whose vector forms (``dot``, ``mv``) inductor decomposes into arithmetic it generates.
_MATRIX_OPERANDS = frozenset({"linear", "matmul"})


def estimate_kernels(ops: Iterable[Op], types: Mapping[str, TypeInfo],
                     fusions: Mapping[str, FusedGroup] | None = None) -> int:
    """Estimate the kernels one run of ``ops`` (a region's statements) launches: a static count, never measured.

    Each call that launches work counts 1; these count 0: dels, the return and unpacking, views
    (`thunder_nb.diagnosis.ops.VIEW_NAMES`), metadata reads (``METADATA_NAMES``), thunder's ``update_aliases``,
    arithmetic on Python numbers alone (no tensor in or out), and ``to``/``float``/``type_as`` when the
    dtype and device stay the same. A fusion symbol counts as `group_kernels`: the kernels inductor generated for it
    (thunder-nb's torchcompile executor notes them when it compiles) and 1 per library call among its ops
    (`library_calls`: matmuls, convolutions, attention, which inductor does not generate), or 1 when no count is
    known (nvFuser, thunder's own executor; `Region.undecided`). So ``≈``, never a bound: an op like
    ``cross_entropy`` launches several kernels and counts 1, a ``reshape`` of a strided tensor copies and counts 0,
    and a library call may launch more than one kernel.

    Args:
        ops: the statements (`Region.ops`).
        types: the trace's value types by name (numbers and tensors told apart by them).
        fusions: the fusion symbols among ``ops``, by name.
    """
    fusions = fusions or {}
    kernels = 0
    for op in ops:
        if op.kind != "call":
            continue
        base = base_name(op.callee)
        if base in fusions:
            kernels += group_kernels(fusions[base])
            continue
        if base in _NO_KERNEL:
            continue
        names = op.inputs + op.outputs
        if names and all(n in types and types[n].kind == "number" for n in names):
            continue  # NOTE: Python arithmetic on numbers runs on the host
        tensors_in = [types[n] for n in op.inputs if n in types and types[n].kind == "tensor"]
        tensors_out = [types[n] for n in op.outputs if n in types and types[n].kind == "tensor"]
        if base in _CONVERSIONS and tensors_in and tensors_out and all(
            (t.dtype, t.device) == (tensors_in[0].dtype, tensors_in[0].device) for t in tensors_out
        ):
            continue
        kernels += 1
    return kernels


def _executor_label(name: str) -> str:
    """``inductor`` for thunder's (and thunder-nb's) torch_compile executors, ``nvFuser``, else the executor's name."""
    if "torchcompile" in name or "torch_compile" in name:
        return "inductor"
    return "nvFuser" if "nvfuser" in name else name


def group_kernels(group: FusedGroup) -> int:
    """≈ kernels one run of a fused group launches: inductor's generated kernels and its library calls, or 1 when the
    executor decides (no count known: `Region.undecided`)."""
    return 1 if group.kernels is None else group.kernels + len(library_calls(group))


def library_calls(group: FusedGroup) -> tuple[str, ...]:
    """The names of a fused group's ops that inductor hands to a library (`LIBRARY_NAMES`; each one call), in order.

    As read from the live trace where the group comes from one (`FusedGroup.library`: a matmul of a vector is
    inductor's own arithmetic), else from its ops' names; none for another executor's group (nvFuser may generate its
    matmuls).
    """
    if group.executor != "inductor":
        return ()
    if group.library is not None:
        return group.library
    return tuple(n for n in group.ops if base_name(n) in LIBRARY_NAMES)


def _is_library_call(bsym: Any) -> bool:
    """Whether inductor hands this fused op to a library: a name of `LIBRARY_NAMES`, with matrices where it matters."""
    name = base_name(bsym.sym.name)
    if name not in LIBRARY_NAMES:
        return False
    if name in _MATRIX_OPERANDS:
        return all(getattr(p, "ndim", 2) >= 2 for p in bsym.flat_proxy_args[:2])
    return True


#: The callee of a statement as thunder prints it: ``t5 = ltorch.linear(...)``, ``[t6, t7] = prims.var_mean(...)``.
_CALLEE = re.compile(r"^\s*(?:[^=(]+=\s*)?([\w.]+)\(")


def _names(proxies: Iterable[Any]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(p.name for p in proxies))


def _statement(bsym: Any, line: int) -> Op:
    """A fused op as a statement: its inputs and outputs are its proxies (thunder's names), its callee as printed.

    Read from the symbol, not parsed: thunder prints some arguments as no Python (``(object of type
    torch_memory_format)``).
    """
    try:
        text = next((t for t in bsym.python(indent=0, print_depth=1) if not t.lstrip().startswith("#")), "")
    except Exception:  # NOTE: a grouping aid for the views: a symbol that does not print keeps its name
        text = ""
    text = text.split("  # ")[0].strip()  # NOTE: without the type comment, as `source.parse_functions` leaves it
    m = _CALLEE.match(text)
    return Op("call", m.group(1) if m else bsym.sym.name, _names(bsym.flat_proxy_outs), _names(bsym.flat_proxy_args),
              line, text or bsym.sym.name)


def fused_group(bsym: Any) -> FusedGroup:
    """The `FusedGroup` of a fusion bound symbol: its name, executor, fused ops (names and statements), inductor's
    count of its kernels and its library calls."""
    from .plans import KERNELS_ATTRIBUTE

    fused = [b for b in bsym.subsymbols if base_name(b.sym.name) not in BOOKKEEPING_NAMES]
    fn = internals.fusion_callable(bsym)
    return FusedGroup(bsym.sym.name, _executor_label(getattr(bsym.sym.executor, "name", "") or ""),
                      tuple(b.sym.name for b in fused), getattr(fn, KERNELS_ATTRIBUTE, None),
                      statements=tuple(_statement(b, k) for k, b in enumerate(fused, start=1)),
                      library=tuple(b.sym.name for b in fused if _is_library_call(b)))


def _named_fusions(fn: ParsedFunction) -> tuple[FusedGroup, ...]:
    """The fusion calls of a region function known from its source alone (their ops are not in it)."""
    names = dict.fromkeys(base_name(o.callee) for o in fn.ops if o.kind == "call")
    return tuple(FusedGroup(n, "inductor" if n.startswith("TorchCompile") else "nvFuser", ())
                 for n in names if _FUSION_NAME.match(n))


def _outside_for(op: Op, position: int, facts: TraceFacts, cuda: bool) -> Outside | None:
    """What a top-level statement outside every region is: an island (capture cannot take it), bookkeeping, the
    hand-out, or an unfused op; None for a del or a region call."""
    if op.kind in ("del", "region"):
        return None

    def made(reason: str, detail: str) -> Outside:
        return Outside(outside_name(reason, position), position, op, reason, detail)

    base = op.callee.rsplit(".", 1)[-1]
    if base == HAND_OUT_NAME:
        return made("hand-out", f"{len(op.inputs)} tensors")
    if op.kind in ("return", "unpack") or base in BOOKKEEPING_NAMES:
        return made("bookkeeping", base if op.kind != "unpack" else "unpack")
    if base in COLLECTION_NAMES:
        return made("collection", ", ".join(op.inputs))
    c = classify_statement(op, facts, cuda)
    if c is not None:
        return made(c[0], c[1])
    return made("unfused", base)


@dataclass(slots=True)
class _Lifetimes:
    """Where each value is defined, used and deleted, as the statements are walked."""

    defined: dict[str, tuple[Site, str]] = field(default_factory=dict)
    uses: dict[str, list[Site]] = field(default_factory=dict)
    dels: dict[str, list[Site]] = field(default_factory=dict)
    boundary: set[str] = field(default_factory=set)
    returned: set[str] = field(default_factory=set)

    def use(self, names, site: Site) -> None:
        for n in names:
            self.uses.setdefault(n, []).append(site)

    def delete(self, names, site: Site) -> None:
        for n in names:
            self.dels.setdefault(n, []).append(site)

    def define(self, names, site: Site, where: str) -> None:
        for n in names:
            self.defined.setdefault(n, (site, where))


def _region(facts: TraceFacts, op: Op, pos: int, life: _Lifetimes, fusions: tuple[FusedGroup, ...]) -> Region:
    """The `Region` a top-level call of a region function makes, its statements' lifetimes recorded."""
    fn = facts.regions[op.callee]
    life.boundary.update(op.inputs)
    life.boundary.update(op.outputs)
    for j, inner in enumerate(fn.ops):
        isite = Site(pos, fn.name, j, inner.line)
        if inner.kind == "del":
            life.delete(inner.inputs, isite)
        elif inner.kind != "return":
            life.use(inner.inputs, isite)
            life.define(inner.outputs, isite, fn.name)
    site = Site(pos, None, None, op.line)
    life.use(op.inputs, site)
    life.define(op.outputs, site, fn.name)
    return Region(
        name=fn.name,
        position=pos,
        ops=tuple(fn.ops),
        inputs=fn.params,
        outputs=tuple(next((o.inputs for o in fn.ops if o.kind == "return"), ())),
        static_mask=tuple(facts.static_masks.get(fn.name, tuple(False for _ in fn.params))),
        source=fn.source,
        user_lines=tuple(dict.fromkeys(o.user_line for o in fn.ops if o.user_line)),
        plan=facts.plans.get(fn.name),
        stats=facts.stats.get(fn.name, RegionStats()),
        kernels=estimate_kernels(fn.ops, facts.types, {g.name: g for g in fusions}),
        fusions=fusions,
    )


def build(facts: TraceFacts, fusions: Mapping[str, tuple[FusedGroup, ...]] | None = None) -> TraceReport:
    """The `TraceReport` of a trace; ``fusions``: each region's fusion symbols (None: known by name only)."""
    def fused(fn: ParsedFunction) -> tuple[FusedGroup, ...]:
        return fusions.get(fn.name, ()) if fusions is not None else _named_fusions(fn)

    cuda = is_cuda(facts.types)
    defects = tuple(check_trace(facts))
    top = facts.top
    if top is None:  # region functions alone (source text)
        top = ParsedFunction(facts.name, (), [], "", 0)
    regions: list[Region] = []
    outside: list[Outside] = []
    life = _Lifetimes()
    for pos, op in enumerate(top.ops):
        site = Site(pos, None, None, op.line)
        if op.kind == "region" and op.callee in facts.regions:
            regions.append(_region(facts, op, pos, life, fused(facts.regions[op.callee])))
        elif op.kind == "del":
            life.delete(op.inputs, site)
        else:
            isl = _outside_for(op, pos, facts, cuda)
            if isl is not None:
                outside.append(isl)
            if op.kind == "return":
                life.returned.update(op.inputs)
            life.use(op.inputs, site)
            life.define(op.outputs, site, isl.name if isl else "top")
    called = {r.name for r in regions}
    regions += [_uncalled_region(fn, facts.types, fused(fn)) for name, fn in facts.regions.items() if name not in called]
    return TraceReport(
        kind=facts.kind,
        name=facts.name,
        provenance=facts.provenance,
        source=top.source,
        ops=tuple(top.ops),
        regions=tuple(regions),
        outside=tuple(outside),
        values=_values(top.params, facts, life),
        defects=defects,
        params=top.params,
        is_cuda=cuda,
        hand_out=facts.hand_out,
        hand_out_stats=facts.hand_out_stats,
    )


def _uncalled_region(fn: ParsedFunction, types: Mapping[str, TypeInfo], fusions: tuple[FusedGroup, ...]) -> Region:
    """A region function that no top-level statement calls (source text of region functions alone)."""
    rets = next((o.inputs for o in fn.ops if o.kind == "return"), ())
    return Region(fn.name, -1, tuple(fn.ops), fn.params, tuple(rets), tuple(False for _ in fn.params),
                  fn.source, tuple(dict.fromkeys(o.user_line for o in fn.ops if o.user_line)),
                  kernels=estimate_kernels(fn.ops, types, {g.name: g for g in fusions}), fusions=fusions)


def _values(params: tuple[str, ...], facts: TraceFacts, life: _Lifetimes) -> tuple[Value, ...]:
    """Every value of the trace, inputs first, then in order of definition, then names only used or deleted."""
    names = list(params)
    names += [n for n in life.defined if n not in names]
    names += [n for n in list(life.uses) + list(life.dels) if n not in names and n in facts.types]
    values = []
    for n in names:
        site, where = life.defined[n] if n in life.defined and n not in params else (None, "input")
        values.append(
            Value(
                name=n,
                type=facts.types.get(n, UNKNOWN),
                defined=site,
                defined_in=where,
                uses=tuple(life.uses.get(n, ())),
                dels=tuple(life.dels.get(n, ())),
                crosses_region_boundary=n in life.boundary,
                returned=n in life.returned,
            )
        )
    return tuple(values)
