"""What a trace report is made of, as frozen records: statements (`Op`, with their types, places and the user's lines),
fused groups, regions, what runs outside them, value lifetimes and defects; and how they are counted in words."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .plans import GraphRecord, RegionPlan, RegionStats, ScalarHandoff
from .rules import CRASH_RULES, ERROR_RULES, ISLAND_REASONS, WRONG_RESULT_RULES

__all__ = ["TypeInfo", "SourceLine", "FusedGroup", "Site", "Op", "Region", "Outside", "Value", "Defect", "plural",
           "severity_counts", "count_phrases"]


def plural(n: int, word: str, plural_form: str | None = None) -> str:
    """``1 region``, ``2 regions`` (or ``plural_form``)."""
    return f"{n} {word if n == 1 else (plural_form or word + 's')}"


def severity_counts(defects: Sequence[Defect]) -> tuple[int, int, int, int]:
    """(crashing the process, wrong results, other errors, warnings) among ``defects``."""
    crash = sum(1 for d in defects if d.severity == "crashes the process")
    wrong = sum(1 for d in defects if d.severity == "wrong result")
    errors = sum(1 for d in defects if d.is_error) - wrong - crash
    return crash, wrong, errors, len(defects) - errors - wrong - crash


def count_phrases(defects: Sequence[Defect]) -> list[str]:
    """``["1 crashing the process", "2 wrong results", "0 errors", "3 warnings"]``, the worst first; the first two
    only where there are any."""
    crash, wrong, errors, warns = severity_counts(defects)
    return ([f"{crash} crashing the process"] if crash else []) + ([plural(wrong, "wrong result")] if wrong else []) + [
        plural(errors, "error"), plural(warns, "warning")]


@dataclass(frozen=True, slots=True)
class TypeInfo:
    """What thunder's type comment says of a value, e.g. ``"cuda:0 f32[8, 16]"`` or ``"float ?"``."""

    kind: str  # "tensor" | "number" | "collection" | "other"
    dtype: str | None = None  # "f32", "bf16", "float", "int", "bool", ...
    shape: tuple[int, ...] | None = None
    device: str | None = None  # "cpu", "cuda:0", ...
    text: str = ""  # the comment as thunder wrote it

    @property
    def is_scalar(self) -> bool:
        """True for a Python number (not a 0-d tensor)."""
        return self.kind == "number"

    def short(self) -> str:
        """Return a compact label: ``f32[8,16]``, ``float``, ``Collection``."""
        if self.kind == "tensor":
            dims = ",".join(str(d) for d in (self.shape or ()))
            return f"{self.dtype}[{dims}]"
        if self.kind == "number":
            return self.dtype or "number"
        return self.text or self.kind


@dataclass(frozen=True, slots=True)
class SourceLine:
    """A line of the user's source that thunder noted before a generated statement."""

    file: str
    line: int
    code: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.code}"


@dataclass(frozen=True, slots=True)
class Site:
    """A place in a trace: a top-level statement, or a statement inside a region."""

    position: int  # index of the top-level statement (0-based, in program order)
    region: str | None = None  # region name when the site is inside a region
    index: int | None = None  # index of the statement inside the region
    line: int | None = None  # 1-based line in the generated source (the region's own source inside a region)

    def label(self) -> str:
        """Return ``@3`` for top level, ``CUDAGraph1[2]@3`` inside a region."""
        if self.region is None:
            return f"@{self.position}"
        return f"{self.region}[{self.index}]@{self.position}"


@dataclass(frozen=True, slots=True)
class Op:
    """One statement of generated code: a call, a ``del`` or a ``return``."""

    kind: str  # "call" | "del" | "return" | "unpack" | "region"
    callee: str  # "torch.sin", "Tensor.item", "CUDAGraph1", "del", "return", ...
    outputs: tuple[str, ...]
    inputs: tuple[str, ...]
    line: int  # 1-based line in the source it comes from
    text: str  # the statement as written
    user_line: SourceLine | None = None  # the user's line thunder noted before the statement


