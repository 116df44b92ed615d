"""A jitted function and its modules: thunder's call path on a cache hit (`call_path`), the compilation under way, a
ThunderModule's forward and lookups, a module's own members, tracing without the cyclic collector
(`cyclic_gc_off`)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from .version import supported

__all__ = ["CallPath", "call_path", "default_device", "THUNDER_MODULE_LOOKUPS", "thunder_module_class",
           "own_parameters", "own_buffers", "own_modules", "compiling_now", "thunder_modules_of", "module_forward",
           "set_module_forward", "is_jitted", "jit_transforms", "cyclic_gc_off", "write_through", "hooks_made",
           "module_hook_dicts", "global_hook_dicts", "autocast_stack",
           "under_own_autocast", "is_thunder_module"]


class CallPath(NamedTuple):
    """The private parts of ``thunder.jit``'s call path that a call on a cache hit goes through (thunder 0.2.6's
    ``fn_`` and ``get_computation_and_inputs``), for `thunder_nb.cudagraph.call`."""

    cache_info: Any  # ContextVar: the dict the prologue reads its ``cache_info[...]`` entries from
    compile_data: Any  # ContextVar: (CompileData, CompileStats) while a prologue runs (``get_thunder_module``)
    langctx: Any  # ContextVar: the language context the prologue runs under
    language: Any  # the LanguageContext of ``jfn``'s compile data
    caching: tuple[Any, ...]  # the cache options under which thunder looks entries up by their prologues
    is_tracing: Callable[[], bool]  # inside a thunder trace: thunder calls the function itself there
    connect_to_autograd: Callable[..., None]


def call_path(cd: Any) -> CallPath | None:
    """`CallPath` for a jitted function's compile data ``cd``; None on a thunder thunder-nb does not support
    (`supported`): the caller then leaves every call to thunder's own path."""
    if not supported():
        return None
    import thunder
    import thunder.core.compile_data as compile_data
    import thunder.core.langctxs as langctxs
    from thunder.core.options import CACHE_OPTIONS
    from thunder.core.trace import is_tracing
    from thunder.executors.torch_autograd import connect_to_autograd

    return CallPath(thunder._cache_info_ctx, compile_data._compile_data, langctxs._langctx,
                    langctxs.langctx(cd.langctx).langctx,
                    (CACHE_OPTIONS.CONSTANT_VALUES, CACHE_OPTIONS.SYMBOLIC_VALUES), is_tracing, connect_to_autograd)


_CPU: Any = None


def default_device() -> Any:
    """``torch.get_default_device()``, without its Python walk of the torch-function mode stack (on every call of
    `cudagraph.call.fast_call`) where that stack is empty and no default device was set (``torch.set_default_device``
    and ``with torch.device(...)`` both push a mode): then it is the CPU."""
    import torch

    global _CPU
    if torch._C._len_torch_function_stack() == 0 and getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context",
                                                              None) is None:
        if _CPU is None:
            _CPU = torch.device("cpu")
        return _CPU
    return torch.get_default_device()


#: The dicts a ``thunder.ThunderModule`` reads first in its ``get_submodule``, ``get_parameter`` and ``get_buffer``
#: (thunder 0.2.6: its module cache and its parameter and buffer overrides, filled when it is made), by lookup kind.
THUNDER_MODULE_LOOKUPS = {"submodule": "_module_cache", "parameter": "_overrides_parameters",
                          "buffer": "_overrides_buffers"}


def thunder_module_class() -> type:
    """``thunder.core.module.ThunderModule``."""
    from thunder.core.module import ThunderModule

    return ThunderModule


def is_thunder_module(obj: Any) -> bool:
    """Whether ``obj``'s class is exactly ``thunder.ThunderModule``, or thunder-nb's `write_through` subclass of it,
    which looks its members up as thunder's does (not a user's subclass, which may look them up its own way)."""
    cls = type(obj)
    return cls is thunder_module_class() or cls in _WRITING_THROUGH.values()


def own_parameters(module: Any) -> dict[str, Any]:
    """``module``'s own parameters by name, the live dict (None for one registered as None): ``module._parameters``."""
    return module._parameters


def own_buffers(module: Any) -> dict[str, Any]:
    """``module``'s own buffers by name, the live dict: ``module._buffers``."""
    return module._buffers


def own_modules(module: Any) -> dict[str, Any]:
    """``module``'s direct submodules by name, the live dict: ``module._modules``."""
    return module._modules


