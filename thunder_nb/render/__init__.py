"""Draw the analysis model: region diagrams (DOT, then SVG by ``dot``), lifetimes, source views, text and HTML.

Every view is a pure function of the frozen records of `thunder_nb.model`: nothing here displays
anything or imports thunder. Submodules: `dot` (DOT building), `backend` (the ``dot`` binary),
`lifetimes`, `source`, `text` (the text report), `html` (HTML views and their CSS).
"""

from __future__ import annotations

from . import backend, common, dot, html, lifetimes, source, text
from .backend import DiagramWarning, svg
from .dot import COLLAPSE_THRESHOLD, region_diagram
from .html import report_html, report_mimebundle, side_by_side_html
from .lifetimes import MAX_ROWS, lifetime_svg, lifetime_text
from .source import source_html, source_text, trace_source_html, trace_source_text
from .text import report_text

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
    "source",
    "text",
]