@dataclass(frozen=True, slots=True)
class FusedGroup:
    """Ops a fusion executor fused into one symbol inside a region (``TorchCompile0``: inductor)."""

    name: str  # the fusion symbol's name, "TorchCompile0", "nvFusion1"
    executor: str  # who compiles it: "inductor", "nvFuser", or the executor's name
    ops: tuple[str, ...]  # the fused ops' names in order ("sin", "mul", ...); empty when unknown (source text)
    # kernels inductor generated for it when it compiled (torch._inductor.metrics); None: not known, the executor
    # decides (nvFuser, thunder's own torch_compile executor, or inductor's cache compiled nothing here)
    kernels: int | None = None
    # the fused ops as statements, in order (thunder's subsymbols with their inputs and outputs; `Op.line`: the place
    # among the group's ops, from 1), which place a fused op by the module it reads as an unfused one is placed; empty
    # when only the names are known (source text)
    statements: tuple[Op, ...] = ()
    # the ops inductor hands to a library instead of generating them (`thunder_nb.diagnosis.build.LIBRARY_NAMES`:
    # matmuls, convolutions, attention), read from the live trace; None: not read (source text)
    library: tuple[str, ...] | None = None

    def __str__(self) -> str:
        return f"{self.name}: {self.ops_text()} fused ({self.executor})"

    def ops_text(self) -> str:
        """``7 ops``, or ``ops`` when they are not known."""
        n = len(self.ops)
        return (f"{n} op" if n == 1 else f"{n} ops") if self.ops else "ops"


@dataclass(frozen=True, slots=True)
class Region:
    """A group of bound symbols captured (or to be captured) as one CUDA graph."""

    name: str  # thunder's name, "CUDAGraph1"
    position: int  # index of the region's call among the top-level statements
    ops: tuple[Op, ...]  # the region function's statements in order (dels and return included)
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    static_mask: tuple[bool, ...]
    source: str  # Python source of the region function
    user_lines: tuple[SourceLine, ...]  # user source lines the region covers
    plan: RegionPlan | None = None  # the transform's plan (thunder-nb transforms only)
    stats: RegionStats = RegionStats()
    # ≈ kernels one run of the region launches: an estimate (`thunder_nb.diagnosis.build.estimate_kernels`); a fused
    # group whose count is not known counts 1 (`undecided`)
    kernels: int = 0
    fusions: tuple[FusedGroup, ...] = ()  # fusion symbols among its statements, in order

    @property
    def undecided(self) -> tuple[FusedGroup, ...]:
        """Fused groups whose kernels the executor decides (no count known): each counts 1 in `kernels`."""
        return tuple(g for g in self.fusions if g.kernels is None)

    @property
    def launches_saved(self) -> int:
        """≈ kernel launches a replay removes: its kernels, less the one graph launch that replaces them."""
        return max(self.kernels - 1, 0)

    @property
    def compute_ops(self) -> tuple[Op, ...]:
        """The region's calls, without dels and the return."""
        return tuple(o for o in self.ops if o.kind == "call")

    @property
    def every_op(self) -> tuple[Op, ...]:
        """`compute_ops` with each fused group's call replaced by the ops fused in it, where they are known
        (`FusedGroup.statements`): what the region computes, counted as an unfused region's ops are."""
        groups = {group.name: group.statements for group in self.fusions}
        return tuple(o for op in self.compute_ops for o in (groups.get(op.callee.rsplit(".", 1)[-1]) or (op,)))

    @property
    def captured(self) -> bool | None:
        """True: a graph was captured; False: ran eagerly; None: not run."""
        return self.stats.captured

    @property
    def graphs(self) -> tuple[GraphRecord, ...]:
        """The graphs captured for this region."""
        return self.stats.graphs

    @property
    def held_calls(self) -> int:
        """Calls run without a graph because saved outputs of every instance were still held."""
        return self.stats.held_calls

    @property
    def scalar_handoffs(self) -> tuple[ScalarHandoff, ...]:
        """Numbers handed to the region on the device."""
        return self.plan.scalar_handoffs if self.plan is not None else ()

    def __repr__(self) -> str:
        """One line at the Python prompt (the dataclass's own holds every op and the source: 100,000s of characters for
        a model's region); `source` and `ops` have the rest."""
        ran = {"eager": "ran eagerly"}.get(self.stats.state, self.stats.state_text)
        return (f"<Region {self.name!r} @{self.position}: {plural(len(self.every_op), 'op')}, "
                f"≈{plural(self.kernels, 'kernel')}, {plural(len(self.inputs), 'input')}, "
                f"{plural(len(self.outputs), 'output')}, {ran}>")


