"""What the module walk (`module_walk`) reads and keeps of a module: its members along a path, read from the dicts
``Module.__getattr__`` reads, and where that reading could differ from the methods'.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from .. import internals
from .notices import TracedHookWarning

_Module = torch.nn.Module
_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter
MISSING = object()
_GETATTR = _Module.__getattr__
GETATTRIBUTE = _Module.__getattribute__
METHODS = {name: getattr(_Module, name) for name in ("get_submodule", "get_parameter", "get_buffer")}
HEAPTYPE = 1 << 9  # NOTE: Py_TPFLAGS_HEAPTYPE: a class made by a class statement (its attributes can be set)
NONE: dict[str, Any] = {}  # NOTE: read only: what a module without a ``_parameters`` or ``_buffers`` dict has


def _plain(m: Any) -> bool:
    """Whether ``m``'s class looks attributes up as ``nn.Module`` does."""
    cls = type(m)
    return getattr(cls, "__getattr__", None) is _GETATTR and cls.__getattribute__ is GETATTRIBUTE


def plain_root(root: Any) -> Any:
    """``root`` where its lookups may be read along their paths; None where only its own methods may answer."""
    if not _plain(root):
        return None
    cls, d = type(root), root.__dict__
    for name, method in METHODS.items():
        if getattr(cls, name, None) is not method or name in d:
            return None
    return root


def child(m: Any, a: str) -> Any:
    """``getattr(m, a)`` for plain ``m`` where it is the plain submodule ``m._modules[a]``; None where it may differ (or ``m`` is None)."""
    if m is None:
        return None
    d = m.__dict__
    modules = d.get("_modules")
    sub = modules.get(a) if modules is not None else None
    # NOTE: Module.__getattr__ reads _parameters, then _buffers, then _modules, and only for names that the
    # instance's and the class's attributes do not have
    if sub is None or a in d or a in d.get("_parameters", NONE) or a in d.get("_buffers", NONE) or getattr(
            type(m), a, MISSING) is not MISSING:
        return None
    cls = type(sub)  # NOTE: `_plain(sub)`, inlined: this runs once per module on the paths, every call
    if getattr(cls, "__getattr__", None) is not _GETATTR or cls.__getattribute__ is not GETATTRIBUTE:
        return None
    return sub


def _read_parameter(m: Any, name: str) -> Any:
    """``m``'s parameter ``name`` where ``getattr(m, name)`` is plainly ``m._parameters[name]``; None where it may
    differ."""
    d = m.__dict__
    p = d.get("_parameters", NONE).get(name)
    if p is not None and name not in d and getattr(type(m), name, MISSING) is MISSING and isinstance(p, _Parameter):
        return p
    return None


def _read_buffer(m: Any, name: str) -> Any:
    """``m``'s buffer ``name`` where ``getattr(m, name)`` is plainly ``m._buffers[name]``; None where it may differ."""
    d = m.__dict__
    b = d.get("_buffers", NONE).get(name)
    if (b is not None and name not in d and name not in d.get("_parameters", NONE)
            and getattr(type(m), name, MISSING) is MISSING):
        return b
    return None


class StructureChanged(AssertionError):
    """A module the trace reached has other members than when it was traced (a submodule, parameter, buffer or
    instance attribute added or removed, or another class): the prologue fails, as a failing check of thunder's does,
    and thunder traces the function again."""


class HookState:
    """The module hooks a trace ran (or a recorded step): torch's count of hook handles made (`internals.hooks_made`),
    and each hook dict of ``modules()`` and of the global ones that holds any (`internals.module_hook_dicts`), with
    its keys and whether its hooks run in the backward. thunder's cache does not check hooks: a hook registered after a
    trace never ran, one removed kept running, with no error. `changed` is one comparison of that count and of those
    few dicts where nothing changed."""

    __slots__ = ("made", "held", "modules")

    def __init__(self, modules: Callable[[], Any]) -> None:
        self.modules = modules
        self.made = internals.hooks_made()
        self.held = self._held()

    def _held(self) -> tuple[tuple[dict, tuple, bool], ...]:
        dicts = [d for m in self.modules() for d in internals.module_hook_dicts(m)]
        return tuple((d, tuple(d), backward) for d, backward in (*dicts, *internals.global_hook_dicts()) if d)

    def changed(self) -> str | None:
        """What changed since, in words (a hook removed, or one registered on a module), or None."""
        made = internals.hooks_made()
        if made == self.made:
            for d, keys, _ in self.held:
                if len(d) != len(keys) or tuple(d) != keys:
                    return "a module hook was removed"
            return None
        held = self._held()
        if [(id(d), k) for d, k, _ in held] != [(id(d), k) for d, k, _ in self.held]:
            return "a module hook was registered (or removed)"
        self.made = made  # NOTE: a handle made elsewhere (a tensor's hook): the same hooks
        return None

    def names(self, backward: bool) -> list[str]:
        """The hooks held that run in the forward (or, ``backward``, in the backward), by name."""
        return sorted({getattr(h, "__qualname__", type(h).__name__) for d, _, b in self.held if b == backward
                       for h in d.values()})


