"""Minimal reproducers of the bugs the differential fuzzer (tests/test_fuzz.py, bench/fuzz.py) found.

Each test is the smallest program that showed one bug, named after the behaviour it guards. A test
of an open bug is strict-xfail and has an entry in `thunder_nb.testing.fuzz.KNOWN_BUGS` (the fuzzer
counts further hits there instead of failing); when the bug is fixed, drop both. All run on CPU but
the last one; "emulated capture" is `thunder_nb.testing.emulated_capture`, thunder's capture path
with CPU stand-ins for graphs.
"""

from __future__ import annotations

import warnings

import pytest
import thunder
import torch
from thunder.transforms.cudagraph import CUDAGraphTransform

import thunder_nb
from thunder_nb.fix import FixedCUDAGraphTransform, LegacyCUDAGraphTransform
from thunder_nb.testing import emulated_capture, fuzz
from thunder_nb.testing.modes import make_transform
from thunder_nb.diagnosis.judge import assert_equal
from thunder_nb.internals.saved import InPlaceGradientWarning


def fixed(fn, **options):
    """``fn`` compiled with the fixed transform, regions run eagerly."""
    fusion_type = options.pop("fusion_type", "consecutive")
    return thunder.jit(fn, transforms=[FixedCUDAGraphTransform(capture=False, **options)], fusion_type=fusion_type)


def test_every_known_bug_has_its_regression_test():
    names = {b.regression_test for b in fuzz.KNOWN_BUGS}
    assert names <= set(globals()), sorted(names - set(globals()))


# --- the checker (fixed) -----------------------------------------------------------------------


def number_output(x):
    return x.sin(), x.sum().item()


def test_never_freed_reports_the_placeholder_of_a_none_cotangent():
    """A number output has no cotangent: the backward trace unpacks it as ``t6, _, = cotangents``.

    Was: `never-freed` reported ``_`` (no value: its type comment is ``# None``), on plain
    ``thunder.jit``'s backward trace too.
    """
    x = torch.randn(4, requires_grad=True)
    jfn = fixed(number_output)
    out, _ = jfn(x)
    out.sum().backward()
    assert thunder_nb.analyze(jfn).defects == ()


def updates_its_input(x):
    x.mul_(2.0)
    return x.sin()


def test_never_freed_reports_an_input_updated_in_place():
    """``analyze`` checks thunder's last trace, "Unwrap the actual return value", which drops ``flat_args``.

    Was: the fusion trace returns the updated input (``'flat_args': [t13]``); after the unwrap pass
    nothing consumed ``t13`` and `never-freed` reported it, though it aliases the caller's tensor.
    """
    x = torch.randn(4)
    expected = updates_its_input(x.clone())
    jfn = fixed(updates_its_input)
    assert_equal(jfn(x), expected)
    assert thunder_nb.analyze(jfn).defects == ()


# --- the fixed transform: wrong results (fixed) ----------------------------------------------------


def read_then_update(x):
    s = x[0].item()
    x.mul_(2.0)
    return x + 1.0, s


def test_dataflow_fusion_keeps_a_read_before_an_in_place_update():
    """``s = x[0].item()`` must read ``x`` before ``x.mul_(2.0)`` updates it.

    Was: with ``fusion_type="dataflow"`` the island ``Tensor.item(t60)`` (``t60`` the view
    ``x[0]``) ran after the region holding ``copy_(t66, t64)`` into an alias of ``x``: dataflow
    fusion follows producer -> consumer edges only, so s was 2.0 instead of 1.0.
    """
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    expected = read_then_update(x.clone())
    assert expected[1] == 1.0
    jfn = fixed(read_then_update, fusion_type="dataflow", scalar_handoff=False)
    out, s = jfn(x)
    assert_equal(out, expected[0])
    assert s == expected[1]


def handoff_then_update_input(x):
    s = x[0].item()
    x.mul_(2.0)
    return x * s


def handoff_then_update_intermediate(x):
    y = x.sin()
    s = y[0].item()
    y.mul_(2.0)
    return y + s


@pytest.mark.parametrize("fn", [handoff_then_update_input, handoff_then_update_intermediate])
def test_scalar_handoff_reads_the_number_before_an_in_place_update(fn):
    """The number a region computes with is the one the program read, before the update.

    Was: `handoff_scalars` made the region read ``t60`` (the 0-d view ``x[0]``) in place of
    ``s = t60.item()``; ``x.mul_(2.0)`` in between writes through an alias of ``t60``, so the region
    computed with 2.0, not 1.0.
    """
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    expected = fn(x.clone())
    assert_equal(fixed(fn, scalar_handoff=False)(x.clone()), expected)
    assert_equal(fixed(fn)(x.clone()), expected)


