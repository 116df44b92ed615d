"""`thunder_nb.jit` runs convolutions' backward, training BatchNorm, layer_norm, gelu, silu, mean and unbind with
PyTorch's kernels, and differentiates broadcasts as eager does.

`executors.native_convolution`: thunder 0.2.6's own rule computes a strided convolution's input gradient over the
output gradient padded with zeros (four times the positions at stride 2) and adds pads, flips and permutes.
`executors.native_batch_norm`: thunder decomposes a training BatchNorm into about ten kernels forward and fifteen
backward. On the H200 resnet18's training step ran 2.3x eager's kernel time. `executors.native_layer_norm` and
`executors.native_gelu` (and `executors.native_silu`, a llama MLP's, and `executors.native_sigmoid`, whose
decomposition's gradient is NaN far below zero): thunder differentiates their decompositions op by op (on an H100
nanoGPT's step ran 197 kernels for them where eager runs 26); a fusion executor keeps them.
`native_tensor_ops.native_mean`, `native_unbind` and `native_broadcast` (a llama's RMSNorm, rotary embedding and
grouped-query attention): thunder writes mean as a sum and a division, pads each unbound half's gradient with zeros and
sums the gradient of each unsqueeze over its new dimension of size 1. These
tests run real thunder traces on the CPU: gradients, outputs and running statistics are bit for bit eager's (a whole
model's within float32's tolerance, where thunder's attention and cross_entropy run), the traces hold PyTorch's calls
and none of thunder's rewrites, and a gradient nobody reads is never computed.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import thunder
import thunder_nb
from thunder_nb.cudagraph.executors import (executor_list, jit_executors, native_batch_norm, native_broadcast,
                                            native_convolution, native_gelu, native_layer_norm, native_mean,
                                            native_sigmoid, native_silu, native_unbind)
from thunder_nb.diagnosis.judge import EXACT, assert_equal
from thunder_nb.fix import EagerFallbackWarning
from thunder_nb.internals import build_traces, grads

CONVOLUTIONS = {
    "conv1d, stride 2": (lambda: torch.nn.Conv1d(3, 5, 3, stride=2), (2, 3, 11)),
    "conv2d, stride 2, padding 3, no bias": (lambda: torch.nn.Conv2d(3, 8, 7, stride=2, padding=3, bias=False),
                                             (2, 3, 17, 17)),
    "conv2d, padding 'same', dilation 2, groups 2": (
        lambda: torch.nn.Conv2d(4, 8, 3, padding="same", dilation=2, groups=2), (2, 4, 9, 9)),
    "conv2d, stride (2, 1), padding (1, 0)": (lambda: torch.nn.Conv2d(4, 6, 3, stride=(2, 1), padding=(1, 0)),
                                              (1, 4, 8, 8)),
    "conv3d, padding 1": (lambda: torch.nn.Conv3d(2, 4, 3, padding=1), (1, 2, 5, 5, 5)),
}


def _flat(bsyms, *, fusions: bool = False) -> list:
    """The bound symbols, those inside the fixed transform's regions (``CUDAGraphN``) included, and with ``fusions``
    those inside a fusion executor's groups too."""
    flat = []
    for b in bsyms:
        inside = b.sym.name.startswith("CUDAGraph") or (fusions and b.sym.is_fusion)
        flat += _flat(b.subsymbols, fusions=fusions) if inside else [b]
    return flat


def _ops(bsyms, *, fusions: bool = False) -> list[str]:
    """The ops' names (`_flat`), less ``del``s."""
    return [b.sym.name for b in _flat(bsyms, fusions=fusions) if b.sym.name != "python_del"]


def _copying_sums(trace) -> list[str]:
    """The ``sum`` calls of ``trace`` that reduce only dimensions of size 1: copies (thunder's broadcast rule)."""
    sums = []
    for b in _flat(trace.bound_symbols):
        if b.sym.name == "sum":
            a, dims = b.args[0], b.args[1]
            dims = (dims,) if isinstance(dims, int) else tuple(dims or ())
            if dims and all(a.shape[d] == 1 for d in dims):
                sums.append(str(b).splitlines()[0])
    return sums


def _backward_ops(jfn) -> list[str]:
    return _ops(thunder.last_backward_traces(jfn)[-1].bound_symbols)


def _jit(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EagerFallbackWarning)  # NOTE: no GPU: regions run eagerly, as eager does
        return thunder_nb.jit(fn)


