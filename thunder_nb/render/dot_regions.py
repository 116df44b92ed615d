"""A region in the diagram: one summary node when collapsed, else a cluster of its ops between its inputs and outputs.

Each function takes the diagram's builder (`thunder_nb.render.dot`) first: its trace and values, its ``node`` and
``edge`` (which add the red marks of defects), the marks of whole regions, and the legend's ``keys``.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from typing import TYPE_CHECKING, Any

from ..diagnosis.model import FusedGroup, Op, Region
from .common import (
    FUSION_FILL, HANDOFF_COLOR, SCALAR_COLOR, fused_kernels, fused_line, kernels, plural, replay_kernels,
    state, state_fill, type_label,
)
from .dot_syntax import dot_text, node_id, tip_lines
from .memory import (
    ACTION_SHORT, ROLE_SHORT, Entry, input_roles, inputs_summary, known, output_actions, outputs_summary, region_memory,
)

__all__ = ["region_summary", "region_tips", "draw_collapsed", "draw_full", "handoffs", "region_counts", "op_node"]

if TYPE_CHECKING:
    import graphviz


def region_summary(b: Any, r: Region) -> list[str]:
    """The lines of a collapsed region's node: name, counts and state, inputs and outputs, its commonest ops."""
    lines = [r.name, " · ".join(region_counts(r) + [state(r)])]
    ins, outs = inputs_summary(b.trace, r), outputs_summary(b.trace, r)
    lines += [ins, outs] if known(b.trace, r) else [f"{ins} · {outs}"]
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


def draw_collapsed(b: Any, g: graphviz.Digraph, r: Region) -> None:
    """Draw the region as one summary node (a 3-D box in its state's colour)."""
    attrs = {"fillcolor": state_fill(r), "shape": "box3d", "style": "filled"}
    b.node(g, node_id(r.name), region_summary(b, r), region_tips(b, r), attrs)


def region_tips(b: Any, r: Region) -> list[str]:
    """The tooltip of a region: its state (and its kernels and fused groups, when it has some), then its memory plan."""
    tips = [f"{r.name}: {state(r)}"]
    if r.fusions:
        tips[0] += f", {replay_kernels(r)}"
        tips += [fused_line(group) for group in r.fusions]
    if known(b.trace, r):
        tips += [str(e) for e in region_memory(b.trace, r)]
    return tips


def draw_full(b: Any, g: graphviz.Digraph, r: Region) -> None:
    """Draw the region as a cluster: a node per input, per op (fused groups boxed twice) and per output."""
    with g.subgraph(name=node_id("cluster", r.name)) as c:
        c.attr(**cluster_attrs(b, r))
        plan = {n: e for e in region_memory(b.trace, r) for n in e.names} if known(b.trace, r) else {}
        draw_region_inputs(b, c, r, plan)
        producers = {n: node_id(r.name, "in", n) for n in r.inputs}
        fusions = {group.name: group for group in r.fusions}
        for op in r.compute_ops:
            nid = op_node(r, op)
            head = f"{', '.join(op.outputs)} = {op.callee}" if op.outputs else op.callee
            group = fusions.get(op.callee.rsplit(".", 1)[-1])
            if group is not None:
                b.keys.add("fusion")
                b.node(c, nid, [head, *_fused_label(group)], [fused_line(group, limit=40), op.text],
                          {"fillcolor": FUSION_FILL, "peripheries": "2", "shape": "box", "style": "filled"})
                continue
            b.node(c, nid, [head], [op.text], {"fillcolor": "white", "shape": "box", "style": "filled"})
            for n in op.inputs:
                if n in producers:
                    b.edge(c, producers[n], nid, [n])
            for n in op.outputs:
                producers[n] = nid
        draw_region_outputs(b, c, r, plan)
        for name in r.outputs:
            if name in producers:
                b.edge(c, producers[name], node_id(r.name, "out", name), [name])


def cluster_attrs(b: Any, r: Region) -> dict[str, str]:
    """A drawn region's cluster: its label (ops, state, inputs and outputs, hand-offs, marks), fill and tooltip."""
    label = [" · ".join([r.name, *region_counts(r), state(r)])]
    if known(b.trace, r):
        label.append(f"{inputs_summary(b.trace, r)} · {outputs_summary(b.trace, r)}")
    if r.scalar_handoffs:
        label.append("hand-offs: " + ", ".join(map(str, r.scalar_handoffs)))
    attrs = {"fillcolor": state_fill(r), "style": "filled,rounded",
             "tooltip": dot_text(*tip_lines(region_tips(b, r)))}
    mark = b.region_marks.get(r.name)
    if mark is not None:
        label += mark.label_lines()
        attrs.update(mark.attrs(region_tips(b, r)))
    return {"label": dot_text(*label), **attrs}


def draw_region_inputs(b: Any, c: graphviz.Digraph, r: Region, plan: dict[str, Entry]) -> None:
    """A node per region input: its role, numbers and hand-offs coloured, its memory plan in the tooltip."""
    # NOTE: inputs are not held on one rank: each sits above its first use, which keeps the cluster narrow
    handoff_names = {n for pair in handoffs(r) for n in pair}
    roles = input_roles(b.trace, r) if known(b.trace, r) else {}
    for name in r.inputs:
        v = b.values.get(name)
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
        b.node(c, node_id(r.name, "in", name), lines, tips, attrs)


def draw_region_outputs(b: Any, c: graphviz.Digraph, r: Region, plan: dict[str, Entry]) -> None:
    """The region's outputs on one rank, each with what happens to it when it leaves the trace."""
    with c.subgraph() as outs:
        outs.attr(rank="same")
        actions = output_actions(b.trace, r) if known(b.trace, r) else {}
        for name in r.outputs:
            v = b.values.get(name)
            tips = [f"{r.name} output {name} {type_label(v)}".rstrip()]
            lines = [name]
            if name in actions:
                lines.append(ACTION_SHORT[actions[name][0]])
            if name in plan:
                tips.append(f"{plan[name].label}: {plan[name].reason}")
            b.node(outs, node_id(r.name, "out", name), lines, tips,
                      {"fontsize": "9", "height": "0.25", "shape": "house"})


def handoffs(region: Region) -> list[tuple[str, str]]:
    """The (number, tensor) pairs of the region's hand-offs to a 0-d tensor of the trace."""
    return [(h.number, h.tensor) for h in region.scalar_handoffs if h.tensor]


def region_counts(r: Region) -> list[str]:
    """``["3 ops"]``; with fused groups also the kernel estimate: ``["1 op", "≈1 kernel"]``."""
    # NOTE: only regions with fused groups show their kernels here (the text report gives every region's),
    # so unfused diagrams stay as compact as they were
    return [plural(len(r.every_op), "op")] + ([kernels(r)] if r.fusions else [])


def _fused_label(group: FusedGroup) -> list[str]:
    """``7 ops fused (inductor)``, its kernels (``+ 2 library calls`` on a line of its own), then the fused ops on up to
    two short lines."""
    lines = [f"{group.ops_text()} fused ({group.executor})", *fused_kernels(group, names=False)]
    if group.ops:
        text = ", ".join(group.ops)
        wrapped = textwrap.wrap(text, 28, break_on_hyphens=False)
        lines += wrapped[:2]
        if len(wrapped) > 2:
            lines[-1] += " …"
    return lines


def op_node(r: Region, op: Op) -> str:
    """Node id of a region statement: its first output (thunder's name), else region and line."""
    return node_id(op.outputs[0]) if op.outputs else node_id(r.name, "line", str(op.line))
