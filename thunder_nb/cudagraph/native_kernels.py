"""PyTorch's own kernels where thunder's rules are slow: `native_convolution` (a convolution's backward as
``aten.convolution_backward``) and `native_batch_norm` (a training BatchNorm as ``native_batch_norm`` and its backward).
`thunder_nb.cudagraph.executors.jit_executors` puts them before every other executor."""

from __future__ import annotations

import functools
from typing import Any

from .. import internals

__all__ = ["native_convolution", "native_batch_norm"]


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
        put_grad(weight, gw)
        if bias is not None:
            put_grad(bias, gb)
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
    are then written back with thunder's ``copy_``, as its decomposition writes them. The backward is
    ``aten.native_batch_norm_backward``. Evaluation mode, and a layer without running statistics, keep thunder's
    decomposition.
    """
    import thunder.torch as ltorch
    import torch
    from thunder.core import prims, utils
    from thunder.core.proxies import TensorProxy
    from thunder.core.transforms import get_grad, put_grad
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
        prims.copy_(new_mean, running_mean, grad_enabled=True)
        prims.copy_(new_var, running_var, grad_enabled=True)
        return out, save_mean, save_invstd

    def execution_transform(a, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1,
                            eps=1e-5):
        return normalised(a, running_mean, running_var, weight, bias, momentum, eps)[0]  # NOTE: no_grad, training mode

    def grad_transform(a, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
        out, save_mean, save_invstd = normalised(a, running_mean, running_var, weight, bias, momentum, eps)
        ga, gw, gb = backward(get_grad(out), a, weight, save_mean, save_invstd, eps, weight is not None)
        put_grad(a, ga)
        if weight is not None:
            put_grad(weight, gw)
        if bias is not None:
            put_grad(bias, gb)
        return out

    def checker(a, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5) -> bool:
        # NOTE: weight and bias together or neither: the backward's mask asks for both gradients or none
        return (training is True and running_mean is not None and running_var is not None
                and (weight is None) == (bias is None) and isinstance(momentum, float) and isinstance(eps, float))

    ex.register_implementation(ltorch.batch_norm, checker=checker, execution_transform=execution_transform,
                               grad_transform=grad_transform)
    return ex