@pytest.mark.parametrize("name", list(CONVOLUTIONS))
def test_thunder_nb_jit_gives_a_convolutions_gradients_bit_for_bit_as_eager_does(name):
    make, shape = CONVOLUTIONS[name]
    torch.manual_seed(0)
    conv = make()
    x = torch.randn(shape, requires_grad=True)

    def loss(x):
        return conv(x).square().sum()

    jfn = _jit(loss)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EagerFallbackWarning)
        got = torch.autograd.grad(jfn(x), [x, *conv.parameters()])
    expected = torch.autograd.grad(loss(x), [x, *conv.parameters()])
    for g, e, what in zip(got, expected, ["input", *(n for n, _ in conv.named_parameters())]):
        assert torch.equal(g, e), f"{name}: the {what} gradient differs from eager's by {(g - e).abs().max():.2e}"
    ops = _backward_ops(jfn)
    # NOTE: thunder's own rule: its convolutions over flipped, permuted tensors (padding "same" has a pad of its own)
    assert not {"flip", "permute", "convolution"} & set(ops), ops
    assert ops.count("thunder_nb_convolution_input_grad") == ops.count("thunder_nb_convolution_weight_grad") == 1, ops


def test_a_gradient_nobody_reads_is_never_computed():
    """A network's first convolution reads the batch, which needs no gradient: only its weight's is computed."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, stride=2), torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 3))
    x = torch.randn(2, 3, 12, 12)
    jfn = _jit(lambda x: net(x).sum())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EagerFallbackWarning)
        jfn(x).backward()
    ops = _backward_ops(jfn)
    assert ops.count("thunder_nb_convolution_weight_grad") == 2, ops
    assert ops.count("thunder_nb_convolution_input_grad") == 1, ops  # NOTE: the second layer's, into the ReLU


def test_the_convolution_executor_comes_before_the_fusion_executors_that_claim_convolutions_too():
    """thunder asks the first executor that claims an op for its backward; inductor's claims ``prims.convolution``
    with none of its own, so behind it thunder's rule would come back. Inference claims nothing new: the forward's
    ``conv2d`` stays thunder's torch executor's."""
    for names in ((), ("torchcompile",), ("no-sdpa",)):
        chosen = [e.name for e in jit_executors(names)]
        assert chosen.index(native_convolution().name) < min(
            (i for i, n in enumerate(chosen) if "torchcompile" in n), default=len(chosen)), chosen
    conv = torch.nn.Conv2d(3, 4, 3)
    jfn = _jit(conv)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", EagerFallbackWarning)
        assert torch.equal(jfn(torch.ones(1, 3, 5, 5)), conv(torch.ones(1, 3, 5, 5)))
    assert not any("thunder_nb_convolution" in name for name in _ops(thunder.last_traces(jfn)[-1].bound_symbols))


def test_attention_goes_to_the_fused_kernels_before_a_fusion_executor_only_where_grad_is_enabled():
    """A fusion executor claims attention with no backward (thunder then differentiated matmuls and a softmax), so
    `training_sdpa` comes before it, and only there; it takes attention only in a compilation with grad enabled, which
    `internals.compiling_with_grad` tells its checker: a decode step under no_grad keeps inductor's fusions. (Its fused
    kernels refuse CPU tensors: a checker of this test's own reads what thunder-nb's reads.)"""
    from thunder.extend import OperatorExecutor, register_executor
    import thunder.torch as ltorch

    from thunder_nb import internals
    from thunder_nb.cudagraph.executors import checked_sdpa, training_sdpa

    for names, first in (((), False), (("torchcompile",), True), (("torchcompile", "no-sdpa"), False)):
        chosen = jit_executors(names)
        assert (training_sdpa() in chosen) == first, names
        if first:
            assert chosen.index(training_sdpa()) < [e.name for e in chosen].index("thunder_nb_torchcompile")
            assert checked_sdpa() in chosen  # NOTE: the one for every compilation, where it was
    seen = []
    probe = OperatorExecutor("thunder_nb_test_grad_probe")
    register_executor(probe)
    probe.register_implementation(ltorch.scaled_dot_product_attention, execution_transform=lambda *a, **k: None,
                                  checker=lambda *args, **kwargs: seen.append(internals.compiling_with_grad()))
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 24)

    def attention(x):
        return torch.nn.functional.scaled_dot_product_attention(*linear(x).split(8, dim=-1), is_causal=True).sum()

    jfn = thunder.jit(attention, executors=[probe, *thunder.get_default_executors()])
    jfn(torch.ones(1, 2, 4, 8)).backward()
    assert seen and all(seen), seen
    seen.clear()
    with torch.no_grad():
        jfn(torch.ones(1, 2, 4, 8))
    assert seen and not any(seen), seen
    assert internals.compiling_with_grad()  # NOTE: outside a compilation


def _batch_norm_net(**options) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4, **options), torch.nn.ReLU(),
                               torch.nn.Conv2d(4, 6, 3, stride=2), torch.nn.BatchNorm2d(6, **options))


def test_a_training_batch_norm_runs_bit_for_bit_as_eager_its_running_statistics_included():
    """Three training steps: loss, every gradient, the running statistics and ``num_batches_tracked`` equal eager's
    exactly, through the fixed transform's regions; thunder's decomposition (``var_mean`` and the rest) is gone."""
    import copy

    net = _batch_norm_net()
    ref = copy.deepcopy(net)
    jfn = _jit(lambda x: net(x).square().mean())
    for i in range(3):
        x = torch.randn(2, 3, 11, 11, generator=torch.Generator().manual_seed(i))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", EagerFallbackWarning)
            loss = jfn(x)
        loss.backward()
        expected = ref(x).square().mean()
        expected.backward()
        assert torch.equal(loss, expected), i
        for (name, p), q in zip(net.named_parameters(), ref.parameters()):
            assert torch.equal(p.grad, q.grad), (i, name)
        for (name, b), c in zip(net.named_buffers(), ref.buffers()):
            assert torch.equal(b, c), (i, name, b, c)
    assert int(net[1].num_batches_tracked) == 3
    forward = _ops(thunder.last_traces(jfn)[-1].bound_symbols)
    assert forward.count("thunder_nb_batch_norm") == 2 and "var_mean" not in forward, forward
    assert _backward_ops(jfn).count("thunder_nb_batch_norm_backward") == 2


@pytest.mark.parametrize("mode", ["eval", "no running statistics"])
def test_a_batch_norm_the_native_kernels_do_not_take_keeps_thunders_decomposition(mode):
    """Evaluation mode (no backward through batch statistics) and ``track_running_stats=False`` are thunder's."""
    net = _batch_norm_net(track_running_stats=mode == "eval")
    net.train(mode != "eval")
    x = torch.randn(2, 3, 11, 11, requires_grad=True)
    jfn = _jit(lambda x: net(x).square().mean())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EagerFallbackWarning)
        loss = jfn(x)
    assert_equal(loss, net(x).square().mean())
    forward = _ops(thunder.last_traces(jfn)[-1].bound_symbols)
    assert "thunder_nb_batch_norm" not in forward, forward
    assert ("var_mean" in forward) == (mode != "eval"), forward  # NOTE: eval normalises by the running statistics
    assert native_batch_norm().name in [e.name for e in jit_executors(())]


