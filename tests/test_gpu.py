"""GPU proof: real CUDA-graph capture with thunder's stock, the legacy and the fixed transform.

Run on the GPU machine: ``pytest -m gpu -q -s`` (prints the figures it checks).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import thunder
import torch
from thunder.transforms.cudagraph import CUDAGraphTransform

import programs
import thunder_nb
from thunder_nb import render
from thunder_nb.fix import FixedCUDAGraphTransform, LegacyCUDAGraphTransform
from thunder_nb.diagnosis.judge import EXACT, assert_equal

pytestmark = pytest.mark.gpu

CUDA = "cuda"


def _bench_programs():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_programs", Path(__file__).parent.parent / "bench" / "programs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_seed_reproducer_stock_fails_legacy_crashes_fixed_runs():
    x = programs.vec(device=CUDA)
    stock = thunder.jit(programs.seed, transforms=[CUDAGraphTransform()])
    with pytest.raises(Exception) as stock_err:
        stock(x)
    thunder_nb.recover_from_failed_capture()  # NOTE: torch leaves the failed capture's stream current (#727)
    print(f"\nstock: {type(stock_err.value).__name__}: {str(stock_err.value).splitlines()[0]}")
    legacy = thunder.jit(programs.seed, transforms=[LegacyCUDAGraphTransform(capture=True)])
    with pytest.raises(UnboundLocalError):
        legacy(x)
    states = [r.stats.state_text for r in thunder_nb.analyze(legacy).forward.regions]
    assert "raised UnboundLocalError" in states, f"#728's region, raising while it is recorded, reads {states}"
    t = FixedCUDAGraphTransform(capture=True)
    fixed = thunder.jit(programs.seed, transforms=[t])
    assert fixed(x) == programs.seed(x)
    print(f"fixed: {fixed(x)} == eager {programs.seed(x)}; graphs captured: {t.graphs_captured}")
    assert thunder_nb.analyze(fixed).defects == ()


def test_island_program_matches_eager_and_captures_one_graph_per_region():
    t = FixedCUDAGraphTransform(capture=True)
    jfn = thunder.jit(programs.island, transforms=[t])
    for i in range(20):
        x = programs.vec(4096, device=CUDA, seed_=i)
        assert_equal(jfn(x), programs.island(x))
    report = thunder_nb.analyze(jfn)
    assert report.defects == ()
    assert all(r.captured and len(r.graphs) == 1 for r in report.forward.regions)
    assert t.graphs_captured == len(report.forward.regions)
    print(f"\nisland program: {len(report.forward.regions)} region(s), {t.graphs_captured} graph(s) in 20 calls")


def test_island_program_without_handoff_recaptures_and_says_why():
    t = FixedCUDAGraphTransform(capture=True, scalar_handoff=False)
    jfn = thunder.jit(programs.island, transforms=[t])
    for i in range(5):
        jfn(programs.vec(4096, device=CUDA, seed_=i))
    report = thunder_nb.analyze(jfn)
    r2 = report.forward.regions[1]
    assert len(r2.graphs) == 5 and r2.graphs[0].cause == "first call"
    assert re.match(r"f\d+: value ", r2.graphs[1].cause), r2.graphs[1].cause
    assert report.rules == ("scalar-region-input",)


def test_mlp_training_step_matches_eager():
    def step(fn, args):
        clones = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
        loss = fn(*clones)
        loss.backward()
        return loss.detach(), [c.grad for c in clones if c.requires_grad]

    args = programs.mlp_inputs(device=CUDA)
    t = FixedCUDAGraphTransform(capture=True)
    jfn = thunder.jit(programs.mlp, transforms=[t])
    for _ in range(3):
        loss, grads = step(jfn, args)
    ref_loss, ref_grads = step(programs.mlp, args)
    assert_equal(loss, ref_loss)
    for g, r in zip(grads, ref_grads):
        assert_equal(g, r)
    # NOTE: one forward and one backward region; the loop keeps each step's gradients by name while the next backward
    # runs, so that backward finds its graph's lent gradients held: a second backward graph, gradients copied since
    assert t.graphs_captured == 3 and t.cuda_graph_runner.lending_stopped
    print(f"\nMLP step: loss {loss.item():.6f} (eager {ref_loss.item():.6f}), graphs {t.graphs_captured}")


def test_backward_with_saved_scalar_on_gpu():
    args = (programs.vec(device=CUDA), programs.vec(seed_=1, device=CUDA).requires_grad_())
    jfn = thunder.jit(programs.saved_scalar, transforms=[FixedCUDAGraphTransform(capture=True)])
    w = args[1].detach().clone().requires_grad_()
    jfn(args[0], w).backward()
    w_ref = args[1].detach().clone().requires_grad_()
    programs.saved_scalar(args[0], w_ref).backward()
    assert_equal(w.grad, w_ref.grad)


def test_returned_tensor_is_not_overwritten_by_the_next_call():
    jfn = thunder.jit(programs.island, transforms=[FixedCUDAGraphTransform(capture=True)])
    a, b = programs.vec(device=CUDA, seed_=1), programs.vec(device=CUDA, seed_=2)
    out_a = jfn(a)
    keep = out_a.clone()
    out_b = jfn(b)
    assert_equal(out_a, keep, tolerance=EXACT)
    assert not torch.equal(out_a, out_b)


def _peak_first_call(transform, x, w) -> int:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    jfn = thunder.jit(_bench_programs().matmul_chain, transforms=[transform])
    jfn(x, w)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def test_matmul_chain_graph_pool_peak_within_5_percent_of_stock():
    g = torch.Generator(device=CUDA).manual_seed(0)
    x = torch.randn(2048, 2048, device=CUDA, generator=g)
    w = torch.randn(2048, 2048, device=CUDA, generator=g) / 2048**0.5
    stock = _peak_first_call(CUDAGraphTransform(), x, w)
    fixed = _peak_first_call(FixedCUDAGraphTransform(capture=True), x, w)
    print(f"\nmatmul chain peak: stock {stock / 2**20:.1f} MiB, fixed {fixed / 2**20:.1f} MiB")
    assert fixed <= stock * 1.05


def test_a_failed_capture_leaves_the_callers_stream_current():
    """``torch.cuda.graph`` ends the capture before it leaves its stream context: when ``capture_end`` raises (an
    ``.item()`` inside thunder's own transform's capture), its capture stream stays current, and every later op ran
    on it (notebook 05's eager step after the stock side failed warned that AccumulateGrad's stream did not match).
    `recover_from_failed_capture` and `compare` put the caller's stream back."""

    def f(x):
        return x * x.sum().item()

    x = torch.randn(64, device=CUDA)
    default = torch.cuda.current_stream()
    assert default == torch.cuda.default_stream(), "an earlier test left a side stream current"
    stock = thunder.jit(f, transforms=[CUDAGraphTransform()])
    with pytest.raises(Exception):
        stock(x)
    left = torch.cuda.current_stream()
    assert left != default, "the premise: torch.cuda.graph leaves its stream current when the capture fails"
    thunder_nb.recover_from_failed_capture()
    assert torch.cuda.current_stream() == default
    result = thunder_nb.compare(f, (x,), repeats=2)
    assert not result.results["original"].ran and result.results["fixed"].matches, result.results
    states = [r.stats.state for r in result.original.forward.regions]
    assert "capture failed" in states, f"the region whose capture failed reads {states}"
    assert "capture failed" in render.region_diagram(result.original.forward).source
    assert torch.cuda.current_stream() == default, "compare left the failed capture's stream current"
    mine = torch.cuda.Stream()
    with torch.cuda.stream(mine):  # NOTE: a caller on a stream of its own gets that one back, not the default
        thunder_nb.compare(f, (x,), repeats=2)
        assert torch.cuda.current_stream() == mine
