"""Differential fuzzing of training loops: the loops people write around a model, run eagerly and under thunder-nb.

A `Loop` composes the features of real training loops: a model (an MLP, a convolution with BatchNorm, an embedding),
any ``torch.optim`` optimizer, an lr scheduler or an lr edited by hand, gradient clipping and accumulation, switches
to eval mode for a validation loss, freezing and unfreezing a layer, a head and its param group added mid-run, a
checkpoint of the model, optimizer and scheduler saved and loaded back, bf16 autocast or fp16 with a GradScaler, a
logged ``loss.item()``, and a ragged last batch. `run` runs one under a configuration (`CONFIGS`) and records every
step; `judge` runs it eagerly, without graphs and under each configuration, and names each run's first step that
leaves eager's.

Dropout's masks come from different random streams under thunder and eager PyTorch, so no loop trains with active
dropout: BatchNorm is what makes train and eval mode differ here.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ... import internals
from .choices import Chooser

__all__ = ["Loop", "LoopRun", "CONFIGS", "MODELS", "OPTIMIZERS", "SCHEDULERS", "PRECISIONS", "EVENTS", "FEATURES",
           "REFERENCES", "generate", "loops", "run", "judge", "LoopVerdict"]

MODELS = ("mlp", "conv-bn", "embed")
#: Every ``torch.optim`` optimizer that steps without a closure on dense gradients, with the options it is made with.
OPTIMIZERS: dict[str, dict[str, Any]] = {
    "SGD": {"lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4},
    "SGD-nesterov": {"lr": 0.05, "momentum": 0.9, "nesterov": True},
    "Adam": {"lr": 1e-2},
    "AdamW": {"lr": 1e-2, "weight_decay": 0.1},
    "Adam-amsgrad": {"lr": 1e-2, "amsgrad": True},
    "Adagrad": {"lr": 0.05},
    "Adadelta": {"lr": 1.0},
    "Adamax": {"lr": 1e-2},
    "ASGD": {"lr": 1e-2},
    "NAdam": {"lr": 1e-2},
    "RAdam": {"lr": 1e-2},
    "RMSprop": {"lr": 1e-3, "momentum": 0.5},
    "Rprop": {"lr": 1e-3},
}
SCHEDULERS = ("none", "lambda", "step", "onecycle", "cosine", "manual")
PRECISIONS = ("fp32", "bf16", "fp16-scaler")
#: What can happen between two steps: a validation loss in eval mode, freezing and unfreezing the first layer, a head
#: added with its param group, a checkpoint saved and (later) loaded back.
EVENTS = ("eval", "freeze", "unfreeze", "add-head", "save", "load")
#: Each feature a loop can have, by name, for `generate`'s ``require``.
FEATURES = (*EVENTS, *SCHEDULERS[1:], "clip", "accumulate", "bf16", "fp16-scaler", "logged", "ragged", "conv-bn",
            "embed")
#: The configurations a loop runs under, besides "eager": ``thunder_nb.jit`` of the loss function with thunder's
#: default executors or inductor's fusions ("fused"), and ``jit_step`` of the whole iteration, each with a capture mode.
CONFIGS = ("thunder_nb.jit", "fused", "jit_step", "jit_step fused")
#: The run without graphs whose numerics each configuration has (thunder.jit with the same executors, no transform):
#: its difference from eager bounds the configuration's.
REFERENCES = {"thunder_nb.jit": "thunder", "fused": "thunder fused", "jit_step": "thunder",
              "jit_step fused": "thunder fused"}
_EXECUTORS = {"thunder_nb.jit": [], "fused": ["torchcompile"], "jit_step": [], "jit_step fused": ["torchcompile"],
              "thunder": [], "thunder fused": ["torchcompile"]}
_BATCH, _RAGGED = 8, 4


@dataclass(frozen=True)
class Loop:
    """One training loop: its model, optimizer and the features around them; ``events`` are ``(step, event)``."""

    model: str = "mlp"
    optimizer: str = "SGD"
    scheduler: str = "none"
    clip: float | None = None
    accumulate: int = 1
    precision: str = "fp32"
    logged: bool = False
    ragged: bool = False
    steps: int = 6
    events: tuple[tuple[int, str], ...] = ()
    seed: int = 0

    def features(self) -> set[str]:
        """The names (`FEATURES`) of what this loop does."""
        out = {e for _, e in self.events} | {self.scheduler, self.model}
        out |= {name for name, on in (("clip", self.clip), ("accumulate", self.accumulate > 1),
                                      ("logged", self.logged), ("ragged", self.ragged)) if on}
        return (out | ({"bf16", "fp16-scaler"} & {self.precision})) & set(FEATURES)

    def __str__(self) -> str:
        parts = [f"{self.model}, {self.optimizer}, {self.steps} steps"]
        parts += [f"scheduler {self.scheduler}"] if self.scheduler != "none" else []
        parts += [f"clip {self.clip}"] if self.clip else []
        parts += [f"accumulate {self.accumulate}"] if self.accumulate > 1 else []
        parts += [self.precision] if self.precision != "fp32" else []
        parts += ["loss.item() logged"] if self.logged else []
        parts += [f"last batch of {_RAGGED}"] if self.ragged else []
        parts += [f"{e} before step {i}" for i, e in self.events]
        return f"Loop(seed {self.seed}: " + "; ".join(parts) + ")"


def generate(chooser: Chooser, *, seed: int = 0, require: str | Iterable[str] = ()) -> Loop:
    """A loop drawn from ``chooser``; ``require`` (`FEATURES` names: at most one scheduler, one of bf16 and
    fp16-scaler, one model) makes sure it has those features."""
    need = {require} if isinstance(require, str) else set(require)
    # NOTE: each pair's second needs its first, which comes a step before it
    need |= {first for second, first in (("unfreeze", "freeze"), ("load", "save")) if second in need}
    model = chooser.choice(MODELS)
    steps = chooser.integer(5, 8)
    events: list[tuple[int, str]] = []
    for event in EVENTS:
        if event in ("unfreeze", "load"):
            continue  # NOTE: each comes after its pair (freeze, save)
        if event == "add-head" and event not in need and need & (set(SCHEDULERS) - {"manual"}):
            continue  # NOTE: a scheduler's base_lrs do not follow add_param_group (see below)
        if chooser.boolean(0.2) or event in need:
            i = chooser.integer(2, steps - 2)
            events.append((i, event))
            if event == "freeze" and ("unfreeze" in need or chooser.boolean(0.5)):
                events.append((i + 1, "unfreeze"))
            if event == "save" and ("load" in need or chooser.boolean(0.7)):
                events.append((i + 1, "load"))
    schedulers = tuple(need & set(SCHEDULERS)) or SCHEDULERS
    optimizers = tuple(OPTIMIZERS)
    at = dict((e, i) for i, e in events)
    if "add-head" in at:
        # NOTE: what eager PyTorch itself refuses after add_param_group: a scheduler made before it (its base_lrs are
        # one short), Adagrad (it makes its state in __init__ only), a checkpoint of the model without the head
        # loaded into it; the head then comes after any load
        schedulers = tuple(x for x in schedulers if x == "manual") or ("manual",)
        optimizers = tuple(o for o in optimizers if o != "Adagrad")
        if "load" in at and at["add-head"] <= at["load"]:
            events = [(i, e) for i, e in events if e != "add-head"] + [(at["load"] + 1, "add-head")]
            steps = max(steps, at["load"] + 2)
    precisions = tuple(need & {"bf16", "fp16-scaler"}) or PRECISIONS
    models = tuple(need & set(MODELS))
    return Loop(
        model=models[0] if models else model,
        optimizer=chooser.choice(optimizers),
        scheduler=chooser.choice(schedulers) if (chooser.boolean(0.5) or need & set(SCHEDULERS)) else "none",
        clip=1.0 if (chooser.boolean(0.25) or "clip" in need) else None,
        accumulate=2 if (chooser.boolean(0.25) or "accumulate" in need) else 1,
        precision=chooser.choice(precisions) if (chooser.boolean(0.25) or need & set(precisions)) else "fp32",
        logged=chooser.boolean(0.5) or "logged" in need,
        ragged=chooser.boolean(0.25) or "ragged" in need,
        steps=steps, events=tuple(sorted(events, key=lambda e: (e[0], EVENTS.index(e[1])))), seed=seed)


def loops() -> Any:
    """A hypothesis strategy of `Loop`s (they shrink towards fewer features)."""
    from hypothesis import strategies as st

    from .choices import HypothesisChooser

    @st.composite
    def draw(draw_fn: Any) -> Loop:
        return generate(HypothesisChooser(draw_fn), seed=draw_fn(st.integers(0, 2**16)))

    return draw()


# --- the model and the data -----------------------------------------------------------------------


def _net(kind: str) -> Any:
    import torch
    from torch import nn

    class Net(nn.Module):
        """A first layer (``body``, the one frozen), the rest of the features and a head."""

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

        def features(self, x: torch.Tensor) -> torch.Tensor:
            h = self.rest(self.body(x))
            return h.mean(1) if kind == "embed" else h

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


def _loss_fn(model: Any) -> Callable[..., Any]:
    import torch.nn.functional as F

    def loss_fn(x, y):
        h = model.features(x)
        loss = F.cross_entropy(model.head(h), y)
        if hasattr(model, "head2"):  # NOTE: a head added mid-run: the trace branches on the name's presence
            loss = loss + F.cross_entropy(model.head2(h), y)
        return loss

    return loss_fn


def _optimizer(name: str, params: Any) -> Any:
    import torch

    kwargs = dict(OPTIMIZERS[name])
    cls = getattr(torch.optim, name.split("-")[0])
    return cls(params, **kwargs)


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
    compiled_mode = config in ("thunder_nb.jit", "fused")
    torch.manual_seed(loop.seed)
    model = _net(loop.model).to(device)
    loss_fn = _loss_fn(model)
    opt = _optimizer(loop.optimizer, model.parameters())
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
            elif config != "eager":
                compiled = fix.jit(loss_fn, capture=jit_capture(capture), executors=_EXECUTORS[config])
                emulate_runner(internals.jit_transforms(compiled)[0], capture)
            forward = compiled or loss_fn
            for i in range(loop.steps):
                record: dict[str, Any] = {}
                for event in (e for at, e in loop.events if at == i):
                    _event(event, loop, i, model, forward, opt, sched, record, saved, device)
                if loop.scheduler == "manual" and i == loop.steps // 2:
                    for g in opt.param_groups:
                        g["lr"] = g["lr"] * 0.3
                n = _RAGGED if (loop.ragged and i == loop.steps - 1) else _BATCH
                x, y = _batch(loop.model, loop.seed, i, n, device)
                if step is not None:
                    with _autocast(loop.precision, device):
                        loss = step(x, y)
                else:
                    loss = _eager_step(loop, model, forward, opt, scaler, x, y, device)
                if sched is not None:
                    sched.step()
                record["loss"] = loss.item() if loop.logged else loss.detach().float().clone()
                record.update(_state(model, opt))
                out.steps.append(record)
        out.warnings = [f"{w.category.__name__}: {w.message}" for w in caught
                        if "thunder" in str(w.message) or "jit_step" in str(w.message)]
    except (StepRefused, ValueError, TypeError) as e:
        out.refused = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
    except Exception as e:  # noqa: BLE001 - the fuzzer records every failure and judges it
        out.error = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
    return out


def _event(event: str, loop: Loop, i: int, model: Any, forward: Callable[..., Any], opt: Any, sched: Any,
           record: dict[str, Any], saved: dict[str, bytes], device: Any) -> None:
    """What a user's loop does between two steps (`EVENTS`), before step ``i``."""
    import torch

    if event == "eval":
        model.eval()
        with torch.no_grad(), _autocast(loop.precision, device):
            xv, yv = _batch(loop.model, loop.seed, 100 + i, _BATCH, device)
            record["validation loss"] = forward(xv, yv).float()
        model.train()
    elif event == "freeze":
        model.body.requires_grad_(False)
    elif event == "unfreeze":
        model.body.requires_grad_(True)
    elif event == "add-head":
        torch.manual_seed(loop.seed + 1)
        model.head2 = torch.nn.Linear(16, 4).to(device)
        # NOTE: the group's other settings as the first group has them (a scheduler's max_lr, initial_lr)
        opt.add_param_group({**{k: v for k, v in opt.param_groups[0].items() if k != "params"},
                             "params": list(model.head2.parameters())})
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


