"""A traced tensor's ``.dtype`` is torch's own under thunder and thunder-nb (`thunder_nb.internals.torch_metadata`):
thunder 0.2.6 handed traced code ``thunder.dtypes.float32``, which equals no ``torch.dtype``, so an ``if`` on a dtype
took the other branch, silently (Lightning-AI/lightning-thunder#2306)."""

from __future__ import annotations

import warnings

import pytest
import thunder
import torch

import thunder_nb
from thunder_nb.fix import EagerFallbackWarning
from thunder_nb.diagnosis.judge import assert_equal
from thunder_nb.internals import torch_metadata

#: what code asks of a tensor's dtype (each a Python value eager computes from a float32 tensor)
QUESTIONS = {
    "x.dtype == torch.float32": lambda x: x.dtype == torch.float32,
    "x.dtype != torch.float32": lambda x: x.dtype != torch.float32,
    "torch.float32 == x.dtype": lambda x: torch.float32 == x.dtype,
    "x.dtype is torch.float32": lambda x: x.dtype is torch.float32,
    "x.dtype in (half, bfloat16)": lambda x: x.dtype in (torch.float16, torch.bfloat16),
    "x.dtype in {float32}": lambda x: x.dtype in {torch.float32},
    "a dict keyed by dtype": lambda x: {torch.float32: "single", torch.float64: "double"}.get(x.dtype, "none"),
    "x.long().dtype == torch.int64": lambda x: x.long().dtype == torch.int64,
    "x.dtype.is_floating_point": lambda x: x.dtype.is_floating_point,
    "x.dtype.itemsize": lambda x: x.dtype.itemsize,
    "str(x.dtype)": lambda x: str(x.dtype),
    "torch.get_default_dtype() == x.dtype": lambda x: torch.get_default_dtype() == x.dtype,
    "torch.finfo(x.dtype).eps": lambda x: torch.finfo(x.dtype).eps,
}


@pytest.mark.parametrize("question", QUESTIONS)
def test_traced_code_reads_a_dtype_as_eager_does(question):
    """The answer the traced function returns equals eager's, value and type."""
    assert torch_metadata.installed()  # NOTE: the session's conftest, as thunder-nb's first entry point does
    ask = QUESTIONS[question]
    x = torch.randn(3)
    got = thunder.jit(lambda x: (x + 1, ask(x)))(x)[1]
    assert (got, type(got)) == (ask(x), type(ask(x)))


class HalfPrecisionNorm(torch.nn.Module):
    """T5's layer norm (transformers' ``T5LayerNorm``): the variance in float32, the result cast back to the weight's
    dtype only where that is half precision."""

    def __init__(self, n: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n) + 0.1 * torch.randn(n))

    def forward(self, x):
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + 1e-6)
        if self.weight.dtype in [torch.float16, torch.bfloat16]:
            x = x.to(self.weight.dtype)
        return self.weight * x


def test_a_model_that_branches_on_a_dtype_takes_eagers_branch():
    """T5's norm in bfloat16: eager casts to bfloat16 before the scale; thunder 0.2.6 took the float32 branch (a
    float32 result of other values, silently). The output's dtype is eager's, and its values and the weight's gradient
    equal eager's within bfloat16's tolerance."""
    torch.manual_seed(0)
    norm = HalfPrecisionNorm(16).to(torch.bfloat16)
    x = torch.randn(4, 16, dtype=torch.bfloat16)

    def run(fn):
        norm.zero_grad()
        out = fn(x)
        out.float().sum().backward()
        return out, norm.weight.grad.clone()

    eager = run(norm)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EagerFallbackWarning)  # NOTE: on the CPU, regions run eagerly
        got = run(thunder_nb.jit(norm))
    assert got[0].dtype == torch.bfloat16  # NOTE: thunder 0.2.6's was float32
    assert_equal(got, eager, label="bfloat16 norm and its weight's gradient")
