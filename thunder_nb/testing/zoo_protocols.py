"""The zoo's protocols: the loops people run around a model (training with the optimizer outside the compiled
function, a logged loss, kept outputs, inference, KV-cache decoding, dropout), each returning what to compare with
eager's run."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from .zoo_models import ZooModel

__all__ = ["FIRST_STEP", "PROTOCOLS", "TRAINING_OPTIMIZERS", "training_optimizer", "keep_rate", "whole_step_training"]

#: The key of a training protocol's first step in its values: its loss, and the parameters and buffers after its update.
#: One step from the same weights is where thunder's numerics and eager's can be told apart: later steps amplify a
#: last-bit difference (a ReLU or BatchNorm over four samples that tips the other way), so the zoo's judge reads it
#: where the rest differs (`thunder_nb.testing.zoo.judge`).
FIRST_STEP = "first step"

#: The training protocols and the optimizer each one's loop steps with (`training_optimizer`): SGD with momentum
#: where BatchNorm trains or gradients are kept by ``zero_grad``, AdamW otherwise.
TRAINING_OPTIMIZERS = {"train": "adamw", "logged": "adamw", "autocast": "adamw", "zero-grad": "sgd", "batchnorm": "sgd"}


def training_optimizer(kind: str, params: Any) -> Any:
    """The zoo's optimizer ``kind`` ("adamw" or "sgd", as `TRAINING_OPTIMIZERS` names it) over ``params``."""
    import torch

    return torch.optim.AdamW(params, lr=1e-3) if kind == "adamw" else torch.optim.SGD(params, lr=0.01, momentum=0.9)


def _loss_value(loss: Any, logged: bool) -> Any:
    # NOTE: float32, as a logged number would be: under autocast eager's cross-entropy is float32, thunder's bfloat16.
    # A copy: torch.compile reduce-overhead's next replay overwrites the loss it returned (and says so when it is read);
    # keeping outputs is the "kept" protocol's question, not this one's
    return loss.item() if logged else loss.detach().float().clone()


def _snapshot(model: Any) -> dict[str, Any]:
    """Parameters and buffers (BatchNorm's running statistics and ``num_batches_tracked``), copied."""
    return {n: t.detach().clone() for n, t in [*model.named_parameters(), *model.named_buffers()]}


def _train(model: ZooModel, net: Any, compiled: Callable[..., Any], device: Any, steps: int, *, protocol: str = "train",
           logged: bool = False, set_to_none: bool = True, autocast: bool = False) -> dict[str, Any]:
    """A training loop with the optimizer outside the compiled function: zero_grad, forward, backward, step; the
    optimizer is ``protocol``'s (`TRAINING_OPTIMIZERS`)."""
    import torch

    opt = training_optimizer(TRAINING_OPTIMIZERS[protocol], net.parameters())
    losses, first = [], None
    dtype = torch.bfloat16
    around = (lambda: torch.autocast(torch.device(device).type, dtype=dtype)) if autocast else contextlib.nullcontext
    for i in range(steps):
        args, targets = model.batch(i, device)
        opt.zero_grad(set_to_none=set_to_none)
        with around():
            loss = compiled(*args, targets)
        loss.backward()
        opt.step()
        losses.append(_loss_value(loss, logged))
        if i == 0:
            first = {"loss": losses[0], "state": _snapshot(net)}
    return {"losses": losses, "state": _snapshot(net), FIRST_STEP: first}


def whole_step_training(model: ZooModel, step: Any, device: Any, steps: int, protocol: str) -> dict[str, Any]:
    """``protocol``'s training loop (`_train`'s) with a `thunder_nb.step.jit_step` in place of the compiled loss, its
    backward and the optimizer's step: what to compare with eager's `_train` from the same state."""
    import torch

    losses, first = [], None
    around = ((lambda: torch.autocast(torch.device(device).type, dtype=torch.bfloat16)) if protocol == "autocast"
              else contextlib.nullcontext)
    for i in range(steps):
        args, targets = model.batch(i, device)
        with around():
            loss = step(*args, targets)
        losses.append(_loss_value(loss, protocol == "logged"))
        if i == 0:
            first = {"loss": losses[0], "state": _snapshot(step.model)}
    return {"losses": losses, "state": _snapshot(step.model), FIRST_STEP: first}


