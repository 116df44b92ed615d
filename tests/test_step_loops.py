"""jit_step in the loops users write (issue 50, point 6): a one-cycle schedule, a ragged last batch, fp16 autocast,
a call under no_grad. Each loop either equals eager PyTorch's with as few recordings as its changes need, or is
refused, or warned about once, with the cause and what to write instead."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from thunder_nb.diagnosis.judge import TRAINED, judge
from thunder_nb.step import RecordAgainWarning, StepRefused, jit_step


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _batch(i, n=8):
    g = torch.Generator().manual_seed(i)
    return torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g)


def _run(batches, make_opt, make_sched=None, *, jitted, **options):
    """The loop, eager or through jit_step: (losses, parameters, the step or None, the warnings' messages)."""
    net = _mlp()
    opt = make_opt(net)
    sched = make_sched(opt) if make_sched else None
    step = jit_step(net, lambda x, y: F.cross_entropy(net(x), y), opt, **options) if jitted else None
    losses = []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for x, y in batches:
            if step is not None:
                loss = step(x, y)
            else:
                opt.zero_grad()
                loss = F.cross_entropy(net(x), y)
                loss.backward()
                opt.step()
            if sched is not None:
                sched.step()
            losses.append(loss.item())
    state = {n: p.detach().clone() for n, p in net.named_parameters()}
    return losses, state, step, [str(w.message) for w in seen if "jit_step" in str(w.message)]


def _equal(got, eager):
    j = judge(got, eager, tolerance=TRAINED)
    assert j.equal, j.difference


def _one_cycle(opt):
    return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=20)


@pytest.mark.parametrize("make_opt", [
    pytest.param(lambda net: torch.optim.AdamW(net.parameters(), lr=1e-3), id="AdamW-betas"),
    pytest.param(lambda net: torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9), id="SGD-momentum"),
])
def test_one_cycle_that_cycles_momentum_records_again_warns_once_and_names_the_fix(make_opt):
    """OneCycleLR's default cycle_momentum changes AdamW's betas (SGD's momentum) at every step. A CUDA graph holds them
    as numbers (torch's capturable Adam reads tensor betas on the host, which a capture refuses), so every step records
    again: equal to eager, with one warning that names the cause and cycle_momentum=False."""
    batches = [_batch(i) for i in range(10)]
    eager = _run(batches, make_opt, _one_cycle, jitted=False)
    got = _run(batches, make_opt, _one_cycle, jitted=True, capture="emulated", warmup=1)
    _equal(got[:2], eager[:2])
    key = "'betas'" if isinstance(got[2].optimizer, torch.optim.AdamW) else "'momentum'"
    about = [m for m in got[3] if key in m]
    assert len(about) == 1, got[3]
    assert "cycle_momentum=False" in about[0] and "as Python numbers" in about[0], about[0]
    assert got[2].graphs_recorded > 5, got[2].recordings  # NOTE: warned once, recorded at every step


def test_one_cycle_without_cycle_momentum_with_adamw_records_once():
    """lr is the one hyperparameter Adam's graph reads live: a schedule of lr alone records once and warns nothing."""
    batches = [_batch(i) for i in range(10)]
    adamw = lambda net: torch.optim.AdamW(net.parameters(), lr=1e-3)  # noqa: E731
    sched = lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=20,  # noqa: E731
                                                            cycle_momentum=False)
    eager = _run(batches, adamw, sched, jitted=False)
    got = _run(batches, adamw, sched, jitted=True, capture="emulated", warmup=1)
    _equal(got[:2], eager[:2])
    assert got[2].graphs_recorded == 1 and got[3] == []


def test_a_ragged_last_batch_is_recorded_in_its_turn_and_a_shape_short_of_a_recording_is_said():
    """An epoch of 16, 16, 16 and 10 examples, three epochs: each shape warms up on its own count and keeps its own
    recording, so both are recorded and replayed in turn; a shape left before it was recorded is said once."""
    epoch = [16, 16, 16, 10]
    batches = [_batch(10 * e + i, n) for e in range(3) for i, n in enumerate(epoch)]
    sgd = lambda net: torch.optim.SGD(net.parameters(), lr=0.05)  # noqa: E731
    eager = _run(batches, sgd, jitted=False)
    got = _run(batches, sgd, jitted=True, capture="emulated", warmup=2)
    _equal(got[:2], eager[:2])
    step = got[2]
    assert step.graphs_recorded == 2, step.recordings
    assert step.captured and step.graph is None  # NOTE: the CPU stand-in records no torch.cuda.CUDAGraph
    short = [m for m in got[3] if "not recorded yet" in m]
    assert len(short) == 1 and "(10, 8)" in short[0] and "drop_last=True" in short[0], got[3]


def test_fp16_autocast_is_refused_with_the_bfloat16_advice():
    net = _mlp()
    step = jit_step(net, lambda x, y: F.cross_entropy(net(x), y), torch.optim.AdamW(net.parameters()),
                    capture="emulated")
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    with torch.autocast("cpu", dtype=torch.float16), pytest.raises(StepRefused) as info:
        step(*_batch(0))
    message = str(info.value)
    assert "float16" in message and "GradScaler" in message and "torch.bfloat16" in message, message
    assert all(torch.equal(before[n], p) for n, p in net.named_parameters())


def test_a_call_under_no_grad_is_refused_with_the_users_line():
    net = _mlp()
    step = jit_step(net, lambda x, y: F.cross_entropy(net(x), y), torch.optim.AdamW(net.parameters()),
                    capture="emulated")
    with torch.no_grad(), pytest.raises(StepRefused) as info:
        step(*_batch(0))  # the user's line
    message = str(info.value)
    assert "no_grad" in message and "test_step_loops.py:" in message and "`step(*_batch(0))  # the user's line`" in \
        message, message

