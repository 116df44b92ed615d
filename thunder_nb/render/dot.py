"""Build a trace's region/island diagram as Graphviz DOT (a ``graphviz.Digraph``): no ``dot`` binary needed."""

from __future__ import annotations

import re
import textwrap
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..diagnosis.model import ISLAND_REASONS, RULES, Defect, FusedGroup, Op, Outside, Region, Site, TraceReport, Value
from .common import (
    DEFECT_COLOR, FUSION_FILL, HANDOFF_COLOR, ISLAND_FILL, SCALAR_COLOR, STATE_FILL, WRONG_COLOR, fused_line,
    count_phrases, has_region, severity_counts, kernels, plural, state, type_label, values,
)
from .memory import (
    ACTION_SHORT, ROLE_SHORT, Entry, hand_out_line, input_roles, inputs_summary, known,
    output_actions, outputs_summary, region_memory,
)

__all__ = ["COLLAPSE_THRESHOLD", "region_diagram", "dot_text", "node_id"]

if TYPE_CHECKING:
    import graphviz

#: Above this many ops (region ops plus top-level statements), `region_diagram` collapses regions.
COLLAPSE_THRESHOLD = 150

_LEGEND_WIDTH = 52  # NOTE: characters per legend line: a wide legend makes the whole diagram wide
# NOTE: 9 pt is dot's smallest font here: 12 px at natural size, and a default view never shrinks a diagram below
# 11/12 of it (`thunder_nb.render.html`), so no text is smaller than 11 px
_SMALL = {"color": "#adb5bd", "fontcolor": "#6c757d", "fontsize": "9", "height": "0.2", "margin": "0.04,0.02",
          "shape": "box", "style": "rounded"}
_MAX_INPUTS = 8  # NOTE: more top-level inputs than this are drawn as one node
_INPUTS = "_inputs"
_EDGE_GROUP = 4  # NOTE: more values than this between two nodes are drawn as one summary edge
_BOOKKEEPING = ("bookkeeping", "collection")
_MERGEABLE = ("bookkeeping", "collection", "unfused")
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


def _handoffs(region: Region) -> list[tuple[str, str]]:
    """The (number, tensor) pairs of the region's hand-offs to a 0-d tensor of the trace."""
    return [(h.number, h.tensor) for h in region.scalar_handoffs if h.tensor]


def _op_count(trace: TraceReport) -> int:
    """Ops a full diagram would draw: every region's calls plus top-level statements that are not dels."""
    region_positions = {r.position for r in trace.regions}
    top = sum(1 for p, o in enumerate(trace.ops) if o.kind != "del" and p not in region_positions)
    return top + sum(len(r.compute_ops) for r in trace.regions)



@dataclass(slots=True)
class _Mark:
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


