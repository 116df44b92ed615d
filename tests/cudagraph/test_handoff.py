"""Python numbers handed to regions as 0-d device tensors without re-capture, run eagerly on CPU.

Each program's result must equal eager PyTorch bit for bit; the GPU tests repeat the float case
with real capture and count graphs.
"""

from __future__ import annotations

import pytest
import thunder
import torch

import programs
import thunder_nb
from thunder_nb.fix import FixedCUDAGraphTransform
from thunder_nb.diagnosis.judge import EXACT, assert_equal


def int_scalar(x):
    y = (x * 10).int()
    n = y.sum().item()  # an int64 sum meets int32 tensors
    return (y * n).abs()


def int_scalar_same_dtype(x):
    n = (x > 0).sum().item()
    return (x > 0).long() * n


def bool_scalar(x):
    b = (x.sum() > 0).item()
    return torch.where(x > 0, x, x * b)


def lowp(x):
    y = x.sin()
    s = y.sum().item()
    return (y * s).cos()


def several_regions(x):
    y = x.cos()
    s = y.sum().item()
    z = (y * s).sin()
    t = z.amax().item()  # returned: this island stays
    w = (z * s).exp()
    return w, t


def returned_scalar(x):
    y = x.sin()
    s = y.sum().item()
    return (y * s).cos(), s


def mixed_precision(x):
    s = x.float().sum().item()  # a float32 number meets bfloat16 tensors
    return (x.cos() * s).sin()


def run(fn, x, **kw):
    t = FixedCUDAGraphTransform(capture=False, **kw)
    jfn = thunder.jit(fn, transforms=[t])
    out = jfn(x)
    return out, thunder_nb.analyze(jfn), t


def assert_same(a, b):
    if isinstance(a, (tuple, list)):
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif isinstance(a, torch.Tensor):
        assert_equal(a, b, tolerance=EXACT)
    else:
        assert a == b


def test_float_scalar_becomes_the_tensor_it_came_from():
    x = programs.vec(64)
    out, report, _ = run(programs.island, x)
    assert_same(out, programs.island(x))
    assert report.defects == ()
    assert report.forward.user_islands == ()  # the item and its host sync are gone


def test_int_scalar_of_another_dtype_is_its_int64_tensor():
    x = programs.vec(64)
    out, report, t = run(int_scalar, x)
    assert_same(out, int_scalar(x))
    assert report.defects == ()
    (handoff,) = [h for r in report.forward.regions for h in r.scalar_handoffs]
    assert handoff.tensor is not None and report.forward.value(handoff.tensor).type.dtype == "i64"
    assert report.forward.user_islands == ()  # the item, and its host sync, are gone


def test_int_scalar_of_the_same_dtype_stays_on_the_device():
    x = programs.vec(64)
    out, report, _ = run(int_scalar_same_dtype, x)
    assert_same(out, int_scalar_same_dtype(x))
    assert report.defects == () and report.forward.user_islands == ()


def test_bool_scalar_is_not_traceable_by_thunder_0_2_6():
    """Documents why there is no bool hand-off test: thunder itself cannot trace the use of the number."""
    with pytest.raises(TypeError, match="float\\(\\) argument"):
        thunder.jit(bool_scalar)(programs.vec(64))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_scalar_from_the_same_dtype(dtype):
    x = programs.vec(64, dtype=dtype)
    out, report, _ = run(lowp, x)
    assert_same(out, lowp(x))
    assert report.defects == ()
    assert report.forward.user_islands == ()


def test_scalar_used_by_several_regions():
    x = programs.vec(64)
    out, report, _ = run(several_regions, x)
    assert_same(out, several_regions(x))
    assert report.defects == ()
    r1, r2 = report.forward.regions
    # s's 0-d tensor crosses from the first region into the second
    s_tensor = next(n for n in r2.inputs if n in r1.outputs and report.forward.value(n).type.shape == ())
    assert s_tensor
    assert [i.detail for i in report.forward.user_islands] == ["item"]  # t's item: t is returned


def test_scalar_also_returned_keeps_its_item():
    x = programs.vec(64)
    out, report, _ = run(returned_scalar, x)
    assert_same(out, returned_scalar(x))
    assert report.defects == ()
    assert [i.detail for i in report.forward.user_islands] == ["item"]  # still needed for the return
    # the region computes with the tensor, not the number
    assert not any(report.forward.value(n).is_scalar for r in report.forward.regions for n in r.inputs)


