"""An input that does not require grad, written in place with a value that does (`thunder_nb.internals.plain_inputs`):
eager PyTorch makes it require grad, thunder 0.2.6 leaves it a plain tensor, and thunder-nb says so where the user's
code writes it (the CPU fuzzer's programs 4373, 5168, 6802). Real thunder traces on the CPU, against eager."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import thunder
import thunder_nb
from thunder_nb.diagnosis.judge import assert_equal
from thunder_nb.internals.saved import InPlaceGradientWarning


def _warned(fn, *args) -> tuple[object, list[str]]:
    """``fn(*args)`` and the texts of the InPlaceGradientWarnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args)
    return out, [str(w.message) for w in caught if issubclass(w.category, InPlaceGradientWarning)]


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, generator=g), torch.randn(4, generator=g).requires_grad_()


def returns_the_written_input(x1, x2):
    x1.sub_(x2)
    return x1


def written_after_an_output_that_needs_no_write(x1, x2):
    y = x2 * 2  # NOTE: its get_grad stands before the write where thunder's fusion pass sorts by data alone
    x1.sub_(x2)
    return y, x1


def fuzz_6802(x1, x2):
    x1.sub_(x2)  # NOTE: the fuzzer's program 6802, cut down: eager's next call builds on this call's graph
    return torch.cos(x1).neg()


@pytest.mark.parametrize("jit", [thunder.jit, thunder_nb.jit], ids=["thunder.jit", "thunder_nb.jit"])
def test_an_input_written_with_a_gradient_is_warned_where_thunder_parts_from_eager(jit):
    """Returned, the written input has eager's gradient in eager PyTorch and none in thunder: the warning names the
    line. A read of it later in the same call is differentiated as eager does, and its warning names that line too
    (eager's second call would build on the first's graph)."""
    x1, x2 = _inputs()
    out = returns_the_written_input(x1, x2)
    assert out.requires_grad and out is x1
    x1, x2 = _inputs()
    out, said = _warned(jit(returns_the_written_input), x1, x2)
    assert not out.requires_grad  # NOTE: thunder's, as the warning says; eager's has a gradient
    line = returns_the_written_input.__code__.co_firstlineno + 1
    assert len(said) == 1 and f"test_inputs_written.py:{line}" in said[0] and "x.sub_(w)" in said[0], said

    x1, x2 = _inputs()
    fuzz_6802(x1, x2).sum().backward()
    expected = x2.grad
    x1, x2 = _inputs()
    out, said = _warned(jit(fuzz_6802), x1, x2)
    out.sum().backward()
    assert_equal(x2.grad, expected, label="the first call's gradient")
    assert len(said) == 1 and f"test_inputs_written.py:{fuzz_6802.__code__.co_firstlineno + 1}" in said[0], said


def detached(x1, x2):
    x1.sub_(x2.detach())
    return x1 * x2


def written_without_grad(x1, x2):
    with torch.no_grad():
        x1.sub_(x2)
    return x1 * x2


def computed_without_grad(x1, x2):
    with torch.no_grad():
        y = x2 * 2.0
    x1.sub_(y)
    return x1 * x2


def an_intermediate_written(x1, x2):
    t = x1 * 1.0
    t.sub_(x2)
    return t



@pytest.mark.parametrize("fusion_type", ["consecutive", "dataflow"])
def test_the_write_is_warned_in_whatever_order_thunders_fusion_pass_leaves_the_trace(fusion_type):
    """With ``fusion_type="dataflow"`` thunder's fusion pass sorts the joint trace by data alone, and the get_grad of
    an output that needs no write stood before the write: the check read the forward only up to it."""
    x1, x2 = _inputs()
    (_, out), said = _warned(thunder.jit(written_after_an_output_that_needs_no_write, fusion_type=fusion_type), x1, x2)
    assert not out.requires_grad
    line = written_after_an_output_that_needs_no_write.__code__.co_firstlineno + 2
    assert len(said) == 1 and f"test_inputs_written.py:{line}" in said[0], said


@pytest.mark.parametrize("fn", [detached, written_without_grad, computed_without_grad, an_intermediate_written],
                         ids=lambda f: f.__name__)
def test_no_warning_where_thunder_and_eager_agree(fn):
    """A detached value, a write or a value made under ``torch.no_grad()``, a tensor that is no input: eager's value
    and gradient, unwarned."""
    x1, x2 = _inputs()
    out = fn(x1, x2)
    out.sum().backward()
    expected = (out.detach(), x2.grad)
    x1, x2 = _inputs()
    got, said = _warned(thunder.jit(fn), x1, x2)
    got.sum().backward()
    assert said == []
    assert_equal(got.detach(), expected[0], label="value")
    assert_equal(x2.grad, expected[1], label="gradient")