class HookCheck:
    """`HookState` of a prologue's origin, made at its first call (the trace's own, on the objects it traced) and
    compared at every later one (`ModuleWalk`): where it changed it raises `StructureChanged`, and thunder traces anew
    with the hooks there are. At that first call it warns of the hooks the trace met (`TracedHookWarning`)."""

    __slots__ = ("_state",)

    def __init__(self) -> None:
        self._state: HookState | None = None

    def __call__(self, origin: Any) -> None:
        state = self._state
        if state is not None:
            change = state.changed()
            if change is not None:
                raise StructureChanged(f"since the function was traced, {change} ({type(origin).__name__}): thunder "
                                       "traces it again")
            return
        self._state = state = HookState(origin.modules if isinstance(origin, _Module) else tuple)
        forward, backward = state.names(False), state.names(True)
        if forward:
            warnings.warn(f"thunder traced {len(forward)} module hook(s) ({', '.join(forward)}): what a hook "
                          "returns is part of the compiled program, but what else it does (appending to a list, "
                          "printing, counting calls) happened once, while tracing, on thunder's proxies, and does not "
                          "happen on later calls; read such values outside the compiled function", TracedHookWarning,
                          stacklevel=2)
        if backward:
            warnings.warn(f"thunder runs no module backward hook ({', '.join(backward)}): the gradients are "
                          "computed as if it were not registered, and it is never called; run that module outside the "
                          "compiled function, or change the gradient after backward()", TracedHookWarning,
                          stacklevel=2)


_MEMBERS = ("_modules", "_parameters", "_buffers")
_KINDS_OF = {"_modules": "submodule", "_parameters": "parameter", "_buffers": "buffer"}
_INSTANCE_DICT = object.__getattribute__  # NOTE: ``__dict__`` as ``Module`` reads it, past a class's own lookup


def module_members(m: Any) -> tuple:
    """What a trace of code using ``m`` may have branched on besides the values thunder checks: ``m``'s class, the
    names of its submodules, parameters and buffers (in order: a ``Sequential`` runs its submodules in that order), and
    the names in its instance dict (``hasattr`` finds a name there first)."""
    d = _INSTANCE_DICT(m, "__dict__")
    return (type(m), *(tuple(d.get(which, NONE)) for which in _MEMBERS), frozenset(d))


def same_members(m: Any, members: tuple) -> bool:
    """Whether ``m`` has ``members`` (`module_members`), compared without building them."""
    d = _INSTANCE_DICT(m, "__dict__")
    cls, modules, parameters, buffers, names = members
    return (type(m) is cls and d.keys() == names and tuple(d.get("_modules", NONE)) == modules
            and tuple(d.get("_parameters", NONE)) == parameters and tuple(d.get("_buffers", NONE)) == buffers)


def members_change(m: Any, path: str, members: tuple) -> str:
    """What differs between ``m``'s members and ``members`` (`module_members`), in words."""
    now = module_members(m)
    where = f"{type(m).__name__}" + (f" (at {path})" if path else "")
    if now[0] is not members[0]:
        return f"the module at {path or 'the origin'} is now a {type(m).__name__} (was a {members[0].__name__})"
    for which, was, is_ in zip(_MEMBERS, members[1:4], now[1:4]):
        kind = _KINDS_OF[which]
        added = [n for n in is_ if n not in was]
        if added:
            return f"{where} has a new {kind} {added[0]}"
        gone = [n for n in was if n not in is_]
        if gone:
            return f"{kind} {gone[0]} of {where} was removed"
        if was != is_:
            return f"{where}'s {kind}s are in another order"
    added = sorted(now[4] - members[4])
    if added:
        return f"{where} has a new instance attribute {added[0]}"
    return f"instance attribute {sorted(members[4] - now[4])[0]} of {where} was removed"


#: The names every ``Module`` has in its instance dict once ``Module.__init__`` ran (its hooks' dicts, ``training``,
#: ``_parameters``, ...): left out of a guard's names (`guard_members`), which still counts them.
_MODULE_NAMES = frozenset(vars(_Module()))


def guard_members(node: Any, m: Any) -> None:
    """Add to a guard (``node``: ``m``'s node) that ``m``'s members are still `module_members` (its class is guarded
    elsewhere): its instance dict holds as many names, among them each of its own (those not `_MODULE_NAMES`: a
    ``Module``'s own bookkeeping is deleted by nobody, and each name costs a check on every call), and its
    ``_modules``, ``_parameters`` and ``_buffers`` dicts have not been written to (their version tags: a name added,
    removed or moved, or an entry replaced, which the walk then reads anew)."""
    d = _INSTANCE_DICT(m, "__dict__")
    dict_node = node.instance_dict(d)
    internals.guard_dict_keys(dict_node, d, [name for name in d if name not in _MODULE_NAMES])
    for which in _MEMBERS:
        if which in d:
            dict_node.item(which, d[which]).unchanged(d[which])
        else:
            dict_node.lacks(which)


SUBMODULE, PARAMETER, BUFFER = "submodule", "parameter", "buffer"
READS = {PARAMETER: _read_parameter, BUFFER: _read_buffer}
METHOD_OF = {SUBMODULE: "get_submodule", PARAMETER: "get_parameter", BUFFER: "get_buffer"}
