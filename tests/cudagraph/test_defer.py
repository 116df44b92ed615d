"""An ``.item()`` whose number is only returned runs in thunder's epilogue (`thunder_nb.cudagraph.defer`)."""

from __future__ import annotations

import contextlib
import copy

import pytest
import thunder
import torch

from thunder_nb.fix import FixedCUDAGraphTransform
from thunder_nb.testing.emulate import emulated_capture
from thunder_nb.testing.models import model_case
from thunder_nb.testing.modes import make_transform
from thunder_nb.diagnosis.judge import assert_equal


def _emulated() -> FixedCUDAGraphTransform:
    return make_transform(FixedCUDAGraphTransform, "emulated")


def _names(trace) -> list[str]:
    return [b.sym.name for b in trace.bound_symbols]


def _epilogue(jfn):
    return thunder.compile_stats(jfn).interpreter_cache[-1].epilogue_traces[-1]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (run `pytest -m gpu` on the GPU machine)")])])
@pytest.mark.slow
def test_a_logged_loss_item_runs_in_the_epilogue_and_the_step_equals_eager(device):
    """One nanoGPT block (of `model_case`'s two): where the loss's item runs does not depend on the depth."""
    case = model_case("nanoGPT", device, layers=1, log_loss=True)
    ref = model_case("nanoGPT", device, model=copy.deepcopy(case.model), log_loss=True)
    t = _emulated() if device == "cpu" else FixedCUDAGraphTransform(capture=True)
    j = thunder.jit(case.step, transforms=[t])
    with emulated_capture() if device == "cpu" else contextlib.nullcontext():
        for i in range(3):
            batch = case.make_batch(i)
            (loss, logged), (want, want_logged) = j(*batch), ref.step(*batch)
            assert type(logged) is float and logged == loss.item()
            assert logged == pytest.approx(want_logged, rel=1e-6)
            loss.backward()
            want.backward()
            for p, q in zip(case.model.parameters(), ref.model.parameters()):
                assert_equal(p.grad, q.grad)
                p.grad = q.grad = None
    forward = thunder.last_traces(j)[-1]
    assert "item" not in _names(forward) and [n for n in _names(forward) if n.startswith("CUDAGraph")] == ["CUDAGraph1"]
    assert "item" in _names(_epilogue(j))
    assert t.graphs_captured == 2
    assert any(".item() of a returned tensor" in n for n in t.notes)


def _logged(x, w):
    loss = torch.tanh(x @ w).sum()
    return loss, loss.item()


def _used(x, w):
    loss = torch.tanh(x @ w).sum()
    return loss * loss.item()  # NOTE: the number is read by the computation: it cannot wait


def _not_returned(x, w):
    return torch.tanh(x @ w), (x @ w).sum().item()


@pytest.mark.parametrize("fn, deferred", [(_logged, True), (_used, False), (_not_returned, False)],
                         ids=["logged", "number-read-later", "tensor-not-returned"])
def test_only_an_item_of_a_returned_tensor_read_by_nothing_else_moves(fn, deferred):
    x, w = torch.randn(16, 16), torch.randn(16, 16, requires_grad=True)
    j = thunder.jit(fn, transforms=[_emulated()])
    with emulated_capture():
        got = j(x, w)
    want = fn(x, w)
    for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        if isinstance(b, torch.Tensor):
            assert_equal(a, b)
        else:
            assert a == pytest.approx(b, rel=1e-6)
    assert ("item" in _names(_epilogue(j))) is deferred
    assert ("item" in _names(thunder.last_traces(j)[-1])) is not deferred


def test_defer_items_false_keeps_the_item_in_the_forward():
    x, w = torch.randn(16, 16), torch.randn(16, 16, requires_grad=True)
    j = thunder.jit(_logged, transforms=[FixedCUDAGraphTransform(capture=False, defer_items=False)])
    j(x, w)
    assert "item" in _names(thunder.last_traces(j)[-1]) and "item" not in _names(_epilogue(j))


def test_without_autograd_the_number_still_comes_back():
    x, w = torch.randn(16, 16), torch.randn(16, 16)
    j = thunder.jit(_logged, transforms=[_emulated()])
    with emulated_capture():
        for _ in range(3):
            x = torch.randn(16, 16)
            loss, logged = j(x, w)
            assert type(logged) is float and logged == pytest.approx(_logged(x, w)[1], rel=1e-6)
            assert logged == loss.item()
