"""Value lifetimes of a trace along its flat step order: a text chart and a standalone SVG chart."""

from __future__ import annotations

from dataclasses import dataclass

from ..diagnosis.model import Outside, TraceReport
from .common import DEFECT_COLOR, ISLAND_FILL, REGION_COLORS, SCALAR_COLOR, esc, plural, type_label
from .lifetime_rows import Axis, Row, pick_rows, row_note, step_axis, value_rows

__all__ = ["MAX_ROWS", "SVG_WIDTH", "lifetime_text", "lifetime_svg"]

#: Most value rows a lifetime view shows; the rest are summarised in a note.
MAX_ROWS = 200

_TEXT_BAR_WIDTH = 64


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _bar(row: Row, n: int, width: int) -> str:
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
    axis = step_axis(trace)
    rows, more = pick_rows(value_rows(trace, axis), max_rows)
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
        lines.append(f"  {name:<{nw}} {type_:<{tw}} |{_bar(r, n, width)}| {row_note(r, axis)}")
    if more:
        lines.append(f"  … {more} more values")
    return "\n".join(lines)


#: Width in px the SVG chart keeps within (a notebook column): the step axis shrinks to fit.
SVG_WIDTH = 860

_NAME_CHARS = 24  # NOTE: longer names (a model's parameters) end in "…" on the chart; the row's tooltip has them whole
_ROW_H = 18  # NOTE: readable rows: at least 18 px each
_LANE_H = 15
_CHAR_W = {10: 6.0, 11: 6.6}  # NOTE: monospace advance at these font sizes, to place labels without cutting them
_LIVE, _HELD, _NEVER, _INK = "#364fc7", "#adb5bd", "#f08c00", "#212529"
_TICK_STEPS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


def _lanes(labels: list[tuple[float, str]], font: int, right: float) -> list[tuple[float, int, str]]:
    """Place labels left to right at their x, each in the first lane where it does not overlap; (x, lane, text).

    A label that would run past ``right`` is moved left to end there: labels are never cut.
    """
    ends: list[float] = []
    out = []
    for x, text in labels:
        w = len(text) * _CHAR_W[font] + 6
        x = max(0.0, min(x, right - w))
        lane = next((k for k, end in enumerate(ends) if end <= x), len(ends))
        if lane == len(ends):
            ends.append(0.0)
        ends[lane] = x + w
        out.append((x, lane, text))
    return out


def _tick(n: int, step_w: float) -> int:
    """Steps between axis labels, so that labels stand at least 40 px apart."""
    return next((k for k in _TICK_STEPS if k * step_w >= 40), _TICK_STEPS[-1])


def _column_name(o: Outside) -> str:
    """The label of a column: the island's name (``island3``), or ``hand-out`` (never called an island)."""
    return o.name if o.is_island else "hand-out"


#: The sample of a red row name in the key.
_NAME_SAMPLE = "name"


def _key(width: float, y: float, has_number: bool, has_hand_out: bool = False,
         has_defect: bool = False) -> tuple[list[str], float]:
    """The colour key as SVG parts from ``y`` down, wrapped to ``width``; returns (parts, height)."""
    items = [
        ("bar", _LIVE, "live: defined to last use"),
        *([("bar", "#e8590c", "a Python number")] if has_number else []),
        ("held", _HELD, "held after its last use"),
        ("held", _NEVER, "never freed"),
        ("del", _INK, "del"),
        ("dot", DEFECT_COLOR, "use after del"),
        # NOTE: a row's name is red when the value has a defect (`_row_svg`): the key says so with a red name
        *([("name", DEFECT_COLOR, "a value with a defect")] if has_defect else []),
        ("shade", REGION_COLORS[0], "region (its statements)"),
        ("shade", ISLAND_FILL["host-sync"], "island"),
        *([("shade", "#e9ecef", "hand-out (not an island)")] if has_hand_out else []),
    ]
    parts = ['<g class="tnb-key">']
    x, line = 4.0, 0
    for kind, color, text in items:
        sample = 22 + (len(_NAME_SAMPLE) * _CHAR_W[11] - 16 if kind == "name" else 0)  # the sample, then the text
        w = sample + len(text) * _CHAR_W[11] + 16
        if x + w > width and x > 4:
            x, line = 4.0, line + 1
        cy = y + line * _LANE_H + 7
        if kind == "name":
            parts.append(f'<text x="{x}" y="{cy + 4}" fill="{color}">{_NAME_SAMPLE}</text>')
        elif kind == "bar":
            parts.append(f'<rect x="{x}" y="{cy - 4}" width="16" height="8" fill="{color}"/>')
        elif kind == "held":
            parts.append(f'<rect x="{x}" y="{cy - 1}" width="16" height="2" fill="{color}"/>')
        elif kind == "del":
            parts.append(f'<path d="M{x + 4} {cy - 5}L{x + 12} {cy + 5}M{x + 12} {cy - 5}L{x + 4} {cy + 5}" '
                         f'stroke="{color}" stroke-width="1.5"/>')
        elif kind == "dot":
            parts.append(f'<circle cx="{x + 8}" cy="{cy}" r="4" fill="{color}"/>')
        else:
            parts.append(f'<rect x="{x}" y="{cy - 6}" width="16" height="12" fill="{color}"/>')
        parts.append(f'<text x="{x + sample}" y="{cy + 4}">{esc(text)}</text>')
        x += w
    parts.append("</g>")
    return parts, (line + 1) * _LANE_H + 4


