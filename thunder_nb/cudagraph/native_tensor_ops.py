"""PyTorch's own kernels for tensor ops thunder differentiates op by op: `native_mean`, `native_unbind` and
`native_stack`.
`thunder_nb.cudagraph.executors.jit_executors` puts them before thunder's defaults where no fusion executor is named,
as it does `native_kernels.native_silu`."""

from __future__ import annotations

import functools
import math
from typing import Any

from .native_kernels import is_floating

__all__ = ["native_mean", "native_unbind", "native_stack"]


def _reduced_dims(ndim: int, dim: Any) -> tuple[int, ...] | None:
    """The dimensions ``mean(a, dim)`` reduces, each in ``range(ndim)`` and sorted; ``None`` for a ``dim`` that is not
    ``None``, an int or a sequence of ints (a number proxy, for one: thunder's own path takes it)."""
    if dim is None or (isinstance(dim, (tuple, list)) and not dim):
        return tuple(range(ndim))
    dims = (dim,) if type(dim) is int else tuple(dim) if isinstance(dim, (tuple, list)) else None
    if dims is None or not all(type(d) is int and -max(ndim, 1) <= d < max(ndim, 1) for d in dims):
        return None
    return tuple(sorted({d % max(ndim, 1) for d in dims})) if ndim else ()


def _mean_backward(g: Any, shape: tuple[int, ...], dims: tuple[int, ...], keepdim: bool, n: int) -> Any:
    """Eager's ``mean_backward``: the gradient unsqueezed where ``keepdim`` dropped a dimension, expanded to the input's
    shape and divided by the number of elements each mean averaged, one kernel."""
    if not keepdim:
        for d in dims:
            g = g.unsqueeze(d)
    return g.expand(shape) / n


@functools.cache  # NOTE: registered with thunder once
def native_mean() -> Any:
    """An executor that runs ``mean`` with PyTorch's own kernel, and its gradient as eager's autograd computes it.

    thunder 0.2.6 writes ``torch.mean`` as a sum and a division (a kernel each, and a copy where the dtype is kept),
    and its gradient as a division, unsqueezes and an expand, where eager runs one kernel each way. A llama's
    RMSNorm calls ``x.pow(2).mean(-1, keepdim=True)`` once a norm: on the CPU the zoo's 2-layer llama2 step ran 35
    kernels for its 5 means against eager's 20 (bench/results/2026-12-06-step-ops-llama2-cpu.md). This executor
    claims ``ltorch.mean`` (a floating dtype, no ``dtype=``, ``dim`` None, an int or ints) and runs ``torch.mean``
    forward and eager's ``mean_backward`` (`_mean_backward`) backward.
    """
    import thunder.torch as ltorch
    import torch
    from thunder.core.proxies import TensorProxy
    from thunder.core.transforms import get_grad, put_grad
    from thunder.extend import OperatorExecutor, register_executor

    ex = OperatorExecutor("thunder_nb_mean", version=torch.__version__)
    register_executor(ex)

    def _backward_meta(g, shape, dims, keepdim, n):
        return TensorProxy(like=g, shape=tuple(shape))

    forward = ex.register_operator("thunder_nb_mean", like=ltorch.mean, fn=torch.mean)
    backward = ex.register_operator("thunder_nb_mean_backward", meta=_backward_meta, fn=_mean_backward)

    def grad_transform(a, dim=None, keepdim=False, *, dtype=None):
        out = forward(a, dim, keepdim)
        dims = _reduced_dims(a.ndim, dim)
        n = math.prod(a.shape[d] for d in dims)
        put_grad(a, backward(get_grad(out), tuple(a.shape), dims, bool(keepdim), n))
        return out

    def execution_transform(a, dim=None, keepdim=False, *, dtype=None):
        return forward(a, dim, keepdim)

    def checker(a, dim=None, keepdim=False, *, dtype=None) -> bool:
        return (is_floating(a) and dtype is None and type(keepdim) is bool and _reduced_dims(a.ndim, dim) is not None
                and all(type(s) is int for s in a.shape))

    ex.register_implementation(ltorch.mean, checker=checker, execution_transform=execution_transform,
                               grad_transform=grad_transform)
    return ex


