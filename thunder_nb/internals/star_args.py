"""A call with ``*`` over any iterable traced as Python makes it (``f(*(t for t in ts))``): one change to
``thunder.core.interpreter.wrap_args_from_list`` (lightning-thunder 0.2.6), installed once per process by `install`
where `thunder_nb.internals.supported` (from `thunder_nb.internals.check_versions`).

For ``CALL_FUNCTION_EX`` Python makes a tuple of whatever iterable the call unpacks; thunder's interpreter indexes it
as a list, and a generator failed the trace ("object of type 'generator' has no len()"): PyTorch's parametrizations
call ``self[0](*originals)`` with one (``nn.utils.parametrizations.weight_norm`` and the others, every forward).
`install` makes the tuple first, as Python does, by interpreting ``tuple(iterable)``; a list or tuple goes as before.
"""

from __future__ import annotations

from typing import Any

from .patches import attribute_patch

__all__ = ["install", "uninstall", "installed"]


def _tupling(original: Any) -> Any:
    from thunder.core import interpreter

    def wrap_args_from_list(lst: Any) -> Any:
        if not isinstance(interpreter.unwrap(lst), (list, tuple)):
            lst = interpreter._interpret_call(tuple, lst)
            if lst is interpreter.INTERPRETER_SIGNALS.EXCEPTION_RAISED:
                raise interpreter.get_interpreterruntimectx().curexc
        return original(lst)

    return wrap_args_from_list


def _interpreter() -> Any:
    from thunder.core import interpreter

    return interpreter


#: thunder's interpreter changed as this module's docstring says, once per process
_patch = attribute_patch(_interpreter, "wrap_args_from_list", _tupling,
                         expected=lambda f: getattr(f, "__module__", None) == "thunder.core.interpreter"
                         and hasattr(_interpreter(), "_interpret_call"))
installed, install, uninstall = _patch.installed, _patch.install, _patch.uninstall
