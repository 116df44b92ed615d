"""``F.embedding``'s ``padding_idx`` counted from the end where it is negative, as PyTorch counts it: one change to the
tables by which thunder's interpreter maps torch functions to thunder symbols (lightning-thunder 0.2.6), installed once
per process by `install` where `thunder_nb.internals.supported` (from `thunder_nb.internals.check_versions`).

thunder 0.2.6 takes ``padding_idx=-1`` as its mark for "no padding row": ``F.embedding(ids, w, padding_idx=-1)`` (the
last row pads, as ``F.embedding`` reads it) trained that row on its gradient, silently, where eager's gradient there is
zero. ``nn.Embedding`` counts a negative index from the end itself, in its constructor; a direct call does not.
`install` traces ``F.embedding`` to a symbol that counts it from the end and calls thunder's own embedding with it
(whose gradient rule reads the index it is called with).
"""

from __future__ import annotations

from typing import Any

from .patches import composite_symbol, table_patch

__all__ = ["install", "uninstall", "installed", "embedding"]


def embedding(a: Any, weight: Any, padding_idx: Any = None, max_norm: Any = None, norm_type: float = 2.0,
              scale_grad_by_freq: bool = False, sparse: bool = False) -> Any:
    """``F.embedding``: thunder's, with a negative ``padding_idx`` counted from the end of ``weight``'s rows."""
    import thunder.torch as ltorch

    if padding_idx is not None and padding_idx < 0:
        padding_idx += weight.shape[0]
    return ltorch.embedding(a, weight, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse)


def _entries() -> dict[Any, Any]:
    import torch.nn.functional as F

    return {F.embedding: composite_symbol("embedding", embedding)}


def _thunders(fn: Any, symbol: Any, lookaside: Any) -> bool:
    import thunder.torch as ltorch

    return symbol is ltorch.embedding


#: thunder's tables changed as this module's docstring says, once per process
_patch = table_patch(_entries, _thunders)
installed, install, uninstall = _patch.installed, _patch.install, _patch.uninstall
