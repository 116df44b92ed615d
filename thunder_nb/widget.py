"""Prepared views of a comparison as ipywidgets that switch in the browser (so they work in a static export).

Every view is rendered to HTML up front; the widgets only choose which one is shown, through a
browser-side link (`ipywidgets.jslink`) between the buttons and a `Stack`. There is no kernel-side
callback, so an exported HTML page with the saved widget state switches exactly like a live notebook.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from .model import Report

if TYPE_CHECKING:  # NOTE: ipywidgets is imported only when a widget is built
    import ipywidgets

    from .compare import Comparison

__all__ = ["VIEWS", "SIDE_VIEWS", "parse_views", "side_html", "toggle", "comparison_toggle"]

#: Every view the magic can show, in display order.
VIEWS = ("diagram", "lifetimes", "source", "run")
#: The views drawn for each side (original, fixed) of the toggle.
SIDE_VIEWS = ("diagram", "lifetimes", "source")

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


def side_html(report: Report, views: Iterable[str] = SIDE_VIEWS, *, title: str | None = None) -> str:
    """Render one side of a comparison (see `thunder_nb.render.html.side_html`)."""
    from .render import html

    return html.side_html(report, views, title=title)


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
