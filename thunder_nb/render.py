"""Draw the analysis model: region/island diagrams (DOT), lifetimes, source views, text and HTML reports.

Every view is a pure function of the frozen model objects in `thunder_nb.model`: nothing here calls
``display()`` or imports thunder. Output is deterministic (thunder's names as node ids, attributes
sorted) so that DOT and text can be tested exactly; every label is escaped for DOT, HTML and SVG.
"""

from __future__ import annotations

import html
import re
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import graphviz

from .model import ISLAND_REASONS, RULES, Defect, Island, Op, Region, Report, Site, SourceLine, TraceReport, Value

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
]

#: Above this many ops (region ops plus top-level statements), `region_diagram` collapses regions.
COLLAPSE_THRESHOLD = 150
#: Most value rows a lifetime view shows; the rest are summarised in a note.
MAX_ROWS = 200

_EDGE_GROUP = 4  # NOTE: more values than this between two nodes are drawn as one summary edge
_TEXT_BAR_WIDTH = 64
_BOOKKEEPING = ("bookkeeping", "collection")
_MERGEABLE = ("bookkeeping", "collection", "single", "other")
_STATE = {True: "captured", False: "eager", None: "not run"}
_STATE_FILL = {True: "#d3f9d8", False: "#ffe8cc", None: "#f1f3f5"}
_ISLAND_FILL = {"host-sync": "#fff3bf", "device-transfer": "#ffd8a8", "cpu-op": "#ffc9c9"}
_REGION_COLORS = ("#d0ebff", "#d3f9d8", "#e5dbff", "#fff3bf", "#ffe3e3", "#c3fae8", "#ffe8cc", "#f3d9fa")
_DEFECT_COLOR = "#e03131"
_SCALAR_COLOR = "#e8590c"
_HANDOFF_COLOR = "#1971c2"
_TIMING = re.compile(r"\s*\(took \d+ milliseconds\)")
_DOT_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DOT_KEYWORDS = frozenset({"node", "edge", "graph", "digraph", "subgraph", "strict"})


class DiagramWarning(UserWarning):
    """A diagram could not be drawn as intended (e.g. Graphviz's ``dot`` is missing)."""


# ---------------------------------------------------------------------------------------------------
# Shared helpers


def _dot_text(*lines: str, sep: str = r"\n", end: str = "") -> str:
    """Return a DOT escString showing ``lines`` literally (backslashes, ``<...>``, quotes, newlines)."""
    parts = [p.replace("\\", "\\\\") for line in lines for p in str(line).split("\n")]
    # NOTE: nohtml keeps graphviz from reading a label like "<script>" as an HTML-like label
    return graphviz.nohtml(sep.join(parts) + end)


def _node_id(*parts: str) -> str:
    """Return a DOT-safe node id: thunder's own name when it is an identifier, else a stable hex form."""
    name = "_".join(parts)
    # NOTE: graphviz would quote other names, but ``a:b`` still reads as a port and ``<...>`` as HTML
    if _DOT_ID.fullmatch(name) and name.lower() not in _DOT_KEYWORDS:
        return name
    return "id_" + name.encode("utf-8").hex()


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _type_label(v: Value | None) -> str:
    if v is None or (v.type.kind == "other" and not v.type.text):
        return ""
    return v.type.short()


def _state(region: Region) -> str:
    return _STATE.get(region.captured, "not run")


def _plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word if n == 1 else (plural or word + 's')}"


def _bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    size, unit = float(n), "B"
    for unit in ("KiB", "MiB", "GiB"):
        size /= 1024
        if size < 1024:
            break
    return f"{size:.1f} {unit}"


def _provenance(trace: TraceReport) -> str:
    # NOTE: thunder's provenance carries the pass's run time; drop it so that output is deterministic
    return _TIMING.sub("", trace.provenance).strip()


def _values(trace: TraceReport) -> dict[str, Value]:
    return {v.name: v for v in trace.values}


def _handoffs(region: Region) -> list[tuple[str, str]]:
    """The (number, tensor) pairs of the region's hand-offs to a 0-d tensor of the trace."""
    return [(h.number, h.tensor) for h in region.scalar_handoffs if h.tensor]


def _op_count(trace: TraceReport) -> int:
    """Ops a full diagram would draw: every region's calls plus top-level statements that are not dels."""
    region_positions = {r.position for r in trace.regions}
    top = sum(1 for p, o in enumerate(trace.ops) if o.kind != "del" and p not in region_positions)
    return top + sum(len(r.compute_ops) for r in trace.regions)


def _defect_user_line(trace: TraceReport, d: Defect) -> SourceLine | None:
    ops = trace.region(d.region).ops if d.region is not None and _has_region(trace, d.region) else trace.ops
    return next((o.user_line for o in ops if o.line == d.line and o.user_line), None)


def _has_region(trace: TraceReport, name: str) -> bool:
    return any(r.name == name for r in trace.regions)


def _verdict(defects: Sequence[Defect]) -> str:
    errors = sum(1 for d in defects if d.is_error)
    warns = len(defects) - errors
    if errors:
        return f"fails or computes wrong values ({_plural(errors, 'error')}, {_plural(warns, 'warning')})"
    if warns:
        return f"runs, but wastes time or memory ({_plural(warns, 'warning')})"
    return "no defects found"


# ---------------------------------------------------------------------------------------------------
# Region/island diagram


@dataclass(slots=True)
class _Mark:
    """Defects anchored on one node."""

    rules: list[str]
    tips: list[str]

    def attrs(self, tips: Sequence[str] = ()) -> dict[str, str]:
        """Red node attributes; the tooltip lists ``tips`` (the node's own), then the defects."""
        return {
            "color": _DEFECT_COLOR,
            "fontcolor": _DEFECT_COLOR,
            "penwidth": "2",
            "tooltip": _dot_text(*tips, *self.tips),
        }

    def label_line(self) -> str:
        rules = list(dict.fromkeys(self.rules))
        return "⚠ " + ", ".join(rules)


