"""FixedCUDAGraphTransform and LegacyCUDAGraphTransform on real thunder traces, run eagerly (CPU)."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import thunder
import torch
from thunder.transforms.cudagraph import CUDAGraphTransform

import programs
import thunder_nb
from thunder_nb.cudagraph.capture import Capture
from thunder_nb.testing import emulated_capture
from thunder_nb.testing.modes import make_transform
from thunder_nb.fix import (
    HeldOutputsWarning,
    EagerFallbackWarning,
    FixedCUDAGraphTransform,
    LegacyCUDAGraphTransform,
    region_del_pass,
)
from thunder_nb.diagnosis.judge import EXACT, Tolerance, assert_equal

EAGER = dict(capture=False)


def rules(report_or_trace):
    return sorted({d.rule for d in thunder_nb.check(report_or_trace)})


def grads_of(fn, args):
    """Run ``fn`` on clones of ``args``, backprop the scalar result, return (value, grads)."""
    clones = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    out = fn(*clones)
    out.backward()
    return out.detach(), [c.grad for c in clones if c.requires_grad]


# --- #728 reproduced, and fixed ------------------------------------------------------------------


def test_legacy_reproduces_728_on_cpu():
    t = LegacyCUDAGraphTransform(**EAGER)
    jfn = thunder.jit(programs.seed, transforms=[t])
    with pytest.raises(UnboundLocalError, match="t9"):
        jfn(programs.vec())
    report = thunder_nb.analyze(jfn, error="UnboundLocalError")
    (region,) = report.forward.regions
    body = [o.text for o in region.ops]
    assert body == ["t9 = torch.sum(x, None, False, dtype=None)", "del t9", "return [t9]"]
    # the checker predicts the crash from the source alone
    assert ("use-after-del", "CUDAGraph1", "t9") in {(d.rule, d.region, d.value) for d in report.defects}
    assert "use-after-del" in rules(region.source)
    # legacy keeps item out of the region, so that is not what breaks
    assert [(i.reason, i.detail) for i in report.forward.user_islands] == [("host-sync", "item")]


def test_fixed_runs_the_seed_reproducer():
    t = FixedCUDAGraphTransform(**EAGER)
    jfn = thunder.jit(programs.seed, transforms=[t])
    x = programs.vec()
    assert jfn(x) == programs.seed(x)
    report = thunder_nb.analyze(jfn)
    assert report.transform == "fixed" and report.defects == ()
    # NOTE: the sum alone is a one-op stretch no region takes: an unfused op, not an island
    assert [(i.reason, i.detail) for i in report.forward.islands] == [("host-sync", "item")]
    assert [(i.reason, i.detail) for i in report.forward.unfused] == [("unfused", "sum")]


def test_fixed_trace_has_its_own_provenance():
    jfn = thunder.jit(programs.island, transforms=[FixedCUDAGraphTransform(**EAGER)])
    jfn(programs.vec())
    provs = [str(t.get_provenance()) for t in thunder.last_traces(jfn)]
    assert any("thunder-nb corrected CUDAGraph fusion" in p for p in provs)
    fused = next(t for t in thunder.last_traces(jfn) if "thunder-nb corrected" in str(t.get_provenance()))
    assert thunder_nb.check(fused) == []


@pytest.mark.parametrize("fusion_type", ["consecutive", "dataflow"])
@pytest.mark.parametrize("handoff", [True, False])
def test_island_program_matches_eager(fusion_type, handoff):
    t = FixedCUDAGraphTransform(scalar_handoff=handoff, **EAGER)
    jfn = thunder.jit(programs.island, transforms=[t], fusion_type=fusion_type)
    x = programs.vec()
    assert_equal(jfn(x), programs.island(x), tolerance=EXACT)
    report = thunder_nb.analyze(jfn)
    allowed = {"scalar-region-input"} if not handoff else set()
    assert set(report.rules) <= allowed, report.defects
    if handoff:
        # the 0-d tensor replaces the number, the item (and its host sync) goes: one region
        (region,) = report.forward.regions
        assert [o.callee for o in region.compute_ops] == ["torch.sin", "torch.cos", "torch.sum", "torch.mul", "torch.exp"]
    else:
        r1, r2 = report.forward.regions
        assert (r1.inputs, r1.outputs) == (("x",), ("t16", "t19"))
        assert (r2.inputs, r2.outputs) == (("t16", "f20"), ("t22",))
        assert [(i.reason, i.detail) for i in report.forward.user_islands] == [("host-sync", "item")]
        # top-level dels right after the last consumer
        top = [o.text for o in report.forward.ops]
        assert top.index("del t19") == top.index("f20 = Tensor.item(t19)") + 1
        assert top.index("del t16, f20") == top.index("[t22] = CUDAGraph2(t16, f20)") + 1


@pytest.mark.parametrize("fusion_type", ["consecutive", "dataflow"])
def test_mlp_training_step_matches_eager(fusion_type):
    args = programs.mlp_inputs()
    jfn = thunder.jit(programs.mlp, transforms=[FixedCUDAGraphTransform(**EAGER)], fusion_type=fusion_type)
    loss, grads = grads_of(jfn, args)
    ref_loss, ref_grads = grads_of(programs.mlp, args)
    assert_equal(loss, ref_loss)
    for g, r in zip(grads, ref_grads):
        assert_equal(g, r)
    report = thunder_nb.analyze(jfn)
    assert report.backward is not None and report.backward.regions
    assert report.defects == ()


def test_backward_with_saved_scalar_works():
    """thunder 0.2.6 asserts here (non-tensor saved for backward); the fixed transform does not."""
    args = (programs.vec(), programs.vec(seed_=1).requires_grad_())
    jfn = thunder.jit(programs.saved_scalar, transforms=[FixedCUDAGraphTransform(**EAGER)])
    loss, grads = grads_of(jfn, args)
    ref_loss, ref_grads = grads_of(programs.saved_scalar, args)
    assert_equal(loss, ref_loss)
    assert_equal(grads[0], ref_grads[0])
    report = thunder_nb.analyze(jfn)
    # the saved Python number reaches the backward region as a 0-d tensor filled outside the graph
    assert report.defects == ()
    (bregion,) = report.backward.regions
    (handoff,) = bregion.scalar_handoffs
    assert (handoff.number, handoff.made, handoff.tensor) == ("f57", "fill", None)


def test_stock_transform_asserts_on_the_same_backward():
    args = (programs.vec(), programs.vec(seed_=1).requires_grad_())
    jfn = thunder.jit(programs.saved_scalar, transforms=[CUDAGraphTransform()])
    with pytest.raises(AssertionError):
        jfn(*args)


# --- options and the pure pass -------------------------------------------------------------------


def test_capture_option():
    with pytest.raises(ValueError, match=r"capture must be one of 'auto', True \('on'\), False \('off'\) or 'emulated' "
                                         r"\(the CPU stand-in\), not 'yes'"):
        FixedCUDAGraphTransform(capture="yes")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="capture=True needs a CUDA GPU, and torch sees none"):
            FixedCUDAGraphTransform(capture=True)
        with pytest.raises(RuntimeError, match="capture=True needs a CUDA GPU, and torch sees none"):
            LegacyCUDAGraphTransform(capture=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU fallback")
def test_auto_mode_warns_once_and_claims_no_graph():
    t = FixedCUDAGraphTransform()
    jfn = thunder.jit(programs.island, transforms=[t], fusion_type="consecutive")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for i in range(3):
            jfn(programs.vec(seed_=i))
    assert [type(x.message) for x in w if issubclass(x.category, EagerFallbackWarning)] == [EagerFallbackWarning]
    assert t.graphs_captured == 0
    report = thunder_nb.analyze(jfn)
    assert all(r.captured is False and r.graphs == () for r in report.forward.regions)


def test_region_del_pass_on_real_bound_symbols():
    """Only region-made, non-output values are deleted, each right after its last use."""
    jfn = thunder.jit(programs.island)
    jfn(programs.vec())
    trace = thunder.last_traces(jfn)[-1]
    bsyms = [b for b in trace.bound_symbols if b.sym.name in ("sin", "cos", "sum")]
    sin, cos, total = bsyms
    x = sin.flat_proxy_args[0]
    out = region_del_pass(bsyms, inputs=[x], outputs=[total.flat_proxy_outs[0], cos.flat_proxy_outs[0]])
    names = [b.sym.name for b in out]
    assert names == ["sin", "cos", "python_del", "sum"]
    assert [p.name for p in out[2].flat_args] == [sin.flat_proxy_outs[0].name]  # t13 only; never x


def test_legacy_and_fixed_take_the_same_capture_option():
    for cls in (FixedCUDAGraphTransform, LegacyCUDAGraphTransform):
        assert cls(capture=False).cuda_graph_runner.capture is Capture.OFF
        assert cls().cuda_graph_runner.capture is Capture.AUTO


def returns_a_view_of_its_input(x):
    a = x.sin() * 2.0
    return a, x.view(2, 4)


@pytest.mark.parametrize("capture", ["emulated", pytest.param(True, marks=pytest.mark.gpu)])
def test_a_returned_view_of_an_input_is_a_view_of_the_callers_tensor(capture):
    """As in eager PyTorch (and plain thunder): not a view of the runner's static copy, nor a copy."""
    device = "cuda" if capture is True else "cpu"
    x, x2 = torch.randn(8, device=device), torch.randn(8, device=device)
    with emulated_capture() if capture == "emulated" else contextlib.nullcontext():
        t = make_transform(FixedCUDAGraphTransform, capture)
        jfn = thunder.jit(returns_a_view_of_its_input, transforms=[t])
        a, v = jfn(x)
        a2, v2 = jfn(x2)  # a replay (of a second instance: ``a`` is still held, rotation)
    assert t.graphs_captured == 2
    region = thunder_nb.analyze(jfn).traces[0].regions[0]
    assert "view" in {op.callee.rsplit(".", 1)[-1] for op in region.ops}  # the view is made in the graph
    for inp, out, view in ((x, a, v), (x2, a2, v2)):
        assert view.data_ptr() == inp.data_ptr()
        assert_equal(out, inp.sin() * 2.0)
    x.add_(1.0)
    assert_equal(v, x.view(2, 4))


