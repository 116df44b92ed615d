"""A buffer that a module's forward sets again (``self.ema = 0.9 * self.ema + 0.1 * x.mean()``) set as eager PyTorch
sets it: one change to ``thunder.core.module.ThunderModule.set_buffer`` (lightning-thunder 0.2.6), installed once per
process by `install` where `thunder_nb.internals.supported` (from `thunder_nb.internals.check_versions`).

thunder records the assignment while it traces, and the epilogue of every call hands the new value to the
ThunderModule's ``set_buffer(name, value)``, which keeps it in the ThunderModule's own overrides. In 0.2.6:

- a buffer of the jitted module itself is named with a leading dot (``".ema"``: the root's empty name joined to the
  buffer's), an entry nothing reads: every call read the first value again, and the losses were off from the second
  step on, silently (``thunder.jit(model)``, ``thunder_nb.jit(model)``);
- the value is thunder's output, which requires grad (it carries thunder's autograd node) where eager's, computed
  from a buffer, does not: a submodule's buffer then failed the next call's prologue (``requires_grad=False``
  expected);
- the user's own module never gets the value: ``model.ema`` and ``model.state_dict()`` kept the first one.

`install` makes ``set_buffer`` drop the dot and keep the value, detached, where the ThunderModule reads it and on the
user's module, as eager's assignment does (``module._buffers[name] = value``).
"""

from __future__ import annotations

from typing import Any

from .patches import attribute_patch

__all__ = ["install", "uninstall", "installed", "set_buffer"]


def set_buffer(module: Any, name: str, value: Any) -> None:
    """``module`` (a ThunderModule) sets its buffer ``name`` (``"ema"``, ``"block.ema"``; thunder 0.2.6's ``".ema"``
    for its own) to ``value``, on itself and on the module it wraps, detached."""
    import torch

    name = name.lstrip(".")
    if isinstance(value, torch.Tensor):
        value = value.detach()
    module._overrides_buffers[name] = value
    owner, _, attr = name.rpartition(".")
    module._model.get_submodule(owner)._buffers[attr] = value


def _thunder_module() -> Any:
    from thunder.core.module import ThunderModule

    return ThunderModule


#: thunder's ThunderModule.set_buffer changed as this module's docstring says, once per process
_patch = attribute_patch(_thunder_module, "set_buffer", lambda _: set_buffer)
installed, install, uninstall = _patch.installed, _patch.install, _patch.uninstall
