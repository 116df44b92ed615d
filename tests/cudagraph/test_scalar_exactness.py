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
from gpu_or_emulated import MODES, capturing, device_of, fixed
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
        # NOTE: one graph whatever the value; the loop keeps each result into the next call, so rotation may record
        # further instances of that one graph (instance > 0), never a graph of its own per value
        assert all(sum(g.instance == 0 for g in r.graphs) == 1 for r in report.forward.regions), report.forward.regions
        assert all(len(r.graphs) <= 1 + transform.cuda_graph_runner.rotation for r in report.forward.regions)


def adam_by_hand(p, g, m, v, step):
    """torch.optim.Adam's single-tensor (non-capturable) path: the step read by ``.item()``, the bias corrections in
    Python (``b ** step``, ``** 0.5``: no exact device form), ``addcdiv_`` reading ``-step_size`` as its value."""
    step.add_(1)
    t = step.item()
    b1, b2, lr, eps = 0.9, 0.999, 1e-3, 1e-8
    m.lerp_(g, 1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    step_size = lr / (1 - b1 ** t)
    denom = (v.sqrt() / ((1 - b2 ** t) ** 0.5)).add_(eps)
    p.addcdiv_(m, denom, value=-step_size)
    return p


@pytest.mark.parametrize("mode", MODES)
def test_adam_by_hand_records_one_graph_per_region_whatever_the_step_and_equals_plain_thunder(mode):
    """Before: ``b ** t`` (not device arithmetic) let the numbers after it count as constants, so the host
    arithmetic joined a region and each new step recorded a graph there, up to ``max_values``."""
    device = device_of(mode)
    g = torch.Generator().manual_seed(0)
    p, grad, m, v = ((torch.randn(256, generator=g)).to(device) for _ in range(4))
    m.zero_(), v.zero_()
    step = torch.zeros((), device=device)
    state, plain_state = [p, m, v, step], [t.clone() for t in (p, m, v, step)]
    transform = fixed(mode)
    jfn, plain = thunder.jit(adam_by_hand, transforms=[transform]), thunder.jit(adam_by_hand)
    with capturing(mode):
        for _ in range(12):
            jfn(state[0], grad, state[1], state[2], state[3])
            plain(plain_state[0], grad, plain_state[1], plain_state[2], plain_state[3])
    assert all(torch.equal(a, b) for a, b in zip(state, plain_state))
    runner = transform.cuda_graph_runner
    graphs = {name: len(runner.region_stats(name).graphs) for name in runner.python_callables}
    assert graphs and all(n == 1 for n in graphs.values()), graphs
    assert "addcdiv" in " ".join(transform.handoff_refusals.values())  # NOTE: it reads -step_size: kept out


def arithmetic_after_an_update(x, step):
    t = step.item()
    step.add_(1)  # NOTE: the 0-d tensor changes after the item: the number must be the value before
    return (x * 2) * (t + 0.5) + 1


@pytest.mark.parametrize("mode", MODES)
def test_device_arithmetic_on_an_item_is_not_moved_past_an_update_of_its_tensor(mode):
    """The arithmetic on the item's number runs at its reader: after ``step.add_(1)`` it read the updated tensor
    (6.0 where thunder gives 4.0, every call, silently). An update between the item and the reader refuses the
    hand-off, whether the reader reads the item's number or arithmetic on it."""
    device = device_of(mode)
    transform = fixed(mode)
    jfn, plain = thunder.jit(arithmetic_after_an_update, transforms=[transform]), thunder.jit(arithmetic_after_an_update)
    x = torch.ones(4, device=device)
    s1, s2 = torch.tensor(1.0, device=device), torch.tensor(1.0, device=device)
    with capturing(mode):
        for _ in range(3):
            got, want = jfn(x, s1), plain(x, s2)
            assert torch.equal(got, want), (got, want)
    assert any("in-place update" in why for why in transform.handoff_refusals.values())
