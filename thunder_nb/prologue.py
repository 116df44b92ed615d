"""Thunder's prologue with its module lookups made cheap: submodules, parameters and buffers read along their path's dicts.

On every call, thunder's prologue finds each submodule, parameter and buffer of a module the
function uses by its dotted name (``Module.get_submodule``, ``get_parameter``, ``get_buffer``):
two attribute lookups through the Python-level ``Module.__getattr__`` per name in the path, plus
the exceptions ``hasattr`` swallows. On the nanoGPT training step (28 parameters, 32 submodules)
that was 70% of the prologue and a fifth of the whole step's host time (`bench/host_profile.py`).

`fast_module_lookups` rewrites those lookups into calls that read the dicts ``Module.__getattr__``
reads (``_modules``, ``_parameters``, ``_buffers``), one name at a time, with the dotted name split
once, when the prologue is made. The result is the object the method would return: the fast reading
is taken only where it cannot differ, and the method itself runs everywhere else:

- a module whose class overrides attribute lookup or these methods (a `thunder.ThunderModule`,
  wrappers with their own ``__getattr__``) is asked through its own method;
- a name that an instance attribute, a class attribute (a property, a method) or an earlier dict of
  ``Module.__getattr__`` would resolve first is resolved by the method;
- anything missing, ``None`` or of the wrong kind goes to the method, which raises its own error.

A submodule, parameter or buffer replaced between calls is found anew on the next call, as before:
nothing is cached but the names of each class's own attributes (classes are not expected to gain an
attribute named like one of their instances' submodules after the first call).

The prologue's tensor checks (``check_tensor_metadata``: shape, device, dtype, ``requires_grad``)
become `check_tensor`, the same test with the shape compared in one step, where the shape is all
plain ints. A check that fails raises, as thunder's does, and thunder then traces anew.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from thunder.core.prims import OpTags, PrimIDs
from thunder.core.symbol import BoundSymbol, Symbol
from thunder.core.trace import TraceCtx, TraceProvenance, from_trace

__all__ = ["get_submodule", "get_parameter", "get_buffer", "check_tensor", "rewrite_module_lookups", "fast_module_lookups"]

_Module = torch.nn.Module
_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter
_MISSING = object()
#: per class: the names its own attributes and its bases' take (these win over ``Module.__getattr__``), or None
#: where the class looks attributes up its own way (then only its methods give the right answer)
_CLASS_NAMES: dict[type, frozenset[str] | None] = {}
_PLAIN_METHODS = ("__getattr__", "__getattribute__", "get_submodule", "get_parameter", "get_buffer")


def _class_names(cls: type) -> frozenset[str] | None:
    names = _CLASS_NAMES.get(cls, _MISSING)
    if names is _MISSING:
        plain = issubclass(cls, _Module) and all(
            getattr(cls, m) is getattr(_Module, m) for m in _PLAIN_METHODS)
        names = _CLASS_NAMES[cls] = frozenset(n for c in cls.__mro__ for n in vars(c)) if plain else None
    return names


def _walk(root: Any, atoms: Sequence[str]) -> tuple[Any, frozenset[str]] | None:
    """The module at ``atoms`` below ``root`` and its class's names, as ``getattr`` finds it; None where it may differ."""
    known = _CLASS_NAMES.get
    m = root
    names = known(type(m), _MISSING)
    if names is _MISSING:
        names = _class_names(type(m))
    for a in atoms:
        if names is None:
            return None
        d = m.__dict__
        sub = d["_modules"].get(a)
        # NOTE: Module.__getattr__ reads _parameters, then _buffers, then _modules, and only for names that the
        # instance's and the class's attributes do not have
        if sub is None or a in d or a in d["_parameters"] or a in d["_buffers"] or a in names:
            return None
        m = sub
        names = known(type(m), _MISSING)
        if names is _MISSING:
            names = _class_names(type(m))
    if names is None:
        return None
    return m, names


def get_submodule(root: Any, atoms: tuple[str, ...], target: str) -> Any:
    """``root.get_submodule(target)``, where ``atoms`` is ``target`` split at its dots."""
    found = _walk(root, atoms)
    return found[0] if found is not None else root.get_submodule(target)


