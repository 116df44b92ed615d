"""``F.pad`` in reflect, replicate and circular modes (``nn.ReflectionPad2d``, ...) traces and trains as in eager
PyTorch (`thunder_nb.internals.padding`: thunder 0.2.6 pads with a constant only)."""

from __future__ import annotations

import pytest
import thunder
import torch
import torch.nn.functional as F

from programs import assert_jit_step_trains_as_eager
from thunder_nb.diagnosis.judge import assert_equal
from thunder_nb.diagnosis.tolerances import EXACT
from thunder_nb.internals import padding

CASES = [((2, 3, 5), (2, 1), "reflect"), ((2, 3, 5, 6), (1, 2, 3, 0), "reflect"),
         ((1, 2, 4, 4, 4), (1, 1, 2, 2, 1, 0), "reflect"), ((2, 3, 5), (2, 3), "replicate"),
         ((2, 3, 5, 6), (1, 2, 3, 4), "replicate"), ((2, 3, 5), (2, 5), "circular"),
         ((2, 3, 5, 6), (1, 2, 3, 0), "circular"), ((2, 3, 5, 6), (1, 2), "constant")]


@pytest.mark.parametrize("shape,widths,mode", CASES, ids=[f"{m}-{len(s)}d-{w}" for s, w, m in CASES])
def test_a_pad_in_each_mode_equals_eagers_with_its_gradient(shape, widths, mode):
    """The padded tensor exactly (the same values, moved), its gradient within float32's tolerance (a corner's
    contributions summed in another order)."""
    assert padding.installed()  # NOTE: the session's conftest installs it, as thunder-nb's first entry point does
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))

    def padded(x):
        return F.pad(x, widths, mode=mode)

    assert_equal(thunder.jit(padded)(x), padded(x), tolerance=EXACT, label="padded")

    def loss(x):
        return (padded(x) * torch.arange(padded(x).numel()).reshape(padded(x).shape)).sum()

    def grad_of(compile_fn):
        xg = x.clone().requires_grad_()
        return torch.autograd.grad(compile_fn(loss)(xg), [xg])[0]

    assert_equal(grad_of(thunder.jit), grad_of(lambda fn: fn), label="gradient")


def test_a_reflection_padded_convolution_trains_under_jit_step_as_eager():
    """An image model's reflection padding (style transfer, CycleGAN) in jit_step's whole step."""
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Sequential(torch.nn.ReflectionPad2d(1), torch.nn.Conv2d(2, 3, 3),
                                            torch.nn.ReplicationPad2d((1, 0, 1, 0)), torch.nn.Conv2d(3, 2, 2))
            self.head = torch.nn.Linear(8, 1)

        def forward(self, x):  # NOTE: the helper's batch is 4 x 8: 4 images of 2 channels, 2 x 2 pixels
            return self.head(self.conv(x.reshape(4, 2, 2, 2)).flatten(1))

    assert_jit_step_trains_as_eager(Net(), lambda model, x: model(x).square().mean())
