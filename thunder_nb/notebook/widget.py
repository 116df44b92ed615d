"""The original/fixed toggle: HTML panes switched in the browser (so exported pages switch too), with a static
fallback."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from ..render.html import SIDE_VIEWS, side_html

if TYPE_CHECKING:  # NOTE: ipywidgets is imported only when a widget is built
    import ipywidgets

    from .comparison import Comparison

__all__ = ["TOGGLE_CLASS", "VIEWS", "SIDE_VIEWS", "parse_views", "side_html", "static_html", "toggle", "comparison_toggle"]

#: The toggle box's class (`thunder_nb.render.html.CSS` styles it).
TOGGLE_CLASS = "thunder-nb-toggle"
#: Every view the magic can show, in display order.
VIEWS = ("diagram", "lifetimes", "source", "run")


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


def static_html(original_html: str, fixed_html: str, labels: Sequence[str] = ("original", "fixed")) -> str:
    """The toggle without JavaScript: the fixed pane shown, the original in a ``<details>`` below it.

    This is what a page without the widget's JavaScript shows (GitHub, nbviewer without JavaScript,
    ``nbconvert --to markdown``, a notebook opened after its kernel is gone), and what JupyterLab shows of a stored
    notebook that is not trusted: the panes' SVG pictures become ``<img>`` elements (`svgs_to_imgs`), which its
    sanitizer lets through where it removes inline SVG.
    """
    from ..render.backend import svgs_to_imgs
    from ..render.common import esc
    from ..render.html import CSS

    return svgs_to_imgs(
        f'<div class="thunder-nb tnb-static">{CSS}{fixed_html}'
        f"<details><summary>{esc(labels[0])}</summary>{original_html}</details></div>"
    )


@functools.cache
def _toggle_box() -> type:
    """`ToggleBox`, made on first use so that importing this module needs no ipywidgets."""
    import ipywidgets as widgets

    class ToggleBox(widgets.VBox):
        """A ``VBox`` (same model) whose display also carries a static HTML fallback and a text line.

        One output holds ``application/vnd.jupyter.widget-view+json`` (the live widget), ``text/html``
        (`static_html`) and ``text/plain``: each frontend picks what it can show.
        """

        def __init__(self, children, *, static: str, text: str, **kwargs):
            super().__init__(children, **kwargs)
            self._thunder_nb_static, self._thunder_nb_text = static, text

        def _repr_mimebundle_(self, **kwargs):
            data = super()._repr_mimebundle_(**kwargs) or {}
            data["text/plain"] = self._thunder_nb_text
            data["text/html"] = self._thunder_nb_static
            return data

    return ToggleBox


def toggle(original_html: str, fixed_html: str, labels: Sequence[str] = ("original", "fixed"), *,
           text: str | None = None) -> ipywidgets.VBox:
    """Build buttons that switch between two prepared HTML views, in the browser; the second view shows first.

    The buttons' ``index`` is `jslink`-ed to a `Stack`'s ``selected_index``, so switching needs no
    kernel: it works in a live notebook, in Voila and in an exported HTML page with widget state.
    Displayed, the box also carries `static_html` of both views and ``text`` for frontends that
    cannot run the widget.

    Args:
        original_html, fixed_html: the two panes (HTML fragments, e.g. from `side_html`).
        labels: the two buttons' labels.
        text: the ``text/plain`` form (default: the labels).

    Returns:
        A ``VBox`` of the ``ToggleButtons`` and the ``Stack``, showing the fixed pane.
    """
    import ipywidgets as widgets

    if len(labels) != 2:
        raise ValueError(f"toggle needs two labels, not {len(labels)}: {list(labels)}")
    buttons = widgets.ToggleButtons(options=list(labels), index=1, description="")
    panes = [widgets.HTML(value=original_html), widgets.HTML(value=fixed_html)]
    stack = widgets.Stack(children=panes, selected_index=1)
    link = widgets.jslink((buttons, "index"), (stack, "selected_index"))
    box = _toggle_box()([buttons, stack], static=static_html(original_html, fixed_html, labels),
                        text=text or f"{labels[1]} | {labels[0]}")
    # NOTE: `CSS` hides ipywidgets' broken-link mark (.jupyter-widgets-disconnected) inside this class: a stored toggle
    # switches without a kernel (jslink), so "disconnected" is no fault of it
    box.add_class(TOGGLE_CLASS)
    # NOTE: hold the link with the box so the browser-side link lives as long as the view
    box._thunder_nb_link = link
    return box


def comparison_toggle(comparison: Comparison, views: Iterable[str] = SIDE_VIEWS) -> ipywidgets.VBox:
    """Build the original/fixed `toggle` of a `Comparison` (panes: diagram, lifetimes, source), on the fixed side."""
    views = tuple(views)
    label = f"original ({comparison.original_kind})"
    return toggle(
        side_html(comparison.original, views, title=f"{comparison.function}: {label}"),
        side_html(comparison.fixed, views, title=f"{comparison.function}: fixed"),
        labels=(label, "fixed"),
        text=comparison.verdict(),
    )
