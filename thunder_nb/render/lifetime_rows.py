"""The rows of a lifetime chart: each value's steps (defined, read, deleted, freed) along a trace's flat step order."""

from __future__ import annotations

from dataclasses import dataclass

from ..diagnosis.model import Site, TraceReport, Value

__all__ = ["Row", "Axis", "step_axis", "value_rows", "pick_rows", "row_note"]


@dataclass(frozen=True, slots=True)
class Row:
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
class Axis:
    """The flat step order: top-level positions, a region's position expanded into its statements."""

    steps: tuple[str, ...]  # a label per step
    index: dict[tuple[int, int | None], int]
    spans: tuple[tuple[str, int, int], ...]  # (region, first step, last step)

    def of(self, site: Site) -> int:
        """The step of a site (a top-level position, or a statement inside a region)."""
        return self.index.get((site.position, site.index), self.index.get((site.position, None), 0))


def step_axis(trace: TraceReport) -> Axis:
    """The trace's flat step order: each top-level statement a step, a region's statements a step each."""
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
    return Axis(tuple(steps), index, tuple(spans))


def value_rows(trace: TraceReport, axis: Axis) -> list[Row]:
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
        rows.append(Row(v, start, max(last_use, start), max(end, start), dels, uses, tuple(dict.fromkeys(late)),
                         never, rules))
    return rows


def pick_rows(rows: list[Row], max_rows: int) -> tuple[list[Row], int]:
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


def row_note(row: Row, axis: Axis) -> str:
    """A row in words: ``input -> CUDAGraph1[3]@2; del @4; never freed``."""
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
