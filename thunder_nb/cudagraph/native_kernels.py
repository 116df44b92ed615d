"""PyTorch's own kernels where thunder's rules are slow: `native_convolution` (a convolution's backward as
``aten.convolution_backward``), `native_batch_norm` (a training BatchNorm as ``native_batch_norm`` and its backward),
`native_layer_norm`, `native_gelu`, `native_silu` and `native_sigmoid` (``native_layer_norm``, ``gelu``, ``silu``,
``sigmoid`` and their backward kernels).
`thunder_nb.cudagraph.executors.jit_executors` puts them before every other executor (the last four only where
no fusion executor is named)."""

from __future__ import annotations

import functools
from typing import Any

from .. import internals

__all__ = ["native_convolution", "native_batch_norm", "native_layer_norm", "native_gelu", "native_silu",
           "native_sigmoid"]


def _put_grads(*pairs: tuple[Any, Any]) -> None:
    """thunder's ``put_grad`` of each gradient whose tensor is there (a layer without a weight or a bias has none)."""
    from thunder.core.transforms import put_grad

    for tensor, grad in pairs:
        if tensor is not None:
            put_grad(tensor, grad)


@functools.cache  # NOTE: registered with thunder once
def native_convolution() -> Any:
    """An executor that gives thunder's convolutions PyTorch's own backward: ``aten.convolution_backward``.

    thunder 0.2.6 differentiates ``prims.convolution`` (every ``conv1d``/``conv2d``/``conv3d``) with its own rule.
    It computes the input's gradient as a stride-1 convolution over the output's gradient padded with zeros: a
    stride-2 convolution's becomes a convolution over four times the positions. The weight's gradient is one more
    convolution over transposed tensors, and both add pads, flips and permutes: on torchvision's resnet18
    training step the GPU spent about twice eager PyTorch's kernel time (bench/results/README.md, "Figures behind
    the defaults"). This executor claims ``prims.convolution``, runs its forward as
    thunder's torch executor does (``torch.convolution``), and differentiates it with the kernels eager PyTorch's
    autograd calls: ``aten.convolution_backward``, once for the input's gradient and once for the weight's and
    the bias's. Each call asks only for its own gradients, so a gradient nobody reads is never computed (thunder
    drops the call): the first layer's input gradient, for example.
    """
    import torch
    from thunder.core import prims
    from thunder.core.proxies import TensorProxy
    from thunder.core.transforms import get_grad, put_grad
    from thunder.extend import OperatorExecutor, register_executor

    ex = OperatorExecutor("thunder_nb_convolution", version=torch.__version__)
    register_executor(ex)

    def _backward(g, a, weight, bias_sizes, stride, padding, dilation, groups, mask):
        """``aten.convolution_backward`` with thunder's parameters, each as long as the convolution's rank."""
        rank = weight.ndim - 2
        stride, padding, dilation = ([*v] * rank if len(v) == 1 else [*v] for v in (stride, padding, dilation))
        return torch.ops.aten.convolution_backward(g, a, weight, bias_sizes, stride, padding, dilation, False,
                                                   [0] * rank, groups, mask)

    def _input_grad(g, a, weight, stride, padding, dilation, groups):
        return _backward(g, a, weight, None, stride, padding, dilation, groups, [True, False, False])[0]

    def _weight_grad(g, a, weight, has_bias, stride, padding, dilation, groups):
        _, gw, gb = _backward(g, a, weight, [weight.shape[0]] if has_bias else None, stride, padding, dilation, groups,
                              [False, True, has_bias])
        return gw, gb

    def _input_grad_meta(g, a, weight, stride, padding, dilation, groups):
        return TensorProxy(like=a)

    def _weight_grad_meta(g, a, weight, has_bias, stride, padding, dilation, groups):
        return TensorProxy(like=weight), (TensorProxy(like=weight, shape=(weight.shape[0],)) if has_bias else None)

    forward = ex.register_operator("thunder_nb_convolution", like=prims.convolution, fn=torch.convolution)
    input_grad = ex.register_operator("thunder_nb_convolution_input_grad", meta=_input_grad_meta, fn=_input_grad)
    weight_grad = ex.register_operator("thunder_nb_convolution_weight_grad", meta=_weight_grad_meta, fn=_weight_grad)

    def grad_transform(a, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
        out = forward(a, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
        g = get_grad(out)
        put_grad(a, input_grad(g, a, weight, stride, padding, dilation, groups))
        gw, gb = weight_grad(g, a, weight, bias is not None, stride, padding, dilation, groups)
        _put_grads((weight, gw), (bias, gb))
        return out

    def checker(a, weight, bias, stride, padding, dilation, transposed, output_padding, groups) -> bool:
        return not transposed  # NOTE: thunder's prims.convolution refuses transposed convolutions anyway

    ex.register_implementation(prims.convolution, forward, checker=checker, grad_transform=grad_transform)
    return ex


@functools.cache  # NOTE: registered with thunder once
def native_batch_norm() -> Any:
    """An executor that runs a training-mode ``batch_norm`` with PyTorch's own kernels, forward and backward.

    thunder 0.2.6 decomposes ``torch.nn.functional.batch_norm`` into a ``var_mean``, the normalisation, the affine
    step and the running statistics' update, each op a kernel, and differentiates that decomposition op by op: about
    ten kernels forward and fifteen backward per BatchNorm layer (resnet18 has 20). This executor claims
    ``ltorch.batch_norm`` in training mode with running statistics, and runs it as eager PyTorch's
    ``native_batch_norm`` does, in its functional form (``aten._native_batch_norm_legit_functional``: the normalised
    output, the batch's mean and inverse standard deviation, and the new running statistics). The running statistics
    are then written back with thunder's ``copy_`` (grad disabled, as in eager's kernel). The backward is
    ``aten.native_batch_norm_backward``. Evaluation mode, and a layer without running statistics, keep thunder's
    decomposition.
    """
    import thunder.torch as ltorch
    import torch
    from thunder.core import prims, utils
    from thunder.core.proxies import TensorProxy
    from thunder.core.transforms import get_grad
    from thunder.extend import OperatorExecutor, register_executor

    ex = OperatorExecutor("thunder_nb_batch_norm", version=torch.__version__)
    register_executor(ex)

    functional = internals.batch_norm_functional()

    def _forward(a, weight, bias, running_mean, running_var, momentum, eps):
        return functional(a, weight, bias, running_mean, running_var, True, momentum, eps)

    def _forward_meta(a, weight, bias, running_mean, running_var, momentum, eps):
        # NOTE: the batch's mean and inverse standard deviation come in the input's computation dtype (float32 for a
        # bfloat16 or float16 input), the running statistics in their own
        batch = utils.get_computation_dtype(a.dtype)
        return (TensorProxy(like=a), TensorProxy(like=running_mean, dtype=batch),
                TensorProxy(like=running_mean, dtype=batch), TensorProxy(like=running_mean),
                TensorProxy(like=running_var))

    def _backward(g, a, weight, save_mean, save_invstd, eps, has_weight):
        return torch.ops.aten.native_batch_norm_backward(g, a, weight, None, None, save_mean, save_invstd, True, eps,
                                                         [True, has_weight, has_weight])

    def _backward_meta(g, a, weight, save_mean, save_invstd, eps, has_weight):
        params = (TensorProxy(like=weight), TensorProxy(like=weight)) if has_weight else (None, None)
        return (TensorProxy(like=a), *params)

    forward = ex.register_operator("thunder_nb_batch_norm", meta=_forward_meta, fn=_forward)
    backward = ex.register_operator("thunder_nb_batch_norm_backward", meta=_backward_meta, fn=_backward)

    def normalised(a, running_mean, running_var, weight, bias, momentum, eps):
        """The output, the batch's mean and inverse standard deviation; the running statistics written back."""
        out, save_mean, save_invstd, new_mean, new_var = forward(a, weight, bias, running_mean, running_var, momentum,
                                                                 eps)
        # NOTE: grad disabled, as eager writes them (inside its kernel, no autograd): with grad enabled the write
        # read as the user's code writing a value that requires grad into a plain input (an InPlaceGradientWarning
        # for every BatchNorm trained under thunder-nb's executor)
        prims.copy_(new_mean, running_mean, grad_enabled=False)
        prims.copy_(new_var, running_var, grad_enabled=False)
        return out, save_mean, save_invstd

    def execution_transform(a, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1,
                            eps=1e-5):
        return normalised(a, running_mean, running_var, weight, bias, momentum, eps)[0]  # NOTE: no_grad, training mode

    def grad_transform(a, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
        out, save_mean, save_invstd = normalised(a, running_mean, running_var, weight, bias, momentum, eps)
        ga, gw, gb = backward(get_grad(out), a, weight, save_mean, save_invstd, eps, weight is not None)
        _put_grads((a, ga), (weight, gw), (bias, gb))
        return out

    def checker(a, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5) -> bool:
        # NOTE: weight and bias together or neither: the backward's mask asks for both gradients or none
        return (training is True and running_mean is not None and running_var is not None
                and (weight is None) == (bias is None) and isinstance(momentum, float) and isinstance(eps, float))

    ex.register_implementation(ltorch.batch_norm, checker=checker, execution_transform=execution_transform,
                               grad_transform=grad_transform)
    return ex


def is_floating(t: Any) -> bool:
    """Whether ``t`` is a tensor proxy of a floating dtype (float16, bfloat16, float32, float64): what PyTorch's
    normalisation, activation and mean kernels take (`native_tensor_ops` too)."""
    import torch
    from thunder.core.dtypes import to_torch_dtype
    from thunder.core.proxies import TensorProxy

    return isinstance(t, TensorProxy) and to_torch_dtype(t.dtype) in (torch.float16, torch.bfloat16, torch.float32,
                                                                        torch.float64)


@functools.cache  # NOTE: registered with thunder once
def native_layer_norm() -> Any:
    """An executor that runs ``layer_norm`` with PyTorch's own kernels, forward and backward.

    thunder 0.2.6 decomposes ``torch.nn.functional.layer_norm`` into ``var_mean``, ``rsqrt``, the normalisation and the
    affine step, and differentiates that decomposition op by op: on an H100, nanoGPT's training step ran 145 kernels
    for its 5 layer norms where eager PyTorch runs 20, 235 µs of GPU time against 37 µs
    (bench/results/2026-12-05-ddp-step-ops-h100.md). This executor claims ``ltorch.layer_norm`` and runs it as eager's
    autograd does: ``aten.native_layer_norm`` (the output, the mean and the inverse standard deviation), then
    ``aten.native_layer_norm_backward``, asked only for the gradients that exist (none for a missing weight or bias).
    A call its kernels cannot take (a ``normalized_shape`` that is not a tuple or list of ints matching the input's
    last dimensions and the weight's shape, a dtype other than a floating one, a weight of another dtype or device)
    keeps thunder's decomposition.
    """
    import thunder.torch as ltorch
    import torch
    from thunder.core import utils
    from thunder.core.proxies import TensorProxy
    from thunder.core.transforms import get_grad
    from thunder.extend import OperatorExecutor, register_executor

    ex = OperatorExecutor("thunder_nb_layer_norm", version=torch.__version__)
    register_executor(ex)

    def _forward_meta(a, normalized_shape, weight, bias, eps):
        # NOTE: the statistics as the kernel returns them on the input's device (torch._refs.native_layer_norm): in the
        # input's dtype on the CPU, in its computation dtype elsewhere (float32 for a bfloat16 or float16 input)
        dtype = a.dtype if a.device.type == "cpu" else utils.get_computation_dtype(a.dtype)
        shape = tuple(a.shape[:a.ndim - len(normalized_shape)]) + (1,) * len(normalized_shape)
        return TensorProxy(like=a), TensorProxy(like=a, shape=shape, dtype=dtype), TensorProxy(like=a, shape=shape,
                                                                                                dtype=dtype)

    def _backward(g, a, normalized_shape, mean, rstd, weight, bias):
        return torch.ops.aten.native_layer_norm_backward(g, a, normalized_shape, mean, rstd, weight, bias,
                                                         [True, weight is not None, bias is not None])

    def _backward_meta(g, a, normalized_shape, mean, rstd, weight, bias):
        return (TensorProxy(like=a), None if weight is None else TensorProxy(like=weight),
                None if bias is None else TensorProxy(like=bias))

    forward = ex.register_operator("thunder_nb_layer_norm", meta=_forward_meta, fn=torch.ops.aten.native_layer_norm)
    backward = ex.register_operator("thunder_nb_layer_norm_backward", meta=_backward_meta, fn=_backward)

    def execution_transform(a, normalized_shape, weight=None, bias=None, eps=1e-5):
        return forward(a, normalized_shape, weight, bias, eps)[0]  # NOTE: no_grad

    def grad_transform(a, normalized_shape, weight=None, bias=None, eps=1e-5):
        out, mean, rstd = forward(a, normalized_shape, weight, bias, eps)
        ga, gw, gb = backward(get_grad(out), a, normalized_shape, mean, rstd, weight, bias)
        _put_grads((a, ga), (weight, gw), (bias, gb))
        return out

    def checker(a, normalized_shape, weight=None, bias=None, eps=1e-5) -> bool:
        # NOTE: thunder's layer_norm takes the normalised shape from the weight where they differ (a sharded
        # parameter's); such a call stays thunder's
        if not (is_floating(a) and isinstance(normalized_shape, (tuple, list)) and 1 <= len(normalized_shape) <= a.ndim
                and all(type(n) is int for n in normalized_shape) and type(eps) in (int, float)):
            return False
        shape = tuple(normalized_shape)
        return tuple(a.shape[a.ndim - len(shape):]) == shape and all(
            isinstance(t, TensorProxy) and tuple(t.shape) == shape and t.dtype == a.dtype and t.device == a.device
            for t in (weight, bias) if t is not None)

    ex.register_implementation(ltorch.layer_norm, checker=checker, execution_transform=execution_transform,
                               grad_transform=grad_transform)
    return ex


@functools.cache  # NOTE: registered with thunder once
def native_gelu() -> Any:
    """An executor that runs ``gelu`` with PyTorch's own kernels, forward and backward.

    thunder 0.2.6 differentiates ``torch.nn.functional.gelu`` through its decomposition (``erf``, or ``tanh`` and a
    cube for ``approximate="tanh"``), op by op: on an H100, nanoGPT's training step ran 52 kernels for its gelu where
    eager PyTorch runs 6, 59 µs of GPU time against 7 µs (bench/results/2026-12-05-ddp-step-ops-h100.md). This
    executor claims ``ltorch.gelu`` (``approximate`` "none" or "tanh", a floating dtype) and runs
    ``torch.nn.functional.gelu`` forward and ``aten.gelu_backward`` backward, as eager's autograd does.
    """
    import thunder.torch as ltorch
    import torch
    from thunder.core.proxies import TensorProxy
    from thunder.core.transforms import get_grad, put_grad
    from thunder.extend import OperatorExecutor, register_executor

    ex = OperatorExecutor("thunder_nb_gelu", version=torch.__version__)
    register_executor(ex)

    def _backward(g, a, approximate):
        return torch.ops.aten.gelu_backward(g, a, approximate=approximate)

    def _backward_meta(g, a, approximate):
        return TensorProxy(like=a)

    forward = ex.register_operator("thunder_nb_gelu", like=ltorch.gelu, fn=torch.nn.functional.gelu)
    backward = ex.register_operator("thunder_nb_gelu_backward", meta=_backward_meta, fn=_backward)

    def grad_transform(a, *, approximate="none"):
        out = forward(a, approximate=approximate)
        put_grad(a, backward(get_grad(out), a, approximate))
        return out

    def checker(a, *, approximate="none") -> bool:
        return is_floating(a) and approximate in ("none", "tanh")

    ex.register_implementation(ltorch.gelu, forward, checker=checker, grad_transform=grad_transform)
    return ex


@functools.cache  # NOTE: registered with thunder once
def native_silu() -> Any:
    """An executor that runs ``silu`` with PyTorch's own kernels, forward and backward.

    thunder 0.2.6 differentiates ``torch.nn.functional.silu`` (a llama MLP's activation) through its decomposition,
    ``a * sigmoid(a)`` with ``sigmoid`` an ``exp``, an add and a reciprocal, op by op: a kernel each, forward and
    backward, where eager PyTorch runs ``silu`` and ``silu_backward`` (on the CPU, the zoo's 2-layer llama2 step ran
    26 kernels for its two silu calls against eager's 6: bench/results/2026-12-05-step-ops-cpu.md). This executor
    claims ``ltorch.silu`` (out of place, a floating dtype) and runs ``torch.nn.functional.silu`` forward and
    ``aten.silu_backward`` backward, as eager's autograd does.
    """
    import thunder.torch as ltorch
    import torch

    def checker(a, inplace=False) -> bool:
        return is_floating(a) and inplace is False

    return _elementwise_executor("thunder_nb_silu", ltorch.silu, torch.nn.functional.silu,
                                 torch.ops.aten.silu_backward, reads_output=False, checker=checker)


@functools.cache  # NOTE: registered with thunder once
def native_sigmoid() -> Any:
    """An executor that runs ``sigmoid`` with PyTorch's own kernels, forward and backward.

    thunder 0.2.6 writes ``torch.sigmoid`` as ``1 / (1 + exp(-a))`` and differentiates that op by op: for an input
    below about -88 ``exp(-a)`` overflows float32 and the gradient is ``inf / inf``, NaN, where eager's
    ``sigmoid_backward`` (``g * (1 - out) * out``) gives 0 (found by the CPU fuzzer: program 440 of
    ``bench/fuzz.py``, a sigmoid of a product with a dot product). This executor claims ``ltorch.sigmoid`` (a floating
    dtype) and runs ``torch.sigmoid`` forward and ``aten.sigmoid_backward`` on its output backward, as eager's autograd
    does.
    """
    import thunder.torch as ltorch
    import torch

    return _elementwise_executor("thunder_nb_sigmoid", ltorch.sigmoid, torch.sigmoid, torch.ops.aten.sigmoid_backward,
                                 reads_output=True, checker=is_floating)


def _elementwise_executor(name: str, sym: Any, forward_fn: Any, backward_fn: Any, *, reads_output: bool,
                          checker: Any) -> Any:
    """An executor named ``name`` that claims the elementwise ``sym`` where ``checker`` says, and runs ``forward_fn``
    forward and ``backward_fn(grad, out if reads_output else a)`` backward (PyTorch's ``*_backward`` kernel, as
    eager's autograd calls it): `native_silu`'s and `native_sigmoid`'s."""
    import torch
    from thunder.core.proxies import TensorProxy
    from thunder.core.transforms import get_grad, put_grad
    from thunder.extend import OperatorExecutor, register_executor

    ex = OperatorExecutor(name, version=torch.__version__)
    register_executor(ex)

    def _backward_meta(g, saved):
        return TensorProxy(like=saved)

    forward = ex.register_operator(name, like=sym, fn=forward_fn)
    backward = ex.register_operator(f"{name}_backward", meta=_backward_meta, fn=backward_fn)

    def grad_transform(a, *args, **kwargs):
        # NOTE: ``args`` and ``kwargs`` are what the checker took (silu's ``inplace=False``): the forward needs none
        out = forward(a)
        put_grad(a, backward(get_grad(out), out if reads_output else a))
        return out

    ex.register_implementation(sym, forward, checker=checker, grad_transform=grad_transform)
    return ex
