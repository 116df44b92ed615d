"""``torch._weight_norm`` (what ``nn.utils.parametrizations.weight_norm`` and ``nn.utils.weight_norm`` compute each
forward) traced by thunder: one change to the tables by which thunder's interpreter maps torch functions to thunder
symbols (lightning-thunder 0.2.6), installed once per process by `install` where `thunder_nb.internals.supported`
(from `thunder_nb.internals.check_versions`).

thunder 0.2.6 has no rule for it ("Trying to call function torch._weight_norm, but it is not yet supported"): a
weight-normalized layer (WaveNet's and HiFi-GAN's convolutions, fairseq's) could not be compiled. `install` builds it
from thunder's ops as ATen's ``_weight_norm`` defines it: ``v * (g / norm(v))``, the 2-norm of ``v`` over every
dimension but ``dim`` (over all of them for ``dim=-1``), which thunder differentiates.
"""

from __future__ import annotations

from typing import Any

from .patches import composite_symbol, table_patch

__all__ = ["install", "uninstall", "installed", "weight_norm"]


def weight_norm(v: Any, g: Any, dim: int = 0) -> Any:
    """``torch._weight_norm(v, g, dim)``: ``v`` scaled to the norm ``g`` along ``dim``."""
    import thunder.torch as ltorch

    if dim == -1:
        return v * (g / ltorch.vector_norm(v))
    dim = dim % v.ndim
    others = [d for d in range(v.ndim) if d != dim]
    return v * (g / ltorch.vector_norm(v, 2, others, keepdim=True)) if others else v * (g / ltorch.abs(v))


def _entries() -> dict[Any, Any]:
    import torch

    return {torch._weight_norm: composite_symbol("weight_norm", weight_norm)}


#: thunder's tables changed as this module's docstring says, once per process (where thunder has no rule of its own)
_patch = table_patch(_entries, lambda fn, symbol, lookaside: symbol is None and lookaside is None)
installed, install, uninstall = _patch.installed, _patch.install, _patch.uninstall