class _DiagramBuilder:
    """Build one trace's diagram; holds the node each top-level statement and value maps to."""

    def __init__(self, trace: TraceReport, full: set[str], merge_islands: bool) -> None:
        self.trace = trace
        self.full = full
        self.compact = merge_islands  # NOTE: a collapsed drawing: edge labels name values, types go to tooltips
        self.keys: set[str] = set()  # what the legend must explain: "number", "hand-off"
        self.inputs = self._inputs()
        self.grouped_inputs = len(self.inputs) > _MAX_INPUTS
        self.values = values(trace)
        self.regions = {r.position: r for r in trace.regions if r.position >= 0}
        self.outside = {i.position: i for i in trace.outside}
        self.island_node: dict[int, str] = {}
        self.island_groups: list[list[Outside]] = self._group_islands(merge_islands)
        self.marks: dict[str, _Mark] = {}
        self.region_marks: dict[str, _Mark] = {}  # defects of a full region with no better anchor

    # -- layout of the top level

    def _group_islands(self, merge: bool) -> list[list[Outside]]:
        """Group runs of adjacent bookkeeping (or unfused ops) outside regions into one node each when merging."""
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
                m = self.marks.setdefault(node, _Mark([], [], []))
            elif region is not None:
                m = self.region_marks.setdefault(region, _Mark([], [], []))
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
        if len(group) > 1:
            reason = ISLAND_REASONS.get(first.reason, first.reason)
            lines = [f"{first.name} … {group[-1].name}", f"{reason} ×{len(group)}"]
        else:
            lines = [first.name, first.label]
        attrs = {"fillcolor": ISLAND_FILL.get(first.reason, "white"), "shape": "box", "style": "rounded,filled"}
        self.node(g, nid, lines, tips, attrs)

    def region_summary(self, r: Region) -> list[str]:
        lines = [r.name, " · ".join(_region_counts(r) + [state(r)])]
        ins, outs = inputs_summary(self.trace, r), outputs_summary(self.trace, r)
        lines += [ins, outs] if known(self.trace, r) else [f"{ins} · {outs}"]
        counts = Counter(o.callee for o in r.compute_ops)
        if counts:
            top = [f"{c} ×{n}" if n > 1 else c for c, n in counts.most_common(3)]
            lines.append(", ".join(top) + (f", +{len(counts) - 3} more" if len(counts) > 3 else ""))
        lines += [str(group) for group in r.fusions[:3]]
        if len(r.fusions) > 3:
            lines.append(f"+{plural(len(r.fusions) - 3, 'fused group')}")
        if r.graphs:
            lines.append(plural(len(r.graphs), "graph"))
        if r.scalar_handoffs:
            lines.append("hand-offs: " + ", ".join(map(str, r.scalar_handoffs)))
        return lines

    def draw_collapsed(self, g: graphviz.Digraph, r: Region) -> None:
        attrs = {"fillcolor": STATE_FILL.get(r.captured, "white"), "shape": "box3d", "style": "filled"}
        self.node(g, node_id(r.name), self.region_summary(r), self.region_tips(r), attrs)

    def region_tips(self, r: Region) -> list[str]:
        """The tooltip of a region: its state (and its kernels and fused groups, when it has some), then its memory plan."""
        tips = [f"{r.name}: {state(r)}"]
        if r.fusions:
            tips[0] += f", {kernels(r)} per replay"
            tips += [fused_line(group) for group in r.fusions]
        if known(self.trace, r):
            tips += [str(e) for e in region_memory(self.trace, r)]
        return tips

    def draw_full(self, g: graphviz.Digraph, r: Region) -> None:
        with g.subgraph(name=node_id("cluster", r.name)) as c:
            c.attr(**self.cluster_attrs(r))
            plan = {n: e for e in region_memory(self.trace, r) for n in e.names} if known(self.trace, r) else {}
            self.draw_region_inputs(c, r, plan)
            producers = {n: node_id(r.name, "in", n) for n in r.inputs}
            fusions = {group.name: group for group in r.fusions}
            for op in r.compute_ops:
                nid = _op_node(r, op)
                head = f"{', '.join(op.outputs)} = {op.callee}" if op.outputs else op.callee
                group = fusions.get(op.callee.rsplit(".", 1)[-1])
                if group is not None:
                    self.keys.add("fusion")
                    self.node(c, nid, [head, *_fused_label(group)], [fused_line(group, limit=40), op.text],
                              {"fillcolor": FUSION_FILL, "peripheries": "2", "shape": "box", "style": "filled"})
                    continue
                self.node(c, nid, [head], [op.text], {"fillcolor": "white", "shape": "box", "style": "filled"})
                for n in op.inputs:
                    if n in producers:
                        self.edge(c, producers[n], nid, [n])
                for n in op.outputs:
                    producers[n] = nid
            self.draw_region_outputs(c, r, plan)
            for name in r.outputs:
                if name in producers:
                    self.edge(c, producers[name], node_id(r.name, "out", name), [name])

    def cluster_attrs(self, r: Region) -> dict[str, str]:
        """A drawn region's cluster: its label (ops, state, inputs and outputs, hand-offs, marks), fill and tooltip."""
        label = [" · ".join([r.name, *_region_counts(r), state(r)])]
        if known(self.trace, r):
            label.append(f"{inputs_summary(self.trace, r)} · {outputs_summary(self.trace, r)}")
        if r.scalar_handoffs:
            label.append("hand-offs: " + ", ".join(map(str, r.scalar_handoffs)))
        attrs = {"fillcolor": STATE_FILL.get(r.captured, "white"), "style": "filled,rounded",
                 "tooltip": dot_text(*tip_lines(self.region_tips(r)))}
        mark = self.region_marks.get(r.name)
        if mark is not None:
            label += mark.label_lines()
            attrs.update(mark.attrs(self.region_tips(r)))
        return {"label": dot_text(*label), **attrs}

    def draw_region_inputs(self, c: graphviz.Digraph, r: Region, plan: dict[str, Entry]) -> None:
        """A node per region input: its role, numbers and hand-offs coloured, its memory plan in the tooltip."""
        # NOTE: inputs are not held on one rank: each sits above its first use, which keeps the cluster narrow
        handoff_names = {n for pair in _handoffs(r) for n in pair}
        roles = input_roles(self.trace, r) if known(self.trace, r) else {}
        for name in r.inputs:
            v = self.values.get(name)
            role = roles.get(name, "copied")
            lines = [name] + ([ROLE_SHORT[role]] if ROLE_SHORT.get(role) else [])
            attrs = {"fontsize": "9", "height": "0.25", "shape": "box", "style": "rounded"}
            if v is not None and v.is_scalar:
                attrs.update(color=SCALAR_COLOR, fontcolor=SCALAR_COLOR)
                if "Python number" not in lines:
                    lines.append("Python number")
            if name in handoff_names:
                attrs.update(color=HANDOFF_COLOR, fontcolor=HANDOFF_COLOR, penwidth="2")
            tips = [f"{r.name} input {name} {type_label(v)}".rstrip()]
            if name in plan:
                tips.append(f"{plan[name].label}: {plan[name].reason}")
            self.node(c, node_id(r.name, "in", name), lines, tips, attrs)

    def draw_region_outputs(self, c: graphviz.Digraph, r: Region, plan: dict[str, Entry]) -> None:
        """The region's outputs on one rank, each with what happens to it when it leaves the trace."""
        with c.subgraph() as outs:
            outs.attr(rank="same")
            actions = output_actions(self.trace, r) if known(self.trace, r) else {}
            for name in r.outputs:
                v = self.values.get(name)
                tips = [f"{r.name} output {name} {type_label(v)}".rstrip()]
                lines = [name]
                if name in actions:
                    lines.append(ACTION_SHORT[actions[name][0]])
                if name in plan:
                    tips.append(f"{plan[name].label}: {plan[name].reason}")
                self.node(outs, node_id(r.name, "out", name), lines, tips,
                          {"fontsize": "9", "height": "0.25", "shape": "house"})

    def edge(self, g: graphviz.Digraph, src: str, dst: str, names: Sequence[str], handoff: str | None = None) -> None:
        """Draw the values ``names`` flowing from ``src`` to ``dst`` (one summary edge for many)."""
        vals = [self.values.get(n) for n in names]
        if len(names) == 1:
            v = vals[0]
            label = [names[0]] + ([type_label(v)] if type_label(v) else [])
            attrs = {"fontsize": "9", "tooltip": dot_text(" ".join(label))}
            if self.compact:
                label = label[:1]
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
        g.edge(src, dst, dot_text(*label), **attrs)

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
        if "number" in self.keys:
            lines.append("dashed orange edge: Python number")
        if "hand-off" in self.keys:
            lines.append("blue edge: scalar hand-off")
        if "unfused" in self.keys:
            lines += _wrap("dashed box: an unfused op (no region took it; not an island)", "")
        if "fusion" in self.keys:
            lines += _wrap("double box: ops a fusion executor compiles together (its kernels: the count inductor gave, "
                           "or the executor decides)", "")
        if len(lines) == 1:
            return  # NOTE: nothing to explain (a region's colour is also said in its label: captured, eager, not run)
        attrs = {"fontsize": "9", "shape": "note"}
        if defects:
            attrs.update(color=WRONG_COLOR if wrong or crash else DEFECT_COLOR)
        # NOTE: on the last rank, under the drawing: beside the inputs it would widen the diagram
        with g.subgraph(name="legend") as sub:
            sub.attr(rank="sink")
            sub.node("_legend", dot_text(*lines, sep=r"\l", end=r"\l"), **attrs)

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
                (self.draw_full if r.name in self.full else self.draw_collapsed)(g, r)
            else:
                self.draw_island_group(g, groups[pos])
        for r in unplaced:
            (self.draw_full if r.name in self.full else self.draw_collapsed)(g, r)
        self.draw_flows(g)
        self.draw_legend(g, lost)
        return g


