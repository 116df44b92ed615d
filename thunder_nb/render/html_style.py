"""The style of every HTML view (`CSS`; `style_for` adds what a fragment's diagrams need) and the measures it is written
for: a notebook's column, the room a diagram may take, the smallest text."""

from __future__ import annotations

import re

__all__ = ["CSS", "style_for", "FIT", "COLUMN", "MIN_TEXT_PX"]

#: (width, height) in px a diagram may take in a default view before its regions are collapsed.
FIT = (880, 900)
#: A notebook's column width in px (JupyterLab at a 1,280-px window); no view is wider than two of them.
COLUMN = 1040
#: The smallest text in px any view shows at `COLUMN` width. A diagram fitted to a narrower column may go below it: a
#: line under it says so, and a click shows it at full size (`thunder_nb.render.html_diagram.box`).
MIN_TEXT_PX = 11

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
    shows that diagram's line "shrunk to fit the column: click …" (`box`) in a column narrower than that."""
    widths = sorted({int(w) for w in _HINT.findall(body)})
    rules = "".join(f"@container (max-width:{w - 1}px){{.thunder-nb .tnb-hint-{w}{{display:block!important}}}}\n"
                    for w in widths)
    return CSS.replace("</style>", rules + "</style>") if rules else CSS