def test_scalar_that_reaches_the_backward_pass():
    x, w = programs.vec(), programs.vec(seed_=1).requires_grad_()
    jfn = thunder.jit(programs.saved_scalar, transforms=[FixedCUDAGraphTransform(capture=False)])
    w1 = w.detach().clone().requires_grad_()
    jfn(x, w1).backward()
    # bit for bit what the same trace computes with the Python number (thunder's own backward)
    plain = thunder.jit(programs.saved_scalar, transforms=[FixedCUDAGraphTransform(capture=False, scalar_handoff=False)])
    w2 = w.detach().clone().requires_grad_()
    plain(x, w2).backward()
    assert_equal(w1.grad, w2.grad, tolerance=EXACT)
    # and equal to PyTorch's autograd within float tolerance (thunder decomposes tanh's gradient)
    w3 = w.detach().clone().requires_grad_()
    programs.saved_scalar(x, w3).backward()
    assert_equal(w1.grad, w3.grad)
    bwd = thunder_nb.analyze(jfn).backward
    assert [str(h) for r in bwd.regions for h in r.scalar_handoffs] == ["f57 -> 0-d tensor (filled outside the graphs)"]


def test_a_float32_number_meeting_bfloat16_tensors_is_handed_over():
    x = programs.vec(64, dtype=torch.bfloat16)
    out, report, t = run(mixed_precision, x)
    assert_same(out, mixed_precision(x))
    assert report.defects == () and t.handoff_refusals == {}
    assert report.forward.user_islands == ()


def clamp_by_item(x):
    y = x.sin()
    m = y.abs().mean().item()
    return (y.clamp(max=m) * 2.0).cos()  # clamp's bound has no exact device form here


def test_a_reader_without_an_exact_form_stays_out_of_the_graph_and_says_why():
    x = programs.vec(64)
    out, report, t = run(clamp_by_item, x)
    assert_same(out, clamp_by_item(x))
    assert report.defects == ()  # no region reads the number: no graph per value
    (why,) = t.handoff_refusals.values()
    assert "clamp" in why
    assert [i.detail for i in report.forward.islands] == ["item"]
    assert [i.detail for i in report.forward.unfused] == ["clamp"]  # NOTE: kept out of graphs, but no island


def test_handoff_can_be_turned_off():
    x = programs.vec(64)
    out, report, _ = run(programs.island, x, scalar_handoff=False)
    assert_same(out, programs.island(x))
    assert report.rules == ("scalar-region-input",)


def test_a_number_left_in_the_graph_takes_a_bounded_number_of_graphs():
    """With the hand-off off, each new value of the island's number is a new graph; past max_values, none."""
    from thunder_nb.cudagraph.runner import RecaptureWarning
    from thunder_nb.testing import emulated_capture

    xs = [programs.vec(64, seed_=i) for i in range(6)]
    with emulated_capture():
        t = FixedCUDAGraphTransform(capture=False, scalar_handoff=False, max_values=3)
        t.cuda_graph_runner.capture = True
        jfn = thunder.jit(programs.island, transforms=[t])
        with pytest.warns(RecaptureWarning, match="took more than 3 values"):
            outs = [jfn(x) for x in xs]
    for x, out in zip(xs, outs):
        assert_same(out, programs.island(x))
    region = thunder_nb.analyze(jfn).forward.regions[1]
    assert len(region.graphs) == 3 and region.stats.eager_calls == 3
    assert "took more than 3 values" in region.stats.eager_reason


def test_a_handoff_is_listed_on_the_region_that_reads_it_not_on_the_one_that_returns_it():
    """Notebook 04's step: the region that makes the item's tensor only returns it; the next region reads it. The
    backward, which gets the saved number, lists its own fill."""
    torch.manual_seed(0)
    x, w1, w2 = torch.randn(16, 8), (torch.randn(8, 16) / 3).requires_grad_(), (torch.randn(16, 4) / 4).requires_grad_()

    def loss_fn(x, w1, w2):
        h = torch.tanh(x @ w1)
        scale = h.abs().mean().item()
        return ((h * scale) @ w2).pow(2).mean()

    jfn = thunder_nb.jit(loss_fn, capture=False)
    jfn(x, w1, w2).backward()
    report = thunder_nb.analyze(jfn)
    listed = {r.name: [str(h) for h in r.scalar_handoffs] for r in report.forward.regions}
    (maker, reader) = report.forward.regions
    (handoff,) = reader.scalar_handoffs
    assert listed[maker.name] == [] and handoff.tensor in reader.inputs, listed
    assert [h.made for r in report.backward.regions for h in r.scalar_handoffs] == ["fill"]