#: The dicts of a module's hooks that its ``__call__`` runs around ``forward`` (torch 2.11's ``Module`` attributes),
#: each with whether it runs in the backward; ``_forward_hooks_with_kwargs`` and ``_forward_hooks_always_called`` only
#: mark entries of ``_forward_hooks``.
_HOOK_DICTS = (("_forward_pre_hooks", False), ("_forward_hooks", False), ("_backward_pre_hooks", True),
               ("_backward_hooks", True))
#: The same, for every module: ``torch.nn.modules.module``'s globals (``register_module_forward_hook`` and kin).
_GLOBAL_HOOK_DICTS = (("_global_forward_pre_hooks", False), ("_global_forward_hooks", False),
                      ("_global_backward_pre_hooks", True), ("_global_backward_hooks", True))


_HANDLE: Any = None  # NOTE: torch.utils.hooks.RemovableHandle, once imported (read on every call of a prologue)


def hooks_made() -> int:
    """How many hook handles torch has made in this process (``RemovableHandle.next_id``): every hook registered on a
    module, or globally for all of them, or on a tensor, makes one."""
    global _HANDLE
    if _HANDLE is None:
        from torch.utils.hooks import RemovableHandle

        _HANDLE = RemovableHandle
    return _HANDLE.next_id


def module_hook_dicts(module: Any) -> tuple[tuple[dict, bool], ...]:
    """The live dicts of the hooks ``module.__call__`` runs around its forward, each with whether its hooks run in the
    backward (`_HOOK_DICTS`); none for a `thunder.ThunderModule`, whose own hooks run around thunder's call, outside
    the trace."""
    if isinstance(module, thunder_module_class()):
        return ()
    d = module.__dict__
    return tuple((d[name], backward) for name, backward in _HOOK_DICTS if name in d)


def global_hook_dicts() -> tuple[tuple[dict, bool], ...]:
    """The live dicts of the hooks every module's ``__call__`` runs (`_GLOBAL_HOOK_DICTS`), as `module_hook_dicts`."""
    from torch.nn.modules import module

    return tuple((getattr(module, name), backward) for name, backward in _GLOBAL_HOOK_DICTS)


def autocast_stack(cd: Any) -> Any:
    """The list of autocast states thunder traces under, of a compilation (its compile data ``cd``: thunder 0.2.6's
    ``cd.autocast_stack.stack``, a deque), or None with another thunder (`supported` False).

    thunder pushes the caller's autocast state there at every call made under autocast (``populate_cache_info``) and
    never takes it off: a function first called under autocast was traced again, for a call without it, with
    autocast on, and returned bfloat16 where eager PyTorch returns float32. `under_own_autocast` empties it before
    each call of thunder's path (`thunder_nb.cudagraph.call`) and trace building; the autocast regions of the traced
    code push and pop their own."""
    if not supported():
        return None
    return cd.autocast_stack.stack


def under_own_autocast(fn: Callable[..., Any], cd: Any) -> Callable[..., Any]:
    """``fn`` (a call into thunder for the compilation whose compile data is ``cd``) made with `autocast_stack` emptied
    first, so that what thunder traces there sees this call's autocast state alone; ``fn`` itself with another
    thunder, or where ``fn`` empties that stack already (a module's forward that the fixed transform wrapped, then
    wrapped again by `thunder_nb.cudagraph.call`'s paths)."""
    stale = autocast_stack(cd)
    if stale is None or getattr(fn, "thunder_nb_autocast_stack", None) is stale:
        return fn

    def under_this_calls_autocast(*args: Any, **kwargs: Any) -> Any:
        if stale:
            stale.clear()
        return fn(*args, **kwargs)

    under_this_calls_autocast.thunder_nb_autocast_stack = stale  # type: ignore[attr-defined]
    return under_this_calls_autocast


def compiling_now() -> Any:
    """The compile data of the function thunder is compiling now (its ``transforms``, ``fn``, ``is_module``), or None
    outside a compilation."""
    from thunder.core.compile_data import get_compile_data

    return get_compile_data()


def compiling_with_grad() -> bool:
    """Whether the compilation under way has grad enabled (the call that traces it, ``torch.is_grad_enabled()``);
    True outside a compilation."""
    cd = compiling_now()
    return cd is None or bool(cd.is_grad_enabled)


def thunder_modules_of(cd: Any) -> list[Any]:
    """The modules thunder made for a compilation's function: its ``fn`` and the ThunderModules it maps."""
    return [cd.fn, *getattr(cd, "_thunder_module_map", {}).values()]


