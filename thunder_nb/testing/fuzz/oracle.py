"""The differential oracle: one program through eager PyTorch and thunder's CUDA-graph transforms, its claims judged."""

from __future__ import annotations

import contextlib
import inspect
import traceback
import warnings
from collections.abc import Callable
from typing import Any

from ...diagnosis.protocols import GraphTransform, PlanningTransform, RecordingRunner
from ...notebook.values import first_difference
from ..modes import CaptureMode, capturing, check_mode, make_transform, stock_transform
from .calls import Failure, Run, differences, execute, yardstick_problem
from .programs import Program
from .rules import KNOWN_BUGS, known_analyze_error, known_by_values, predict
from .verdicts import FixedStats, Outcome, Verdict

__all__ = ["judge", "Outcome", "Verdict", "FixedStats", "region_sources"]


class _Reference:
    """Eager PyTorch's run, and plain ``thunder.jit``'s (made on demand): the one judge of "equal"
    (`thunder_nb.diagnosis.judge`) lets a run differ from eager's as far as plain thunder's does, while plain thunder
    is sane itself (``thunder_wrong`` says where it is not)."""

    def __init__(self, fn: Callable[..., Any], program: Program, device: str, outcome: Outcome):
        self._fn, self._program, self._device, self._outcome = fn, program, device, outcome
        self.eager = execute(fn, program, device)
        self._plain: Run | None = None
        self.thunder_wrong: str | None = None  # why plain thunder is itself wrong here (not finite, far from eager)

    @property
    def plain(self) -> Run:
        import thunder

        if self._plain is None:
            jfn = thunder.jit(self._fn, fusion_type=self._program.fusion_type)
            self._plain = execute(jfn, self._program, self._device)
            self._outcome.thunder_differs = self._plain.error is None and bool(differences(self._plain, self.eager))
            if self._outcome.thunder_differs:
                self.thunder_wrong = yardstick_problem(self._plain, self.eager)
        return self._plain

    def disagrees(self, run: Run, *, settle: bool = True) -> list[Failure]:
        """How ``run`` differs from eager PyTorch; empty when it agrees (where thunder differs, within thunder's own
        difference).

        With ``settle=False`` plain thunder is not consulted (it costs a trace): for a first look.
        """
        found = differences(run, self.eager)
        if found and settle and self.plain.error is None and self._outcome.thunder_differs:
            # NOTE: where thunder itself differs from eager, the run may differ as far, and no further; a plain
            # thunder that is itself wrong excuses nothing
            return [Failure(f.kind, f"{f.text} (thunder without graphs differs from eager too)")
                    for f in differences(run, self.eager, without_graphs=self.plain)]
        return found


def judge(program: Program, *, device: str = "cpu", capture: CaptureMode = False) -> Outcome:
    """Run ``program`` through eager PyTorch and thunder (plain, fixed, legacy, stock) and judge the claims.

    Each version goes through `calls.PROTOCOL` (three calls with fresh inputs, two parameter sets,
    two forwards before one backward, every result kept). The claims, each broken one a line of
    ``Outcome.problems``:

    1. fixed: everything the calls leave (outputs fresh and kept, aliasing, arguments after the
       calls, gradients) equals eager PyTorch's (`calls.differences`), and its traces have no defect
       but ``scalar-region-input`` on a number whose hand-off it refused and explained;
    2. legacy and stock: the checker's error defects predict the run (`rules.predict`): every kind
       of failure is one a reported defect can cause in this mode (no false negative), and every
       must-show defect did show (no false positive). The rules found in the traces before the
       first call are kept apart from those the runner recorded during the run;
    3. stock: ``host-sync-in-region`` is reported exactly when a region's code calls ``.item()``.

    A program that PyTorch or plain thunder rejects is discarded. Values are judged by the one judge of
    "equal" (`thunder_nb.diagnosis.judge`): where plain thunder's own results differ from eager PyTorch's, a
    transform may differ from eager as far as plain thunder does, and no further; where plain thunder is itself
    wrong (not finite where eager is, far from eager) and the fixed transform differs from eager, the program is
    discarded as thunder's wrong result ("thunder wrong: ..."), never judged equal. Bugs already found are in
    `rules.KNOWN_BUGS`: counted, not reported again.

    Args:
        program: the program.
        device: where its inputs live (``"cpu"`` or ``"cuda"``).
        capture: True: capture CUDA graphs for real (needs ``device="cuda"``); False: regions run
            eagerly; ``"emulated"``: the runners' capture path on the CPU (`thunder_nb.testing.emulated_capture`).

    Returns:
        The `Outcome`; ``discarded`` says why when PyTorch or plain thunder rejects the program, or plain thunder
        is itself wrong where the fixed transform differs from eager.
    """
    outcome = Outcome(program, capture=check_mode(capture))
    fn = program.function()
    with warnings.catch_warnings(), capturing(capture):
        warnings.simplefilter("ignore")
        ref = _Reference(fn, program, device, outcome)
        if ref.eager.error is not None:
            outcome.discarded = f"PyTorch rejects: {type(ref.eager.error).__name__}"
            return outcome
        if not _judge_fixed(fn, program, device, capture, outcome, ref):
            return outcome
        _judge_legacy(fn, program, device, capture, outcome, ref)
        _judge_stock(fn, program, device, capture, outcome, ref)
    return outcome


