"""The plain-text report: verdict, then per trace its regions (with their memory plan), islands, defects, lifetimes."""

from __future__ import annotations

from collections.abc import Iterable

from ..diagnosis.model import Region, Report, TraceReport
from .common import fused_line, kernels, launch_line, plural, provenance, size, state, type_label, values, verdict
from .lifetimes import lifetime_text
from .memory import hand_out_line, hand_outs, known, region_memory

__all__ = ["report_text", "trace_text"]



def _value_list(trace: TraceReport, names: Iterable[str]) -> str:
    by_name = values(trace)
    items = []
    for n in names:
        v = by_name.get(n)
        item = f"{n} {type_label(v)}".rstrip()
        if v is not None and v.is_scalar:
            item += " (Python number)"
        items.append(item)
    return ", ".join(items) or "-"


def _region_text(trace: TraceReport, r: Region) -> list[str]:
    where = f" @{r.position}" if r.position >= 0 else ""
    replays = f", {plural(r.stats.replays, 'replay')}" if r.stats.replays else ""
    lines = [f"    {r.name}{where}: {plural(len(r.every_op), 'op')}, {kernels(r)}, {state(r)}{replays}"]
    for group in r.fusions:
        lines.append(f"      {fused_line(group)}")
    lines.append(f"      inputs:  {_value_list(trace, r.inputs)}")
    lines.append(f"      outputs: {_value_list(trace, r.outputs)}")
    for e in region_memory(trace, r) if known(trace, r) else ():
        lines.append(f"      {'⚠ ' if e.flagged else ''}{e}")
    if r.scalar_handoffs:
        lines.append(f"      hand-offs: {', '.join(map(str, r.scalar_handoffs))}")
    if r.graphs:
        graphs = "; ".join(
            f"#{g.index} {g.cause} (static {size(g.static_bytes)}"
            + (f", pool {size(g.pool_bytes)}" if g.pool_bytes is not None else "") + ")"
            for g in r.graphs
        )
        lines.append(f"      graphs: {graphs}")
    if r.held_calls:
        lines.append(
            f"      without the graph: {plural(r.held_calls, 'call')} (tensors its last replay saved for the "
            "backward were still held: a forward ran before the previous backward)"
        )
    return lines


def trace_text(trace: TraceReport) -> list[str]:
    """The text lines of one trace: regions with their memory plan, islands, the hand-out, defects, lifetimes."""
    n_ops = sum(len(r.every_op) for r in trace.regions)
    lines = [
        f"{trace.kind} trace `{trace.name}`: {plural(len(trace.regions), 'region')} ({plural(n_ops, 'op')}), "
        f"{plural(len(trace.islands), 'island')}" + (f", {plural(len(trace.unfused), 'unfused op')}" if trace.unfused
                                                      else ""),
    ]
    if provenance(trace):
        lines.append(f"  constructed by: {provenance(trace)}")
    lines.append("  regions:" if trace.regions else "  regions: none")
    for r in trace.regions:
        lines += _region_text(trace, r)
    lines.append("  islands (outside every graph: capture cannot take them):" if trace.islands else "  islands: none")
    for i in trace.islands:
        lines.append(f"    {i.name} @{i.position}: {i.label}: {i.op.text}")
    outs = hand_outs(trace)
    bookkeeping = sum(1 for i in trace.outside if i.kind == "bookkeeping")
    if trace.unfused or outs or bookkeeping or trace.hand_out is not None:
        lines.append("  also outside regions (not islands):")
    for i in trace.unfused:
        lines.append(f"    {i.name} @{i.position}: {i.label}: {i.op.text}")
    for i in outs:
        lines.append(f"    {i.name} @{i.position}: hand-out: {hand_out_line(trace)}")
    if bookkeeping:
        lines.append(f"    + {bookkeeping} bookkeeping (unpack, return, collection clearing)")
    if trace.hand_out is not None and not outs:
        lines.append("    (no hand-out: nothing leaves the trace in graph memory)")
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
        f"verdict: {verdict(report.defects)}",
    ]
    if report.error:
        lines.append(f"error: {report.error}")
    lines += [f"note: {n}" for n in report.notes]
    if any(t.regions for t in report.traces):
        lines.append(f"launches: {launch_line(report)}")
    for t in report.traces:
        lines.append("")
        lines += trace_text(t)
    return "\n".join(lines)

