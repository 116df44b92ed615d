"""A view read after an in-place write into its base: its value and its gradient are eager's
(`thunder_nb.internals.views`, `thunder_nb.internals.saved`).

thunder 0.2.6 passes such a view on through ``update_aliases``, whose rule hands its gradient to the view as it was
before the write: ``v = t.unsqueeze(1); t.mul_(x); v.sum()`` had eager's value and the gradient of ``t``'s old values
(2 where eager's is 4x), with no error; and where the view was returned and nothing else read the write, thunder's
split moved the write into the backward (the view held the old values, then changed during the backward). Real
thunder traces on the CPU, judged against eager.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import thunder
import thunder_nb
from programs import assert_jit_step_trains_as_eager
from thunder_nb.diagnosis.judge import assert_equal
from thunder_nb.internals import saved
from thunder_nb.fix import FixedCUDAGraphTransform
from thunder_nb.testing import emulated_capture
from thunder_nb.testing.modes import capturing, make_transform


def unsqueezed_then_written(x):
    t = x * 2
    v = t.unsqueeze(1)
    t.mul_(x)
    return v.sum()


def a_chain_of_views_then_written(x):
    t = x * 2
    v = t.unsqueeze(1).expand(4, 3).transpose(0, 1)
    t.add_(x.sin())
    return (v * v).sum()


def a_slice_then_written_twice(x):
    t = x * 3
    v = t[1:]
    t.mul_(x)
    w = v * 3
    t.add_(1.0)
    return (w + v).sum()


def a_view_returned_then_written(x):
    t = x * 2
    v = t.unsqueeze(1)
    t.mul_(x)
    return v


def a_view_then_relu_in_place(x):
    t = x * 2
    v = t.view(-1)
    t.relu_()  # NOTE: thunder 0.2.6 tags mul_ as in-place, not the activations: only the copy_ inside says so
    return v


def a_view_then_an_inplace_activation(x):
    t = x * 2
    v = t[1:].unsqueeze(0)
    torch.nn.functional.silu(t, inplace=True)
    torch.nn.functional.relu(t, inplace=True)
    return v * 3


def a_transpose_then_written(x):
    t = x.view(2, 2) * 2
    v = t.T
    t.mul_(x.view(2, 2))
    return v * 3


def flattened_then_written(x):
    t = x * 2
    v = t.flatten()  # NOTE: a 1-D tensor's flatten is the tensor itself: a view whatever its strides
    t.relu_()
    return v * 3


PROGRAMS = [unsqueezed_then_written, a_chain_of_views_then_written, a_slice_then_written_twice,
            a_view_returned_then_written, a_view_then_relu_in_place, a_view_then_an_inplace_activation,
            a_transpose_then_written, flattened_then_written]


def _x():
    return torch.randn(4, generator=torch.Generator().manual_seed(0))


def _run(fn, x):
    """The output (detached) and the gradient of its sum, and thunder-nb's InPlaceGradientWarnings."""
    x = x.detach().clone().requires_grad_()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(x)
    value = out.detach().clone()  # NOTE: before the backward, which thunder's own split let write into it
    grad, = torch.autograd.grad(out.sum(), [x])
    return value, grad, [w for w in caught if issubclass(w.category, saved.InPlaceGradientWarning)]


@pytest.mark.parametrize("jit", ["thunder_nb.jit", "thunder.jit"])
@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_a_view_read_after_a_write_into_its_base_has_eagers_value_and_gradient(fn, jit):
    """The view is taken again from the written base before thunder differentiates it: no warning is left."""
    _assert_eagers_value_and_gradient_unwarned(fn, jit)


def _assert_eagers_value_and_gradient_unwarned(fn, jit: str) -> None:
    """``fn`` under ``jit`` ("thunder_nb.jit" or "thunder.jit"): eager's value and gradient, and no
    InPlaceGradientWarning."""
    jfn = thunder_nb.jit(fn, capture=False) if jit == "thunder_nb.jit" else thunder.jit(fn)
    out, grad, caught = _run(jfn, _x())
    expected_out, expected_grad, _ = _run(fn, _x())
    assert_equal(out, expected_out, label="value")
    assert_equal(grad, expected_grad, label="gradient")
    assert not caught, [str(w.message) for w in caught]


