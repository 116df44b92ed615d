"""Random ops in a CUDA graph draw new numbers at every replay, as eager PyTorch draws new ones at every call.

A graph that kept the numbers it drew when it was recorded would apply one dropout mask to every step: training
that runs, and is wrong in a way no single step shows (issue 52 quotes a full-iteration graph with its random
numbers baked in: 3.47% off in the loss). torch's capture registers the default generator and each replay takes
its next numbers from it, so `thunder_nb.jit`'s regions and `jit_step`'s one graph a step must draw anew at every
call, at the rate asked for, and draw the same again after the same seed. On the CPU the replays are the emulated
capture's (`gpu_or_emulated`); ``-m gpu`` runs the same cases under real capture.
"""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch

import thunder_nb
from gpu_or_emulated import CAPTURE, MODES, capturing, device_of, fixed
from thunder_nb.step import RecordAgainWarning

#: Elements a mask has: the share kept is 0.5 within 0.01, 5 standard deviations of a fair coin's share (0.002).
N = 1 << 16


def dropped(x):
    return torch.nn.functional.dropout(x, 0.5, training=True) * 3 + 1


def _masks(outs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Which elements each output kept (dropout zeroes the rest, so they come out as 1)."""
    return [o != 1 for o in outs]


def _drawn_anew(masks: list[torch.Tensor]) -> None:
    for m in masks:
        assert abs(m.float().mean().item() - 0.5) < 0.01
    same = [(i, j) for (i, a), (j, b) in itertools.combinations(enumerate(masks), 2) if torch.equal(a, b)]
    assert same == [], f"calls {same} drew the same mask"


@pytest.mark.parametrize("mode", MODES)
def test_a_region_draws_new_numbers_at_every_replay_and_the_same_after_the_same_seed(mode):
    import thunder

    x = torch.ones(N, device=device_of(mode))
    transform = fixed(mode)
    jfn = thunder.jit(dropped, transforms=[transform])
    with capturing(mode):
        for _ in range(4):  # NOTE: warm-up and recording
            jfn(x)
        torch.manual_seed(0)
        first = [jfn(x).clone() for _ in range(4)]
        torch.manual_seed(0)
        again = [jfn(x).clone() for _ in range(4)]
    runner = transform.cuda_graph_runner
    graphs = {name: len(runner.region_stats(name).graphs) for name in runner.python_callables}
    assert list(graphs.values()) == [1], graphs  # NOTE: one region, recorded once, replayed from then on
    _drawn_anew(_masks(first))
    assert all(torch.equal(a, b) for a, b in zip(first, again)), "the same seed drew other numbers"


def _train_with_dropout(mode: str) -> tuple[list[float], int, int]:
    """(the losses of 8 steps, graphs recorded, warm-up steps) of `jit_step` on a model with dropout, from seed 1."""
    device = device_of(mode)
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Dropout(0.5), torch.nn.Linear(256, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # NOTE: the weights stay: only the mask moves the loss
    x = torch.randn(32, 64, device=device)

    def loss_fn(x):
        return model(x).pow(2).mean()

    with warnings.catch_warnings():
        warnings.simplefilter("error", RecordAgainWarning)  # NOTE: one recording for every step
        step = thunder_nb.jit_step(model, loss_fn, optimizer, capture=CAPTURE[mode])
        losses = [float(step(x)) for _ in range(8)]
    return losses, step.graphs_recorded, step.warmup


@pytest.mark.parametrize("mode", MODES)
def test_jit_step_applies_a_new_dropout_mask_at_every_step_and_a_seeded_run_again_gives_the_same(mode):
    losses, graphs, warmup = _train_with_dropout(mode)
    assert graphs == 1
    replays = losses[warmup + 1:]
    assert len(replays) >= 3 and len(set(replays)) == len(replays), losses
    assert _train_with_dropout(mode)[0] == losses  # NOTE: a seeded run is reproducible, replays and all
