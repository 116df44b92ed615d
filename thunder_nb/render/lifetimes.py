"""Value lifetimes of a trace along its flat step order: a text chart and a standalone SVG chart."""

from __future__ import annotations

from dataclasses import dataclass

from ..model import Site, TraceReport, Value
from .common import DEFECT_COLOR, ISLAND_FILL, REGION_COLORS, SCALAR_COLOR, esc, plural, type_label

__all__ = ["MAX_ROWS", "lifetime_text", "lifetime_svg"]

#: Most value rows a lifetime view shows; the rest are summarised in a note.
MAX_ROWS = 200

_TEXT_BAR_WIDTH = 64

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
    lines = [f"lifetimes: {trace.kind} `{trace.name}` ({plural(len(trace.values), 'value')}, {plural(n, 'step')})"]
    if not rows:
        return lines[0] + "\n  (no values)"
    nw = min(max(len(r.value.name) for r in rows), 20)
    tw = min(max(len(type_label(r.value)) for r in rows), 16)
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
        name, type_ = _fit(r.value.name, nw), _fit(type_label(r.value), tw)
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
        f"<title>{esc(f'lifetimes: {trace.kind} {trace.name}')}</title>",
    ]
    for k, (name, first, last_step) in enumerate(axis.spans):
        color = REGION_COLORS[k % len(REGION_COLORS)]
        out.append(
            f'<g class="tnb-span"><title>{esc(f"{name}: steps {first}-{last_step}")}</title>'
            f'<rect x="{x(first)}" y="2" width="{round((last_step - first + 1) * step_w, 2)}" '
            f'height="{height - 4}" fill="{color}" opacity="0.6"/>'
            f'<text x="{x(first) + 2}" y="14">{esc(name)}</text></g>'
        )
    for isl in trace.user_islands:
        step = axis.index.get((isl.position, None))
        if step is not None:
            fill = ISLAND_FILL.get(isl.reason, "#e9ecef")
            out.append(
                f'<g class="tnb-island"><title>{esc(f"{isl.name}: {isl.label}")}</title>'
                f'<rect x="{x(step)}" y="2" width="{round(step_w, 2)}" height="{height - 4}" fill="{fill}"/></g>'
            )
    for i, r in enumerate(rows):
        y = top + i * row_h
        v = r.value
        flagged = bool(r.defects or r.late_uses)
        tip = f"{v.name} {type_label(v)}: {_row_note(r, axis)}" + (f" [{', '.join(r.defects)}]" if r.defects else "")
        color = SCALAR_COLOR if v.is_scalar else "#364fc7"
        fill = DEFECT_COLOR if flagged else "#212529"
        parts = [f'<g class="tnb-row"><title>{esc(tip)}</title>',
                 f'<text x="4" y="{y + 10}" fill="{fill}">{esc(v.name[:20])}</text>',
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
                         f'fill="{DEFECT_COLOR}"/>')
        notes = [s for s, on in (("never freed", r.never_freed), ("use after del", bool(r.late_uses))) if on]
        if notes:
            parts.append(f'<text x="{x(n) + 6}" y="{y + 10}" fill="{DEFECT_COLOR}">{esc(", ".join(notes))}</text>')
        parts.append("</g>")
        out.append("".join(parts))
    if more:
        out.append(f'<text x="4" y="{height - 6}">{esc(f"… {more} more values")}</text>')
    out.append("</svg>")
    return "\n".join(out)