class _DiagramBuilder:
    """Build one trace's diagram; holds the node each top-level statement and value maps to."""

    def __init__(self, trace: TraceReport, full: set[str], merge_islands: bool) -> None:
        self.trace = trace
        self.full = full
        self.values = _values(trace)
        self.regions = {r.position: r for r in trace.regions if r.position >= 0}
        self.islands = {i.position: i for i in trace.islands}
        self.island_node: dict[int, str] = {}
        self.island_groups: list[list[Island]] = self._group_islands(merge_islands)
        self.marks: dict[str, _Mark] = {}
        self.region_marks: dict[str, _Mark] = {}  # defects of a full region with no better anchor

    # -- layout of the top level

    def _group_islands(self, merge: bool) -> list[list[Island]]:
        """Group runs of adjacent bookkeeping (or unfused) islands into one node each when merging."""
        groups: list[list[Island]] = []
        prev_key = None
        for pos in sorted(set(self.regions) | set(self.islands)):
            isl = self.islands.get(pos)
            key = None
            if isl is not None and merge and isl.reason in _MERGEABLE:
                key = (isl.reason, isl.detail if isl.reason == "bookkeeping" else "")
            if isl is not None and key is not None and key == prev_key:
                groups[-1].append(isl)
            elif isl is not None:
                groups.append([isl])
            prev_key = key
        for g in groups:
            for isl in g:
                self.island_node[isl.position] = _node_id(g[0].name)
        return groups

    def producer(self, v: Value) -> str | None:
        """The node a value leaves from at top level."""
        if v.defined is None:
            return _node_id(v.name)
        region = self.regions.get(v.defined.position)
        if region is not None:
            if region.name in self.full:
                return _node_id(region.name, "out", v.name) if v.name in region.outputs else None
            return _node_id(region.name)
        return self.island_node.get(v.defined.position)

    def consumer(self, v: Value, site: Site) -> str | None:
        """The node a top-level use of a value enters."""
        region = self.regions.get(site.position)
        if region is not None:
            if region.name in self.full:
                return _node_id(region.name, "in", v.name)
            return _node_id(region.name)
        return self.island_node.get(site.position)

    # -- defects

    def anchor(self, d: Defect) -> tuple[str | None, str | None]:
        """Return (node id, full region name) where a defect is drawn; node None means the region's cluster."""
        t = self.trace
        if d.region is not None and _has_region(t, d.region):
            r = t.region(d.region)
            if r.name not in self.full:
                return _node_id(r.name), None
            if d.value in r.inputs and d.rule != "region-deletes-output":
                return _node_id(r.name, "in", d.value), None
            if d.value in r.outputs and d.rule in ("region-deletes-output", "double-del"):
                return _node_id(r.name, "out", d.value), None
            op = next((o for o in r.compute_ops if o.line == d.line), None)
            if op is None and d.value is not None:
                op = next((o for o in r.compute_ops if d.value in o.outputs), None)
            if op is not None:
                return _op_node(r, op), None
            return None, r.name
        pos = next((p for p, o in enumerate(t.ops) if o.line == d.line and o.kind != "del"), None)
        if pos is None and d.value in self.values:
            v = self.values[d.value]
            return self.producer(v), None
        if pos is None:
            return None, None
        region = self.regions.get(pos)
        if region is not None and region.name in self.full:
            if d.value in region.outputs:
                return _node_id(region.name, "out", d.value), None
            return None, region.name
        if region is not None:
            return _node_id(region.name), None
        return self.island_node.get(pos), None

    def place_defects(self) -> list[Defect]:
        """Anchor every defect; return those with no place in the drawing (listed in the legend only)."""
        lost = []
        for d in self.trace.defects:
            node, region = self.anchor(d)
            tip = f"{d.rule} ({d.where()}): {d.message}"
            if node is not None:
                m = self.marks.setdefault(node, _Mark([], []))
            elif region is not None:
                m = self.region_marks.setdefault(region, _Mark([], []))
            else:
                lost.append(d)
                continue
            m.rules.append(d.rule)
            m.tips.append(tip)
        return lost

    def node(self, g: graphviz.Digraph, nid: str, lines: Sequence[str], tips: Sequence[str],
             attrs: dict[str, str]) -> None:
        """Draw a node; a node with defects turns red and lists them in its label and tooltip."""
        mark = self.marks.get(nid)
        if mark is not None:
            lines = [*lines, mark.label_line()]
            attrs = {**attrs, **mark.attrs(tips)}
        else:
            attrs = {**attrs, "tooltip": _dot_text(*tips)}
        g.node(nid, _dot_text(*lines), **attrs)

    # -- drawing

    def draw_inputs(self, g: graphviz.Digraph) -> None:
        names = list(self.trace.params)
        for v in self.trace.values:
            if v.defined is None and v.name not in names and any(s.region is None for s in v.uses):
                names.append(v.name)
        with g.subgraph(name="inputs") as sub:
            sub.attr(rank="source")
            for name in names:
                v = self.values.get(name)
                lines = [name] + ([_type_label(v)] if _type_label(v) else [])
                self.node(sub, _node_id(name), lines, [f"input {name}"], {"shape": "ellipse"})

    def draw_island_group(self, g: graphviz.Digraph, group: list[Island]) -> None:
        first = group[0]
        nid = _node_id(first.name)
        tips = [f"{i.name}: {i.op.text}" for i in group[:20]]
        if len(group) > 20:
            tips.append(f"… {len(group) - 20} more")
        if first.reason in _BOOKKEEPING:
            head = first.detail if first.reason == "bookkeeping" else "clear " + first.detail
            if len(group) > 1:
                head = ("clear" if first.reason == "collection" else first.detail) + f" ×{len(group)}"
            attrs = {"color": "#adb5bd", "fontcolor": "#868e96", "fontsize": "8", "height": "0.2",
                     "margin": "0.04,0.02", "shape": "box", "style": "rounded"}
            self.node(g, nid, [head], tips, attrs)
            return
        if len(group) > 1:
            reason = ISLAND_REASONS.get(first.reason, first.reason)
            lines = [f"{first.name} … {group[-1].name}", f"{reason} ×{len(group)}"]
        else:
            lines = [first.name, first.label]
        attrs = {"fillcolor": _ISLAND_FILL.get(first.reason, "white"), "shape": "box", "style": "rounded,filled"}
        self.node(g, nid, lines, tips, attrs)

    def region_summary(self, r: Region) -> list[str]:
        lines = [r.name, f"{_plural(len(r.compute_ops), 'op')} · {_state(r)}",
                 f"in {len(r.inputs)} · out {len(r.outputs)}"]
        counts = Counter(o.callee for o in r.compute_ops)
        if counts:
            top = [f"{c} ×{n}" if n > 1 else c for c, n in counts.most_common(3)]
            lines.append(", ".join(top) + (f", +{len(counts) - 3} more" if len(counts) > 3 else ""))
        if r.graphs:
            lines.append(_plural(len(r.graphs), "graph"))
        if r.scalar_handoffs:
            lines.append("hand-offs: " + ", ".join(map(str, r.scalar_handoffs)))
        return lines

    def draw_collapsed(self, g: graphviz.Digraph, r: Region) -> None:
        attrs = {"fillcolor": _STATE_FILL.get(r.captured, "white"), "shape": "box3d", "style": "filled"}
        self.node(g, _node_id(r.name), self.region_summary(r), [f"{r.name}: {_state(r)}"], attrs)

    def draw_full(self, g: graphviz.Digraph, r: Region) -> None:
        handoff_names = {n for pair in _handoffs(r) for n in pair}
        with g.subgraph(name=_node_id("cluster", r.name)) as c:
            label = [f"{r.name} · {_plural(len(r.compute_ops), 'op')} · {_state(r)}"]
            if r.scalar_handoffs:
                label.append("hand-offs: " + ", ".join(map(str, r.scalar_handoffs)))
            cattrs = {"fillcolor": _STATE_FILL.get(r.captured, "white"), "style": "filled,rounded",
                      "tooltip": _dot_text(f"{r.name}: {_state(r)}")}
            mark = self.region_marks.get(r.name)
            if mark is not None:
                label.append(mark.label_line())
                cattrs.update(mark.attrs([f"{r.name}: {_state(r)}"]))
            c.attr(label=_dot_text(*label), **cattrs)
            with c.subgraph() as ins:
                ins.attr(rank="same")
                for k, name in enumerate(r.inputs):
                    v = self.values.get(name)
                    static = k < len(r.static_mask) and r.static_mask[k]
                    lines = [name] + (["static"] if static else [])
                    attrs = {"fontsize": "9", "height": "0.25", "shape": "invhouse"}
                    if v is not None and v.is_scalar:
                        attrs.update(color=_SCALAR_COLOR, fontcolor=_SCALAR_COLOR)
                        lines.append("Python number")
                    if name in handoff_names:
                        attrs.update(color=_HANDOFF_COLOR, fontcolor=_HANDOFF_COLOR, penwidth="2")
                    tip = f"{r.name} input {name} {_type_label(v)}".rstrip()
                    self.node(ins, _node_id(r.name, "in", name), lines, [tip], attrs)
            producers = {n: _node_id(r.name, "in", n) for n in r.inputs}
            for op in r.compute_ops:
                nid = _op_node(r, op)
                head = f"{', '.join(op.outputs)} = {op.callee}" if op.outputs else op.callee
                self.node(c, nid, [head], [op.text], {"fillcolor": "white", "shape": "box", "style": "filled"})
                for n in op.inputs:
                    if n in producers:
                        self.edge(c, producers[n], nid, [n])
                for n in op.outputs:
                    producers[n] = nid
            with c.subgraph() as outs:
                outs.attr(rank="same")
                for name in r.outputs:
                    v = self.values.get(name)
                    tip = f"{r.name} output {name} {_type_label(v)}".rstrip()
                    self.node(outs, _node_id(r.name, "out", name), [name], [tip],
                              {"fontsize": "9", "height": "0.25", "shape": "house"})
            for name in r.outputs:
                if name in producers:
                    self.edge(c, producers[name], _node_id(r.name, "out", name), [name])

    def edge(self, g: graphviz.Digraph, src: str, dst: str, names: Sequence[str], handoff: str | None = None) -> None:
        """Draw the values ``names`` flowing from ``src`` to ``dst`` (one summary edge for many)."""
        vals = [self.values.get(n) for n in names]
        if len(names) == 1:
            v = vals[0]
            label = [names[0]] + ([_type_label(v)] if _type_label(v) else [])
            attrs = {"fontsize": "9", "tooltip": _dot_text(" ".join(label))}
            if v is not None and v.is_scalar:
                label.append("Python number")
                attrs.update(color=_SCALAR_COLOR, fontcolor=_SCALAR_COLOR, style="dashed")
            if handoff:
                label.append(f"hand-off {handoff}")
                attrs.update(color=_HANDOFF_COLOR, fontcolor=_HANDOFF_COLOR, penwidth="2")
        else:
            head = ", ".join(names[:3]) + (", …" if len(names) > 3 else "")
            label = [f"{len(names)} values", head]
            tips = [f"{n} {_type_label(v)}".rstrip() for n, v in zip(names, vals)]
            attrs = {"fontsize": "9", "tooltip": _dot_text(*tips)}
        g.edge(src, dst, _dot_text(*label), **attrs)

    def draw_flows(self, g: graphviz.Digraph) -> None:
        """Draw the values that cross statements at top level; many values between two nodes share one edge."""
        handoff = {}
        for r in self.trace.regions:
            for src, dst in _handoffs(r):
                handoff[(src, r.position)] = handoff[(dst, r.position)] = f"{src} -> {dst}"
        # NOTE: keyed by (src, dst, own): numbers and hand-offs get an edge of their own (own = the value's name);
        # dicts keep insertion order, so edges follow the values' order
        flows: dict[tuple[str, str, str | None], list[tuple[str, str | None]]] = {}
        for v in self.trace.values:
            src = self.producer(v)
            if src is None:
                continue
            seen = set()
            for site in v.uses:
                dst = None if site.region is not None else self.consumer(v, site)
                if dst is None or dst == src or dst in seen:
                    continue
                seen.add(dst)
                h = handoff.get((v.name, site.position))
                own = v.name if v.is_scalar or h else None
                flows.setdefault((src, dst, own), []).append((v.name, h))
        for (src, dst, _), items in flows.items():
            if len(items) > _EDGE_GROUP:
                self.edge(g, src, dst, [n for n, _ in items])
                continue
            for n, h in items:
                self.edge(g, src, dst, [n], h)

    def draw_legend(self, g: graphviz.Digraph, lost: Sequence[Defect]) -> None:
        defects = self.trace.defects
        lines = ["legend"]
        if defects:
            counts = Counter(d.rule for d in defects)
            errors = sum(1 for d in defects if d.is_error)
            lines.append(f"defects: {_plural(errors, 'error')}, {_plural(len(defects) - errors, 'warning')} (red)")
            for rule in RULES:
                if rule in counts:
                    lines.append(f"  {rule} ×{counts[rule]}: {RULES[rule]}")
        else:
            lines.append("no defects")
        for d in lost:
            lines.append(f"  {d.rule} at {d.where()}: {d.message}")
        lines += ["region: green captured, orange eager, grey not run",
                  "dashed orange edge: Python number",
                  "blue edge: scalar hand-off"]
        attrs = {"fontsize": "9", "shape": "note"}
        if defects:
            attrs.update(color=_DEFECT_COLOR)
        g.node("_legend", _dot_text(*lines, sep=r"\l", end=r"\l"), **attrs)

    def build(self) -> graphviz.Digraph:
        t = self.trace
        g = graphviz.Digraph(name=_node_id(t.kind))
        g.attr(compound="true", fontsize="10", label=_dot_text(f"{t.kind} trace `{t.name}`"), labelloc="t",
               rankdir="TB")
        g.attr("node", fontsize="10")
        g.attr("edge", fontsize="9")
        lost = self.place_defects()
        self.draw_inputs(g)
        groups = {grp[0].position: grp for grp in self.island_groups}
        unplaced = [r for r in t.regions if r.position < 0]
        for pos in sorted(set(self.regions) | set(groups)):
            if pos in self.regions:
                r = self.regions[pos]
                (self.draw_full if r.name in self.full else self.draw_collapsed)(g, r)
            else:
                self.draw_island_group(g, groups[pos])
        for r in unplaced:
            (self.draw_full if r.name in self.full else self.draw_collapsed)(g, r)
        self.draw_flows(g)
        self.draw_legend(g, lost)
        return g


