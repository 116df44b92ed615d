"""Build the model (`Report`) from thunder traces, the transform's plans and the runner's stats, or from source."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .checker import UNKNOWN, TraceFacts, check_trace, classify_statement, is_cuda
from .model import Defect, FusedGroup, Op, Outside, Region, Report, Site, TraceReport, TypeInfo, Value, outside_name
from .ops import (
    BOOKKEEPING_NAMES, COLLECTION_NAMES, METADATA_NAMES, VIEW_NAMES, base_name, capture_hazard,
    classify_bsym, classify_op, parse_type, type_of_proxy,
)
from .plans import HAND_OUT_NAME, RegionStats
from .source import REGION_NAME, ParsedFunction, comment_types, parse_functions


__all__ = [
    "analyze",
    "analyze_trace",
    "analyze_source",
    "check",
    "estimate_kernels",
    "classify_op",
    "classify_bsym",
    "parse_type",
    "REGION_NAME",
]


#: View-like ops that copy when they change the dtype or device (``to``, ``float``, ``type_as``).
_CONVERSIONS = frozenset({"to", "float", "type_as"})
#: Ops that launch no kernel: views (``contiguous`` aside: it may copy), metadata reads, bookkeeping, aliasing.
_NO_KERNEL = (
    (VIEW_NAMES - _CONVERSIONS - {"contiguous"}) | METADATA_NAMES | BOOKKEEPING_NAMES | COLLECTION_NAMES
    | {"update_aliases", "del", "python_del"}
)
#: Fusion symbols by name, for source text (a live trace says so itself: ``sym.is_fusion``).
_FUSION_NAME = re.compile(r"^(?:TorchCompile|nvFusion)\d+$")


def estimate_kernels(ops: Iterable[Op], types: Mapping[str, TypeInfo],
                     fusions: Mapping[str, FusedGroup] | None = None) -> int:
    """Estimate the kernels one run of ``ops`` (a region's statements) launches: a static count, never measured.

    Each call that launches work counts 1; these count 0: dels, the return and unpacking, views
    (`thunder_nb.diagnosis.ops.VIEW_NAMES`), metadata reads (``METADATA_NAMES``), thunder's ``update_aliases``,
    arithmetic on Python numbers alone (no tensor in or out), and ``to``/``float``/``type_as`` when the
    dtype and device stay the same. A fusion symbol counts as its `FusedGroup.kernels`: the kernels inductor
    generated for it (thunder-nb's torchcompile executor notes them when it compiles), or 1 when no count is
    known (nvFuser, thunder's own executor): then the total is a lower bound (`Region.undecided`). So ``≈``: an
    op like ``cross_entropy`` launches several kernels and counts 1, and a fusion's matmuls (library calls) are
    not among inductor's generated kernels.

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
            kernels += fusions[base].kernels or 1
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


def _fused_group(bsym: Any) -> FusedGroup:
    """The `FusedGroup` of a fusion bound symbol: its name, executor and fused ops."""
    from ..cudagraph.executors import KERNELS_ATTRIBUTE

    ops = tuple(b.sym.name for b in bsym.subsymbols if base_name(b.sym.name) not in BOOKKEEPING_NAMES)
    fn = (getattr(bsym, "_call_ctx", None) or {}).get(bsym.sym.name)
    return FusedGroup(bsym.sym.name, _executor_label(getattr(bsym.sym.executor, "name", "") or ""), ops,
                      getattr(fn, KERNELS_ATTRIBUTE, None))


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


def _build(facts: TraceFacts, fusions: Mapping[str, tuple[FusedGroup, ...]] | None = None) -> TraceReport:
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
    facts = TraceFacts(kind, name, "", top, regions, comment_types(source))
    return _build(facts)


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


def _hazards(bsyms: Iterable[Any], out: dict[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
    """Output name -> `capture_hazard` for every symbol in ``bsyms`` (inside regions too) that has one."""
    for b in bsyms:
        if getattr(b.sym, "is_fusion", False):
            _hazards(b.subsymbols, out)
            continue
        hazard = capture_hazard(b)
        if hazard is not None:
            out.update((p.name, hazard) for p in b.flat_proxy_outs)
    return out


def _argument_names(prologue: Any) -> frozenset[str]:
    """Names a prologue trace takes from the call's arguments, through any unpacking (not from globals,
    closures or a jitted module's own tensors): the computation inputs a call can fill with another tensor."""
    from thunder.core.prims import PrimIDs

    roots = {p.name for b in prologue.bound_symbols if b.sym.id == PrimIDs.UNPACK_TRIVIAL for p in b.flat_proxy_outs}
    derived = set(roots)
    for b in prologue.bound_symbols:
        if any(getattr(p, "name", None) in derived for p in b.flat_proxy_args):
            derived.update(p.name for p in b.flat_proxy_outs)
    return frozenset(derived - roots)


# NOTE: thunder's ``x = obj.get_parameter('h.0.ln_1.weight')`` and thunder-nb's fast prologue's
# ``x = thunder_nb_get_parameter(obj, m, 'weight', 'h.0.ln_1.weight')``: the path is the call's last string
_GET_PARAMETER = re.compile(r"^\s*(\w+)(?::[^=\n]*)? = [\w.]*get_(?:parameter|buffer)\([^\n]*'([^'\n]+)'\)", re.M)


def _parameter_paths(prologues: Iterable[Any]) -> dict[str, str]:
    """Name -> dotted path of each module parameter or buffer a prologue fetches (``get_parameter('h.0.ln_1.weight')``)."""
    paths: dict[str, str] = {}
    for prologue in prologues:
        try:
            source = prologue.python()
        except Exception:  # NOTE: only a grouping aid for the diagrams: a prologue that does not print gives none
            continue
        for m in _GET_PARAMETER.finditer(source):
            paths.setdefault(m.group(1), m.group(2))
    return paths


def analyze_trace(trace: Any, *, kind: str | None = None, arguments: frozenset[str] | None = None) -> TraceReport:
    """Build a `TraceReport` from one thunder trace (fused by a CUDA-graph transform or not).

    ``arguments``: the computation inputs that come from the call's arguments (`_argument_names`), if known.
    """
    from thunder.core.proxies import Proxy

    from .. import internals
    from ..cudagraph.passes import returned_names

    source = trace.python()
    fns = parse_functions(source)
    top = next((f for f in fns if not REGION_NAME.match(f.name)), None)
    if kind is None:
        kind = "backward" if trace.siginfo().name == "backward_fn" else "forward"
    facts = TraceFacts(kind, top.name if top else trace.siginfo().name, _provenance(trace), top, {}, {})
    facts.arguments = arguments
    for a in trace.args:
        if isinstance(a, Proxy):
            facts.types[a.name] = type_of_proxy(a)
    _gather_types(trace.bound_symbols, facts.types)
    transform = None
    fusions: dict[str, tuple[FusedGroup, ...]] = {}
    for b in trace.bound_symbols:
        if not (getattr(b.sym, "is_fusion", False) and REGION_NAME.match(b.sym.name)):
            continue
        fusions[b.sym.name] = tuple(_fused_group(s) for s in b.subsymbols if getattr(s.sym, "is_fusion", False))
        transform = b.sym.executor
        runner = getattr(transform, "cuda_graph_runner", None)
        if runner is None or b.sym.name not in runner.python_callables:
            continue
        rfns = [f for f in parse_functions(_region_source(runner, b.sym.name)) if f.name == b.sym.name]
        if rfns:
            facts.regions[b.sym.name] = rfns[0]
        facts.static_masks[b.sym.name] = tuple(runner.python_callables[b.sym.name][1] or ())
        if hasattr(runner, "region_stats"):
            facts.stats[b.sym.name] = runner.region_stats(b.sym.name)
        if b.sym.name in getattr(runner, "plans", {}):
            facts.plans[b.sym.name] = runner.plans[b.sym.name]
    for name, t in comment_types(source).items():
        facts.types.setdefault(name, t)
    facts.sync_outputs = frozenset(_sync_outputs(trace.bound_symbols))
    facts.hazards = _hazards(trace.bound_symbols, {})
    facts.hand_out = getattr(transform, "hand_outs", {}).get(kind) if transform is not None else None
    runner = getattr(transform, "cuda_graph_runner", None)
    if hasattr(runner, "hand_out_stats"):
        facts.hand_out_stats = runner.hand_out_stats(kind)
    facts.returned = frozenset(returned_names(trace))
    facts.saved = frozenset(p.name for p in internals.saved_for_backward(trace) if isinstance(p, Proxy))
    return _build(facts, fusions)


def _provenance(trace: Any) -> str:
    prov = trace.get_provenance()
    text = prov.pss if prov is not None and hasattr(prov, "pss") else (str(prov) if prov else "")
    return text.replace("# Constructed by ", "").strip()


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

    from .. import internals

    try:
        cd = thunder.compile_data(jfn)
    except Exception:
        cd = None
    if cd is None:
        raise ValueError(f"analyze() takes a function compiled with thunder.jit, not a {type(jfn).__name__}")
    if not internals.has_traces(jfn):
        raise ValueError("the function has no traces yet: call it once before analyze()")
    fwd = thunder.last_traces(jfn)
    bwd = thunder.last_backward_traces(jfn) or []
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
    prologues = thunder.last_prologue_traces(jfn)
    arguments = _argument_names(prologues[-1]) if prologues else None
    paths = _parameter_paths(prologues or ())

    def with_paths(t: TraceReport) -> TraceReport:
        names = {v.name for v in t.values}
        return replace(t, parameters=tuple((n, p) for n, p in paths.items() if n in names))

    return Report(
        function=fname,
        transform=_transform_label(jfn),
        forward=with_paths(analyze_trace(fwd[-1], kind="forward", arguments=arguments)),
        backward=with_paths(analyze_trace(bwd[-1], kind="backward", arguments=arguments)) if bwd else None,
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