# --- capture: in-place updates ---------------------------------------------------------------------


def updates_its_input_twice(x):
    x.mul_(2.0)
    s = x.sum().item()
    x.add_(1.0)
    return x.sin(), s


def updates_through_a_view(x):
    y = x.sin()
    v = y.view(2, 4)
    s = y.sum().item()
    v.mul_(2.0)
    return y, s




@pytest.mark.parametrize(
    "fn, cls",
    [
        (updates_its_input, FixedCUDAGraphTransform),
        (updates_its_input, LegacyCUDAGraphTransform),  # NOTE: one region, so no #728 crash
        (updates_its_input_twice, FixedCUDAGraphTransform),
        (updates_through_a_view, FixedCUDAGraphTransform),
    ],
)
def test_capture_keeps_in_place_updates(fn, cls):
    """Under (emulated) capture the caller's tensors and every alias see in-place updates, as eagerly.

    The runner copies each region input into a static buffer before the replay, so a region's
    ``copy_(t11, t10)`` (``t10`` from ``update_aliases((x,))``) writes into the buffer.
    ``updates_its_input``: was, `_make_fusion` looked for the destination ``t10`` among the
    region's inputs by name, never found ``x``, and nothing was written back; resolved through
    ``update_aliases`` now. ``updates_its_input_twice``: the second update, in the next region,
    wrote back into the first region's static buffer, not into ``x``; ``updates_through_a_view``:
    ``y`` was returned from before the update. Both were fixed by keeping ``copy_`` and
    ``update_aliases`` out of the fixed transform's regions (they run on the real tensors); the
    legacy transform still relies on the write-back.
    """
    x = torch.randn(8)
    x_expected = x.clone()
    expected = fn(x_expected)
    with emulated_capture():
        jfn = thunder.jit(fn, transforms=[make_transform(cls, "emulated")])
        out = jfn(x)
    assert_equal(out, expected)
    assert_equal(x, x_expected)


def test_checker_reports_a_region_that_updates_an_input_in_place():
    """Found on the GPU: thunder's stock transform loses the update too, and the checker said nothing.

    A region that ``copy_``-s into (an alias of) one of its inputs, where the runner neither keeps
    that input static nor writes it back, computes wrong values under capture: ``region-updates-input``,
    an error rule that only capture shows (like ``host-sync-in-region``). The fixed transform,
    which writes the input back, is not reported.
    """
    x = torch.randn(8)
    stock = thunder.jit(updates_its_input, transforms=[CUDAGraphTransform()])
    thunder.compile_data(stock)._get_computation_and_inputs(x)  # traces only: capture needs a GPU
    fixed_fn = thunder.jit(updates_its_input, transforms=[FixedCUDAGraphTransform(capture=False)])
    fixed_fn(x.clone())
    assert thunder_nb.analyze(fixed_fn).defects == ()
    errors = [d for d in thunder_nb.analyze(stock).defects if d.severity == "error"]
    assert [(d.region, d.trace) for d in errors] == [("CUDAGraph1", "forward")], thunder_nb.analyze(stock).defects


def updates_a_view_of_its_input_in_training(x, w):
    v = x.unsqueeze(1)
    v.add_(0.25)
    return w.sin()


def test_capture_keeps_in_place_updates_through_views_made_in_regions():
    """Found by ``bench/fuzz.py --emulate-capture`` (programs 465 and 961 of 1000).

    With a ``requires_grad`` input thunder's forward trace spells ``x.unsqueeze(1)`` as
    ``unsqueeze`` + ``expand``: two fusible view ops between two ``update_aliases`` islands, so
    ``[t38] = CUDAGraph1(t36)`` (``t36`` aliases ``x``). Under capture ``t38`` is a view of the
    runner's static copy of ``t36``; thunder 0.2.6 saves it for the backward and applies the
    ``add_`` there (plain ``thunder.jit`` updates ``x`` only once backward has run), and the update
    through that view landed in the copy, so ``x`` kept its values. With dataflow fusion any view op
    could join a region (program 961: ``t2 = x2.t()`` read after ``x2`` was updated through
    ``x2.flatten()``). Fixed in the runner: after capture it finds the outputs that are views of an
    input's static copy (`instances.view_plan`), and after each replay hands out the same view of the
    caller's tensor. (Keeping such view ops out of regions also works, but splits regions.)
    """
    x, w = torch.randn(4), torch.randn(4, requires_grad=True)
    x_expected = x.clone()
    updates_a_view_of_its_input_in_training(x_expected, w).sum().backward()
    x_plain = x.clone()
    thunder.jit(updates_a_view_of_its_input_in_training)(x_plain, w).sum().backward()
    assert_equal(x_plain, x_expected)  # thunder's own result, after backward
    with emulated_capture():
        t = make_transform(FixedCUDAGraphTransform, "emulated")
        jfn = thunder.jit(updates_a_view_of_its_input_in_training, transforms=[t])
        jfn(x, w).sum().backward()
    assert_equal(x, x_expected)
    forward = thunder_nb.analyze(jfn).traces[0]
    captured = {op.callee.rsplit(".", 1)[-1] for r in forward.regions for op in r.ops}
    assert {"unsqueeze", "expand"} <= captured, captured  # the views are still made inside the graph
    assert t.graphs_captured >= 1


