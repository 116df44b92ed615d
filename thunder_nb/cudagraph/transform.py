"""What thunder-nb's two CUDA-graph transforms share (`RegionTransform`): fusing a trace's regions into graphs that
`thunder_nb.cudagraph.runner.ThunderNBRunner` runs, each region's plan (`thunder_nb.diagnosis.plans`), and the
hand-out of what leaves them. `thunder_nb.fix` holds the transforms themselves and `jit`."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

import torch
from thunder.core import prims, utils
from thunder.core.proxies import NumberProxy, Proxy, ProxyTag, TensorProxy
from thunder.core.pytree import tree_flatten
from thunder.core.symbol import BoundSymbol, Symbol
from thunder.core.trace import TraceCtx, TraceProvenance, from_trace, reset_tracectx, set_tracectx
from thunder.executors.data_dependent_partition import Node, consecutive_fusion, dataflow_fusion
from thunder.executors.utils import Region
from thunder.transforms.cudagraph import CUDAGraphTransform

from .. import internals
from ..diagnosis.ops import returned_names
from ..diagnosis.plans import HandOutPlan, InputPlan, OutputPlan, RegionPlan, ScalarHandoff
from .capture import Capture, only, parse_capture, resolve
from .handout import insert_hand_out
from .passes import has_in_place, in_place_plan, is_cuda_trace
from .runner import RunnerOptions, ThunderNBRunner

__all__ = ["RegionTransform", "check_capture", "RUNNER_DEFAULTS", "foreign_fusion"]


def check_capture(capture: Any) -> Capture:
    """``capture`` parsed (`parse_capture`): AUTO, CUDA or OFF, CUDA refused when torch sees no GPU (`resolve`)."""
    capture = only(parse_capture(capture), Capture.AUTO, Capture.CUDA, Capture.OFF,
                   who="thunder_nb.jit (and each transform)")
    return resolve(capture, "cuda" if torch.cuda.is_available() else None) if capture is Capture.CUDA else capture


#: The runner's defaults, declared once (`RunnerOptions`): `FixedCUDAGraphTransform`'s keywords take theirs here.
RUNNER_DEFAULTS = RunnerOptions()


class RegionTransform(CUDAGraphTransform):
    """thunder's `CUDAGraphTransform` with thunder-nb's runner, region plans and hand-out; the transforms subclass it
    with their fusion rules (`can_fuse`, `fuse`) and passes.

    On a thunder or torch thunder-nb does not support (`thunder_nb.internals.supported`; one `VersionWarning` says so)
    it has no use counts to tell when memory it handed out is free again, so it hands none out to stay there: no
    gradient is lent and no returned tensor rotates (both are copied out), and a graph whose tensors went to a backward
    is not replayed again (`thunder_nb.internals.use_counters`).
    """

    label = "base"
    safe_dataflow = True  # fall back to consecutive fusion when dataflow fusion could reorder in-place updates

    def __init__(self, *, capture: bool | str | Capture = "auto", copy_outputs: bool = True, lend_gradients: bool = False,
                 runner: RunnerOptions = RunnerOptions()):
        super().__init__(share_mem_pool=False)
        supported = internals.check_versions()
        self.capture = check_capture(capture)
        self.copy_outputs = copy_outputs
        # NOTE: the legacy transform hands nothing out; the fixed one lends, where use counts guard what it lent
        self.lend_gradients = lend_gradients and supported
        options = asdict(runner) if supported else {**asdict(runner), "rotation": 0}
        self.cuda_graph_runner = ThunderNBRunner(capture=self.capture, **options)
        self.hand_outs: dict[str, HandOutPlan] = {}  # "forward" / "backward" -> the plan of the latest such trace
        self.handoff_refusals: dict[str, str] = {}  # number -> why it stays a Python number
        self.notes: list[str] = []  # decisions the report should mention
        self._cuda = False
        self._returned: set[str] = set()
        self._saved: set[str] = set()  # names a forward trace saves for its backward
        self._origin: dict[str, str] = {}  # tensor name -> where it comes from, for input plans
        self._module_buffers: set[str] = set()  # computation names of module buffers (from the prologue)
        self._handoffs: list[ScalarHandoff] = []  # numbers handed over on the device (current trace)
        self._keep_out: set[str] = set()  # outputs of symbols the hand-off keeps out of regions (current trace)

    @property
    def graphs_captured(self) -> int:
        """CUDA graphs captured so far, all regions and instances together."""
        return self.cuda_graph_runner.graphs_captured

    def transform_traces_pre_prologue(self, prologue_trace, computation_trace, epilogue_trace, **kwargs):
        """Note which computation inputs are module buffers (``unpack_buffer`` in the prologue): they are read in place."""
        self._module_buffers |= {p.name for b in prologue_trace.bound_symbols if b.sym.name == "unpack_buffer"
                                 for p in b.flat_proxy_outs}
        return prologue_trace, computation_trace, epilogue_trace

    def region_plan(self, name: str) -> RegionPlan:
        """The plan of region ``name``."""
        return self.cuda_graph_runner.plans[name]

    def _make_fusion(self, bsyms: list[BoundSymbol], inputs: list[Proxy], outputs: list[Proxy]) -> BoundSymbol:
        runner = self.cuda_graph_runner
        fusion_callable, fusion_name = runner.make_cuda_graph_callable_from_symbols(bsyms, inputs, outputs)
        runner.cuda_regions[fusion_name] = self._cuda
        stable = frozenset(i for i, p in enumerate(inputs) if p.name in self._module_buffers)
        if stable:
            runner.stable_inputs[fusion_name] = stable
        written, through = in_place_plan(bsyms, inputs, outputs)
        if written:
            runner.write_back[fusion_name] = written
        if through:
            runner.passthrough[fusion_name] = through
        # NOTE: a hand-off is listed on the region that reads it; the region that makes it only returns it
        read = {p.name for b in bsyms if b.sym.id != prims.PrimIDs.RETURN for p in b.flat_proxy_args}
        runner.plans[fusion_name] = RegionPlan(
            name=fusion_name,
            inputs=tuple(self._input_plan(p) for p in inputs),
            outputs=tuple(OutputPlan(o.name, o.name in self._returned, o.name in self._saved) for o in outputs),
            write_back=tuple(inputs[i].name for i in written),
            scalar_handoffs=tuple(h for h in self._handoffs if h.device_tensor in read),
        )
        for o in outputs:
            self._origin[o.name] = f"output of {fusion_name}"
        sym = Symbol(fusion_name, meta=None, is_fusion=True, executor=self)
        return internals.bound_call(sym, inputs, outputs, fusion_callable, bsyms)

    def _input_plan(self, p: Proxy) -> InputPlan:
        if isinstance(p, NumberProxy):
            why = self.handoff_refusals.get(p.name, "a number the region reads")
            return InputPlan(p.name, "number", why)
        if not isinstance(p, TensorProxy):
            return InputPlan(p.name, "number", type(p).__name__)
        if ProxyTag.STATIC_MEMORY_LOCATION in p.tags:
            return InputPlan(p.name, "static", "parameter")
        if p.name in self._module_buffers:
            return InputPlan(p.name, "static", "module buffer")
        origin = self._origin.get(p.name)
        if origin and origin.startswith("output of"):
            return InputPlan(p.name, "static", f"{origin}: read where that graph left it")
        if origin == "saved":
            return InputPlan(p.name, "static", "saved for the backward: read where the forward's graph left it "
                                               "(copied when it lies elsewhere)")
        if origin == "cotangent":
            return InputPlan(p.name, "static", "the gradient of an output, from autograd: read where it lies when a "
                                               "graph wrote it (copied when it lies elsewhere)")
        return InputPlan(p.name, "copied", origin or "a tensor made outside any graph")

    def _fuse_groups(self, trace: TraceCtx, groups: list[list[BoundSymbol]]) -> list[BoundSymbol]:
        producers, consumers = utils.producers_and_consumers(trace)
        out: list[BoundSymbol] = []
        for bsyms in groups:
            # NOTE: one op alone is not worth a graph, but one fusion of another executor (inductor's
            # TorchCompile: a whole forward) is
            lone = len(bsyms) == 1 and not foreign_fusion(bsyms[0], self)
            if lone or not self.can_fuse(bsyms[0]):
                out.extend(bsyms)
                continue
            out.append(self.fuse(Region(producers, consumers, bsyms), 0))
        return out

    def _begin(self, trace: TraceCtx) -> bool:
        """Prepare for fusing ``trace``: what it returns and saves, where its tensors come from; return whether it is a backward."""
        backward = trace.siginfo().name == "backward_fn"
        self._cuda = is_cuda_trace(trace)
        self._returned = returned_names(trace) if not backward else {
            p.name for p in tree_flatten(trace.output)[0] if isinstance(p, TensorProxy)
        }
        self._saved = {p.name for p in internals.saved_for_backward(trace) if isinstance(p, TensorProxy)}
        self._origin = {}
        for a in trace.args:
            if isinstance(a, TensorProxy) and a.name not in self._module_buffers:
                self._origin[a.name] = "an input of the function"
        if backward:
            # NOTE: backward_fn(saved_for_backward, cotangents): what each unpacks from (nested collections included)
            names = [name for name, _ in trace.siginfo().args]  # NOTE: the trace's args are lists, not proxies
            roots = dict(zip(names, ("saved", "cotangent")))
            for b in trace.bound_symbols:
                if b.sym.id == prims.PrimIDs.UNPACK_SEQUENCE:
                    root = roots.get(getattr(b.args[0], "name", None), "saved") if b.args else "saved"
                    for p in b.flat_proxy_outs:
                        roots.setdefault(p.name, root)
                        self._origin.setdefault(p.name, root)
        self._handoffs, self._keep_out = [], set()
        return backward

    def _finish(self, fused: TraceCtx, start_ns: int, what: str) -> TraceCtx:
        """Record the pass in the provenance."""
        ms = (time.perf_counter_ns() - start_ns) // 1_000_000
        fused.set_provenance(TraceProvenance(f"{what} (took {ms} milliseconds)"))
        return fused

    def _fused_trace(self, trace: TraceCtx, work: TraceCtx, fusion_type: str | None) -> TraceCtx:
        """A trace like ``trace`` whose bound symbols are ``work``'s, grouped and fused into regions."""
        fused = from_trace(trace)
        # NOTE: thunder's can_fuse bookkeeping expects this attribute on the trace in context
        fused.clear_collection_names = set()
        tok = set_tracectx(fused)
        try:
            fused.bound_symbols = self._fuse_groups(work, self._groups(work, fusion_type))
        finally:
            delattr(fused, "clear_collection_names")
            reset_tracectx(tok)
        return fused

    def _groups(self, trace: TraceCtx, fusion_type: str | None) -> list[list[BoundSymbol]]:
        def should_fuse(a: Node, b: Node) -> bool:
            def ok(n: Node) -> bool:
                return len(n.group_bsyms) > 1 or self.can_fuse(n.group_bsyms[0])

            return ok(a) and ok(b)

        kind = fusion_type or internals.compile_option("fusion_type", "Choose the type of fusion to use") or "consecutive"
        if kind == "dataflow" and self.safe_dataflow and has_in_place(trace.bound_symbols):
            # NOTE: dataflow fusion follows producer -> consumer edges only; an in-place update is no
            # such edge for the other readers of its destination, which it may then be moved past
            self.notes.append("dataflow fusion replaced by consecutive: the trace updates tensors in place")
            kind = "consecutive"
        if kind == "dataflow":
            return dataflow_fusion(trace, should_fuse)
        if kind == "consecutive":
            return consecutive_fusion(trace, should_fuse)
        raise ValueError(f"unknown fusion_type {kind!r} (must be one of ['consecutive', 'dataflow'])")

    def _insert_hand_out(self, fused: TraceCtx, backward: bool) -> None:
        """Route what leaves ``fused`` through the runner's hand-out (`thunder_nb.cudagraph.handout.insert_hand_out`)."""
        kind = "backward" if backward else "forward"
        self.hand_outs[kind] = insert_hand_out(fused, self.cuda_graph_runner, self, backward=backward,
                                               saving=bool(self._saved), copy_outputs=self.copy_outputs,
                                               lend_gradients=self.lend_gradients)


def foreign_fusion(bsym: BoundSymbol, owner: Any) -> bool:
    """Whether ``bsym`` is a fusion made by another fusion executor (e.g. thunder's torch_compile_ex)."""
    from thunder.extend import FusionExecutor

    ex = getattr(bsym.sym, "executor", None)
    return bool(getattr(bsym.sym, "is_fusion", False)) and ex is not owner and isinstance(ex, FusionExecutor)
