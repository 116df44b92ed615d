"""What every view shares: the palette, the wording of counts, sizes, states and verdicts, and HTML escaping."""

from __future__ import annotations

import html
import re
from collections import Counter
from collections.abc import Sequence

from ..diagnosis.build import library_calls
# NOTE: plural and the defect counts are the model's own (its reprs count as the reports do), re-exported here
from ..diagnosis.model import (
    LAUNCH_HOST_US, Defect, FusedGroup, Region, Report, TraceReport, Value, count_phrases, plural, severity_counts,
)

__all__ = [
    "STATE_FILL",
    "state_fill",
    "ISLAND_FILL",
    "FUSION_FILL",
    "REGION_COLORS",
    "DEFECT_COLOR",
    "WRONG_COLOR",
    "SCALAR_COLOR",
    "HANDOFF_COLOR",
    "BOOKKEEPING",
    "esc",
    "plural",
    "severity_counts",
    "count_phrases",
    "size",
    "type_label",
    "state",
    "values",
    "provenance",
    "has_region",
    "region_colors",
    "verdict",
    "kernels",
    "replay_kernels",
    "library_text",
    "fused_kernels",
    "fused_line",
    "launch_line",
]

#: A region's fill by its `RegionStats.state`: green captured, orange eager, red a recording that raised, grey not run.
STATE_FILL = {"captured": "#d3f9d8", "eager": "#ffe8cc", "capture failed": "#ffe3e3", "raised": "#ffe3e3",
              "not run": "#f1f3f5"}
FUSION_FILL = "#e7f5ff"  # NOTE: a fused group inside a region: pale blue, apart from the white single ops
ISLAND_FILL = {"host-sync": "#fff3bf", "device-transfer": "#ffd8a8", "cpu-op": "#ffc9c9",
               "collective": "#eebefa"}  # NOTE: a collective or its wait: communication between ranks
REGION_COLORS = ("#d0ebff", "#d3f9d8", "#e5dbff", "#fff3bf", "#ffe3e3", "#c3fae8", "#ffe8cc", "#f3d9fa")
DEFECT_COLOR = "#e03131"
WRONG_COLOR = "#a61e4d"  # NOTE: "wrong result" is worse than an error: the run succeeds with wrong numbers
SCALAR_COLOR = "#e8590c"
HANDOFF_COLOR = "#1971c2"
#: Reasons of statements outside regions that are bookkeeping (the hand-out too): drawn small, never islands.
BOOKKEEPING = ("bookkeeping", "collection", "hand-out")

_TIMING = re.compile(r"\s*\(took \d+ milliseconds\)")


def esc(text: object) -> str:
    """Escape ``text`` for HTML and SVG text and attribute values."""
    return html.escape(str(text), quote=True)


def size(n: int) -> str:
    """``96 B``, ``1.5 KiB``, ``2.0 MiB``."""
    if n < 1024:
        return f"{n} B"
    value, unit = float(n), "B"
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024:
            break
    return f"{value:.1f} {unit}"


def type_label(v: Value | None) -> str:
    """A value's short type (``f32[8,16]``, ``float``), or "" when unknown."""
    if v is None or (v.type.kind == "other" and not v.type.text):
        return ""
    return v.type.short()


def state(region: Region) -> str:
    """``captured``, ``eager``, ``capture failed``, ``raised UnboundLocalError`` or ``not run``
    (`RegionStats.state_text`)."""
    return region.stats.state_text


def state_fill(region: Region) -> str:
    """The region's fill colour for its state (`STATE_FILL`)."""
    return STATE_FILL[region.stats.state]


def values(trace: TraceReport) -> dict[str, Value]:
    """The trace's values by name."""
    return {v.name: v for v in trace.values}


def provenance(trace: TraceReport) -> str:
    """thunder's provenance line without the pass's run time."""
    # NOTE: thunder's provenance carries the pass's run time; drop it so that output is deterministic
    return _TIMING.sub("", trace.provenance).strip()


def has_region(trace: TraceReport, name: str) -> bool:
    """True when the trace has a region called ``name``."""
    return any(r.name == name for r in trace.regions)


def region_colors(trace: TraceReport) -> dict[str, str]:
    """A background colour per region, the same in the source view and the lifetime chart."""
    return {r.name: REGION_COLORS[k % len(REGION_COLORS)] for k, r in enumerate(trace.regions)}


def verdict(defects: Sequence[Defect]) -> str:
    """One line on a set of defects; the worst kind is named first (a dead process, then silent wrong results)."""
    crash, wrong, errors, warns = severity_counts(defects)
    counts = count_phrases(defects)
    if crash:
        return f"kills the process ({', '.join(counts)})"
    if errors:
        return f"fails or computes wrong values ({', '.join(counts)})"
    if wrong:
        return f"computes wrong results without an error ({', '.join(counts)})"
    if warns:
        return f"runs, but wastes time or memory ({plural(warns, 'warning')})"
    return "no defects found"