def updates_a_slice_of_its_input(x):
    v = x[2:]
    v.add_(1.0)
    return v.sin()


def updates_a_view_of_its_input(x):
    v = x.view(2, 4)
    v.mul_(2.0)
    return x.sin()


@pytest.mark.parametrize("fn", [updates_a_slice_of_its_input, updates_a_view_of_its_input])
def test_checker_reports_an_update_through_a_view_of_an_input(fn):
    """Found by the date-seed fuzz run (emulated capture): the stock transform lost the update, unreported.

    The region holds ``(t20, t21) = update_aliases((t18, t19))`` where ``t18`` aliases ``x`` and
    ``t19 = Tensor.__getitem__(t18, slice(2, None))`` is a view of it, then ``copy_(t22, t21)``.
    `_in_place_updates_of_params` mapped ``update_aliases`` outputs to inputs position by position
    (``t21 -> t19``) and stopped there: ``t19`` is no parameter, so no defect. Fixed: thunder passes
    whole alias groups to ``update_aliases``, and the checker now unites every argument and result
    of one call, which reaches ``x``.
    """
    x = torch.randn(8)
    stock = thunder.jit(fn, transforms=[CUDAGraphTransform()])
    thunder.compile_data(stock)._get_computation_and_inputs(x)  # traces only: capture needs a GPU
    rules = [(d.rule, d.value) for d in thunder_nb.analyze(stock).defects if d.severity == "error"]
    assert rules == [("region-updates-input", "x")], rules


# --- found by the call protocol (2026-11-30), fixed ------------------------------------------------


def updates_its_input_from_another(x, w):
    x.add_(w.sin())
    return x.cos()


def test_hand_out_leaves_an_input_updated_from_a_region_alone():
    """Found by ``bench/fuzz.py --emulate-capture`` (program 2 of the 2026-11-30 generator).

    With ``fusion_type="dataflow"`` thunder's own passes move ``update_aliases((x,))`` ahead of
    ``sin``, so ``sin`` and ``add`` form ``[t14] = CUDAGraph1(w, t13)`` and ``t15 = copy_(t14, t13)``
    stays outside. `cudagraph.handout._graph_derived` counts everything made from a region output as graph
    memory, ``copy_``'s result too, though it lies in the destination's (``x``'s) memory: the hand-out
    then takes ``t16`` (``x`` updated, the trace's ``flat_args``) and ``cos``'s result ``t17``:
    ``(t18, t19) = thunder_nb_hand_out(t16, t17)``. The unwrap pass drops ``flat_args``, so ``t18`` is
    never used and the checker reports ``never-freed`` on the fixed transform's own trace. The
    values are right (at run time neither lies in memory a graph owns). Fixed: an in-place update's
    result is graph memory only when its destination is.
    """
    x, w = torch.randn(5), torch.randn(5)
    expected = updates_its_input_from_another(x.clone(), w)
    jfn = fixed(updates_its_input_from_another, fusion_type="dataflow")
    assert_equal(jfn(x, w), expected)
    assert thunder_nb.analyze(jfn).defects == ()


def reads_a_grad_input_only_through_item(x, w):
    s = w.mean().item()
    return x.sin(), s


@pytest.mark.parametrize("transforms", [[], [FixedCUDAGraphTransform(capture=False)]], ids=["plain", "fixed"])
def test_analyze_reads_a_forward_that_saves_nothing_for_the_backward(transforms):
    """Found by ``bench/fuzz.py`` (program 25 of the 2026-11-30 generator).

    ``w`` requires grad but reaches the outputs only through ``.item()``: thunder returns
    ``(t40, f39)`` from a forward whose output is no ``(outputs, saved)`` pair, and
    ``thunder_nb.analyze`` fails in ``internals.saved_for_backward``
    (``vjp_utils.get_saved_for_backward_tensors``: ``TypeError: 'FloatProxy' object is not
    subscriptable``; ``IndexError`` when the only output is a tensor). The call itself runs right.
    Fixed: a forward whose output is no ``(outputs, saved)`` pair saves nothing.
    """
    x, w = torch.randn(4), torch.randn(4, requires_grad=True)
    jfn = thunder.jit(reads_a_grad_input_only_through_item, transforms=transforms)
    out, s = jfn(x, w)
    assert_equal(out, x.sin())
    assert thunder_nb.analyze(jfn).defects == ()