#: The base tolerance of each precision (`thunder_nb.diagnosis.judge`): beyond it a run may differ from eager as far
#: as thunder without graphs does on the same loop, value by value, while that reference is itself sane.
def _tolerance(precision: str) -> Any:
    from ...diagnosis.judge import AUTOCAST, MODEL

    return MODEL if precision == "fp32" else AUTOCAST


@dataclass
class LoopVerdict:
    """A loop judged: each (configuration, capture mode) run's first divergence from eager, or its refusal."""

    loop: Loop
    eager: LoopRun
    runs: dict[tuple[str, Any], LoopRun]
    wrong: dict[tuple[str, Any], str]  # the first divergence of each run that left eager's
    references: dict[str, LoopRun]
    reference_problems: dict[str, str]  # where thunder without graphs itself leaves eager: thunder's own gap


    def report(self) -> str:
        """Every wrong run with its first diverging step, under the loop."""
        lines = [str(self.loop)]
        lines += [f"  {c} (capture={m!r}): {why}" for (c, m), why in self.wrong.items()]
        lines += [f"  ({name}, the reference: {why})" for name, why in self.reference_problems.items()]
        return "\n".join(lines)


def _difference(a: dict[str, Any], b: dict[str, Any], ref: dict[str, Any] | None, precision: str) -> str | None:
    """The first difference of step record ``a`` from eager's ``b`` (a value missing from either, or one the judge
    calls unequal, given thunder-without-graphs' record ``ref`` of the same step); None when they are equal."""
    from ...diagnosis.judge import judge as judge_values

    missing, more = [k for k in b if k not in a], [k for k in a if k not in b]
    if missing or more:
        extra = len(missing) + len(more) - 1
        return (f"{missing[0]} missing (eager has it)" if missing else f"{more[0]} (eager has none)") + (
            f", and {extra} more" if extra else "")
    if ref is not None and set(ref) != set(b):
        ref = None  # NOTE: thunder without graphs lacks a value eager has: no yardstick (reported on its own)
    j = judge_values(a, b, without_graphs=ref, tolerance=_tolerance(precision), label="")
    return None if j.equal else j.difference.lstrip(" ")


