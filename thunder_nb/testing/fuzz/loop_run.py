"""One training loop run under one configuration (`run`): its model and data, the user's iteration around the loss
function (or `jit_step`'s), the events between steps, and every step's values recorded (`LoopRun`)."""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ... import internals
from .loop_features import OPTIMIZERS, RAGGED_BATCH, Loop

__all__ = ["LoopRun", "CONFIGS", "REFERENCES", "FLOAT32", "run"]

#: The configurations a loop runs under, besides "eager": ``thunder_nb.jit`` of the loss function with thunder's
#: default executors or inductor's fusions ("fused"), ``jit_step`` of the whole iteration, and ``thunder_nb.jit`` of
#: the model ("thunder_nb.jit(model)": the loop then holds the compiled module, and does to it what it did to the
#: model: ``eval()``, ``state_dict()``, a layer frozen through it, a head set on it), each with a capture mode.
CONFIGS = ("thunder_nb.jit", "fused", "jit_step", "jit_step fused", "thunder_nb.jit(model)")
#: The run without graphs whose numerics each configuration has (thunder.jit with the same executors, no transform):
#: its difference from eager bounds the configuration's.
REFERENCES = {"thunder_nb.jit": "thunder", "fused": "thunder fused", "jit_step": "thunder",
              "jit_step fused": "thunder fused", "thunder_nb.jit(model)": "thunder(model)"}
_EXECUTORS = {"thunder_nb.jit": [], "fused": ["torchcompile"], "jit_step": [], "jit_step fused": ["torchcompile"],
              "thunder": [], "thunder fused": ["torchcompile"], "thunder_nb.jit(model)": [], "thunder(model)": []}
_MODULE_CONFIGS = ("thunder_nb.jit(model)", "thunder(model)")
#: The end of a recorded value's name that was computed without autocast in a loop trained under it: judged at float32's
#: tolerance (`loops.judge`).
FLOAT32 = " (float32)"
_BATCH = 8


# --- the model and the data -----------------------------------------------------------------------


def _net(kind: str, *, tied: bool = False, checkpoint: bool = False, buffer: bool = False) -> Any:
    import torch
    import torch.utils.checkpoint
    from torch import nn

    class Net(nn.Module):
        """A first layer (``body``, the one frozen), the rest of the features and a head; with ``tied``, a layer
        ``tied`` after them that holds the weight of a layer of its own (``mix``, as nanoGPT's output layer holds the
        embedding's); with ``checkpoint``, the rest (after a BatchNorm) recomputed in the backward; with ``buffer``,
        a moving average of the features' mean kept in the buffer ``level``, updated in place in training mode, and
        taken out of the features by every forward."""

        def __init__(self) -> None:
            super().__init__()
            if kind == "mlp":
                self.body, self.rest = nn.Linear(8, 16), nn.Sequential(nn.Tanh(), nn.Linear(16, 16), nn.ReLU())
            elif kind == "conv-bn":
                self.body = nn.Conv2d(3, 8, 3, padding=1, bias=False)
                # NOTE: resnet's stem: a padded max pool after BatchNorm (issue 50's NaN came from its backward)
                self.rest = nn.Sequential(nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1),
                                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 16))
            else:
                self.body, self.rest = nn.Embedding(32, 16), nn.Sequential(nn.LayerNorm(16), nn.GELU())
            self.head = nn.Linear(16, 4)
            if tied:
                self.mix, self.tied = nn.Linear(16, 16), nn.Linear(16, 16, bias=False)
                self.tied.weight = self.mix.weight
            if buffer:
                self.register_buffer("level", torch.zeros(()))

        def _features(self, h: torch.Tensor, start: int) -> torch.Tensor:
            for layer in list(self.rest)[start:]:
                h = layer(h)
            return h

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            h = self.body(x)
            if checkpoint:
                # NOTE: a BatchNorm stays out of the recomputed part: eager PyTorch updates its running statistics
                # again in the recomputation, thunder once (`thunder_nb.internals.checkpoint`, which warns of it)
                start = 1 if kind == "conv-bn" else 0
                h = self.rest[0](h) if start else h
                h = torch.utils.checkpoint.checkpoint(self._features, h, start, use_reentrant=False)
            else:
                h = self.rest(h)
            h = h.mean(1) if kind == "embed" else h
            if buffer:
                if self.training:
                    with torch.no_grad():
                        self.level.mul_(0.9).add_(0.1 * h.float().mean())
                h = h - self.level.to(h.dtype)
            if tied:
                h = self.tied(torch.tanh(self.mix(h)))
            if hasattr(self, "head2"):  # NOTE: a head added mid-run: the trace branches on the name's presence
                return self.head(h), self.head2(h)
            return (self.head(h),)

    return Net()


