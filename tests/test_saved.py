"""thunder's forward keeps what its backward reads from an in-place write (`thunder_nb.internals.saved`).

thunder 0.2.6 saves for the backward a tensor that its forward then overwrites in place (``t = x.sin(); t.mul_(x)``:
the backward reads ``sin(x) * x`` where it needs ``sin(x)``), and trained with a wrong gradient and no error. Real
thunder traces on the CPU, judged against eager, or against eager written without the in-place op where eager itself
refuses the program ("modified by an inplace operation").
"""

from __future__ import annotations

import copy

import pytest
import torch

import thunder
import thunder_nb
from programs import assert_jit_step_trains_as_eager
from thunder_nb.diagnosis.judge import assert_equal
from thunder_nb.diagnosis.tolerances import EXACT
from thunder_nb.internals import saved


def mul_of_a_saved_intermediate(x):
    t = torch.sin(x)
    t.mul_(x)  # NOTE: mul's rule saves t, the sine, which copy_ then overwrites
    return t.sum()


def a_saved_view_then_its_base_written(x):
    t = torch.sin(x)
    v = t.view(2, 2)
    a = (v * x.view(2, 2)).sum()
    t.mul_(2)
    return a + t.sum()


def a_saved_view_then_its_base_written_eager(x):
    t = torch.sin(x)
    return (t * x).sum() + (t * 2).sum()


def two_writes_each_after_a_save(x):
    t = torch.sin(x)
    t.mul_(x)
    u = t * x
    t.add_(1)
    return (u + t).sum()


def two_writes_each_after_a_save_eager(x):
    t = torch.sin(x) * x
    return (t * x + t + 1).sum()


def a_buffer_written_after_its_use_was_saved(x, buffer):
    y = x * buffer
    buffer.mul_(0.5)
    return (y * buffer).sum()


def a_buffer_written_after_its_use_was_saved_eager(x, buffer):
    return (x * buffer * buffer * 0.5).sum()


#: name -> (the program, eager's equal program where eager refuses the in-place one, its inputs past x)
PROGRAMS = {
    "t.mul_(x) of a saved t": (mul_of_a_saved_intermediate, None, 0),
    "a saved view, then its base written": (a_saved_view_then_its_base_written,
                                            a_saved_view_then_its_base_written_eager, 0),
    "two writes, each after a save": (two_writes_each_after_a_save, two_writes_each_after_a_save_eager, 0),
    "a buffer written after its use was saved": (a_buffer_written_after_its_use_was_saved,
                                                 a_buffer_written_after_its_use_was_saved_eager, 1),
}


def _grad(fn, x, *others):
    x = x.detach().requires_grad_()
    return torch.autograd.grad(fn(x, *(o.clone() for o in others)), [x])[0]


def _inputs(extra: int):
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, generator=g), *(torch.randn(4, generator=g) for _ in range(extra))


@pytest.mark.parametrize("jit", ["thunder_nb.jit", "thunder.jit"])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_a_tensor_the_backward_reads_is_kept_from_a_later_write(name, jit):
    """Under thunder_nb.jit, and under plain thunder.jit once thunder-nb's entry points have run (the tests' session
    installs it as a user's first entry point does)."""
    fn, eager_fn, extra = PROGRAMS[name]
    x, *others = _inputs(extra)
    jfn = thunder_nb.jit(fn, capture=False) if jit == "thunder_nb.jit" else thunder.jit(fn)
    assert saved.installed()
    assert_equal(_grad(jfn, x, *others), _grad(eager_fn or fn, x, *others), label=f"{name}: gradient")


def _clones(trace) -> bool:
    """Whether ``trace`` runs a ``clone`` (by its symbols: its text names the test's own file, whose path may say
    "clone", as a checkout made by ``git clone`` into such a folder does)."""
    return any(b.sym.name == "clone" for b in trace.bound_symbols)


def test_thunders_own_split_reads_the_overwritten_tensor_that_install_keeps():
    """With thunder's split back, ``t.mul_(x)`` of a saved sine gets the gradient of ``sin(x) * x`` read where
    ``sin(x)`` belongs (what `saved.install` changes); installed, a clone of the sine is saved in its place."""
    x, = _inputs(0)
    saved.uninstall()
    try:
        jfn = thunder.jit(mul_of_a_saved_intermediate)
        wrong = _grad(jfn, x)
        assert not _clones(thunder.last_traces(jfn)[-1])
    finally:
        assert saved.install()
    right = _grad(mul_of_a_saved_intermediate, x)
    sine, cosine = torch.sin(x), torch.cos(x)
    assert_equal(wrong, sine * x + x * cosine, label="thunder's own gradient (the product read for the sine)")
    assert_equal(right, sine + x * cosine, label="eager's gradient")
    jfn = thunder.jit(mul_of_a_saved_intermediate)
    assert_equal(_grad(jfn, x), right, label="installed: gradient")
    assert _clones(thunder.last_traces(jfn)[-1])


@pytest.mark.parametrize("model", ["Linear, ReLU(inplace=True)", "Conv2d, BatchNorm2d, ReLU(inplace=True)"])
def test_nothing_is_copied_where_nothing_saved_is_written(model):
    """An in-place ReLU saves its mask, and BatchNorm's running statistics are written but not saved: the forward
    trace is thunder's own, with no clone, and its gradients are those of thunder's own split, bit for bit."""
    torch.manual_seed(0)
    if model.startswith("Linear"):
        net, x = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(inplace=True), torch.nn.Linear(8, 2)), \
            torch.randn(4, 8)
    else:
        net, x = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                                     torch.nn.ReLU(inplace=True)), torch.randn(2, 3, 8, 8)
    ref = copy.deepcopy(net)
    jnet = thunder.jit(net)
    jnet(x).square().sum().backward()
    saved.uninstall()
    try:
        jref = thunder.jit(ref)
        jref(x).square().sum().backward()
    finally:
        assert saved.install()
    assert not _clones(thunder.last_traces(jnet)[-1])
    body = [str(thunder.last_traces(j)[-1]).split("\n", 1)[1] for j in (jnet, jref)]  # NOTE: past the timed header
    assert body[0] == body[1]
    assert_equal({k: p.grad for k, p in net.named_parameters()}, {k: p.grad for k, p in ref.named_parameters()},
                 tolerance=EXACT, label="gradients")


class Gated(torch.nn.Module):
    """A model with an in-place op whose operand the backward reads: ``h = sin(lin(x)); h.mul_(lin(x))``."""

    def __init__(self):
        super().__init__()
        self.lin, self.out = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)

    def forward(self, x):
        z = self.lin(x)
        h = torch.sin(z)
        h.mul_(z)
        return self.out(h)


def test_a_training_loop_through_an_in_place_gate_trains_as_eager():
    """jit_step's whole step over a model with ``h.mul_(z)``: the losses and weights of 4 AdamW steps equal eager's
    (thunder 0.2.6's backward read the product for the sine)."""
    torch.manual_seed(0)
    assert_jit_step_trains_as_eager(Gated(), lambda model, x: model(x).square().mean())
