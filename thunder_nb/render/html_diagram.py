"""The region diagram in HTML: drawn for the column (laid out narrow where that is narrower), collapsed where it is
bigger than `FIT` with the full drawing behind it, in a box that fits the column and shows it at full size at a click;
and the module trees that list a big region's ops."""

from __future__ import annotations

import math
import re
import time

from ..diagnosis.model import TraceReport
from .backend import DrawingTooSlow, svg, svg_size
from .common import esc, plural
from .dot import region_diagram
from .html_style import COLUMN, FIT, MIN_TEXT_PX
from .modules import fused_owners, has_tree, module_tree_html

__all__ = ["NARROW_AT", "FULL_MAX_BYTES", "diagram_html", "diagram_parts", "box", "trees_html"]

#: A drawing wider than this (px) is laid out again for a narrow column (`region_diagram`'s ``narrow``: its inputs one
#: under the other), and that layout is shown where it is narrower: JupyterLab's column in a 1,024-px window is 592 px,
#: which shows 640 px of drawing with its 12-px labels at 11 px.
NARROW_AT = 640
#: Seconds the usual layout may have taken for the narrow one to be tried: a bigger drawing's second layout takes
#: longer still (a 1-layer nanoGPT's full forward: 2 s, then 6 s for the narrow one) and is rarely narrower, its
#: width coming from the region's ops, not from its inputs side by side.
NARROW_IF_UNDER = 1.0
#: Bytes a drawing behind "full diagram" may take (a model's full drawing is megabytes: its module tree replaces it).
FULL_MAX_BYTES = 150_000


def _full_what(trace: TraceReport, w: float, h: float) -> str:
    """``full diagram: 506 ops, 505 of them in 1 fused group (35393 × 599 px)``: every region's ops, those a fusion
    executor fused counted one by one where they are known (the drawing has one box per fused group)."""
    n = sum(len(r.every_op) for r in trace.regions)
    owners = [fused_owners(r) for r in trace.regions]
    fused = sum(map(len, owners))
    groups = sum(len(set(o.values())) for o in owners)
    inside = f", {'all' if fused == n else f'{fused} of them'} in {plural(groups, 'fused group')}" if fused else ""
    return f"full diagram: {plural(n, 'op')}{inside} ({w:.0f} × {h:.0f} px)"


def _too_big(trace: TraceReport, trees: str) -> str:
    """What stands in for a full diagram too big to show: the module trees (``trees``: where they are from here,
    "below" or "above"), as far as there are any."""
    listed = [r.name for r in trace.regions if has_tree(r)]
    if not listed:
        return "too big to show"
    if len(listed) == sum(1 for r in trace.regions if r.compute_ops):
        where = f"its ops are listed by module {trees}"
    else:
        where = f"the ops of {', '.join(listed)} are listed by module {trees}"
    # NOTE: the generated code holds a fused group's call, not the ops fused in it
    return f"too big to show; {where}" + ("" if any(r.fusions for r in trace.regions) else " and in the generated code")


def _draw(trace: TraceReport, **how) -> tuple[str | None, str]:
    """(the SVG of `region_diagram` with ``how``, its DOT source): laid out for a narrow column where the usual layout
    is wider than `NARROW_AT`, took under `NARROW_IF_UNDER` seconds, and the narrow one is narrower; (None, source)
    without ``dot``. Raises `DrawingTooSlow` where the usual layout ran past ``dot``'s time limit."""
    graph = region_diagram(trace, **how)
    began = time.perf_counter()
    image = svg(graph)
    took = time.perf_counter() - began
    if image is not None and svg_size(image)[0] > NARROW_AT and took < NARROW_IF_UNDER:
        try:
            narrow = svg(region_diagram(trace, narrow=True, **how))
        except DrawingTooSlow:
            narrow = None
        if narrow is not None and svg_size(narrow)[0] < svg_size(image)[0]:
            return narrow, graph.source
    return image, graph.source


def _in_full(source: str) -> bool:
    """Whether a drawing's DOT source draws its regions in full (each a cluster of its ops), not collapsed."""
    return "subgraph cluster_" in source


def _not_drawn(trace: TraceReport, slow: DrawingTooSlow) -> tuple[str, str, bool]:
    """`diagram_parts` where even the collapsed drawing was too slow for ``dot``: a line that says so (the pane's text
    view follows, as without ``dot``)."""
    ops = sum(len(r.every_op) for r in trace.regions)
    return (f'<div class="tnb-diagram"><p>not drawn: {esc(str(slow))} ({esc(plural(ops, "op"))} in '
            f'{esc(plural(len(trace.regions), "region"))}); the text view below lists them.</p></div>', "", False)


