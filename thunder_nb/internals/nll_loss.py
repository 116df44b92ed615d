"""``F.nll_loss`` traced with PyTorch's signature and defaults: one change to the tables by which thunder's interpreter
maps torch functions to thunder symbols (lightning-thunder 0.2.6), installed once per process by `install` where
`thunder_nb.internals.supported` (from `thunder_nb.internals.check_versions`).

thunder 0.2.6's ``nll_loss`` symbol has its own signature, ``(a, target, weight, ignore_index=None, reduction)``:
``F.nll_loss(F.log_softmax(x, 1), target)`` (PyTorch's MNIST example's loss) failed with or without a gradient (its
torch executor handed PyTorch ``ignore_index=None``; its backward compared the target with None), a fourth positional
argument went to ``ignore_index`` where PyTorch's is the deprecated ``size_average``, and where it did run without the
argument it ignored the targets -1, not PyTorch's -100. `install` traces ``F.nll_loss`` to a symbol with PyTorch's
signature that calls thunder's with every argument named (``ignore_index=-100`` unless given; the deprecated
``size_average``/``reduce`` read into ``reduction`` as PyTorch reads them).
"""

from __future__ import annotations

from typing import Any

from .patches import ProcessPatch, composite_symbol, traced_as

__all__ = ["install", "uninstall", "installed", "nll_loss"]


def nll_loss(input: Any, target: Any, weight: Any = None, size_average: Any = None, ignore_index: int = -100,
             reduce: Any = None, reduction: str = "mean") -> Any:
    """``F.nll_loss``: thunder's ``nll_loss`` with every argument named."""
    import thunder.torch as ltorch
    from torch.nn import _reduction

    if size_average is not None or reduce is not None:
        reduction = _reduction.legacy_get_string(size_average, reduce)
    return ltorch.nll_loss(input, target, weight=weight, ignore_index=ignore_index, reduction=reduction)


def _apply() -> dict[str, Any] | None:
    import torch.nn.functional as F
    from thunder.core import jit_ext
    from thunder.torch import _torch_to_thunder_function_map as table

    lookasides = getattr(jit_ext, "_general_jit_lookaside_map", None)
    symbol = table.get(F.nll_loss)
    if (not isinstance(lookasides, dict) or F.nll_loss not in lookasides or getattr(symbol, "id", None)
            != "torch.nn.functional.nll_loss"):
        return None  # NOTE: not the thunder this was written for: thunder's own stays
    saved = {"symbol": symbol, "lookaside": lookasides[F.nll_loss]}
    ours = composite_symbol("nll_loss", nll_loss)
    table[F.nll_loss], lookasides[F.nll_loss] = ours, traced_as(ours)
    return saved


def _restore(originals: dict[str, Any]) -> None:
    import torch.nn.functional as F
    from thunder.core import jit_ext
    from thunder.torch import _torch_to_thunder_function_map as table

    table[F.nll_loss], jit_ext._general_jit_lookaside_map[F.nll_loss] = originals["symbol"], originals["lookaside"]


#: thunder's tables changed as this module's docstring says, once per process
_patch = ProcessPatch(_apply, _restore)
installed, install, uninstall = _patch.installed, _patch.install, _patch.uninstall