@functools.cache  # NOTE: registered with thunder once
def native_unbind() -> Any:
    """An executor that runs ``unbind`` as PyTorch does: views forward, one ``stack`` of the gradients backward.

    thunder 0.2.6 writes ``torch.unbind`` as slices and squeezes, and differentiates each slice by padding its gradient
    with zeros to the input's shape (a fill and a copy each), then adds the padded gradients. A llama's rotary
    embedding unbinds its query and key into real and imaginary halves (thunder's bundled llama2: ``xq.float()
    .reshape(..., -1, 2).unbind(-1)``): on the CPU the zoo's 2-layer llama2 step ran 28 kernels for its 4 unbinds
    against eager's 12 (bench/results/2026-12-06-step-ops-llama2-cpu.md). This executor claims ``ltorch.unbind`` (an
    int ``dim``) and runs ``torch.unbind`` forward (views of the input, no kernel, as thunder's slices are) and eager's
    ``unbind_backward``, ``torch.stack`` of the gradients, backward.
    """
    import thunder.torch as ltorch
    import torch
    from thunder.core.proxies import TensorProxy
    from thunder.core.transforms import get_grad, put_grad
    from thunder.extend import OperatorExecutor, register_executor

    ex = OperatorExecutor("thunder_nb_unbind", version=torch.__version__)
    register_executor(ex)

    forward = ex.register_operator("thunder_nb_unbind", like=ltorch.unbind, fn=torch.unbind)
    backward = ex.register_operator("thunder_nb_unbind_backward", like=ltorch.stack, fn=torch.stack)

    def grad_transform(a, dim=0):
        outs = forward(a, dim)
        put_grad(a, backward([get_grad(o) for o in outs], dim))
        return outs

    def checker(a, dim=0) -> bool:
        return isinstance(a, TensorProxy) and a.ndim > 0 and type(dim) is int and -a.ndim <= dim < a.ndim

    ex.register_implementation(ltorch.unbind, forward, checker=checker, grad_transform=grad_transform)
    return ex


@functools.cache  # NOTE: registered with thunder once
def native_stack() -> Any:
    """An executor that runs ``stack`` as PyTorch does: one kernel forward, views of the gradient backward.

    thunder 0.2.6 writes ``torch.stack`` as an unsqueeze of each tensor and a ``cat``, and differentiates each unsqueeze
    as a broadcast: a ``sum`` over the new dimension of size 1, a copy kernel per stacked tensor. A llama's rotary
    embedding stacks its real and imaginary halves back (thunder's bundled llama2: ``torch.stack([xq_out_r,
    xq_out_i], dim=-1)``): 4 such copies a layer. This executor claims ``ltorch.stack`` (tensors of one shape, dtype
    and device, an int ``dim``) and runs ``torch.stack`` forward and eager's ``stack`` backward, ``torch.unbind`` of the
    gradient: views, no kernel.
    """
    import thunder.torch as ltorch
    import torch
    from thunder.core.proxies import TensorProxy
    from thunder.core.transforms import get_grad, put_grad
    from thunder.extend import OperatorExecutor, register_executor

    ex = OperatorExecutor("thunder_nb_stack", version=torch.__version__)
    register_executor(ex)

    forward = ex.register_operator("thunder_nb_stack", like=ltorch.stack, fn=torch.stack)
    backward = ex.register_operator("thunder_nb_stack_backward", like=ltorch.unbind, fn=torch.unbind)

    def grad_transform(tensors, dim=0):
        out = forward(tensors, dim)
        for t, g in zip(tensors, backward(get_grad(out), dim)):
            put_grad(t, g)
        return out

    def checker(tensors, dim=0) -> bool:
        if not (isinstance(tensors, (tuple, list)) and tensors and all(isinstance(t, TensorProxy) for t in tensors)):
            return False
        first = tensors[0]
        return (all(tuple(t.shape) == tuple(first.shape) and t.dtype == first.dtype and t.device == first.device
                    for t in tensors) and type(dim) is int and -first.ndim - 1 <= dim <= first.ndim)

    ex.register_implementation(ltorch.stack, forward, checker=checker, grad_transform=grad_transform)
    return ex
