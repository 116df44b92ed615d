"""Run Graphviz's ``dot`` on a built diagram: SVG to embed, or None (and one warning) when ``dot`` is missing, or
`DrawingTooSlow` when its layout takes longer than `DOT_SECONDS`; an SVG as an ``<img>`` that shows where inline SVG
is sanitized away."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
import warnings
from typing import TYPE_CHECKING

from .common import esc

if TYPE_CHECKING:
    import graphviz

__all__ = ["DOT_SECONDS", "DiagramWarning", "DrawingTooSlow", "svg", "svg_size", "svg_img", "svgs_to_imgs"]

#: Seconds ``dot`` may take to lay out one drawing. Its positioning grows much faster than the graph (a 1-layer
#: nanoGPT's full forward, 330 nodes: 2 s on a 2-core CPU; the same drawing laid out for a narrow column: 6 s; a
#: 6-layer model's drawings on an H100's host: minutes for one cell), so a drawing that takes longer is stopped and
#: its caller draws a smaller one or says so.
DOT_SECONDS = 10.0

_SIZE = re.compile(r'<svg[^>]*?\bwidth="([\d.]+)pt"[^>]*?\bheight="([\d.]+)pt"')
_PX_PER_PT = 4 / 3


class DiagramWarning(UserWarning):
    """A diagram could not be drawn as intended (e.g. Graphviz's ``dot`` is missing)."""


class DrawingTooSlow(Exception):
    """``dot`` was stopped: laying out the drawing took longer than its time limit (``seconds``)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"Graphviz's dot took more than {seconds:g} s to lay out the diagram and was stopped")
        self.seconds = seconds


_dot_missing_warned = False


def svg(graph: graphviz.Digraph, *, timeout: float | None = None) -> str | None:
    """Render a diagram to an SVG string with Graphviz's ``dot``.

    Args:
        graph: the diagram.
        timeout: seconds ``dot`` may take (default `DOT_SECONDS`).

    Returns:
        The ``<svg>`` element (XML prolog left out, ready to embed), or None when ``dot`` is not on
        PATH; then one `DiagramWarning` per process says how to install it.

    Raises:
        DrawingTooSlow: ``dot`` ran past ``timeout`` (it is stopped).
        subprocess.CalledProcessError: ``dot`` failed (its message in ``stderr``).
    """
    global _dot_missing_warned
    limit = DOT_SECONDS if timeout is None else timeout
    dot = shutil.which(graph.engine)
    if dot is None:
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
    # NOTE: the graphviz package's pipe() has no time limit; subprocess.run stops dot at one (and on Ctrl-C)
    try:
        out = subprocess.run([dot, "-Tsvg"], input=graph.source, capture_output=True, text=True, encoding="utf-8",
                             timeout=limit, check=True).stdout
    except subprocess.TimeoutExpired:
        raise DrawingTooSlow(limit) from None
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
