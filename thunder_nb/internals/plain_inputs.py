"""Inputs written in place, where eager PyTorch and thunder 0.2.6 part: one that does not require grad, written by the
user's code with a value that does (`written_with_grad`), and one that requires grad, written in place at all
(`written_losing_grad`). thunder's split, as `thunder_nb.internals.saved` changes it, warns of both with an
`InPlaceGradientWarning`."""

from __future__ import annotations

import functools
import os
from typing import Any

from .storage import forward_of, joint_return, storage_of
from .views import alias_update, tensor_names, user_line

__all__ = ["written_with_grad", "written_losing_grad"]


def _constant(bsym: Any) -> bool:
    """Whether thunder's autodiff takes ``bsym``'s outputs as constants (``is_constant_for_vjp``'s rules, and
    ``detach``): made in a ``torch.no_grad()`` region, by an op without a gradient, or not floating point."""
    from thunder.core.dtypes import is_inexact_dtype
    from thunder.core.proxies import ProxyTag, TensorProxy
    from thunder.core.transforms import nondifferentiable_vjp_symbols

    outs = [o for o in bsym.flat_proxy_outs if isinstance(o, TensorProxy)]
    return (bsym.sym.name == "detach" or bsym.sym.id in nondifferentiable_vjp_symbols
            or any(ProxyTag.DETACHED_AUTOGRAD_GRAPH in o.tags for o in outs)
            or not any(is_inexact_dtype(o.dtype) for o in outs))


def _in_torch(bsym: Any) -> bool:
    """Whether ``bsym`` comes from PyTorch's own code (BatchNorm's update of its running statistics, which eager
    PyTorch makes inside a kernel, without autograd)."""
    filename = getattr(bsym, "source_filename", None)
    return bool(filename) and os.path.abspath(filename).startswith(_torch_folder())


@functools.cache
def _torch_folder() -> str:
    import torch

    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def written_with_grad(joint_trace: Any) -> list[str]:
    """The user's lines where ``joint_trace`` (thunder's forward and backward in one trace, before its split) writes
    in place, with grad enabled, a value that requires grad into an input that does not (the CPU fuzzer's programs
    5168, 6802, 8484: ``x1.sub_(x2)``, ``x2`` requiring grad). A write nothing in the forward reads after it is not in
    that trace (thunder drops it there: programs 4373, 8273), and goes unnamed.

    Eager PyTorch makes that input require grad: returned, it carries the gradient back to what was written into it,
    and a later call's write into it builds on this call's graph. thunder leaves it a plain tensor: returned, it has no
    gradient, and each call starts afresh (reads of it later in the same call are differentiated as eager's are).
    """
    bsyms = list(joint_trace.bound_symbols)
    forward = forward_of(joint_trace)
    writes = {id(b) for b in forward if b.sym.name == "copy_" and len(b.args) > 1
              and b.kwargs.get("grad_enabled", False) and not _in_torch(b)}
    if not writes:
        return []  # NOTE: no write of the user's with grad enabled: the trace's storage is not walked
    find, _ = storage_of(bsyms)
    args = [p for p in joint_trace.args if hasattr(p, "requires_grad") and hasattr(p, "name")]
    plain = {find(p.name) for p in args if not p.requires_grad}
    with_grad = {p.name for p in args if p.requires_grad}
    found: dict[str, None] = {}
    for bsym in forward if plain else ():
        reads = tensor_names(bsym.flat_proxy_args)
        if not with_grad.intersection(reads):
            continue
        if id(bsym) in writes and reads[0] in with_grad and find(bsym.args[1].name) in plain:
            found[user_line(bsym)] = None
        elif not _constant(bsym):
            with_grad.update(tensor_names(bsym.flat_proxy_outs))
    return list(found)


def written_losing_grad(joint_trace: Any) -> list[str]:
    """The lines where ``joint_trace`` (thunder's forward and backward in one trace, before its split) writes in place
    into an input that requires grad (or into memory thunder takes as shared with it) that the forward's outputs then
    read, where thunder gives that input no gradient.

    Eager PyTorch records the write in the input's graph (``x.add_(w)`` on a layer's input, ``nn.ReLU(inplace=True)``
    first in a compiled part of a model): the gradient reaches what made the input. thunder 0.2.6 takes the written
    version as the input in its backward and returns no gradient for the input itself: everything before the compiled
    function silently gets none through it.
    """
    info = joint_return(joint_trace)
    grads = info.get("output")
    if not isinstance(grads, (tuple, list)) or len(grads) != len(joint_trace.args):
        return []
    lost = [p.name for p, g in zip(joint_trace.args, grads)
            if g is None and getattr(p, "requires_grad", False) and hasattr(p, "name")]
    forward = forward_of(joint_trace)
    writes = [b for b in forward if b.sym.name == "copy_" and len(b.args) > 1 and b.kwargs.get("grad_enabled", False)]
    if not lost or not writes:
        return []
    # NOTE: what the outputs differentiate: back from them, each alias update's output to its own input only, and
    # nothing through a constant (a detach: eager's gradient stops there too)
    needed = set(tensor_names(info.get("fw_flat_out", ())))
    for bsym in reversed(forward):
        outs, ins = tensor_names(bsym.flat_proxy_outs), tensor_names(bsym.flat_proxy_args)
        if alias_update(bsym):
            needed.update(i for i, o in zip(ins, outs) if o in needed)
        elif needed.intersection(outs) and not _constant(bsym):
            needed.update(ins)
    find, _ = storage_of(joint_trace.bound_symbols)
    found: dict[str, None] = {}
    for name in lost:
        derived = {name}  # NOTE: the input's values, through its writes and the ops that differentiate them
        for bsym in forward:
            outs, ins = tensor_names(bsym.flat_proxy_outs), tensor_names(bsym.flat_proxy_args)
            if alias_update(bsym):
                derived.update(o for i, o in zip(ins, outs) if i in derived)
            elif derived.intersection(ins) and not _constant(bsym):
                derived.update(outs)
        if derived & needed:
            found.update((user_line(b), None) for b in writes
                         if hasattr(b.args[1], "name") and find(b.args[1].name) == find(name))
    return list(found)
