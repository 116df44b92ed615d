"""Run Graphviz's ``dot`` on a built diagram: SVG to embed, or None (and one warning) when ``dot`` is missing."""

from __future__ import annotations

import re
import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import graphviz

__all__ = ["DiagramWarning", "svg", "svg_size"]

_SIZE = re.compile(r'<svg[^>]*?\bwidth="([\d.]+)pt"[^>]*?\bheight="([\d.]+)pt"')
_PX_PER_PT = 4 / 3


class DiagramWarning(UserWarning):
    """A diagram could not be drawn as intended (e.g. Graphviz's ``dot`` is missing)."""


_dot_missing_warned = False


def svg(graph: graphviz.Digraph) -> str | None:
    """Render a diagram to an SVG string with Graphviz's ``dot``.

    Returns:
        The ``<svg>`` element (XML prolog left out, ready to embed), or None when ``dot`` is not on
        PATH; then one `DiagramWarning` per process says how to install it.
    """
    global _dot_missing_warned
    import graphviz  # NOTE: here, not at the top: importing thunder_nb needs no Graphviz package

    try:
        out = graph.pipe(format="svg", encoding="utf-8")
    except graphviz.ExecutableNotFound:
        if not _dot_missing_warned:
            _dot_missing_warned = True
            warnings.warn(
                "Graphviz's `dot` executable was not found on PATH, so diagrams are shown as DOT source "
                "and text. Install it (`apt-get install graphviz`, `brew install graphviz` or "
                "`conda install -c conda-forge graphviz`).",
                DiagramWarning,
                stacklevel=2,
            )
        return None
    start = out.find("<svg")
    return out[start:] if start >= 0 else out


def svg_size(image: str) -> tuple[float, float]:
    """The width and height in CSS pixels that ``dot`` gave an SVG (``(0, 0)`` when it states none)."""
    m = _SIZE.search(image)
    if m is None:
        return 0.0, 0.0
    return float(m.group(1)) * _PX_PER_PT, float(m.group(2)) * _PX_PER_PT
