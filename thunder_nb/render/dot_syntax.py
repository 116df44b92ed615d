"""DOT's small print: labels shown literally, tooltips of bounded size, node ids that are safe to write."""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["dot_text", "tip_lines", "node_id"]

_DOT_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DOT_KEYWORDS = frozenset({"node", "edge", "graph", "digraph", "subgraph", "strict"})


def dot_text(*lines: str, sep: str = r"\n", end: str = "") -> str:
    """Return a DOT escString showing ``lines`` literally (backslashes, ``<...>``, quotes, newlines)."""
    import graphviz  # NOTE: here, not at the top: importing thunder_nb needs no Graphviz package

    # NOTE: graphviz.escape doubles backslashes; nohtml keeps a label like "<script>" from reading as HTML-like
    parts = [graphviz.escape(p) for line in lines for p in str(line).split("\n")]
    return graphviz.nohtml(sep.join(parts) + end)


_TIP_LINES, _TIP_WIDTH = 16, 400  # NOTE: a tooltip listing a model's 187 outputs made one node 8 KB of SVG


def tip_lines(lines: Sequence[str]) -> list[str]:
    """At most `_TIP_LINES` tooltip lines of at most `_TIP_WIDTH` characters, then ``… N more``."""
    out = [line if len(line) <= _TIP_WIDTH else line[: _TIP_WIDTH - 1] + "…" for line in lines[:_TIP_LINES]]
    return out + ([f"… {len(lines) - _TIP_LINES} more"] if len(lines) > _TIP_LINES else [])


def node_id(*parts: str) -> str:
    """Return a DOT-safe node id: thunder's own name when it is an identifier, else a stable hex form."""
    name = "_".join(parts)
    # NOTE: graphviz would quote other names, but ``a:b`` still reads as a port and ``<...>`` as HTML
    if _DOT_ID.fullmatch(name) and name.lower() not in _DOT_KEYWORDS:
        return name
    return "id_" + name.encode("utf-8").hex()