def test_thunders_own_gradient_misses_the_write():
    """With thunder's own split and grad transform back, ``v.sum()`` after ``t.mul_(x)`` gets the gradient of
    ``sum(2x)``, 2, where eager's is ``4x``; and a returned view holds ``2x`` after the call (the write moved into the
    backward)."""
    x = _x()
    saved.uninstall()
    try:
        _, wrong, _ = _run(thunder.jit(unsqueezed_then_written), x)
        stale, _, _ = _run(thunder.jit(a_view_returned_then_written), x)
    finally:
        assert saved.install()
    assert_equal(wrong, torch.full_like(x, 2.0), label="thunder's own gradient")
    assert_equal(_run(unsqueezed_then_written, x)[1], 4 * x, label="eager's gradient")
    assert_equal(stale, (2 * x).unsqueeze(1), label="thunder's own returned view: the value before the write")


def reshaped_then_written(x):
    t = x * 2
    v = t.reshape(4, 1)  # NOTE: reshape may copy: not taken again, so the split warns
    t.mul_(x)
    return v


def test_a_view_through_an_op_that_may_copy_keeps_eagers_value_and_warns_of_its_gradient_naming_the_line():
    """``reshape`` returns a view here, but may copy: it is not taken again from the written base, and thunder's
    gradient for it stays the old view's. The value is eager's right after the call and after the backward (the
    write stays in the forward), and the warning names the line of the write."""
    x = _x()
    out, _, caught = _run(thunder.jit(reshaped_then_written), x)
    assert_equal(out, reshaped_then_written(x.clone()), label="value")
    line = reshaped_then_written.__code__.co_firstlineno + 3
    assert len(caught) == 1 and f"test_views.py:{line}" in str(caught[0].message), [str(w.message) for w in caught]


def test_a_returned_view_stays_eagers_through_the_backward():
    """The write into a returned view's base runs in the forward, not during the backward."""
    x = _x().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", saved.InPlaceGradientWarning)
        out = thunder.jit(reshaped_then_written)(x)
    expected = reshaped_then_written(x.detach().clone())
    assert_equal(out.detach(), expected, label="right after the call")
    out.sum().backward()
    assert_equal(out.detach(), expected, label="after the backward")


class Broadcast(torch.nn.Module):
    """A model that scales a hidden layer in place after taking a view of it: ``v = h.unsqueeze(1); h.mul_(s)``."""

    def __init__(self):
        super().__init__()
        self.lin, self.scale, self.out = torch.nn.Linear(8, 16), torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)

    def forward(self, x):
        h = torch.sin(self.lin(x))  # NOTE: sin's backward reads its input, so eager allows the write
        v = h.unsqueeze(1)
        h.mul_(torch.sigmoid(self.scale(x)))
        return self.out(v.squeeze(1))


def test_a_training_loop_through_a_view_of_a_tensor_scaled_in_place_trains_as_eager():
    """jit_step's whole step: the losses and weights of 4 AdamW steps equal eager's (thunder 0.2.6 never trained
    ``scale``: its gradient went to the view before the write)."""
    torch.manual_seed(0)
    assert_jit_step_trains_as_eager(Broadcast(), lambda model, x: model(x).square().mean())


def a_base_read_after_a_write_into_its_slice(x):
    t = x * 2
    v = t[1:]
    v.mul_(x[1:])  # NOTE: a write through a view: thunder's alias update hands t's gradient to t before it
    return t.sum()


def a_base_returned_after_a_write_through_a_chain_of_views(x):
    t = (x * 2).unsqueeze(0).expand(3, 4) * 1.0
    v = t.select(0, 1).unsqueeze(0).transpose(0, 1)
    v.tanh_()  # NOTE: the CPU fuzzer's programs 2897 and 3415: the base returned, or read, after the write
    return t


def a_view_of_the_whole_base_written_then_a_sibling_view_read(x):
    t = x.sin() * 3
    w = t[2:]
    v = t.view(2, 2)
    v.mul_(x.view(2, 2))  # NOTE: the whole base written through a view, then another view of it read
    return (w * w).sum() + t.narrow(0, 1, 2).sum()


def written_through_its_transpose_then_returned(x):
    t = x.view(2, 2) * 2
    t.T.mul_(x.view(2, 2).cos())  # NOTE: .T is thunder's transpose prim: thunder 0.2.6 lost the write's value too
    return t