def _op_node(r: Region, op: Op) -> str:
    """Node id of a region statement: its first output (thunder's name), else region and line."""
    return _node_id(op.outputs[0]) if op.outputs else _node_id(r.name, "line", str(op.line))


def region_diagram(trace: TraceReport, *, detail: str | None = None, collapse: bool | None = None) -> graphviz.Digraph:
    """Draw a trace's regions, islands and the values between them.

    Args:
        trace: the trace to draw (forward or backward).
        detail: name of one region to draw in full (its ops, inputs and outputs), whatever ``collapse`` says.
        collapse: draw each region as one summary node; None collapses when the trace has more than
            `COLLAPSE_THRESHOLD` ops.

    Returns:
        A ``graphviz.Digraph`` (render it with `svg`, or read its ``.source``).

    Raises:
        ValueError: ``detail`` names no region of the trace.
    """
    names = [r.name for r in trace.regions]
    if detail is not None and detail not in names:
        raise ValueError(f"unknown region: {detail!r} (must be one of {names})")
    if collapse is None:
        collapse = _op_count(trace) > COLLAPSE_THRESHOLD
    full = {detail} if collapse and detail is not None else (set() if collapse else set(names))
    return _DiagramBuilder(trace, full, merge_islands=collapse).build()


_dot_missing_warned = False


