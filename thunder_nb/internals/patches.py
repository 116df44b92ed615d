"""A change to thunder's own modules, made once per process and undone on demand: `ProcessPatch`, which `tracing` (the
interpreter) and `grads` (the backward) each make one of, and `attribute_patch`, the one that replaces a single
attribute (`losses`, `buffers`, `instance_norm`, `padding`)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["ProcessPatch", "attribute_patch", "composite_symbol", "traced_as"]


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
