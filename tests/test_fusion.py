"""Fusions of another executor (thunder's torch_compile_ex: inductor) inside the fixed transform's regions."""

from __future__ import annotations

import copy

import pytest
import torch

import thunder
from thunder_nb.fix import FixedCUDAGraphTransform
from thunder_nb.testing.emulate import emulated_capture
from thunder_nb.testing.models import model_case

torch_compile = pytest.importorskip("thunder.executors.torch_compile", reason="thunder's torch_compile executor")


def _compare_steps(device: str, capture: bool) -> tuple[FixedCUDAGraphTransform, object]:
    """Three nanoGPT training steps under the fixed transform with inductor fusions, checked against eager."""
    case = model_case("nanoGPT", device)
    ref = model_case("nanoGPT", device, model=copy.deepcopy(case.model))
    t = FixedCUDAGraphTransform(capture=capture if device == "cuda" else False)
    if device != "cuda":
        t.cuda_graph_runner.capture = True  # NOTE: emulated_capture takes the capture path on the CPU
    executors = [torch_compile.torch_compile_ex, *thunder.get_default_executors()]
    j = thunder.jit(case.step, transforms=[t], executors=executors)
    for i in range(3):
        batch = case.make_batch(i)
        loss, expected = j(*batch), ref.step(*batch)
        loss.backward()
        expected.backward()
        torch.testing.assert_close(loss, expected)
        for (name, p), q in zip(case.model.named_parameters(), ref.model.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=lambda m, name=name: f"grad of {name}: {m}")
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
