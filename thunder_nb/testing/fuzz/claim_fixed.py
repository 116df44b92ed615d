"""The oracle's first claim: the fixed transform leaves what eager PyTorch leaves, and its traces have no defect."""

from __future__ import annotations

import traceback
import warnings
from typing import Any

from ...diagnosis.protocols import PlanningTransform, RecordingRunner
from ..modes import CaptureMode, make_transform
from .calls import execute
from .programs import Program
from .reference import Reference, defect_text, describe, first_text, report_of
from .rules import KNOWN_BUGS
from .verdicts import FixedStats, ProgramOutcome

__all__ = ["judge_fixed"]


def judge_fixed(fn, program: Program, device: str, capture: CaptureMode, outcome: ProgramOutcome,
                ref: Reference) -> bool:
    """Claim 1: the fixed transform leaves what eager PyTorch leaves, and its traces have no defect.

    Returns False when the program is discarded (plain thunder cannot run it either, or is itself wrong).
    """
    from thunder_nb.fix import FixedCUDAGraphTransform
    from thunder_nb.internals.saved import InPlaceGradientWarning

    transform = make_transform(FixedCUDAGraphTransform, capture)
    jfixed = program.jit(fn, device, transforms=[transform], fusion_type=program.fusion_type)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = execute(jfixed, program, device)
    outcome.fixed_warned = tuple(str(w.message) for w in caught if issubclass(w.category, InPlaceGradientWarning))
    if run.error is not None:
        if ref.plain.error is not None:
            outcome.discarded = f"thunder rejects: {type(ref.plain.error).__name__}"
            return False
        outcome.fixed_error = f"{run.failed_at}: {describe(run.error)}"
        outcome.problems.append(f"fixed raised where plain thunder ran ({outcome.fixed_error})\n"
                                + "".join(traceback.format_exception(run.error)[-6:]))
    else:
        failures = ref.disagrees(run)
        outcome.fixed_mismatch = first_text(failures)
        if failures and ref.thunder_wrong is not None:
            # NOTE: thunder's own wrong result (NaN where eager is finite, far from eager): no transform's to answer for
            outcome.discarded = f"thunder wrong: {_wrong_kind(ref.thunder_wrong)}"
            return False
        if failures:
            bugs = _known_wrong_results(fn, program, device, capture, ref)
            if bugs:
                outcome.known_bugs += bugs
            else:
                outcome.problems.append("fixed differs from eager PyTorch:\n  "
                                        + "\n  ".join(f"{f.kind}: {f.text}" for f in failures))
    outcome.fixed_stats = _fixed_stats(transform)
    _check_fixed_traces(jfixed, transform, outcome, run.error)
    return True


def _wrong_kind(why: str) -> str:
    """A short class of plain thunder's wrong result, for the tally: not finite, or far from eager."""
    return "not finite" if "not finite" in why else "far from eager"


def _fixed_stats(transform: PlanningTransform) -> FixedStats:
    runner = transform.cuda_graph_runner
    assert isinstance(runner, RecordingRunner), f"the fixed transform's runner records: {type(runner).__name__}"
    stats = [runner.region_stats(name) for name in runner.python_callables]
    return FixedStats(
        graphs=sum(len(s.graphs) for s in stats),
        replays=sum(s.replays for s in stats),
        most_instances=max((s.instances for s in stats), default=0),
        most_address_keys=max((s.address_keys for s in stats), default=0),
        held_calls=sum(s.held_calls for s in stats),
    )


def _known_wrong_results(fn, program: Program, device: str, capture: CaptureMode, ref: Reference) -> tuple[str, ...]:
    """The known bugs that explain the fixed transform's wrong results: those whose variant runs right.

    Variants are tried one bug at a time, then all together (several bugs at once).
    """
    from thunder_nb.fix import FixedCUDAGraphTransform

    default = {"fusion_type": program.fusion_type, "scalar_handoff": True, "capture": capture}

    def right_with(options: dict[str, Any]) -> bool:
        opts = {**default, **options}
        if opts == default:
            return False  # NOTE: this variant is what already ran
        transform = make_transform(FixedCUDAGraphTransform, opts["capture"], scalar_handoff=opts["scalar_handoff"])
        run = execute(program.jit(fn, device, transforms=[transform], fusion_type=opts["fusion_type"]), program, device)
        return run.error is None and not ref.disagrees(run)

    bugs = [b for b in KNOWN_BUGS if b.variant is not None and (b.applies is None or b.applies(program))]
    for b in bugs:
        if right_with(b.variant):
            return (b.name,)
    combined: dict[str, Any] = {}
    for b in bugs:
        combined.update(b.variant)
    if bugs and right_with(combined):
        return tuple(b.name for b in bugs if {**default, **b.variant} != default)
    return ()


def _check_fixed_traces(jfixed: Any, transform: Any, outcome: ProgramOutcome, error: BaseException | None) -> None:
    """No defect in the fixed transform's traces, but a refused scalar hand-off that says why."""
    report = report_of(jfixed, "fixed", outcome, error)
    if report is None:
        return
    defects, known, fallbacks = [], [], []
    for d in report.defects:
        bug = next((b.name for b in KNOWN_BUGS if b.defect is not None and b.defect(d, jfixed)), None)
        if bug is not None:
            if bug not in known and bug not in outcome.known_bugs:
                known.append(bug)
        elif d.rule == "scalar-region-input" and d.value in transform.handoff_refusals:
            # NOTE: a documented fallback: the number stays a number where a 0-d tensor would not
            # compute the same values (handoff_refusals says why); it costs re-captures, not results
            fallbacks.append(f"{d.value}: {transform.handoff_refusals[d.value]}")
        else:
            defects.append(defect_text(d))
    outcome.fixed_defects = tuple(defects)
    outcome.fixed_fallbacks = tuple(fallbacks)
    outcome.known_bugs += tuple(known)
    if defects:
        outcome.problems.append("defects in the fixed transform's traces:\n  " + "\n  ".join(defects))