def test_a_training_batch_norm_under_no_grad_updates_its_running_statistics_as_eager_does():
    """Training mode without autograd (a forward under ``torch.no_grad()``): the same kernels, no backward."""
    import copy

    net = _batch_norm_net()
    ref = copy.deepcopy(net)
    jfn = _jit(lambda x: net(x))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", EagerFallbackWarning)
        for i in range(2):
            x = torch.randn(2, 3, 11, 11, generator=torch.Generator().manual_seed(i))
            assert torch.equal(jfn(x), ref(x)), i
    for (name, b), c in zip(net.named_buffers(), ref.buffers()):
        assert torch.equal(b, c), (name, b, c)
    assert "thunder_nb_batch_norm" in _ops(thunder.last_traces(jfn)[-1].bound_symbols)


#: thunder's decomposition of layer_norm, gelu (either approximation) and silu, forward and backward
DECOMPOSED = {"var_mean", "rsqrt", "erf", "tanh", "pow", "exp", "sigmoid", "reciprocal"}

LAYER_NORMS = {"last dim": ((2, 3, 8), (8,)), "last two dims": ((4, 5, 6), (5, 6))}


def _weighted(fn, shape, dtype):
    """``fn``'s output weighted by a fixed tensor and summed: every gradient non-trivial (a layer norm's plain sum is
    its bias's)."""
    weights = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    return lambda x: (fn(x) * weights).sum()


