"""The results torch gives as named tuples (``x.max(dim=1)``, ``x.topk(k)``, ``x.sort()``, ...) readable by their
fields while thunder traces: one change to ``thunder.core.jit_ext``'s lookasides of those ops (lightning-thunder
0.2.6), installed once per process by `install` where `thunder_nb.internals.supported` (from
`thunder_nb.internals.check_versions`).

thunder 0.2.6 returns them as plain tuples, so ``x.max(dim=1).indices`` (an accuracy's argmax) failed the trace with a
bare ``AttributeError: indices``. `install` makes the interpreter hand the traced code a tuple with the same two
fields as torch's (``values`` and ``indices``; ``min`` and ``max`` for ``aminmax``). It prints as a plain tuple, so
the trace's code is what it was, and a function that returns one returns a plain tuple, as under thunder before.
"""

from __future__ import annotations

import collections
import functools
from typing import Any

from .patches import ProcessPatch

__all__ = ["install", "uninstall", "installed", "named"]

#: thunder's symbol names of the ops torch returns a named tuple from, and the name of torch's type
_KINDS = {"torch_max": "max", "min": "min", "topk": "topk", "sort": "sort", "median": "median", "mode": "mode",
          "kthvalue": "kthvalue", "cummax": "cummax", "cummin": "cummin", "aminmax": "aminmax",
          "nanmedian": "nanmedian"}


def _fields(kind: str) -> tuple[str, str]:
    return ("min", "max") if kind == "aminmax" else ("values", "indices")


@functools.cache
def _result_type(kind: str) -> type:
    """A tuple of two with ``kind``'s fields, made from one iterable as a tuple is (what thunder's interpreter does to
    rebuild it) or from its two items (a named tuple's way), and printed as a plain tuple."""
    base = collections.namedtuple(kind, _fields(kind))  # type: ignore[misc]

    def __new__(cls: type, *items: Any) -> Any:
        return tuple.__new__(cls, items[0] if len(items) == 1 else items)

    # NOTE: thunder's pytree takes tuples of a type from torch.return_types (and namedtuples by their repr's code,
    # which this one does not keep): the module says so
    return type(kind, (base,), {"__slots__": (), "__new__": __new__, "__repr__": tuple.__repr__,
                                "__str__": tuple.__repr__, "__module__": "torch.return_types"})


def named(symbol: Any, result: Any) -> Any:
    """``result`` of thunder's ``symbol`` as `_result_type`, where torch returns a named tuple there."""
    kind = _KINDS.get(getattr(symbol, "name", None))
    if kind is not None and type(result) is tuple and len(result) == 2:
        return _result_type(kind)(result)
    return result


def _naming(original: Any) -> Any:
    """``record_source_loc_in_symbol_header`` (what the interpreter calls a symbol through) naming the results of
    `_KINDS`'s symbols."""
    from thunder.core.symbol import Symbol

    def record(fn: Any) -> Any:
        inner = original(fn)
        if not (isinstance(fn, Symbol) and fn.name in _KINDS):
            return inner

        @functools.wraps(inner)
        def call(*args: Any, **kwargs: Any) -> Any:
            return named(fn, inner(*args, **kwargs))

        return call

    return record


def _apply() -> dict[str, Any] | None:
    from thunder.core import jit_ext
    from thunder.core.symbol import Symbol
    from thunder.torch import _torch_to_thunder_function_map

    original = getattr(jit_ext, "record_source_loc_in_symbol_header", None)
    lookasides = getattr(jit_ext, "_general_jit_lookaside_map", None)
    if not callable(original) or not isinstance(lookasides, dict) or not hasattr(jit_ext, "ensure_recursive_proxies"):
        return None
    record = _naming(original)
    replaced = {}
    for torch_fn, symbol in _torch_to_thunder_function_map.items():
        if isinstance(symbol, Symbol) and symbol.name in _KINDS and torch_fn in lookasides:
            replaced[torch_fn] = lookasides[torch_fn]
            # NOTE: as thunder builds these entries (jit_ext, at import), through the naming record
            lookasides[torch_fn] = jit_ext.ensure_recursive_proxies(jit_ext.interpreter_needs_wrap(record(symbol)))
    jit_ext.record_source_loc_in_symbol_header = record
    return {"record": original, "lookasides": replaced}


def _restore(originals: dict[str, Any]) -> None:
    from thunder.core import jit_ext

    jit_ext.record_source_loc_in_symbol_header = originals["record"]
    jit_ext._general_jit_lookaside_map.update(originals["lookasides"])


#: thunder's lookasides changed as this module's docstring says, once per process
_patch = ProcessPatch(_apply, _restore)
installed, install, uninstall = _patch.installed, _patch.install, _patch.uninstall
