"""A language model's loss over padded targets with label smoothing (``F.cross_entropy(..., ignore_index=-100,
label_smoothing=0.1)``) computes eager's loss and gradient under thunder and thunder-nb (`thunder_nb.internals.losses`:
thunder 0.2.6 summed the smoothing term over the ignored targets too, silently)."""

from __future__ import annotations

import copy

import pytest
import thunder
import torch
import torch.nn.functional as F

import thunder_nb
from thunder_nb.diagnosis.judge import assert_equal
from thunder_nb.internals import losses


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "class weights"])
@pytest.mark.parametrize("ignore_index", [-100, 2])
def test_label_smoothing_averages_over_the_counted_targets(weighted, ignore_index):
    assert losses.installed()  # NOTE: the session's conftest installs it, as thunder-nb's first entry point does
    torch.manual_seed(0)
    x = torch.randn(5, 6, requires_grad=True)
    y = torch.tensor([ignore_index, 1, 3, 0, ignore_index if ignore_index >= 0 else 5])
    w = torch.rand(6) if weighted else None

    def loss(x, y, w):
        return F.cross_entropy(x, y, weight=w, ignore_index=ignore_index, label_smoothing=0.2)

    want = loss(x, y, w)
    (want_grad,) = torch.autograd.grad(want, x)
    got = thunder.jit(loss)(x, y, w)
    (got_grad,) = torch.autograd.grad(got, x)
    assert_equal(got.detach(), want.detach(), label="loss")
    assert_equal(got_grad, want_grad, label="gradient")


@pytest.mark.parametrize("how", ["thunder_nb.jit", "jit_step"])
def test_a_padded_language_model_loss_trains_as_in_eager(how):
    """Three steps of a next-token loss whose padding targets are -100, with label smoothing, as eager trains them."""
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16))
    model = copy.deepcopy(eager)
    g = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(3):
        x, y = torch.randint(0, 16, (4, 6), generator=g), torch.randint(0, 16, (4, 6), generator=g)
        y[:, 4:] = -100  # NOTE: padding at the end of each sequence
        batches.append((x, y))

    def loss_of(m):
        def loss_fn(x, y):
            return F.cross_entropy(m(x).flatten(0, 1), y.flatten(), ignore_index=-100, label_smoothing=0.1)
        return loss_fn

    def sgd_steps(m, loss_fn, whole_step=False):
        """The losses of SGD steps over ``batches``: the user's loop around ``loss_fn``, or `jit_step`'s."""
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        if whole_step:
            step = thunder_nb.jit_step(m, loss_fn, opt, capture=False)
            return [step(x, y).detach().clone() for x, y in batches]
        losses = []
        for x, y in batches:
            opt.zero_grad()
            loss = loss_fn(x, y)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return losses

    want = sgd_steps(eager, loss_of(eager))
    if how == "jit_step":
        got = sgd_steps(model, loss_of(model), whole_step=True)
    else:
        got = sgd_steps(model, thunder_nb.jit(loss_of(model)))
    assert_equal(got, want, label="losses")
    assert_equal(dict(model.named_parameters()), dict(eager.named_parameters()), label="weights")
