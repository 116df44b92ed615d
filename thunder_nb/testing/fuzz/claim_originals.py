"""The oracle's claims on thunder's own transform and the legacy one: the checker's error defects predict how the calls
went (claim 2), and the stock transform's ``host-sync-in-region`` is reported exactly where a region calls ``.item()``
(claim 3)."""

from __future__ import annotations

import contextlib
import inspect
import traceback
from typing import Any

from ...diagnosis.protocols import GraphTransform
from ...notebook.values import first_difference
from ..modes import CaptureMode, make_transform, stock_transform
from .calls import CallLog, execute, parameter_sets
from .programs import Program
from .reference import Reference, defect_text, describe, first_text, report_of
from .rules import known_by_values, predict
from .verdicts import ProgramOutcome, Verdict

__all__ = ["judge_legacy", "judge_stock", "region_sources"]


def _error_rules_before_run(jfn: Any, program: Program, device: str) -> tuple[tuple[str, ...], BaseException | None]:
    """Build ``jfn``'s traces for call 0's arguments without running them; the error rules the checker finds there."""
    import thunder_nb

    from ... import internals

    args = program.arguments(program.make_inputs(device, seed=0), parameter_sets(jfn, program, device)[0])
    try:
        internals.build_traces(jfn, *program.passed(args))
    except Exception as e:  # NOTE: judged by the caller (thunder asserting on a backward, e.g.)
        return (), e
    # NOTE: a failing analyze() is found again, and reported, after the run
    with contextlib.suppress(Exception):
        return tuple(sorted({d.rule for d in thunder_nb.analyze(jfn).defects if d.is_error})), None
    return (), None


def _hidden_rules(eager: CallLog) -> frozenset[str]:
    """Must-show rules that cannot show in this program, as eager's run tells.

    A parameter that ends up the same in both parameter sets (a program that zeroes it in place)
    hides thunder's runner copying set 1 into set 0 (``static-input-rebound``).
    """
    sets = [[p.detach() for p in ps] for ps in eager.parameters]
    if len(sets) > 1 and any(all(first_difference(s[i], sets[0][i]) is None for s in sets[1:])
                             for i in range(len(sets[0]))):
        return frozenset({"static-input-rebound"})
    return frozenset()


def _judge_original(kind: str, jfn: Any, program: Program, device: str, capture: CaptureMode, outcome: ProgramOutcome,
                    ref: Reference) -> tuple[Verdict, Any]:
    """Claim 2 for ``kind`` ("legacy", "stock"): the checker's error defects predict how the calls went.

    Returns the verdict and the report (None when there is none to read).
    """
    verdict = Verdict()
    verdict.before_run, error = _error_rules_before_run(jfn, program, device)
    run = None
    if error is None:
        run = execute(jfn, program, device)
        error = run.error
    if error is not None and _raised_while_compiling(error):
        verdict.compile_crash = describe(error) or type(error).__name__
        frames = {f.name for f in traceback.extract_tb(error.__traceback__)}
        if "unwrap_return_value" in frames or ("_insert_hand_out" in frames and "end with its return" in str(error)):
            # NOTE: thunder 0.2.6's dataflow fusion can order the region of a dead in-place update
            # after the return (plain thunder.jit with fusion_type="dataflow" fails an assertion in
            # unwrap_return_value; thunder-nb's hand-out pass checks for it first)
            verdict.compile_crash = "dataflow fusion put a region after the return"
        elif isinstance(error, AssertionError) and "transform_trace_post_optimization" in frames and kind == "stock":
            # NOTE: thunder 0.2.6's transform asserts on hard-coded positions of the backward trace
            # (it fails on a backward that saves a number): loud, at compile time, and documented
            verdict.compile_crash = "thunder's backward assertion (hard-coded trace positions)"
        return verdict, None
    kinds: frozenset[str] = frozenset()
    if error is not None:
        where = run.failed_at if run is not None else "compiling"
        verdict.failure, kinds = f"{where}: {describe(error)}", frozenset({"error"})
    else:
        failures = ref.disagrees(run, settle=False)
        verdict.failure, kinds = first_text(failures), frozenset(f.kind for f in failures)
    report = report_of(jfn, kind, outcome, error)
    if report is None:
        return verdict, None
    hidden = _hidden_rules(ref.eager)
    verdict.prediction = predict(report.defects, kinds, capture, hidden=hidden)
    if verdict.false_negative and error is None:
        # NOTE: only now is plain thunder's own behaviour worth its trace: it may explain the difference
        failures = ref.disagrees(run)
        verdict.failure, kinds = first_text(failures), frozenset(f.kind for f in failures)
        verdict.prediction = predict(report.defects, kinds, capture, hidden=hidden)
    verdict.kinds = tuple(sorted(kinds))
    if verdict.false_negative:
        bug = known_by_values(kind, kinds, program, capture)
        if bug:
            # NOTE: wrong values the checker cannot explain, from a known bug: counted, not judged
            outcome.known_bugs += (bug,) if bug not in outcome.known_bugs else ()
            verdict.failure, verdict.kinds = None, ()
            verdict.prediction = predict(report.defects, frozenset(), capture, hidden=hidden)
    p = verdict.prediction
    if verdict.kinds and not p.false_negative:
        early = [d for d in report.defects if d.rule in verdict.before_run]
        alone = predict(early, frozenset(verdict.kinds), capture, hidden=hidden)
        verdict.explained_before_run = not alone.false_negative
    if p.false_negative:
        outcome.problems.append(f"false negative ({kind}): it failed ({verdict.failure}); failure kinds "
                                f"{list(p.unexplained)} are not explained by the checker's errors {list(p.errors)}")
    if p.false_positive:
        outcome.problems.append(f"false positive ({kind}): {list(p.not_shown)} must show, and the calls gave "
                                f"{'failure kinds ' + str(list(p.failed)) if p.failed else 'no failure'}:\n  "
                                + "\n  ".join(defect_text(d) for d in report.defects if d.rule in p.not_shown))
    return verdict, report