def lifetime_svg(trace: TraceReport, *, max_rows: int = MAX_ROWS, width: int = SVG_WIDTH) -> str:
    """Draw the value lifetimes of a trace as a standalone SVG (no Graphviz needed), at most ``width`` px wide.

    One row per value: a bar from its definition to its last use, a thinner bar while it is held
    afterwards (orange when it is never freed), ``del`` crosses, and red dots for uses after a del.
    Above the rows: the regions (shaded spans) and islands (columns), each named, and a step axis;
    below them a colour key. At most ``max_rows`` rows; a note counts the rest. Every label is
    shown whole; tooltips repeat each row's steps by name.
    """
    axis = step_axis(trace)
    rows, more = pick_rows(value_rows(trace, axis), max_rows)
    notes = [[s for s, on in (("never freed", r.never_freed), ("use after del", bool(r.late_uses))) if on] for r in rows]
    at = _layout(trace, axis, rows, more, notes, width)
    key, key_h = _key(width, at.bottom + 8, any(r.value.is_scalar for r in rows),
                      any(not o.is_island for o, _ in at.islands), any(r.defects or r.late_uses for r in rows))
    height = at.bottom + 8 + key_h
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="tnb-lifetime" width="{width}" height="{height:.0f}" '
        f'viewBox="0 0 {width} {height:.0f}" font-family="monospace" font-size="11">',
        f"<title>{esc(f'lifetimes: {trace.kind} {trace.name}')}</title>",
    ]
    out += _bands_svg(axis, at)
    out.append(_axis_svg(len(axis.steps), at))
    out += [_row_svg(r, at.top + i * _ROW_H, note, axis, at) for i, (r, note) in enumerate(zip(rows, notes))]
    if more:
        out.append(f'<text x="4" y="{at.bottom - 5}">{esc(f"… {more} more values")}</text>')
    out += key
    out.append("</svg>")
    return "\n".join(out)


@dataclass(frozen=True, slots=True)
class _Layout:
    """Where the parts of a lifetime chart go, in px: columns, step width, the tops of its bands and rows."""

    left: float  # x of step 0 (after the name column)
    step_w: float
    right: float  # x after the last step
    top_spans: float  # region names, then island names, then the step axis, then the rows
    top_islands: float
    top_axis: float
    top: float
    bottom: float  # below the last row (and the "more values" line)
    span_labels: list[tuple[float, int, str]]  # (x, lane, name) per region span
    islands: list[tuple[Outside, int]]  # (island or hand-out, its step) for each column drawn
    island_labels: list[tuple[float, int, str]]

    def x(self, step: float) -> float:
        return round(self.left + step * self.step_w, 2)


def _layout(trace: TraceReport, axis: Axis, rows: list[Row], more: int, notes: list[list[str]],
            width: int) -> _Layout:
    """Size the name and note columns to their longest texts, the steps to what is left, the bands to their lanes."""
    n = len(axis.steps)
    name_w = max([min(len(r.value.name), _NAME_CHARS) for r in rows] + [6]) * _CHAR_W[11] + 12
    longest = max([len(", ".join(v)) for v in notes if v] + [0])
    note_w = longest * _CHAR_W[11] + (12 if longest else 4)
    plot_w = max(width - name_w - note_w, 120.0)
    step_w = min(16.0, plot_w / n)
    left = name_w

    def x(step: float) -> float:
        return round(left + step * step_w, 2)

    span_labels = _lanes([(x(first), name) for name, first, _ in axis.spans], 11, width)
    # NOTE: islands and the hand-out get a column; bookkeeping and unfused ops none (they are no islands)
    drawn = [i for i in trace.outside if i.is_island or i.reason == "hand-out"]
    islands = [(isl, axis.index[(isl.position, None)]) for isl in drawn if (isl.position, None) in axis.index]
    island_labels = _lanes([(x(step), _column_name(isl)) for isl, step in islands], 11, width)
    span_lanes = 1 + max((lane for _, lane, _ in span_labels), default=-1)
    island_lanes = 1 + max((lane for _, lane, _ in island_labels), default=-1)
    top_spans = 4
    top_islands = top_spans + span_lanes * _LANE_H
    top_axis = top_islands + island_lanes * _LANE_H
    top = top_axis + 22
    bottom = top + _ROW_H * len(rows) + (_ROW_H if more else 0)
    return _Layout(left, step_w, left + step_w * n, top_spans, top_islands, top_axis, top, bottom, span_labels,
                   islands, island_labels)