def loss_of(x, w):
    h = torch.tanh(x @ w)
    return (h * 2.0).pow(2).mean()


@pytest.mark.parametrize("capture", ["emulated", pytest.param(True, marks=pytest.mark.gpu)])
def test_two_forwards_before_one_backward(capture):
    """Gradient accumulation by summing losses: the second forward must not overwrite what the first saved.

    A replay writes the graph's outputs in place without a version bump, so on a GPU the first
    backward would read the second forward's activations and give wrong gradients silently. The
    runner sees at the second call that the tensors the first saved still lie in its graph
    instance's memory, and replays a second instance; with ``max_instances=2`` a third forward with
    both held runs without a graph (`HeldOutputsWarning`); in the usual order (each backward before
    the next forward) the first instance keeps replaying.
    """
    device = "cuda" if capture is True else "cpu"
    g = torch.Generator().manual_seed(0)
    x1, x2, x3, w0 = (torch.randn(8, 8, generator=g).to(device) for _ in range(4))
    w_ref = w0.clone().requires_grad_()
    (loss_of(x1, w_ref) + loss_of(x2, w_ref)).backward()
    w_ref3 = w0.clone().requires_grad_()
    (loss_of(x1, w_ref3) + loss_of(x2, w_ref3) + loss_of(x3, w_ref3)).backward()
    w = w0.clone().requires_grad_()
    with emulated_capture() if capture == "emulated" else contextlib.nullcontext():
        t = make_transform(FixedCUDAGraphTransform, capture, max_instances=2)
        jfn = thunder.jit(loss_of, transforms=[t])
        jfn(x1, w).backward()  # capture; the usual order
        fwd = thunder_nb.analyze(jfn).forward
        assert fwd.hand_out is not None and fwd.hand_out.saved, "nothing saved for the backward: the test tests nothing"
        w.grad = None
        with warnings.catch_warnings():
            warnings.simplefilter("error", HeldOutputsWarning)
            (jfn(x1, w) + jfn(x2, w)).backward()
        assert_equal(w.grad, w_ref.grad)
        (region,) = thunder_nb.analyze(jfn).forward.regions
        assert region.stats.instances == 2 and region.stats.held_calls == 0
        w.grad = None
        with pytest.warns(HeldOutputsWarning, match="saved for the backward .* no further instance: max_instances=2"):
            (jfn(x1, w) + jfn(x2, w) + jfn(x3, w)).backward()
        assert_equal(w.grad, w_ref3.grad)
        report = thunder_nb.analyze(jfn)
        assert report.forward.regions[0].stats.held_calls == 1
        assert "without the graph: 1 call" in report.to_text()
        replays = report.forward.regions[0].stats.replays
        w.grad = None
        jfn(x2, w).backward()  # the usual order again: replayed
        assert thunder_nb.analyze(jfn).forward.regions[0].stats.replays == replays + 1
    # two forward instances; a backward graph for the saved tensors of each (read where they lie), and
    # one that copies them in (those of the forward that ran without a graph lie in no graph's memory)
    assert t.graphs_captured == 5