def _assert_as_eager(loss, x, params, what):
    """``loss`` through thunder_nb.jit: its value and the gradients of ``x`` and ``params`` bit for bit eager's; the
    jitted function."""
    jfn = _jit(loss)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EagerFallbackWarning)
        got = jfn(x)
        grads = torch.autograd.grad(got, [x, *params])
    expected = loss(x)
    assert_equal(got, expected, tolerance=EXACT, label=f"{what}: loss")
    assert_equal(grads, torch.autograd.grad(expected, [x, *params]), tolerance=EXACT, label=f"{what}: gradients")
    return jfn


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("affine", ["weight and bias", "weight", "neither"])
@pytest.mark.parametrize("name", list(LAYER_NORMS))
def test_a_layer_norm_runs_bit_for_bit_as_eager_with_pytorchs_kernels(name, affine, dtype):
    shape, normalized = LAYER_NORMS[name]
    torch.manual_seed(0)
    ln = torch.nn.LayerNorm(normalized, elementwise_affine=affine != "neither", bias=affine == "weight and bias",
                            dtype=dtype)
    with torch.no_grad():
        for p in ln.parameters():
            p.normal_()
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    jfn = _assert_as_eager(_weighted(ln, shape, dtype), x, list(ln.parameters()), f"{name}, {affine}, {dtype}")
    forward, backward = _ops(thunder.last_traces(jfn)[-1].bound_symbols), _backward_ops(jfn)
    assert forward.count("thunder_nb_layer_norm") == 1 and not DECOMPOSED & set(forward), forward
    assert backward.count("thunder_nb_layer_norm_backward") == 1 and not DECOMPOSED & set(backward), backward


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_a_layer_norms_statistics_are_typed_as_its_kernel_returns_them_on_the_inputs_device(dtype):
    """The mean and inverse standard deviation: the input's dtype on the CPU, float32 for a reduced-precision input
    elsewhere. torch's meta kernel (``torch._refs.native_layer_norm``) types them as CUDA's kernel does."""
    from thunder.core import devices, dtypes
    from thunder.core.proxies import TensorProxy
    from thunder.core.trace import TraceCtx, tracectx

    forward = native_layer_norm().opmap["thunder_nb_layer_norm"]
    for device, kernel_device in (("cpu", "cpu"), ("cuda:0", "meta")):
        with tracectx(TraceCtx()):
            a = TensorProxy(shape=(2, 3, 4), device=devices.to_device(device), dtype=dtypes.to_dtype(dtype))
            meta = forward.meta(a, (3, 4), None, None, 1e-5)
        kernel = torch.ops.aten.native_layer_norm(torch.ones(2, 3, 4, dtype=dtype, device=kernel_device), (3, 4), None,
                                                  None, 1e-5)
        assert [(tuple(p.shape), dtypes.to_torch_dtype(p.dtype)) for p in meta] == [
            (tuple(t.shape), t.dtype) for t in kernel], device


def test_a_layer_norm_the_kernels_do_not_take_keeps_thunders_decomposition():
    """A weight of another dtype than the input's: thunder's decomposition, whose result is eager's within bfloat16's
    rounding."""
    ln = torch.nn.LayerNorm(8)
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    jfn = _jit(ln)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EagerFallbackWarning)
        got = jfn(x)
    assert_equal(got, ln(x))
    forward = _ops(thunder.last_traces(jfn)[-1].bound_symbols)
    assert "thunder_nb_layer_norm" not in forward and "var_mean" in forward, forward


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_runs_bit_for_bit_as_eager_with_pytorchs_kernels(approximate, dtype):
    x = torch.randn(3, 16, dtype=dtype, generator=torch.Generator().manual_seed(0)).requires_grad_()
    fn = _weighted(lambda x: torch.nn.functional.gelu(x, approximate=approximate), x.shape, dtype)
    jfn = _assert_as_eager(fn, x, [], f"gelu {approximate}, {dtype}")
    forward, backward = _ops(thunder.last_traces(jfn)[-1].bound_symbols), _backward_ops(jfn)
    assert forward.count("thunder_nb_gelu") == 1 and not DECOMPOSED & set(forward), forward
    assert backward.count("thunder_nb_gelu_backward") == 1 and not DECOMPOSED & set(backward), backward


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_silu_runs_bit_for_bit_as_eager_with_pytorchs_kernels(dtype):
    x = torch.randn(3, 16, dtype=dtype, generator=torch.Generator().manual_seed(0)).requires_grad_()
    jfn = _assert_as_eager(_weighted(torch.nn.functional.silu, x.shape, dtype), x, [], f"silu, {dtype}")
    forward, backward = _ops(thunder.last_traces(jfn)[-1].bound_symbols), _backward_ops(jfn)
    assert forward.count("thunder_nb_silu") == 1 and not DECOMPOSED & set(forward), forward
    assert backward.count("thunder_nb_silu_backward") == 1 and not DECOMPOSED & set(backward), backward


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_sigmoid_runs_bit_for_bit_as_eager_with_pytorchs_kernels(dtype):
    x = torch.randn(3, 16, dtype=dtype, generator=torch.Generator().manual_seed(0)).requires_grad_()
    jfn = _assert_as_eager(_weighted(torch.sigmoid, x.shape, dtype), x, [], f"sigmoid, {dtype}")
    forward, backward = _ops(thunder.last_traces(jfn)[-1].bound_symbols), _backward_ops(jfn)
    assert forward.count("thunder_nb_sigmoid") == 1 and not DECOMPOSED & set(forward), forward
    assert backward.count("thunder_nb_sigmoid_backward") == 1 and not DECOMPOSED & set(backward), backward


