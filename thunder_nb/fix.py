"""The CUDA-graph transforms: `FixedCUDAGraphTransform` (corrected) and `LegacyCUDAGraphTransform` (#728 as it was)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from thunder.core import prims, utils
from thunder.core.proxies import Proxy, unvariableify
from thunder.core.pytree import tree_flatten
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx, from_trace
from thunder.executors.utils import Region

from . import internals
from .cudagraph import call
from .cudagraph.capture import Capture
from .cudagraph.defer import defer_returned_items
from .cudagraph.distributed import (
    is_collective,
    later_trace_rewriters,
    refuse_fully_sharded,
    refuse_wrapped,
    sink_collectives,
)
from .cudagraph.executors import jit_executors
from .cudagraph.inplace import fold_in_place
from .cudagraph.passes import (
    region_del_pass,
    strip_top_level_dels,
)
from .cudagraph.prologue import fast_module_lookups
from .cudagraph.runner import (
    EagerFallbackWarning,
    HeldOutputsWarning,
    RecaptureWarning,
    RunnerOptions,
    ThunderNBRunner,
)
from .cudagraph.scalars import handoff_numbers
from .cudagraph.transform import RUNNER_DEFAULTS, RegionTransform
from .diagnosis.ops import classify_bsym
from .diagnosis.plans import HAND_OUT_NAME

__all__ = [
    "FixedCUDAGraphTransform",
    "LegacyCUDAGraphTransform",
    "ThunderNBRunner",
    "EagerFallbackWarning",
    "HeldOutputsWarning",
    "RecaptureWarning",
    "recover_from_failed_capture",
    "region_del_pass",
    "strip_top_level_dels",
    "HAND_OUT_NAME",
    "jit",
    "ONE_AUTOGRAD_FUNCTION",
]

#: The compile option of ``thunder.jit`` that `jit` sets: one ``torch.autograd.Function`` per call connects the
#: outputs to autograd, as thunder's torch.compile backend (ThunderFX) does by default, instead of the pair that
#: ``thunder.jit`` uses by default (a second Function over all the inputs, a dummy tensor made on the meta device
#: in the forward and in the backward), whose host time the single Function saves on every call (the figure is in
#: bench/results/README.md, "Figures behind the defaults").
ONE_AUTOGRAD_FUNCTION = {"thunderfx_disable_split_autograd": True}


def jit(fn: Any, *, executors: Sequence[Any] = (), split_autograd: bool = False, fast_call: bool = True,
        **transform_options: Any) -> Any:
    """``thunder.jit(fn)`` as thunder-nb recommends it: `FixedCUDAGraphTransform`, one autograd Function per call,
    and thunder's call path shortened on a cache hit.

    Args:
        executors: fusion executors put before thunder's defaults: names (``"torchcompile"``: inductor's fused
            kernels inside the regions, compiled at the first call; ``"torchcompile_cat"``; ``"nvfuser"``) or
            thunder executors; ``"no-sdpa"`` leaves thunder's sdpa executor out of the defaults. Among the
            defaults, thunder's sdpa executor refuses what its kernels cannot run (a KV cache's mask broadcast over
            the batch), which then runs as torch's attention (`thunder_nb.cudagraph.executors.checked_sdpa`).
        split_autograd: connect to autograd as ``thunder.jit`` does by default (two Functions per call; see
            `ONE_AUTOGRAD_FUNCTION`). With the single Function, the gradients flowing into the backward call stay
            alive until it returns, as with any ``torch.autograd.Function``.
        fast_call: make the calls that hit thunder's cache by thunder's steps without its wrappers around them
            (`thunder_nb.cudagraph.call.fast_call`: the same results and statistics, less host time per call, which
            is what a step under CUDA graphs waits for). False: thunder's own call path. Either way thunder's
            tracing runs with Python's cyclic garbage collector off (`thunder_nb.internals.cyclic_gc_off`).
        transform_options: `FixedCUDAGraphTransform`'s arguments (``capture``, ``copy_outputs``, ...).

    Returns:
        thunder's jitted function; its transform is ``jfn._lc_transforms[0]``. For a module, thunder's
        `thunder.ThunderModule`, on which an attribute set or deleted is set on or deleted from the model, as on
        torch.compile's module (``compiled.head = nn.Linear(...)``: `FixedCUDAGraphTransform.transform_module`).

    Where thunder cannot trace ``fn`` at a call (an op with a data-dependent shape, one of thunder's known limits), the
    call raises thunder's own error with a note of what to do (`thunder_nb.diagnosis.failures.explain_trace_failure`).

    Data parallelism wraps the result: ``thunder.distributed.ddp(thunder_nb.jit(model))`` (or ``fsdp``, or torch's
    ``DistributedDataParallel`` or ``FullyShardedDataParallel``) synchronises the gradients as around
    ``thunder.jit(model)``. The reverse order (a model already compiled, or wrapped for data parallelism) and torch's
    ``fully_shard`` around the result raise TypeError naming the order to write (`thunder_nb.cudagraph.distributed`).

    With a thunder or torch other than those thunder-nb reads the private parts of (lightning-thunder 0.2.6, torch
    2.11.x: `thunder_nb.internals.supported`) it takes thunder's own call path, prologue and torchcompile executors,
    and hands no graph memory out unguarded, slower, with one `thunder_nb.internals.VersionWarning` per process.
    """
    import thunder

    internals.check_versions()
    refuse_wrapped(fn)
    options = {} if split_autograd else dict(ONE_AUTOGRAD_FUNCTION)
    options["executors"] = jit_executors(executors)
    jfn = thunder.jit(fn, transforms=[FixedCUDAGraphTransform(**transform_options)], **options)
    return call.fast_call(jfn) if fast_call else call.without_cyclic_gc(jfn)


def recover_from_failed_capture(stream: Any = None) -> None:
    """Leave CUDA usable after a capture that failed: its random number generators (`internals.recover_generators`)
    and the current stream, which ``torch.cuda.graph`` leaves on its capture stream when the capture fails at its
    end (`internals.recover_stream`): ``stream`` is made current again, or the device's default stream for None.

    Call it after thunder's own transform failed to capture; thunder-nb's transforms call it themselves.
    """
    internals.recover_capture(stream)


class FixedCUDAGraphTransform(RegionTransform):
    """thunder's CUDA-graph transform with islands kept out, a corrected deletion pass, and no wrong result.

    Args:
        capture: ``"auto"`` (default: capture on CUDA, otherwise run regions eagerly with one
            `EagerFallbackWarning`), True or ``"on"`` (always capture; error without CUDA), False or ``"off"`` (always
            eager), or the `thunder_nb.cudagraph.capture.Capture` they stand for; kept as that `Capture`.
        scalar_handoff: hand the Python numbers regions read to them as 0-d device tensors, computed
            bit for bit as PyTorch would (default True; see `thunder_nb.cudagraph.scalars`).
        copy_outputs: copy returned tensors that lie in graph memory out of it (default True).
            False returns them as they are: the next call then overwrites them, as with thunder's transform.
        rotation: instead of copying, hand out where they lie the tensors a forward returns from a region that
            saves nothing for a backward, and while the caller still holds them at the next call, replay another
            instance of that region (recorded into the first one's memory pool, its outputs copied inside its
            graph into buffers of its own): up to this many instances take turns (default 2, what a loop that
            keeps its last result needs); past that, those tensors are copied out again. 0: always copy.
        share_mem_pool: as thunder's transform.
        max_instances: graph instances a region may have for tensors it handed out that are still held (saved
            for a backward, lent gradients): at most 16 by default, and fewer where memory runs short (below).
        instance_memory: the fraction of the device's free memory a further instance may take (default 0.25);
            the first instance is always recorded.
        instance_bytes: a cap in bytes on a region's further instances together (default None: no cap). Past a
            bound, a call whose instances are all held runs without a graph (`HeldOutputsWarning`, naming it).
        max_addresses: addresses one static input may take (one per layer is normal) before it is copied.
        max_values: values of a Python number a region still bakes in (no exact hand-off, not from an
            island) before the region runs without a graph (default 8; `RecaptureWarning`).
        defer_items: run an ``.item()`` whose number is only returned (``return loss, loss.item()``) in
            thunder's epilogue, after the outputs are connected to autograd, instead of in the forward:
            the host then waits for the forward graph later, having done that work meanwhile (default
            True; see `thunder_nb.cudagraph.defer`).
        fast_prologue: find the submodules, parameters and buffers thunder's prologue looks up on every
            call along their paths' dicts instead of through ``Module.get_parameter`` and its kin, with
            the same results (default True; see `thunder_nb.cudagraph.prologue`).
        in_place_updates: run each update of part of a tensor that thunder functionalized (``index_copy_``,
            ``buf[i] = v``, ``index_put_``, ``index_add_``, ``scatter_``, ``scatter_add_``: an out-of-place copy of
            the whole tensor, then a ``copy_`` back; a KV cache's update) in place again, where that computes the
            same (default True; see `thunder_nb.cudagraph.inplace`).
        lend_gradients: hand the gradients a backward's graph wrote to autograd where they lie, guarded,
            instead of copying them out (default True): autograd makes them the parameters' ``.grad``, and
            while any is still referenced (``.grad`` not reset, gradient accumulation, a name) the next
            backward replays another graph instance, as for saved tensors. False copies them out.
    """

    label = "fixed"

    def __init__(
        self,
        *,
        capture: bool | str | Capture = "auto",
        scalar_handoff: bool = True,
        copy_outputs: bool = True,
        share_mem_pool: bool = RUNNER_DEFAULTS.share_mem_pool,
        max_instances: int = RUNNER_DEFAULTS.max_instances,
        instance_memory: float = RUNNER_DEFAULTS.instance_memory,
        instance_bytes: int | None = RUNNER_DEFAULTS.instance_bytes,
        max_addresses: int = RUNNER_DEFAULTS.max_addresses,
        max_values: int = RUNNER_DEFAULTS.max_values,
        rotation: int = RUNNER_DEFAULTS.rotation,
        defer_items: bool = True,
        fast_prologue: bool = True,
        lend_gradients: bool = True,
        in_place_updates: bool = True,
    ):
        runner = RunnerOptions(share_mem_pool=share_mem_pool, max_instances=max_instances,
                               instance_memory=instance_memory, instance_bytes=instance_bytes,
                               max_addresses=max_addresses, max_values=max_values, rotation=rotation)
        super().__init__(capture=capture, copy_outputs=copy_outputs, lend_gradients=lend_gradients, runner=runner)
        self.scalar_handoff = scalar_handoff
        self.defer_items = defer_items
        self.fast_prologue = fast_prologue
        self.in_place_updates = in_place_updates

    def transform_module(self, model: Any) -> None:
        """thunder calls it on the `thunder.ThunderModule` it made of a module (``thunder.jit(model,
        transforms=[...])``, `thunder_nb.jit`, and ``thunder.distributed.ddp`` or ``fsdp`` around them, which jit the
        model again): an attribute set or deleted on that module is set on or deleted from the model
        (`internals.write_through`), and each call traces under its own autocast state alone
        (`thunder_nb.cudagraph.call.autocast_of_each_call`)."""
        super().transform_module(model)
        internals.write_through(model)
        call.autocast_of_each_call(model)

    def transform_traces_pre_prologue(self, prologue_trace, computation_trace, epilogue_trace, **kwargs):
        """As the base transform; then make the prologue's module lookups path walks (`thunder_nb.cudagraph.prologue`), and
        move each ``.item()`` whose number is only returned into the epilogue.

        The walks are left out where a transform after this one in ``transforms=`` rewrites the traces before the
        prologue too (``thunder.distributed.ddp`` and ``fsdp`` add theirs there): those look for thunder's own lookup
        and check symbols, and would find none (`thunder_nb.cudagraph.distributed`). A module given to torch's
        ``fully_shard`` after ``thunder_nb.jit`` is refused here, at its first call."""
        refuse_fully_sharded()
        prologue_trace, computation_trace, epilogue_trace = super().transform_traces_pre_prologue(
            prologue_trace, computation_trace, epilogue_trace, **kwargs)
        if self.fast_prologue:
            later = later_trace_rewriters(self)
            if later:
                names = ", ".join(sorted({type(t).__name__ for t in later}))
                self.notes.append(f"prologue left as thunder made it (no module walks): {names} after this transform "
                                  "reads thunder's lookups and checks")
            elif not internals.supported():
                self.notes.append("prologue left as thunder made it (no module walks): thunder or torch is not the "
                                  "version thunder-nb reads the private parts of")
            else:
                prologue_trace = fast_module_lookups(prologue_trace)
        moved = defer_returned_items(computation_trace, epilogue_trace) if self.defer_items else None
        if moved is None:
            return prologue_trace, computation_trace, epilogue_trace
        computation_trace, epilogue_trace, names = moved
        self.notes.append(f"{', '.join(names)} = .item() of a returned tensor: run after the call's autograd "
                          "connection (thunder's epilogue), not in the forward")
        return prologue_trace, computation_trace, epilogue_trace

    def can_fuse(self, bsym: BoundSymbol) -> bool:
        """Whether ``bsym`` may join a region: never a del, nor what `thunder_nb.diagnosis.ops.classify_bsym` keeps out
        (a host sync, a transfer, a CPU op of a CUDA trace, a collective or its wait)."""
        if bsym.sym.id == prims.PrimIDs.DEL or bsym.sym.id == "clear_mutable_collection":
            return False
        if bsym.sym.id in (
            prims.PrimIDs.UNPACK_TRIVIAL,
            prims.PrimIDs.UNPACK_KEY,
            prims.PrimIDs.UNPACK_EMPTY_DICT,
            prims.PrimIDs.UNPACK_SEQUENCE,
            prims.PrimIDs.RETURN,
            prims.PrimIDs.ITEM,
        ):
            return False
        if self._keep_out and any(p.name in self._keep_out for p in bsym.flat_proxy_outs):
            return False  # NOTE: the scalar hand-off keeps a number's fill, or a reader it cannot hand over, outside
        return classify_bsym(bsym, cuda_trace=self._cuda) is None

    def region_dels(self, bsyms: Sequence[BoundSymbol], inputs: Sequence[Proxy], outputs: Sequence[Proxy]):
        """The region's del pass (`region_del_pass`); override to study memory without it."""
        return region_del_pass(bsyms, inputs, outputs)

    def fuse(self, region: Region, fusion_counter: int) -> BoundSymbol:
        """Make one region's fusion symbol, with the corrected region del pass."""
        inputs = [unvariableify(i) for i in region.inputs]
        outputs = [unvariableify(o) for o in region.outputs]
        bsyms = self.region_dels(region.bound_symbols, inputs, outputs)
        return self._make_fusion(bsyms, inputs, outputs)

    def transform_trace_post_optimization(self, trace: TraceCtx, **kwargs: Any) -> TraceCtx:
        """Fuse regions into CUDA graphs, route what leaves the trace through the hand-out, regenerate top-level dels.

        Collectives and their waits (thunder's ``ddp`` and ``fsdp``) move down to just before what reads them
        (`thunder_nb.cudagraph.distributed.sink_collectives`), so that they split no region."""
        start = time.perf_counter_ns()
        backward = self._begin(trace)
        work = from_trace(trace)
        work.bound_symbols = strip_top_level_dels(trace.bound_symbols, collections=backward)
        if self.in_place_updates:
            before = len(work.bound_symbols)
            work.bound_symbols = fold_in_place(work.bound_symbols)
            if len(work.bound_symbols) < before:
                self.notes.append(f"{before - len(work.bound_symbols)} partial updates that thunder made out of place "
                                  "(a copy of the whole tensor, then a copy_ back) run in place again")
        if any(is_collective(b) for b in work.bound_symbols):
            work.bound_symbols = sink_collectives(work.bound_symbols)
        if self.scalar_handoff:
            handed = handoff_numbers(work, work.bound_symbols, self.can_fuse, cuda=self._cuda)
            work.bound_symbols, self._handoffs, self._keep_out = handed.bsyms, handed.handoffs, handed.keep_out
            self.handoff_refusals.update(handed.refused)

        fused = self._fused_trace(trace, work, None)
        self._insert_hand_out(fused, backward)
        flat_out, _ = tree_flatten(utils.sequencify(fused.output))
        fused.bound_symbols = internals.del_last_used(fused.bound_symbols, flat_out, clear_mutable_collections=backward)
        return self._finish(fused, start, "thunder-nb corrected CUDAGraph fusion")


class LegacyCUDAGraphTransform(RegionTransform):
    """The July 2024 behaviour behind upstream issue #728, for teaching and regression tests.

    The del pass runs before fusion and its dels are fused into regions as they are (no per-region
    regeneration); fusion is ``"dataflow"``; the torch executor's ``item`` is kept out of regions.
    On ``x.sum().item()`` its region deletes and then returns the same name (UnboundLocalError).
    """

    label = "legacy"
    safe_dataflow = False  # July 2024 behaviour, reordering included

    def can_fuse(self, bsym: BoundSymbol) -> bool:
        """thunder's rule of the time, plus the torch executor's ``item`` kept out."""
        if bsym.sym.name == "item":
            return False
        return super().can_fuse(bsym)

    def fuse(self, region: Region, fusion_counter: int) -> BoundSymbol:
        """Make the fusion symbol with the region's bound symbols as they are, dels included."""
        inputs = [unvariableify(i) for i in region.inputs]
        outputs = [unvariableify(o) for o in region.outputs]
        return self._make_fusion(list(region.bound_symbols), inputs, outputs)

    def transform_trace_post_optimization(self, trace: TraceCtx, **kwargs: Any) -> TraceCtx:
        """Fuse along dataflow over a trace that already has its dels (as in July 2024)."""
        start = time.perf_counter_ns()
        backward = self._begin(trace)
        self._returned = set()
        fused = self._fused_trace(trace, trace, "dataflow")
        self._insert_hand_out(fused, backward)
        return self._finish(fused, start, "thunder-nb legacy (July 2024) CUDAGraph fusion")
