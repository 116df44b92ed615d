"""A traced tensor's ``.dtype`` read as torch's own ``torch.dtype``: one change to
the lookaside of ``getattr`` in thunder's interpreter (``thunder.core.jit_ext``, lightning-thunder 0.2.6), installed
once per process by `install` where `thunder_nb.internals.supported` (from `thunder_nb.internals.check_versions`).

thunder 0.2.6 hands the code it traces its own ``thunder.dtypes.float32``, which equals no ``torch.dtype``
(Lightning-AI/lightning-thunder#2306): ``x.dtype == torch.float32`` was False, ``x.dtype != torch.float32`` True, and
``x.dtype in (torch.float16, torch.bfloat16)``, ``x.dtype is torch.long`` and ``{torch.float32: ...}[x.dtype]``
all missed, so a model's ``if`` on a dtype took the other branch, silently (T5's layer norm casts back to half
precision only ``if self.weight.dtype in [torch.float16, torch.bfloat16]``), and ``x.dtype.is_floating_point`` and
``x.dtype.itemsize`` failed. `install` makes a tensor's ``dtype``, read by the traced code, torch's own object, which
thunder's ops take as they take thunder's; thunder's own code, which reads its proxies outside the interpreter, is
unchanged. (A tensor's ``device`` stays thunder's: ``torch.device(...)`` in traced code makes thunder's too, and the
two compare equal.)
"""

from __future__ import annotations

from typing import Any

from .patches import ProcessPatch

__all__ = ["install", "uninstall", "installed"]


def _reading_torch_types(original: Any) -> Any:
    """thunder's ``getattr`` lookaside whose ``dtype`` of a tensor proxy is torch's."""
    from thunder.core import dtypes
    from thunder.core.interpreter import WrappedValue, unwrap, wrap
    from thunder.core.proxies import TensorProxy

    def getattr_lookaside(obj: Any, name: Any, *maybe_default: Any) -> Any:
        value = original(obj, name, *maybe_default)
        if (isinstance(value, WrappedValue) and isinstance(value.value, dtypes.dtype) and unwrap(name) == "dtype"
                and isinstance(unwrap(obj), TensorProxy)):  # NOTE: the same provenance: the same tensor's attribute
            return wrap(dtypes.to_torch_dtype(value.value), provenance=value.provenance)
        return value

    return getattr_lookaside


def _apply() -> dict[str, Any] | None:
    from thunder.core import jit_ext

    table = getattr(jit_ext, "_general_jit_lookaside_map", None)
    original = table.get(getattr) if isinstance(table, dict) else None
    if getattr(original, "__name__", None) != "_general_jit_getattr_lookaside":
        return None  # NOTE: not the thunder this was written for: thunder's own stays
    table[getattr] = _reading_torch_types(original)
    return {"lookaside": original}


def _restore(originals: dict[str, Any]) -> None:
    from thunder.core import jit_ext

    jit_ext._general_jit_lookaside_map[getattr] = originals["lookaside"]


#: thunder's getattr lookaside changed as this module's docstring says, once per process
_patch = ProcessPatch(_apply, _restore)
installed, install, uninstall = _patch.installed, _patch.install, _patch.uninstall