def _first(failures: list[Failure]) -> str | None:
    return f"{failures[0].kind}: {failures[0].text}" if failures else None


def _judge_fixed(fn, program: Program, device: str, capture: CaptureMode, outcome: Outcome, ref: _Reference) -> bool:
    """Claim 1: the fixed transform leaves what eager PyTorch leaves, and its traces have no defect.

    Returns False when the program is discarded (plain thunder cannot run it either, or is itself wrong).
    """
    import thunder

    from thunder_nb.fix import FixedCUDAGraphTransform

    transform = make_transform(FixedCUDAGraphTransform, capture)
    jfixed = thunder.jit(fn, transforms=[transform], fusion_type=program.fusion_type)
    run = execute(jfixed, program, device)
    if run.error is not None:
        if ref.plain.error is not None:
            outcome.discarded = f"thunder rejects: {type(ref.plain.error).__name__}"
            return False
        outcome.fixed_error = f"{run.failed_at}: {_describe(run.error)}"
        outcome.problems.append(f"fixed raised where plain thunder ran ({outcome.fixed_error})\n"
                                + "".join(traceback.format_exception(run.error)[-6:]))
    else:
        failures = ref.disagrees(run)
        outcome.fixed_mismatch = _first(failures)
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


def _known_wrong_results(fn, program: Program, device: str, capture: CaptureMode, ref: _Reference) -> tuple[str, ...]:
    """The known bugs that explain the fixed transform's wrong results: those whose variant runs right.

    Variants are tried one bug at a time, then all together (several bugs at once).
    """
    import thunder

    from thunder_nb.fix import FixedCUDAGraphTransform

    default = {"fusion_type": program.fusion_type, "scalar_handoff": True, "capture": capture}

    def right_with(options: dict[str, Any]) -> bool:
        opts = {**default, **options}
        if opts == default:
            return False  # NOTE: this variant is what already ran
        transform = make_transform(FixedCUDAGraphTransform, opts["capture"], scalar_handoff=opts["scalar_handoff"])
        run = execute(thunder.jit(fn, transforms=[transform], fusion_type=opts["fusion_type"]), program, device)
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


def _analyze(jfn: Any, kind: str, outcome: Outcome, error: BaseException | None = None) -> Any:
    """``thunder_nb.analyze(jfn)``; None when it raised (a known bug is counted, anything else is a problem)."""
    import thunder_nb

    try:
        return thunder_nb.analyze(jfn, error=error)
    except Exception as e:
        bug = known_analyze_error(e)
        if bug is None:
            outcome.problems.append(f"analyze() failed on the {kind} transform's traces: {_describe(e)}\n"
                                    + "".join(traceback.format_exception(e)[-4:]))
        elif bug not in outcome.known_bugs:
            outcome.known_bugs += (bug,)
        return None


def _defect_text(d: Any) -> str:
    return f"{d.rule} @ {d.trace}/{d.where()} ({d.value}): {d.message}"


def _check_fixed_traces(jfixed: Any, transform: Any, outcome: Outcome, error: BaseException | None) -> None:
    """No defect in the fixed transform's traces, but a refused scalar hand-off that says why."""
    report = _analyze(jfixed, "fixed", outcome, error)
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
            defects.append(_defect_text(d))
    outcome.fixed_defects = tuple(defects)
    outcome.fixed_fallbacks = tuple(fallbacks)
    outcome.known_bugs += tuple(known)
    if defects:
        outcome.problems.append("defects in the fixed transform's traces:\n  " + "\n  ".join(defects))