def svg(graph: graphviz.Digraph) -> str | None:
    """Render a diagram to an SVG string with Graphviz's ``dot``.

    Returns:
        The ``<svg>`` element (XML prolog left out, ready to embed), or None when ``dot`` is not on
        PATH; then one `DiagramWarning` per process says how to install it.
    """
    global _dot_missing_warned
    try:
        out = graph.pipe(format="svg", encoding="utf-8")
    except graphviz.ExecutableNotFound:
        if not _dot_missing_warned:
            _dot_missing_warned = True
            warnings.warn(
                "Graphviz's `dot` executable was not found on PATH, so diagrams are shown as DOT source "
                "and text. Install it (`apt-get install graphviz`, `brew install graphviz` or "
                "`conda install -c conda-forge graphviz`).",
                DiagramWarning,
                stacklevel=2,
            )
        return None
    start = out.find("<svg")
    return out[start:] if start >= 0 else out


# ---------------------------------------------------------------------------------------------------
# Lifetimes


@dataclass(frozen=True, slots=True)
class _Row:
    """One value's lifetime on the flat step axis."""

    value: Value
    start: int  # step of the definition (0 for an input)
    last_use: int  # last step it is read at (``start`` when never read)
    end: int  # step it is freed at: its first del after the last use, else the trace's end
    dels: tuple[int, ...]
    uses: tuple[int, ...]
    late_uses: tuple[int, ...]  # uses after a del
    never_freed: bool
    defects: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Axis:
    """The flat step order: top-level positions, a region's position expanded into its statements."""

    steps: tuple[str, ...]  # a label per step
    index: dict[tuple[int, int | None], int]
    spans: tuple[tuple[str, int, int], ...]  # (region, first step, last step)

    def of(self, site: Site) -> int:
        return self.index.get((site.position, site.index), self.index.get((site.position, None), 0))


def _axis(trace: TraceReport) -> _Axis:
    regions = {r.position: r for r in trace.regions if r.position >= 0}
    steps: list[str] = []
    index: dict[tuple[int, int | None], int] = {}
    spans = []
    for pos in range(len(trace.ops)):
        r = regions.get(pos)
        if r is None or not r.ops:
            index[(pos, None)] = len(steps)
            steps.append(f"@{pos}")
            continue
        index[(pos, None)] = len(steps)
        first = len(steps)
        for j in range(len(r.ops)):
            index[(pos, j)] = len(steps)
            steps.append(f"{r.name}[{j}]@{pos}")
        spans.append((r.name, first, len(steps) - 1))
    if not steps:
        steps.append("@0")
    return _Axis(tuple(steps), index, tuple(spans))


