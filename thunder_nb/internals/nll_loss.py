"""``F.nll_loss`` traced with PyTorch's signature and defaults, and ``F.binary_cross_entropy_with_logits`` with its
``pos_weight``: one change to the tables by which thunder's interpreter maps torch functions to thunder symbols
(lightning-thunder 0.2.6), installed once per process by `install` where `thunder_nb.internals.supported` (from
`thunder_nb.internals.check_versions`).

thunder 0.2.6's ``nll_loss`` symbol has its own signature, ``(a, target, weight, ignore_index=None, reduction)``:
``F.nll_loss(F.log_softmax(x, 1), target)`` (PyTorch's MNIST example's loss) failed with or without a gradient (its
torch executor handed PyTorch ``ignore_index=None``; its backward compared the target with None), a fourth positional
argument went to ``ignore_index`` where PyTorch's is the deprecated ``size_average``, and where it did run without the
argument it ignored the targets -1, not PyTorch's -100. `install` traces ``F.nll_loss`` to a symbol with PyTorch's
signature that calls thunder's with every argument named (``ignore_index=-100`` unless given; the deprecated
``size_average``/``reduce`` read into ``reduction`` as PyTorch reads them).

thunder 0.2.6 runs ``F.binary_cross_entropy_with_logits`` as an opaque call it differentiates by calling it again, which
refuses a ``pos_weight`` or ``weight`` tensor ("keyword argument that requires gradient": an imbalanced multi-label
classifier's loss). `install` builds it from thunder's ops as ATen does: ``(1 - y) x - w_p log sigmoid(x)``, with
``w_p = 1 + (pos_weight - 1) y``, times ``weight``, reduced.
"""

from __future__ import annotations

from typing import Any

from .patches import auto_registered, composite_symbol, table_patch

__all__ = ["install", "uninstall", "installed", "nll_loss", "binary_cross_entropy_with_logits"]


def nll_loss(input: Any, target: Any, weight: Any = None, size_average: Any = None, ignore_index: int = -100,
             reduce: Any = None, reduction: str = "mean") -> Any:
    """``F.nll_loss``: thunder's ``nll_loss`` with every argument named."""
    import thunder.torch as ltorch
    from torch.nn import _reduction

    if size_average is not None or reduce is not None:
        reduction = _reduction.legacy_get_string(size_average, reduce)
    return ltorch.nll_loss(input, target, weight=weight, ignore_index=ignore_index, reduction=reduction)


def binary_cross_entropy_with_logits(input: Any, target: Any, weight: Any = None, size_average: Any = None,
                                     reduce: Any = None, reduction: str = "mean", pos_weight: Any = None) -> Any:
    """``F.binary_cross_entropy_with_logits`` in thunder's ops, as ATen's ``binary_cross_entropy_with_logits``."""
    import thunder.torch as ltorch
    from torch.nn import _reduction

    if size_average is not None or reduce is not None:
        reduction = _reduction.legacy_get_string(size_average, reduce)
    log_sigmoid = ltorch.logsigmoid(input)
    if pos_weight is not None:
        log_sigmoid = log_sigmoid * ((pos_weight - 1) * target + 1)
    loss = (1 - target) * input - log_sigmoid
    if weight is not None:
        loss = loss * weight
    if reduction == "none":
        return loss
    return ltorch.sum(loss) if reduction == "sum" else ltorch.mean(loss)


def _entries() -> dict[Any, Any]:
    import torch.nn.functional as F

    return {F.nll_loss: composite_symbol("nll_loss", nll_loss),
            F.binary_cross_entropy_with_logits: composite_symbol("binary_cross_entropy_with_logits",
                                                                 binary_cross_entropy_with_logits)}


def _thunders(fn: Any, symbol: Any, lookaside: Any) -> bool:
    """thunder 0.2.6's: its own ``nll_loss`` symbol, an opaque call of BCE with logits."""
    import torch.nn.functional as F

    own = getattr(symbol, "id", None) == "torch.nn.functional.nll_loss" if fn is F.nll_loss else auto_registered(symbol)
    return own and lookaside is not None


#: thunder's tables changed as this module's docstring says, once per process
_patch = table_patch(_entries, _thunders)
installed, install, uninstall = _patch.installed, _patch.install, _patch.uninstall
