"""PyTorch's attention modules (``nn.MultiheadAttention``, ``nn.TransformerEncoderLayer``,
``nn.TransformerDecoderLayer``, ``nn.Transformer``) traced by thunder as PyTorch's Python writes them: two changes to
the lookasides of thunder's interpreter (``thunder.core.jit_ext``, lightning-thunder 0.2.6), installed once per process
by `install` where `thunder_nb.internals.supported` (from `thunder_nb.internals.check_versions`).

- ``F.multi_head_attention_forward`` is traced through PyTorch's Python (its projections, masks, attention and
  dropout are ops thunder has rules for). thunder 0.2.6 ran it as one opaque call ("automatic registration") that it
  differentiates by calling it again: with ``need_weights=False`` (what the Transformer layers pass) the backward
  failed on a ``None`` among its outputs, and a dropout in it would have been drawn anew for the backward.
- ``torch.backends.mha.get_fastpath_enabled()`` reads False while thunder traces, so that the modules take their
  Python path, which thunder traces, and not their fused inference kernels (``torch._transformer_encoder_layer_fwd``,
  ``torch._native_multi_head_attention``), which thunder 0.2.6 cannot trace: an evaluation under ``torch.no_grad()``
  failed. The two paths compute the same function; eager keeps its fast path.
"""

from __future__ import annotations

from typing import Any

from .patches import ProcessPatch, auto_registered, restore_table, swap_table

__all__ = ["install", "uninstall", "installed"]


def _apply() -> dict[str, Any] | None:
    import torch.backends.mha
    import torch.nn.functional as F
    from thunder.core import jit_ext
    from thunder.torch import _torch_to_thunder_function_map as table

    lookasides = getattr(jit_ext, "_general_jit_lookaside_map", None)
    mha, fastpath = F.multi_head_attention_forward, torch.backends.mha.get_fastpath_enabled
    if (not isinstance(lookasides, dict) or mha not in lookasides or fastpath in lookasides
            or not auto_registered(table.get(mha))):
        return None  # NOTE: not the thunder this was written for: thunder's own stays
    saved = swap_table({mha: None})  # NOTE: no entry: its Python is traced
    lookasides[fastpath] = jit_ext.interpreter_needs_wrap(lambda: False)
    return {"saved": saved}


def _restore(originals: dict[str, Any]) -> None:
    import torch.backends.mha
    from thunder.core import jit_ext

    restore_table(originals["saved"])
    jit_ext._general_jit_lookaside_map.pop(torch.backends.mha.get_fastpath_enabled, None)


#: thunder's lookasides changed as this module's docstring says, once per process
_patch = ProcessPatch(_apply, _restore)
installed, install, uninstall = _patch.installed, _patch.install, _patch.uninstall
