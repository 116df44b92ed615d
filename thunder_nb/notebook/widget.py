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

__all__ = ["TOGGLE_CLASS", "VIEWS", "SIDE_VIEWS", "parse_views", "side_html", "static_html", "fallback_class",
           "hide_fallback_css", "toggle", "comparison_toggle"]

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


def static_html(original_html: str, fixed_html: str, labels: Sequence[str] = ("original", "fixed"), *,
                hidden_by: str | None = None) -> str:
    """The toggle without JavaScript: the fixed pane shown, the original in a ``<details>`` below it.

    This is what a page without the widget's JavaScript shows (GitHub, nbviewer, nbconvert's HTML with JavaScript off,
    ``nbconvert --to markdown``), and what JupyterLab shows of a stored notebook that is not trusted: the panes' SVG
    pictures become ``<img>`` elements (`svgs_to_imgs`), which its sanitizer lets through where it removes inline SVG.

    Args:
        hidden_by: the model id of the toggle this stands in for: the fallback gets the class `fallback_class` of it,
            which the toggle's panes hide (`hide_fallback_css`) wherever the widget is drawn.
    """
    from ..render.backend import svgs_to_imgs
    from ..render.common import esc
    from ..render.html import CSS

    cls = f" {fallback_class(hidden_by)}" if hidden_by else ""
    return svgs_to_imgs(
        f'<div class="thunder-nb tnb-static{cls}">{CSS}{fixed_html}'
        f"<details><summary>{esc(labels[0])}</summary>{original_html}</details></div>"
    )


def fallback_class(model_id: str) -> str:
    """The class of the static fallback that stands in for the toggle whose model id is ``model_id``."""
    return f"tnb-fallback-{model_id}"


def hide_fallback_css(model_id: str) -> str:
    """A ``<style>`` that hides the static fallback of toggle ``model_id``, with the output (JupyterLab, Notebook 7,
    Voila, nbconvert's pages; classic Notebook) that holds it.

    It sits in the toggle's panes, so it is in the page only where the widget manager drew the toggle: a page without
    JavaScript, an untrusted notebook or a toggle whose model is gone never has it, and shows the fallback.
    """
    cls = fallback_class(model_id)
    return (f"<style>.{cls},.jp-OutputArea-child:has(.{cls}),.output_area:has(.{cls})"
            "{display:none!important}</style>")


@functools.cache
def _toggle_box() -> type:
    """`ToggleBox`, made on first use so that importing this module needs no ipywidgets."""
    import ipywidgets as widgets

    class ToggleBox(widgets.VBox):
        """A ``VBox`` (same model) whose display is two outputs: the live widget, and its static HTML fallback.

        The first output holds ``application/vnd.jupyter.widget-view+json`` and a ``text/plain`` line; the second
        ``text/html`` (`static_html`), which the widget's panes hide where the widget is drawn (`hide_fallback_css`).
        nbconvert's HTML of a notebook with widget state writes only the widget view of an output that has one, and
        JupyterLab shows an untrusted notebook's widget output as its text: the fallback beside the view would be lost
        in both, so it is an output of its own.
        """

        def __init__(self, children, *, static: str, text: str, **kwargs):
            super().__init__(children, **kwargs)
            self._thunder_nb_static, self._thunder_nb_text = static, text

        def _repr_mimebundle_(self, **kwargs):
            data = super()._repr_mimebundle_(**kwargs) or {}
            data["text/plain"] = self._thunder_nb_text
            return data

        def fallback_mimebundle(self) -> dict[str, str]:
            """The second output: the static fallback (`static_html`), hidden where the widget is drawn."""
            return {"text/html": self._thunder_nb_static}

        def _ipython_display_(self):
            from IPython.display import display

            display(self._repr_mimebundle_(), raw=True)
            display(self.fallback_mimebundle(), raw=True)

    return ToggleBox


def toggle(original_html: str, fixed_html: str, labels: Sequence[str] = ("original", "fixed"), *,
           text: str | None = None) -> ipywidgets.VBox:
    """Build buttons that switch between two prepared HTML views, in the browser; the second view shows first.

    The buttons' ``index`` is `jslink`-ed to a `Stack`'s ``selected_index``, so switching needs no
    kernel: it works in a live notebook, in Voila and in an exported HTML page with widget state.
    Displayed, the box is two outputs: the widget (with ``text`` as its ``text/plain``) and `static_html` of both
    views, an output of its own that the widget's panes hide wherever the widget is drawn.

    Args:
        original_html, fixed_html: the two panes (HTML fragments, e.g. from `side_html`).
        labels: the two buttons' labels.
        text: the ``text/plain`` form of the widget's output (default: ``toggle: original | fixed``).

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
    box = _toggle_box()([buttons, stack], static="", text=text or f"toggle: {labels[0]} | {labels[1]}")
    # NOTE: the fallback is named after the box's model, and each pane (the Stack may draw only the one it shows)
    # carries the style that hides it
    box._thunder_nb_static = static_html(original_html, fixed_html, labels, hidden_by=box.model_id)
    hide = hide_fallback_css(box.model_id)
    for pane, html in zip(panes, (original_html, fixed_html)):
        pane.value = hide + html
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
    )
