"""``F.nll_loss`` under thunder and thunder-nb takes PyTorch's signature and defaults, and
``F.binary_cross_entropy_with_logits`` its ``pos_weight`` and ``weight`` (`thunder_nb.internals.nll_loss`):
thunder 0.2.6 failed ``F.nll_loss(F.log_softmax(x, 1), target)`` (PyTorch's MNIST example's loss) with or without a
gradient, and read a fourth positional argument (PyTorch's deprecated ``size_average``) as ``ignore_index``: with
``size_average=False`` it ignored the targets of class 0, silently. (A non-contiguous 4-d input's gradient still fails
in thunder's torch executor: "grad_input must be contiguous".) thunder ran the second as an opaque call that refused a
weight tensor ("keyword argument that requires gradient")."""

from __future__ import annotations

import pytest
import thunder
import torch
import torch.nn.functional as F

from programs import assert_jit_step_trains_as_eager
from thunder_nb.diagnosis.judge import assert_equal
from thunder_nb.internals import nll_loss

TARGET = torch.tensor([0, 1, 3, 2, 1, 3])
#: (name, the loss of log-probabilities of 6 samples of 4 classes)
CASES = {
    "defaults": lambda p: F.nll_loss(p, TARGET),
    "targets -100 ignored": lambda p: F.nll_loss(p, torch.tensor([0, -100, 3, 2, -100, 1])),
    "class weights, sum": lambda p: F.nll_loss(p, TARGET, weight=torch.tensor([1.0, 2.0, 0.5, 3.0], dtype=p.dtype),
                                               reduction="sum"),
    "ignore_index=2, none": lambda p: F.nll_loss(p, TARGET, ignore_index=2, reduction="none"),
    "size_average=False (deprecated, positional)": lambda p: F.nll_loss(p, TARGET, None, False),
    "2-d targets": lambda p: F.nll_loss(p.reshape(2, 3, 4)[..., :2].reshape(2, 3, 2, 1).expand(2, 3, 2, 2) * 1,
                                        torch.tensor([[[0, 1], [2, 1]], [[2, 2], [0, -100]]])),
}


@pytest.mark.filterwarnings("ignore:size_average and reduce args will be deprecated")  # NOTE: PyTorch's, eager's too
@pytest.mark.parametrize("case", CASES)
def test_nll_loss_and_its_gradient_equal_eagers(case):
    assert nll_loss.installed()  # NOTE: the session's conftest installs it, as thunder-nb's first entry point does
    logits = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    loss = CASES[case]

    def run(fn):
        value = fn(logits)
        return value, torch.autograd.grad(value.sum(), [logits])[0]

    def of_logits(x):
        return loss(F.log_softmax(x, 1))

    assert_equal(run(thunder.jit(of_logits)), run(of_logits), label=f"{case}: loss and gradient")
    with torch.no_grad():
        assert_equal(thunder.jit(of_logits)(logits), of_logits(logits), label=f"{case}: without a gradient")


def test_an_mnist_style_classifier_trains_under_jit_step_as_eager():
    """PyTorch's MNIST example's step: ``log_softmax`` then ``F.nll_loss``, AdamW over 4 steps in jit_step."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    target = torch.tensor([0, 2, 1, 2])
    assert_jit_step_trains_as_eager(net, lambda model, x: F.nll_loss(F.log_softmax(model(x), dim=1), target))


BCE = {
    "defaults": {},
    "pos_weight": {"pos_weight": torch.linspace(0.5, 3.0, 5, dtype=torch.float64)},
    "weight, sum": {"weight": torch.linspace(0.5, 1.5, 5, dtype=torch.float64), "reduction": "sum"},
    "pos_weight, none": {"pos_weight": torch.full((5,), 2.0, dtype=torch.float64), "reduction": "none"},
}


@pytest.mark.parametrize("case", BCE)
def test_binary_cross_entropy_with_logits_and_its_gradients_equal_eagers(case):
    """The loss and its gradients for the logits and for soft targets (label smoothing's), as eager's."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 5, dtype=torch.float64, generator=generator).requires_grad_()
    targets = ((torch.rand(6, 5, dtype=torch.float64, generator=generator) > 0.5).double() * 0.8 + 0.1).requires_grad_()

    options = BCE[case]  # NOTE: not read from the dict by its key inside: thunder names a tensor so read after the key

    def loss(x, y):
        return F.binary_cross_entropy_with_logits(x, y, **options)

    def run(fn):
        value = fn(logits, targets)
        return value, torch.autograd.grad(value.sum(), [logits, targets])

    assert_equal(run(thunder.jit(loss)), run(loss), label=f"{case}: loss and gradients")
