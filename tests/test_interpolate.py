"""``F.interpolate`` under thunder and thunder-nb computes as eager PyTorch in its nearest and linear modes
(`thunder_nb.internals.interpolate`): differentiated, thunder 0.2.6's bilinear took ``in_size / out_size`` for the
scale where PyTorch takes ``1 / scale_factor`` (other values and gradients, silently), and it refused
``align_corners``, ``linear``, ``trilinear`` and ``recompute_scale_factor=True``."""

from __future__ import annotations

import pytest
import thunder
import torch
import torch.nn.functional as F

from programs import assert_jit_step_trains_as_eager
from thunder_nb.diagnosis.judge import assert_equal
from thunder_nb.internals import interpolate

#: (mode, input shape, F.interpolate's other arguments)
CASES = [
    ("bilinear", (2, 3, 5, 7), dict(scale_factor=1.5)),  # NOTE: thunder 0.2.6 wrong under grad
    ("bilinear", (2, 3, 5, 7), dict(scale_factor=0.5)),  # NOTE: thunder 0.2.6 wrong under grad (odd sizes)
    ("bilinear", (2, 3, 5, 7), dict(scale_factor=(1.3, 2.7))),
    ("bilinear", (2, 3, 5, 7), dict(scale_factor=2.0, align_corners=True)),
    ("bilinear", (2, 3, 5, 7), dict(size=(9, 4), align_corners=False)),
    ("bilinear", (2, 3, 3, 7), dict(scale_factor=(1.3, 2.0))),  # NOTE: a dimension kept at its size
    ("linear", (2, 3, 7), dict(scale_factor=1.5, align_corners=True)),
    ("linear", (2, 3, 7), dict(size=3)),
    ("trilinear", (1, 2, 3, 4, 5), dict(scale_factor=(1.3, 2.7, 0.6))),
    ("trilinear", (1, 2, 3, 4, 5), dict(size=(5, 2, 6), align_corners=True)),
    ("nearest", (2, 3, 5, 7), dict(scale_factor=1.7, recompute_scale_factor=True)),
    ("nearest-exact", (2, 3, 5, 7), dict(scale_factor=0.5)),  # NOTE: thunder 0.2.6 wrong under grad
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("mode,shape,options", CASES, ids=[f"{m}-{len(s) - 2}d-{o}" for m, s, o in CASES])
def test_interpolate_and_its_gradient_equal_eagers(mode, shape, options, dtype):
    """Outputs and gradients (the input needs one) within the dtype's tolerance of eager's: the same gathers and
    weights, computed in another order."""
    assert interpolate.installed()  # NOTE: the session's conftest installs it, as thunder-nb's first entry point does
    x = torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(0)).requires_grad_()

    def resampled(x):
        return F.interpolate(x, mode=mode, **options)

    weights = torch.randn(resampled(x).shape, dtype=dtype, generator=torch.Generator().manual_seed(1))

    def run(fn):
        out = fn(x)
        return out, torch.autograd.grad((out * weights).sum(), [x])[0]

    assert_equal(run(thunder.jit(resampled)), run(resampled), label=f"{mode} {options}: output and gradient")


def test_a_unet_decoder_trains_under_jit_step_as_eager():
    """A U-Net's step: ``nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)`` and a skip connection
    (milesial's Pytorch-UNet), AdamW over 4 steps in jit_step's whole step."""
    torch.manual_seed(0)

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.down = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3, padding=1), torch.nn.MaxPool2d(2))
            self.up = torch.nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
            self.out = torch.nn.Conv2d(6, 1, 1)

        def forward(self, x):  # NOTE: the helper's batch is 4 x 8: 4 images of 2 channels, 2 x 2 pixels
            image = x.reshape(4, 2, 2, 2)
            return self.out(torch.cat([image, self.up(self.down(image))], dim=1)).flatten(1)

    assert_jit_step_trains_as_eager(Decoder(), lambda model, x: model(x).square().mean())
