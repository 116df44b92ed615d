"""Frozen records that describe a function compiled with CUDA graphs: plain values, never thunder objects. The report
(`Report`, a `TraceReport` per trace) is here; what a trace report is made of is in `trace_parts`, re-exported."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .plans import HandOutPlan, HandOutStats
from .rules import (  # NOTE: re-exported: the records' vocabulary, imported from here across the package
    CRASH_RULES,
    ERROR_RULES,
    ISLAND_REASONS,
    OUTSIDE_REASONS,
    RULES,
    WRONG_RESULT_RULES,
    outside_name,
)
from .trace_parts import (
    Defect,
    FusedGroup,
    Op,
    Outside,
    Region,
    Site,
    SourceLine,
    TypeInfo,
    Value,
    count_phrases,
    plural,
    severity_counts,
)

__all__ = [
    "RULES",
    "ERROR_RULES",
    "ISLAND_REASONS",
    "OUTSIDE_REASONS",
    "outside_name",
    "WRONG_RESULT_RULES",
    "CRASH_RULES",
    "TypeInfo",
    "SourceLine",
    "FusedGroup",
    "LAUNCH_HOST_US",
    "Site",
    "Op",
    "Region",
    "Outside",
    "Value",
    "Defect",
    "TraceReport",
    "Report",
    "plural",
    "severity_counts",
    "count_phrases",
]

#: Host time one kernel launch costs, in microseconds, that a graph replay removes, as measured on an H200 (bench/results/
#: README.md, "Figures behind the defaults"). The report's launch-time estimate multiplies by it.
LAUNCH_HOST_US: float = 4.0


@dataclass(frozen=True, slots=True)
class TraceReport:
    """One trace (forward or backward) of a compiled function: its regions and what runs outside them."""

    kind: str  # "forward" | "backward" | "source"
    name: str  # the generated function's name, "computation" / "backward_fn"
    provenance: str  # thunder's "Constructed by ..." line
    source: str  # the top-level Python source
    ops: tuple[Op, ...]  # top-level statements in order
    regions: tuple[Region, ...]
    outside: tuple[Outside, ...]  # top-level statements outside every region (islands among them)
    values: tuple[Value, ...]
    defects: tuple[Defect, ...]
    params: tuple[str, ...] = ()
    is_cuda: bool = False
    hand_out: HandOutPlan | None = None  # what leaves the trace (thunder-nb transforms only)
    hand_out_stats: HandOutStats = HandOutStats()
    # (value name, dotted path of the module parameter or buffer it is, "transformer.h.0.attn.c_attn.weight"): from
    # the prologue's get_parameter/get_buffer calls; the diagrams group ops by module with it
    parameters: tuple[tuple[str, str], ...] = ()

    def region(self, name: str) -> Region:
        """Return the region called ``name``."""
        for r in self.regions:
            if r.name == name:
                return r
        raise KeyError(f"no region {name!r} (regions: {[r.name for r in self.regions]})")

    def value(self, name: str) -> Value:
        """Return the lifetime of ``name``."""
        for v in self.values:
            if v.name == name:
                return v
        raise KeyError(f"no value {name!r}")

    @property
    def kernels(self) -> int:
        """≈ kernels its regions launch per call (an estimate; see `Region.kernels`)."""
        return sum(r.kernels for r in self.regions)

    @property
    def launches_saved(self) -> int:
        """≈ kernel launches its regions' graph replays remove per call."""
        return sum(r.launches_saved for r in self.regions)

    @property
    def islands(self) -> tuple[Outside, ...]:
        """The islands: ops outside every region because capture cannot take them (`ISLAND_REASONS`)."""
        return tuple(o for o in self.outside if o.is_island)

    @property
    def user_islands(self) -> tuple[Outside, ...]:
        """The islands (`islands`; the name of an older version, when bookkeeping was counted among islands)."""
        return self.islands

    @property
    def unfused(self) -> tuple[Outside, ...]:
        """Capturable ops no region took (a one-op stretch): they run eagerly, and are not islands."""
        return tuple(o for o in self.outside if o.reason == "unfused")

    def _counts(self) -> str:
        """``forward: 1 region, 0 islands, 2 wrong results, 0 errors, 3 warnings``: what `Report`'s repr says of it."""
        return (f"{self.kind}: {plural(len(self.regions), 'region')}, {plural(len(self.islands), 'island')}, "
                f"{', '.join(count_phrases(self.defects))}")

    def __repr__(self) -> str:
        """One line at the Python prompt, e.g. ``<TraceReport 'computation' forward: 1 region, ...>`` (the dataclass's
        own holds every op, value and source line: 770,936 characters for notebook 05's nanoGPT step)."""
        return f"<TraceReport {self.name!r} {self._counts()}>"


@dataclass(frozen=True, slots=True)
class Report:
    """Everything thunder-nb knows about one compiled function."""

    function: str  # the user's function name
    transform: str  # "stock", "fixed", "legacy", or a class name
    forward: TraceReport
    backward: TraceReport | None = None
    error: str | None = None  # how the call failed, when it did ("RuntimeError: ...")
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def traces(self) -> tuple[TraceReport, ...]:
        """Forward, then backward when there is one."""
        return (self.forward,) if self.backward is None else (self.forward, self.backward)

    @property
    def defects(self) -> tuple[Defect, ...]:
        """All defects of all traces."""
        return tuple(d for t in self.traces for d in t.defects)

    @property
    def rules(self) -> tuple[str, ...]:
        """The sorted set of rules that fired."""
        return tuple(sorted({d.rule for d in self.defects}))

    @property
    def launch_us_saved(self) -> float:
        """≈ host microseconds per call that graph replays save: launches removed × `LAUNCH_HOST_US` (an estimate)."""
        return sum(t.launches_saved for t in self.traces) * LAUNCH_HOST_US

    def to_text(self) -> str:
        """Return the plain-text report (every view in text form)."""
        return VIEWS["text"](self)

    def __repr__(self) -> str:
        """One line at the Python prompt: the function, the transform, each trace's counts (`TraceReport._counts`: its
        defects counted as the text report counts them); ``to_text()`` has the rest."""
        error = f", error={self.error!r}" if self.error else ""
        return f"<Report {self.function!r} ({self.transform}): {'; '.join(t._counts() for t in self.traces)}{error}>"

    def _repr_mimebundle_(self, include=None, exclude=None):
        return VIEWS["mimebundle"](self, include=include, exclude=exclude)


#: How a `Report` shows itself: ``"text"`` (`Report.to_text`) and ``"mimebundle"`` (Jupyter's display), filled in by
#: `thunder_nb.render` when it is imported (``thunder_nb`` imports it): the records never import what draws them.
VIEWS: dict[str, Callable[..., Any]] = {}