def _batch(kind: str, seed: int, step: int, n: int, device: Any) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(seed * 1000 + step)
    if kind == "mlp":
        x = torch.randn(n, 8, generator=g)
    elif kind == "conv-bn":
        x = torch.randn(n, 3, 6, 6, generator=g)
    else:
        x = torch.randint(0, 32, (n, 5), generator=g)
    return x.to(device), torch.randint(0, 4, (n,), generator=g).to(device)


def _loss_fn(model: Any, loop: Loop) -> Callable[..., Any]:
    import torch.nn.functional as F

    def loss_fn(x, y):
        if loop.inplace:  # NOTE: the caller's batch changes too, in eager PyTorch: every configuration must do the same
            x = x.clamp_(max=15) if loop.model == "embed" else x.mul_(0.5)
        logits = model(x)
        loss = F.cross_entropy(logits[0], y)
        for more in logits[1:]:
            loss = loss + F.cross_entropy(more, y)
        return loss

    return loss_fn


def _optimizer(name: str, model: Any, groups: bool) -> Any:
    """``torch.optim.<name>`` over the model's parameters; with ``groups``, in three param groups: the weights (at the
    optimizer's weight decay), the biases and norms (without), and the head (at half the learning rate)."""
    import torch

    kwargs = dict(OPTIMIZERS[name])
    cls = getattr(torch.optim, name.split("-")[0])
    if not groups:
        return cls(model.parameters(), **kwargs)
    named = list(model.named_parameters())
    decay = [p for n, p in named if p.dim() >= 2 and not n.startswith("head.")]
    rest = [p for n, p in named if p.dim() < 2 and not n.startswith("head.")]
    head = [p for n, p in named if n.startswith("head.")]
    no_decay = {"weight_decay": 0.0} if "weight_decay" in kwargs else {}
    return cls([{"params": decay}, {"params": rest, **no_decay}, {"params": head, "lr": kwargs["lr"] / 2}], **kwargs)


def _update_ema(ema: dict[str, Any], model: Any) -> None:
    """The moving average a loop keeps of the weights (``ema = 0.9 ema + 0.1 w``), after each step; a parameter new
    to it (a head added mid-run) starts at its value."""
    import torch

    with torch.no_grad():
        for n, p in model.named_parameters():
            if n in ema:
                ema[n].lerp_(p, 0.1)
            else:
                ema[n] = p.detach().clone()


def _scheduler(name: str, opt: Any, steps: int) -> Any:
    import torch

    s = torch.optim.lr_scheduler
    if name == "lambda":
        return s.LambdaLR(opt, lambda i: 1.0 / (1 + i))
    if name == "step":
        return s.StepLR(opt, step_size=2, gamma=0.5)
    if name == "onecycle":
        # NOTE: the default cycle_momentum=True, where the optimizer has a momentum or betas to cycle
        cycle = "momentum" in opt.defaults or "betas" in opt.defaults
        return s.OneCycleLR(opt, max_lr=0.05, total_steps=steps + 2, cycle_momentum=cycle)
    if name == "cosine":
        return s.CosineAnnealingLR(opt, T_max=steps)
    return None


# --- running a loop ---------------------------------------------------------------------------------


