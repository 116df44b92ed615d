"""A trace's tables in HTML: its memory plan (`memory_html`) and its defects, one row per rule (`defects_html`)."""

from __future__ import annotations

from collections.abc import Sequence

from ..diagnosis.model import TraceReport
from .common import esc
from .memory import known, region_memory

__all__ = ["MEMORY_NAMES", "DEFECTS_LISTED", "memory_html", "defects_html"]

#: Names a memory-plan row lists before the rest fold away ("+73 more").
MEMORY_NAMES = 4
#: How many of a rule's other defects its row lists under "+N more" (the count is always whole).
DEFECTS_LISTED = 30


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

