"""`compare_step`'s judging through the one judge of "equal" (`thunder_nb.diagnosis.judge`): its base tolerance, and
thunder without graphs (the same executors) as the yardstick where the whole step differs from eager beyond it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from thunder_nb.diagnosis.judge import AUTOCAST, TRAINED, Judgement, judge
from thunder_nb.step.compare import _eager_step, _judged_note, _tolerance, _without_graphs


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def test_thunder_without_graphs_runs_the_users_loop_from_the_same_state():
    """The yardstick: ``n`` steps of the user's loop with the loss jitted by thunder (jit_step's executors), no graph,
    from the state given; on the CPU thunder runs PyTorch's kernels, so it is eager's loop to the last bit here."""
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    batch = (torch.randn(8, 8, generator=g), torch.randint(0, 4, (8,), generator=g))

    def loss_fn(x, y):
        return F.cross_entropy(net(x), y)

    start = [p.detach().clone() for p in net.parameters()]
    params = list(net.parameters())
    plain = _without_graphs(net, loss_fn, opt, batch, 4, params, ())
    with torch.no_grad():
        for p, s in zip(params, start):
            p.copy_(s)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    eager = {"loss": [float(_eager_step(loss_fn, opt, batch)) for _ in range(4)],
             "parameter": [p.detach().clone() for p in params]}
    assert plain is not None and len(plain["loss"]) == 4 and plain["loss"][0] > plain["loss"][-1]
    verdict = judge(plain, eager, tolerance=TRAINED)
    assert verdict.equal, verdict
    assert judge(plain, eager, without_graphs=plain, tolerance=TRAINED).equal


def test_thunder_failing_leaves_no_yardstick():
    net = _net()

    def not_traceable(x):
        return net(torch.from_numpy(x.numpy()))  # NOTE: thunder cannot trace a NumPy round trip

    assert _without_graphs(net, not_traceable, torch.optim.SGD(net.parameters(), lr=0.1), (torch.ones(2, 8),), 2,
                           list(net.parameters()), ()) is None


def test_the_base_tolerance_and_the_notes():
    assert _tolerance([torch.ones(2)]) == TRAINED and _tolerance([torch.ones(2, dtype=torch.bfloat16)]) == AUTOCAST
    assert _judged_note(Judgement(False), False).startswith("thunder without graphs failed on this step")
    assert _judged_note(Judgement(True, without_graphs_error=3e-4, widened=True), True) == (
        "thunder without graphs differs from eager too (by 0.0003): the whole step is judged within that difference")
    assert _judged_note(Judgement(False, without_graphs_wrong="result['loss'][1]: not finite: nan"), True) == (
        "thunder without graphs is itself wrong on this step: result['loss'][1]: not finite: nan")