def _kept(model: ZooModel, net: Any, compiled: Callable[..., Any], device: Any, steps: int) -> dict[str, Any]:
    """Three forwards kept, then a backward for each (gradients accumulate), for ``steps`` rounds."""
    out = []
    for r in range(steps):
        batches = [model.batch(3 * r + k, device) for k in range(3)]
        losses = [compiled(*args, targets) for args, targets in batches]
        for loss in losses:
            loss.backward()
        out.append([loss.detach().clone() for loss in losses])
    return {"losses": out, "grads": {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}}


def _inference(model: ZooModel, net: Any, compiled: Callable[..., Any], device: Any, steps: int) -> dict[str, Any]:
    """Eval mode under ``no_grad``, every output kept until the end."""
    import torch

    net.eval()
    with torch.no_grad():
        outs = [compiled(*model.batch(i, device)[0]) for i in range(steps)]
    return {"outputs": outs}


def _decode(model: ZooModel, net: Any, compiled: Callable[..., Any], device: Any, steps: int) -> dict[str, Any]:
    """KV-cache decoding, greedy: a prefill of 8 tokens, then ``2 * steps`` one-token calls with ``input_pos``
    advancing (the model's KV cache set up by `run_protocol`); every call's logits kept, and the tokens."""
    import torch

    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 128, (1, 8), generator=g).to(device)
    logits, tokens = [], []
    with torch.no_grad():
        out = compiled(prompt, torch.arange(8, device=device))
        for t in range(8, 8 + 2 * steps):
            logits.append(out)
            token = out[:, -1].argmax(-1, keepdim=True)
            tokens.append(int(token))
            out = compiled(token, torch.tensor([t], device=device))
    return {"logits": logits, "tokens": tokens}


def _dropout(model: ZooModel, net: Any, compiled: Callable[..., Any], device: Any, steps: int) -> dict[str, Any]:
    """Forward and backward of a model with dropout on one batch and fixed weights: only the masks change between
    calls, so the losses must differ from call to call, and stay finite."""
    args, targets = model.batch(0, device)
    losses, grads = [], []
    for _ in range(steps):
        net.zero_grad()
        loss = compiled(*args, targets)
        loss.backward()
        losses.append(loss.item())
        grads.append(float(sum(p.grad.float().norm() for p in net.parameters() if p.grad is not None)))
    finite = all(abs(v) < float("inf") for v in losses + grads)  # NOTE: NaN fails the comparison too
    return {"finite": finite, "distinct": len(set(losses)) == len(losses), "losses": losses}


def keep_rate(compiled_dropout: Callable[..., Any], device: Any, calls: int = 4) -> tuple[float, bool]:
    """(the fraction of elements kept, whether the mask changed on every call) of a compiled ``dropout(ones)``."""
    import torch

    x = torch.ones(1 << 16, device=device)
    masks = [compiled_dropout(x) != 0 for _ in range(calls)]
    kept = float(torch.stack(masks).float().mean())
    return kept, all(not torch.equal(a, b) for a, b in zip(masks, masks[1:]))


PROTOCOLS: dict[str, Callable[..., dict[str, Any]]] = {
    "train": _train,
    "logged": lambda m, n, c, d, s: _train(m, n, c, d, s, protocol="logged", logged=True),
    "zero-grad": lambda m, n, c, d, s: _train(m, n, c, d, s, protocol="zero-grad", set_to_none=False),
    "autocast": lambda m, n, c, d, s: _train(m, n, c, d, s, protocol="autocast", autocast=True),
    "batchnorm": lambda m, n, c, d, s: _train(m, n, c, d, s, protocol="batchnorm"),
    "kept": _kept,
    "inference": _inference,
    "decode": _decode,
    "dropout": _dropout,
}