def returns_a_view_it_updates_in_training(x):
    t = x.sin() * 2.0
    v = t.unsqueeze(1)
    t.mul_(x)
    return v


def test_a_returned_view_shows_its_bases_update_right_after_the_call():
    """Found by ``bench/fuzz.py --emulate-capture`` (program 391 of the 2026-11-30 generator).

    With ``x`` requiring grad, thunder 0.2.6's split moved ``t.mul_(x)`` into the backward trace (applied to the
    saved ``t``), so the returned view ``v`` of ``t`` showed the update only once backward had run (eager PyTorch:
    right after the call). ``t`` is ``CUDAGraph1``'s output: under capture the hand-out guards ``t`` (saved) and
    copied ``v`` (returned) out of graph memory, so the caller's ``v`` no longer shared ``t``'s memory and never saw
    the update. Fixed: a returned tensor that shares memory with a saved one is guarded with it, not copied; and
    since `thunder_nb.internals.views`, the view is taken again from the written base, which keeps the write in the
    forward: ``v`` is eager's right after the call, and stays so through the backward.
    """
    x = torch.randn(4, requires_grad=True)
    expected = returns_a_view_it_updates_in_training(x.detach().clone())
    with warnings.catch_warnings():
        warnings.simplefilter("error", InPlaceGradientWarning)
        v_plain = thunder.jit(returns_a_view_it_updates_in_training)(x)
    assert_equal(v_plain.detach(), expected, label="right after the call")
    v_plain.sum().backward()
    # NOTE: detached: autograd refuses to read a custom Function's output view whose base was updated
    assert_equal(v_plain.detach(), expected, label="after the backward")
    v_eager = fixed(returns_a_view_it_updates_in_training)(x)
    assert_equal(v_eager.detach(), expected)
    v_eager.sum().backward()
    assert_equal(v_eager.detach(), expected)
    with emulated_capture():
        jfn = thunder.jit(returns_a_view_it_updates_in_training,
                          transforms=[make_transform(FixedCUDAGraphTransform, "emulated")])
        v = jfn(x)
        assert_equal(v.detach(), expected)
        v.sum().backward()  # NOTE: the backward's regions too run under emulated capture
        assert_equal(v.detach(), expected)


def _gradients_equal_eagers(fn, calls):
    """``calls(f)`` (it calls ``f`` and runs the backward, returning the gradients) with ``fn`` eagerly and with ``fn``
    under the fixed transform in emulated capture: each gradient equal."""
    expected = calls(fn)
    with emulated_capture():
        got = calls(thunder.jit(fn, transforms=[make_transform(FixedCUDAGraphTransform, "emulated")]))
    for g, e in zip(got, expected, strict=True):
        assert_equal(g, e)


def saves_a_view_of_another_regions_output(x0, x1):
    x1.relu_()
    t1 = x1.sin()
    t3 = torch.sin(x0)
    x1.sum().item()
    t9 = t3.flatten()
    return t9.sin(), t1


def test_a_saved_view_of_another_graphs_memory_holds_that_graph_until_the_backward():
    """Found by tests/test_fuzz.py's date run of 2026-12-01 (seed 20261201), emulated capture.

    ``t3`` is one region's output, and the next region reads it as a static input, makes ``t9`` (a view
    of it) and returns it, saved for the backward. Two forwards run before one backward. The first
    region's instance must stay held while the first call's ``t9`` waits for the backward: that instance
    watches its memory by the storage's use count, which only the alias thunder's autograd connection
    makes of a saved *view* raises. Was: the runner made every view among a graph's outputs a plain
    alias (to spare that detach), ``t9`` too, so it was saved as it was; the second call replayed the
    first region over the first call's ``t3`` and its gradient came out wrong. Fixed: only views in the
    graph's own memory (watched object by object) become plain aliases.
    """
    def inputs(seed):
        g = torch.Generator().manual_seed(seed)
        return torch.randn(11, 11, generator=g).requires_grad_(), torch.randn(11, 11, generator=g)

    def two_forwards_one_backward(fn):
        a, b = inputs(0), inputs(1)
        (fn(*a)[0].sum() + fn(*b)[0].sum()).backward()
        return a[0].grad, b[0].grad

    _gradients_equal_eagers(saves_a_view_of_another_regions_output, two_forwards_one_backward)