def written_through_narrow_from_the_end(x):
    t = x.cos() * 2
    t.narrow(0, -2, 2).mul_(x[:2])  # NOTE: narrow counts a negative start from the end (to the last element here)
    return t * x


def a_view_written_then_read_itself(x):
    t = x * 3
    v = t[:2]
    v.add_(x[2:])
    return v * t[1:3]


def two_slices_written_in_turn(x):
    t = x * 2
    t[:2].mul_(x[2:])
    t[1:].mul_(3.0)  # NOTE: a second write through another view, after the first was rebuilt into the base
    return t * x


def written_through_a_view_then_the_base_written(x):
    t = x * 2
    t[1:].mul_(x[1:])
    t.add_(x)  # NOTE: the base written again after: it goes on from the base rebuilt for this write
    return t * x


def the_same_view_written_twice(x):
    t = x.cos()
    v = t.flatten()
    v.add_(x)
    v.tanh_()  # NOTE: the same view written again before any read of the base (the CPU fuzzer's program 9780)
    return t * x


def copied_into_a_slice(x):
    t = x.cos()
    t[1:3].copy_(x[:2] * 5)  # NOTE: thunder 0.2.6 tags no copy_ as in-place: the copied values got no gradient
    return t * x


def copied_into_its_even_and_odd_elements(x):
    t = torch.zeros_like(x)
    t[::2].copy_(x[:2] * 2)
    t[1::2].copy_(x[2:].sin())  # NOTE: two writes through views: the backward failed ("assert not args")
    return t * x


def written_through_its_diagonal(x):
    t = x.view(2, 2) * 2
    t.diagonal().add_(x[:2].cos())  # NOTE: thunder differentiated diagonal as a gather, a copy: the write was lost
    return t * x.view(2, 2)


def its_diagonal_filled(x):
    t = x.view(2, 2).sin()
    t.diagonal().fill_(0.5)  # NOTE: fill_ (thunder_nb.internals.tensor_api) through the diagonal
    return t * x.view(2, 2)


WRITTEN_THROUGH_A_VIEW = [a_base_read_after_a_write_into_its_slice,
                          a_base_returned_after_a_write_through_a_chain_of_views,
                          a_view_of_the_whole_base_written_then_a_sibling_view_read, a_view_written_then_read_itself,
                          written_through_narrow_from_the_end, written_through_its_transpose_then_returned,
                          two_slices_written_in_turn, written_through_a_view_then_the_base_written,
                          the_same_view_written_twice, copied_into_a_slice, copied_into_its_even_and_odd_elements,
                          written_through_its_diagonal, its_diagonal_filled]


@pytest.mark.parametrize("jit", ["thunder_nb.jit", "thunder.jit"])
@pytest.mark.parametrize("fn", WRITTEN_THROUGH_A_VIEW, ids=lambda f: f.__name__)
def test_a_base_read_after_a_write_through_its_view_has_eagers_value_and_gradient(fn, jit):
    """The base is rebuilt out of place from its old values and the written view (thunder's ``setitem`` and the
    views undone) for the reads after the write: eager's gradient (CopySlices), no warning left."""
    _assert_eagers_value_and_gradient_unwarned(fn, jit)


class SliceScaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.scale, self.out = torch.nn.Linear(8, 16), torch.nn.Linear(8, 6), torch.nn.Linear(16, 1)

    def forward(self, x):
        h = torch.sin(self.lin(x))
        h[:, 2:8].mul_(torch.sigmoid(self.scale(x)))  # NOTE: a write through a slice, then the whole of h read
        return self.out(h)


def test_a_training_loop_that_scales_a_slice_in_place_trains_as_eager():
    """jit_step's whole step: the losses and weights of 4 AdamW steps equal eager's (thunder 0.2.6 gave ``lin`` the
    gradient of ``h`` before the write, the scaled part's included)."""
    torch.manual_seed(0)
    assert_jit_step_trains_as_eager(SliceScaled(), lambda model, x: model(x).square().mean())