def judge(loop: Loop, runs: Sequence[tuple[str, Any]], device: Any = "cpu") -> LoopVerdict:
    """Run ``loop`` eagerly, without graphs (each reference `REFERENCES` names) and in each (configuration, capture
    mode) of ``runs``; each run must equal eager's at every step, by `thunder_nb.diagnosis.judge`'s rule with the
    reference's record of the same step as its yardstick."""
    eager = run(loop, "eager", device=device)
    refs = {name: run(loop, name, device=device) for name in dict.fromkeys(REFERENCES[c] for c, _ in runs)}
    problems = {}
    for name, ref in refs.items():
        if ref.error or ref.refused:
            problems[name] = f"thunder without graphs failed: {ref.error or ref.refused}"
            continue
        for i, (a, b) in enumerate(zip(ref.steps, eager.steps)):
            why = _difference(a, b, None, loop.precision)
            if why is not None:
                problems[name] = f"thunder without graphs leaves eager at step {i}: {why}"
                break
    done: dict[tuple[str, Any], LoopRun] = {}
    wrong: dict[tuple[str, Any], str] = {}
    for config, mode in runs:
        got = run(loop, config, capture=mode, device=device)
        done[(config, mode)] = got
        if got.refused or got.error:
            continue  # NOTE: not silent: the caller tallies refusals and errors
        ref = refs[REFERENCES[config]]
        for i, (a, b) in enumerate(zip(got.steps, eager.steps)):
            diff = _difference(a, b, ref.steps[i] if i < len(ref.steps) else None, loop.precision)
            if diff is not None:
                wrong[(config, mode)] = f"step {i}: {diff}"
                break
        else:
            if len(got.steps) != len(eager.steps):
                wrong[(config, mode)] = f"{len(got.steps)} steps run, eager ran {len(eager.steps)}"
    return LoopVerdict(loop, eager, done, wrong, refs, problems)
