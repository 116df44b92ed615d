"""A change to thunder's own modules, made once per process and undone on demand: `ProcessPatch`, which `tracing` (the
interpreter) and `grads` (the backward) each make one of; `attribute_patch`, the one that replaces a single attribute
(`losses`, `buffers`, `instance_norm`, `padding`, `interpolate`, `star_args`, `python_random`); and `table_patch`, the
one that traces torch functions to other thunder symbols (`nll_loss`, `pooling`, `weight_norm`; `swap_table` for
`random_ops`, `attention`, `tensor_api`), with the symbols `composite_symbol` makes."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["ProcessPatch", "attribute_patch", "composite_symbol", "traced_as", "auto_registered", "put", "swap_table",
           "restore_table", "table_patch"]


class ProcessPatch:
    """``apply()`` changes thunder's modules and returns what it replaced (None where thunder is not the one it was
    written for: nothing changed); ``restore(originals)`` puts those back. `install` applies it once per process,
    under a lock (two threads' first entry points at once apply it once); `uninstall` restores it (for the tests that
    compare the two)."""

    def __init__(self, apply: Callable[[], dict[str, Any] | None], restore: Callable[[dict[str, Any]], None]):
        self._apply, self._restore = apply, restore
        self._originals: dict[str, Any] = {}
        self._lock = threading.Lock()

    def installed(self) -> bool:
        """Whether `install` has changed thunder in this process."""
        return bool(self._originals)

    def install(self) -> bool:
        """Apply the change once per process; whether it is applied. Call it only where
        `thunder_nb.internals.supported` (the names changed are thunder 0.2.6's): `thunder_nb.internals.check_versions`
        does."""
        if self._originals:
            return True
        with self._lock:
            if self._originals:
                return True
            originals = self._apply()
            if not originals:
                return False  # NOTE: not the thunder this was written for: thunder's own stays
            self._originals.update(originals)
        return True

    def uninstall(self) -> None:
        """Put thunder's own parts back."""
        with self._lock:
            if self._originals:
                self._restore(self._originals)
                self._originals.clear()


def attribute_patch(owner: Callable[[], Any], name: str, replacement: Callable[[Any], Any], *,
                    expected: Callable[[Any], bool] = callable) -> ProcessPatch:
    """A `ProcessPatch` that sets ``owner()``'s attribute ``name`` (a module's function, a class's method, a thunder
    symbol's ``meta``) to ``replacement(original)`` where ``expected(original)`` says thunder is the one it was written
    for, and puts the original back. A frozen dataclass's field (thunder's ``Symbol``) is set as its own
    ``__init__`` sets it."""

    def put(target: Any, value: Any) -> None:
        frozen = dataclasses.is_dataclass(target) and not isinstance(target, type)
        (object.__setattr__ if frozen else setattr)(target, name, value)

    def apply() -> dict[str, Any] | None:
        target = owner()
        original = getattr(target, name, None)
        if not expected(original):
            return None
        put(target, replacement(original))
        return {name: original}

    def restore(originals: dict[str, Any]) -> None:
        put(owner(), originals[name])

    return ProcessPatch(apply, restore)


def composite_symbol(name: str, fn: Callable[..., Any], *, in_place: bool = False) -> Any:
    """A thunder symbol named ``thunder_nb.<name>`` that traces to ``fn``'s thunder ops, as ``thunder.torch``'s own
    composite symbols do (tagged as writing its first argument where ``in_place``, as thunder's ``exponential_``)."""
    from thunder.core.langctxs import Languages, langctx
    from thunder.core.prims import OpTags
    from thunder.core.symbol import Symbol

    return Symbol(name=name, meta=langctx(Languages.TORCH)(fn), id=f"thunder_nb.{name}", is_prim=False,
                  tags=(OpTags.IN_PLACE,) if in_place else None)


def traced_as(symbol: Any) -> Any:
    """The lookaside by which thunder's interpreter calls ``symbol`` for a torch function, built as thunder builds the
    ones of its own table at import (``thunder.core.jit_ext``)."""
    from thunder.core import jit_ext

    return jit_ext.ensure_recursive_proxies(
        jit_ext.interpreter_needs_wrap(jit_ext.record_source_loc_in_symbol_header(symbol)))


def auto_registered(symbol: Any) -> bool:
    """Whether ``symbol`` is one of thunder's opaque calls of a torch function ("automatic registration",
    ``thunder.torch.register_default_torch_op``), which thunder differentiates by calling it again."""
    from thunder.core.prims import OpTags

    return OpTags.AUTO_REGISTERED in (getattr(symbol, "tags", None) or ())


def put(mapping: dict[Any, Any], key: Any, value: Any) -> None:
    """``mapping[key] = value``, or no entry where ``value`` is None (there was none)."""
    if value is None:
        mapping.pop(key, None)
    else:
        mapping[key] = value


def swap_table(entries: dict[Any, Any]) -> dict[Any, tuple[Any, Any]]:
    """Each torch function of ``entries`` traced to its thunder symbol, in thunder's table of torch functions and its
    interpreter's lookasides (None: no entry, and the interpreter runs the function's own Python); {function: (the
    symbol, the lookaside) that were there, None where none}, for `restore_table`."""
    from thunder.core import jit_ext
    from thunder.torch import _torch_to_thunder_function_map as table

    lookasides = jit_ext._general_jit_lookaside_map
    saved = {fn: (table.get(fn), lookasides.get(fn)) for fn in entries}
    for fn, symbol in entries.items():
        put(table, fn, symbol)
        put(lookasides, fn, None if symbol is None else traced_as(symbol))
    return saved


def restore_table(saved: dict[Any, tuple[Any, Any]]) -> None:
    """Put back what `swap_table` replaced."""
    from thunder.core import jit_ext
    from thunder.torch import _torch_to_thunder_function_map as table

    for fn, (symbol, lookaside) in saved.items():
        put(table, fn, symbol)
        put(jit_ext._general_jit_lookaside_map, fn, lookaside)


def table_patch(entries: Callable[[], dict[Any, Any]], expected: Callable[[Any, Any, Any], bool]) -> ProcessPatch:
    """A `ProcessPatch` that makes `swap_table` of ``entries()`` where ``expected(function, thunder's symbol,
    thunder's lookaside)`` holds for each (thunder is the one it was written for), and restores it."""

    def apply() -> dict[str, Any] | None:
        from thunder.core import jit_ext
        from thunder.torch import _torch_to_thunder_function_map as table

        lookasides = getattr(jit_ext, "_general_jit_lookaside_map", None)
        if not isinstance(lookasides, dict) or not hasattr(jit_ext, "ensure_recursive_proxies"):
            return None
        wanted = entries()
        if not all(expected(fn, table.get(fn), lookasides.get(fn)) for fn in wanted):
            return None
        return {"table": swap_table(wanted)}

    return ProcessPatch(apply, lambda originals: restore_table(originals["table"]))
