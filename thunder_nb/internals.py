"""Every private thunder and torch name thunder-nb relies on, behind one version check."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "THUNDER_VERSION",
    "TORCH_VERSION",
    "check_versions",
    "del_last_used",
    "build_traces",
    "has_traces",
    "saved_for_backward",
    "clear_cublas_workspaces",
    "copy_all",
    "copy_into",
    "storage_use_count",
    "recover_generators",
    "compile_option",
    "fusion_symbol",
]

#: The versions whose private names this module was written against.
THUNDER_VERSION = "0.2.6"
TORCH_VERSION = "2.11"

_checked = False


class VersionWarning(UserWarning):
    """thunder or torch is not the version thunder-nb's private accesses were written for."""


def check_versions() -> None:
    """Warn once when thunder or torch differs from the pinned versions (private names may have moved)."""
    global _checked
    if _checked:
        return
    _checked = True
    import thunder
    import torch

    found = {"lightning-thunder": getattr(thunder, "__version__", "?"), "torch": torch.__version__}
    wanted = {"lightning-thunder": THUNDER_VERSION, "torch": TORCH_VERSION}
    for name, version in found.items():
        if not str(version).startswith(wanted[name]):
            warnings.warn(
                f"thunder-nb was written for {name} {wanted[name]}, found {version}: "
                "its private accesses (runner internals, del pass, capture) may not hold",
                VersionWarning,
                stacklevel=2,
            )


def del_last_used(bsyms: Sequence[Any], protected: Sequence[Any], *, clear_mutable_collections: bool = False) -> list[Any]:
    """thunder's del pass over bound symbols (``thunder.executors.passes._del_last_used``)."""
    from thunder.executors.passes import _del_last_used

    return _del_last_used(bsyms, protected, clear_mutable_collections=clear_mutable_collections)


def build_traces(jfn: Any, *args: Any, **kwargs: Any) -> None:
    """Build ``jfn``'s traces for these inputs without running the computation."""
    import thunder

    thunder.compile_data(jfn)._get_computation_and_inputs(*args, **kwargs)


def has_traces(jfn: Any) -> bool:
    """Whether ``jfn`` has been traced at least once."""
    import thunder

    cs = thunder.compile_stats(jfn)
    return cs is not None and bool(cs.last_traces)


def saved_for_backward(trace: Any) -> tuple[Any, ...]:
    """The tensors an augmented forward trace saves for its backward (empty for other traces)."""
    from thunder.core import vjp_utils
    from thunder.core.trace import TraceTag

    out = trace.output
    # NOTE: a trace keeps its AUGMENTED_FORWARD tag where thunder returns no (outputs, saved) pair: under
    # no_grad, or when no output depends on an input that requires grad (it reaches them through .item())
    if TraceTag.AUGMENTED_FORWARD not in trace.tags or not (
        isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], dict) and isinstance(out[1], (tuple, list))
    ):
        return ()
    return tuple(vjp_utils.get_saved_for_backward_tensors(trace))


def copy_all(tensors: Sequence[Any]) -> list[Any]:
    """Copies of ``tensors``, each laid out as ``clone()`` lays it out, made by one `copy_into`.

    Tensor subclasses, and tensors whose copies autograd would record, are ``clone()``d.
    """
    import torch

    if len(tensors) < 2 or any(type(t) is not torch.Tensor for t in tensors) or (
            torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        return [t.clone() for t in tensors]
    out = [torch.empty_like(t) for t in tensors]  # NOTE: preserve_format: clone's strides, dense or not
    copy_into(out, tensors)
    return out


def copy_into(targets: Sequence[Any], sources: Sequence[Any]) -> None:
    """``targets[i].copy_(sources[i])`` for each i, in one ``torch._foreach_copy_`` (a few kernel launches, not one each).

    Where autograd would record a copy, each is a ``copy_`` of its own.
    """
    import torch

    if len(targets) < 2 or (torch.is_grad_enabled() and any(t.requires_grad for t in sources)):
        for t, s in zip(targets, sources):
            t.copy_(s)
        return
    torch._foreach_copy_(list(targets), list(sources))


def compile_option(name: str, description: str) -> Any:
    """A ``thunder.jit`` compile option of the function being compiled (None outside compilation)."""
    from thunder.core.compile_data import get_compile_option

    return get_compile_option(name, description)


def clear_cublas_workspaces() -> None:
    """Drop cuBLAS's per-stream workspaces, so that the next matmul allocates a fresh one.

    Called right before and after recording a graph: the workspace the recording allocates then lies
    in the graph's private pool, which lives as long as the graph. Without it the graph records a
    workspace from the ordinary allocator that anyone may free later (torch.compile's CUDA-graph
    trees clear these workspaces when they record), and a replay then writes freed memory.
    """
    import torch

    torch._C._cuda_clearCublasWorkspaces()


def storage_use_count(t: Any) -> int:
    """How many tensors (and storage handles) share ``t``'s storage."""
    import torch

    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


def recover_generators() -> None:
    """Leave CUDA's random number generators usable after a capture that failed.

    torch 2.11 ends a failed capture without its generator epilogue, so each default CUDA generator
    stays in capture mode and the next random op outside a capture raises "Offset increment outside
    graph capture encountered unexpectedly" (pytorch/pytorch#171263). A fresh copy of each
    generator's state (same seed and offset, not capturing) puts that right.
    """
    import torch

    if not torch.cuda.is_available():
        return
    for generator in torch.cuda.default_generators:
        try:
            generator.graphsafe_set_state(generator.clone_state())
        except RuntimeError:  # NOTE: a device still capturing, or one torch never initialised
            pass


def fusion_symbol(name: str, executor: Any, fn: Callable[..., Any], inputs: Sequence[Any], outputs: Sequence[Any],
                  subsymbols: Sequence[Any] = ()) -> Any:
    """A bound symbol that calls ``fn`` under ``name`` in generated code (how thunder calls a region)."""
    from thunder.core.symbol import BoundSymbol, Symbol

    sym = Symbol(name, meta=None, is_fusion=True, executor=executor)
    return BoundSymbol(sym, tuple(inputs), {}, tuple(outputs), list(subsymbols), _call_ctx={name: fn})