def test_thunders_own_gradient_of_a_base_written_through_its_view_is_wrong():
    """With thunder's own grad transform back, ``t.sum()`` after ``t[1:].mul_(x[1:])`` gets the gradient of
    ``sum(2x)``: 2 for every element, where eager's is ``4x`` past the first."""
    x = _x()
    saved.uninstall()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", saved.InPlaceGradientWarning)
            _, wrong, _ = _run(thunder.jit(a_base_read_after_a_write_into_its_slice), x)
    finally:
        assert saved.install()
    assert_equal(wrong, torch.full_like(x, 2.0), label="thunder's own gradient")
    assert_equal(_run(a_base_read_after_a_write_into_its_slice, x)[1], torch.cat([x.new_ones(1) * 2, 4 * x[1:]]),
                 label="eager's gradient")


def written_through_a_reshape_then_the_base_read(x):
    t = x * 2
    v = t.reshape(2, 2)  # NOTE: reshape may copy (not here): the base is not rebuilt from it
    v.mul_(x.view(2, 2))
    return t.sum()


def written_through_a_view_then_through_a_slice_of_it(x):
    t = x * 2
    v = t[1:]
    v.mul_(x[1:])
    v[1:].add_(1.0)  # NOTE: a slice of the written view written before any read rebuilt the base: not rebuilt
    return t.sum()


@pytest.mark.parametrize("fn", [written_through_a_reshape_then_the_base_read,
                                written_through_a_view_then_through_a_slice_of_it], ids=lambda f: f.__name__)
def test_a_write_through_a_view_it_cannot_mend_keeps_eagers_value_and_warns_naming_the_line(fn):
    """Where the base cannot be rebuilt (a view through an op that may copy; a part of the written view written again
    before the base is read), the value is eager's and the warning names the line of the write through the view."""
    x = _x()
    out, _, caught = _run(thunder.jit(fn), x)
    assert_equal(out, fn(x.clone()), label="value")
    line = fn.__code__.co_firstlineno + 3
    assert len(caught) == 1 and f"test_views.py:{line}" in str(caught[0].message), [str(w.message) for w in caught]


def written_twice_through_its_view(x):
    t = x.cos()
    v = t.flatten()
    v.add_(x)
    v[1:].tanh_()  # NOTE: a slice of the written view written again: the base is not rebuilt (after program 9780)
    return x * 2, t  # NOTE: the first output needs no write: its get_grad is sorted before them


@pytest.mark.parametrize("fusion_type", ["consecutive", "dataflow"])
def test_a_write_it_cannot_mend_is_warned_in_whatever_order_thunders_fusion_pass_leaves_the_trace(fusion_type):
    """With ``fusion_type="dataflow"`` (a ``thunder.jit`` option, ThunderFX's default) thunder's fusion pass sorts the
    joint trace by its data alone, and the backward's first ``get_grad`` stood before the forward's writes: the
    split's check read the forward only up to it and said nothing of a gradient it knew to be wrong. The forward is
    what the outputs and the writes need, wherever it stands (`thunder_nb.internals.storage.forward_of`)."""
    x = _x()
    out, _, caught = _run(lambda x: torch.cat(thunder.jit(written_twice_through_its_view, fusion_type=fusion_type)(x)),
                          x)
    assert_equal(out, torch.cat(written_twice_through_its_view(x.clone())), label="value")
    line = written_twice_through_its_view.__code__.co_firstlineno + 3
    assert len(caught) == 1 and f"test_views.py:{line}" in str(caught[0].message), [str(w.message) for w in caught]


def written_through_a_view_of_a_slice_and_returned(x):
    t1 = x * -1.0
    t3 = t1[2:].unsqueeze(1)
    t5 = t3.view(-1)
    t7 = x - t1  # NOTE: read before the write
    t5.mul_(0.25)
    return t7, t5, t3  # NOTE: the CPU fuzzer's programs 1723 and 4696, cut down: the views returned as they are