def test_a_sigmoid_far_below_zero_has_eagers_gradient_where_thunders_rule_gives_nan():
    """``sigmoid(x)`` for x below about -88: thunder's differentiation of ``1 / (1 + exp(-x))`` overflows to
    ``inf / inf``, NaN (the CPU fuzzer's program 440); PyTorch's ``sigmoid_backward`` gives eager's 0, bit for bit.
    (Without this executor, `thunder_nb.internals.grads`' rule from the output is finite too: tests/test_grads.py.)"""
    x = torch.tensor([-100.0, -30.0, 0.0, 30.0], requires_grad=True)
    expected = torch.autograd.grad(torch.sigmoid(x).sum(), [x])[0]
    grads.uninstall()
    try:
        rules = thunder.jit(lambda x: torch.sigmoid(x).sum(),
                            executors=[e for e in jit_executors([]) if e.name != native_sigmoid().name])
        assert torch.isnan(torch.autograd.grad(rules(x), [x])[0][0])
    finally:
        assert grads.install()
    jfn = _jit(lambda x: torch.sigmoid(x).sum())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EagerFallbackWarning)
        got = torch.autograd.grad(jfn(x), [x])[0]
    assert_equal(got, expected, tolerance=EXACT, label="sigmoid gradient")


def test_an_in_place_silu_keeps_thunders_path():
    """``silu(x, inplace=True)`` writes its input: thunder's own path (an out-of-place silu and a copy), eager's
    values."""
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.SiLU(inplace=True))
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))
    jfn = _jit(lambda x: net(x).sum())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EagerFallbackWarning)
        got = jfn(x)
    assert_equal(got, net(x).sum())
    assert "thunder_nb_silu" not in _ops(thunder.last_traces(jfn)[-1].bound_symbols)


MEANS = {"last dim, kept": (-1, True), "dims 0 and 2": ((0, 2), False), "every dim": (None, False)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(MEANS))
def test_mean_runs_bit_for_bit_as_eager_with_pytorchs_kernel(name, dtype):
    """``torch.mean`` forward, eager's ``mean_backward`` (an expand and one division) backward: nothing of thunder's
    sum-and-divide left."""
    dim, keepdim = MEANS[name]
    x = torch.randn(3, 4, 5, dtype=dtype, generator=torch.Generator().manual_seed(0)).requires_grad_()
    shape = torch.mean(x.detach(), dim, keepdim) if dim is not None else x.detach().mean()
    fn = (lambda x: x.mean(dim, keepdim)) if dim is not None else (lambda x: x.mean())
    jfn = _assert_as_eager(_weighted(fn, shape.shape, dtype), x, [], f"mean {name}, {dtype}")
    forward, backward = _ops(thunder.last_traces(jfn)[-1].bound_symbols), _backward_ops(jfn)
    assert forward.count("thunder_nb_mean") == 1 and forward.count("sum") == 1, forward  # NOTE: the weighted sum
    assert backward.count("thunder_nb_mean_backward") == 1, backward
    assert not [n for n in forward + backward if "div" in n], (forward, backward)