@dataclass
class LoopRun:
    """What a loop did under one configuration: per step, the values to compare with eager's."""

    config: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    refused: str | None = None  # a clear refusal (``StepRefused``, a ValueError or TypeError naming the cause)
    error: str | None = None  # anything else that stopped it, ``Type: first line``
    warnings: list[str] = field(default_factory=list)


def _autocast(precision: str, device: Any) -> Any:
    import torch

    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def _state(model: Any, opt: Any) -> dict[str, Any]:
    out = {f"param {n}": p.detach().clone() for n, p in model.named_parameters()}
    out |= {f"buffer {n}": b.detach().clone() for n, b in model.named_buffers()}
    names = {id(p): n for n, p in model.named_parameters()}
    for p, st in opt.state.items():
        for k, v in st.items():
            # NOTE: on the host, in float32: a capturable optimizer keeps its step count on the device, eager on the CPU
            v = v.detach().float().cpu().clone() if hasattr(v, "detach") else float(v)
            out[f"optimizer {names.get(id(p), '?')}.{k}"] = v
    return out


def run(loop: Loop, config: str = "eager", *, capture: Any = False, device: Any = "cpu") -> LoopRun:
    """Run ``loop`` under ``config`` ("eager" or one of `CONFIGS`) in capture mode ``capture`` (False, "emulated", or
    True on a GPU) on ``device``; never raises for what the loop does (a refusal or an error is recorded)."""
    import torch

    from ... import fix
    from ...step import StepRefused, jit_step
    from ..modes import capturing, emulate_runner, jit_capture

    out = LoopRun(config)
    compiled_mode = config in ("thunder_nb.jit", "fused", "thunder_nb.jit(model)")
    torch.manual_seed(loop.seed)
    model = _net(loop.model, tied=loop.tied, checkpoint=loop.checkpoint, buffer=loop.buffer).to(device)
    handle = writes = model  # NOTE: what the loop holds and calls, and what it sets a head on
    if config in _MODULE_CONFIGS:
        import thunder

        from ...cudagraph.executors import jit_executors

        if config == "thunder(model)":
            # NOTE: thunder's module sets an attribute on itself, where its forward never reads it: the yardstick's
            # writes go to the model, where the compiled one's go through
            handle = thunder.jit(model, executors=jit_executors(_EXECUTORS[config]))
        else:
            handle = writes = fix.jit(model, capture=jit_capture(capture), executors=_EXECUTORS[config])
            emulate_runner(internals.jit_transforms(handle)[0], capture)
    loss_fn = _loss_fn(handle, loop)
    opt = _optimizer(loop.optimizer, handle, loop.groups)
    ema: dict[str, Any] = {n: p.detach().clone() for n, p in model.named_parameters()} if loop.ema else {}
    sched = _scheduler(loop.scheduler, opt, loop.steps)
    scaler = None
    if loop.precision == "fp16-scaler":
        scaler = torch.amp.GradScaler(torch.device(device).type, init_scale=2.0**8)
    saved: dict[str, bytes] = {}  # the checkpoint a "save" wrote, for a "load"
    step = compiled = None
    try:
        with warnings.catch_warnings(record=True) as caught, capturing(capture if compiled_mode else False):
            warnings.simplefilter("always")
            if config.startswith("jit_step"):
                step = jit_step(model, loss_fn, opt, accumulate=loop.accumulate, max_grad_norm=loop.clip,
                                capture=capture, warmup=1, executors=_EXECUTORS[config])
            elif config in ("thunder", "thunder fused"):
                import thunder

                from ...cudagraph.executors import jit_executors

                compiled = thunder.jit(loss_fn, executors=jit_executors(_EXECUTORS[config]))
            elif config not in ("eager", *_MODULE_CONFIGS):
                compiled = fix.jit(loss_fn, capture=jit_capture(capture), executors=_EXECUTORS[config])
                emulate_runner(internals.jit_transforms(compiled)[0], capture)
            forward = compiled or loss_fn
            hooked = None
            for i in range(loop.steps):
                record: dict[str, Any] = {}
                if loop.hook and i == loop.hook:
                    hooked = model.head.register_forward_hook(lambda m, args, out: out * 0.5)
                elif loop.hook and i == loop.hook + 2:
                    hooked.remove()
                for event in (e for at, e in loop.events if at == i):
                    _event(event, loop, i, (handle, writes), forward, opt, sched, record, saved, device)
                if loop.scheduler == "manual" and i == loop.steps // 2:
                    for g in opt.param_groups:
                        g["lr"] = g["lr"] * 0.3
                n = RAGGED_BATCH if (loop.ragged and i == loop.steps - 1) else _BATCH
                x, y = _batch(loop.model, loop.seed, i, n, device)
                if step is not None:
                    with _autocast(loop.precision, device):
                        loss = step(x, y)
                else:
                    loss = _eager_step(loop, model, forward, opt, scaler, x, y, device)
                if sched is not None:
                    sched.step()
                if loop.ema:
                    _update_ema(ema, model)
                    record.update({f"ema {n}": e.clone() for n, e in ema.items()})
                record["loss"] = loss.item() if loop.logged else loss.detach().float().clone()
                record["batch"] = x.detach().clone()  # NOTE: as the caller sees it after the step
                record.update(_state(model, opt))
                out.steps.append(record)
        out.warnings = [f"{w.category.__name__}: {w.message}" for w in caught
                        if "thunder" in str(w.message) or "jit_step" in str(w.message)]
    except (StepRefused, ValueError, TypeError) as e:
        out.refused = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
    except Exception as e:  # noqa: BLE001 - the fuzzer records every failure and judges it
        out.error = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
    return out


