"""The words of `thunder_nb.compare`'s verdict: each version's run, its worst findings first, and the speeds."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from ..diagnosis import failures
from ..diagnosis.failures import Failure
from ..diagnosis.model import Defect, Report
from ..render.common import plural
from .outcome import Outcome

__all__ = ["HAZARDS", "by_priority", "check_text", "defect_phrase", "hazard_phrase", "nothing_captured", "run_phrase",
           "speed_phrase", "tally_phrase", "format_us", "warnings_phrase"]


def speed_phrase(slower_us: float, us: float, than: str) -> str:
    """``1.8x faster than eager`` (``us`` against ``slower_us``), or ``1.5x slower than ...``."""
    ratio = slower_us / us
    return f"{ratio:.1f}x faster than {than}" if ratio >= 1 else f"{1 / ratio:.1f}x slower than {than}"


def format_us(x: float, unit: bool = True) -> str:
    text = f"{x:.0f}" if x >= 100 else f"{x:.1f}"
    return f"{text} us" if unit else text


def warnings_phrase(defects: Iterable[Defect]) -> str:
    """``13 warnings (9 never-freed, 4 dead-region-input)``: the count, then the most frequent rules."""
    counts = Counter(d.rule for d in defects)
    top = [f"{n} {rule}" for rule, n in counts.most_common(2)]
    if len(counts) > 2:
        top.append(f"{sum(counts.values()) - sum(n for _, n in counts.most_common(2))} more")
    return f"{plural(sum(counts.values()), 'warning')} ({', '.join(top)})"


#: A few words per `Failure.kind` (``{error_type}``: the exception's class name).
_FAILURE_PHRASES = {
    "no-gpu": "needs a GPU to run (only its trace is shown)",
    "capture": "capture fails",
    "compile": "compile fails ({error_type})",
    "crash": "crashes ({error_type})",
    "would-crash": "not run: it would kill the process",
}


#: What an error defect that did not show in a run would do, and when: (what, when no graph was captured in the run,
#: when graphs were). The verdict says it in amber: ``t106 saved for the backward in graph memory would be wrong when
#: two forwards run before one backward``.
HAZARDS = {
    "returned-graph-memory": ("be wrong", "when a result is kept across calls (the next call overwrites it)",
                              "when a result is kept across calls (the next call overwrites it)"),
    "saved-graph-memory": ("be wrong", "when two forwards run before one backward",
                           "when two forwards run before one backward"),
    "static-input-rebound": ("be wrong", "when another tensor is passed in a static input's place",
                             "when another tensor is passed in a static input's place"),
    "host-sync-in-region": ("fail", "when captured on a GPU (a graph cannot hold a host sync)",
                            "when captured again"),
    "host-data-in-region": ("fail", "when captured on a GPU (CUDA refuses a copy from host data in a capture)",
                            "when captured again"),
    "cpu-op-in-region": ("be wrong", "when captured on a GPU (it runs once, at capture, never on replay)",
                         "on a replay with other inputs (it ran once, at capture)"),
    "region-updates-input": ("be wrong", "when captured on a GPU (the caller never sees the update)",
                             "when the caller reads the updated input"),
    "capture-dependent-in-region": ("kill the process", "when captured on a GPU", "when captured"),
    "collective-in-region": ("hang or sum the wrong tensors", "when ranks capture it", "when ranks replay it"),
    "handle-crosses-region": ("fail", "when captured (a graph cannot wait on work launched outside it)",
                              "when captured again"),
    "use-after-del": ("fail", "when that region runs", "when that region runs"),
    "region-deletes-output": ("fail", "when that region runs", "when that region runs"),
}


def nothing_captured(report: Report) -> str | None:
    """Why a function with no region has nothing captured: no op computes on a tensor, or each op stands alone."""
    if not any(v.type.kind == "tensor" for t in report.traces for v in t.values):
        return ("nothing to capture: no op computes on a tensor (its arguments are Python numbers, which thunder "
                "computes as Python; pass tensors)")
    lone = sum(len(t.unfused) for t in report.traces)
    if lone:
        return f"nothing captured: {plural(lone, 'op')} alone, and one op alone is not worth a graph"
    return None


def _failure_phrase(failure: Failure) -> str:
    return _FAILURE_PHRASES[failure.kind].format(error_type=failure.error_type)


def run_phrase(out: Outcome, c: Any) -> str:
    if not out.ran:
        return "not run"
    if out.matches:
        text = "matches eager"
    else:
        err = f" (max abs error {out.max_abs_error:.3g})" if out.max_abs_error is not None else ""
        random = c.random_ops
        # NOTE: a dropout mask is a draw: another run draws another, so a difference says nothing about graphs
        why = (f" as expected: it draws random numbers ({', '.join(random)}), and eager draws others; compare in "
               "eval mode or with dropout 0") if random else ""
        text = f"DIFFERS from eager{err}{why}"
    if c.training:
        text += ", grads match" if out.grads_match else ", grads DIFFER"
    if out.params_match is not None:
        text += f", {'params match' if out.params_match else 'params DIFFER'} after {c.steps} SGD steps"
        if c.steps == 1 + c.warmup + c.repeats:
            # NOTE: the count is the calls' (one step after each), which --repeats alone does not show
            text += f" (one after each call: 1 checked, {c.warmup} warm-up, {c.repeats} timed)"
    if out.thunder_error is not None:
        # NOTE: the one judge's rule 4 (thunder_nb.diagnosis.judge): thunder's own numerics, not the graphs
        text += f" (as close as thunder without graphs: it differs from eager by {out.thunder_error:.3g} too)"
    return text


def check_text(out: Outcome, c: Any) -> str:
    if out.failure:
        if out.failure.kind == "no-gpu":
            return f"not run: {failures.NO_GPU}"
        return f"fails at {out.stage}: {out.error}"
    if not out.ran:
        return "not run"
    text = run_phrase(out, c)
    if out.max_abs_error is not None:
        text += f" (max abs error {out.max_abs_error:.3g}"
        if c.training and out.grads_max_abs_error is not None:
            text += f", grads {out.grads_max_abs_error:.3g}"
        if out.params_max_abs_error is not None:
            text += f", params {out.params_max_abs_error:.3g}"
        text += ")"
    if out.mismatch:
        text += f": {out.mismatch}"
    return text


#: Which error a verdict names first: the one that breaks the run soonest, then the rest.
_PRIORITY = ("capture-dependent-in-region", "host-sync-in-region", "host-data-in-region", "cpu-op-in-region",
             "use-after-del", "region-deletes-output",
             "static-input-rebound", "saved-graph-memory", "returned-graph-memory")


def by_priority(defects: Iterable[Defect]) -> list[Defect]:
    ranked = list(defects)
    return sorted(ranked, key=lambda d: _PRIORITY.index(d.rule) if d.rule in _PRIORITY else len(_PRIORITY))


def _op_of(report: Report, d: Defect):
    for t in report.traces:
        if t.kind != d.trace or d.region is None:
            continue
        try:
            region = t.region(d.region)
        except KeyError:
            return None
        return next((o for o in region.ops if o.line == d.line), None)
    return None


#: A few words per rule, with the defect's value and where it is.
_PHRASES = {
    "use-after-del": "{value} used after del in {where}",
    "region-deletes-output": "{where} deletes its own output {value}",
    "region-deletes-outside-value": "{where} deletes {value} from outside it",
    "scalar-region-input": "number {value} into {where} (a graph per value)",
    "returned-graph-memory": "wrong result: {value} returned in graph memory (the next call overwrites it)",
    "saved-graph-memory": "wrong result: {value} saved for the backward in graph memory (a second forward overwrites it)",
    "static-input-rebound": "wrong result: {where} copies any other tensor passed as {value} into its static input",
}


def defect_phrase(report: Report, d: Defect) -> str:
    """A few words for a defect: ``item inside CUDAGraph1``, ``t9 used after del in CUDAGraph1``."""
    where = d.region or "the top level"
    if d.rule in ("host-sync-in-region", "cpu-op-in-region", "host-data-in-region", "capture-dependent-in-region"):
        op = _op_of(report, d)
        what = op.callee.rsplit(".", 1)[-1] if op is not None else (d.value or "an op")
        return f"{what} inside {where}"
    phrase = _PHRASES.get(d.rule)
    if phrase is not None:
        return phrase.format(value=d.value, where=where)
    return f"{d.rule} ({d.value or where})"


#: How a defect's place is named in the verdict's count: ``4 in the forward trace, 4 in the backward``.
_TRACE_ORDER = ("forward", "backward")


def tally_phrase(defects: Iterable[Defect]) -> str:
    """``8 wrong results: 4 in the forward trace, 4 in the backward``: error defects counted by severity as each
    trace's key counts them (`thunder_nb.diagnosis.model.count_phrases`), and where they are when in more than one
    trace. Empty for a single defect."""
    found = list(defects)
    if len(found) < 2:
        return ""
    words = {"crashes the process": ("crashing the process", "crashing the process"),
             "wrong result": ("wrong result", "wrong results"), "error": ("error", "errors")}
    severities = [s for s in words if any(d.severity == s for d in found)]

    def counted(ds: list[Defect]) -> str:
        if len(severities) == 1 and ds is not found:  # NOTE: one kind: "4 in the forward trace", its name said once
            return str(len(ds))
        return ", ".join(f"{n} {words[s][n != 1]}" for s in severities
                         if (n := sum(1 for d in ds if d.severity == s)))

    total = counted(found)
    traces = sorted({d.trace for d in found}, key=lambda t: (_TRACE_ORDER + (t,)).index(t))
    if len(traces) < 2:
        return f"{total} in the {traces[0]} trace"
    parts = [f"{counted([d for d in found if d.trace == t])} in the {t}" + (" trace" if i == 0 else "")
             for i, t in enumerate(traces)]
    return f"{total}: {', '.join(parts)}"


def _hazard_what(report: Report, d: Defect) -> str:
    """The defect as the subject of ``... would be wrong when ...``: ``t106 saved for the backward in graph memory``."""
    subjects = {
        "returned-graph-memory": "{value} returned in graph memory",
        "saved-graph-memory": "{value} saved for the backward in graph memory",
        "static-input-rebound": "{value}, a static input of {where}",
    }
    subject = subjects.get(d.rule)
    if subject is not None:
        return subject.format(value=d.value, where=d.region or "the top level")
    return defect_phrase(report, d)


def hazard_phrase(report: Report, errors: list[Defect], captured: bool) -> str:
    """``t106 saved for the backward in graph memory would be wrong when two forwards run before one backward (8 wrong
    results: 4 in the forward trace, 4 in the backward)``: the first error defect (by priority) as a hazard this run did
    not show, when it would show, and how many there are."""
    first = errors[0]
    what, uncaptured, when_captured = HAZARDS.get(first.rule, ("fail", "in another run", "in another run"))
    tally = tally_phrase(errors)
    return (f"{_hazard_what(report, first)} would {what} {when_captured if captured else uncaptured}"
            + (f" ({tally})" if tally else ""))
