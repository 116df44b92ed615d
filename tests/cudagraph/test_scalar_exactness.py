"""The scalar hand-off is exact: bit for bit what PyTorch computes with the Python number, over many values and dtypes.

Each program reads a number from ``.item()`` and computes with it; the fixed transform hands the
number over as a 0-d device tensor (no graph per value). The reference is plain ``thunder.jit``: the
same torch calls with the Python number (eager PyTorch may differ from both: ``s / x`` is
``x.reciprocal() * s`` there). On the CPU regions run as plain Python (the CPU kernels); on the GPU
they run captured (the CUDA kernels, whose scalar paths differ: see `thunder_nb.cudagraph.scalars._reader_form`).
"""

from __future__ import annotations

import pytest
import thunder
import torch

import thunder_nb
from thunder_nb.fix import FixedCUDAGraphTransform


def mul(x, t):
    return x * t.item()


def add(x, t):
    return x + t.item()


def sub_from(x, t):
    return t.item() - x


def div(x, t):
    return x / t.item()


def div_into(x, t):
    return t.item() / x


def arithmetic(x, t):
    s = t.item()
    return x / (s + 1.0) + (s * 2.0 - 0.5)


def div_by_arithmetic(x, t):
    """A divisor float32 cannot hold: PyTorch's CUDA division rounds its double reciprocal (#13's ulp)."""
    return x / (t.item() + 1e-3)


def fill(x, t):
    return torch.full_like(x, t.item()) + x


PROGRAMS = [mul, add, sub_from, div, div_into, arithmetic, div_by_arithmetic, fill]
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
VALUES = 40


def values(seed: int) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    mags = 10.0 ** torch.randint(-4, 5, (VALUES,), generator=g)
    return (torch.randn(VALUES, generator=g, dtype=torch.float64) * mags).tolist()


@pytest.mark.parametrize("capture", [False, pytest.param(True, marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_handed_over_number_gives_the_same_bits(fn, dtype, capture):
    device = "cuda" if capture else "cpu"
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(2048, generator=g) * 3).to(device=device, dtype=dtype)
    t_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    transform = FixedCUDAGraphTransform(capture=capture)
    jfn, plain = thunder.jit(fn, transforms=[transform]), thunder.jit(fn)
    for v in values(sum(map(ord, fn.__name__))):
        t = torch.tensor(v, dtype=t_dtype, device=device)
        got, want = jfn(x, t), plain(x, t)
        assert got.dtype == want.dtype
        assert torch.equal(got, want) or (got.isnan() == want.isnan()).all() and torch.equal(
            got.nan_to_num(0.0), want.nan_to_num(0.0)), f"{fn.__name__} {dtype} with {v!r}: max diff " \
            f"{(got.double() - want.double()).abs().max().item()}"
    report = thunder_nb.analyze(jfn)
    assert report.defects == ()
    assert not any(report.forward.value(n).is_scalar for r in report.forward.regions for n in r.inputs)
    if capture:
        if fn in (arithmetic, div_by_arithmetic):  # NOTE: a lone reader (x * s) makes no region at all
            assert len(report.forward.regions) == 1, "the arithmetic on the number and its reader join the region"
        assert all(len(r.graphs) == 1 for r in report.forward.regions)  # one graph, whatever the value
