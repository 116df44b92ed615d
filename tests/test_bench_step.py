"""bench/bench_step.py's training loops on the CPU: autocast as a user's loop enters it, and the one judge of its
"equal to eager" column."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def bench_step():
    spec = importlib.util.spec_from_file_location("bench_step", BENCH / "bench_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # NOTE: it puts bench/ on sys.path for its own imports
    yield module
    sys.modules.pop("bench_step", None)


def _written_out(bench_step, name: str, steps: int, *, one_context: bool = False) -> list[float]:
    """The loop as PyTorch's docs write it: zero_grad, the forward and the loss under autocast, backward and the
    optimizer's step outside it, on the bench's batches in turn; ``one_context``: one autocast context around the whole
    loop instead (what the docs warn against)."""
    model = bench_step.sized_models.model(name)
    net = model.build("cpu").train()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    fn = model.loss(net)
    batches = [model.batch(i, "cpu") for i in range(3)]
    autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    losses = []
    with autocast() if one_context else contextlib.nullcontext():
        for i in range(steps):
            (idx,), targets = batches[i % 3]
            opt.zero_grad()
            with contextlib.nullcontext() if one_context else autocast():
                loss = fn(idx, targets)
            loss.backward()
            opt.step()
            losses.append(float(loss))
    return losses


def _bench_losses(bench_step, name: str, config: str, steps: int) -> list[float]:
    loop = bench_step.TrainLoop(name, config, "cpu")
    with loop.context():
        return [float(loop.step(i)) for i in range(steps)]


def test_eager_rows_autocast_is_entered_for_each_step(bench_step, monkeypatch):
    """One autocast context around several steps makes eager read the first step's bfloat16 weights (PyTorch keeps
    its casts until the outermost context exits): the bench's eager reference, trained so, stopped learning and judged
    a correct run wrong by 1.4 (llama-1b, 2026-12-06). Its eager row is the written-out loop, bit for bit."""
    monkeypatch.setattr(bench_step.sized_models, "AUTOCAST", frozenset({"llama2"}))
    expected = _written_out(bench_step, "llama2", 5)
    assert _bench_losses(bench_step, "llama2", "eager", 5) == expected


def test_one_context_around_the_loop_is_what_the_test_above_tells_apart(bench_step):
    """The test above can fail: eager under one autocast context for the whole loop gives other losses."""
    assert _written_out(bench_step, "llama2", 5, one_context=True) != _written_out(bench_step, "llama2", 5)


def test_matches_judges_with_the_protocols_tolerance(bench_step):
    eager = [4.8516, 4.8203, 4.7891]
    assert bench_step.matches([4.8516, 4.8203, 4.7891 + 2e-2], eager, autocast=True).startswith("yes")
    verdict = bench_step.matches([4.8516, 4.8203, 4.7891 + 2e-2], eager, autocast=False)
    assert verdict.startswith("no (2.0e-02: loss[2]"), verdict
    assert bench_step.matches(eager, eager, autocast=False) == "yes (0.0e+00)"


def test_the_whole_step_rows_call_under_autocast_for_each_step(bench_step, monkeypatch):
    """The whole-step rows (jit_step, the hand captures, PT2's) call their step inside autocast, entered for that call
    alone: what jit_step reads to trace under it, and exited before the next step (eager's cast cache with it)."""
    monkeypatch.setattr(bench_step.sized_models, "AUTOCAST", frozenset({"llama2"}))
    loop = bench_step.TrainLoop("llama2", "eager", "cpu")
    seen = []

    def whole(idx, targets):
        seen.append(torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16)
        return torch.zeros(())

    loop.whole = whole
    with loop.context():
        for i in range(2):
            loop.step(i)
            seen.append(torch.is_autocast_enabled("cpu"))
    assert seen == [True, False, True, False]
