"""thunder's dataflow ordering keeps an in-place write after the reads of its memory (`thunder_nb.internals.ordering`).

With ``fusion_type="dataflow"``, thunder 0.2.6 rebuilt a trace's order from its producers and consumers by name, and a
write into memory an earlier op reads under another name could move before that read: a wrong value, no error (the
CPU fuzzer's program 696). Real thunder traces on the CPU, judged against eager.
"""

from __future__ import annotations

import pytest
import thunder
import torch

from thunder_nb.diagnosis.judge import assert_equal
from thunder_nb.diagnosis.tolerances import EXACT
from thunder_nb.internals import ordering


def reads_then_writes_an_input(x0, x1):
    s1 = x1.mean().item()
    t2 = abs(s1) - x1  # NOTE: reads x1 before the write below
    s3 = x0[3, 1].item()
    x1.relu_()
    return t2, s3, s1


def reads_a_view_then_writes_its_base(x0, x1):
    v = x1[1:]
    t = v * 2.0
    x1.mul_(x0.sum().item())
    return t + x0[1:]


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(6, 6, generator=g).requires_grad_(), torch.randn(6, 6, generator=g)


@pytest.mark.parametrize("fn", [reads_then_writes_an_input, reads_a_view_then_writes_its_base],
                         ids=lambda f: f.__name__)
@pytest.mark.parametrize("fusion_type", ["dataflow", "consecutive"])
def test_a_write_stays_after_the_reads_of_its_memory(fn, fusion_type):
    x0, x1 = _inputs()
    expected_x1 = x1.clone()
    expected = fn(x0.detach().clone(), expected_x1)
    got = thunder.jit(fn, fusion_type=fusion_type)(x0, x1)
    detached = tuple(g.detach() if isinstance(g, torch.Tensor) else g for g in got) if isinstance(got, tuple) \
        else got.detach()
    assert_equal(detached, expected, tolerance=EXACT, label="outputs")
    assert_equal(x1, expected_x1, tolerance=EXACT, label="the written input")


def test_thunders_own_dataflow_order_reads_after_the_write():
    """With thunder's graph back, ``t2`` read ``x1`` after ``x1.relu_()``: what `ordering.install` changes."""
    x0, x1 = _inputs()
    expected = reads_then_writes_an_input(x0.detach().clone(), x1.clone())[0]
    ordering.uninstall()
    try:
        wrong = thunder.jit(reads_then_writes_an_input, fusion_type="dataflow")(x0, x1.clone())[0]
    finally:
        assert ordering.install()
    assert not torch.equal(wrong, expected)
    assert_equal(wrong, abs(x1.mean().item()) - x1.relu(), tolerance=EXACT, label="thunder's own order")
