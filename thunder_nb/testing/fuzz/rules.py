"""How each error rule of the checker shows in a run of the fuzzer's call protocol, and the known bugs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...cudagraph.capture import Capture
from ..modes import CaptureMode, check_mode, mode_name
from .calls import FAILURE_KINDS
from .programs import Program

__all__ = [
    "Showing",
    "SHOWING",
    "shows",
    "kinds_of",
    "observable_rules",
    "explaining_rules",
    "Prediction",
    "predict",
    "KnownBug",
    "KNOWN_BUGS",
    "known_by_values",
    "known_analyze_error",
]

_VALUES = frozenset({"output", "kept", "input", "gradient"})


@dataclass(frozen=True, slots=True)
class Showing:
    """How one error rule shows: per mode (``"eager"``, ``"emulated"``, ``"real"``) "must", "may" or "never"."""

    rule: str
    eager: str
    emulated: str
    real: str
    kinds: frozenset[str]  # the failure kinds its defect can cause
    why: str  # when it shows, and why a "may" may not

    def in_mode(self, capture: CaptureMode) -> str:
        return getattr(self, mode_name(capture))


#: Every error rule of `thunder_nb.diagnosis.model.ERROR_RULES`, and how its defect shows. In a given capture
#: mode a defect *must* show (a run without the failure it causes is a false positive of the
#: checker), *may* show (it can explain a failure, but a run without one is no contradiction), or
#: *never* shows (a run that fails needs another explanation). A run's failure is explained when
#: each of its kinds (`calls.FAILURE_KINDS`) is one that a must- or may-show defect can cause; a
#: kind nothing explains is a false negative.
SHOWING: dict[str, Showing] = {s.rule: s for s in (
    Showing("use-after-del", "must", "must", "must", frozenset({"error"}),
            "generated code reads a deleted name: UnboundLocalError on the first call (traces are "
            "single-assignment, so the name is never bound again)"),
    Showing("region-deletes-output", "must", "must", "must", frozenset({"error"}),
            "the region returns a name it deleted: UnboundLocalError on the first call"),
    Showing("host-sync-in-region", "never", "may", "must", frozenset({"error"}) | _VALUES,
            "real capture fails on the host sync; eagerly the number is just read; an emulated graph "
            "reads it at recording and hands the recorded number out on every replay, which is wrong "
            "only where the number leaves the region and later calls would read another one"),
    Showing("cpu-op-in-region", "never", "may", "must", frozenset({"error"}) | _VALUES,
            "a transfer fails real capture, a CPU op runs once at recording; eagerly it runs every time; "
            "an emulated graph reruns it on replay (wrong only where its result is handed out)"),
    Showing("host-data-in-region", "never", "may", "must", frozenset({"error"}),
            "real capture refuses the pageable host-to-device copy of a list index or torch.tensor(list); "
            "eagerly and emulated the copy just runs (a CPU trace has no such region at all)"),
    Showing("capture-dependent-in-region", "never", "may", "may", frozenset({"error"}),
            "dropout attention's seed and offset are host memory outside a capture and device memory inside: a "
            "backward run outside a graph on a seed a graph wrote kills the process (no failure kind can "
            "record that: the fuzzer's programs have no fused attention, and such probes run in a child "
            "process); a graph reading an eager seed faults on the device; eagerly nothing happens"),
    Showing("region-updates-input", "never", "may", "may", _VALUES,
            "the update lands in the runner's static copy: wrong only where the caller's tensor, or a "
            "later reader of it, reads the update (not for an intermediate nobody reads again)"),
    Showing("returned-graph-memory", "never", "may", "may", frozenset({"kept", "alias", "gradient"}),
            "a kept result changes when a later call replays the same graph with other values (not when "
            "the region records a new graph per call, e.g. per Python number, nor when the value is the "
            "same for every input); a returned view of an input is a view of the runner's copy. A "
            "backward's gradient in graph memory (`kinds_of`: gradient only) is overwritten by the backward "
            "of another forward in the same pass: under real capture that replay can run before autograd's "
            "device thread accumulates the gradient (thunder's backward runs on the CPU thread), so which "
            "gradient comes out wrong, if any, depends on timing; on the CPU one thread accumulates it "
            "first (`shows`: never; torch.autograd.grad, outside the protocol, would see it)"),
    Showing("saved-graph-memory", "never", "may", "may", frozenset({"gradient", "error"}),
            "call 1's forward overwrites what call 0 saved for the backward when it replays the same "
            "graph (not when it records a new one), and call 0's gradients are wrong where the backward "
            "reads the overwritten values; where the saved tensor is a view of the runner's copy of an "
            "input, the copy before call 1's replay bumps its version and call 0's backward raises"),
    Showing("collective-in-region", "never", "may", "may", frozenset({"error"}) | _VALUES,
            "thunder's ddp and fsdp (the fuzzer's module programs, `collectives`): eagerly a region's collective runs "
            "at each call; recorded, a rank that records again alone (a new shape, a result still held) launches it "
            "in its warm-up calls alone, so the ranks hang or sum the wrong tensors; gloo's collectives (the CPU's) "
            "cannot be captured. In the fuzzer it cannot show: an emulated replay reruns the region's Python, "
            "collective included, on the live process group (as a graph replays an NCCL kernel), and the fuzzer's "
            "world is one rank, where an all-reduce is the identity (divided by one) and an all-gather or "
            "reduce-scatter a copy, with no other rank to wait for or to sum with; reported on thunder's "
            "transform and the legacy one (ddp's backward, fsdp's forward and backward), never on the fixed one"),
    Showing("handle-crosses-region", "never", "may", "may", frozenset({"error"}) | _VALUES,
            "thunder's ddp and fsdp (the fuzzer's module programs, `collectives`): eagerly the handle is each call's "
            "own; real capture refuses a wait on work launched outside the capture; an emulated replay hands out the "
            "recording's handle, whose tensor holds the recording's result (tests/test_fuzz.py shows it on "
            "thunder's runner). In the fuzzer's programs it cannot show: a handle a region takes (fsdp's forward: "
            "an all-gather at top level, its wait in a region) is a non-tensor argument, in thunder's cache key by "
            "identity, so every call records a new graph that waits for that call's own handle; a handle a region "
            "hands out (its wait inside the same region) only goes to a later region's del, never to a wait; "
            "reported on thunder's transform and the legacy one, never on the fixed one"),
    Showing("static-input-rebound", "never", "must", "must", frozenset({"error"}) | _VALUES,
            "a static input that is an argument of the function (predicted from the traces), or one the "
            "runner saw receive another tensor: the calls with parameter set 1 copy it into set 0's "
            "memory, so set 0 differs from eager's after the calls, or, where call 0 saved set 0 for the "
            "backward, the copy's version bump makes that backward raise; a may-show in a backward "
            "(`shows`), and where the calls' parameter sets end up equal (the oracle's hidden rules)"),
)}


def _check_table() -> None:
    from thunder_nb.diagnosis.model import ERROR_RULES

    if set(SHOWING) != ERROR_RULES:
        raise AssertionError(
            "thunder_nb.testing.fuzz.rules.SHOWING must classify every error rule: missing "
            f"{sorted(ERROR_RULES - set(SHOWING))}, unknown {sorted(set(SHOWING) - ERROR_RULES)}")
    bad = [s.rule for s in SHOWING.values()
           if not s.kinds <= set(FAILURE_KINDS) or {s.eager, s.emulated, s.real} - {"must", "may", "never"}]
    if bad:
        raise AssertionError(f"malformed SHOWING entries: {bad}")


def shows(defect: Any, capture: CaptureMode) -> str:
    """"must", "may" or "never": how this defect shows in mode ``capture`` (`SHOWING`, refined per defect)."""
    _check_table()
    how = SHOWING[defect.rule].in_mode(capture)
    if defect.rule == "static-input-rebound" and defect.trace != "forward" and how == "must":
        # NOTE: a backward's static input is a forward graph's output; what the copy into it spoils is
        # only read again if that older graph replays, or someone kept its output
        how = "may"
    if defect.rule == "returned-graph-memory" and defect.trace == "backward" and mode_name(capture) != "real":
        # NOTE: on the CPU one autograd thread runs each leaf's AccumulateGrad (which copies a gradient
        # others hold) before the next backward node: the protocol's backward() never sees the overwrite
        how = "never"
    return how


def kinds_of(defect: Any) -> frozenset[str]:
    """The failure kinds ``defect`` can cause (`SHOWING`, refined per defect)."""
    kinds = SHOWING[defect.rule].kinds
    if defect.rule == "returned-graph-memory":
        # NOTE: a forward returns results the caller keeps; a backward, gradients for autograd
        return kinds & {"gradient"} if defect.trace == "backward" else kinds - {"gradient"}
    return kinds


def observable_rules(capture: CaptureMode) -> frozenset[str]:
    """The error rules whose defects must show in mode ``capture`` (per rule, before `shows` refines it)."""
    _check_table()
    return frozenset(r for r, s in SHOWING.items() if s.in_mode(capture) == "must")


def explaining_rules(capture: CaptureMode) -> frozenset[str]:
    """The error rules whose defects can explain a failure in mode ``capture`` (must or may show)."""
    _check_table()
    return frozenset(r for r, s in SHOWING.items() if s.in_mode(capture) != "never")


@dataclass(frozen=True, slots=True)
class Prediction:
    """The checker's error defects set against what a run did.

    ``unexplained``: failure kinds no must- or may-show defect can cause (false negatives);
    ``not_shown``: must-show rules whose failure did not happen (false positives); ``may_show``
    and ``may_shown``: the may-show rules, and those among them that a failure kind fits.
    """

    errors: tuple[str, ...]  # every error rule reported
    must: tuple[str, ...]
    may: tuple[str, ...]
    failed: tuple[str, ...]  # the failure kinds observed
    unexplained: tuple[str, ...]
    not_shown: tuple[str, ...]
    may_shown: tuple[str, ...]

    @property
    def false_negative(self) -> bool:
        return bool(self.unexplained)

    @property
    def false_positive(self) -> bool:
        return bool(self.not_shown)


def predict(defects: Any, failed: set[str] | frozenset[str], capture: CaptureMode, *,
            hidden: frozenset[str] = frozenset()) -> Prediction:
    """Set the error defects of a report against the failure kinds a run showed.

    Args:
        hidden: rules that the reference run shows cannot show in this program (e.g. a
            ``static-input-rebound`` where both parameter sets end up equal): may-show here.
    """
    errors = [d for d in defects if d.is_error]
    rated = [(d, "may" if d.rule in hidden and shows(d, capture) == "must" else shows(d, capture)) for d in errors]
    must = sorted({d.rule for d, h in rated if h == "must"})
    may = sorted({d.rule for d, h in rated if h == "may"} - set(must))
    kinds: dict[tuple[str, str], set[str]] = {}
    for d, h in rated:
        kinds.setdefault((d.rule, h), set()).update(kinds_of(d))
    covered = {k for (_, h), ks in kinds.items() if h != "never" for k in ks}
    return Prediction(
        errors=tuple(sorted({d.rule for d in errors})),
        must=tuple(must),
        may=tuple(may),
        failed=tuple(k for k in FAILURE_KINDS if k in failed),
        unexplained=tuple(k for k in FAILURE_KINDS if k in failed and k not in covered),
        not_shown=tuple(r for r in must if not kinds[(r, "must")] & failed),
        may_shown=tuple(r for r in may if kinds[(r, "may")] & failed),
    )


@dataclass(frozen=True)
class KnownBug:
    """A thunder_nb bug the fuzzer found, with its strict-xfail test in tests/test_fuzz_regressions.py.

    A hit is counted under the bug's name instead of failing the fuzz tests. ``defect`` recognises
    a wrong defect of the fixed transform's traces; ``variant`` names the fixed transform's options
    (``fusion_type``, ``scalar_handoff``, ``capture``) under which a program whose results are wrong
    comes out right, which pins the wrong results on this bug (tried only on programs ``applies``
    accepts); ``wrong_values`` recognises the bug from how a
    captured run of one transform (``"fixed"``, ``"legacy"``, ``"stock"``) differs from eager (the
    failure kinds, `calls.FAILURE_KINDS`); ``analyze_error`` from an exception ``thunder_nb.analyze``
    raised on a transform's traces.
    """

    name: str
    regression_test: str
    defect: Callable[[Any, Any], bool] | None = None  # (Defect, jitted function) -> hit?
    variant: dict[str, Any] | None = None
    applies: Callable[[Program], bool] | None = None  # where ``variant`` is worth trying (None: everywhere)
    wrong_values: Callable[[str, frozenset[str], Program], bool] | None = None  # (transform, kinds, program) -> hit?
    analyze_error: Callable[[BaseException], bool] | None = None  # thunder_nb.analyze raised this -> hit?


#: Open bugs: add one with its strict-xfail regression test, delete it when the bug is fixed. The
#: fuzzer's fixed findings stay as regression tests (tests/test_fuzz_regressions.py). The legacy
#: entry is the July 2024 behaviour the legacy transform reproduces on purpose, not a bug to fix.
KNOWN_BUGS: tuple[KnownBug, ...] = (
    KnownBug(
        "legacy (capture): in-place updates inside regions can land in static copies (July 2024 behaviour)",
        "test_capture_keeps_in_place_updates",
        wrong_values=lambda transform, kinds, program: transform == "legacy" and program.updates_in_place,
    ),
)


def _frames(e: BaseException) -> set[str]:
    import traceback

    return {f.name for f in traceback.extract_tb(e.__traceback__)}


def _hand_out_outputs(jfn: Any) -> set[str]:
    """Names the fixed transform's forward hand-out makes."""
    import thunder

    from thunder_nb.fix import HAND_OUT_NAME

    return {p.name for b in thunder.last_traces(jfn)[-1].bound_symbols if b.sym.name == HAND_OUT_NAME
            for p in b.flat_proxy_outs}


def known_by_values(transform: str, kinds: frozenset[str], program: Program, capture: CaptureMode) -> str | None:
    """The known bug that explains how a captured run of ``transform`` went wrong, if one does."""
    if not kinds or check_mode(capture) is Capture.OFF:
        return None
    return next((b.name for b in KNOWN_BUGS if b.wrong_values is not None and b.wrong_values(transform, kinds, program)),
                None)


def known_analyze_error(error: BaseException) -> str | None:
    """The known bug that explains an exception of ``thunder_nb.analyze``, if one does."""
    return next((b.name for b in KNOWN_BUGS if b.analyze_error is not None and b.analyze_error(error)), None)