def _event(event: str, loop: Loop, i: int, models: tuple[Any, Any], forward: Callable[..., Any], opt: Any,
           sched: Any, record: dict[str, Any], saved: dict[str, bytes], device: Any) -> None:
    """What a user's loop does between two steps (`EVENTS`), before step ``i``, to the model it holds (``models``:
    that, and what it sets a head on)."""
    import torch

    model, writes = models
    if event == "eval":
        model.eval()
        with torch.no_grad(), _autocast("fp32" if loop.eval_fp32 else loop.precision, device):
            xv, yv = _batch(loop.model, loop.seed, 100 + i, _BATCH, device)
            record["validation loss" + (FLOAT32 if loop.eval_fp32 else "")] = forward(xv, yv).float()
        model.train()
    elif event == "freeze":
        model.body.requires_grad_(False)
    elif event == "unfreeze":
        model.body.requires_grad_(True)
    elif event == "add-head":
        torch.manual_seed(loop.seed + 1)
        head = torch.nn.Linear(16, 4).to(device)
        writes.head2 = head
        # NOTE: the group's other settings as the first group has them (a scheduler's max_lr, initial_lr)
        opt.add_param_group({**{k: v for k, v in opt.param_groups[0].items() if k != "params"},
                             "params": list(head.parameters())})
    elif event == "save":
        buf = io.BytesIO()
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                    "sched": sched.state_dict() if sched else None}, buf)
        saved["checkpoint"] = buf.getvalue()
    elif event == "load" and "checkpoint" in saved:
        ckpt = torch.load(io.BytesIO(saved["checkpoint"]), weights_only=False)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        if sched is not None:
            sched.load_state_dict(ckpt["sched"])


def _eager_step(loop: Loop, model: Any, forward: Callable[..., Any], opt: Any, scaler: Any, x: Any, y: Any,
                device: Any) -> Any:
    """One iteration as a user writes it around a loss function: zero_grad, forward and backward per micro-batch,
    clipping, the optimizer's (or the GradScaler's) step."""
    import torch

    opt.zero_grad()
    total = None
    k = loop.accumulate
    for xp, yp in zip(x.chunk(k), y.chunk(k)):
        with _autocast(loop.precision, device):
            loss = forward(xp, yp)
        part = loss / k if k > 1 else loss
        (scaler.scale(part) if scaler is not None else part).backward()
        total = part.detach() if total is None else total + part.detach()
    if scaler is not None:
        scaler.unscale_(opt)
    if loop.clip is not None:
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], loop.clip)
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    return total

