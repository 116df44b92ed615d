"""Frozen model objects that describe a thunder function compiled with CUDA graphs.

Every other layer only reads these: `analysis` builds them, `render` draws them, `magics` shows
them. They hold plain strings and numbers (never thunder objects), so they can be built by hand in
a test, compared with ``==`` and pickled.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "RULES",
    "ERROR_RULES",
    "ISLAND_REASONS",
    "TypeInfo",
    "Site",
    "Op",
    "Region",
    "Island",
    "Value",
    "Defect",
    "GraphRecord",
    "TraceReport",
    "Report",
]

#: Every checker rule, with the one-line description shown in legends and help.
RULES: dict[str, str] = {
    "use-after-del": "a name is used after it was deleted",
    "region-deletes-output": "a region deletes one of its own outputs",
    "region-deletes-outside-value": "a region deletes a value produced outside it",
    "dead-region-input": "a region input used by nothing but a del (copied on every replay)",
    "host-sync-in-region": "a data-dependent or host-synchronising op inside a region (capture fails)",
    "cpu-op-in-region": "a device transfer or CPU op inside a region (runs once at capture, never on replay)",
    "region-updates-input": "a region updates an input in place that the runner copies (the caller never sees it)",
    "scalar-region-input": "a Python number region input (each new value captures a new graph)",
    "never-freed": "a top-level intermediate that is never deleted",
    "double-del": "a name deleted twice",
}

#: Rules whose defect makes the function crash or compute a wrong result; the others cost time or memory.
ERROR_RULES: frozenset[str] = frozenset(
    {"use-after-del", "region-deletes-output", "host-sync-in-region", "cpu-op-in-region", "region-updates-input"}
)

#: Why a top-level symbol stays outside every region.
ISLAND_REASONS: dict[str, str] = {
    "host-sync": "data-dependent / host-synchronising",
    "device-transfer": "device transfer",
    "cpu-op": "op on CPU tensors in a CUDA trace",
    "in-place": "in-place update (runs on the caller's tensors)",
    "bookkeeping": "trace bookkeeping (unpack, return)",
    "collection": "collection clearing",
    "single": "single-symbol group",
    "other": "not fused",
}


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
    user_line: str | None = None  # "file.py:12: y = x.sin()" from thunder's comments, when present


@dataclass(frozen=True, slots=True)
class GraphRecord:
    """One CUDA graph a region's runner captured."""

    index: int
    cause: str  # "first call", or which input changed ("f20: value 1.5 -> 2.0", "x: shape ...")
    static_bytes: int  # bytes copied into static input buffers on every replay
    pool_bytes: int | None = None  # graph-pool bytes, when a GPU measured them


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
    user_lines: tuple[str, ...]  # user source lines the region covers, "file.py:12: y = x.sin()"
    captured: bool | None = None  # True: a graph was captured; False: ran eagerly; None: not run
    graphs: tuple[GraphRecord, ...] = ()
    scalar_handoffs: tuple[str, ...] = ()  # "f20 -> t19": numbers handed to the region as device tensors
    held_calls: int = 0  # calls run without the graph: tensors its last replay saved for backward were held

    @property
    def compute_ops(self) -> tuple[Op, ...]:
        """The region's calls, without dels and the return."""
        return tuple(o for o in self.ops if o.kind == "call")


@dataclass(frozen=True, slots=True)
class Island:
    """A top-level statement that runs outside every region."""

    name: str  # "island3" (its top-level position)
    position: int
    op: Op
    reason: str  # a key of ISLAND_REASONS
    detail: str  # e.g. "item", "cpu -> cuda:0"

    @property
    def label(self) -> str:
        """A short human label, e.g. ``host sync: item``."""
        short = {"host-sync": "host sync", "device-transfer": "device transfer", "cpu-op": "CPU op"}
        head = short.get(self.reason, self.reason)
        return f"{head}: {self.detail}" if self.detail else head


@dataclass(frozen=True, slots=True)
class Value:
    """The lifetime of one named value of a trace."""

    name: str
    type: TypeInfo
    defined: Site | None  # None for a function parameter
    defined_in: str  # "input", a region name, an island name, or "top"
    uses: tuple[Site, ...]
    dels: tuple[Site, ...]
    crosses_region_boundary: bool
    returned: bool = False

    @property
    def is_scalar(self) -> bool:
        """True when the value is a Python number."""
        return self.type.is_scalar

    @property
    def last_use(self) -> Site | None:
        """The last use (by top-level position, then inner index), or None."""
        if not self.uses:
            return None
        return max(self.uses, key=lambda s: (s.position, -1 if s.index is None else s.index))


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
        """``"error"`` when the defect crashes or computes wrong values, else ``"warning"``."""
        return "error" if self.rule in ERROR_RULES else "warning"

    def where(self) -> str:
        """Return ``CUDAGraph1:7`` or ``top:12``."""
        return f"{self.region or 'top'}:{self.line if self.line is not None else '?'}"


@dataclass(frozen=True, slots=True)
class TraceReport:
    """One trace (forward or backward) of a compiled function, split into regions and islands."""

    kind: str  # "forward" | "backward" | "source"
    name: str  # the generated function's name, "computation" / "backward_fn"
    provenance: str  # thunder's "Constructed by ..." line
    source: str  # the top-level Python source
    ops: tuple[Op, ...]  # top-level statements in order
    regions: tuple[Region, ...]
    islands: tuple[Island, ...]
    values: tuple[Value, ...]
    defects: tuple[Defect, ...]
    params: tuple[str, ...] = ()
    is_cuda: bool = False

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
    def op_count(self) -> int:
        """Statements of the trace, each region's own statements counted."""
        return len(self.ops) + sum(len(r.ops) for r in self.regions)

    @property
    def user_islands(self) -> tuple[Island, ...]:
        """Islands that a user's op caused (bookkeeping and collection clearing left out)."""
        return tuple(i for i in self.islands if i.reason not in ("bookkeeping", "collection"))


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

    def to_text(self) -> str:
        """Return the plain-text report (every view in text form)."""
        from . import render

        return render.report_text(self)

    def _repr_mimebundle_(self, include=None, exclude=None):
        from . import render

        return render.report_mimebundle(self, include=include, exclude=exclude)