def test_a_mean_with_a_dtype_keeps_thunders_path():
    """``mean(dtype=...)`` converts first, which PyTorch's kernel does otherwise: thunder's own path, eager's value."""
    x = torch.randn(4, 6, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    jfn = _jit(lambda x: x.mean(-1, dtype=torch.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EagerFallbackWarning)
        got = jfn(x)
    assert_equal(got, x.mean(-1, dtype=torch.float32))
    assert "thunder_nb_mean" not in _ops(thunder.last_traces(jfn)[-1].bound_symbols)


@pytest.mark.parametrize("used", ["both halves", "the first half"])
def test_unbind_runs_as_pytorch_does_views_forward_one_stack_backward(used):
    """A rotary embedding's split into halves: loss and gradients bit for bit eager's, ``torch.unbind`` forward and
    one ``stack`` backward where thunder pads each half's gradient with zeros (a half nobody reads has a gradient of
    zeros in the stack, as eager's ``unbind_backward`` gives it)."""
    x = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(0), requires_grad=True)
    cos, sin = torch.randn(2, 2, 3, 4, generator=torch.Generator().manual_seed(1))

    def loss(x):
        real, imag = x.reshape(2, 3, 4, 2).unbind(-1)
        return ((real * cos - imag * sin) if used == "both halves" else real * cos).square().sum()

    jfn = _assert_as_eager(loss, x, [], f"unbind, {used}")
    forward, backward = _ops(thunder.last_traces(jfn)[-1].bound_symbols), _backward_ops(jfn)
    assert forward.count("thunder_nb_unbind") == 1 and not {"torch_slice_prim_impl", "squeeze"} & set(forward), forward
    assert backward.count("thunder_nb_unbind_backward") == 1, backward
    assert not [n for n in backward if "pad" in n], backward


BROADCASTS = {
    "unsqueeze": lambda x, w: (x.unsqueeze(1) * w[:, :, None]).sum(),
    "None index, expand": lambda x, w: (x[:, None, :].expand(2, 5, 4) * w[:, :, None]).sum(),
    "stack": lambda x, w: (torch.stack([x * 2.0, x.sin()], dim=-1) * w[:, :4, None]).sum(),
    "implicit broadcast": lambda x, w: (x[:, None, :] * w[:, :, None] + x.mean()).sum(),
}


@pytest.mark.parametrize("name", list(BROADCASTS))
def test_a_broadcast_is_differentiated_as_eager_does_a_sum_over_repeated_dims_only(name):
    """``unsqueeze``, ``x[:, None]``, ``stack`` (an unsqueeze each) and implicit broadcasting: loss and gradients bit
    for bit eager's, and the backward sums only over dimensions an expand repeats (thunder's rule also summed over each
    new dimension of size 1, a copy: the next test)."""
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)
    w = torch.randn(2, 5, generator=torch.Generator().manual_seed(1))
    jfn = _assert_as_eager(lambda x: BROADCASTS[name](x, w), x, [], name)
    assert _copying_sums(thunder.last_backward_traces(jfn)[-1]) == []


def test_thunders_broadcast_rule_copies_where_the_executor_views_with_the_same_forward_and_values():
    """A stack and a ``[:, None]`` under thunder.jit with thunder_nb.jit's executors, with and without
    `native_broadcast`: the same forward trace (thunder's torch executor's ``unsqueeze`` and ``expand``), the same
    gradient bit for bit, and thunder's rule's 3 sums over new dimensions of size 1 gone."""
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)

    def fn(x):
        return (torch.stack([x * 2.0, x.sin()], dim=-1) * x[:, :, None]).square().sum()

    runs = {}
    for name, executors in (("thunder's rule", [e for e in jit_executors([]) if e.name != native_broadcast().name]),
                            ("native_broadcast", jit_executors([]))):
        jfn = thunder.jit(fn, executors=executors)
        grad = torch.autograd.grad(jfn(x), [x])[0]
        forward = _ops(thunder.last_traces(jfn)[-1].bound_symbols)
        runs[name] = (forward, grad, _copying_sums(thunder.last_backward_traces(jfn)[-1]))
    (forward, grad, sums), (forward_ex, grad_ex, sums_ex) = runs["thunder's rule"], runs["native_broadcast"]
    assert forward_ex == forward and "unsqueeze" in forward, forward_ex
    assert_equal(grad_ex, grad, tolerance=EXACT, label="gradient")
    assert (len(sums), sums_ex) == (3, []), (sums, sums_ex)


