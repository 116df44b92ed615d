"""thunder's limits that raise without a message are named with what to do (`thunder_nb.diagnosis.failures.LIMITS`)."""

from __future__ import annotations

import pytest
import torch

import thunder_nb
from thunder_nb.diagnosis.failures import known_limit
from thunder_nb.step import capturability


def test_an_embedding_with_max_norm_is_named_with_what_to_do():
    """thunder 0.2.6 raises a bare ``NotImplementedError()`` for ``nn.Embedding(max_norm=...)``; the user is told which
    layer option it is and how to keep it, at the call and in `capturability`'s blocker."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Embedding(10, 4, max_norm=1.0), torch.nn.Flatten(), torch.nn.Linear(8, 2))
    x = torch.tensor([[1, 2], [3, 4]])
    with pytest.raises(NotImplementedError) as raised:
        thunder_nb.jit(net)(x)
    component, advice = known_limit(raised.value)
    assert "no max_norm" in component and "embedding_renorm_" in advice

    report = capturability(net, lambda x: net(x).sum(), torch.optim.SGD(net.parameters(), lr=0.1), x)
    (blocker,) = report.blockers
    assert "drop max_norm" in blocker.fix, blocker


@pytest.mark.parametrize("fast_call", [True, False])
def test_a_direct_call_says_what_thunder_cannot_trace_under_its_own_error(fast_call):
    """``thunder_nb.jit(...)(x)`` raises thunder's own error, its type and message kept (an ``except`` catches it as
    before), with one note of what thunder cannot trace and what to do: a known limit raised bare, an op with a
    data-dependent shape. A function's own error gets no note."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 4, max_norm=1.0)
    with pytest.raises(NotImplementedError) as raised:
        thunder_nb.jit(emb, fast_call=fast_call)(torch.tensor([1, 2]))
    (note,) = raised.value.__notes__
    assert note.startswith("thunder-nb: thunder cannot trace Embedding") and "embedding_renorm_" in note, note
    assert str(raised.value) == ""

    def count_nonzero(x):
        return x.nonzero().shape[0]

    with pytest.raises(NotImplementedError, match="automatic registration for nonzero") as raised:
        thunder_nb.jit(count_nonzero, fast_call=fast_call)(torch.tensor([0, 2]))
    (note,) = raised.value.__notes__
    assert "thunder cannot trace nonzero in count_nonzero" in note and "x.nonzero()" in note, note

    def users_own_error(x):
        raise ValueError("the user's own message")

    with pytest.raises(ValueError, match="the user's own message") as raised:
        thunder_nb.jit(users_own_error, fast_call=fast_call)(torch.ones(2))
    assert not getattr(raised.value, "__notes__", None)


def test_a_named_tuples_field_read_from_thunders_plain_tuple_is_a_limit_with_the_index_to_write_instead():
    """thunder 0.2.6 returns torch's named tuples as plain tuples: ``x.max(dim=1).indices`` (an accuracy's argmax)
    raised a bare ``AttributeError: indices``. thunder-nb gives them their fields (`internals.named_tuples`,
    tests/test_named_tuples.py); where it cannot (another thunder), the error names the index to write instead."""
    component, advice = known_limit(AttributeError("indices"))
    assert "named tuples as plain tuples" in component and "x.max(dim=1)[1]" in advice, advice
    assert known_limit(AttributeError("'Net' object has no attribute 'values'")) is None
