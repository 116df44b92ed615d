"""The executors' private parts: a fusion's callable, an executor's implementations, thunder's backward rules, its sdpa
executor's functions, inductor's kernel count, torch's functional batch norm, the torch executor's transform of a
prim."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .version import supported

__all__ = ["fusion_callable", "wrap_fusion_callable", "set_implementations", "grad_rules", "sdpa_implementation",
           "inductor_kernel_count", "batch_norm_functional", "torch_executor_transform"]


def fusion_callable(bsym: Any) -> Callable[..., Any] | None:
    """The callable a fusion bound symbol runs under its own name (None: not a fusion)."""
    return (getattr(bsym, "_call_ctx", None) or {}).get(bsym.sym.name)


def wrap_fusion_callable(bsym: Any, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Make the fusion bound symbol ``bsym`` run ``wrap(f)`` in place of its callable ``f``."""
    name = bsym.sym.name
    bsym._call_ctx = {name: wrap(bsym._call_ctx[name])}


def set_implementations(ex: Any, implmap: dict[Any, Any]) -> bool:
    """Give the executor ``ex`` these implementations (its ``implmap``, which thunder exposes read-only); whether it
    did. False on a thunder thunder-nb does not support (`supported`): ``ex`` is left as it was made, and the caller
    takes thunder's own executor instead."""
    if not supported():
        return False
    ex._implmap = implmap
    return True


def grad_rules() -> dict[Any, Any]:
    """thunder's own backward rules by symbol id (``thunder.core.transforms._grad_fn_map``)."""
    from thunder.core.transforms import _grad_fn_map

    return _grad_fn_map


def sdpa_implementation() -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """thunder's sdpa executor's (checker, execution transform, grad transform) of fused attention."""
    from thunder.executors import sdpaex

    return (sdpaex._scaled_dot_product_attention_checker, sdpaex._scaled_dot_product_attention_fused,
            sdpaex._scaled_dot_product_attention_grad)


def inductor_kernel_count() -> int | None:
    """How many kernels inductor has generated in this process (None: torch has no such metric)."""
    try:
        from torch._inductor import metrics
    except ImportError:
        return None
    return metrics.generated_kernel_count


def batch_norm_functional() -> Any:
    """``aten._native_batch_norm_legit_functional``: a training batch norm that returns its new running statistics."""
    import torch

    return torch.ops.aten._native_batch_norm_legit_functional


def torch_executor_transform(sym: Any) -> Callable[..., Any]:
    """thunder's torch executor's execution transform of the symbol ``sym`` (for ``prims.broadcast_in_dim``: its
    ``unsqueeze`` and ``expand`` calls)."""
    from thunder.executors.torchex import ex

    return ex.implmap[sym.id].execution_transform