def _wrap(text: str, indent: str) -> list[str]:
    """Wrap a legend line at `_LEGEND_WIDTH` characters, continuation lines indented further."""
    return textwrap.wrap(text, _LEGEND_WIDTH, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_on_hyphens=False)


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
    counts = Counter(ACTION_SHORT[a] for a in (plan.action(n) for n in plan.graph_memory) if a is not None)
    return "hand-out: " + " · ".join(f"{w} {n}" for w, n in counts.items()) if counts else "hand-out"


def _region_counts(r: Region) -> list[str]:
    """``["3 ops"]``; with fused groups also the kernel estimate: ``["1 op", "≈1 kernel"]``."""
    # NOTE: only regions with fused groups show their kernels here (the text report gives every region's),
    # so unfused diagrams stay as compact as they were
    return [plural(len(r.compute_ops), "op")] + ([kernels(r)] if r.fusions else [])


def _fused_label(group: FusedGroup) -> list[str]:
    """``7 ops fused (inductor)``, then the fused ops on up to two short lines."""
    lines = [f"{group.ops_text()} fused ({group.executor})", group.kernels_text()]
    if group.ops:
        text = ", ".join(group.ops)
        wrapped = textwrap.wrap(text, 28, break_on_hyphens=False)
        lines += wrapped[:2]
        if len(wrapped) > 2:
            lines[-1] += " …"
    return lines


def _op_node(r: Region, op: Op) -> str:
    """Node id of a region statement: its first output (thunder's name), else region and line."""
    return node_id(op.outputs[0]) if op.outputs else node_id(r.name, "line", str(op.line))


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

