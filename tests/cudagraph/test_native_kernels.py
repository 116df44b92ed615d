"""`thunder_nb.jit` runs convolutions' backward and training BatchNorm with PyTorch's own kernels.

`executors.native_convolution`: thunder 0.2.6's own rule computes a strided convolution's input gradient over the
output gradient padded with zeros (four times the positions at stride 2) and adds pads, flips and permutes.
`executors.native_batch_norm`: thunder decomposes a training BatchNorm into about ten kernels forward and fifteen
backward. On the H200 resnet18's training step ran 2.3x eager's kernel time. These tests run real thunder traces on
the CPU: gradients, outputs and running statistics are bit for bit eager's, the traces hold PyTorch's calls and none of
thunder's rewrites, and a gradient nobody reads is never computed.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import thunder
import thunder_nb
from thunder_nb.cudagraph.executors import jit_executors, native_batch_norm, native_convolution
from thunder_nb.fix import EagerFallbackWarning
from thunder_nb.diagnosis.judge import assert_equal

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


def _ops(bsyms) -> list[str]:
    """The ops' names, those inside the fixed transform's regions (``CUDAGraphN``) included."""
    names = []
    for b in bsyms:
        names += _ops(b.subsymbols) if b.sym.name.startswith("CUDAGraph") else [b.sym.name]
    return [n for n in names if n != "python_del"]


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