@pytest.mark.parametrize("how", ["thunder.jit", "thunder_nb.jit(model)", "thunder_nb.jit(loss_fn)", "jit_step"])
def test_batchnorms_running_statistics_are_not_warned(how):
    """BatchNorm updates its running statistics (buffers, no grad) from activations that require grad: PyTorch's own
    code, which eager runs in a kernel without autograd, as thunder does, and as thunder-nb's executor of PyTorch's
    batch norm kernel does (which warned of every BatchNorm trained so, before it wrote them with grad disabled)."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    x = torch.randn(2, 3, 8, 8)
    model, before = copy.deepcopy(m), [b.clone() for b in m.buffers()]
    expected = m(x).sum()
    if how == "jit_step":
        step = thunder_nb.jit_step(model, lambda x: model(x).sum(), torch.optim.SGD(model.parameters(), lr=0.0))
        out, said = _warned(step, x)
    else:
        fn = {"thunder.jit": lambda: thunder.jit(model), "thunder_nb.jit(model)": lambda: thunder_nb.jit(model),
              "thunder_nb.jit(loss_fn)": lambda: thunder_nb.jit(lambda x: model(x))}[how]()
        out, said = _warned(fn, x)
        out = out.sum()
        out.backward()
    assert said == []
    assert_equal(out.detach(), expected.detach(), label="loss")
    for (name, got), want, old in zip(model.named_buffers(), m.buffers(), before):
        assert not torch.equal(want, old), name  # NOTE: the step did update them
        assert_equal(got, want, label=name)


@pytest.mark.parametrize("seed,class_", [(6802, "does not require grad"), (8273, "does not require grad"),
                                         (8484, "does not require grad"), (8904, "requires grad is written")])
def test_the_fuzzers_programs_where_thunder_is_wrong_so_are_warned(seed, class_):
    """The CPU fuzzer's seven programs of 7000-8799 where plain thunder is far from eager all write an input in place
    so (7159, 7452, 8004, 8114, 8168, 8273, 8484), and each is warned of; 6802 is of 6400-6999. 8273's write stands
    after the first get_grad in thunder's joint trace (its fusion_type is "dataflow"): warned since the check reads
    the forward by its data (`thunder_nb.internals.storage.forward_of`). 8904 writes into the flattened transpose of
    an input that requires grad, which thunder takes as that input: it gets no gradient. (9780's view written twice is
    mended now: tests/test_views.py's ``the_same_view_written_twice``.)"""
    from thunder_nb.testing import fuzz

    program = fuzz.generate(fuzz.RandomChooser(seed))
    fn = program.function()
    args = program.passed(program.arguments(program.make_inputs("cpu", 0), program.make_parameters("cpu", 0)))
    _, said = _warned(program.jit(fn, "cpu", fusion_type=program.fusion_type), *args)
    assert len(said) == 1 and class_ in said[0], said


def written_input_read_after(x, w):
    x.add_(w)
    return x * 2


def written_input_not_read_after(x, w):
    x.add_(w)
    return w * 2


def written_input_read_detached(x, w):
    x.add_(w)
    return w * x.detach()


def _layer_input():
    """An input that requires grad and is no leaf, as a layer's is: (what made it, it)."""
    g = torch.Generator().manual_seed(0)
    before = torch.randn(4, 5, generator=g).requires_grad_()
    return before, before * 1


@pytest.mark.parametrize("jit", [thunder.jit, thunder_nb.jit], ids=["thunder.jit", "thunder_nb.jit"])
def test_an_input_that_requires_grad_written_in_place_is_warned_where_thunder_drops_its_gradient(jit):
    """Eager differentiates through the write into a layer's input (``x.add_(w)``; ``nn.ReLU(inplace=True)`` first
    in a compiled part of a model): what made the input gets a gradient. thunder 0.2.6 returns none for the input, and
    nothing said so: the warning names the line of the write."""
    w = torch.ones(4, 5, requires_grad=True)
    before, x = _layer_input()
    written_input_read_after(x, w).sum().backward()
    assert_equal(before.grad, torch.full_like(before, 2.0), label="eager's gradient")
    before, x = _layer_input()
    out, said = _warned(jit(written_input_read_after), x, w)
    out.sum().backward()
    assert before.grad is None  # NOTE: thunder's, as the warning says
    line = written_input_read_after.__code__.co_firstlineno + 1
    assert len(said) == 1 and f"test_inputs_written.py:{line}" in said[0] and "no gradient" in said[0], said

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.ReLU(inplace=True), torch.nn.Linear(5, 3))
    before, x = _layer_input()
    out, said = _warned(jit(net), x)
    out.sum().backward()
    assert before.grad is None and len(said) == 1 and "activation.py" in said[0], said


@pytest.mark.parametrize("fn", [written_input_not_read_after, written_input_read_detached], ids=lambda f: f.__name__)
def test_an_input_written_in_place_that_no_output_differentiates_is_not_warned(fn):
    """Nothing the outputs differentiate comes from the written input: eager gives what made it no gradient either."""
    w = torch.ones(4, 5, requires_grad=True)
    before, x = _layer_input()
    out, said = _warned(thunder.jit(fn), x, w)
    out.sum().backward()
    assert said == [] and before.grad is None
    before, x = _layer_input()
    fn(x, w).sum().backward()
    assert before.grad is None
