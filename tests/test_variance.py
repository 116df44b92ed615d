"""``var``, ``std``, ``var_mean`` and ``std_mean`` in PyTorch's forms (`thunder_nb.internals.variance`): thunder 0.2.6
takes only ``(x, dim, *, keepdim, correction)``, and ``x.var(1, unbiased=False)``, ``x.std(1, False, True)``,
``torch.var_mean(x, 1, False)`` and ``x.var(False)`` failed. Now each equals eager (values exact, gradients within
float32's tolerance), and a hand-written normalization with the population variance trains under `jit_step` as
eager."""

from __future__ import annotations

import pytest
import torch

from programs import assert_jit_step_trains_as_eager, assert_thunder_as_eager
from thunder_nb.diagnosis.tolerances import dtype_tolerance
from thunder_nb.internals import variance

FORMS = {
    "x.var(1, unbiased=False)": lambda x: x.var(1, unbiased=False),
    "x.std(1, unbiased=False, keepdim=True)": lambda x: x.std(1, unbiased=False, keepdim=True),
    "x.var(1, False)": lambda x: x.var(1, False),
    "x.std(0, True, True)": lambda x: x.std(0, True, True),
    "x.var(False)": lambda x: x.var(False),
    "torch.var(x, [0, 1], unbiased=True)": lambda x: torch.var(x, [0, 1], unbiased=True),
    "torch.var_mean(x, 1, False)": lambda x: torch.cat(torch.var_mean(x, 1, False)),
    "torch.std_mean(x, dim=1, unbiased=False)": lambda x: torch.cat(torch.std_mean(x, dim=1, unbiased=False)),
    "x.var(1, correction=0), as before": lambda x: x.var(1, correction=0),
    "x.std(), as before": lambda x: x.std(),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_each_form_has_eagers_value_and_gradient(form):
    assert variance.installed()  # NOTE: the conftest's check_versions
    # NOTE: thunder differentiates its own decomposition of var, not eager's var_backward: the last bit may differ
    assert_thunder_as_eager(FORMS[form], torch.randn(4, 6, generator=torch.Generator().manual_seed(0)),
                            loss=lambda y: (y * torch.arange(y.numel()).view(y.shape)).sum(),
                            gradient=dtype_tolerance(torch.float32))


class AdaptiveNorm(torch.nn.Module):
    """Instance normalization by hand, as AdaIN writes it: the population variance over the features."""

    def __init__(self):
        super().__init__()
        self.lin, self.out = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)

    def forward(self, x):
        h = self.lin(x)
        h = (h - h.mean(1, keepdim=True)) / (h.var(1, unbiased=False, keepdim=True) + 1e-5).sqrt()
        return self.out(h)


def test_a_hand_written_normalization_trains_under_jit_step_as_eager():
    torch.manual_seed(0)
    assert_jit_step_trains_as_eager(AdaptiveNorm(), lambda model, x: model(x).square().mean())