@pytest.mark.parametrize("fusion_type", ["consecutive", "dataflow"])
def test_the_mends_own_copy_back_into_a_rebuilt_base_is_not_warned_of(fusion_type):
    """The mend of a base read after a write through its view copies the rebuilt base back into its memory: that
    write puts there what the write through the view put there already, and makes no view taken before it stale. The
    split took it for the user's write and warned of a wrong gradient (naming "copy_", no line of the user's) where
    the gradient is eager's."""
    def flat(fn):
        return lambda x: torch.cat([t.flatten() for t in fn(x)])

    x = _x()
    jfn = thunder.jit(written_through_a_view_of_a_slice_and_returned, fusion_type=fusion_type)
    out, grad, caught = _run(flat(jfn), x)
    eager_out, eager_grad, _ = _run(flat(written_through_a_view_of_a_slice_and_returned), x)
    assert_equal(out, eager_out, label="value")
    assert_equal(grad, eager_grad, label="gradient")
    assert caught == [], [str(w.message) for w in caught]


def flattened_and_returned_with_its_base(x):
    t = x.sum(1)
    v = t.flatten()
    t.relu_()
    return v, t  # NOTE: eager returns one tensor twice; thunder-nb's capture hands out two tensors of that memory


def test_a_flattened_tensor_returned_with_its_written_base_has_eagers_gradient_under_capture():
    """The CPU fuzzer's program 4249: under (emulated) capture the two outputs are two tensors, and the flattened one
    had thunder's old gradient (the ReLU's mask missing); plain thunder returned one tensor twice and hid it."""
    def grad(fn):
        x = torch.randn(16, 10, generator=torch.Generator().manual_seed(0)).requires_grad_()
        v, t = fn(x)
        (v.sum() + 2 * t.sum()).backward()
        return x.grad

    expected = grad(flattened_and_returned_with_its_base)
    with emulated_capture():
        transform = make_transform(FixedCUDAGraphTransform, "emulated")
        jfn = thunder.jit(flattened_and_returned_with_its_base, transforms=[transform])
        for call in range(2):
            assert_equal(grad(jfn), expected, label=f"gradient, call {call}")


def a_view_of_the_input_returned_twice(x):
    v = x.view(-1)
    return v, x.sin() * 2.0, v.flatten()  # NOTE: `flatten` of 1-D `v` returns `v`: the region returns it twice


def the_input_flattened_and_returned(x):
    return x.flatten(), x * 2.0, x  # NOTE: 1-D: `flatten` returns `x` itself (the CPU fuzzer's program 8867)


def saved_and_returned_twice(x):
    t = torch.tanh(x)  # NOTE: 1-D: `flatten` returns `t` itself, which the backward saves
    return t.flatten(), t


@pytest.mark.parametrize("rotation", [2, 0], ids=["rotated", "copied"])
@pytest.mark.parametrize("capture", ["emulated", pytest.param(True, marks=pytest.mark.gpu)])
@pytest.mark.parametrize("fn, shape, grad", [
    (flattened_and_returned_with_its_base, (16, 10), False),
    (a_view_of_the_input_returned_twice, (2, 4), False),
    (the_input_flattened_and_returned, (8,), False),
    (saved_and_returned_twice, (8,), True),
], ids=lambda p: p.__name__ if callable(p) else None)
def test_one_tensor_returned_twice_is_one_tensor_as_in_eager(fn, shape, grad, capture, rotation):
    """A tensor a region returns at two places goes out as one object at every call, as eager returns it, whether the
    hand-out copies it, rotates it, aliases it (saved for the backward) or the replay re-makes it (a view of a copied
    input), and from the second instance too (the first call's outputs are still held)."""
    device = "cuda" if capture is True else "cpu"
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(shape, generator=g).to(device).requires_grad_(grad) for _ in range(3)]
    with capturing(capture):
        t = make_transform(FixedCUDAGraphTransform, capture, rotation=rotation)
        jfn = thunder.jit(fn, transforms=[t])
        held = [jfn(x) for x in xs]
        for call, (x, outs) in enumerate(zip(xs, held)):
            expected = fn(x)
            assert [[a is b for b in outs] for a in outs] == [[a is b for b in expected] for a in expected], call
            for i, (out, want) in enumerate(zip(outs, expected)):
                assert_equal(out, want, label=f"output {i}, call {call}")
            if grad:
                (got,) = torch.autograd.grad(sum(o.sum() for o in outs), x)
                (want,) = torch.autograd.grad(sum(o.sum() for o in expected), x)
                assert_equal(got, want, label=f"gradient, call {call}")
    # NOTE: an instance per call where each call's outputs are still held (rotated, or saved for a backward)
    assert t.graphs_captured == (6 if grad else 3 if rotation else 1)
