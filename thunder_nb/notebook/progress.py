"""What the magic shows while it works: one progress line that becomes the verdict, and thunder-nb's warnings
addressed to the magic the user typed."""

from __future__ import annotations

import contextlib
import html
import os
import warnings
from collections.abc import Iterator

from IPython.display import display

__all__ = ["Progress", "WARNING_ORIGIN", "addressed_warnings"]

#: Where a warning of thunder-nb's own code is shown as coming from: the magic the user typed, not a line of
#: thunder-nb (Python would print that file's path and the line of code under it).
WARNING_ORIGIN = "%%thunder_cudagraph"

#: thunder-nb's own files: a warning raised in one of them is addressed to the magic.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


@contextlib.contextmanager
def addressed_warnings() -> Iterator[None]:
    """Show each warning thunder-nb's own code raises while the magic runs as one line addressed to the user.

    thunder-nb's own categories are printed so everywhere (`thunder_nb.cudagraph.notices.install_warning_format`);
    here any other category raised in its files (a plain ``UserWarning``) is addressed to the magic too.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        yield
    for w in caught:
        if os.path.abspath(w.filename).startswith(_PACKAGE):
            warnings.warn_explicit(w.message, w.category, WARNING_ORIGIN, 1, module="thunder_nb")
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)


class Progress:
    """One output line that says what is going on, then becomes the verdict."""

    def __init__(self) -> None:
        self._handle = None

    def __call__(self, message: str) -> None:
        bundle = {"text/plain": f"thunder-nb: {message}", "text/html": f"<i>thunder-nb: {html.escape(message)}</i>"}
        if self._handle is None:
            self._handle = display(bundle, raw=True, display_id=True)
        else:
            self._handle.update(bundle, raw=True)

    def done(self, bundle: dict[str, str]) -> None:
        """Replace the progress line with ``bundle`` (or show it, when there was no progress)."""
        if self._handle is None:
            display(bundle, raw=True)
        else:
            self._handle.update(bundle, raw=True)

    def clear(self) -> None:
        """Blank the progress line (the error message says what happened)."""
        if self._handle is not None:
            self._handle.update({"text/plain": ""}, raw=True)
