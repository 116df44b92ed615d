"""`thunder_nb.compare`: the original and the fixed transform on one call, checked against eager PyTorch."""

from __future__ import annotations

import math

import pytest
import torch

import programs
from thunder_nb.comparison import (
    EAGER_DEVICE,
    CaptureUnavailableError,
    CompareError,
    Comparison,
    TraceError,
    compare,
)
from thunder_nb.values import compare_values

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run `pytest -m gpu` there)")
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a CUDA GPU")
FAST = dict(repeats=2)


@pytest.fixture(scope="module")
def seed_stock() -> Comparison:
    return compare(programs.seed, (programs.vec(),), **FAST)


# --- what a comparison says on CPU (eager mode) ---------------------------------------------------


@no_gpu
def test_seed_against_stock_on_cpu(seed_stock):
    c = seed_stock
    assert c.verdict() == (
        "original (stock): item inside CUDAGraph1 (capture would fail), matches eager; "
        "fixed: 0 regions, 2 islands, matches eager; eager mode (no GPU): no CUDA graph captured, no speed compared"
    )
    assert c.device == EAGER_DEVICE and not c.on_cuda
    assert c.graphs == {"original": 0, "fixed": 0}
    assert c.original.transform == "stock" and c.fixed.transform == "fixed"
    assert "host-sync-in-region" in c.original.rules and c.fixed.defects == ()
    assert c.results["fixed"].ok and c.results["original"].ok
    assert c.results["fixed"].max_abs_error == 0.0
    assert set(c.timings) == {"eager", "fixed", "original"} and all(t > 0 for t in c.timings.values())


def test_cpu_verdict_claims_no_graph_or_speedup(seed_stock):
    text = seed_stock.verdict()
    assert "faster" not in text and "slower" not in text and "eager mode" in text
    rows = dict(seed_stock.run_rows())
    assert rows["graphs captured"].startswith("fixed 0, original 0 (eager mode: ")
    assert list(rows) == ["device", "value", "check fixed", "check original (stock)", "timings", "graphs captured"]


def test_legacy_reproduces_728_as_a_finding():
    c = compare(programs.seed, (programs.vec(),), original="legacy", **FAST)
    assert c.verdict().startswith("original (legacy): crashes (UnboundLocalError), t9 used after del in CUDAGraph1")
    orig = c.results["original"]
    assert not orig.ran and orig.stage == "run" and orig.error.startswith("UnboundLocalError")
    assert c.original.error.startswith("UnboundLocalError")  # the report keeps it too
    assert "original" not in c.timings
    assert c.results["fixed"].ok


def test_island_program():
    c = compare(programs.island, (programs.vec(),), **FAST)
    assert c.verdict().split("; ")[1] == "fixed: 1 region, 0 islands, matches eager"
    fixed = c.results["fixed"]
    assert fixed.ok and fixed.eager_regions and fixed.value.startswith("tensor float32[8]")
    assert c.fixed.forward.regions[0].captured is False  # ran eagerly, and the report says so


def test_original_that_fails_to_compile_is_a_finding():
    x, w = programs.vec().requires_grad_(), programs.vec(seed_=1).requires_grad_()
    c = compare(programs.saved_scalar, (x, w), training=True, **FAST)
    orig = c.results["original"]
    assert orig.stage == "trace" and orig.error.startswith("AssertionError")
    assert c.verdict().startswith("original (stock): compile fails (AssertionError), item inside CUDAGraph1")
    assert c.results["fixed"].ok and c.results["fixed"].grads_match
    assert x.grad is None and w.grad is None  # every run worked on its own clones


def test_mlp_training_compares_gradients():
    c = compare(programs.mlp, programs.mlp_inputs(), training=True, **FAST)
    for key in ("fixed", "original"):
        out = c.results[key]
        assert out.ran and out.matches and out.grads_match, (key, out)
        assert out.grads_max_abs_error is not None
    assert ", grads match" in c.verdict()
    assert c.fixed.backward is not None


def test_module_training_compares_parameter_gradients():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    class Loss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(x).pow(2).mean()

    loss = Loss()
    c = compare(loss, (torch.randn(4, 8),), training=True, **FAST)
    assert c.results["fixed"].ok and c.results["fixed"].grads_match
    assert all(p.grad is None for p in model.parameters())  # the user's module is never touched


def test_no_run_builds_traces_only():
    c = compare(programs.island, (programs.vec(),), execute=False)
    assert not c.executed and c.timings == {} and not c.results["fixed"].ran
    assert c.verdict() == (
        "original (stock): item inside CUDAGraph1 (capture would fail), not run; fixed: 1 region, 0 islands, not run"
    )
    assert c.run_rows() == [("run", "not run (--no-run): traces only")]
    assert c.fixed.forward.regions[0].captured is None