def _rows(trace: TraceReport, axis: _Axis) -> list[_Row]:
    """Place every value on the step axis.

    A ``del`` ends a value only in the scope that owns the name: the top level, or the region that
    defines it. A region deleting its input unbinds the region's own name; the caller's stays alive,
    so such a del ends nothing outside that region.
    """
    by_value: dict[str, list[str]] = {}
    for d in trace.defects:
        if d.value is not None:
            by_value.setdefault(d.value, []).append(d.rule)
    last = len(axis.steps) - 1
    outputs = {n for r in trace.regions for n in r.outputs}
    rows = []
    for v in trace.values:
        home = v.defined.region if v.defined is not None else None
        local = home is not None and v.name not in outputs  # NOTE: dies with the region's frame at the latest
        start = 0 if v.defined is None else axis.of(v.defined)
        uses = tuple(sorted({axis.of(s) for s in v.uses}))
        dels = tuple(sorted({axis.of(s) for s in v.dels}))
        own = sorted(axis.of(d) for d in v.dels if d.region is None or d.region == home)
        foreign = [d for d in v.dels if not (d.region is None or d.region == home)]
        late = tuple(
            axis.of(u) for u in sorted(v.uses, key=axis.of)
            if any(d < axis.of(u) for d in own)
            or any(d.region == u.region and d.position == u.position and axis.of(d) < axis.of(u) for d in foreign)
        )
        last_use = max(uses, default=start)
        rules = tuple(dict.fromkeys(by_value.get(v.name, ())))
        never = "never-freed" in rules or (
            not own and not local and not v.returned and v.defined is not None and v.type.kind == "tensor"
            and last_use < last
        )
        later = [d for d in own if d >= last_use]
        # NOTE: held until its del; a never-freed value until the end; anything else ends at its last use
        end = later[0] if later else (own[-1] if own else last if never else last_use)
        if "use-after-del" in rules and not late:
            late = (last_use,)
        rows.append(_Row(v, start, max(last_use, start), max(end, start), dels, uses, tuple(dict.fromkeys(late)),
                         never, rules))
    return rows


def _pick_rows(rows: list[_Row], max_rows: int) -> tuple[list[_Row], int]:
    """Keep at most ``max_rows`` rows, those with defects first, in trace order."""
    if len(rows) <= max_rows:
        return rows, 0
    flagged = [i for i, r in enumerate(rows) if r.defects or r.late_uses or r.never_freed][:max_rows]
    keep = set(flagged)
    for i in range(len(rows)):
        if len(keep) >= max_rows:
            break
        keep.add(i)
    return [rows[i] for i in sorted(keep)], len(rows) - len(keep)


def _row_note(row: _Row, axis: _Axis) -> str:
    v = row.value
    start = "input" if v.defined is None else axis.steps[row.start]
    parts = [f"{start} -> {axis.steps[row.last_use]}" if row.uses else f"{start}, never read"]
    if row.dels:
        parts.append("del " + ", ".join(axis.steps[d] for d in row.dels))
    if row.late_uses:
        parts.append("USE AFTER DEL at " + ", ".join(axis.steps[u] for u in row.late_uses))
    if row.never_freed:
        parts.append("never freed")
    if v.returned:
        parts.append("returned")
    return "; ".join(parts)


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _bar(row: _Row, n: int, width: int) -> str:
    """Return the text bar of a row: ``=`` live, ``-`` held after its last use, ``x`` del, ``!`` use after del."""
    rank = {" ": 0, "-": 1, "=": 2, "x": 3, "!": 4}
    cells = [" "] * width

    def put(step: int, ch: str) -> None:
        k = step * width // n
        if rank[ch] > rank[cells[k]]:
            cells[k] = ch

    for s in range(row.start, row.last_use + 1):
        put(s, "=")
    for s in range(row.last_use + 1, row.end + 1):
        put(s, "-")
    for d in row.dels:
        put(d, "x")
    for u in row.late_uses:
        put(u, "!")
    return "".join(cells)


