"""PyTorch's own kernels, and eager autograd's rules, for tensor ops thunder differentiates op by op: `native_mean`,
`native_unbind` and `native_broadcast`.
`thunder_nb.cudagraph.executors.jit_executors` puts them before thunder's defaults where no fusion executor is named,
as it does `native_kernels.native_silu`."""

from __future__ import annotations

import functools
import math
from typing import Any

from .. import internals
from .native_kernels import is_floating

__all__ = ["native_mean", "native_unbind", "native_broadcast"]


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


def _expanded_dims(a_shape: tuple[int, ...], shape: tuple[int, ...], broadcast_dimensions: tuple[int, ...]
                   ) -> tuple[int, ...]:
    """The dimensions of ``broadcast_in_dim(a, shape, broadcast_dimensions)`` that repeat ``a``: new ones and those
    where ``a`` has size 1, each of size above 1 in ``shape`` (a dimension of size 1 repeats nothing)."""
    kept = {d for i, d in enumerate(broadcast_dimensions) if a_shape[i] != 1}
    return tuple(d for d, n in enumerate(shape) if d not in kept and n != 1)


@functools.cache  # NOTE: registered with thunder once
def native_broadcast() -> Any:
    """An executor that differentiates a broadcast as eager's autograd does: a sum over the dimensions it repeats only.

    thunder 0.2.6 differentiates ``prims.broadcast_in_dim`` (which every ``unsqueeze``, ``expand``, ``x[:, None]``,
    ``stack`` and implicit broadcast becomes) with a ``sum`` over every dimension it adds, those of size 1 included:
    an ``unsqueeze``'s gradient is a sum over one element per output, a copy kernel. A llama's rotary embedding stacks
    its halves back (an unsqueeze each) and its grouped-query attention repeats the keys and values through
    ``x[:, :, :, None, :].expand(...)``: 6 such copies a layer of thunder's bundled llama2. Eager's rules (``expand``:
    ``sum_to_size``; ``unsqueeze``: ``squeeze``) sum only over the dimensions an expand repeats and view the rest. This
    executor claims ``prims.broadcast_in_dim`` (int shapes) and runs its forward as thunder's torch executor does (the
    same ``unsqueeze`` and ``expand`` views in the trace), and its backward as a ``sum`` over the repeated dimensions
    (`_expanded_dims`), when there are any, and a ``reshape`` to the input's shape: the values thunder's rule gives,
    without the copies.
    """
    import thunder.torch as ltorch
    import torch
    from thunder.core import prims
    from thunder.core.proxies import TensorProxy
    from thunder.core.transforms import get_grad, put_grad
    from thunder.extend import OperatorExecutor, register_executor

    ex = OperatorExecutor("thunder_nb_broadcast", version=torch.__version__)
    register_executor(ex)
    forward = internals.torch_executor_transform(prims.broadcast_in_dim)

    def grad_transform(a, shape, broadcast_dimensions):
        out = forward(a, shape, broadcast_dimensions)
        g = get_grad(out)
        repeated = _expanded_dims(tuple(a.shape), tuple(shape), tuple(broadcast_dimensions))
        put_grad(a, ltorch.reshape(ltorch.sum(g, repeated) if repeated else g, tuple(a.shape)))
        return out

    def checker(a, shape, broadcast_dimensions) -> bool:
        return isinstance(a, TensorProxy) and all(type(n) is int for n in (*a.shape, *shape))

    ex.register_implementation(prims.broadcast_in_dim, checker=checker, execution_transform=forward,
                               grad_transform=grad_transform)
    return ex
