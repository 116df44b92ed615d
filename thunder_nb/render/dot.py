"""Build a trace's region/island diagram as Graphviz DOT (a ``graphviz.Digraph``): no ``dot`` binary needed.

The top level is drawn here (inputs, islands and other statements outside regions, the values between them);
`thunder_nb.render.dot_regions` draws a region, `thunder_nb.render.dot_marks` the defects' marks and the legend,
`thunder_nb.render.dot_syntax` escapes labels and names nodes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..diagnosis.model import ISLAND_REASONS, Defect, Outside, Site, TraceReport, Value
from .common import ISLAND_FILL, SCALAR_COLOR, HANDOFF_COLOR, has_region, type_label, values
from .dot_marks import Mark, draw_legend
from .dot_regions import draw_collapsed, draw_full, handoffs, op_node
from .dot_syntax import dot_text, node_id, tip_lines
from .memory import ACTION_SHORT, hand_out_actions, hand_out_line

__all__ = ["COLLAPSE_THRESHOLD", "region_diagram", "dot_text", "node_id"]

if TYPE_CHECKING:
    import graphviz

#: Above this many ops (region ops plus top-level statements), `region_diagram` collapses regions.
COLLAPSE_THRESHOLD = 150

# NOTE: 9 pt is dot's smallest font here: 12 px at natural size, and a default view never shrinks a diagram below
# 11/12 of it (`thunder_nb.render.html`), so no text is smaller than 11 px
_SMALL = {"color": "#adb5bd", "fontcolor": "#6c757d", "fontsize": "9", "height": "0.2", "margin": "0.04,0.02",
          "shape": "box", "style": "rounded"}
_MAX_INPUTS = 8  # NOTE: more top-level inputs than this are drawn as one node
_INPUTS = "_inputs"
_EDGE_GROUP = 4  # NOTE: more values than this between two nodes are drawn as one summary edge
_BOOKKEEPING = ("bookkeeping", "collection")
_MERGEABLE = ("bookkeeping", "collection", "unfused", "collective")


def _op_count(trace: TraceReport) -> int:
    """Ops a full diagram would draw: every region's calls plus top-level statements that are not dels."""
    region_positions = {r.position for r in trace.regions}
    top = sum(1 for p, o in enumerate(trace.ops) if o.kind != "del" and p not in region_positions)
    return top + sum(len(r.compute_ops) for r in trace.regions)


