"""Source views: the user's lines marked with the regions and islands they end up in, and the generated code."""

from __future__ import annotations

from dataclasses import dataclass

from ..diagnosis.model import RULES, Defect, Outside, Region, SourceLine, TraceReport
from .common import BOOKKEEPING, esc, has_region, region_colors

__all__ = ["source_text", "source_html", "trace_source_text", "trace_source_html"]


def _defect_user_line(trace: TraceReport, d: Defect) -> SourceLine | None:
    ops = trace.region(d.region).ops if d.region is not None and has_region(trace, d.region) else trace.ops
    return next((o.user_line for o in ops if o.line == d.line and o.user_line), None)



@dataclass(slots=True)
class _Marked:
    """A user's source line and where its ops end up."""

    source: SourceLine
    places: list[str]  # "CUDAGraph1", "island3 (host sync: item)"
    regions: list[str]
    defects: list[str]


def _source_lines(trace: TraceReport) -> list[_Marked]:
    """The user's lines in file order, each with the regions and islands its ops end up in."""
    found: dict[SourceLine, _Marked] = {}

    def entry(user_line: SourceLine) -> _Marked:
        if user_line not in found:
            found[user_line] = _Marked(user_line, [], [], [])
        return found[user_line]

    blocks: list[tuple[int, Region | Outside]] = [(r.position, r) for r in trace.regions]
    blocks += [(i.position, i) for i in trace.outside]
    for _, b in sorted(blocks, key=lambda pb: pb[0]):
        if isinstance(b, Region):
            for ul in b.user_lines:
                e = entry(ul)
                if b.name not in e.places:
                    e.places.append(b.name)
                    e.regions.append(b.name)
        elif b.op.user_line and b.reason not in BOOKKEEPING:
            e = entry(b.op.user_line)
            e.places.append(f"{b.name} ({b.label})" if b.is_island else b.label)
    for d in trace.defects:
        ul = _defect_user_line(trace, d)
        if ul is not None and d.rule not in entry(ul).defects:
            entry(ul).defects.append(d.rule)
    files = list(dict.fromkeys(e.source.file for e in found.values()))
    return sorted(found.values(), key=lambda e: (files.index(e.source.file), e.source.line))


def source_text(trace: TraceReport) -> str:
    """Return the user's source lines, each marked with the regions and islands it ends up in."""
    lines = [f"source: {trace.kind} `{trace.name}`"]
    entries = _source_lines(trace)
    if not entries:
        return lines[0] + "\n  (no user source lines in the trace)"
    cw = min(max(len(e.source.code) for e in entries), 60)
    file = None
    for e in entries:
        if e.source.file != file:
            file = e.source.file
            lines.append(f"  {file or '(unknown file)'}")
        marks = ", ".join(e.places)
        if e.defects:
            marks += ("  " if marks else "") + "⚠ " + ", ".join(e.defects)
        lines.append(f"  {e.source.line:>5}  {e.source.code:<{cw}}  {marks}".rstrip())
    return "\n".join(lines)


def source_html(trace: TraceReport) -> str:
    """Return the user's source lines as an HTML table, each line coloured by the region it ends up in."""
    colors = region_colors(trace)
    entries = _source_lines(trace)
    out = [f'<div class="tnb-source"><div class="tnb-h">source: {esc(trace.kind)} '
           f"<code>{esc(trace.name)}</code></div>"]
    if not entries:
        out.append("<p>(no user source lines in the trace)</p></div>")
        return "".join(out)
    out.append("<table>")
    file = None
    for e in entries:
        if e.source.file != file:
            file = e.source.file
            out.append(f'<tr><th colspan="3">{esc(file or "(unknown file)")}</th></tr>')
        bg = colors.get(e.regions[0], "") if e.regions else ""
        style = f' style="background:{bg}"' if bg else ""
        badges = "".join(
            f'<span class="tnb-badge" style="background:{colors[p]}">{esc(p)}</span>' if p in colors
            else f'<span class="tnb-badge tnb-island">{esc(p)}</span>'
            for p in e.places
        )
        badges += "".join(f'<span class="tnb-badge tnb-defect" title="{esc(RULES.get(r, r))}">⚠ {esc(r)}</span>'
                          for r in e.defects)
        out.append(f'<tr{style}><td class="tnb-ln">{e.source.line}</td><td><code>{esc(e.source.code)}</code></td>'
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


_LINE_CHARS = 240  # NOTE: with max_lines, longer lines (a signature of 79 parameters) end in "…"


def trace_source_html(trace: TraceReport, *, max_lines: int | None = None) -> str:
    """Return the generated top-level source and each region's source as HTML, defect lines highlighted.

    ``max_lines``: show at most this many lines of each source, and every defect line after them (a model's
    generated code is hundreds of kilobytes); `trace_source_text` has it all.
    """
    out = ['<div class="tnb-trace-source">']
    for title, source, marks in _sources(trace):
        out.append(f'<div class="tnb-h">{esc(title)}</div><pre class="tnb-code">')
        lines = source.splitlines()
        skipped = 0
        for k, text in enumerate(lines, start=1):
            ds = marks.get(k)
            if max_lines is not None and k > max_lines and not ds:
                skipped += 1
                continue
            if skipped:
                out.append(f'<span class="tnb-ln">   ⋮</span> … {skipped} lines\n')
                skipped = 0
            if max_lines is not None and len(text) > _LINE_CHARS:
                text = text[: _LINE_CHARS - 1] + "…"
            body = f'<span class="tnb-ln">{k:>4}</span> {esc(text)}'
            if ds:
                tip = "\n".join(f"{d.rule}: {d.message}" for d in ds)
                rules = ", ".join(dict.fromkeys(d.rule for d in ds))
                body = (f'<span class="tnb-defect-line" title="{esc(tip)}">{body}'
                        f'  <span class="tnb-rule">⚠ {esc(rules)}</span></span>')
            out.append(body + "\n")
        if skipped:
            out.append(f'<span class="tnb-ln">   ⋮</span> … {skipped} more lines (all of them: Report.to_text())\n')
        out.append("</pre>")
    out.append("</div>")
    return "".join(out)