@pytest.mark.parametrize("capture", ["emulated", pytest.param(True, marks=pytest.mark.gpu)])
def test_forwards_kept_before_their_backwards_get_an_instance_each_while_memory_allows(capture):
    """Issue #29 point 3: three forwards kept before their backwards all replay a graph (an instance each, bounded by
    the memory an instance costs, not by a count of 2), each instance says why it exists, and a byte budget
    (``instance_bytes``) that leaves no room for a second instance runs the held call without a graph, saying so.
    """
    device = "cuda" if capture is True else "cpu"
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(8, 8, generator=g).to(device) for _ in range(3)]
    w0 = torch.randn(8, 8, generator=g).to(device)
    w_ref = w0.clone().requires_grad_()
    sum(loss_of(x, w_ref) for x in xs).backward()
    with emulated_capture() if capture == "emulated" else contextlib.nullcontext():
        t = make_transform(FixedCUDAGraphTransform, capture)
        jfn = thunder.jit(loss_of, transforms=[t])
        w = w0.clone().requires_grad_()
        for _ in range(3):  # rounds: the instances recorded in the first are replayed in the next
            w.grad = None
            with warnings.catch_warnings():
                warnings.simplefilter("error", HeldOutputsWarning)
                losses = [jfn(x, w) for x in xs]
            for loss in losses:
                loss.backward()
            assert_equal(w.grad, w_ref.grad)
        (region,) = thunder_nb.analyze(jfn).forward.regions
        assert region.stats.instances == 3 and region.stats.held_calls == 0
        causes = [g.cause for g in t.cuda_graph_runner.counts(region.name).graphs]
        assert causes == ["first call", "outputs of 1 instance still held for a backward",
                          "outputs of 2 instances still held for a backward"]

        tight = make_transform(FixedCUDAGraphTransform, capture, instance_bytes=1)  # no room for a second
        jfn = thunder.jit(loss_of, transforms=[tight])
        w = w0.clone().requires_grad_()
        jfn(xs[0], w).backward()
        w.grad = None
        with pytest.warns(HeldOutputsWarning, match=r"no further instance: another would take .* beyond instance_bytes=1"):
            losses = [jfn(x, w) for x in xs]
        for loss in losses:
            loss.backward()
        assert_equal(w.grad, w_ref.grad)
        (region,) = thunder_nb.analyze(jfn).forward.regions
        assert region.stats.instances == 1 and region.stats.held_calls == 2