def _error_rules_before_run(jfn: Any, program: Program, device: str) -> tuple[tuple[str, ...], BaseException | None]:
    """Build ``jfn``'s traces for call 0's arguments without running them; the error rules the checker finds there."""
    import thunder_nb

    from ... import internals

    args = program.arguments(program.make_inputs(device, seed=0), program.make_parameters(device, 0))
    try:
        internals.build_traces(jfn, *args)
    except Exception as e:  # NOTE: judged by the caller (thunder asserting on a backward, e.g.)
        return (), e
    # NOTE: a failing analyze() is found again, and reported, after the run
    with contextlib.suppress(Exception):
        return tuple(sorted({d.rule for d in thunder_nb.analyze(jfn).defects if d.is_error})), None
    return (), None


def _hidden_rules(eager: Run) -> frozenset[str]:
    """Must-show rules that cannot show in this program, as eager's run tells.

    A parameter that ends up the same in both parameter sets (a program that zeroes it in place)
    hides thunder's runner copying set 1 into set 0 (``static-input-rebound``).
    """
    sets = [[p.detach() for p in ps] for ps in eager.parameters]
    if len(sets) > 1 and any(all(first_difference(s[i], sets[0][i]) is None for s in sets[1:])
                             for i in range(len(sets[0]))):
        return frozenset({"static-input-rebound"})
    return frozenset()


def _judge_original(kind: str, jfn: Any, program: Program, device: str, capture: CaptureMode, outcome: Outcome,
                    ref: _Reference) -> tuple[Verdict, Any]:
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
        verdict.compile_crash = _describe(error) or type(error).__name__
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
        verdict.failure, kinds = f"{where}: {_describe(error)}", frozenset({"error"})
    else:
        failures = ref.disagrees(run, settle=False)
        verdict.failure, kinds = _first(failures), frozenset(f.kind for f in failures)
    report = _analyze(jfn, kind, outcome, error)
    if report is None:
        return verdict, None
    hidden = _hidden_rules(ref.eager)
    verdict.prediction = predict(report.defects, kinds, capture, hidden=hidden)
    if verdict.false_negative and error is None:
        # NOTE: only now is plain thunder's own behaviour worth its trace: it may explain the difference
        failures = ref.disagrees(run)
        verdict.failure, kinds = _first(failures), frozenset(f.kind for f in failures)
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
                                + "\n  ".join(_defect_text(d) for d in report.defects if d.rule in p.not_shown))
    return verdict, report


def _judge_legacy(fn, program: Program, device: str, capture: CaptureMode, outcome: Outcome, ref: _Reference) -> None:
    import thunder

    from thunder_nb.fix import LegacyCUDAGraphTransform

    jleg = thunder.jit(fn, transforms=[make_transform(LegacyCUDAGraphTransform, capture)])
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


def _judge_stock(fn, program: Program, device: str, capture: CaptureMode, outcome: Outcome, ref: _Reference) -> None:
    """Claims 2 and 3 for thunder's own transform.

    A crash of thunder 0.2.6 while compiling (its AssertionError on a backward that saves a number)
    leaves no backward to run and is only counted; the forward traces are still checked for claim 3.
    """
    import thunder

    import thunder_nb

    jstock = thunder.jit(fn, transforms=[stock_transform(capture)], fusion_type=program.fusion_type)
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
        outcome.problems.append(f"no stock traces to check ({_describe(e)}; compile: {outcome.stock.compile_crash})")
        return
    outcome.stock_item_in_region = any(_calls_item(src) for src in sources.values())
    outcome.stock_host_sync_reported = any(d.rule == "host-sync-in-region" for d in report.defects)
    if outcome.stock_item_in_region != outcome.stock_host_sync_reported:
        outcome.problems.append(f"stock: .item() inside a region: {outcome.stock_item_in_region}, "
                                f"host-sync-in-region reported: {outcome.stock_host_sync_reported}")


def _raised_while_compiling(e: BaseException) -> bool:
    """Whether thunder raised ``e`` while building the compiled function (not while running it)."""
    return "apply_transforms_and_build_cache_entry" in {f.name for f in traceback.extract_tb(e.__traceback__)}


def _describe(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}"[:200].rstrip(": ")
