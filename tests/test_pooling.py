"""Max and average pooling under thunder and thunder-nb compute as eager PyTorch in ceil mode, without the padding
counted, and in 1-d with padding (`thunder_nb.internals.pooling`): thunder 0.2.6 refused the first two (torchvision's
GoogLeNet, Inception v3 and SqueezeNet pool so) and gave ``max_pool1d`` NaN gradients where a window overlaps the
padding, silently."""

from __future__ import annotations

import pytest
import thunder
import torch
import torch.nn.functional as F

from programs import assert_jit_step_trains_as_eager
from thunder_nb.diagnosis.judge import assert_equal
from thunder_nb.internals import pooling

#: (name, input shape, pooling)
CASES = [
    ("max_pool1d padded", (2, 3, 11), lambda x: F.max_pool1d(x, 3, 2, 1)),  # NOTE: thunder 0.2.6's gradient NaN
    ("max_pool1d ceil", (2, 3, 11), lambda x: F.max_pool1d(x, 2, 2, ceil_mode=True)),
    ("max_pool2d ceil", (2, 3, 7, 9), lambda x: F.max_pool2d(x, 3, 2, ceil_mode=True)),
    ("max_pool2d ceil padded dilated", (2, 3, 7, 9), lambda x: F.max_pool2d(x, 3, 2, 1, dilation=2, ceil_mode=True)),
    ("torch.max_pool2d ceil by position", (2, 3, 7, 9), lambda x: torch.max_pool2d(x, 3, 2, 1, 1, True)),
    ("max_pool3d ceil", (1, 2, 5, 6, 7), lambda x: F.max_pool3d(x, 2, ceil_mode=True)),
    ("avg_pool1d ceil", (2, 3, 11), lambda x: F.avg_pool1d(x, 3, 2, 1, ceil_mode=True)),
    ("avg_pool2d ceil", (2, 3, 7, 9), lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True)),
    ("avg_pool2d pad not counted", (2, 3, 7, 9), lambda x: F.avg_pool2d(x, 3, 1, 1, count_include_pad=False)),
    ("avg_pool2d ceil, pad not counted", (2, 3, 7, 9),
     lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False)),
    ("avg_pool2d ceil, divisor", (2, 3, 7, 9), lambda x: F.avg_pool2d(x, 2, ceil_mode=True, divisor_override=3)),
    ("avg_pool3d ceil", (1, 2, 5, 6, 7), lambda x: F.avg_pool3d(x, 2, ceil_mode=True)),
]


@pytest.mark.parametrize("name,shape,pool", CASES, ids=[c[0] for c in CASES])
def test_pooling_and_its_gradient_equal_eagers(name, shape, pool):
    assert pooling.installed()  # NOTE: the session's conftest installs it, as thunder-nb's first entry point does
    x = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    weights = torch.randn(pool(x).shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))

    def run(fn):
        out = fn(x)
        return out, torch.autograd.grad((out * weights).sum(), [x])[0]

    assert_equal(run(thunder.jit(pool)), run(pool), label=f"{name}: output and gradient")
    with torch.no_grad():
        assert_equal(thunder.jit(pool)(x), pool(x), label=f"{name}: without a gradient")


def test_an_inception_style_block_trains_under_jit_step_as_eager():
    """GoogLeNet's pooling: ``nn.MaxPool2d(3, 2, ceil_mode=True)`` and a pooled branch ``nn.AvgPool2d(3, 1, 1,
    count_include_pad=False)``, AdamW over 4 steps in jit_step's whole step."""
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 1), torch.nn.MaxPool2d(3, 2, ceil_mode=True))
            self.branch = torch.nn.Sequential(torch.nn.AvgPool2d(3, 1, 1, count_include_pad=False),
                                              torch.nn.Conv2d(4, 2, 1))
            self.head = torch.nn.Linear(8, 1)

        def forward(self, x):  # NOTE: the helper's batch is 4 x 8: 4 images of 2 channels, 2 x 2 pixels
            image = torch.nn.functional.interpolate(x.reshape(4, 2, 2, 2), scale_factor=2.0, mode="nearest")
            return self.head(self.branch(self.stem(image)).flatten(1))

    assert_jit_step_trains_as_eager(Block(), lambda model, x: model(x).square().mean())
