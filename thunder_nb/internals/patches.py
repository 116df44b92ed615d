"""A change to thunder's own modules, made once per process and undone on demand: `ProcessPatch`, which `tracing` (the
interpreter) and `grads` (the backward) each make one of."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["ProcessPatch"]


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
