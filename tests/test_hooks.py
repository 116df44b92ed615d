"""Module hooks under thunder-nb: a hook registered or removed between calls runs as eager PyTorch runs it
(`thunder_nb.cudagraph.module_reads.HookState`: thunder's cache does not check hooks, so a hook registered after the
first call never ran, and one removed kept running, with no error), and what a trace cannot do with a hook is warned of
(`TracedHookWarning`)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook

import thunder_nb
from thunder_nb.cudagraph.notices import TracedHookWarning
from thunder_nb.diagnosis.judge import MODEL, assert_equal
from thunder_nb.testing.modes import capturing


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


#: name -> register(model): the hook's handle. Each changes what the model computes, so running without it is seen.
HOOKS = {
    "a forward hook of a Linear": lambda m: m[0].register_forward_hook(lambda mod, args, out: out * 0.5),
    "a pre-hook of a Linear": lambda m: m[2].register_forward_pre_hook(lambda mod, args: (args[0] * 2,)),
    "a forward hook of a ReLU (no parameters)": lambda m: m[1].register_forward_hook(lambda mod, args, out: out + 0.1),
    "a global forward hook": lambda m: register_module_forward_hook(
        lambda mod, args, out: out * 1.5 if isinstance(mod, nn.Linear) else None),
}


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out.square().mean()


def _train(config: str, hook: str) -> dict:
    """Six SGD steps under ``config``; the hook registered before step 2 and removed before step 4."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if config == "jit_step":
        step = thunder_nb.jit_step(model, lambda x: _loss(model(x)), opt, capture="emulated", warmup=1)
    else:
        forward = model if config == "eager" else thunder_nb.jit(
            model if config == "thunder_nb.jit(model)" else lambda x: model(x))

        def step(x):
            opt.zero_grad()
            loss = _loss(forward(x))
            loss.backward()
            opt.step()
            return loss
    losses, handle = [], None
    try:
        for i in range(6):
            if i == 2:
                handle = HOOKS[hook](model)
            if i == 4:
                handle.remove()
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(i))
            losses.append(step(x).detach().clone())
    finally:
        if handle is not None:
            handle.remove()
    return {"losses": torch.stack(losses), "parameters": [p.detach().clone() for p in model.parameters()]}


@pytest.mark.parametrize("hook", [pytest.param(h, marks=[] if i == 0 else [pytest.mark.slow])
                                  for i, h in enumerate(HOOKS)])
@pytest.mark.parametrize("config", ["thunder_nb.jit(model)", "thunder_nb.jit(function)", "jit_step"])
def test_a_hook_registered_then_removed_between_calls_runs_as_in_eager(config, hook):
    eager = _train("eager", hook)
    with warnings.catch_warnings(), capturing("emulated"):
        warnings.simplefilter("ignore", TracedHookWarning)  # NOTE: said of each trace with the hook (tested below)
        got = _train(config, hook)
    assert_equal(got, eager, tolerance=MODEL)


def test_a_hook_that_records_is_warned_of_once_as_having_run_while_tracing():
    model, seen = _model(), []
    model[0].register_forward_hook(lambda mod, args, out: seen.append(out))
    compiled = thunder_nb.jit(model)
    x = torch.randn(3, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            compiled(x)
    said = [str(w.message) for w in caught if w.category is TracedHookWarning]
    assert len(said) == 1 and "<lambda>" in said[0] and "happened once, while tracing" in said[0], said
    assert len(seen) == 1  # NOTE: what the warning says: the hook ran at tracing only


def test_a_backward_hook_is_warned_of_as_never_run():
    model = _model()
    model[2].register_full_backward_hook(lambda mod, grad_in, grad_out: (grad_in[0] * 0,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        thunder_nb.jit(model)(torch.randn(3, 4)).sum().backward()
    said = [str(w.message) for w in caught if w.category is TracedHookWarning]
    assert any("runs no module backward hook" in s for s in said), said
