"""What the CUDA-graph runtime writes down for the diagnosis to read: the transform's plan for each region and for what
leaves each trace, and what the runner did with them. Frozen records of plain values, never thunder objects."""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "HAND_OUT_NAME",
    "INPUT_ROLES",
    "HandOutAction",
    "rotates",
    "STATIC_INPUT_CHANGES",
    "ScalarHandoff",
    "InputPlan",
    "OutputPlan",
    "RegionPlan",
    "HandOutPlan",
    "StaticInputChange",
    "RegionStats",
    "HandOutStats",
    "GraphRecord",
    "KERNELS_ATTRIBUTE",
]


#: The name under which generated code calls the runner's hand-out (`thunder_nb.cudagraph.handout.insert_hand_out`).
HAND_OUT_NAME = "thunder_nb_hand_out"

#: The attribute of a fusion's callable that holds the kernels inductor generated for it when it compiled
#: (`thunder_nb.cudagraph.executors` sets it, `thunder_nb.diagnosis.build` reads it).
KERNELS_ATTRIBUTE = "thunder_nb_kernels"

#: How a region input reaches its graph (`InputPlan.role`).
INPUT_ROLES: dict[str, str] = {
    "static": "read where it lies (a parameter, or memory a graph owns); keyed by address: another tensor gets its own graph",
    "copied": "copied into the graph's own buffer before each replay",
    "number": "a Python number baked into the graph: each new value captures a new graph",
}


#: What the runner does with a tensor that leaves a trace (`HandOutPlan`).
class HandOutAction(str, Enum):
    """What the hand-out does with a tensor leaving a trace that may lie in graph memory: the one list of actions
    the transform asks for (`thunder_nb.fix`), the runner carries out (`thunder_nb.cudagraph.handout`), the checker
    reads and `render` words (`label`, `short`, `meaning`). A member equals its value (``HandOutAction.COPY ==
    "copy"``), so the generated code's tuples of actions stay plain.

    ROTATE is not asked for: it is what the runner makes of COPY in a forward whose region `rotates` (the tensor goes
    out where it lies, watched, while the region's instances take turns), and what the report says of it."""

    COPY = "copy"
    GUARD = "guard"
    LEND = "lend"
    AS_IS = "as-is"
    ROTATE = "rotate"

    @property
    def meaning(self) -> str:
        """What it does, in a sentence (ROTATE's holds ``{rotation}``: `meaning_for` fills it in)."""
        return _ACTION_WORDS[self.value][2]

    def meaning_for(self, rotation: int) -> str:
        """`meaning`, with the runner's ``rotation`` option (`HandOutStats.rotation`) where it says it."""
        return self.meaning.format(rotation=rotation)

    @property
    def label(self) -> str:
        """How reports name it: ``copied out``, ``guarded``, ``lent``, ``returned as-is``."""
        return _ACTION_WORDS[self.value][0]

    @property
    def short(self) -> str:
        """How a diagram's output node names it: ``copied out``, ``guarded``, ``lent``, ``as-is``."""
        return _ACTION_WORDS[self.value][1]


_ACTION_WORDS: dict[str, tuple[str, str, str]] = {
    "copy": ("copied out", "copied out", "returned: copied out of graph memory when it lies there (views of one "
             "buffer stay views of one copy)"),
    "guard": ("guarded", "guarded", "saved for the backward: left where the graph wrote it and guarded (while held, "
              "the next call replays another graph instance)"),
    "as-is": ("returned as-is", "as-is", "returned as the graph's own buffer (copy_outputs=False: the next call "
              "overwrites it)"),
    "lend": ("lent", "lent", "a backward's gradient: handed to autograd where the graph wrote it, and guarded "
             "(while held, as a parameter's .grad, the next backward replays another graph instance)"),
    "rotate": ("handed out (rotation)", "rotated", "returned: left where the graph wrote it, watched; while the caller "
               "still holds it, the next call replays another instance (rotation, up to {rotation} instances); copied "
               "out of graph memory past that"),
}


