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
