"""The loops the training-loop fuzzer composes (`Loop`): a model, an optimizer and the features around them, drawn by a
chooser (`generate`) or by hypothesis (`loops`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .choices import Chooser

__all__ = ["Loop", "MODELS", "OPTIMIZERS", "SCHEDULERS", "PRECISIONS", "EVENTS", "FEATURES", "RAGGED_BATCH",
           "generate", "loops"]

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
            "embed", "inplace-batch", "param-groups", "ema", "hook", "eval-fp32", "tied", "checkpoint",
            "buffer")
#: The size of a ragged loop's last batch.
RAGGED_BATCH = 4


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
    inplace: bool = False  # the loss function updates its batch in place (scales the inputs, clamps the token ids)
    # NOTE: as nanoGPT's configure_optimizers and timm make them: weights with weight decay, biases and norms without,
    # the head at half the learning rate
    groups: bool = False
    ema: bool = False  # an exponential moving average of the weights, updated after every step
    hook: int = 0  # a forward hook on the head (it halves its output) registered before this step, removed 2 later
    eval_fp32: bool = False  # under bf16 or fp16 training, the validation loss in float32 (no autocast)
    # NOTE: as nanoGPT and llama tie the embedding and the output layer: a second layer holding the same weight
    tied: bool = False
    checkpoint: bool = False  # the features after the first layer recomputed in the backward (torch.utils.checkpoint)
    # NOTE: a running statistic the forward keeps in a buffer of its own, written in place in training mode (what
    # thunder traces inside a function that calls the module too), read by every forward
    buffer: bool = False
    steps: int = 6
    events: tuple[tuple[int, str], ...] = ()
    seed: int = 0

    def features(self) -> set[str]:
        """The names (`FEATURES`) of what this loop does."""
        out = {e for _, e in self.events} | {self.scheduler, self.model}
        out |= {name for name, on in (("clip", self.clip), ("accumulate", self.accumulate > 1),
                                      ("logged", self.logged), ("ragged", self.ragged),
                                      ("inplace-batch", self.inplace), ("param-groups", self.groups),
                                      ("ema", self.ema), ("hook", self.hook), ("tied", self.tied),
                                      ("checkpoint", self.checkpoint), ("buffer", self.buffer)) if on}
        if self.eval_fp32 and self.precision != "fp32" and "eval" in out:
            out.add("eval-fp32")
        return (out | ({"bf16", "fp16-scaler"} & {self.precision})) & set(FEATURES)

    def __str__(self) -> str:
        parts = [f"{self.model}, {self.optimizer}, {self.steps} steps"]
        parts += [f"scheduler {self.scheduler}"] if self.scheduler != "none" else []
        parts += [f"clip {self.clip}"] if self.clip else []
        parts += [f"accumulate {self.accumulate}"] if self.accumulate > 1 else []
        parts += [self.precision] if self.precision != "fp32" else []
        parts += ["loss.item() logged"] if self.logged else []
        parts += [f"last batch of {RAGGED_BATCH}"] if self.ragged else []
        parts += ["the loss function updates its batch in place"] if self.inplace else []
        parts += ["param groups (decay, no decay, the head at half the lr)"] if self.groups else []
        parts += ["an EMA of the weights"] if self.ema else []
        parts += [f"a forward hook on the head from step {self.hook} to {self.hook + 2}"] if self.hook else []
        parts += ["validation in float32"] if "eval-fp32" in self.features() else []
        parts += ["a layer tied to another's weight"] if self.tied else []
        parts += ["activation checkpointing"] if self.checkpoint else []
        parts += ["a running statistic in a buffer"] if self.buffer else []
        parts += [f"{e} before step {i}" for i, e in self.events]
        return f"Loop(seed {self.seed}: " + "; ".join(parts) + ")"


def generate(chooser: Chooser, *, seed: int = 0, require: str | Iterable[str] = ()) -> Loop:
    """A loop drawn from ``chooser``; ``require`` (`FEATURES` names: at most one scheduler, one of bf16 and
    fp16-scaler, one model) makes sure it has those features."""
    need = {require} if isinstance(require, str) else set(require)
    # NOTE: each pair's second needs its first, which comes a step before it
    need |= {first for second, first in (("unfreeze", "freeze"), ("load", "save"), ("eval-fp32", "eval"))
             if second in need}
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
        # NOTE: drawn last, newest last: an earlier seed's loop keeps what it drew and may gain these
        inplace=chooser.boolean(0.2) or "inplace-batch" in need,
        groups=chooser.boolean(0.3) or "param-groups" in need,
        ema=chooser.boolean(0.2) or "ema" in need,
        hook=chooser.integer(1, steps - 3) if (chooser.boolean(0.2) or "hook" in need) else 0,
        eval_fp32=chooser.boolean(0.4) or "eval-fp32" in need,
        tied=chooser.boolean(0.2) or "tied" in need,
        checkpoint=chooser.boolean(0.2) or "checkpoint" in need,
        buffer=chooser.boolean(0.2) or "buffer" in need,
        steps=steps, events=tuple(sorted(events, key=lambda e: (e[0], EVENTS.index(e[1])))), seed=seed)


def loops() -> Any:
    """A hypothesis strategy of `Loop`s (they shrink towards fewer features)."""
    from hypothesis import strategies as st

    from .choices import HypothesisChooser

    @st.composite
    def draw(draw_fn: Any) -> Loop:
        return generate(HypothesisChooser(draw_fn), seed=draw_fn(st.integers(0, 2**16)))

    return draw()

