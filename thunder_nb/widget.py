"""Prepared views of a comparison as ipywidgets that switch in the browser (so they work in a static export).

Every view is rendered to HTML up front; the widgets only choose which one is shown, through a
browser-side link (`ipywidgets.jslink`) between the buttons and a `Stack`. There is no kernel-side
callback, so an exported HTML page with the saved widget state switches exactly like a live notebook.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from .model import Report, TraceReport

if TYPE_CHECKING:  # NOTE: ipywidgets is imported only when a widget is built
    import ipywidgets

    from .comparison import Comparison

__all__ = ["VIEWS", "SIDE_VIEWS", "parse_views", "side_html", "toggle", "comparison_toggle"]

#: Every view the magic can show, in display order.
VIEWS = ("diagram", "lifetimes", "source", "run")
#: The views drawn for each side (original, fixed) of the toggle.
SIDE_VIEWS = ("diagram", "lifetimes", "source")

# NOTE: the classes render.trace_source_html emits, styled the same way as render's report HTML
_CSS = """<style>
.tnb-pane{font-family:system-ui,sans-serif;font-size:13px}
.tnb-pane .tnb-h{font-weight:600;margin:8px 0 4px}
.tnb-pane .tnb-ln{color:#868e96;user-select:none}
.tnb-pane .tnb-rule,.tnb-pane .tnb-error{color:#e03131}
.tnb-pane .tnb-defect-line{background:#ffe3e3;display:inline-block;min-width:100%}
.tnb-pane pre{background:#f8f9fa;padding:6px;overflow:auto;margin:0;line-height:1.3}
.tnb-pane .tnb-diagram{overflow:auto;max-width:100%}
</style>"""


def parse_views(spec: str | Iterable[str]) -> tuple[str, ...]:
    """Parse ``"diagram,run"`` (or a list of names) into view names in `VIEWS` order.

    Raises:
        ValueError: a name is not one of `VIEWS` (the message says which and lists the valid ones).
    """
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec)]
    names = [n for n in names if n]
    for n in names:
        if n not in VIEWS:
            raise ValueError(f"unknown view: {n!r} (must be one of {list(VIEWS)})")
    return tuple(v for v in VIEWS if v in names)


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _diagram_html(trace: TraceReport) -> tuple[str, bool]:
    """The region diagram as inline SVG; without ``dot``, its DOT source (render warns once). Returns (html, drawn)."""
    from . import render

    graph = render.region_diagram(trace)
    image = render.svg(graph)
    if image is not None:
        return f'<div class="tnb-diagram">{image}</div>', True
    return (
        "<p>Graphviz <code>dot</code> is not installed (<code>apt-get install graphviz</code>): "
        f'the diagram as DOT source.</p><pre class="tnb-dot">{_esc(graph.source)}</pre>',
        False,
    )


def _trace_html(trace: TraceReport, views: Sequence[str]) -> tuple[str, bool]:
    from . import render

    head = (
        f'<div class="tnb-h">{_esc(trace.kind)} trace <code>{_esc(trace.name)}</code>: '
        f"{_esc(_plural(len(trace.regions), 'region'))}, {_esc(_plural(len(trace.user_islands), 'island'))}, "
        f"{_esc(_plural(len(trace.defects), 'defect'))}</div>"
    )
    parts, drawn = [head], True
    if "diagram" in views:
        diagram, drawn = _diagram_html(trace)
        parts.append(diagram)
    if "lifetimes" in views:
        parts.append(f'<div class="tnb-h">lifetimes</div>{render.lifetime_svg(trace)}')
    if "source" in views:
        parts.append(f'<div class="tnb-h">generated code</div>{render.trace_source_html(trace)}')
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
    from . import render

    views = tuple(v for v in views if v in SIDE_VIEWS)
    title = title or f"{report.function} (transform: {report.transform})"
    parts = [f'<div class="thunder-nb tnb-pane">{_CSS}<div class="tnb-h">{_esc(title)}</div>']
    if report.error:
        parts.append(f'<div class="tnb-error">error: {_esc(report.error)}</div>')
    parts += [f"<div>note: {_esc(n)}</div>" for n in report.notes]
    all_drawn = True
    for trace in report.traces:
        body, drawn = _trace_html(trace, views)
        all_drawn = all_drawn and drawn
        parts.append(body)
    if not all_drawn:
        parts.append(f'<div class="tnb-h">text view</div><pre class="tnb-text">{_esc(render.report_text(report))}</pre>')
    parts.append("</div>")
    return "".join(parts)


def toggle(original_html: str, fixed_html: str, labels: Sequence[str] = ("original", "fixed")) -> ipywidgets.VBox:
    """Build buttons that switch between two prepared HTML views, in the browser.

    The buttons' ``index`` is `jslink`-ed to a `Stack`'s ``selected_index``, so switching needs no
    kernel: it works in a live notebook, in Voila and in an exported HTML page with widget state.

    Args:
        original_html, fixed_html: the two panes (HTML fragments, e.g. from `side_html`).
        labels: the two buttons' labels.

    Returns:
        A ``VBox`` of the ``ToggleButtons`` and the ``Stack``; the first pane is shown.
    """
    import ipywidgets as widgets

    if len(labels) != 2:
        raise ValueError(f"toggle needs two labels, not {len(labels)}: {list(labels)}")
    buttons = widgets.ToggleButtons(options=list(labels), index=0, description="")
    panes = [widgets.HTML(value=original_html), widgets.HTML(value=fixed_html)]
    stack = widgets.Stack(children=panes, selected_index=0)
    link = widgets.jslink((buttons, "index"), (stack, "selected_index"))
    box = widgets.VBox([buttons, stack])
    # NOTE: hold the link with the box so the browser-side link lives as long as the view
    box._thunder_nb_link = link
    return box


def comparison_toggle(comparison: Comparison, views: Iterable[str] = SIDE_VIEWS) -> ipywidgets.VBox:
    """Build the original/fixed `toggle` of a `Comparison` (each pane: diagram, lifetimes, source)."""
    views = tuple(views)
    label = f"original ({comparison.original_kind})"
    return toggle(
        side_html(comparison.original, views, title=f"{comparison.function}: {label}"),
        side_html(comparison.fixed, views, title=f"{comparison.function}: fixed"),
        labels=(label, "fixed"),
    )
