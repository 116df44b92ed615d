"""A function called under autocast, then without it, computes in its own dtypes again: thunder 0.2.6 kept the autocast
state of every call made under autocast (`thunder_nb.internals.autocast_stack`), and traced a later call without
autocast with autocast on (bfloat16 where eager PyTorch computes float32), silently."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import thunder_nb
from thunder_nb.testing.modes import capturing


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))


def _batch(i: int) -> torch.Tensor:
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(i))


@pytest.mark.parametrize("what,fast_call", [
    ("model", True), ("function", False),  # NOTE: the other two in the slow tier (each path once in the fast one)
    pytest.param("model", False, marks=pytest.mark.slow), pytest.param("function", True, marks=pytest.mark.slow)])
def test_a_call_without_autocast_after_calls_under_it_computes_as_a_fresh_compile(what, fast_call):
    model = _model()
    fn = model if what == "model" else (lambda x: model(x))
    compiled = thunder_nb.jit(fn, fast_call=fast_call)
    with warnings.catch_warnings(), capturing("emulated"):
        warnings.simplefilter("ignore")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert compiled(_batch(0)).dtype == torch.bfloat16
        got = compiled(_batch(1))
        fresh = thunder_nb.jit(model)(_batch(1))  # NOTE: never called under autocast
    assert got.dtype == torch.float32 == model(_batch(1)).dtype
    assert torch.equal(got, fresh)  # NOTE: the same kernels: exact


@pytest.mark.parametrize("capture", [pytest.param(False, marks=pytest.mark.slow), "emulated"])
def test_the_whole_step_after_autocast_computes_its_first_step_without_it_as_a_fresh_compile(capture):
    """Three steps of ``jit_step`` under bfloat16 autocast, then one without: that step's loss is what a loss function
    never compiled under autocast computes from the same weights (its capture path builds a new batch key's traces
    before it runs, `internals.build_traces`, where the earlier calls' autocast state stayed too)."""
    import copy

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = thunder_nb.jit_step(model, lambda x: model(x).float().square().mean(), opt, capture=capture, warmup=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(3):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                step(_batch(i))
        before = copy.deepcopy(model)
        want = thunder_nb.jit(lambda x: before(x).float().square().mean(), capture=False)(_batch(3))
        got = step(_batch(3))
    assert torch.equal(got.detach(), want.detach())  # NOTE: the same kernels: exact


def test_a_module_jitted_by_thunder_with_the_fixed_transform_computes_as_a_fresh_compile_too():
    """``thunder.jit(model, transforms=[FixedCUDAGraphTransform()])`` (and ``thunder.distributed.ddp`` around
    `thunder_nb.jit`, which jits the model so again): the transform makes each call of the module thunder made trace
    under that call's autocast state alone (`thunder_nb.cudagraph.call.autocast_of_each_call`)."""
    import thunder

    model = _model()
    compiled = thunder.jit(model, transforms=[thunder_nb.FixedCUDAGraphTransform(capture=False)])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert compiled(_batch(0)).dtype == torch.bfloat16
    got = compiled(_batch(1))
    fresh = thunder.jit(_model(), transforms=[thunder_nb.FixedCUDAGraphTransform(capture=False)])(_batch(1))
    assert got.dtype == torch.float32 and torch.equal(got, fresh)
