"""Defects in the diagram: the red marks on the nodes they are anchored to, and the legend that explains them."""

from __future__ import annotations

import textwrap
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..diagnosis.model import RULES, Defect, TraceReport
from .common import DEFECT_COLOR, WRONG_COLOR, count_phrases, severity_counts
from .dot_syntax import dot_text, tip_lines

__all__ = ["Mark", "draw_legend"]

if TYPE_CHECKING:
    import graphviz

_LEGEND_WIDTH = 52  # NOTE: characters per legend line: a wide legend makes the whole diagram wide


@dataclass(slots=True)
class Mark:
    """Defects anchored on one node."""

    rules: list[str]
    tips: list[str]
    wrong: list[str]  # the rules whose severity is "wrong result" or "crashes the process" (drawn heavier)

    def attrs(self, tips: Sequence[str] = ()) -> dict[str, str]:
        """Red node attributes (crimson for a wrong result); the tooltip lists ``tips``, then the defects."""
        color = WRONG_COLOR if self.wrong else DEFECT_COLOR
        return {"color": color, "fontcolor": color, "penwidth": "3" if self.wrong else "2",
                "tooltip": dot_text(*tip_lines([*tips, *self.tips]))}

    def label_lines(self) -> list[str]:
        """One line per rule (narrow nodes); wrong results first, under their own heading."""
        wrong = list(dict.fromkeys(self.wrong))
        rest = [r for r in dict.fromkeys(self.rules) if r not in wrong]
        return (["⚠ WRONG RESULT:", *wrong] if wrong else []) + [f"⚠ {r}" for r in rest]


def draw_legend(g: graphviz.Digraph, trace: TraceReport, keys: set[str], lost: Sequence[Defect]) -> None:
    """Add the legend under the drawing: defects by rule, those with no place in it, the marks used (``keys``)."""
    defects = trace.defects
    lines = ["legend"]
    crash, wrong, _, _ = severity_counts(defects)
    if defects:
        counts = Counter(d.rule for d in defects)
        lines.append("defects: " + ", ".join(count_phrases(defects)))
        for rule in RULES:
            if rule in counts:
                lines += _wrap(f"{rule} ×{counts[rule]}: {RULES[rule]}", "  ")
    for d in lost:
        lines += _wrap(f"{d.rule} at {d.where()}: {d.message}", "  ")
    if defects:
        lines.append("red: defect" + ("; crimson: wrong result" if wrong else "")
                     + ("; crimson: crashes the process" if crash else ""))
    if "number" in keys:
        lines.append("dashed orange edge: Python number")
    if "hand-off" in keys:
        lines.append("blue edge: scalar hand-off")
    if "collective" in keys:
        lines += _wrap("arrow box: a collective or its wait, outside the graphs (each rank launches and waits for it "
                       "itself, in the same order)", "")
    if "unfused" in keys:
        lines += _wrap("dashed box: an unfused op (no region took it; not an island)", "")
    if "fusion" in keys:
        lines += _wrap("double box: ops a fusion executor compiles together (its kernels: the count inductor gave, "
                       "or the executor decides)", "")
    if len(lines) == 1:
        return  # NOTE: nothing to explain (a region's colour is said in its label too: captured, eager, not run, ...)
    attrs = {"fontsize": "9", "shape": "note"}
    if defects:
        attrs.update(color=WRONG_COLOR if wrong or crash else DEFECT_COLOR)
    # NOTE: on the last rank, under the drawing: beside the inputs it would widen the diagram
    with g.subgraph(name="legend") as sub:
        sub.attr(rank="sink")
        sub.node("_legend", dot_text(*lines, sep=r"\l", end=r"\l"), **attrs)


def _wrap(text: str, indent: str) -> list[str]:
    """Wrap a legend line at `_LEGEND_WIDTH` characters, continuation lines indented further."""
    return textwrap.wrap(text, _LEGEND_WIDTH, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_on_hyphens=False)
