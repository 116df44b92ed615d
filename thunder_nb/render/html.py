"""HTML views built from the others: the report, the side panes and their traces, tables for the comparison. The style
sheet is `html_style`'s, the diagram's box `html_diagram`'s and a trace's tables `html_tables`'."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..diagnosis.model import Report, TraceReport
from .backend import svgs_to_imgs
from .common import WRONG_COLOR, esc, launch_line, plural, severity_counts, verdict
from .html_diagram import diagram_html, diagram_parts, trees_html
from .html_style import COLUMN, CSS, FIT, MIN_TEXT_PX, style_for
from .html_tables import MEMORY_NAMES, defects_html, memory_html
from .lifetimes import lifetime_svg
from .source import source_html, trace_source_html
from .text import report_text, trace_text

__all__ = [
    "CSS",
    "style_for",
    "FIT",
    "COLUMN",
    "MIN_TEXT_PX",
    "MEMORY_NAMES",
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
#: Lifetime rows a pane shows of a big trace (the text report and `lifetime_svg` keep `MAX_ROWS`).
PANE_ROWS = 40
#: Lines of each generated source a pane shows (defect lines always).
PANE_CODE_LINES = 200


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


def _lifetimes(trace: TraceReport, rows: int | None = None) -> str:
    """The lifetime chart in a box that scrolls sideways in a column narrower than the chart."""
    chart = lifetime_svg(trace) if rows is None else lifetime_svg(trace, max_rows=rows)
    return f'<div class="tnb-scroll">{chart}</div>'


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
        diagram, full, drawn = diagram_parts(trace, "above")  # NOTE: it goes to the closed parts, after the trees
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