def lifetime_text(trace: TraceReport, *, max_rows: int = MAX_ROWS) -> str:
    """Return the value lifetimes of a trace as text, one row per value.

    Each row has a bar along the flat step order (``=`` live, ``-`` held after the last use,
    ``x`` del, ``!`` use after del) and a note naming the steps.
    """
    axis = _axis(trace)
    rows, more = _pick_rows(_rows(trace, axis), max_rows)
    n = len(axis.steps)
    width = min(n, _TEXT_BAR_WIDTH)
    lines = [f"lifetimes: {trace.kind} `{trace.name}` ({_plural(len(trace.values), 'value')}, {_plural(n, 'step')})"]
    if not rows:
        return lines[0] + "\n  (no values)"
    nw = min(max(len(r.value.name) for r in rows), 20)
    tw = min(max(len(_type_label(r.value)) for r in rows), 16)
    header = [" "] * width
    keys = []
    for k, (name, first, last_step) in enumerate(axis.spans):
        ch = "123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"[k % 35]
        keys.append(f"{ch}={name}")
        for s in range(first, last_step + 1):
            header[s * width // n] = ch
    if keys:
        lines.append("  regions: " + ", ".join(keys))
    lines.append(f"  {'':<{nw}} {'':<{tw}} |{''.join(header)}|")
    for r in rows:
        name, type_ = _fit(r.value.name, nw), _fit(_type_label(r.value), tw)
        lines.append(f"  {name:<{nw}} {type_:<{tw}} |{_bar(r, n, width)}| {_row_note(r, axis)}")
    if more:
        lines.append(f"  … {more} more values")
    return "\n".join(lines)


def lifetime_svg(trace: TraceReport, *, max_rows: int = MAX_ROWS) -> str:
    """Draw the value lifetimes of a trace as a standalone SVG (no Graphviz needed).

    One row per value: a bar from its definition to its last use, a thinner bar while it is held
    afterwards (orange when it is never freed), ``del`` ticks, and red marks for uses after a del.
    Region spans are shaded. At most ``max_rows`` rows; a note counts the rest.
    """
    axis = _axis(trace)
    rows, more = _pick_rows(_rows(trace, axis), max_rows)
    n = len(axis.steps)
    step_w = max(1.5, min(16.0, 900.0 / n))
    name_w, row_h, top = 150, 14, 30
    width = name_w + n * step_w + 170
    height = top + row_h * len(rows) + (20 if more else 6)

    def x(step: float) -> float:
        return round(name_w + step * step_w, 2)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="tnb-lifetime" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="monospace" font-size="10">',
        f"<title>{_esc(f'lifetimes: {trace.kind} {trace.name}')}</title>",
    ]
    for k, (name, first, last_step) in enumerate(axis.spans):
        color = _REGION_COLORS[k % len(_REGION_COLORS)]
        out.append(
            f'<g class="tnb-span"><title>{_esc(f"{name}: steps {first}-{last_step}")}</title>'
            f'<rect x="{x(first)}" y="2" width="{round((last_step - first + 1) * step_w, 2)}" '
            f'height="{height - 4}" fill="{color}" opacity="0.6"/>'
            f'<text x="{x(first) + 2}" y="14">{_esc(name)}</text></g>'
        )
    for isl in trace.user_islands:
        step = axis.index.get((isl.position, None))
        if step is not None:
            fill = _ISLAND_FILL.get(isl.reason, "#e9ecef")
            out.append(
                f'<g class="tnb-island"><title>{_esc(f"{isl.name}: {isl.label}")}</title>'
                f'<rect x="{x(step)}" y="2" width="{round(step_w, 2)}" height="{height - 4}" fill="{fill}"/></g>'
            )
    for i, r in enumerate(rows):
        y = top + i * row_h
        v = r.value
        flagged = bool(r.defects or r.late_uses)
        tip = f"{v.name} {_type_label(v)}: {_row_note(r, axis)}" + (f" [{', '.join(r.defects)}]" if r.defects else "")
        color = _SCALAR_COLOR if v.is_scalar else "#364fc7"
        fill = _DEFECT_COLOR if flagged else "#212529"
        parts = [f'<g class="tnb-row"><title>{_esc(tip)}</title>',
                 f'<text x="4" y="{y + 10}" fill="{fill}">{_esc(v.name[:20])}</text>',
                 f'<rect x="{x(r.start)}" y="{y + 3}" width="{round((r.last_use - r.start + 1) * step_w, 2)}" '
                 f'height="8" fill="{color}"/>']
        if r.end > r.last_use:
            held = "#f08c00" if r.never_freed else "#adb5bd"
            parts.append(f'<rect class="tnb-held" x="{x(r.last_use + 1)}" y="{y + 6}" '
                         f'width="{round((r.end - r.last_use) * step_w, 2)}" height="2" fill="{held}"/>')
        for d in r.dels:
            cx, w = x(d + 0.5), round(max(step_w, 6) / 2, 2)
            cross = f"M{cx - w} {y + 2}L{cx + w} {y + 12}M{cx + w} {y + 2}L{cx - w} {y + 12}"
            parts.append(f'<path class="tnb-del" d="{cross}" stroke="#212529" stroke-width="1.5"/>')
        for u in r.late_uses:
            parts.append(f'<circle class="tnb-use-after-del" cx="{x(u + 0.5)}" cy="{y + 7}" r="4" '
                         f'fill="{_DEFECT_COLOR}"/>')
        notes = [s for s, on in (("never freed", r.never_freed), ("use after del", bool(r.late_uses))) if on]
        if notes:
            parts.append(f'<text x="{x(n) + 6}" y="{y + 10}" fill="{_DEFECT_COLOR}">{_esc(", ".join(notes))}</text>')
        parts.append("</g>")
        out.append("".join(parts))
    if more:
        out.append(f'<text x="4" y="{height - 6}">{_esc(f"… {more} more values")}</text>')
    out.append("</svg>")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------------
# Source views


@dataclass(slots=True)
class _SourceLine:
    file: str
    line: int | None
    code: str
    places: list[str]  # "CUDAGraph1", "island3 (host sync: item)"
    regions: list[str]
    defects: list[str]


def _source_lines(trace: TraceReport) -> list[_SourceLine]:
    """The user's lines in file order, each with the regions and islands its ops end up in."""
    found: dict[SourceLine, _SourceLine] = {}

    def entry(user_line: SourceLine) -> _SourceLine:
        if user_line not in found:
            found[user_line] = _SourceLine(user_line.file, user_line.line, user_line.code, [], [], [])
        return found[user_line]

    blocks: list[tuple[int, Region | Island]] = [(r.position, r) for r in trace.regions]
    blocks += [(i.position, i) for i in trace.islands]
    for _, b in sorted(blocks, key=lambda pb: pb[0]):
        if isinstance(b, Region):
            for ul in b.user_lines:
                e = entry(ul)
                if b.name not in e.places:
                    e.places.append(b.name)
                    e.regions.append(b.name)
        elif b.op.user_line and b.reason not in _BOOKKEEPING:
            e = entry(b.op.user_line)
            e.places.append(f"{b.name} ({b.label})")
    for d in trace.defects:
        ul = _defect_user_line(trace, d)
        if ul is not None and d.rule not in entry(ul).defects:
            entry(ul).defects.append(d.rule)
    files = list(dict.fromkeys(e.file for e in found.values()))
    return sorted(found.values(), key=lambda e: (files.index(e.file), e.line if e.line is not None else -1))


def source_text(trace: TraceReport) -> str:
    """Return the user's source lines, each marked with the regions and islands it ends up in."""
    lines = [f"source: {trace.kind} `{trace.name}`"]
    entries = _source_lines(trace)
    if not entries:
        return lines[0] + "\n  (no user source lines in the trace)"
    cw = min(max(len(e.code) for e in entries), 60)
    file = None
    for e in entries:
        if e.file != file:
            file = e.file
            lines.append(f"  {file or '(unknown file)'}")
        num = "" if e.line is None else str(e.line)
        marks = ", ".join(e.places)
        if e.defects:
            marks += ("  " if marks else "") + "⚠ " + ", ".join(e.defects)
        lines.append(f"  {num:>5}  {e.code:<{cw}}  {marks}".rstrip())
    return "\n".join(lines)


def _region_colors(trace: TraceReport) -> dict[str, str]:
    return {r.name: _REGION_COLORS[k % len(_REGION_COLORS)] for k, r in enumerate(trace.regions)}