def _collapsed_instead(trace: TraceReport, slow: DrawingTooSlow, full: bool) -> tuple[str, str, bool] | None:
    """`diagram_parts` where the usual drawing ran past ``dot``'s limit: the collapsed drawing where the usual one drew
    its regions in full (``full``), else `_not_drawn`; None where ``dot`` is gone (the DOT source is shown then)."""
    if not full:
        return _not_drawn(trace, slow)  # NOTE: already collapsed: nothing smaller to draw
    try:
        small, _ = _draw(trace, collapse=True)
    except DrawingTooSlow as slower:
        return _not_drawn(trace, slower)
    if small is None:
        return None
    return box(small), f'<p class="tnb-full">full diagram not drawn: {esc(str(slow))}</p>', True


def _dot_source_only(source: str) -> tuple[str, str, bool]:
    """`diagram_parts` without ``dot``: the diagram as DOT source."""
    return (
        '<div class="tnb-diagram"><p>Graphviz <code>dot</code> is not installed '
        "(<code>apt-get install graphviz</code>): the diagram as DOT source.</p>"
        f'<pre class="tnb-dot">{esc(source)}</pre></div>',
        "",
        False,
    )


def diagram_parts(trace: TraceReport, trees: str = "below") -> tuple[str, str, bool]:
    """(the diagram shown, the full one in a closed ``<details>`` or "", drawn by ``dot``); ``trees``: where the
    module trees (`trees_html`) are from the second part, "below" or "above"."""
    try:
        image, source = _draw(trace)
    except DrawingTooSlow as slow:
        source = region_diagram(trace).source  # NOTE: the drawing `_draw` gave up on, built once for both uses
        return _collapsed_instead(trace, slow, _in_full(source)) or _dot_source_only(source)
    if image is None:
        return _dot_source_only(source)
    w, h = svg_size(image)
    full = _in_full(source)
    if full and (w > FIT[0] or h > FIT[1]):
        try:
            small, _ = _draw(trace, collapse=True)
        except DrawingTooSlow:
            small = None  # NOTE: the full drawing is shown as it is
        if small is not None:
            what = _full_what(trace, w, h)
            if w > 2 * COLUMN or len(image) > FULL_MAX_BYTES:
                # NOTE: wider than two columns, or megabytes: the module trees below the diagram show its ops
                return box(small), f'<p class="tnb-full">{esc(what)}: {esc(_too_big(trace, trees))}</p>', True
            return (
                box(small),
                f'<details class="tnb-full"><summary>{esc(what)}</summary>{box(image, tall=False)}</details>',
                True,
            )
    return box(image), "", True


_FONT = re.compile(r'font-size="([\d.]+)"')


def box(image: str, *, tall: bool | None = None) -> str:
    """The diagram's box: the drawing fits the column's width (shrunk, never cut); one still taller than `FIT` (a long
    chain of regions) scrolls within that height.

    A click on the drawing shows it at full size (scrolling sideways in its box where the column is narrower), a second
    click fits it again: a hidden checkbox in a ``<label>`` around it, and `CSS`, so it works without JavaScript, in a
    widget pane and in a static page alike. Where the fitted drawing's smallest text would be under `MIN_TEXT_PX`
    (the column narrower than ``width × MIN_TEXT_PX / smallest``), a line under it says so: a container query of
    `style_for` shows it, so it appears only in such a column. Where ``<style>`` is stripped (an untrusted notebook) the drawing just fits.
    """
    w, h = svg_size(image)
    if tall is None:
        tall = h > FIT[1]
    sizes = [float(m) for m in _FONT.findall(image)]
    hint = ""
    if w and sizes:
        smallest = min(sizes) * 4 / 3  # NOTE: dot writes font sizes in pt, its drawing's units
        legible = math.ceil(w * MIN_TEXT_PX / smallest)  # NOTE: up, or rounding makes 10.99 px
        if legible > 0:
            # NOTE: shown by a container query of `style_for`, one per width; hidden inline where no style sheet applies
            hint = (f'<div class="tnb-zoom-hint tnb-hint-{legible}" style="display:none">shrunk to fit the column: '
                    "click the diagram for full size, again to fit</div>")
    zoom = (f'<label class="tnb-zoomable" title="click: full size / fit the column">'
            f'<input type="checkbox" class="tnb-zoom" hidden style="display:none">{image}</label>')
    return f'<div class="tnb-diagram{" tnb-tall" if tall else ""}">{zoom}{hint}</div>'


def trees_html(trace: TraceReport) -> str:
    """The module tree of each region of at least `thunder_nb.render.modules.TREE_MIN_OPS` ops, its fused ops counted
    (`thunder_nb.render.modules`)."""
    return "".join(module_tree_html(trace, r) for r in trace.regions if has_tree(r))


def diagram_html(trace: TraceReport) -> tuple[str, bool]:
    """The region diagram as inline SVG that fits `FIT`; without ``dot``, its DOT source. Returns (html, drawn).

    A drawing bigger than `FIT` with its regions in full is replaced by the collapsed one, and the
    full drawing follows in a closed ``<details>``.
    """
    shown, full, drawn = diagram_parts(trace)
    return shown + full, drawn

