"""What the oracle concludes of one program: its `ProgramOutcome` (every broken claim, and the figures), each judged
transform's `Verdict`, and the fixed runner's `FixedStats`."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..modes import CaptureMode
from .programs import Program
from .rules import Prediction

__all__ = ["FixedStats", "Verdict", "ProgramOutcome"]


@dataclass(frozen=True, slots=True)
class FixedStats:
    """What the fixed transform's runner did over the calls, all regions together."""

    graphs: int = 0
    replays: int = 0
    most_instances: int = 0  # > 1: a second graph instance served a forward while the first's saved tensors were held
    most_address_keys: int = 0  # > 1: a static input (a parameter set) got its own graph
    held_calls: int = 0  # region calls run without a graph (every instance held)


@dataclass
class Verdict:
    """How a transform the checker judges (legacy, stock) fared, and what the checker said."""

    failure: str | None = None  # how it failed (exception, or the first difference); None: it ran right
    kinds: tuple[str, ...] = ()  # failure kinds (`calls.FAILURE_KINDS`)
    prediction: Prediction | None = None
    before_run: tuple[str, ...] = ()  # error rules in its traces before the first call
    explained_before_run: bool = False  # a failure that those rules alone explain
    compile_crash: str | None = None  # thunder raised while compiling: nothing ran to judge

    @property
    def false_negative(self) -> bool:
        return self.prediction is not None and self.prediction.false_negative

    @property
    def false_positive(self) -> bool:
        return self.prediction is not None and self.prediction.false_positive


@dataclass
class ProgramOutcome:
    """How one program fared: ``problems`` lists every broken claim (empty: all hold); the rest are figures."""

    program: Program
    capture: CaptureMode = CaptureMode.OFF
    discarded: str | None = None  # why the program was thrown away ("thunder rejects: TypeError")
    problems: list[str] = field(default_factory=list)
    thunder_differs: bool = False  # plain thunder.jit disagrees with eager PyTorch (thunder's own behaviour)
    known_bugs: tuple[str, ...] = ()  # names of `KNOWN_BUGS` hit
    fixed_error: str | None = None
    fixed_mismatch: str | None = None  # its first difference from eager
    fixed_warned: tuple[str, ...] = ()  # the InPlaceGradientWarnings of its run: where it says thunder is wrong
    fixed_defects: tuple[str, ...] = ()  # defects of its traces ("rule @ trace/where (value): message")
    fixed_fallbacks: tuple[str, ...] = ()  # numbers kept as region inputs, and why (refused hand-offs)
    fixed_stats: FixedStats = FixedStats()
    legacy: Verdict = field(default_factory=Verdict)
    stock: Verdict = field(default_factory=Verdict)
    stock_item_in_region: bool | None = None  # None: no stock traces to look at
    stock_host_sync_reported: bool | None = None
