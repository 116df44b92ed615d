"""Run Graphviz's ``dot`` on a built diagram: SVG to embed, or None (and one warning) when ``dot`` is missing; an SVG as
an ``<img>`` that shows where inline SVG is sanitized away."""

from __future__ import annotations

import base64
import re
import warnings
from typing import TYPE_CHECKING

from .common import esc

if TYPE_CHECKING:
    import graphviz

__all__ = ["DiagramWarning", "svg", "svg_size", "svg_img", "svgs_to_imgs"]

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


# NOTE: what an <img> cannot use (tooltips, links, dot's comments) goes, so the data URI stays small
_UNSHOWN = re.compile(r"<!--.*?-->|<title>.*?</title>|\n", re.DOTALL)
_LINK = re.compile(r"<a\b[^>]*>|</a>")
_SVG = re.compile(r"<svg\b.*?</svg>", re.DOTALL)
_CLASS = re.compile(r'<svg\b[^>]*?\bclass="([^"]*)"')


def svg_img(image: str, *, alt: str = "diagram", cls: str = "tnb-img") -> str:
    """Return an SVG as an ``<img>`` whose source is a ``data:`` URI, sized as ``dot`` drew it and never wider than its column.

    Inline ``<svg>`` in an HTML output is removed by every sanitizer that stands between a notebook and its reader
    (JupyterLab and Notebook 7 for an untrusted notebook, GitHub): its text then runs on as loose words. An ``<img>``
    with a ``data:`` source passes JupyterLab's sanitizer, and nbconvert's HTML needs no JavaScript for it. The style is
    inline (a sanitizer drops ``<style>`` elements, not the properties of ``style`` it allows): the image keeps its
    drawn size where the column is wider, and shrinks to the column's width where it is narrower, whole (never cut).
    """
    w, h = svg_size(image)
    if not w:
        m = re.search(r'<svg\b[^>]*?\bwidth="([\d.]+)"[^>]*?\bheight="([\d.]+)"', image)
        w, h = (float(m.group(1)), float(m.group(2))) if m else (0.0, 0.0)
    small = _LINK.sub(lambda m: "</g>" if m.group(0) == "</a>" else "<g>", _UNSHOWN.sub(" ", image))
    if "xmlns=" not in small[:400]:
        small = small.replace("<svg", '<svg xmlns="http://www.w3.org/2000/svg"', 1)
    src = "data:image/svg+xml;base64," + base64.b64encode(small.encode("utf-8")).decode("ascii")
    size = f' width="{w:.0f}" height="{h:.0f}"' if w and h else ""
    return (f'<img class="{esc(cls)}" alt="{esc(alt)}"{size} src="{src}" '
            'style="max-width:100%;height:auto;display:block">')


def svgs_to_imgs(html: str) -> str:
    """Replace every inline ``<svg>`` of an HTML fragment by its `svg_img` (its class kept: ``tnb-lifetime-img`` for a
    lifetime chart), so that the fragment shows its pictures where inline SVG is sanitized away."""

    def one(m: re.Match) -> str:
        image = m.group(0)
        cls = _CLASS.search(image)
        kind = cls.group(1).split()[0] if cls else "tnb-diagram"
        return svg_img(image, alt=kind.removeprefix("tnb-"), cls=f"tnb-img {kind}-img")

    return _SVG.sub(one, html)
