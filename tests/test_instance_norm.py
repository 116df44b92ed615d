"""An instance norm that tracks running statistics trains and evaluates as in eager PyTorch under thunder and
thunder-nb (`thunder_nb.internals.instance_norm`: thunder 0.2.6 never wrote the running statistics, silently)."""

from __future__ import annotations

import copy
import warnings

import pytest
import thunder
import torch
import torch.nn.functional as F

import thunder_nb
from thunder_nb import internals
from thunder_nb.diagnosis.judge import assert_equal
from thunder_nb.internals import instance_norm
from thunder_nb.testing.modes import capturing, emulate_runner, jit_capture


def _model(dims: int, affine: bool) -> torch.nn.Module:
    """A convolution (no bias: the norm would take it out, and its gradient would be rounding alone), the instance
    norm with running statistics, a linear head."""
    conv = (torch.nn.Conv1d, torch.nn.Conv2d)[dims - 1](2, 4, 3, bias=False)
    norm = (torch.nn.InstanceNorm1d, torch.nn.InstanceNorm2d)[dims - 1](4, affine=affine, track_running_stats=True)
    return torch.nn.Sequential(conv, norm, torch.nn.Flatten(), torch.nn.LazyLinear(1))


def _run(model, entry, dims, steps=3):
    """``steps`` SGD steps through ``entry``, then an evaluation-mode forward (the running statistics read): the
    losses, the evaluation's output and the model's state."""
    torch.manual_seed(1)
    shape = (3, 2) + (6,) * dims
    batches = [(torch.randn(shape) * (i + 1) + i, torch.randn(3, 1)) for i in range(steps + 1)]
    model(batches[0][0])  # NOTE: LazyLinear's shape
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    def loss_fn(x, y):
        return F.mse_loss(model(x), y)

    with capturing("emulated"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if entry == "jit_step":
            step = thunder_nb.jit_step(model, loss_fn, optimizer, capture="emulated")
            losses = [step(x, y) for x, y in batches[:steps]]
            forward = thunder_nb.jit(model)
        else:
            if entry == "thunder.jit":
                forward = thunder.jit(model)
            elif entry == "thunder_nb.jit":
                forward = thunder_nb.jit(model, capture=jit_capture("emulated"))
                emulate_runner(internals.jit_transforms(forward)[0], "emulated")
            else:
                forward = model
            losses = []
            for x, y in batches[:steps]:
                optimizer.zero_grad()
                loss = F.mse_loss(forward(x), y)
                loss.backward()
                optimizer.step()
                losses.append(loss.detach())
        model.eval()
        with torch.no_grad():
            evaluated = forward(batches[-1][0])
    return losses, evaluated, model.state_dict()


@pytest.mark.parametrize("entry", ["thunder.jit", "thunder_nb.jit", "jit_step"])
@pytest.mark.parametrize("dims,affine", [(1, True), (2, False)])
def test_an_instance_norm_with_running_statistics_trains_and_evaluates_as_in_eager(dims, affine, entry):
    """3 SGD steps, then an evaluation-mode forward that normalises with the running statistics: losses, output and
    state dict equal eager's. Before `thunder_nb.internals.instance_norm` the running statistics stayed at 0 and 1."""
    assert instance_norm.installed()  # NOTE: the session's conftest installs it, as thunder-nb's first entry point does
    torch.manual_seed(0)
    model = _model(dims, affine)
    expected = _run(copy.deepcopy(model), "eager", dims)
    assert_equal(_run(model, entry, dims), expected, label="losses, evaluation, state")
