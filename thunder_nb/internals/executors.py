"""The executors' private parts: a fusion's callable, an executor's implementations, thunder's backward rules, its sdpa
executor's functions, inductor's kernel count, torch's functional batch norm, the torch executor's transform of a
prim."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .version import supported

__all__ = ["fusion_callable", "wrap_fusion_callable", "set_implementations", "grad_rules", "sdpa_implementation",
           "sdpa_grad_in_its_dtype", "inductor_kernel_count", "batch_norm_functional", "torch_executor_transform"]


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


def sdpa_implementation() -> tuple[Callable[..., Any], Callable[..., Any]]:
    """thunder's sdpa executor's (checker, execution transform) of fused attention."""
    from thunder.executors import sdpaex

    return sdpaex._scaled_dot_product_attention_checker, sdpaex._scaled_dot_product_attention_fused


def sdpa_grad_in_its_dtype(query: Any, key: Any, value: Any, attn_mask: Any, dropout_p: float = 0.0,
                           is_causal: bool = False, *, scale: float | None = None) -> Any:
    """thunder's sdpa executor's grad transform (its fused attention, forward and backward), with the gradient that
    reaches the attention's output cast to that output's dtype first, as PyTorch's autograd casts it.

    thunder 0.2.6 hands the backward kernel the gradient as it comes: under ``torch.autocast`` the attention runs in
    bfloat16 and its output's gradient can arrive in float32, and the kernel refuses it ("query and dout must have the
    same dtype"). A backend other than flash and memory-efficient attention goes to thunder's own transform (which
    says what it cannot do).
    """
    import thunder.torch as ltorch
    from thunder.core.transforms import get_grad, put_grad, put_grads
    from thunder.executors import sdpaex

    backend = sdpaex._fused_sdp_choice(query, key, value, attn_mask, dropout_p, is_causal, scale)
    flash = backend == sdpaex.SpdaBackend.FLASH_ATTENTION
    if not flash and backend != sdpaex.SpdaBackend.MEMORY_EFFICIENT:
        return sdpaex._scaled_dot_product_attention_grad(query, key, value, attn_mask, dropout_p, is_causal,
                                                         scale=scale)

    def incoming(out: Any) -> Any:
        g = get_grad(out)
        return g if g.dtype == out.dtype else ltorch.to(g, out.dtype)

    qkv = (query, key, value)
    if flash:
        out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = sdpaex.sdpfa_gradfwd(*qkv, dropout_p, is_causal,
                                                                                      scale=scale)
        grads = sdpaex.sdpfa_bwd(incoming(out), *qkv, out, lse, cum_q, cum_k, max_q, max_k, dropout_p, is_causal,
                                 seed, offset, scale=scale)
    else:
        out, lse, seed, offset = sdpaex.sdpea_gradfwd(*qkv, attn_mask, dropout_p, is_causal, scale=scale)
        *grads, grad_mask = sdpaex.sdpea_bwd(incoming(out), *qkv, attn_mask, out, lse, seed, offset, dropout_p,
                                             is_causal, scale=scale)
        if attn_mask is not None:
            put_grad(attn_mask, grad_mask)
    put_grads(qkv, tuple(grads[:3]))
    return out


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
