"""Draw the model (`thunder_nb.diagnosis.model`) as diagrams, lifetimes, source views, text and HTML; never imports thunder."""

from __future__ import annotations

from ..diagnosis import model as _model
from . import backend, common, dot, html, lifetimes, memory, source, text
from .backend import DiagramWarning, svg
from .dot import COLLAPSE_THRESHOLD, region_diagram
from .html import report_html, report_mimebundle, side_by_side_html
from .lifetimes import MAX_ROWS, lifetime_svg, lifetime_text
from .source import source_html, source_text, trace_source_html, trace_source_text
from .text import report_text

_model.VIEWS.update(text=report_text, mimebundle=report_mimebundle)

__all__ = [
    "COLLAPSE_THRESHOLD",
    "MAX_ROWS",
    "DiagramWarning",
    "region_diagram",
    "svg",
    "lifetime_text",
    "lifetime_svg",
    "source_text",
    "source_html",
    "trace_source_text",
    "trace_source_html",
    "report_text",
    "report_html",
    "report_mimebundle",
    "side_by_side_html",
    "backend",
    "common",
    "dot",
    "html",
    "lifetimes",
    "memory",
    "source",
    "text",
]