class _DiagramBuilder:
    """Build one trace's diagram; holds the node each top-level statement and value maps to."""

    def __init__(self, trace: TraceReport, full: set[str], merge_islands: bool, narrow: bool = False) -> None:
        self.trace = trace
        self.full = full
        self.narrow = narrow  # NOTE: inputs one under the other, no edge label that repeats its input's name
        self.compact = merge_islands  # NOTE: a collapsed drawing: edge labels name values, types go to tooltips
        self.keys: set[str] = set()  # what the legend must explain: "number", "hand-off"
        self.inputs = self._inputs()
        self.grouped_inputs = len(self.inputs) > _MAX_INPUTS
        self.values = values(trace)
        self.regions = {r.position: r for r in trace.regions if r.position >= 0}
        self.outside = {i.position: i for i in trace.outside}
        self.island_node: dict[int, str] = {}
        self.island_groups: list[list[Outside]] = self._group_islands(merge_islands)
        self.marks: dict[str, Mark] = {}
        self.region_marks: dict[str, Mark] = {}  # defects of a full region with no better anchor

    # -- layout of the top level

    def _group_islands(self, merge: bool) -> list[list[Outside]]:
        """Group runs of adjacent bookkeeping (or unfused ops, or collectives) outside regions into one node each when
        merging."""
        groups: list[list[Outside]] = []
        prev_key = None
        for pos in sorted(set(self.regions) | set(self.outside)):
            isl = self.outside.get(pos)
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
                self.island_node[isl.position] = node_id(g[0].name)
        return groups

    def producer(self, v: Value) -> str | None:
        """The node a value leaves from at top level."""
        if v.defined is None:
            return _INPUTS if self.grouped_inputs else node_id(v.name)
        region = self.regions.get(v.defined.position)
        if region is not None:
            if region.name in self.full:
                return node_id(region.name, "out", v.name) if v.name in region.outputs else None
            return node_id(region.name)
        return self.island_node.get(v.defined.position)

    def consumer(self, v: Value, site: Site) -> str | None:
        """The node a top-level use of a value enters."""
        region = self.regions.get(site.position)
        if region is not None:
            if region.name in self.full:
                return node_id(region.name, "in", v.name)
            return node_id(region.name)
        return self.island_node.get(site.position)

    # -- defects

    def anchor(self, d: Defect) -> tuple[str | None, str | None]:
        """Return (node id, full region name) where a defect is drawn; node None means the region's cluster."""
        t = self.trace
        if d.region is not None and has_region(t, d.region):
            r = t.region(d.region)
            if r.name not in self.full:
                return node_id(r.name), None
            if d.value in r.inputs and d.rule != "region-deletes-output":
                return node_id(r.name, "in", d.value), None
            if d.value in r.outputs and d.rule in ("region-deletes-output", "double-del"):
                return node_id(r.name, "out", d.value), None
            op = next((o for o in r.compute_ops if o.line == d.line), None)
            if op is None and d.value is not None:
                op = next((o for o in r.compute_ops if d.value in o.outputs), None)
            if op is not None:
                return op_node(r, op), None
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
                return node_id(region.name, "out", d.value), None
            return None, region.name
        if region is not None:
            return node_id(region.name), None
        return self.island_node.get(pos), None

    def place_defects(self) -> list[Defect]:
        """Anchor every defect; return those with no place in the drawing (listed in the legend only)."""
        lost = []
        for d in self.trace.defects:
            node, region = self.anchor(d)
            tip = f"{d.rule} ({d.where()}): {d.message}"
            if node is not None:
                m = self.marks.setdefault(node, Mark([], [], []))
            elif region is not None:
                m = self.region_marks.setdefault(region, Mark([], [], []))
            else:
                lost.append(d)
                continue
            m.rules.append(d.rule)
            m.tips.append(tip)
            if d.severity in ("wrong result", "crashes the process"):
                m.wrong.append(d.rule)
        return lost

    def node(self, g: graphviz.Digraph, nid: str, lines: Sequence[str], tips: Sequence[str],
             attrs: dict[str, str]) -> None:
        """Draw a node; a node with defects turns red and lists them in its label and tooltip."""
        mark = self.marks.get(nid)
        if mark is not None:
            lines = [*lines, *mark.label_lines()]
            attrs = {**attrs, **mark.attrs(tips)}
        else:
            attrs = {**attrs, "tooltip": dot_text(*tip_lines(list(tips)))}
        g.node(nid, dot_text(*lines), **attrs)

    # -- drawing

    def _inputs(self) -> list[str]:
        """The trace's inputs that the top level uses, parameters first."""
        names = list(self.trace.params)
        for v in self.trace.values:
            if v.defined is None and v.name not in names and any(s.region is None for s in v.uses):
                names.append(v.name)
        return names

    def draw_inputs(self, g: graphviz.Digraph) -> None:
        names = self.inputs
        with g.subgraph(name="inputs") as sub:
            if not self.narrow or self.grouped_inputs:
                sub.attr(rank="source")
            if len(names) > _MAX_INPUTS:
                # NOTE: one node for many inputs (a model's parameters): side by side they make the drawing very wide
                tips = [f"input {n} {type_label(self.values.get(n))}".rstrip() for n in names[:50]]
                tips += [f"… {len(names) - 50} more"] if len(names) > 50 else []
                head = _some(names)
                self.node(sub, _INPUTS, [f"{len(names)} inputs", head], tips, {"shape": "ellipse"})
                return
            for name in names:
                v = self.values.get(name)
                lines = [name] + ([type_label(v)] if type_label(v) else [])
                self.node(sub, node_id(name), lines, [f"input {name}"], {"shape": "ellipse"})
            if self.narrow:
                # NOTE: side by side, a model's long parameter names made the drawing twice a column's width
                for a, b in zip(names, names[1:]):
                    sub.edge(node_id(a), node_id(b), style="invis")

    def draw_island_group(self, g: graphviz.Digraph, group: list[Outside]) -> None:
        first = group[0]
        nid = node_id(first.name)
        tips = [f"{i.name}: {i.op.text}" for i in group[:20]]
        if len(group) > 20:
            tips.append(f"… {len(group) - 20} more")
        if first.reason == "hand-out":
            tips = [f"{first.name}: hand-out: {hand_out_line(self.trace) or first.detail}", first.op.text]
            self.node(g, nid, [_hand_out_label(self.trace)], tips, _SMALL)
            return
        if first.reason in _BOOKKEEPING:
            head = first.detail if first.reason == "bookkeeping" else "clear " + first.detail
            if len(group) > 1:
                head = ("clear" if first.reason == "collection" else first.detail) + f" ×{len(group)}"
            self.node(g, nid, [head], tips, _SMALL)
            return
        if first.reason == "unfused":
            # NOTE: not an island (capture could take it): a plain white box, named by its op, never "island"
            self.keys.add("unfused")
            lines = ([f"{len(group)} unfused ops", _some([i.detail for i in group])] if len(group) > 1
                     else [f"unfused: {first.detail}"])
            self.node(g, nid, lines, tips, {"fillcolor": "white", "shape": "box", "style": "dashed,filled"})
            return
        if first.reason == "collective":
            # NOTE: an island of its own kind, communication between ranks: an arrow-shaped box, the collectives named
            self.keys.add("collective")
            counts = Counter(i.detail for i in group)
            lines = ([f"{first.name} … {group[-1].name}", _some([f"{op} ×{n}" for op, n in counts.items()])]
                     if len(group) > 1 else [first.name, first.label])
            self.node(g, nid, lines, tips, {"fillcolor": ISLAND_FILL["collective"], "shape": "cds", "style": "filled"})
            return
        if len(group) > 1:
            reason = ISLAND_REASONS.get(first.reason, first.reason)
            lines = [f"{first.name} … {group[-1].name}", f"{reason} ×{len(group)}"]
        else:
            lines = [first.name, first.label]
        attrs = {"fillcolor": ISLAND_FILL.get(first.reason, "white"), "shape": "box", "style": "rounded,filled"}
        self.node(g, nid, lines, tips, attrs)

    def edge(self, g: graphviz.Digraph, src: str, dst: str, names: Sequence[str], handoff: str | None = None,
             **extra: str) -> None:
        """Draw the values ``names`` flowing from ``src`` to ``dst`` (one summary edge for many); ``extra``: more
        edge attributes (``lhead``)."""
        vals = [self.values.get(n) for n in names]
        if len(names) == 1:
            v = vals[0]
            label = [names[0]] + ([type_label(v)] if type_label(v) else [])
            attrs = {"fontsize": "9", "tooltip": dot_text(" ".join(label))}
            if self.compact:
                label = label[:1]
            if self.narrow and src == node_id(names[0]) and not (v is not None and v.is_scalar) and not handoff:
                label = []  # NOTE: the edge leaves the node that names the value
            if v is not None and v.is_scalar:
                label.append("Python number")
                attrs.update(color=SCALAR_COLOR, fontcolor=SCALAR_COLOR, style="dashed")
                self.keys.add("number")
            if handoff:
                self.keys.add("hand-off")
                label.append(f"hand-off {handoff}")
                attrs.update(color=HANDOFF_COLOR, fontcolor=HANDOFF_COLOR, penwidth="2")
        else:
            head = _some(names)
            label = [f"{len(names)} values", head]
            tips = [f"{n} {type_label(v)}".rstrip() for n, v in zip(names, vals)]
            attrs = {"fontsize": "9", "tooltip": dot_text(*tip_lines(tips))}
        g.edge(src, dst, dot_text(*label) if label else None, **attrs, **extra)

    def draw_flows(self, g: graphviz.Digraph) -> None:
        """Draw the values that cross statements at top level; many values between two nodes share one edge."""
        handoff = {}
        for r in self.trace.regions:
            for src, dst in handoffs(r):
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
        # NOTE: many values from one node into a full region's input nodes (the grouped inputs, a backward's unpacked
        # saved values) enter it by one edge to its border, as many values between two nodes share one edge: one edge
        # each ran from the top of the drawing to each input's first use, and dot spent 7-10 s laying out one region of
        # a 2-layer nanoGPT (17,000 nodes in its positioning graph), 0.7 s with one edge (2026-12-05)
        in_nodes = {node_id(r.name, "in", n): r.name for r in self.regions.values() if r.name in self.full
                    for n in r.inputs}
        order = {node: i for i, node in enumerate(in_nodes)}  # NOTE: each region's inputs in its signature's order
        into: dict[tuple[str, str], list[tuple[str, str]]] = {}
        for (src, dst, own), items in flows.items():
            if own is None and dst in in_nodes:
                into.setdefault((src, in_nodes[dst]), []).extend((dst, n) for n, _ in items)
        into = {key: entered for key, entered in into.items() if len(entered) > _EDGE_GROUP}
        for (src, dst, own), items in flows.items():
            if own is None and (src, in_nodes.get(dst)) in into:
                continue
            if len(items) > _EDGE_GROUP:
                self.edge(g, src, dst, [n for n, _ in items])
                continue
            for n, h in items:
                self.edge(g, src, dst, [n], h)
        for (src, region), entered in into.items():
            anchor = min((node for node, _ in entered), key=order.__getitem__)  # NOTE: at the first of them
            self.edge(g, src, anchor, [n for _, n in entered], lhead=node_id("cluster", region))

    def build(self) -> graphviz.Digraph:
        import graphviz

        t = self.trace
        g = graphviz.Digraph(name=node_id(t.kind))
        title = f"{t.kind} trace `{t.name}`" + ("" if t.defects else " · no defects")
        g.attr(compound="true", fontsize="10", label=dot_text(title), labelloc="t",
               rankdir="TB", **({"ranksep": "0.3"} if self.compact else {}))
        g.attr("node", fontsize="10")
        g.attr("edge", fontsize="9")
        lost = self.place_defects()
        self.draw_inputs(g)
        groups = {grp[0].position: grp for grp in self.island_groups}
        unplaced = [r for r in t.regions if r.position < 0]
        for pos in sorted(set(self.regions) | set(groups)):
            if pos in self.regions:
                r = self.regions[pos]
                (draw_full if r.name in self.full else draw_collapsed)(self, g, r)
            else:
                self.draw_island_group(g, groups[pos])
        for r in unplaced:
            (draw_full if r.name in self.full else draw_collapsed)(self, g, r)
        self.draw_flows(g)
        draw_legend(g, t, self.keys, lost)
        return g


