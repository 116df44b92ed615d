"""What the magic shows while it works: one progress line that becomes the verdict, and thunder-nb's warnings
addressed to the magic the user typed."""

from __future__ import annotations

import contextlib
import html
import os
import re
import sys
import warnings
from collections.abc import Iterator

from IPython.display import display

__all__ = ["Progress", "WARNING_ORIGIN", "addressed_warnings", "quiet_proxies"]

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
        self.last: str | None = None  # the last message shown (what the magic was doing)

    def __call__(self, message: str) -> None:
        self.last = message
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


#: A thunder proxy's repr (``FloatProxy name=f17, value=None, static=CONSTRAINT.STATIC``, ``<TensorProxy(name="t0",
#: ...)>``): what a ``print`` in the user's function writes while thunder traces it.
PROXY_REPR = re.compile(r"\b[A-Z]\w*Proxy\b[ (]")


class _ProxyFilter:
    """A text stream that passes every line on to ``stream`` except those holding a thunder proxy's repr."""

    def __init__(self, stream, name: str) -> None:
        self._stream, self._name, self._line, self.hidden = stream, name, "", 0

    def write(self, text: str) -> int:
        self._line += text
        *lines, self._line = self._line.split("\n")
        for line in lines:
            if PROXY_REPR.search(line):
                self.hidden += 1
            else:
                self._stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def close_line(self) -> None:
        if self._line:
            self.write("\n")

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextlib.contextmanager
def quiet_proxies(name: str) -> Iterator[None]:
    """Keep out of the output what the user's function prints while thunder traces it: thunder runs its Python once
    with placeholders (proxies) for values, so a ``print(loss.item())`` writes ``FloatProxy name=f17, value=None``.
    Its eager runs print as they do; one line says how many lines were left out."""
    out = _ProxyFilter(sys.stdout, name)
    saved = sys.stdout
    sys.stdout = out
    try:
        yield
    finally:
        out.close_line()
        sys.stdout = saved
        if out.hidden:
            print(f"thunder-nb: {out.hidden} line{'s' if out.hidden != 1 else ''} that {name} printed while thunder "
                  "traced it left out: thunder runs its Python once, with placeholders for the values (a print in a "
                  "compiled function prints only then; print after the call instead)")