def test_text_and_mimebundle(seed_stock):
    text = seed_stock.to_text()
    heads = [seed_stock.verdict(), "== original (stock) ==", "== fixed ==", "== run ==", "timings"]
    positions = [text.index(h) for h in heads]
    assert positions == sorted(positions)
    bundle = seed_stock._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}
    assert bundle["text/html"].index("tnb-verdict") < bundle["text/html"].index("tnb-run")
    assert set(seed_stock._repr_mimebundle_(include={"text/plain"})) == {"text/plain"}
    assert set(seed_stock._repr_mimebundle_(exclude={"text/plain"})) == {"text/html"}


def test_comparison_is_frozen(seed_stock):
    with pytest.raises(AttributeError):
        seed_stock.device = "cuda"


# --- errors ---------------------------------------------------------------------------------------


def _float_of_sum(x):
    return float(x.sum())


def test_untraceable_function_raises_trace_error():
    with pytest.raises(TraceError, match=r"thunder cannot trace _float_of_sum: NotImplementedError: casting"):
        compare(_float_of_sum, (programs.vec(),), **FAST)


@no_gpu
def test_capture_on_without_gpu():
    with pytest.raises(CaptureUnavailableError, match="needs a CUDA GPU, and torch sees none"):
        compare(programs.seed, (programs.vec(),), capture=True)


def test_training_needs_grad_inputs_and_a_scalar():
    with pytest.raises(CompareError, match="requires grad"):
        compare(programs.island, (programs.vec(),), training=True)
    with pytest.raises(CompareError, match=r"scalar tensor .* returned a tensor of shape \(8,\)"):
        compare(programs.island, (programs.vec().requires_grad_(),), training=True)


@pytest.mark.parametrize(
    "option, message",
    [
        (dict(original="nightly"), r"unknown original: 'nightly' \(must be one of \['stock', 'legacy'\]\)"),
        (dict(capture="yes"), r"unknown capture: 'yes'"),
        (dict(repeats=0), "repeats must be at least 1"),
    ],
)
def test_bad_options(option, message):
    with pytest.raises(ValueError, match=message):
        compare(programs.seed, (programs.vec(),), **option)


# --- value checks ---------------------------------------------------------------------------------


def test_compare_values_nested():
    t = torch.arange(4.0)
    ok, err, why = compare_values((t + 1e-7, {"n": 3, "f": 0.5}), (t, {"n": 3, "f": 0.5}))
    assert ok and why is None and err == pytest.approx(1e-7, abs=1e-7)
    ok, err, why = compare_values((t + 1, 3), (t, 3))
    assert not ok and err == 1.0 and why.startswith("[0]: Tensor-likes are not close")
    assert compare_values(3, 4) == (False, 1, "result: 3 against eager's 4")
    assert compare_values([t], (t,))[0] is False
    ok, _, why = compare_values(t, t.double())
    assert not ok and "torch.float32" in why and "torch.float64" in why
    assert compare_values(float("nan"), float("nan"))[0]
    assert compare_values(1.0, 1.0 + 1e-9)[0] and not compare_values(1.0, 1.1)[0]
    ok, err, _ = compare_values(torch.tensor([math.nan, 1.0]), torch.tensor([math.nan, 1.0]))
    assert ok and err == 0.0


# --- GPU: real capture ----------------------------------------------------------------------------


@pytest.mark.gpu
@needs_gpu
def test_gpu_capture_verdicts():
    x = programs.vec(device="cuda")
    seed = compare(programs.seed, (x,), capture=True, repeats=5)
    torch.randn(4, device="cuda")  # the original's failed capture leaves CUDA's RNG usable
    island = compare(programs.island, (x,), capture=True, repeats=20)
    mlp = compare(programs.mlp, programs.mlp_inputs("cuda"), training=True, capture=True, repeats=20)
    for c in (seed, island, mlp):
        print(f"GPU verdict {c.function}: {c.verdict()}")
        print(c.run_text())
    assert seed.on_cuda and seed.device == "cuda"
    assert seed.verdict().startswith("original (stock): capture fails, item inside CUDAGraph1")
    assert seed.results["fixed"].ok
    assert island.results["fixed"].ok and island.graphs["fixed"] >= 1
    assert ("faster than eager" in island.verdict()) or ("slower than eager" in island.verdict())
    assert mlp.results["fixed"].ok and mlp.results["fixed"].grads_match and mlp.graphs["fixed"] >= 1