def test_instance_memory_is_a_fraction_and_instance_bytes_a_count_of_bytes():
    with pytest.raises(ValueError, match="fraction of the free device memory"):
        FixedCUDAGraphTransform(instance_memory=1.5)
    with pytest.raises(ValueError, match="instance_bytes is a number of bytes"):
        FixedCUDAGraphTransform(instance_bytes="1GB")
    with pytest.raises(ValueError, match="instance_bytes is a number of bytes"):
        FixedCUDAGraphTransform(instance_bytes=1.5)


def _conv_bn_relu() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(inplace=True),
        torch.nn.Conv2d(4, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(inplace=True),
    )


@pytest.mark.parametrize("capture", ["emulated", pytest.param(True, marks=pytest.mark.gpu)])
def test_in_place_updates_run_inside_the_graph_and_once_per_call(capture):
    """Issue #31: BatchNorm's running statistics (``copy_`` into module buffers) and ``ReLU(inplace=True)``
    (``update_aliases``) no longer split a trace into a region per stretch between them (torchvision's resnet18 had
    80): the forward is one region, and its warm-up calls, which run it for real, do not apply the updates again, so
    after N training steps ``num_batches_tracked`` is N and the running statistics are eager's."""
    device = "cuda" if capture is True else "cpu"
    eager, net = _conv_bn_relu().to(device), _conv_bn_relu().to(device)
    xs = [torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(i)).to(device) for i in range(5)]
    with emulated_capture() if capture == "emulated" else contextlib.nullcontext():
        jfn = thunder.jit(net, transforms=[make_transform(FixedCUDAGraphTransform, capture)])
        for model, fn in ((eager, eager), (net, jfn)):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x in xs:
                opt.zero_grad()
                fn(x).square().mean().backward()
                opt.step()
    report = thunder_nb.analyze(jfn)
    assert len(report.forward.regions) == 1 and report.forward.islands == ()
    assert report.forward.regions[0].stats.replays == len(xs)
    for name, buf in net.named_buffers():
        assert_equal(buf, dict(eager.named_buffers())[name], tolerance=Tolerance(1e-5, 1e-6), label=name)
    assert int(net[1].num_batches_tracked) == len(xs) == int(eager[1].num_batches_tracked)
    for p, q in zip(net.parameters(), eager.parameters()):
        assert_equal(p, q, tolerance=Tolerance(1e-4, 1e-5))