_WRITING_THROUGH: dict[type, type] = {}  # NOTE: thunder's ThunderModule class -> its write-through subclass


def _holds(module: Any, name: str) -> bool:
    """Whether the attribute ``name`` is the `thunder.ThunderModule`'s own: thunder's (a private name, one of its
    class, one it set) rather than the user's model's."""
    own = (module.__dict__, module.__dict__.get("_parameters", {}), module.__dict__.get("_buffers", {}),
           module.__dict__.get("_modules", {}))
    return name.startswith("_") or hasattr(type(module), name) or any(name in d for d in own)


def write_through(jfn: Any) -> Any:
    """Make the `thunder.ThunderModule` ``jfn`` set and delete an attribute it does not hold itself (`_holds`) on the
    model it compiled, as torch.compile's module does; return it.

    thunder's ThunderModule reads a missing attribute from its model but sets one on itself: ``compiled.head2 =
    nn.Linear(...)`` registered the head on the wrapper, where neither the traced forward (``hasattr(self, "head2")``)
    nor ``compiled.parameters()`` sees it, and the head an optimizer was given was never trained, with no error; so
    was a flag such as ``compiled.use_cache = False`` never read. With another thunder (`supported` False) the module
    is left as thunder made it."""
    if not supported():
        return jfn
    base = type(jfn)
    if base not in _WRITING_THROUGH:

        def __setattr__(self: Any, name: str, value: Any) -> None:
            if _holds(self, name):
                base.__setattr__(self, name, value)
            else:
                setattr(self._model, name, value)

        def __delattr__(self: Any, name: str) -> None:
            if _holds(self, name):
                base.__delattr__(self, name)
            else:
                delattr(self._model, name)

        _WRITING_THROUGH[base] = type(base.__name__, (base,), {
            "__setattr__": __setattr__, "__delattr__": __delattr__, "__module__": base.__module__,
            "__qualname__": base.__qualname__, "__doc__": base.__doc__})
    jfn.__class__ = _WRITING_THROUGH[base]
    return jfn


def module_forward(jfn: Any) -> Callable[..., Any]:
    """The function a `thunder.ThunderModule` calls as its forward."""
    return jfn._forward_fn


def set_module_forward(jfn: Any, fn: Callable[..., Any]) -> None:
    """Make the `thunder.ThunderModule` ``jfn`` call ``fn`` as its forward."""
    jfn._forward_fn = fn


def is_jitted(fn: Any) -> bool:
    """Whether ``fn`` is what ``thunder.jit`` returned (it carries thunder's compile data)."""
    return hasattr(fn, "_lc_cd")


def jit_transforms(jfn: Any) -> list[Any]:
    """The transforms ``thunder.jit`` was given for ``jfn``, in order."""
    return jfn._lc_transforms


class _CyclicGCOff:
    """The context manager `cyclic_gc_off` returns (one, re-entrant, shared by every thread)."""

    __slots__ = ()
    _lock = threading.Lock()
    _depth = 0  # NOTE: the guards entered and not left, in every thread: the last one out turns the collector back on
    _was_enabled = False

    def __enter__(self) -> None:
        cls = _CyclicGCOff
        with cls._lock:
            if cls._depth == 0:
                cls._was_enabled = gc.isenabled()
                gc.disable()
            cls._depth += 1

    def __exit__(self, *exc: Any) -> None:
        cls = _CyclicGCOff
        with cls._lock:
            cls._depth -= 1
            if cls._depth == 0 and cls._was_enabled:
                gc.enable()


_GC_OFF = _CyclicGCOff()


def cyclic_gc_off() -> _CyclicGCOff:
    """A context manager that keeps Python's cyclic garbage collector off inside it, for thunder's tracing; left as
    it was where it was off already (nested, or off by the user), on again when the last guard is left.

    thunder 0.2.6's interpreter iterates the live dicts the traced code reads (``populate_item_wrappers`` walks
    ``dict.items()``, making wrappers, objects the collector counts, for every entry). Where a weak reference's
    callback deletes from such a dict, a collection that lands inside that walk fails the trace with "dictionary
    changed size during iteration". Once torch.compile has run in the process, dynamo's patched
    ``nn.Module.__init__`` records every module made in an ``ExactWeakKeyDictionary`` whose ``refs`` dict is such a
    dict (each entry's callback deletes it): a module made inside a traced function reads it, and a collection that
    frees an earlier module caught in a reference cycle deletes its entry. Refcounting still frees everything
    else meanwhile; the cycles made while tracing wait for the next collection after it."""
    return _GC_OFF
