"""Build the model (`Report`) from thunder traces, the transform's plans and the runner's stats, or from source."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from .build import build, estimate_kernels, fused_group
from .checker import TraceFacts
from .model import Defect, FusedGroup, Report, TraceReport, TypeInfo
from .ops import capture_hazard, classify_bsym, classify_op, parse_type, type_of_proxy
from .protocols import GraphRunner, GraphTransform, PlanningTransform, RecordingRunner
from .source import REGION_NAME, comment_types, parse_functions


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
    return build(facts)


def _region_source(runner: GraphRunner, name: str) -> str:
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


# NOTE: thunder's ``x = obj.get_parameter('h.0.ln_1.weight')``: the path is the call's last string (thunder-nb's fast
# prologue fetches them all in one call, whose object names the paths: `_parameter_paths`)
_GET_PARAMETER = re.compile(r"^\s*(\w+)(?::[^=\n]*)? = [\w.]*get_(?:parameter|buffer)\([^\n]*'([^'\n]+)'\)", re.M)


def _parameter_paths(prologues: Iterable[Any]) -> dict[str, str]:
    """Name -> dotted path of each module parameter or buffer a prologue fetches
    (``get_parameter('h.0.ln_1.weight')``)."""
    paths: dict[str, str] = {}
    for prologue in prologues:
        try:
            source = prologue.python()
        except Exception:  # NOTE: only a grouping aid for the diagrams: a prologue that does not print gives none
            continue
        for m in _GET_PARAMETER.finditer(source):
            paths.setdefault(m.group(1), m.group(2))
        for b in prologue.bound_symbols:
            # NOTE: thunder-nb's ``(m4, ..., t3) = thunder_nb_module_walk(obj)``: the walk names each output's
            # (kind, path) in ``lookup_targets``
            targets = getattr(getattr(b.sym, "python_impl", None), "lookup_targets", None)
            if isinstance(targets, tuple) and isinstance(b.output, tuple):
                for out, (kind, target) in zip(b.output, targets):
                    if kind != "submodule" and hasattr(out, "name"):
                        paths.setdefault(out.name, target)
    return paths


def _has_graph_regions(trace: Any) -> bool:
    """Whether a CUDA-graph transform fused regions into ``trace``: a fusion symbol whose executor is one."""
    return any(getattr(b.sym, "is_fusion", False) and isinstance(getattr(b.sym, "executor", None), GraphTransform)
               for b in trace.bound_symbols)


def analyze_trace(trace: Any, *, kind: str | None = None, arguments: frozenset[str] | None = None) -> TraceReport:
    """Build a `TraceReport` from one thunder trace (fused by a CUDA-graph transform or not).

    ``arguments``: the computation inputs that come from the call's arguments (`_argument_names`), if known.
    """
    from thunder.core.proxies import Proxy

    from .. import internals
    from .ops import returned_names

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
    transform: GraphTransform | None = None
    fusions: dict[str, tuple[FusedGroup, ...]] = {}
    for b in trace.bound_symbols:
        if not (getattr(b.sym, "is_fusion", False) and REGION_NAME.match(b.sym.name)):
            continue
        fusions[b.sym.name] = tuple(fused_group(s) for s in b.subsymbols if getattr(s.sym, "is_fusion", False))
        if not isinstance(b.sym.executor, GraphTransform):
            continue
        transform = b.sym.executor
        runner = transform.cuda_graph_runner
        if b.sym.name not in runner.python_callables:
            continue
        rfns = [f for f in parse_functions(_region_source(runner, b.sym.name)) if f.name == b.sym.name]
        if rfns:
            facts.regions[b.sym.name] = rfns[0]
        facts.static_masks[b.sym.name] = tuple(runner.python_callables[b.sym.name][1] or ())
        if isinstance(runner, RecordingRunner):
            facts.stats[b.sym.name] = runner.region_stats(b.sym.name)
            if b.sym.name in runner.plans:
                facts.plans[b.sym.name] = runner.plans[b.sym.name]
    for name, t in comment_types(source).items():
        facts.types.setdefault(name, t)
    facts.sync_outputs = frozenset(_sync_outputs(trace.bound_symbols))
    facts.hazards = _hazards(trace.bound_symbols, {})
    if isinstance(transform, PlanningTransform):
        facts.hand_out = transform.hand_outs.get(kind)
    if transform is not None and isinstance(transform.cuda_graph_runner, RecordingRunner):
        facts.hand_out_stats = transform.cuda_graph_runner.hand_out_stats(kind)
    facts.returned = frozenset(returned_names(trace))
    facts.saved = frozenset(p.name for p in internals.saved_for_backward(trace) if isinstance(p, Proxy))
    return build(facts, fusions)


def _provenance(trace: Any) -> str:
    prov = trace.get_provenance()
    text = prov.pss if prov is not None and hasattr(prov, "pss") else (str(prov) if prov else "")
    return text.replace("# Constructed by ", "").strip()


def _transform_label(jfn: Any) -> str:
    import thunder

    from thunder.transforms.cudagraph import CUDAGraphTransform

    for t in thunder.compile_data(jfn).transforms or ():
        if isinstance(t, CUDAGraphTransform):
            if isinstance(t, PlanningTransform):
                return t.label
            return "stock" if type(t) is CUDAGraphTransform else type(t).__name__
    return "none"


def analyze(jfn: Any, *, error: BaseException | str | None = None) -> Report:
    """Build the `Report` of a ``thunder.jit`` function after a call.

    A failed call still leaves traces; pass the exception as ``error`` to keep it in the report.

    Raises:
        ValueError: the function has not been traced yet (call it first).
    """
    import thunder

    from .. import internals

    internals.check_versions()
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
    if bwd and not any(map(_has_graph_regions, bwd)) and _transform_label(jfn) != "none":
        notes.append("the backward trace has no regions (the transform failed on it)")
    for t in cd.transforms or ():
        if not isinstance(t, PlanningTransform):
            continue
        notes.extend(dict.fromkeys(t.notes))
        for number, why in t.handoff_refusals.items():
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
