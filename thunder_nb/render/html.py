"""HTML views built from the others: the CSS (written once), report and side panes, tables for the comparison."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..model import Report, TraceReport
from .backend import svg
from .common import esc, plural, verdict
from .dot import region_diagram
from .lifetimes import lifetime_svg
from .source import source_html, trace_source_html
from .text import report_text, trace_text

__all__ = [
    "CSS",
    "SIDE_VIEWS",
    "rows_table",
    "diagram_html",
    "trace_html",
    "report_html",
    "report_mimebundle",
    "side_by_side_html",
    "side_html",
]

#: The views a side pane (`side_html`) can show, in display order.
SIDE_VIEWS = ("diagram", "lifetimes", "source")

#: The style of every HTML view, scoped to ``.thunder-nb``; each top-level fragment carries it once.
CSS = """<style>
.thunder-nb{font-family:system-ui,sans-serif;font-size:13px}
.thunder-nb .tnb-h{font-weight:600;margin:8px 0 4px}
.thunder-nb table{border-collapse:collapse}
.thunder-nb td,.thunder-nb th{padding:1px 6px;text-align:left;vertical-align:top}
.thunder-nb .tnb-ln{color:#868e96;text-align:right;user-select:none}
.thunder-nb .tnb-badge{border-radius:3px;padding:0 4px;margin-right:3px;font-size:11px}
.thunder-nb .tnb-island{background:#fff3bf}
.thunder-nb .tnb-defect,.thunder-nb .tnb-rule,.thunder-nb .tnb-error{color:#e03131}
.thunder-nb .tnb-defect-line{background:#ffe3e3;display:inline-block;min-width:100%}
.thunder-nb pre{background:#f8f9fa;padding:6px;overflow:auto;margin:0;line-height:1.3}
.thunder-nb .tnb-diagram{overflow:auto;max-width:100%}
.thunder-nb .tnb-side td{width:50%}
</style>"""


def rows_table(rows: Iterable[tuple[str, str]], *, cls: str = "tnb-rows") -> str:
    """Return (label, text) rows as a two-column HTML table of class ``cls``, everything escaped."""
    body = "".join(
        f'<tr><th style="text-align:left;padding-right:1em">{esc(k)}</th><td>{esc(v)}</td></tr>' for k, v in rows
    )
    return f'<table class="{esc(cls)}">{body}</table>'


def diagram_html(trace: TraceReport) -> tuple[str, bool]:
    """The region diagram as inline SVG; without ``dot``, its DOT source. Returns (html, drawn)."""
    graph = region_diagram(trace)
    image = svg(graph)
    if image is not None:
        return f'<div class="tnb-diagram">{image}</div>', True
    return (
        '<div class="tnb-diagram"><p>Graphviz <code>dot</code> is not installed '
        "(<code>apt-get install graphviz</code>): the diagram as DOT source.</p>"
        f'<pre class="tnb-dot">{esc(graph.source)}</pre></div>',
        False,
    )


def _defects_html(trace: TraceReport) -> str:
    if not trace.defects:
        return "<p>no defects</p>"
    rows = "".join(
        f'<tr class="tnb-{d.severity.replace(" ", "-")}"><td>{esc(d.severity)}</td><td><code>{esc(d.rule)}</code></td>'
        f"<td>{esc(d.where())}</td><td>{esc(d.message)}<br><i>{esc(d.hint)}</i></td></tr>"
        for d in trace.defects
    )
    return f"<table><tr><th>severity</th><th>rule</th><th>where</th><th>message</th></tr>{rows}</table>"


def trace_html(trace: TraceReport) -> str:
    """One trace for the report: header, diagram (text view without ``dot``), defects, lifetimes, source views."""
    diagram, drawn = diagram_html(trace)
    if not drawn:
        diagram += f'<pre class="tnb-text">{esc(chr(10).join(trace_text(trace)))}</pre>'
    return (
        f'<div class="tnb-trace"><div class="tnb-h">{esc(trace.kind)} trace <code>{esc(trace.name)}</code>: '
        f"{esc(plural(len(trace.regions), 'region'))}, {esc(plural(len(trace.user_islands), 'user island'))}</div>"
        f"{diagram}{_defects_html(trace)}"
        f'<details><summary>lifetimes</summary>{lifetime_svg(trace)}</details>'
        f"<details><summary>source</summary>{source_html(trace)}</details>"
        f"<details><summary>generated code</summary>{trace_source_html(trace)}</details></div>"
    )


def _header_html(report: Report) -> str:
    parts = [f'<div class="tnb-h">{esc(report.function)} <small>(transform: {esc(report.transform)})</small></div>',
             f"<div>verdict: {esc(verdict(report.defects))}</div>"]
    if report.error:
        parts.append(f'<div class="tnb-error">error: {esc(report.error)}</div>')
    parts += [f"<div>note: {esc(n)}</div>" for n in report.notes]
    return "".join(parts)


def report_html(report: Report) -> str:
    """Return the HTML report: header, then per trace its diagram, defects, lifetimes and source views."""
    body = _header_html(report) + "".join(trace_html(t) for t in report.traces)
    return f'<div class="thunder-nb">{CSS}{body}</div>'


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
    """Return two reports of the same function side by side, trace by trace (e.g. stock vs. fixed transform)."""
    rows = [f"<tr><td>{_header_html(original)}</td><td>{_header_html(fixed)}</td></tr>"]
    kinds = list(dict.fromkeys(t.kind for t in original.traces + fixed.traces))
    for kind in kinds:
        cells = []
        for rep in (original, fixed):
            t = next((t for t in rep.traces if t.kind == kind), None)
            cells.append(f"<td>{trace_html(t)}</td>" if t is not None else f"<td><p>no {esc(kind)} trace</p></td>")
        rows.append(f"<tr>{''.join(cells)}</tr>")
    return f'<div class="thunder-nb">{CSS}<table class="tnb-side">{"".join(rows)}</table></div>'


def _pane_trace_html(trace: TraceReport, views: Sequence[str]) -> tuple[str, bool]:
    head = (
        f'<div class="tnb-h">{esc(trace.kind)} trace <code>{esc(trace.name)}</code>: '
        f"{esc(plural(len(trace.regions), 'region'))}, {esc(plural(len(trace.user_islands), 'island'))}, "
        f"{esc(plural(len(trace.defects), 'defect'))}</div>"
    )
    parts, drawn = [head], True
    if "diagram" in views:
        diagram, drawn = diagram_html(trace)
        parts.append(diagram)
    if "lifetimes" in views:
        parts.append(f'<div class="tnb-h">lifetimes</div>{lifetime_svg(trace)}')
    if "source" in views:
        parts.append(f'<div class="tnb-h">generated code</div>{trace_source_html(trace)}')
    return "".join(parts), drawn


def side_html(report: Report, views: Iterable[str] = SIDE_VIEWS, *, title: str | None = None) -> str:
    """Render one side of a comparison: its header, then per trace the chosen views.

    Args:
        report: the side's `Report`.
        views: any of `SIDE_VIEWS` ("diagram": region diagram SVG, "lifetimes": lifetime SVG,
            "source": generated code with defect lines highlighted); others are ignored.
        title: the heading (default: the function and its transform).

    Returns:
        A self-contained HTML fragment. Without Graphviz's ``dot`` the diagram is shown as DOT
        source followed by the report's text form.
    """
    views = tuple(v for v in views if v in SIDE_VIEWS)
    title = title or f"{report.function} (transform: {report.transform})"
    parts = [f'<div class="thunder-nb tnb-pane">{CSS}<div class="tnb-h">{esc(title)}</div>']
    if report.error:
        parts.append(f'<div class="tnb-error">error: {esc(report.error)}</div>')
    parts += [f"<div>note: {esc(n)}</div>" for n in report.notes]
    all_drawn = True
    for trace in report.traces:
        body, drawn = _pane_trace_html(trace, views)
        all_drawn = all_drawn and drawn
        parts.append(body)
    if not all_drawn:
        parts.append(f'<div class="tnb-h">text view</div><pre class="tnb-text">{esc(report_text(report))}</pre>')
    parts.append("</div>")
    return "".join(parts)