def judge_legacy(fn, program: Program, device: str, capture: CaptureMode, outcome: ProgramOutcome,
                 ref: Reference) -> None:
    from thunder_nb.fix import LegacyCUDAGraphTransform

    jleg = program.jit(fn, device, transforms=[make_transform(LegacyCUDAGraphTransform, capture)])
    outcome.legacy, _ = _judge_original("legacy", jleg, program, device, capture, outcome, ref)
    crash = outcome.legacy.compile_crash
    if crash is not None and not crash.startswith("dataflow fusion"):
        outcome.problems.append(f"legacy crashed while compiling: {crash}")


def region_sources(jfn: Any) -> dict[str, str]:
    """``{region name: Python source}`` of the last forward and backward traces, read from the runner."""
    import thunder

    out: dict[str, str] = {}
    traces = list(thunder.last_traces(jfn)[-1:]) + list((thunder.last_backward_traces(jfn) or [])[-1:])
    for trace in traces:
        for b in trace.bound_symbols:
            if not (getattr(b.sym, "is_fusion", False) and isinstance(b.sym.executor, GraphTransform)):
                continue
            runner = b.sym.executor.cuda_graph_runner
            if b.sym.name in runner.python_callables:
                out[b.sym.name] = inspect.getsource(runner.python_callables[b.sym.name][0])
    return out


def _calls_item(source: str) -> bool:
    """Whether generated source calls ``.item()`` in code (not in the comments that quote user lines)."""
    return any(".item(" in line.split("#", 1)[0] for line in source.splitlines())


def judge_stock(fn, program: Program, device: str, capture: CaptureMode, outcome: ProgramOutcome,
                ref: Reference) -> None:
    """Claims 2 and 3 for thunder's own transform.

    A crash of thunder 0.2.6 while compiling (its AssertionError on a backward that saves a number)
    leaves no backward to run and is only counted; the forward traces are still checked for claim 3.
    """
    import thunder_nb

    jstock = program.jit(fn, device, transforms=[stock_transform(capture)], fusion_type=program.fusion_type)
    outcome.stock, report = _judge_original("stock", jstock, program, device, capture, outcome, ref)
    crash = outcome.stock.compile_crash
    if crash is not None and not crash.startswith(("thunder's backward assertion", "dataflow fusion")):
        outcome.problems.append(f"stock crashed while compiling where plain thunder did not: {crash}")
    if report is None and outcome.stock.compile_crash is None:
        return  # NOTE: analyze() raised, which _judge_original has reported
    try:
        report = report or thunder_nb.analyze(jstock)
        sources = region_sources(jstock)
    except Exception as e:
        outcome.problems.append(f"no stock traces to check ({describe(e)}; compile: {outcome.stock.compile_crash})")
        return
    outcome.stock_item_in_region = any(_calls_item(src) for src in sources.values())
    outcome.stock_host_sync_reported = any(d.rule == "host-sync-in-region" for d in report.defects)
    if outcome.stock_item_in_region != outcome.stock_host_sync_reported:
        outcome.problems.append(f"stock: .item() inside a region: {outcome.stock_item_in_region}, "
                                f"host-sync-in-region reported: {outcome.stock_host_sync_reported}")


def _raised_while_compiling(e: BaseException) -> bool:
    """Whether thunder raised ``e`` while building the compiled function (not while running it)."""
    return "apply_transforms_and_build_cache_entry" in {f.name for f in traceback.extract_tb(e.__traceback__)}

