"""Tensors and the memory a graph writes: copies in few launches, memory use counts for the held-guard, storage
handles, cuBLAS's workspaces, a graph pool's size, and CUDA's generators and stream after a capture that failed."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from .version import supported

__all__ = ["copy_all", "copy_into", "clear_cublas_workspaces", "storage_use_count", "data_ptrs_equal",
           "recover_generators", "current_stream", "recover_stream", "recover_capture", "graph_pool_bytes",
           "use_counters", "storage_handle", "is_view", "version_counter"]


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
    """``targets[i].copy_(sources[i])`` for each i, in one ``torch._foreach_copy_`` (a few kernel launches, not one
    each).

    Where autograd would record a copy, and on a torch thunder-nb does not support (`supported`), each is a
    ``copy_`` of its own.
    """
    import torch

    if len(targets) < 2 or (torch.is_grad_enabled() and any(t.requires_grad for t in sources)) or not supported():
        for t, s in zip(targets, sources):
            t.copy_(s)
        return
    torch._foreach_copy_(list(targets), list(sources))


def clear_cublas_workspaces() -> None:
    """Drop cuBLAS's per-stream workspaces, so that the next matmul allocates a fresh one.

    Called right before and after recording a graph: the workspace the recording allocates then lies
    in the graph's private pool, which lives as long as the graph. Without it the graph records a
    workspace from the ordinary allocator that anyone may free later (torch.compile's CUDA-graph
    trees clear these workspaces when they record), and a replay then writes freed memory.
    """
    import torch

    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)  # NOTE: a torch without it: nothing to drop
    if clear is not None:
        clear()


def storage_use_count(t: Any) -> int:
    """How many tensors (and storage handles) share ``t``'s storage, as `use_counters` reads it (on an unsupported
    torch, a number that never repeats)."""
    return use_counters()[0](storage_handle(t))


def data_ptrs_equal(tensors: list[Any], ptrs: list[int | None], indices: list[int]) -> bool:
    """Whether ``tensors[i].data_ptr() == ptrs[i]`` for each i in ``indices``, in one C call (as torch.compile's
    CUDA-graph trees check their static inputs)."""
    import torch

    return torch._C._tensors_data_ptrs_at_indices_equal(tensors, ptrs, indices)


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


def current_stream() -> Any:
    """The current CUDA stream, or None where CUDA is not initialised (nothing to put back then but the default)."""
    import torch

    return torch.cuda.current_stream() if torch.cuda.is_available() and torch.cuda.is_initialized() else None


def recover_stream(stream: Any = None) -> None:
    """Make ``stream`` current again after a capture that failed (the device's default stream for None).

    ``torch.cuda.graph.__exit__`` (torch 2.11) ends the capture before it leaves its stream context: when
    ``capture_end`` raises ("operation failed due to a previous error during capture", after an ``.item()`` inside
    the capture, say), the capture's side stream stays current, and every later op of the thread runs on it:
    eager steps after a failed capture warned that AccumulateGrad's stream did not match, and their timings ran
    on that stream.
    """
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return
    target = stream if stream is not None else torch.cuda.default_stream()
    if torch.cuda.current_stream() != target:
        torch.cuda.set_stream(target)


def recover_capture(stream: Any = None) -> None:
    """After a capture that failed: the generators (`recover_generators`) and ``stream`` current again
    (`recover_stream`; the device's default stream for None)."""
    recover_generators()
    recover_stream(stream)


def graph_pool_bytes(graph: Any) -> int | None:
    """The bytes of the segments the caching allocator holds in ``graph``'s private pool (its outputs and
    intermediates), read as torch.compile's CUDA-graph trees read them (``segment_pool_id``); None without a pool."""
    pool = getattr(graph, "pool", None)
    if pool is None:
        return None
    import torch

    pid = tuple(pool())
    return sum(s["total_size"] for s in torch.cuda.memory_snapshot() if tuple(s.get("segment_pool_id", ())) == pid)


def use_counters() -> tuple[Callable[[int], int], Callable[[Any], int]]:
    """torch's C functions that count the users of memory, for the replay guards' C loops: (a storage's use count by
    its handle, `storage_handle`; a tensor object's C++ use count).

    On a thunder or torch thunder-nb does not support (`supported` False) there are no counts to trust, and the safe
    answer is that memory handed out is never free again: each function then returns a number that never repeats,
    so that an instance compares its counts with what it settled, finds them changed, and reads as held for good
    (``thunder_nb.cudagraph.instances.Instance.held``). A replay then never writes memory it handed out: the runner
    records another instance, and past its bounds runs the region without a graph (fresh memory each call). The
    hand-out guards nothing there either (`thunder_nb.cudagraph.handout`): what it would guard, the tensors saved for
    the backward, is copied out with what is returned, so no instance is left watching memory it handed out.
    """
    if not supported():
        fresh = itertools.count()
        return (lambda _: next(fresh)), (lambda _: next(fresh))
    import torch

    return torch._C._storage_Use_Count, torch.Tensor._use_count


def storage_handle(t: Any) -> int:
    """The handle of ``t``'s storage that `use_counters`' first function reads (``untyped_storage()._cdata``)."""
    return t.untyped_storage()._cdata


def is_view(t: Any) -> bool:
    """Whether the tensor ``t`` is a view of another (``t._base``)."""
    return t._base is not None


def version_counter(t: Any) -> int:
    """The tensor ``t``'s version counter (``t._version``): an in-place update of it, or of a view of it, moves it."""
    return t._version