def source_html(trace: TraceReport) -> str:
    """Return the user's source lines as an HTML table, each line coloured by the region it ends up in."""
    colors = _region_colors(trace)
    entries = _source_lines(trace)
    out = [f'<div class="tnb-source"><div class="tnb-h">source: {_esc(trace.kind)} '
           f"<code>{_esc(trace.name)}</code></div>"]
    if not entries:
        out.append("<p>(no user source lines in the trace)</p></div>")
        return "".join(out)
    out.append("<table>")
    file = None
    for e in entries:
        if e.file != file:
            file = e.file
            out.append(f'<tr><th colspan="3">{_esc(file or "(unknown file)")}</th></tr>')
        bg = colors.get(e.regions[0], "") if e.regions else ""
        style = f' style="background:{bg}"' if bg else ""
        badges = "".join(
            f'<span class="tnb-badge" style="background:{colors[p]}">{_esc(p)}</span>' if p in colors
            else f'<span class="tnb-badge tnb-island">{_esc(p)}</span>'
            for p in e.places
        )
        badges += "".join(f'<span class="tnb-badge tnb-defect" title="{_esc(RULES.get(r, r))}">⚠ {_esc(r)}</span>'
                          for r in e.defects)
        num = "" if e.line is None else str(e.line)
        out.append(f'<tr{style}><td class="tnb-ln">{num}</td><td><code>{_esc(e.code)}</code></td>'
                   f"<td>{badges}</td></tr>")
    out.append("</table></div>")
    return "".join(out)


def _sources(trace: TraceReport) -> list[tuple[str, str, dict[int, list[Defect]]]]:
    """(title, source, defects by line) for the top level and each region; a shared text is listed once.

    Regions read from one source text (`analysis.analyze_source`) share it with the top level, and their
    defects' lines count in that text.
    """
    parts: dict[str, tuple[list[str], set[str | None]]] = {}
    parts.setdefault(trace.source, ([], set()))[0].append(f"{trace.kind} `{trace.name}` (top level)")
    parts[trace.source][1].add(None)
    for r in trace.regions:
        titles, owners = parts.setdefault(r.source, ([], set()))
        titles.append(f"region {r.name}")
        owners.add(r.name)
    out = []
    for source, (titles, owners) in parts.items():
        marks: dict[int, list[Defect]] = {}
        for d in trace.defects:
            if d.region in owners and d.line is not None:
                marks.setdefault(d.line, []).append(d)
        out.append((", ".join(titles), source, marks))
    return out


def trace_source_text(trace: TraceReport) -> str:
    """Return the generated top-level source and each region's source, defect lines marked ``!!``."""
    lines: list[str] = []
    for title, source, marks in _sources(trace):
        lines.append(f"{title}:")
        for k, text in enumerate(source.splitlines(), start=1):
            ds = marks.get(k, [])
            note = "  <- " + "; ".join(f"{d.rule}: {d.message}" for d in ds) if ds else ""
            lines.append(f"{'!!' if ds else '  '} {k:>4}  {text}{note}".rstrip())
    return "\n".join(lines)


def trace_source_html(trace: TraceReport) -> str:
    """Return the generated top-level source and each region's source as HTML, defect lines highlighted."""
    out = ['<div class="tnb-trace-source">']
    for title, source, marks in _sources(trace):
        out.append(f'<div class="tnb-h">{_esc(title)}</div><pre class="tnb-code">')
        for k, text in enumerate(source.splitlines(), start=1):
            ds = marks.get(k)
            body = f'<span class="tnb-ln">{k:>4}</span> {_esc(text)}'
            if ds:
                tip = "\n".join(f"{d.rule}: {d.message}" for d in ds)
                rules = ", ".join(dict.fromkeys(d.rule for d in ds))
                body = (f'<span class="tnb-defect-line" title="{_esc(tip)}">{body}'
                        f'  <span class="tnb-rule">⚠ {_esc(rules)}</span></span>')
            out.append(body + "\n")
        out.append("</pre>")
    out.append("</div>")
    return "".join(out)


# ---------------------------------------------------------------------------------------------------
# Reports


def _value_list(trace: TraceReport, names: Iterable[str], static: Sequence[bool] = ()) -> str:
    values = _values(trace)
    items = []
    for k, n in enumerate(names):
        v = values.get(n)
        item = f"{n} {_type_label(v)}".rstrip()
        if v is not None and v.is_scalar:
            item += " (Python number)"
        if k < len(static) and static[k]:
            item += " (static)"
        items.append(item)
    return ", ".join(items) or "-"


def _trace_text(trace: TraceReport) -> list[str]:
    n_ops = sum(len(r.compute_ops) for r in trace.regions)
    lines = [
        f"{trace.kind} trace `{trace.name}`: {_plural(len(trace.regions), 'region')} ({_plural(n_ops, 'op')}), "
        f"{_plural(len(trace.user_islands), 'user island')}",
    ]
    if _provenance(trace):
        lines.append(f"  constructed by: {_provenance(trace)}")
    lines.append("  regions:" if trace.regions else "  regions: none")
    for r in trace.regions:
        where = f" @{r.position}" if r.position >= 0 else ""
        lines.append(f"    {r.name}{where}: {_plural(len(r.compute_ops), 'op')}, {_state(r)}")
        lines.append(f"      inputs:  {_value_list(trace, r.inputs, r.static_mask)}")
        lines.append(f"      outputs: {_value_list(trace, r.outputs)}")
        if r.scalar_handoffs:
            lines.append(f"      hand-offs: {', '.join(map(str, r.scalar_handoffs))}")
        if r.graphs:
            graphs = "; ".join(
                f"#{g.index} {g.cause} (static {_bytes(g.static_bytes)}"
                + (f", pool {_bytes(g.pool_bytes)}" if g.pool_bytes is not None else "") + ")"
                for g in r.graphs
            )
            lines.append(f"      graphs: {graphs}")
        if r.held_calls:
            lines.append(
                f"      without the graph: {_plural(r.held_calls, 'call')} (tensors its last replay saved for the "
                "backward were still held: a forward ran before the previous backward)"
            )
    user = trace.user_islands
    lines.append("  islands:" if trace.islands else "  islands: none")
    for i in user:
        lines.append(f"    {i.name} @{i.position}: {i.label}: {i.op.text}")
    hidden = len(trace.islands) - len(user)
    if hidden:
        lines.append(f"    + {hidden} bookkeeping (unpack, return, collection clearing)")
    lines.append("  defects:" if trace.defects else "  defects: none")
    for d in trace.defects:
        value = f" ({d.value})" if d.value else ""
        lines.append(f"    {d.severity:<7} {d.rule} at {d.where()}{value}: {d.message}")
        lines.append(f"            hint: {d.hint}")
    lines += ["  " + line for line in lifetime_text(trace).splitlines()]
    return lines