#: Why the runner no longer reads a static region input as it was captured (`StaticInputChange`).
STATIC_INPUT_CHANGES: dict[str, str] = {
    "demoted": "took more than {limit} addresses, copied into the graph's buffer from now on",
    "rebound": "static input received another tensor; thunder's runner copies it into the captured tensor's memory",
    "shares-memory": "shares its memory with an input the graph copies, copied with it from now on (one memory in the "
                     "graph, so that an update of either reaches the other)",
}


@dataclass(frozen=True, slots=True)
class ScalarHandoff:
    """A Python number a region reads, handed to it as a 0-d device tensor (so new values capture nothing)."""

    number: str  # "f20"
    tensor: str | None = None  # "t19": the 0-d tensor the number came from (item), read in its place
    made: str | None = None  # otherwise: "arithmetic" (Python arithmetic run on the device) or "fill" (written outside)
    device_tensor: str | None = None  # the 0-d tensor that stands in for the number
    kept: bool = False  # the Python number is still computed for another reader (its host sync stays)

    def __str__(self) -> str:
        if self.tensor:
            return f"{self.number} -> {self.tensor}"
        how = "arithmetic on the device" if self.made == "arithmetic" else "filled outside the graphs"
        return f"{self.number} -> 0-d tensor ({how})"


@dataclass(frozen=True, slots=True)
class InputPlan:
    """How one region input reaches the graph."""

    name: str
    role: str  # a key of INPUT_ROLES
    reason: str  # why, e.g. "parameter", "module buffer", "saved for the backward"


@dataclass(frozen=True, slots=True)
class OutputPlan:
    """Where one region output goes."""

    name: str
    returned: bool = False  # reaches the caller (directly; views made later are found at the hand-out)
    saved: bool = False  # saved for the backward
    view_of: str | None = None  # an input this output is a view of: handed out as that view of the caller's tensor

    @property
    def fate(self) -> str:
        """``"returned"``, ``"saved"``, ``"returned, saved"`` or ``"internal"``."""
        parts = [w for w, on in (("returned", self.returned), ("saved", self.saved)) if on]
        return ", ".join(parts) or "internal"


@dataclass(frozen=True, slots=True)
class RegionPlan:
    """What the transform decided for one region, and what the runner must do at each replay."""

    name: str
    inputs: tuple[InputPlan, ...]
    outputs: tuple[OutputPlan, ...]
    write_back: tuple[str, ...] = ()  # inputs updated in place: copied back to the caller's tensor after replay
    scalar_handoffs: tuple[ScalarHandoff, ...] = ()

    def input(self, name: str) -> InputPlan:
        """Return the plan of input ``name``."""
        return next(i for i in self.inputs if i.name == name)


@dataclass(frozen=True, slots=True)
class HandOutPlan:
    """The tensors that leave one trace, and which of them may lie in graph memory (checked by storage)."""

    returned: tuple[str, ...]  # to the caller (or, for a backward, to autograd)
    saved: tuple[str, ...]  # saved for the backward
    graph_memory: tuple[str, ...]  # of those, region outputs and views of them: checked at each hand-out
    copy_outputs: bool = True
    lend: bool = False  # returned tensors are lent, not copied (a backward's gradients, `lend_gradients`)

    def action(self, name: str) -> HandOutAction | None:
        """What the hand-out does with ``name``, or None when it cannot lie in graph memory."""
        if name not in self.graph_memory:
            return None
        if name in self.saved:
            return HandOutAction.GUARD
        if self.lend:
            return HandOutAction.LEND
        return HandOutAction.COPY if self.copy_outputs else HandOutAction.AS_IS


def rotates(region: str, plan: RegionPlan | None, rotation: int, stopped: Container[str] = ()) -> bool:
    """Whether region ``region``'s returned tensors take turns in its graph instances (`HandOutAction.ROTATE`) instead
    of being copied out: ``rotation`` is on (the runner's option; `HandOutStats.rotation`, 0 for a backward's), the
    region is not in ``stopped`` (`HandOutStats.rotation_stopped`: the caller kept the results of every instance), and
    it saves nothing for a backward (an instance is then only its outputs: another costs their bytes, in a shared
    pool). The one decision: the runner makes it when it records an instance, the report reads it back. A region with
    no plan (a runner used without its transform) is judged by the option alone."""
    return rotation > 0 and region not in stopped and (plan is None or not any(o.saved for o in plan.outputs))