@pytest.mark.slow  # NOTE: a llama2 trace, forward and backward: seconds
def test_llamas_training_step_runs_rmsnorms_mean_rotarys_unbind_and_its_broadcasts_as_eager_does():
    """thunder's bundled llama2 (1 layer): loss and gradients equal eager's (within float32's tolerance: attention and
    cross_entropy are thunder's decompositions on the CPU), each RMSNorm's mean and each rotary unbind PyTorch's,
    forward and backward, no gradient padded with zeros, and no sum over dimensions of size 1 (the rotary's stacks,
    the grouped-query attention's ``x[:, :, :, None, :]``)."""
    from thunder.tests.llama2_model import ModelArgs, Transformer

    torch.manual_seed(0)
    model = Transformer(ModelArgs(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=64, multiple_of=8,
                                  max_seq_len=16, dropout=0.0))
    idx, targets = torch.randint(0, 64, (2, 2, 16), generator=torch.Generator().manual_seed(0))

    def loss(idx, targets):
        logits = model(idx, targets)
        return torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    jfn = _jit(loss)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EagerFallbackWarning)
        got = jfn(idx, targets)
        grads = torch.autograd.grad(got, list(model.parameters()))
    expected = loss(idx, targets)
    assert_equal(got, expected, label="loss")
    assert_equal(grads, torch.autograd.grad(expected, list(model.parameters())), label="gradients")
    forward, backward = _ops(thunder.last_traces(jfn)[-1].bound_symbols), _backward_ops(jfn)
    assert [forward.count(f"thunder_nb_{op}") for op in ("mean", "unbind")] == [3, 2], forward
    assert [backward.count(f"thunder_nb_{op}_backward") for op in ("mean", "unbind")] == [3, 2], backward
    assert not [n for n in backward if "pad" in n], backward
    assert _copying_sums(thunder.last_backward_traces(jfn)[-1]) == []


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.LayerNorm(8), torch.nn.Linear(8, 8), torch.nn.GELU(approximate="tanh"))


@pytest.mark.parametrize("executor", ["torchcompile", "torchcompile_cat", "thunder's torch_compile_ex"])
def test_a_fusion_executor_keeps_layer_norm_and_gelu(executor):
    """inductor fuses their decomposition itself, forward and backward: PyTorch's kernels are not in the list, and
    the traces (built, not run) hold thunder's decomposition."""
    from thunder.executors.torch_compile import torch_compile_ex

    executors = [torch_compile_ex] if executor.startswith("thunder") else [executor]
    names = [e.name for e in jit_executors(executors)]
    assert native_convolution().name in names and native_batch_norm().name in names, names
    kept = {e().name for e in (native_layer_norm, native_gelu, native_silu, native_sigmoid, native_mean, native_unbind,
                               native_broadcast)}
    assert not kept & set(names), names
    assert kept <= {e.name for e in jit_executors(["no-sdpa"])}
    net = _mlp()
    jfn = thunder_nb.jit(lambda x: net(x).sum(), executors=executors, capture=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build_traces(jfn, torch.randn(2, 8, requires_grad=True))
    names = [n for t in (thunder.last_traces(jfn)[-1], thunder.last_backward_traces(jfn)[-1])
             for n in _ops(t.bound_symbols, fusions=True)]
    assert not any(n.startswith(("thunder_nb_layer_norm", "thunder_nb_gelu")) for n in names), names
    assert {"var_mean", "rsqrt", "tanh"} <= set(names), names


def _nanogpt():
    """thunder's bundled nanoGPT, one layer, and its loss on a batch: (model, loss function, inputs)."""
    from thunder.tests.nanogpt_model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64, dropout=0.0))
    inputs = tuple(torch.randint(0, 64, (2, 2, 16), generator=torch.Generator().manual_seed(0)))

    def loss(idx, targets):
        return model(idx, targets)[1]

    return model, loss, inputs


@pytest.fixture(scope="module")
def nanogpt_step():
    """`_nanogpt`'s training step under thunder_nb.jit, traced and run once for the module's two nanoGPT tests:
    (model, loss function, inputs, the jitted loss, its loss, its gradients)."""
    model, loss, inputs = _nanogpt()
    jfn = _jit(loss)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EagerFallbackWarning)
        got = jfn(*inputs)
        grads = torch.autograd.grad(got, list(model.parameters()))
    return model, loss, inputs, jfn, got, grads


def test_a_nanogpt_training_step_equals_eagers_without_the_layer_norm_and_gelu_decompositions(nanogpt_step):
    """thunder's bundled nanoGPT: loss and gradients equal eager's (within float32's tolerance: attention, which on
    the CPU is thunder's decomposition, and cross_entropy's mean round otherwise than eager's kernels), and its 3 layer
    norms and its gelu run as PyTorch's kernels, forward and backward."""
    model, loss, inputs, jfn, got, grads = nanogpt_step
    params = list(model.parameters())
    expected = loss(*inputs)
    assert_equal(got, expected, label="loss")
    assert_equal(grads, torch.autograd.grad(expected, params), label="gradients")
    forward, backward = _ops(thunder.last_traces(jfn)[-1].bound_symbols), _backward_ops(jfn)
    assert forward.count("thunder_nb_layer_norm") == 3 and forward.count("thunder_nb_gelu") == 1, forward
    assert backward.count("thunder_nb_layer_norm_backward") == 3 and "thunder_nb_gelu_backward" in backward, backward
    assert not DECOMPOSED & set(forward + backward), forward + backward