def report_text(report: Report) -> str:
    """Return the plain-text report: verdict, error, notes, then per trace regions, islands, defects, lifetimes."""
    lines = [
        f"thunder-nb report: {report.function} (transform: {report.transform})",
        f"verdict: {_verdict(report.defects)}",
    ]
    if report.error:
        lines.append(f"error: {report.error}")
    lines += [f"note: {n}" for n in report.notes]
    for t in report.traces:
        lines.append("")
        lines += _trace_text(t)
    return "\n".join(lines)


_CSS = """<style>
.thunder-nb{font-family:system-ui,sans-serif;font-size:13px}
.thunder-nb .tnb-h{font-weight:600;margin:8px 0 4px}
.thunder-nb table{border-collapse:collapse}
.thunder-nb td,.thunder-nb th{padding:1px 6px;text-align:left;vertical-align:top}
.thunder-nb .tnb-ln{color:#868e96;text-align:right;user-select:none}
.thunder-nb .tnb-badge{border-radius:3px;padding:0 4px;margin-right:3px;font-size:11px}
.thunder-nb .tnb-island{background:#fff3bf}
.thunder-nb .tnb-defect,.thunder-nb .tnb-rule,.thunder-nb .tnb-error{color:#e03131}
.thunder-nb .tnb-defect-line{background:#ffe3e3;display:inline-block;min-width:100%}
.thunder-nb pre{background:#f8f9fa;padding:6px;overflow:auto;margin:0}
.thunder-nb .tnb-diagram{overflow:auto;max-width:100%}
.thunder-nb .tnb-side td{width:50%}
</style>"""


def _diagram_html(trace: TraceReport) -> str:
    """The diagram as inline SVG, or the DOT source plus the text view when ``dot`` is missing."""
    graph = region_diagram(trace)
    image = svg(graph)
    if image is not None:
        return f'<div class="tnb-diagram">{image}</div>'
    text = "\n".join(_trace_text(trace))
    return (
        '<div class="tnb-diagram"><p>Graphviz <code>dot</code> is not installed '
        "(<code>apt-get install graphviz</code>): DOT source and text view.</p>"
        f'<pre class="tnb-dot">{_esc(graph.source)}</pre><pre class="tnb-text">{_esc(text)}</pre></div>'
    )


def _defects_html(trace: TraceReport) -> str:
    if not trace.defects:
        return "<p>no defects</p>"
    rows = "".join(
        f'<tr class="tnb-{d.severity.replace(" ", "-")}"><td>{_esc(d.severity)}</td><td><code>{_esc(d.rule)}</code></td>'
        f"<td>{_esc(d.where())}</td><td>{_esc(d.message)}<br><i>{_esc(d.hint)}</i></td></tr>"
        for d in trace.defects
    )
    return f"<table><tr><th>severity</th><th>rule</th><th>where</th><th>message</th></tr>{rows}</table>"


def _trace_html(trace: TraceReport) -> str:
    return (
        f'<div class="tnb-trace"><div class="tnb-h">{_esc(trace.kind)} trace <code>{_esc(trace.name)}</code>: '
        f"{_esc(_plural(len(trace.regions), 'region'))}, {_esc(_plural(len(trace.user_islands), 'user island'))}</div>"
        f"{_diagram_html(trace)}{_defects_html(trace)}"
        f'<details><summary>lifetimes</summary>{lifetime_svg(trace)}</details>'
        f"<details><summary>source</summary>{source_html(trace)}</details>"
        f"<details><summary>generated code</summary>{trace_source_html(trace)}</details></div>"
    )


def _header_html(report: Report) -> str:
    parts = [f'<div class="tnb-h">{_esc(report.function)} <small>(transform: {_esc(report.transform)})</small></div>',
             f"<div>verdict: {_esc(_verdict(report.defects))}</div>"]
    if report.error:
        parts.append(f'<div class="tnb-error">error: {_esc(report.error)}</div>')
    parts += [f"<div>note: {_esc(n)}</div>" for n in report.notes]
    return "".join(parts)


def report_html(report: Report) -> str:
    """Return the HTML report: header, then per trace its diagram, defects, lifetimes and source views."""
    body = _header_html(report) + "".join(_trace_html(t) for t in report.traces)
    return f'<div class="thunder-nb">{_CSS}{body}</div>'


def report_mimebundle(report: Report, include: Iterable[str] | None = None,
                      exclude: Iterable[str] | None = None) -> dict[str, str]:
    """Return the report's rich display: ``text/plain`` and ``text/html``, filtered as IPython asks."""
    wanted = ["text/plain", "text/html"]
    if include:
        wanted = [m for m in wanted if m in set(include)]
    if exclude:
        wanted = [m for m in wanted if m not in set(exclude)]
    makers = {"text/plain": report_text, "text/html": report_html}
    return {m: makers[m](report) for m in wanted}


def side_by_side_html(original: Report, fixed: Report) -> str:
    """Return two reports of the same function side by side, trace by trace (e.g. stock vs. fixed transform)."""
    rows = [f"<tr><td>{_header_html(original)}</td><td>{_header_html(fixed)}</td></tr>"]
    kinds = list(dict.fromkeys(t.kind for t in original.traces + fixed.traces))
    for kind in kinds:
        cells = []
        for rep in (original, fixed):
            t = next((t for t in rep.traces if t.kind == kind), None)
            cells.append(f"<td>{_trace_html(t)}</td>" if t is not None else f"<td><p>no {_esc(kind)} trace</p></td>")
        rows.append(f"<tr>{''.join(cells)}</tr>")
    return f'<div class="thunder-nb">{_CSS}<table class="tnb-side">{"".join(rows)}</table></div>'
