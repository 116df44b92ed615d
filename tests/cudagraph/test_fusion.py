"""Fusions of another executor (thunder's torch_compile_ex: inductor) inside the fixed transform's regions."""

from __future__ import annotations

import copy

import pytest
import torch

import thunder
from thunder.core.proxies import NumberProxy
from thunder_nb.cudagraph.executors import executor_list
from thunder_nb.diagnosis import ops
from thunder_nb.fix import FixedCUDAGraphTransform
from thunder_nb.testing.emulate import emulated_capture
from thunder_nb.testing.models import model_case
from thunder_nb.diagnosis.judge import assert_equal

torch_compile = pytest.importorskip("thunder.executors.torch_compile", reason="thunder's torch_compile executor")


def _compare_steps(device: str, capture: bool, *, executors=None, log_loss: bool = False, defer_items: bool = True):
    """Three nanoGPT training steps under the fixed transform with inductor fusions, checked against eager.

    ``executors`` defaults to thunder's own torch_compile executor before thunder's defaults. One block: what a
    fusion, an island and a region do here is the same in each block, and a second doubled thunder's tracing.
    """
    case = model_case("nanoGPT", device, layers=1, log_loss=log_loss)
    ref = model_case("nanoGPT", device, model=copy.deepcopy(case.model), log_loss=log_loss)
    t = FixedCUDAGraphTransform(capture=capture if device == "cuda" else False, defer_items=defer_items)
    if device != "cuda":
        t.cuda_graph_runner.capture = True  # NOTE: emulated_capture takes the capture path on the CPU
    executors = executors or [torch_compile.torch_compile_ex, *thunder.get_default_executors()]
    j = thunder.jit(case.step, transforms=[t], executors=executors)
    for i in range(3):
        batch = case.make_batch(i)
        out, expected = j(*batch), ref.step(*batch)
        if log_loss:
            assert out[1] == pytest.approx(expected[1], rel=1e-5)  # the logged number, a Python float
            out, expected = out[0], expected[0]
        out.backward()
        expected.backward()
        assert_equal(out, expected)
        for (name, p), q in zip(case.model.named_parameters(), ref.model.parameters()):
            assert_equal(p.grad, q.grad, label=f"grad of {name}")
            p.grad = q.grad = None
    return t, j


def _region_names(trace) -> list[str]:
    return [b.sym.name for b in trace.bound_symbols if b.sym.name.startswith("CUDAGraph")]


@pytest.mark.slow
def test_a_lone_inductor_fusion_is_a_region_and_replays_equal_to_eager():
    """inductor fuses the whole forward into one TorchCompile symbol: it must still be captured (emulated)."""
    with emulated_capture():
        t, j = _compare_steps("cpu", capture=True)
    forward, backward = thunder.last_traces(j)[-1], thunder.last_backward_traces(j)[-1]
    assert len(_region_names(forward)) == 1 and len(_region_names(backward)) == 1
    region = next(b for b in forward.bound_symbols if b.sym.name.startswith("CUDAGraph"))
    assert any(s.sym.name.startswith("TorchCompile") for s in region.subsymbols)
    assert t.graphs_captured == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run `pytest -m gpu` on the GPU machine)")
def test_gpu_inductor_fusion_is_captured_and_equal_to_eager():
    t, _ = _compare_steps("cuda", capture=True)
    assert t.graphs_captured == 2


@pytest.mark.slow
def test_thunder_nb_torchcompile_leaves_the_logged_item_out_so_the_forward_is_still_captured():
    """thunder's torch_compile_ex fuses ``loss.item()`` into the forward's one fusion, which then cannot be
    captured; thunder-nb's ``torchcompile`` keeps the island out: a region, the island, 2 graphs in all.
    (``defer_items=False``: by default the logged item runs in thunder's epilogue, out of the forward.)"""
    with emulated_capture():
        t, j = _compare_steps("cpu", capture=True, executors=executor_list(["torchcompile"]), log_loss=True,
                              defer_items=False)
    forward = thunder.last_traces(j)[-1]
    names = [b.sym.name for b in forward.bound_symbols]
    assert len(_region_names(forward)) == 1 and names.index("item") > names.index(_region_names(forward)[0])
    assert t.graphs_captured == 2

    with emulated_capture():  # thunder's own executor: the island is inside its fusion, the forward runs uncaptured
        t, j = _compare_steps("cpu", capture=True, log_loss=True, defer_items=False)
    assert _region_names(thunder.last_traces(j)[-1]) == [] and t.graphs_captured == 1


@pytest.mark.slow
def test_thunder_nb_torchcompile_keeps_an_islands_number_out_of_fusions_so_one_graph_serves_every_value():
    """``x * s`` with ``s`` from ``.item()``: fused by inductor, ``s`` would be a number baked into the graph."""

    def f(x):
        s = x.sum().item()
        return torch.tanh(torch.sin(x) * s + 1.0)

    t = FixedCUDAGraphTransform(capture=False)
    t.cuda_graph_runner.capture = True
    j = thunder.jit(f, transforms=[t], executors=executor_list(["torchcompile"]))
    with emulated_capture():
        for _ in range(4):
            x = torch.randn(64)
            assert_equal(j(x), f(x))
    assert t.graphs_captured == 1
    fusions = [s for b in thunder.last_traces(j)[-1].bound_symbols for s in b.subsymbols
               if s.sym.name.startswith("TorchCompile")]
    assert fusions, "expected inductor fusions inside the region"
    for fusion in fusions:
        assert not any(isinstance(a, NumberProxy) for a in fusion.flat_proxy_args), fusion.sym.name
        assert all(ops.classify_bsym(s) is None for s in fusion.subsymbols), fusion.sym.name


@pytest.mark.slow
def test_in_place_updates_inside_an_inductor_fusion_are_applied_once_per_step():
    """BatchNorm's running statistics and num_batches_tracked, updated inside inductor's fusion in the region: the
    recording's warm-up calls ran the region three times and put back only what it found written at the region's
    top level (the running statistics), so num_batches_tracked counted 3 per step (resnet18 in the fused
    configuration: 6 after 2 steps, eager 2). The alias group inside the fusion is read now."""
    from thunder_nb.testing.zoo import capturing, compile_with

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(4 * 6 * 6, 2))
    ref = copy.deepcopy(net)
    x = [torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    with capturing("emulated"):
        fused, transform = compile_with("fused", lambda x: net(x).sum(), "emulated")
        for xi in x:
            fused(xi).backward()
    for xi in x:
        ref(xi).sum().backward()
    runner = transform.cuda_graph_runner
    assert runner.graphs_captured >= 1 and any(n.startswith("TorchCompile") for n in _fusion_names(fused))
    assert int(net[1].num_batches_tracked) == int(ref[1].num_batches_tracked) == 3
    assert_equal(net[1].running_mean, ref[1].running_mean)
    assert_equal(net[1].running_var, ref[1].running_var)


def _fusion_names(jfn) -> list[str]:
    return [s.sym.name for b in thunder.last_traces(jfn)[-1].bound_symbols for s in b.subsymbols if s.sym.is_fusion]
