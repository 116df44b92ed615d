"""What each optimizer needs to be recorded in a step's graph: its plan, ``capturable=True``, the lr as a device tensor,
and why a change of its hyperparameters records the step again."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .report import Blocker

__all__ = ["TENSOR_LR", "LIVE", "optimizer_plan", "make_capturable", "lr_to_tensor", "without_state", "why_fixed"]

#: Optimizers whose capturable step reads ``lr`` from a device tensor (torch 2.11: Adam's and AdamW's foreach and
#: fused paths): a schedule that changes it on the host needs no new recording.
TENSOR_LR = (torch.optim.Adam, torch.optim.AdamW)

#: The hyperparameters an Adam or AdamW step reads at every step where lr is live: the CPU stand-in runs the
#: optimizer itself, a CUDA graph reads lr from the device tensor the step keeps in each param group. Betas are not
#: among them: torch 2.11's capturable Adam reads tensor betas on the host (``_foreach_lerp_``'s and ``addcmul_``'s
#: Python-number arguments call ``.item()``), which a capture refuses, so the graph holds them as numbers.
LIVE = ("lr",)
#: The hyperparameters a scheduler that cycles momentum changes at every step, which the graph holds as numbers.
_CYCLED = ("momentum", "betas")


def optimizer_plan(optimizer: torch.optim.Optimizer) -> tuple[str, Blocker | None]:
    """(how the step runs the optimizer, in words; what stops it from being captured, or None)."""
    name = type(optimizer).__name__
    if "capturable" in optimizer.defaults:
        lr = "lr from a device tensor" if isinstance(optimizer, TENSOR_LR) else "lr fixed in the graph"
        return f"{name} (capturable=True, {lr})", None
    if isinstance(optimizer, torch.optim.SGD):
        return f"{name} (no step counter; lr fixed in the graph)", None
    return name, Blocker("optimizer", name, None,
                         f"{name} has no capturable step in torch {torch.__version__.split('+')[0]}: use "
                         "torch.optim.AdamW / Adam (capturable) or SGD", trace="optimizer")


def make_capturable(optimizer: torch.optim.Optimizer, device: torch.device, *, tensor_lr: bool) -> list[str]:
    """Set ``capturable=True`` (and the lr tensor) in every param group, and move step counters onto the device; what
    it changed, in words (nothing when all was set)."""
    notes = []
    if "capturable" in optimizer.defaults and not all(g.get("capturable") for g in optimizer.param_groups):
        for g in optimizer.param_groups:
            g["capturable"] = True
        notes.append(f"{type(optimizer).__name__}: capturable=True set in every param group (its step counters live "
                     "on the device)")
    for state in optimizer.state.values():
        step = state.get("step")
        if isinstance(step, torch.Tensor) and step.device != device:
            state["step"] = step.to(device=device, dtype=torch.float32)
    if tensor_lr and not all(isinstance(g["lr"], torch.Tensor) and g["lr"].device == device
                             for g in optimizer.param_groups):
        for g in optimizer.param_groups:
            if not isinstance(g["lr"], torch.Tensor):
                g["lr"] = torch.tensor(float(g["lr"]), dtype=torch.float32, device=device)
            elif g["lr"].device != device:
                g["lr"] = g["lr"].to(device)
        notes.append("lr is a 0-d device tensor in every param group: schedulers and group['lr'] = x change it "
                     "without recording again")
    return notes


def lr_to_tensor(optimizer: torch.optim.Optimizer, lrs: Sequence[torch.Tensor]) -> None:
    """Keep each group's ``lr`` the device tensor the graph reads (``lrs``, one a group): a number set on the host (a
    scheduler's) is written into it."""
    for g, t in zip(optimizer.param_groups, lrs):
        if g["lr"] is not t:
            t.fill_(float(g["lr"]))
            g["lr"] = t


def without_state(optimizer: torch.optim.Optimizer) -> frozenset[int]:
    """The ids of the parameters ``optimizer`` trains that it has no state for (yet)."""
    return frozenset(id(p) for g in optimizer.param_groups for p in g["params"]
                     if p.requires_grad and not optimizer.state.get(p))


def why_fixed(opt: torch.optim.Optimizer, key: str) -> str:
    """Why a change of hyperparameter ``key`` records the step again, and what to do, in words ("" if nothing)."""
    name = type(opt).__name__
    if key == "lr":
        return (f" ({name}'s step reads it as a Python number, fixed in the graph; Adam and AdamW read lr from a "
                "device tensor and need no new recording)")
    if key in _CYCLED:
        return (f" ({name}'s step reads its {key} as Python numbers, fixed in the graph: a scheduler that cycles "
                "momentum (OneCycleLR, CyclicLR) changes it at every step, and every step records again; pass "
                "cycle_momentum=False to the scheduler)")
    return ""