def _bands_svg(axis: Axis, at: _Layout) -> list[str]:
    """The shaded region spans and island columns behind the rows, each with its name in its lane."""
    out = []
    for k, ((name, first, last_step), (lx, lane, _)) in enumerate(zip(axis.spans, at.span_labels)):
        color = REGION_COLORS[k % len(REGION_COLORS)]
        out.append(
            f'<g class="tnb-span"><title>{esc(f"{name}: steps {first}-{last_step}")}</title>'
            f'<rect x="{at.x(first)}" y="{at.top_spans}" width="{round((last_step - first + 1) * at.step_w, 2)}" '
            f'height="{at.bottom - at.top_spans:.0f}" fill="{color}" opacity="0.6"/>'
            f'<text x="{lx + 2:.1f}" y="{at.top_spans + lane * _LANE_H + 11}">{esc(name)}</text></g>'
        )
    for (isl, step), (lx, lane, label) in zip(at.islands, at.island_labels):
        fill = ISLAND_FILL.get(isl.reason, "#e9ecef")
        what = f"{isl.name}: {isl.label}" if isl.is_island else f"hand-out @{isl.position}: what leaves the trace"
        cls = "tnb-island" if isl.is_island else "tnb-hand-out"
        out.append(
            f'<g class="{cls}"><title>{esc(what)}</title>'
            f'<rect x="{at.x(step)}" y="{at.top_islands}" width="{round(max(at.step_w, 2), 2)}" '
            f'height="{at.bottom - at.top_islands:.0f}" fill="{fill}"/>'
            f'<text x="{lx + 2:.1f}" y="{at.top_islands + lane * _LANE_H + 11}">{esc(label)}</text></g>'
        )
    return out


def _axis_svg(n: int, at: _Layout) -> str:
    """The step axis: a line with a numbered tick every few steps."""
    y = at.top_axis
    ticks = [f'<text x="4" y="{y + 12}">step</text>',
             f'<path d="M{at.left} {y + 16}H{at.right:.2f}" stroke="{_INK}"/>']
    for s in range(0, n, _tick(n, at.step_w)):
        ticks.append(f'<path d="M{at.x(s + 0.5)} {y + 13}V{y + 19}" stroke="{_INK}"/>'
                     f'<text x="{at.x(s + 0.5)}" y="{y + 11}" text-anchor="middle">{s}</text>')
    return f'<g class="tnb-axis">{"".join(ticks)}</g>'


def _row_svg(r: Row, y: float, note: list[str], axis: Axis, at: _Layout) -> str:
    """One value's row at ``y``: its name, live bar, held bar, del crosses, uses after a del, and its note."""
    v = r.value
    tip = f"{v.name} {type_label(v)}: {row_note(r, axis)}" + (f" [{', '.join(r.defects)}]" if r.defects else "")
    color = SCALAR_COLOR if v.is_scalar else _LIVE
    fill = DEFECT_COLOR if r.defects or r.late_uses else _INK
    parts = [f'<g class="tnb-row"><title>{esc(tip)}</title>',
             f'<text x="4" y="{y + 13}" fill="{fill}">{esc(_fit(v.name, _NAME_CHARS))}</text>',
             f'<rect x="{at.x(r.start)}" y="{y + 4}" width="{round(max((r.last_use - r.start + 1) * at.step_w, 1), 2)}" '
             f'height="10" fill="{color}"/>']
    if r.end > r.last_use:
        held = _NEVER if r.never_freed else _HELD
        parts.append(f'<rect class="tnb-held" x="{at.x(r.last_use + 1)}" y="{y + 8}" '
                     f'width="{round((r.end - r.last_use) * at.step_w, 2)}" height="2" fill="{held}"/>')
    for d in r.dels:
        cx, w = at.x(d + 0.5), round(max(min(at.step_w, 10), 6) / 2, 2)
        cross = f"M{cx - w} {y + 3}L{cx + w} {y + 15}M{cx + w} {y + 3}L{cx - w} {y + 15}"
        parts.append(f'<path class="tnb-del" d="{cross}" stroke="{_INK}" stroke-width="1.5"/>')
    for u in r.late_uses:
        parts.append(f'<circle class="tnb-use-after-del" cx="{at.x(u + 0.5)}" cy="{y + 9}" r="4.5" '
                     f'fill="{DEFECT_COLOR}"/>')
    if note:
        parts.append(f'<text x="{at.right + 8:.2f}" y="{y + 13}" fill="{DEFECT_COLOR}">{esc(", ".join(note))}</text>')
    parts.append("</g>")
    return "".join(parts)
