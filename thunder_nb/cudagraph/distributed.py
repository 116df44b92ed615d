"""thunder's data parallelism around `thunder_nb.jit`: what keeps it working, and the orders that cannot work.

``thunder.distributed.ddp(jfn)`` and ``fsdp(jfn)`` take the module ``thunder.jit`` returned and compile its model
anew with their transform added after the ones it had (thunder's ``add_transform``): for ``thunder_nb.jit(model)``,
``transforms=[FixedCUDAGraphTransform, DDPTransform]``. Before the prologue is made, each transform rewrites the
traces in that order. `DDPTransform` finds the parameters among the prologue's ``unpack_parameter`` symbols, marks
each one replicated and puts a ``synchronize`` before its first use; the backward rule of ``synchronize`` is what
gives each gradient its division by the world size, its ``all_reduce`` and its ``wait`` (``fsdp``: shards each
parameter, ``all_gather`` in the forward, ``reduce_scatter`` in the backward). The fixed transform had already
turned those lookups into module walks (`thunder_nb.cudagraph.prologue`), so `DDPTransform` found no parameter,
added nothing and said nothing: each rank trained its own model. `FSDPTransform` likewise left the walks' shape
checks at the unsharded shapes, and the first call failed on them.

So the fixed transform leaves the prologue as thunder made it where a transform after it in the list rewrites the
traces before the prologue too (`later_trace_rewriters`), and keeps the collectives and their waits out of its
regions (`thunder_nb.diagnosis.ops.classify_bsym` calls them islands of reason ``"collective"``, `is_collective`): an
``all_reduce`` is launched and waited for outside every graph, each as a symbol of its own, its input and output
plain tensors, after the region that computed its gradient (`sink_collectives`). A call of the module ``ddp``
returns then goes through thunder's own call path (thunder-nb's `thunder_nb.cudagraph.call.fast_call` wrapped the
module it was given, not this new one), which also honours ``thunder.distributed.skip_data_parallel_grad_sync``.

torch's ``DistributedDataParallel(thunder_nb.jit(model))`` and ``FullyShardedDataParallel(thunder_nb.jit(model))``
work as around ``thunder.jit(model)``: their hooks run around thunder's computation, and the backward's gradients
reach the parameters' gradient accumulators as any other autograd Function's. What cannot work is compiling a model
that is already compiled or already wrapped for data parallelism (``thunder_nb.jit(ddp(thunder.jit(model)))``,
``thunder_nb.jit(DistributedDataParallel(model))``): `refuse_wrapped` names the order to write instead. Nor torch's
``fully_shard`` around ``thunder_nb.jit(model)``, which around ``thunder.jit(model)`` too trains each rank apart from
the others without a word: `refuse_fully_sharded` refuses it at its first call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import internals

# NOTE: what a collective is, and that it never enters a region, is the diagnosis's to decide (one place for the
# transform's can_fuse and the checker alike); re-exported here for the passes below
from ..diagnosis.ops import COLLECTIVE_NAMES, is_collective

__all__ = ["is_collective", "sink_collectives", "later_trace_rewriters", "refuse_wrapped", "refuse_fully_sharded",
           "data_parallel_wrapper", "thunder_data_parallel", "COLLECTIVE_NAMES", "FULLY_SHARD"]


def sink_collectives(bsyms: Sequence[Any]) -> list[Any]:
    """``bsyms`` with each collective and wait (`is_collective`) moved down past the symbols after it that neither read
    what a moved one makes nor write a tensor in place, to just before the first that does (or the return); they keep
    their order among themselves, which is the order every rank issues them in.

    thunder's backward divides each gradient by the world size and launches its ``all_reduce`` right after, one
    gradient after another once the last gradient is computed: left there, each launch would split the region and
    leave the next division alone outside it, one eager kernel per parameter. Moved down, the divisions join the
    region and the launches follow it together, as in thunder's order (whose backward computes every gradient first:
    no overlap of communication with computation is given up in its traces)."""
    from thunder.core import prims

    from ..diagnosis.ops import IN_PLACE_NAMES

    out: list[Any] = []
    pending: list[Any] = []
    made: set[str] = set()  # NOTE: what the pending symbols make
    for b in bsyms:
        if is_collective(b):
            pending.append(b)
            made.update(p.name for p in b.flat_proxy_outs)
            continue
        if pending and (b.sym.id == prims.PrimIDs.RETURN or b.sym.name in IN_PLACE_NAMES or b.sym.name.endswith("_")
                        or any(p.name in made for p in b.flat_proxy_args)):
            out += pending
            pending, made = [], set()
        out.append(b)
    return out + pending


def later_trace_rewriters(transform: Any) -> list[Any]:
    """The transforms after ``transform`` in the transforms of the function thunder is compiling now whose own
    ``transform_traces_pre_prologue`` rewrites the traces after ``transform``'s (``ddp`` and ``fsdp`` put theirs
    there); empty outside a compilation or where ``transform`` is not among them."""
    from thunder.core.transform_common import Transform

    cd = internals.compiling_now()
    transforms = list(getattr(cd, "transforms", None) or ())
    at = next((i for i, t in enumerate(transforms) if t is transform), None)
    if at is None:
        return []
    return [t for t in transforms[at + 1:]
            if type(t).transform_traces_pre_prologue is not Transform.transform_traces_pre_prologue]


def _torch_wrapper(module: Any) -> tuple[str, str] | None:
    """torch's data-parallel wrapper that ``module`` is or holds among its submodules, and what to write instead; None
    where there is none."""
    import torch

    if not isinstance(module, torch.nn.Module):
        return None
    return next((w for w in map(_torch_wrapper_of, module.modules()) if w is not None), None)


def _torch_wrapper_of(m: Any) -> tuple[str, str] | None:
    """`_torch_wrapper` of ``m`` itself, its submodules left out."""
    import torch

    try:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    except ImportError:  # NOTE: a torch built without distributed support
        FSDPModule = FullyShardedDataParallel = ()
    if isinstance(m, torch.nn.parallel.DistributedDataParallel):
        return ("torch.nn.parallel.DistributedDataParallel",
                "torch.nn.parallel.DistributedDataParallel(thunder_nb.jit(model)) or "
                "thunder.distributed.ddp(thunder_nb.jit(model))")
    if isinstance(m, FullyShardedDataParallel):
        return ("torch.distributed.fsdp.FullyShardedDataParallel",
                "FullyShardedDataParallel(thunder_nb.jit(model)) or "
                "thunder.distributed.fsdp(thunder_nb.jit(model))")
    if isinstance(m, FSDPModule):
        return FULLY_SHARD
    return None


def thunder_data_parallel(obj: Any) -> bool:
    """Whether ``obj`` is what ``thunder.distributed.ddp`` or ``fsdp`` returned."""
    import thunder

    cd = thunder.compile_data(obj)
    return cd is not None and bool(getattr(cd.fn, "use_ddp", False) or getattr(cd.fn, "use_fsdp", False))


def data_parallel_wrapper(module: Any) -> str | None:
    """The data-parallel wrapper ``module`` is or holds among its submodules, by name (torch's DDP, FSDP or
    ``fully_shard``; thunder's ``ddp`` or ``fsdp``); None where there is none."""
    import torch

    if not isinstance(module, torch.nn.Module):
        return None
    for m in module.modules():
        wrapped = _torch_wrapper_of(m)
        if wrapped is not None:
            return wrapped[0]
        if thunder_data_parallel(m):
            return "thunder.distributed.ddp or fsdp"
    return None


#: torch's ``fully_shard`` (FSDP2), and what to write instead: around ``thunder.jit(model)`` or
#: ``thunder_nb.jit(model)`` it trains each rank apart from the others (thunder 0.2.6, torch 2.11, gloo: the
#: parameters end unlike one process's), without an error.
FULLY_SHARD = ("torch.distributed.fsdp.fully_shard", "thunder.distributed.fsdp(thunder_nb.jit(model))")


def refuse_wrapped(fn: Any) -> None:
    """Raise TypeError where ``thunder_nb.jit(fn)`` cannot compile what the user means, naming what to write instead:
    ``fn`` already compiled by thunder (a `thunder.ThunderModule` or a jitted function, ``ddp``'s and ``fsdp``'s
    results among them: compiled again, the gradients do not reach the parameters the way the inner compilation
    connects them, and its transforms, gradient synchronisation included, are not the outer one's), or a model that
    is or holds a module torch wrapped for data parallelism (thunder does not trace its hooks)."""
    import thunder

    if thunder.compile_data(fn) is not None:
        if thunder_data_parallel(fn):
            raise TypeError(
                "thunder_nb.jit was given a module that thunder.distributed.ddp or fsdp returned: compile the plain "
                "model and wrap the result, thunder.distributed.ddp(thunder_nb.jit(model)) (or "
                "thunder.distributed.fsdp(thunder_nb.jit(model)))")
        raise TypeError(
            f"thunder_nb.jit was given what thunder already compiled ({type(fn).__name__}): pass the plain model or "
            "function, thunder_nb.jit(model) in place of thunder.jit(model), and wrap its result for data parallelism "
            "(thunder.distributed.ddp(thunder_nb.jit(model)))")
    wrapped = _torch_wrapper(fn)
    if wrapped is not None:
        wrapper, instead = wrapped
        raise TypeError(f"thunder_nb.jit cannot compile a model wrapped by {wrapper}: compile the model, then wrap the "
                        f"result: {instead}")


def refuse_fully_sharded() -> None:
    """Raise TypeError where the module thunder is compiling now was given to torch's ``fully_shard`` after
    ``thunder_nb.jit`` (`FULLY_SHARD`); called by the fixed transform before the prologue is made, at the first call."""
    cd = internals.compiling_now()
    if cd is None or not getattr(cd, "is_module", False):
        return
    # NOTE: the ThunderModule(s) thunder made for ``cd.fn``: ``fully_shard(jfn)`` changes the class of that one
    for module in internals.thunder_modules_of(cd):
        if _torch_wrapper(module) == FULLY_SHARD:
            wrapper, instead = FULLY_SHARD
            raise TypeError(f"thunder_nb.jit cannot run a model given to {wrapper}: it would train each rank apart "
                            f"from the others; write {instead}")