def saves_another_regions_output_as_it_is(x):
    t1 = x + -1.0
    s = t1.amax().item()
    t3 = t1.amax(1)
    return torch.where(t3 > s * 0.5, t3, t3 * 0.5)


def test_a_saved_alias_of_another_graphs_output_holds_that_graph_until_the_backward():
    """Found by ``bench/fuzz.py --seed 20000 --n 300 --emulate-capture`` (program 20108), 2026-12-05.

    The ``.item()`` splits two regions: the first returns ``t1``, the second reads it in place and saves it for
    ``amax``'s backward as it is (``shallow_copy(t1)``: the same memory, not a view). Two forwards run before one
    backward. Was: the second graph's output was its static output object, which the graph itself keeps for good,
    so autograd saving it raised no count the first region's instance watches; the second call replayed the first
    region over the first call's ``t1``, and its gradient came out NaN (amax's backward found no maximum in it).
    Fixed: an output lying in memory another instance writes goes out as a fresh alias each call
    (`Instance.in_inputs`).
    """
    def two_forwards_one_backward(fn):
        g = torch.Generator().manual_seed(0)
        xs = [torch.randn(15, 5, generator=g).requires_grad_() for _ in range(2)]
        sum(fn(x).sum() for x in xs).backward()
        return [x.grad for x in xs]

    _gradients_equal_eagers(saves_another_regions_output_as_it_is, two_forwards_one_backward)


def returned_with_its_flatten_after_an_island(x, y):
    t = torch.where(x > -1.0, x, x * 0.5)
    s = y[2, 1].item()
    u = torch.where(t > s * 0.5, t, t * 0.5)
    return u.amax(), t, t.flatten()  # NOTE: ``flatten`` of a 1-D tensor is the tensor itself


@pytest.mark.parametrize("grad", [False, True])
def test_a_tensor_returned_with_its_flatten_made_after_an_island_is_one_object(grad):
    """Found by ``bench/fuzz.py --seed 10600 --n 600 --emulate-capture`` (program 10651), 2026-12-07.

    Eager returns ``t`` twice. The ``.item()`` splits two regions: the first returns ``t``, the second takes it as a
    static input (it lies in the first graph's memory) and makes the flatten, which is that input itself. Was: the
    second graph's output was its alias of the static input, and the hand-out put ``t`` and it out as two tensors of
    one memory (a write through one changed the other; two autograd histories). Fixed: an output that is a static
    input's alias itself goes out as the caller's tensor, as one that is the runner's copy of an input did (66050ce).
    """
    x, y = torch.randn(11, requires_grad=grad), torch.randn(11, 11)
    expected = returned_with_its_flatten_after_an_island(x, y)
    assert expected[2] is expected[1]
    if grad:
        (expected[1] * expected[2]).sum().backward()
        expected_grad, x.grad = x.grad, None
    with emulated_capture():
        jfn = thunder.jit(returned_with_its_flatten_after_an_island,
                          transforms=[make_transform(FixedCUDAGraphTransform, "emulated")])
        for _ in range(3):
            out = jfn(x, y)
            assert_equal(out[1], expected[1])
            assert out[2] is out[1]
            if grad:
                (out[1] * out[2]).sum().backward()
                assert_equal(x.grad, expected_grad)
                x.grad = None


@pytest.mark.gpu
def test_a_returned_view_shows_its_bases_update_right_after_the_call_on_gpu():
    """The same under real capture (found with emulated capture, whose replays write memory as real ones do)."""
    x = torch.randn(4, device="cuda", requires_grad=True)
    expected = returns_a_view_it_updates_in_training(x.detach().clone())
    jfn = thunder.jit(returns_a_view_it_updates_in_training, transforms=[FixedCUDAGraphTransform(capture=True)])
    v = jfn(x)
    assert_equal(v.detach(), expected, label="right after the call")
    v.sum().backward()
    assert_equal(v.detach(), expected, label="after the backward")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "fn", [updates_its_input, updates_its_input_twice,
           updates_through_a_view],
)
def test_capture_keeps_in_place_updates_on_gpu(fn):
    """Found by ``bench/fuzz.py --device cuda --capture``: 15 of 100 programs, all updating an input in place."""
    x = torch.randn(8, device="cuda")
    x_expected = x.clone()
    expected = fn(x_expected)
    jfn = thunder.jit(fn, transforms=[FixedCUDAGraphTransform(capture=True)])
    assert_equal(jfn(x), expected)
    assert_equal(x, x_expected)