def _some(names: Sequence[str], budget: int = 36) -> str:
    """The first names (at most three, about ``budget`` characters, always one), then "…" if any are left."""
    shown = [names[0]]
    for n in names[1:3]:
        if sum(len(m) + 2 for m in shown) + len(n) > budget:
            break
        shown.append(n)
    return ", ".join(shown) + (", …" if len(shown) < len(names) else "")


def _hand_out_label(trace: TraceReport) -> str:
    """``hand-out: copy 1 · guard 2``: what the trace's hand-out checks."""
    plan = trace.hand_out
    if plan is None:
        return "hand-out"
    counts = Counter(ACTION_SHORT[a] for a in hand_out_actions(trace).values())
    return "hand-out: " + " · ".join(f"{w} {n}" for w, n in counts.items()) if counts else "hand-out"


def region_diagram(trace: TraceReport, *, detail: str | None = None, collapse: bool | None = None,
                   narrow: bool = False) -> graphviz.Digraph:
    """Draw a trace's regions, islands and the values between them.

    Args:
        trace: the trace to draw (forward or backward).
        detail: name of one region to draw in full (its ops, inputs and outputs), whatever ``collapse`` says.
        collapse: draw each region as one summary node; None collapses when the trace has more than
            `COLLAPSE_THRESHOLD` ops.
        narrow: lay out for a narrow column: the inputs one under the other instead of side by side, and no label on
            an edge out of an input's node (the node names the value).

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
    return _DiagramBuilder(trace, full, merge_islands=collapse, narrow=narrow).build()

