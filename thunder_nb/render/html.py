"""HTML views built from the others: the CSS (written once), report and side panes, tables for the comparison."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence

from ..diagnosis.model import Report, TraceReport
from .backend import svg, svg_size, svgs_to_imgs
from .common import WRONG_COLOR, esc, launch_line, plural, severity_counts, verdict
from .dot import region_diagram
from .lifetimes import lifetime_svg
from .memory import known, region_memory
from .modules import fused_owners, has_tree, module_tree_html
from .source import source_html, trace_source_html
from .text import report_text, trace_text

__all__ = [
    "CSS",
    "style_for",
    "FIT",
    "COLUMN",
    "MIN_TEXT_PX",
    "trees_html",
    "SIDE_VIEWS",
    "rows_table",
    "verdict_spans",
    "VERDICT_COLORS",
    "diagram_html",
    "memory_html",
    "defects_html",
    "trace_html",
    "report_html",
    "report_mimebundle",
    "side_by_side_html",
    "side_html",
    "pane_html",
]

#: The views a side pane (`side_html`) can show, in display order.
SIDE_VIEWS = ("diagram", "lifetimes", "source")
#: (width, height) in px a diagram may take in a default view before its regions are collapsed.
FIT = (880, 900)
#: A notebook's column width in px (JupyterLab at a 1,280-px window); no view is wider than two of them.
COLUMN = 1040
#: The smallest text in px any view shows at `COLUMN` width. A diagram fitted to a narrower column may go below it: a
#: line under it says so, and a click shows it at full size (`_box`).
MIN_TEXT_PX = 11
#: A drawing wider than this (px) is laid out again for a narrow column (`region_diagram`'s ``narrow``: its inputs one
#: under the other), and that layout is shown where it is narrower: JupyterLab's column in a 1,024-px window is 592 px,
#: which shows 640 px of drawing with its 12-px labels at 11 px.
NARROW_AT = 640
#: Bytes a drawing behind "full diagram" may take (a model's full drawing is megabytes: its module tree replaces it).
FULL_MAX_BYTES = 150_000
#: Lifetime rows a pane shows of a big trace (the text report and `lifetime_svg` keep `MAX_ROWS`).
PANE_ROWS = 40
#: Names a memory-plan row lists before the rest fold away ("+73 more").
MEMORY_NAMES = 4
#: How many of a rule's other defects its row lists under "+N more" (the count is always whole).
DEFECTS_LISTED = 30
#: Lines of each generated source a pane shows (defect lines always).
PANE_CODE_LINES = 200

#: The style of every HTML view, scoped to ``.thunder-nb``; each top-level fragment carries it once.
# NOTE: .tnb-tall's max-height is FIT's height. The widget's boxes that hold a view (ipywidgets' flex items) may shrink
# below their content's width, so that a wide diagram scrolls in its own box instead of widening the column.
CSS = """<style>
.thunder-nb{font-family:system-ui,sans-serif;font-size:13px;line-height:1.4;max-width:100%;overflow-wrap:anywhere;min-width:0}
.widget-html:has(.thunder-nb),.widget-html-content:has(.thunder-nb),.widget-box:has(.thunder-nb){min-width:0;max-width:100%}
.thunder-nb-toggle.jupyter-widgets-disconnected::before,.thunder-nb-toggle .jupyter-widgets-disconnected::before{content:none;display:none}
.thunder-nb .tnb-h{font-weight:600;margin:8px 0 4px}
.thunder-nb table{border-collapse:collapse}
.thunder-nb td,.thunder-nb th{padding:1px 6px;text-align:left;vertical-align:top;overflow-wrap:break-word}
.thunder-nb small{font-size:11px}
.thunder-nb code,.thunder-nb pre{font-size:12px}
.thunder-nb .tnb-memory td:nth-child(-n+2),.thunder-nb .tnb-defects td:nth-child(-n+3){white-space:nowrap}
.thunder-nb .tnb-memory td:nth-child(4),.thunder-nb .tnb-defects td:nth-child(4){min-width:16em}
.thunder-nb .tnb-ln{color:#868e96;text-align:right;user-select:none}
.thunder-nb .tnb-badge{border-radius:3px;padding:0 4px;margin-right:3px;font-size:11px}
.thunder-nb .tnb-island{background:#fff3bf}
.thunder-nb .tnb-defect,.thunder-nb .tnb-rule,.thunder-nb .tnb-error{color:#e03131}
.thunder-nb .tnb-wrong-result,.thunder-nb .tnb-wrong{color:#a61e4d;font-weight:600}
.thunder-nb .tnb-defect-line{background:#ffe3e3;display:inline-block;min-width:100%}
.thunder-nb pre{background:#f8f9fa;padding:6px;overflow:auto;margin:0;line-height:1.3;max-width:100%}
.thunder-nb .tnb-diagram,.thunder-nb .tnb-scroll{max-width:100%;overflow-x:auto}
.thunder-nb .tnb-diagram{container-type:inline-size}
.thunder-nb .tnb-diagram svg{max-width:100%;height:auto}
.thunder-nb .tnb-zoomable{display:block;width:max-content;max-width:100%}
.thunder-nb .tnb-zoomable>svg,.thunder-nb .tnb-zoomable>img{cursor:zoom-in}
.thunder-nb .tnb-zoom:checked~svg,.thunder-nb .tnb-zoom:checked~img{max-width:none!important;cursor:zoom-out}
.thunder-nb .tnb-zoomable:has(.tnb-zoom:checked){max-width:none}
.thunder-nb .tnb-zoom-hint{font-size:11px;color:#495057}
.thunder-nb .tnb-zoomable:has(.tnb-zoom:checked)+.tnb-zoom-hint{display:none!important}
.thunder-nb svg.tnb-lifetime{max-width:none}
.thunder-nb .tnb-tree{border-left:4px solid;padding-left:6px;margin:6px 0}
.thunder-nb ol.tnb-level{list-style:none;margin:0;padding-left:14px}
.thunder-nb .tnb-tree>ol.tnb-level{padding-left:0}
.thunder-nb ol.tnb-level>li{margin:2px 0}
.thunder-nb .tnb-tree summary{font-weight:400}
.thunder-nb .tnb-box{display:inline-block;border:1px solid #868e96;border-radius:3px;padding:0 5px;background:#fff;font-weight:600}
.thunder-nb .tnb-ops{font-weight:400;border-style:dashed}
.thunder-nb ol.tnb-level>li>code{font-size:12px;white-space:pre-wrap}
.thunder-nb .tnb-tall{max-height:900px;overflow-y:auto}
.thunder-nb details{margin:2px 0}
.thunder-nb details>summary{cursor:pointer;font-weight:600;margin:2px 0}
.thunder-nb .tnb-more{display:flex;flex-wrap:wrap;column-gap:18px;align-items:baseline}
.thunder-nb .tnb-more>details[open]{flex-basis:100%;order:1;min-width:0}
.thunder-nb .tnb-side-row{display:flex;flex-wrap:wrap;gap:8px 16px}
.thunder-nb .tnb-side-row>div{flex:1 1 420px;min-width:0}
</style>"""


_HINT = re.compile(r'class="tnb-zoom-hint tnb-hint-(\d+)"')


def style_for(body: str) -> str:
    """`CSS`, with a container query for each width at which a diagram of ``body`` is shrunk below `MIN_TEXT_PX`: it
    shows that diagram's line "shrunk to fit the column: click …" (`_box`) in a column narrower than that."""
    widths = sorted({int(w) for w in _HINT.findall(body)})
    rules = "".join(f"@container (max-width:{w - 1}px){{.thunder-nb .tnb-hint-{w}{{display:block!important}}}}\n"
                    for w in widths)
    return CSS.replace("</style>", rules + "</style>") if rules else CSS


def rows_table(rows: Iterable[tuple[str, str]], *, cls: str = "tnb-run") -> str:
    """Return (label, text) rows as a two-column HTML table of class ``cls``, everything escaped.

    `thunder_nb.compare.Comparison.run_html` is ``rows_table(self.run_rows())``.
    """
    body = "".join(
        f'<tr><th style="text-align:left;padding-right:1em">{esc(k)}</th><td>{esc(v)}</td></tr>' for k, v in rows
    )
    return f'<table class="{esc(cls)}">{body}</table>'


#: The verdict's colours by level: red for what fails or is wrong, amber for warnings, green for nothing wrong.
VERDICT_COLORS = {"bad": "#e03131", "warn": "#e8590c", "good": "#2b8a3e", "note": "#495057"}


def verdict_spans(phrases: Sequence[tuple[str, str]]) -> str:
    """Return a one-line verdict of phrases, each ``(text, level)`` in its level's colour (`VERDICT_COLORS`)."""
    spans = "; ".join(f'<span class="tnb-{level}" style="color:{VERDICT_COLORS[level]}">{esc(text)}</span>'
                      for text, level in phrases)
    return f'<div class="tnb-verdict" style="font-weight:600">{spans}</div>'


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
    is wider than `NARROW_AT` and the narrow one is narrower; (None, source) without ``dot``."""
    graph = region_diagram(trace, **how)
    image = svg(graph)
    if image is not None and svg_size(image)[0] > NARROW_AT:
        narrow = svg(region_diagram(trace, narrow=True, **how))
        if narrow is not None and svg_size(narrow)[0] < svg_size(image)[0]:
            return narrow, graph.source
    return image, graph.source


def _diagram_parts(trace: TraceReport, trees: str = "below") -> tuple[str, str, bool]:
    """(the diagram shown, the full one in a closed ``<details>`` or "", drawn by ``dot``); ``trees``: where the
    module trees (`trees_html`) are from the second part, "below" or "above"."""
    image, source = _draw(trace)
    if image is None:
        return (
            '<div class="tnb-diagram"><p>Graphviz <code>dot</code> is not installed '
            "(<code>apt-get install graphviz</code>): the diagram as DOT source.</p>"
            f'<pre class="tnb-dot">{esc(source)}</pre></div>',
            "",
            False,
        )
    w, h = svg_size(image)
    full = "subgraph cluster_" in source
    if full and (w > FIT[0] or h > FIT[1]):
        small, _ = _draw(trace, collapse=True)
        if small is not None:
            what = _full_what(trace, w, h)
            if w > 2 * COLUMN or len(image) > FULL_MAX_BYTES:
                # NOTE: wider than two columns, or megabytes: the module trees below the diagram show its ops
                return _box(small), f'<p class="tnb-full">{esc(what)}: {esc(_too_big(trace, trees))}</p>', True
            return (
                _box(small),
                f'<details class="tnb-full"><summary>{esc(what)}</summary>{_box(image, tall=False)}</details>',
                True,
            )
    return _box(image), "", True


_FONT = re.compile(r'font-size="([\d.]+)"')


def _box(image: str, *, tall: bool | None = None) -> str:
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


def _lifetimes(trace: TraceReport, rows: int | None = None) -> str:
    """The lifetime chart in a box that scrolls sideways in a column narrower than the chart."""
    chart = lifetime_svg(trace) if rows is None else lifetime_svg(trace, max_rows=rows)
    return f'<div class="tnb-scroll">{chart}</div>'


def diagram_html(trace: TraceReport) -> tuple[str, bool]:
    """The region diagram as inline SVG that fits `FIT`; without ``dot``, its DOT source. Returns (html, drawn).

    A drawing bigger than `FIT` with its regions in full is replaced by the collapsed one, and the
    full drawing follows in a closed ``<details>``.
    """
    shown, full, drawn = _diagram_parts(trace)
    return shown + full, drawn


def _names_html(names: Sequence[str]) -> str:
    """The names of one memory-plan row; past `MEMORY_NAMES`, the rest behind a closed ``<details>``."""
    shown = f"<code>{esc(', '.join(names[:MEMORY_NAMES]))}</code>"
    if len(names) <= MEMORY_NAMES:
        return shown
    # NOTE: a model's 77 parameters made one row 77 lines tall, and pushed its reason out of the column
    rest = names[MEMORY_NAMES:]
    return f"{shown}, <details><summary>+{len(rest)} more</summary><code>{esc(', '.join(rest))}</code></details>"


def memory_html(trace: TraceReport) -> str:
    """The memory plan of every region as a table (region, what, names, why); "" when it is not known."""
    rows = []
    for r in trace.regions:
        if not known(trace, r):
            continue
        for e in region_memory(trace, r):
            cls = ' class="tnb-wrong"' if e.flagged else ""
            rows.append(f"<tr{cls}><td>{esc(r.name)}</td><td>{esc(e.label)}</td><td>{_names_html(e.names)}</td>"
                        f"<td>{esc(e.reason)}</td></tr>")
    if not rows:
        return ""
    # NOTE: in its own scroll box: its first columns do not wrap (legible names), so a narrow column scrolls it
    return (f'<div class="tnb-scroll"><table class="tnb-memory"><tr><th>region</th><th>what</th><th>names</th>'
            f"<th>why</th></tr>{''.join(rows)}</table></div>")


def defects_html(trace: TraceReport) -> str:
    """The defects of a trace as a table, one row per rule (severity, rule, where, message and hint).

    A model's trace has hundreds of defects of a few rules (every saved activation of a layer, every value a
    region deletes): one row per defect repeated the hint hundreds of times and made the notebook megabytes. A
    rule's row gives its count and first places, its first message and each distinct hint once; the others'
    places and values fold under a closed "+N more" (at most `DEFECTS_LISTED`; ``report.defects`` has them all).
    """
    if not trace.defects:
        return "<p>no defects</p>"
    groups: dict[str, list] = {}
    for d in trace.defects:
        groups.setdefault(d.rule, []).append(d)
    rows = []
    for rule, ds in groups.items():
        first = ds[0]
        places = list(dict.fromkeys(d.where() for d in ds))
        where = ", ".join(places[:3]) + (f" (+{len(places) - 3})" if len(places) > 3 else "")
        more = ""
        if len(ds) > 1:
            listed = [f"{d.where()}: {d.value or d.message}" for d in ds[1:DEFECTS_LISTED + 1]]
            rest = len(ds) - 1 - len(listed)
            tail = f"<br>… and {rest} more (<code>report.defects</code> lists them all)" if rest > 0 else ""
            more = (f"<details><summary>+{len(ds) - 1} more</summary><small>{esc('; '.join(listed))}{tail}</small>"
                    "</details>")
        count = f"\u00a0×{len(ds)}" if len(ds) > 1 else ""  # NOTE: inside the code, on its line: ``rule ×79``
        rows.append(f'<tr class="tnb-{first.severity.replace(" ", "-")}"><td>{esc(first.severity)}</td>'
                    f"<td><code>{esc(rule + count)}</code></td><td>{esc(where)}</td><td>{esc(first.message)}{more}"
                    + "".join(f"<br><i>{esc(h)}</i>" for h in dict.fromkeys(d.hint for d in ds)) + "</td></tr>")
    # NOTE: in its own scroll box, as the memory plan: severity, rule and place do not break (`CSS`), so a narrow
    # column scrolls it
    return (f'<div class="tnb-scroll"><table class="tnb-defects"><tr><th>severity</th><th>rule</th><th>where</th>'
            f"<th>message</th></tr>{''.join(rows)}</table></div>")


def _counts(trace: TraceReport) -> str:
    """``2 regions, 1 island``: the counts every header gives (islands: ops capture cannot take, nothing else)."""
    return f"{plural(len(trace.regions), 'region')}, {plural(len(trace.islands), 'island')}"


def _defect_counts(trace: TraceReport, *, ran: bool = True) -> str:
    """``5 defects (2 wrong results)``; for a call that failed (``ran`` False), what its defects would have done."""
    crash, wrong, _, _ = severity_counts(trace.defects)
    text = esc(plural(len(trace.defects), "defect"))
    would = "" if ran else " had it run"
    worst = ([f"{crash} crashing the process{would}"] if crash else []) + (
        [plural(wrong, "wrong result") + would] if wrong else [])
    if worst:
        text += f' (<span class="tnb-wrong" style="color:{WRONG_COLOR}">{esc(", ".join(worst))}</span>)'
    return text


def trace_html(trace: TraceReport) -> str:
    """One trace for the report: header, diagram (text view without ``dot``), defects, then closed detail views."""
    diagram, drawn = diagram_html(trace)
    if not drawn:
        diagram += f'<pre class="tnb-text">{esc(chr(10).join(trace_text(trace)))}</pre>'
    memory = memory_html(trace)
    return (
        f'<div class="tnb-trace"><div class="tnb-h">{esc(trace.kind)} trace <code>{esc(trace.name)}</code>: '
        f"{esc(_counts(trace))}</div>"
        f"{diagram}{trees_html(trace)}{defects_html(trace)}"
        + (f"<details><summary>memory plan</summary>{memory}</details>" if memory else "")
        + f'<details><summary>lifetimes</summary>{_lifetimes(trace, PANE_ROWS)}</details>'
        f"<details><summary>source</summary>{source_html(trace)}</details>"
        f"<details><summary>generated code</summary>{trace_source_html(trace, max_lines=PANE_CODE_LINES)}</details></div>"
    )


def _header_html(report: Report) -> str:
    parts = [f'<div class="tnb-h">{esc(report.function)} <small>(transform: {esc(report.transform)})</small></div>',
             f"<div>verdict: {esc(verdict(report.defects))}</div>"]
    if report.error:
        parts.append(f'<div class="tnb-error">error: {esc(report.error)}</div>')
    parts += [f"<div>note: {esc(n)}</div>" for n in report.notes]
    return "".join(parts) + _launch_html(report)


def _launch_html(report: Report) -> str:
    """The launch-time estimate as one line (nothing when the report has no region)."""
    return f"<div>launches: {esc(launch_line(report))}</div>" if any(t.regions for t in report.traces) else ""


def report_html(report: Report) -> str:
    """Return the HTML report: header, then per trace its diagram, defects, lifetimes and source views.

    Its pictures are ``<img>`` elements (`thunder_nb.render.backend.svgs_to_imgs`): a stored notebook opened untrusted
    (JupyterLab, GitHub) sanitizes inline SVG away.
    """
    body = _header_html(report) + "".join(trace_html(t) for t in report.traces)
    return svgs_to_imgs(f'<div class="thunder-nb">{style_for(body)}{body}</div>')


def report_mimebundle(report: Report, include: Iterable[str] | None = None,
                      exclude: Iterable[str] | None = None) -> dict[str, str]:
    """Return the report's rich display: ``text/plain`` and ``text/html``, filtered as IPython asks."""
    wanted = ["text/plain", "text/html"]
    if include:
        wanted = [m for m in wanted if m in set(include)]
    if exclude:
        wanted = [m for m in wanted if m not in set(exclude)]
    makers = {"text/plain": report_text, "text/html": report_html}
    return {m: makers[m](report) for m in wanted}


def side_by_side_html(original: Report, fixed: Report) -> str:
    """Return two reports of the same function side by side, trace by trace (e.g. stock vs. fixed transform).

    Each row holds one trace kind of both; in a column narrower than two diagrams the two stack top to bottom.
    """
    rows = [f'<div class="tnb-side-row"><div>{_header_html(original)}</div><div>{_header_html(fixed)}</div></div>']
    kinds = list(dict.fromkeys(t.kind for t in original.traces + fixed.traces))
    for kind in kinds:
        cells = []
        for rep in (original, fixed):
            t = next((t for t in rep.traces if t.kind == kind), None)
            cells.append(f"<div>{trace_html(t)}</div>" if t is not None else f"<div><p>no {esc(kind)} trace</p></div>")
        rows.append(f'<div class="tnb-side-row">{"".join(cells)}</div>')
    body = "".join(rows)
    return svgs_to_imgs(f'<div class="thunder-nb">{style_for(body)}<div class="tnb-side">{body}</div></div>')


def _pane_trace_html(trace: TraceReport, views: Sequence[str], *, ran: bool = True) -> tuple[str, bool]:
    head = (
        f'<div class="tnb-h">{esc(trace.kind)} trace <code>{esc(trace.name)}</code>: '
        f"{esc(_counts(trace))}, {_defect_counts(trace, ran=ran)}</div>"
    )
    parts, more, drawn = [head], [], True
    if "diagram" in views:
        diagram, full, drawn = _diagram_parts(trace, "above")  # NOTE: it goes to the closed parts, after the trees
        parts.append(diagram + trees_html(trace))
        more.append(full)
        memory = memory_html(trace)
        if memory:
            more.append(f"<details><summary>memory plan</summary>{memory}</details>")
        if trace.defects:
            more.append(f"<details><summary>defects</summary>{defects_html(trace)}</details>")
    if "lifetimes" in views:
        more.append(f"<details><summary>lifetimes: {esc(plural(len(trace.values), 'value'))}</summary>"
                    f"{_lifetimes(trace, PANE_ROWS)}</details>")
    if "source" in views:
        more.append(f"<details><summary>generated code</summary>{trace_source_html(trace, max_lines=PANE_CODE_LINES)}"
                    "</details>")
    if any(more):
        # NOTE: the closed parts share one line; an opened one takes a line of its own below them
        parts.append(f'<div class="tnb-more">{"".join(more)}</div>')
    return "".join(parts), drawn


def pane_html(report: Report, views: Iterable[str] = SIDE_VIEWS, *, title: str | None = None) -> str:
    """`side_html` without the CSS: to put several panes under one style block."""
    views = tuple(v for v in views if v in SIDE_VIEWS)
    title = title or f"{report.function} (transform: {report.transform})"
    parts = [f'<div class="tnb-pane"><div class="tnb-h">{esc(title)}</div>']
    if report.error:
        parts.append(f'<div class="tnb-error">error: {esc(report.error)}</div>')
    parts += [f"<div>note: {esc(n)}</div>" for n in report.notes]
    all_drawn = True
    for trace in report.traces:
        body, drawn = _pane_trace_html(trace, views, ran=report.error is None)
        all_drawn = all_drawn and drawn
        parts.append(body)
    if not all_drawn:
        parts.append(f'<div class="tnb-h">text view</div><pre class="tnb-text">{esc(report_text(report))}</pre>')
    parts.append("</div>")
    return "".join(parts)


def side_html(report: Report, views: Iterable[str] = SIDE_VIEWS, *, title: str | None = None) -> str:
    """Render one side of a comparison: its header, then per trace the chosen views, sized for a notebook column.

    Args:
        report: the side's `Report`.
        views: any of `SIDE_VIEWS` ("diagram": region diagram SVG with the memory plan and defects
            behind ``<details>``, "lifetimes": lifetime chart, "source": generated code with defect
            lines highlighted); others are ignored. Lifetimes and code start closed.
        title: the heading (default: the function and its transform).

    Returns:
        A self-contained HTML fragment (it carries `CSS`). Without Graphviz's ``dot`` the diagram is
        shown as DOT source followed by the report's text form.
    """
    body = pane_html(report, views, title=title)
    return f'<div class="thunder-nb">{style_for(body)}{body}</div>'
