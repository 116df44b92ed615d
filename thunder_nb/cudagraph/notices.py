"""The warnings the CUDA-graph runner gives, and how every warning of thunder-nb's is printed: one line to the user."""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["HeldOutputsWarning", "EagerFallbackWarning", "RecaptureWarning", "ViewCopyWarning", "TracedHookWarning",
           "is_own", "one_line", "install_warning_format"]

#: What a thunder-nb warning's line starts with (its messages start with it too; it is shown once).
_PREFIX = "thunder-nb: "


class HeldOutputsWarning(UserWarning):
    """A region ran without a graph: every instance's outputs saved for the backward were still held."""


class EagerFallbackWarning(UserWarning):
    """Regions ran eagerly (no CUDA graph was captured)."""


class RecaptureWarning(UserWarning):
    """A region read too many values of a Python number to capture a graph for each: it runs without a graph."""


class ViewCopyWarning(UserWarning):
    """A region returns a view of an input whose copy has other strides: that output is copied out, not re-viewed."""


class TracedHookWarning(UserWarning):
    """A module hook ran while thunder traced: what it returns is part of the compiled program, what else it does (a
    list appended to, a print) happened that once, on thunder's proxies."""


def is_own(category: Any) -> bool:
    """True for a warning category thunder-nb defines, in any of its modules (`render.DiagramWarning` too)."""
    return isinstance(category, type) and getattr(category, "__module__", "").partition(".")[0] == "thunder_nb"


def one_line(message: Warning | str, category: type[Warning]) -> str:
    """Return ``thunder-nb: EagerFallbackWarning: <message>`` and a newline: who speaks, the category, the message."""
    return f"{_PREFIX}{category.__name__}: {str(message).removeprefix(_PREFIX)}\n"


def install_warning_format() -> None:
    """Show thunder-nb's own warnings as `one_line` wherever they are printed (a script, a notebook, pytest's summary).

    Wraps `warnings.formatwarning` for thunder-nb's categories only: every other warning is formatted by the function
    that was there before. Filters are untouched, so the warnings stay filterable and catchable as any other.
    Idempotent: a second call (a second import, a reload) leaves the one wrapper in place.
    """
    # NOTE: the public hook, not `warnings._formatwarnmsg_impl` (private to CPython). Its one cost to other warnings:
    # Python hands a replaced formatwarning no `source`, so under `-X tracemalloc` a ResourceWarning loses its "Object
    # allocated at" lines, as it does under any library that replaces formatwarning
    before = warnings.formatwarning
    if getattr(before, "thunder_nb", False):
        return

    def formatwarning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      line: str | None = None) -> str:
        # NOTE: a library file, its line number and its line of code say nothing to the user a warning is for
        if is_own(category):
            return one_line(message, category)
        return before(message, category, filename, lineno, line)

    formatwarning.thunder_nb = True  # type: ignore[attr-defined]
    warnings.formatwarning = formatwarning
