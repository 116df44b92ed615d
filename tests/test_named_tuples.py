"""torch's named tuples (``x.max(dim=1)``, ``x.topk(k)``, ``x.sort()``, ...) have their fields while thunder traces
(`thunder_nb.internals.named_tuples`: thunder 0.2.6 gave plain tuples, and ``.values``/``.indices`` failed the trace
with a bare ``AttributeError``)."""

from __future__ import annotations

import warnings

import pytest
import thunder
import torch
import torch.nn.functional as F

import thunder_nb
from programs import assert_jit_step_trains_as_eager
from thunder_nb.diagnosis.judge import assert_equal
from thunder_nb.diagnosis.tolerances import EXACT
from thunder_nb.internals import named_tuples

READS = {
    "x.max(dim=1).indices": lambda x: x.max(dim=1).indices,
    "torch.max(x, 1).values": lambda x: torch.max(x, 1).values,
    "x.min(1).values": lambda x: x.min(1).values,
    "x.topk(2).values, .indices": lambda x: (x.topk(2).values, x.topk(2, dim=0).indices),
    "x.sort(1).values": lambda x: x.sort(1).values,
    "x.median(1).indices": lambda x: x.median(1).indices,
    "x.mode(1).values": lambda x: x.mode(1).values,
    "x.kthvalue(2, 1).values": lambda x: x.kthvalue(2, 1).values,
    "x.cummax(1).values, x.cummin(1).indices": lambda x: (x.cummax(1).values, x.cummin(1).indices),
    "torch.aminmax(x, dim=1).min, .max": lambda x: (torch.aminmax(x, dim=1).min, torch.aminmax(x, dim=1).max),
    "x.nanmedian(1).values": lambda x: x.nanmedian(1).values,
    "unpacked and indexed as before": lambda x: (x.topk(2)[0], *x.sort(1)),
}


@pytest.mark.parametrize("jit", [thunder.jit, thunder_nb.jit], ids=["thunder.jit", "thunder_nb.jit"])
@pytest.mark.parametrize("name", list(READS))
def test_a_named_tuples_fields_read_in_the_traced_function_equal_eagers(name, jit):
    assert named_tuples.installed()  # NOTE: the session's conftest installs it, as thunder-nb's first entry point does
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = jit(READS[name])(x)
    assert_equal(got, READS[name](x), tolerance=EXACT)


def test_a_returned_named_tuple_is_a_plain_tuple_of_eagers_values():
    """Returned from the compiled function, it is the plain tuple thunder returned before (its trace is unchanged)."""
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    got = thunder.jit(lambda x: x.topk(2))(x)
    assert type(got) is tuple
    assert_equal(got, tuple(x.topk(2)), tolerance=EXACT)


def test_a_loss_on_the_top_k_values_trains_under_jit_step_as_eager():
    """A loss that reads ``.values`` of ``topk`` and an accuracy-style ``.indices`` (thunder 0.2.6 failed the trace)."""
    torch.manual_seed(0)

    def top_margin(model, x):
        out = model(x)
        top = out.topk(2, dim=1)
        hit = (top.indices[:, 0] == out.max(dim=1).indices).float().mean()
        return (top.values[:, 0] - top.values[:, 1]).square().mean() + F.relu(out).mean() * hit

    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 5))
    assert_jit_step_trains_as_eager(net, top_margin)