def kernels(region: Region) -> str:
    """``≈3 kernels``: the estimate of the kernels one run of the region launches, a fused group's library calls among
    them (`replay_kernels` says how many). A fused group whose count is not known (inductor compiles it on the first
    call, which has not run) gets no figure: ``≈3 kernels + 1 fused group (inductor decides its kernels)``, or
    ``kernels: inductor decides (1 fused group)`` where the region is nothing else. Never a bound: each op's own count
    is an estimate too (`thunder_nb.diagnosis.build.estimate_kernels`)."""
    if not region.undecided:
        return "≈" + plural(region.kernels, "kernel")
    who = "/".join(dict.fromkeys(g.executor for g in region.undecided))
    groups = plural(len(region.undecided), "fused group")
    known = region.kernels - len(region.undecided)  # NOTE: the estimate counts each undecided group as 1
    if known <= 0:
        return f"kernels: {who} decides ({groups})"
    return f"≈{plural(known, 'kernel')} + {groups} ({who} decides its kernels)"


def _library(region: Region) -> int:
    """Library calls among the kernels `kernels` counts: those of the fused groups whose kernels are known."""
    return sum(len(library_calls(g)) for g in region.fusions if g.kernels is not None)


def replay_kernels(region: Region) -> str:
    """``≈82 kernels per replay, 31 of them library calls (…)``: `kernels`, with the library calls it counts (each
    one kernel, though a library may launch more)."""
    n = _library(region)
    split = (f", {n} of them library calls (ops inductor hands to a library: matmuls, convolutions, attention)"
             if n else "")
    return f"{kernels(region)} per replay{split}"


def library_text(calls: Sequence[str]) -> str:
    """``31 library calls (linear ×25, matmul ×6)``: ops inductor hands to a library, by name, the commonest first."""
    counts = Counter(c.rsplit(".", 1)[-1] for c in calls)
    names = ", ".join(f"{c} ×{n}" if n > 1 else c for c, n in counts.most_common())
    return f"{plural(len(calls), 'library call')} ({names})"


def fused_kernels(group: FusedGroup, *, names: bool = True) -> list[str]:
    """A fused group's kernels: ``["inductor generated 51 kernels", "+ 31 library calls (linear ×25, matmul ×6)"]``
    (the ops' names only with ``names``); the second only where it hands ops to a library
    (`thunder_nb.diagnosis.build.library_calls`). ``["inductor decides its kernels"]`` when no count is known, with no
    figure: its library calls alone would be only part of its kernels."""
    if group.kernels is None:
        return [f"{group.executor} decides its kernels"]
    calls = library_calls(group)
    generated = f"{group.executor} generated {plural(group.kernels, 'kernel')}"
    if not calls:
        return [generated]
    return [generated, f"+ {library_text(calls) if names else plural(len(calls), 'library call')}"]


def fused_line(group: FusedGroup, limit: int = 12) -> str:
    """``TorchCompile0: 7 ops fused (inductor), inductor generated 2 kernels + 1 library call (linear): sin, mul, …``:
    a fused group, its kernels (or who decides them) and (the first ``limit`` of) its ops."""
    shown = ", ".join(group.ops[:limit]) + (f", +{len(group.ops) - limit} more" if len(group.ops) > limit else "")
    head = f"{group}, {' '.join(fused_kernels(group))}"
    return f"{head}: {shown}" if shown else head


def launch_line(report: Report) -> str:
    """The estimate of the host time graph replays save per call: kernel launches removed × `LAUNCH_HOST_US`."""
    regions = [r for t in report.traces for r in t.regions]
    undecided = sum(len(r.undecided) for r in regions)
    n_kernels = sum(r.kernels for r in regions) - undecided  # NOTE: without the groups whose kernels are not known
    graphs = sum(1 for r in regions if r.kernels)
    who = "/".join(dict.fromkeys(g.executor for r in regions for g in r.undecided))
    counts = ([f"≈{plural(n_kernels, 'kernel')}"] if n_kernels or not undecided else []) + (
        [f"{plural(undecided, 'fused group')} whose kernels {who} decides"] if undecided else [])
    estimate = f"estimate: {LAUNCH_HOST_US:g} µs per kernel launch removed, measured on an H200"
    if regions and not any(r.captured for r in regions) and any(r.captured is False for r in regions):
        # NOTE: regions that ran eagerly (no GPU, capture=False) saved nothing: say what a capture would save
        return (f"{' + '.join(counts)} in {plural(len(regions), 'region')} per call; nothing was captured in this run "
                f"(the regions ran eagerly): captured, {plural(graphs, 'graph launch', 'graph launches')} would save "
                f"≈{report.launch_us_saved:g} µs of host time per call ({estimate})")
    return (
        f"{' + '.join(counts)} in {plural(len(regions), 'region')} per call, replayed as "
        f"{plural(graphs, 'graph launch', 'graph launches')}: ≈{report.launch_us_saved:g} µs of host time saved "
        f"per call ({estimate})"
    )