@dataclass(frozen=True, slots=True)
class Outside:
    """A top-level statement that runs outside every region: an island, bookkeeping, the hand-out or an unfused op.

    Only an island (``reason`` in `ISLAND_REASONS`: capture cannot take it) is called and counted an island;
    `TraceReport.islands` holds those, `TraceReport.outside` all of them.
    """

    # "island3" for an island, "hand_out5", "step2" (bookkeeping), "op4" (unfused): kind and top-level position
    name: str
    position: int
    op: Op
    reason: str  # a key of ISLAND_REASONS or OUTSIDE_REASONS
    detail: str  # e.g. "item", "cpu -> cuda:0"

    @property
    def is_island(self) -> bool:
        """True for an island: an op capture cannot take (`ISLAND_REASONS`)."""
        return self.reason in ISLAND_REASONS

    @property
    def kind(self) -> str:
        """``island``, ``hand-out``, ``bookkeeping`` (collection clearing included) or ``unfused``."""
        if self.is_island:
            return "island"
        return "bookkeeping" if self.reason == "collection" else self.reason

    @property
    def label(self) -> str:
        """A short human label, e.g. ``host sync: item``, ``unfused: sum``."""
        short = {"host-sync": "host sync", "device-transfer": "device transfer", "cpu-op": "CPU op"}
        head = short.get(self.reason, self.reason)
        return f"{head}: {self.detail}" if self.detail else head


@dataclass(frozen=True, slots=True)
class Value:
    """The lifetime of one named value of a trace."""

    name: str
    type: TypeInfo
    defined: Site | None  # None for a function parameter
    defined_in: str  # "input", a region name, the name of a statement outside regions (`Outside.name`), or "top"
    uses: tuple[Site, ...]
    dels: tuple[Site, ...]
    crosses_region_boundary: bool
    returned: bool = False

    @property
    def is_scalar(self) -> bool:
        """True when the value is a Python number."""
        return self.type.is_scalar


@dataclass(frozen=True, slots=True)
class Defect:
    """One finding of the static checker."""

    rule: str  # a key of RULES
    trace: str  # "forward", "backward", or the function name for source text
    region: str | None  # region name, or None at top level
    value: str | None
    line: int | None  # 1-based line in the generated source of the region (or of the top level)
    message: str
    hint: str

    @property
    def severity(self) -> str:
        """``"crashes the process"``, ``"wrong result"`` (silent), ``"error"`` (raises), or ``"warning"`` (time or
        memory)."""
        if self.rule in CRASH_RULES:
            return "crashes the process"
        if self.rule in WRONG_RESULT_RULES:
            return "wrong result"
        return "error" if self.rule in ERROR_RULES else "warning"

    @property
    def is_error(self) -> bool:
        """The defect crashes or computes wrong values (severity "error" or "wrong result")."""
        return self.rule in ERROR_RULES

    def where(self) -> str:
        """Return ``CUDAGraph1:7`` or ``top:12``."""
        return f"{self.region or 'top'}:{self.line if self.line is not None else '?'}"