def get_parameter(root: Any, atoms: tuple[str, ...], name: str, target: str) -> Any:
    """``root.get_parameter(target)``, where ``atoms`` and ``name`` are ``target`` split at its dots."""
    found = _walk(root, atoms)
    if found is not None:
        m, names = found
        d = m.__dict__
        p = d["_parameters"].get(name)
        if p is not None and name not in d and name not in names and isinstance(p, _Parameter):
            return p
    return root.get_parameter(target)


def get_buffer(root: Any, atoms: tuple[str, ...], name: str, target: str) -> Any:
    """``root.get_buffer(target)``, where ``atoms`` and ``name`` are ``target`` split at its dots."""
    found = _walk(root, atoms)
    if found is not None:
        m, names = found
        d = m.__dict__
        b = d["_buffers"].get(name)
        if b is not None and name not in d and name not in names and name not in d["_parameters"]:
            return b
    return root.get_buffer(target)


def check_tensor(t: Any, shape: tuple[int, ...], device: str, dtype: torch.dtype, requires_grad: bool) -> None:
    """thunder's ``check_tensor_metadata`` for a shape of plain ints: the same test, with the shape compared at once."""
    if not (isinstance(t, _Tensor) and t.shape == shape and t.dtype == dtype and t.requires_grad == requires_grad
            and str(t.device) == device):
        raise AssertionError(f"expected tensor with {shape}, {device}, {dtype}, {requires_grad=}, got "
                             f"{tuple(t.shape) if isinstance(t, _Tensor) else type(t).__name__}"
                             + (f", {t.device}, {t.dtype}, {t.requires_grad}" if isinstance(t, _Tensor) else ""))


_SYMBOLS = {
    PrimIDs.UNPACK_SUBMODULE: ("thunder_nb_get_submodule", get_submodule),
    PrimIDs.UNPACK_PARAMETER: ("thunder_nb_get_parameter", get_parameter),
    PrimIDs.UNPACK_BUFFER: ("thunder_nb_get_buffer", get_buffer),
}


def rewrite_module_lookups(bsyms: Sequence[BoundSymbol]) -> tuple[list[BoundSymbol], int]:
    """The prologue's bound symbols with each module lookup by dotted name made a path walk; and how many."""
    out, n = [], 0
    for b in bsyms:
        if b.sym.id == PrimIDs.CHECK_TENSOR_SHAPE_AND_METADATA and len(b.args) == 5 and not b.kwargs and all(
                type(d) is int for d in b.args[1]):  # NOTE: a symbolic size (a NumberProxy) keeps thunder's check
            sym = Symbol("thunder_nb_check_tensor", meta=None, python_impl=check_tensor, id="thunder_nb_check_tensor",
                         tags=[OpTags.DONT_DCE])
            out.append(BoundSymbol(sym, tuple(b.args[:1]) + (tuple(b.args[1]),) + tuple(b.args[2:]), {}, None, [],
                                   header=b.header, _call_ctx={"thunder_nb_check_tensor": check_tensor}))
            n += 1
            continue
        entry = _SYMBOLS.get(b.sym.id)
        if entry is None or len(b.args) != 2 or b.kwargs or not isinstance(b.args[1], str):
            out.append(b)
            continue
        sym_name, fn = entry
        origin, target = b.args
        if b.sym.id == PrimIDs.UNPACK_SUBMODULE:
            if not target:
                out.append(b)  # NOTE: the module itself: nothing to walk
                continue
            args = (origin, tuple(target.split(".")), target)
        else:
            path, _, name = target.rpartition(".")
            args = (origin, tuple(path.split(".")) if path else (), name, target)
        sym = Symbol(sym_name, meta=None, python_impl=fn, id=sym_name)
        out.append(BoundSymbol(sym, args, {}, b.output, [], header=b.header, _call_ctx={sym_name: fn}))
        n += 1
    return out, n


def fast_module_lookups(prologue: TraceCtx) -> TraceCtx:
    """`rewrite_module_lookups` over a prologue trace; the same trace where it has no lookups."""
    bsyms, n = rewrite_module_lookups(prologue.bound_symbols)
    if not n:
        return prologue
    trace = from_trace(prologue)
    trace.bound_symbols = bsyms
    trace.set_provenance(TraceProvenance(f"thunder-nb module lookups along their paths ({n})"))
    return trace
