"""Activation checkpointing (``torch.utils.checkpoint``) trained under thunder-nb as eager PyTorch trains it, and the
one place where they part said (`thunder_nb.internals.checkpoint`): a BatchNorm inside the checkpointed function has its
running statistics updated twice a step by eager PyTorch (again in the recomputation: pytorch/pytorch#96136), once by
thunder."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import thunder_nb
from thunder_nb.diagnosis.judge import assert_equal
from thunder_nb.internals.checkpoint import CheckpointStatisticsWarning
from thunder_nb.testing.modes import capturing, emulate_runner, jit_capture


class Net(nn.Module):
    def __init__(self, norm: bool, checkpointed: bool = True):
        super().__init__()
        self.conv, self.head, self.checkpointed = nn.Conv2d(3, 8, 3), nn.Linear(8, 2), checkpointed
        self.block = nn.Sequential(nn.BatchNorm2d(8) if norm else nn.Identity(), nn.Conv2d(8, 8, 1), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)
        if self.checkpointed:
            h = torch.utils.checkpoint.checkpoint(self.block, h, use_reentrant=False)
        else:
            h = self.block(h)
        return self.head(h.mean((2, 3)))


def _train(model: nn.Module, how: str, steps: int = 3) -> tuple[list[torch.Tensor], list[str]]:
    """``steps`` SGD steps of ``model`` (in place) run as ``how`` says; the losses and the thunder-nb warnings."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 3, 6, 6, generator=g), torch.randint(0, 2, (4,), generator=g)) for _ in range(steps)]

    def loss_fn(x, y):
        return nn.functional.cross_entropy(model(x), y)

    losses = []
    with warnings.catch_warnings(record=True) as caught, capturing("emulated" if how != "eager" else False):
        warnings.simplefilter("always")
        if how == "jit_step":
            step = thunder_nb.jit_step(model, loss_fn, opt, capture="emulated", warmup=1)
            losses = [step(x, y).detach().clone() for x, y in batches]
        else:
            fn = loss_fn
            if how == "thunder_nb.jit":
                fn = thunder_nb.jit(loss_fn, capture=jit_capture("emulated"))
                emulate_runner(thunder_nb.internals.jit_transforms(fn)[0], "emulated")
            for x, y in batches:
                opt.zero_grad()
                loss = fn(x, y)
                loss.backward()
                opt.step()
                losses.append(loss.detach().clone())
    return losses, [str(w.message) for w in caught if issubclass(w.category, CheckpointStatisticsWarning)]


@pytest.mark.parametrize("how", ["thunder_nb.jit", "jit_step"])
def test_a_checkpointed_block_trains_as_in_eager(how):
    torch.manual_seed(0)
    eager = Net(norm=False)
    model = copy.deepcopy(eager)
    want, _ = _train(eager, "eager")
    got, said = _train(model, how)
    assert said == []
    assert_equal(got, want, label="losses")
    assert_equal(dict(model.state_dict()), dict(eager.state_dict()), label="weights")


@pytest.mark.parametrize("how", ["thunder_nb.jit", "jit_step"])
def test_a_batch_norm_in_a_checkpointed_block_is_said_and_updated_once_a_step(how):
    """Eager PyTorch's running statistics are updated in the forward and again in the recomputation; thunder's once,
    as the model without checkpointing updates them. The warning names the line of the checkpoint call; the losses and
    weights are eager's."""
    torch.manual_seed(0)
    eager = Net(norm=True)
    model, plain = copy.deepcopy(eager), copy.deepcopy(eager)
    plain.checkpointed = False
    want, _ = _train(eager, "eager")
    _train(plain, "eager")
    got, said = _train(model, how)
    assert len(said) == 1 and f"{__file__}:" in said[0] and "pytorch/pytorch#96136" in said[0], said
    assert_equal(got, want, label="losses")
    weights = {k: v for k, v in model.state_dict().items() if "running" not in k and "num_batches" not in k}
    assert_equal(weights, {k: eager.state_dict()[k] for k in weights}, label="weights")
    stats = {k: v for k, v in model.state_dict().items() if "running" in k or "num_batches" in k}
    assert_equal(stats, {k: plain.state_dict()[k] for k in stats}, label="running statistics")
    assert not torch.equal(eager.block[0].running_mean, plain.block[0].running_mean)  # NOTE: eager's twice
