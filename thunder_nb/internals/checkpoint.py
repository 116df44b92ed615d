"""thunder's activation checkpointing read for what eager PyTorch does differently: one change to thunder's lookaside
for ``torch.utils.checkpoint.checkpoint`` (lightning-thunder 0.2.6), installed once per process by `install` where
`thunder_nb.internals.supported` (from `thunder_nb.internals.check_versions`).

thunder traces a checkpointed function inline and marks what it computes for recomputation in the backward; the
buffers it writes (a BatchNorm's running statistics in training mode) are written once, in the forward. Eager
PyTorch runs the function again in the backward, writes included: a BatchNorm there updates its running statistics
twice a step (pytorch/pytorch#96136, open). The loss, the gradients and the weights are eager's; the running
statistics are those of the model without checkpointing, not eager's. `install` makes the lookaside warn of it
(`CheckpointStatisticsWarning`, naming the user's line).
"""

from __future__ import annotations

import warnings
from typing import Any

from .patches import ProcessPatch

__all__ = ["CheckpointStatisticsWarning", "install", "uninstall", "installed", "statistics_written"]


class CheckpointStatisticsWarning(UserWarning):
    """A BatchNorm in training mode inside ``torch.utils.checkpoint.checkpoint``: thunder updates its running
    statistics once a step, where eager PyTorch updates them again when the backward recomputes it."""


_TEXT = (
    "a BatchNorm in training mode runs inside torch.utils.checkpoint ({where}): eager PyTorch updates its running "
    "statistics a second time when the backward recomputes it (pytorch/pytorch#96136); thunder updates them once a "
    "step, as the model without checkpointing does. The loss, gradients and weights are eager's; the running "
    "statistics differ from eager's. Keep the BatchNorm out of the checkpointed function to have eager's in both.")


def statistics_written(bsyms: Any) -> bool:
    """Whether ``bsyms`` (thunder's bound symbols, their subsymbols too) hold a batch norm in training mode with
    running statistics."""
    stack = list(bsyms)
    while stack:
        bsym = stack.pop()
        if bsym.sym.name == "batch_norm":
            args = list(bsym.args) + [None] * 8
            if args[1] is not None and bsym.kwargs.get("training", args[5]) is True:
                return True
        stack.extend(bsym.subsymbols)
    return False


def _caller() -> str:
    """``file:line`` of the code thunder's interpreter runs now (the call to ``checkpoint``), or ``checkpoint``."""
    from thunder.core.interpreter import get_interpreterruntimectx

    frames = getattr(get_interpreterruntimectx(), "frame_stack", None)
    frame = frames[-1] if frames else None
    positions = getattr(frame, "positions", None)
    return f"{frame.code.co_filename}:{positions.lineno}" if frame is not None and positions else "checkpoint"


def _warning_lookaside(lookaside: Any) -> Any:
    """thunder's lookaside for ``torch.utils.checkpoint.checkpoint``, warning of the statistics it writes once."""
    from thunder.core.jit_ext import get_jit_ctx

    def checkpoint_lookaside(*args: Any, **kwargs: Any) -> Any:
        bsyms = get_jit_ctx().computation_trace.bound_symbols
        before, where = len(bsyms), _caller()
        result = lookaside(*args, **kwargs)
        if statistics_written(bsyms[before:]):  # NOTE: shown once per message, as Python shows a warning
            warnings.warn(_TEXT.format(where=where), CheckpointStatisticsWarning, stacklevel=2)
        return result

    return checkpoint_lookaside


def _apply() -> dict[str, Any] | None:
    import torch.utils.checkpoint
    from thunder.core import jit_ext

    table = getattr(jit_ext, "_general_jit_lookaside_map", None)
    lookaside = table.get(torch.utils.checkpoint.checkpoint) if isinstance(table, dict) else None
    if lookaside is None or not hasattr(jit_ext, "get_jit_ctx"):
        return None
    table[torch.utils.checkpoint.checkpoint] = _warning_lookaside(lookaside)
    return {"lookaside": lookaside}


def _restore(originals: dict[str, Any]) -> None:
    import torch.utils.checkpoint
    from thunder.core import jit_ext

    jit_ext._general_jit_lookaside_map[torch.utils.checkpoint.checkpoint] = originals["lookaside"]


#: thunder's checkpoint lookaside changed as this module's docstring says, once per process
_patch = ProcessPatch(_apply, _restore)
installed, install, uninstall = _patch.installed, _patch.install, _patch.uninstall