def test_a_swiglu_mlps_training_step_runs_silu_as_pytorch_does():
    """A llama MLP (``w2(silu(w1(x)) * w3(x))``, as thunder's bundled llama2 and litgpt's LLaMAMLP write it): loss and
    gradients bit for bit eager's, its silu PyTorch's kernels forward and backward, nothing of sigmoid left."""
    torch.manual_seed(0)
    w1, w2, w3 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8), torch.nn.Linear(8, 16)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
    params = [p for m in (w1, w2, w3) for p in m.parameters()]
    jfn = _assert_as_eager(_weighted(lambda x: w2(torch.nn.functional.silu(w1(x)) * w3(x)), x.shape, torch.float32),
                           x, params, "SwiGLU MLP")
    forward, backward = _ops(thunder.last_traces(jfn)[-1].bound_symbols), _backward_ops(jfn)
    assert forward.count("thunder_nb_silu") == 1 and backward.count("thunder_nb_silu_backward") == 1, (forward,
                                                                                                      backward)
    assert not DECOMPOSED & set(forward + backward), forward + backward


@pytest.mark.slow  # NOTE: a nanoGPT trace with thunder's decompositions (the module's other is shared): seconds
def test_a_nanogpt_training_steps_backward_is_shorter_than_with_thunders_rules(nanogpt_step):
    """The executors thunder_nb.jit took before (without PyTorch's layer_norm and gelu kernels) left a backward of
    200 symbols; now it has 88 (bookkeeping included: thunder_nb.jit's trace, the module's shared one, which has the
    region's hand-out and return besides the 86 of thunder.jit with the same executors)."""
    _, loss, inputs, jfn, _, _ = nanogpt_step
    rules = thunder.jit(loss, executors=[native_convolution(), native_batch_norm(), *executor_list([], checked=True)])
    build_traces(rules, *inputs)
    assert "rsqrt" in _ops(thunder.last_traces(rules)[-1].bound_symbols)
    assert len(_backward_ops(jfn)) < len(_backward_ops(rules)) - 50, (_backward_ops(jfn), _backward_ops(rules))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run `pytest -m gpu` on the GPU machine)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gpu_captured_native_kernels_replay_bit_for_bit_as_eager(dtype):
    """On the GPU, under real capture: a layer norm, a tanh gelu, a linear layer, a silu, a linear layer, then a
    rotary embedding's unbind and stack (stack's backward: views of one gradient) and a mean over 96 features; three
    calls (the recording and two replays, each with new inputs) give eager's loss and gradients bit for bit, and the
    traces hold PyTorch's kernels, forward and backward, and no copying sum. No RMSNorm: its ``rsqrt`` and ``pow``
    are thunder's rules, which in bfloat16 round otherwise than eager's autograd (on the CPU its loss and gradients
    differ; on the H100, at ad00870, the input's gradient did)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.LayerNorm(96), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(96, 96),
                              torch.nn.SiLU(), torch.nn.Linear(96, 96))
    net = net.to("cuda", dtype)
    cos, sin = torch.randn(2, 8, 48, device="cuda", dtype=dtype, generator=torch.Generator("cuda").manual_seed(9))

    def loss(x):
        h = net(x)
        real, imag = h.reshape(8, 48, 2).unbind(-1)
        rotated = torch.stack([real * cos - imag * sin, real * sin + imag * cos], dim=-1)
        return rotated.float().square().mean() + h.mean(-1).float().square().mean()

    jfn = thunder_nb.jit(loss)
    for seed in range(3):
        x = torch.randn(8, 96, device="cuda", dtype=dtype, generator=torch.Generator("cuda").manual_seed(seed))
        x.requires_grad_(True)
        got = jfn(x)
        grads = torch.autograd.grad(got, [x, *net.parameters()])
        expected = loss(x)
        assert_equal(got, expected, tolerance=EXACT, label=f"call {seed}: loss")
        assert_equal(grads, torch.autograd.grad(expected, [x, *net.parameters()]), tolerance=EXACT,
                     label=f"call {seed}: gradients")
    forward, backward = _ops(thunder.last_traces(jfn)[-1].bound_symbols), _backward_ops(jfn)
    natives = [f"thunder_nb_{op}" for op in ("layer_norm", "gelu", "silu", "mean", "unbind")]
    assert set(natives) <= set(forward), forward
    assert {f"{n}_backward" for n in natives} <= set(backward), backward
    assert _copying_sums(thunder.last_backward_traces(jfn)[-1]) == []