@dataclass(frozen=True, slots=True)
class StaticInputChange:
    """A static input of a region that the runner no longer reads as it was captured.

    ``str()`` gives ``w2: static input received another tensor; ...``.
    """

    name: str  # the input's name in the region's trace ("w2", "t_0")
    position: int  # its position among the region's inputs
    reason: str  # a `STATIC_INPUT_CHANGES` key: "demoted", "shares-memory" (both copied from now on) or "rebound"
    limit: int | None = None  # "demoted": the number of addresses it took more than

    @property
    def why(self) -> str:
        """What happened, in words: ``took more than 32 addresses, copied into the graph's buffer from now on``."""
        return STATIC_INPUT_CHANGES[self.reason].format(limit=self.limit)

    def __str__(self) -> str:
        return f"{self.name}: {self.why}"


@dataclass(frozen=True, slots=True)
class RegionStats:
    """What the runner did with one region so far."""

    graphs: tuple["GraphRecord", ...] = ()
    replays: int = 0
    eager_calls: int = 0  # calls run as plain Python (no CUDA device, or capture off)
    held_calls: int = 0  # calls run without a graph: every instance's saved outputs were still held
    instances: int = 0  # graph instances kept for outputs still held (2 when a second forward came first)
    address_keys: int = 0  # distinct sets of static-input addresses (one per layer is normal)
    demoted: tuple[StaticInputChange, ...] = ()  # static inputs copied from now on (they took too many addresses)
    # static inputs that received another tensor (thunder's runner copies into them)
    rebound: tuple[StaticInputChange, ...] = ()
    eager_reason: str | None = None  # why the region runs without a graph on every call now
    copied: tuple[str, ...] = ()  # inputs copied into the graph's buffers at the last replay
    failed: str | None = None  # the error of a recording that raised, as one line ("UnboundLocalError: ...")
    capture_failed: bool = False  # that error came out of the capture itself (an `.item()` inside it), not the code

    @property
    def captured(self) -> bool | None:
        """True: a graph was captured; False: ran eagerly only; None: not run (or its capture failed: `failed`)."""
        return True if self.graphs else (False if self.eager_calls or self.held_calls else None)

    @property
    def state(self) -> str:
        """What became of the region: ``captured``, ``eager``, ``capture failed`` (its recording raised in the
        capture itself: an op capture cannot take), ``raised`` (its own code raised while it was recorded: #728's
        ``UnboundLocalError``; `failed` says what) or ``not run``."""
        if self.graphs:
            return "captured"
        if self.failed is not None:
            return "capture failed" if self.capture_failed else "raised"
        return "eager" if self.eager_calls or self.held_calls else "not run"

    @property
    def state_text(self) -> str:
        """`state` in the words a label shows: ``raised`` with the error's type (``raised UnboundLocalError``)."""
        state = self.state
        return f"raised {self.failed.split(':', 1)[0]}" if state == "raised" else state


@dataclass(frozen=True, slots=True)
class HandOutStats:
    """What the runner did at the hand-outs of one trace so far."""

    calls: int = 0
    copied: int = 0  # tensors copied out of graph memory
    guarded: int = 0  # saved tensors left in graph memory and guarded
    lent: int = 0  # gradients handed to autograd in graph memory and guarded
    lending_stopped: bool = False  # a lent gradient was still held at the next backward: copied out since
    rotated: int = 0  # returned tensors handed out in graph memory, watched, while instances take turns (rotation)
    rotation_stopped: tuple[str, ...] = ()  # regions whose returned tensors the caller kept past rotation: copied since
    rotation: int = 0  # instances a forward region's returned tensors may take turns in (the runner's option; 0: none)


@dataclass(frozen=True, slots=True)
class GraphRecord:
    """One CUDA graph a region's runner captured."""

    index: int
    cause: str  # "first call", or which input changed ("f20: value 1.5 -> 2.0", "x: shape ...")
    static_bytes: int  # bytes copied into static input buffers on every replay
    pool_bytes: int | None = None  # graph-pool bytes, when a GPU measured them
    instance: int = 0  # 0, or the instance number of a further copy of the same graph
