"""Compile a function with the original and the fixed CUDA-graph transform, run both, check them against eager PyTorch."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..cudagraph.capture import capture_mode
from ..cudagraph.executors import executor_list
from ..diagnosis import failures
from ..diagnosis.failures import Failure
from ..diagnosis.model import Defect, Report
from ..render.common import plural
from . import runs
from .outcome import (
    EAGER_DEVICE,
    ORIGINALS,
    PEER,
    PEER_MODE,
    CaptureUnavailableError,
    CompareError,
    EagerError,
    Outcome,
    TraceError,
)
from .values import short
from .verdict import (
    WRONG_WHEN,
    _by_priority,
    _check_text,
    _defect_phrase,
    _failure_phrase,
    _nothing_captured,
    _run_phrase,
    _speed,
    _us,
    _warnings_phrase,
)

__all__ = [
    "compare",
    "Comparison",
    "Outcome",
    "CompareError",
    "TraceError",
    "CaptureUnavailableError",
    "EagerError",
    "ORIGINALS",
    "EAGER_DEVICE",
    "PEER",
    "PEER_MODE",
]


@dataclass(frozen=True, slots=True)
class Comparison:
    """The original and the fixed transform on one function and its inputs, checked against eager."""

    function: str
    original_kind: str  # "stock" | "legacy"
    original: Report
    fixed: Report
    results: Mapping[str, Outcome]  # "original", "fixed"
    timings: Mapping[str, float]  # median microseconds per call: "eager", "fixed", "original" (those that ran)
    graphs: Mapping[str, int]  # CUDA graphs captured: "original", "fixed"
    device: str  # "cuda" or `EAGER_DEVICE`
    gpu: bool = False  # torch saw a CUDA device
    capture: bool | str = "auto"
    training: bool = False
    executed: bool = True
    eager_value: str = ""
    repeats: int = 0
    notes: tuple[str, ...] = ()  # what else went wrong, e.g. a later call failing while timing
    #: the jitted functions, "original" and "fixed" (to call again, or to inspect with thunder)
    functions: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    spread: Mapping[str, tuple[float, float]] = field(default_factory=dict)  # 10th and 90th percentile, µs
    warmup: int = 0  # untimed calls before the timed ones
    threads: int = 0  # torch's CPU threads while timing
    lr: float | None = None  # the SGD learning rate of each training step (None: no step taken)
    steps: int = 0  # training steps each run took (the checked call, warm-up and timed calls)
    trainable: tuple[str, ...] = ()  # the tensors whose gradients are compared, e.g. "model.0.weight", "w1"
    peers: bool = False  # torch.compile reduce-overhead ran too: results["peer"], timings["peer"]

    @property
    def on_cuda(self) -> bool:
        """True when the inputs are on a CUDA device."""
        return self.device == "cuda"

    @property
    def random_ops(self) -> tuple[str, ...]:
        """The random ops the fixed side's traces run (``uniform`` for dropout): their draws are not eager's."""
        from ..diagnosis.ops import CAPTURE_DEPENDENT, RANDOM_NAMES

        found = {base for t in self.fixed.traces for op in (*t.ops, *(o for r in t.regions for o in r.ops))
                 if (base := op.callee.rsplit(".", 1)[-1]) in RANDOM_NAMES or base in CAPTURE_DEPENDENT}
        return tuple(sorted(found))

    def verdict(self) -> str:
        """Return the one-line verdict, e.g. ``original (stock): capture fails, item inside CUDAGraph1; fixed: ...``."""
        phrases = (self._original_phrase(), self._fixed_phrase(), self._peer_phrase(), self._mode_phrase())
        return "; ".join(p for p in phrases if p)

    def _original_phrase(self) -> str:
        out = self.results["original"]
        parts: list[str] = []
        if out.failure:
            parts.append(_failure_phrase(out.failure))
        errors = _by_priority(d for d in self.original.defects if d.is_error)
        if errors:
            phrase = _defect_phrase(self.original, errors[0])
            if len(errors) > 1:
                phrase += f" (+{len(errors) - 1} more)"
            if errors[0].rule == "host-sync-in-region" and not out.error and self.graphs.get("original", 0) == 0:
                phrase += " (capture would fail)"
            parts.append(phrase)
        elif self.original.defects:
            parts.append(_warnings_phrase(self.original.defects))
        if not out.error:
            run = _run_phrase(out, self) if self.executed else "not run"
            if self.executed and out.ok and errors and errors[0].rule in WRONG_WHEN:
                # NOTE: the hazard did not show on these inputs: say so, and when it would
                when = WRONG_WHEN[errors[0].rule]
                run = run.replace("matches eager", "equal to eager in this run", 1) + f" (would be wrong {when})"
            parts.append(run)
        return f"original ({self.original_kind}): " + ", ".join(parts)

    def _fixed_phrase(self) -> str:
        rep, out = self.fixed, self.results["fixed"]
        regions = sum(len(t.regions) for t in rep.traces)
        islands = sum(len(t.islands) for t in rep.traces)
        parts = [plural(regions, "region"), plural(islands, "island")]
        nothing = _nothing_captured(rep) if regions == 0 else None
        if nothing:
            parts.append(nothing)
        errors = _by_priority(d for d in rep.defects if d.is_error)
        if errors:
            parts.append(plural(len(errors), "defect") + ": " + _defect_phrase(rep, errors[0]))
        if out.failure:
            parts.append(_failure_phrase(out.failure))
        elif not self.executed:
            parts.append("not run")
        else:
            parts.append(_run_phrase(out, self))
            eager_us, fixed_us = self.timings.get("eager"), self.timings.get("fixed")
            # NOTE: a speed-up is only claimed for captured graphs; eager-mode timings say nothing about them
            if self.graphs.get("fixed", 0) > 0 and eager_us and fixed_us:
                parts.append(_speed(eager_us, fixed_us, "eager"))
                if self.timings.get("peer"):
                    parts.append(_speed(self.timings["peer"], fixed_us, PEER))
        return "fixed: " + ", ".join(parts)

    def _peer_phrase(self) -> str:
        """``torch.compile reduce-overhead: matches eager, 2.1x faster than eager``, or how it failed, in words."""
        out = self.results.get("peer")
        if not self.peers or not self.executed or out is None:
            return ""
        if out.failure:
            return f"{PEER}: fails ({out.failure.error_type}), so no speed compared with it"
        parts = [_run_phrase(out, self)]
        eager_us, peer_us = self.timings.get("eager"), self.timings.get("peer")
        # NOTE: as for the fixed side, a speed only where CUDA graphs are captured (reduce-overhead's own, on CUDA)
        if self.on_cuda and self.capture is not False and eager_us and peer_us:
            parts.append(_speed(eager_us, peer_us, "eager"))
        return f"{PEER}: " + ", ".join(parts)

    def _mode_phrase(self) -> str:
        if not self.executed:
            return ""
        if not self.on_cuda:
            why = "inputs on the CPU" if self.gpu else "no GPU"
            return f"eager mode ({why}): no CUDA graph captured, no speed compared"
        if self.capture is False:
            return "eager mode (capture off): no CUDA graph captured"
        return ""

    # --- views ------------------------------------------------------------------------------------

    def run_rows(self) -> list[tuple[str, str]]:
        """The run section as (label, text) rows: value, check against eager, timings, graphs captured."""
        if not self.executed:
            return [("run", "not run (--no-run): traces only")]
        fixed, orig = self.results["fixed"], self.results["original"]
        rows = [("device", self.device)]
        peer = self.results.get("peer") if self.peers else None
        rows.append(("value", f"eager {self.eager_value}; fixed {fixed.value or '-'}"
                     + (f"; original {orig.value}" if orig.ran else "")
                     + (f"; torch.compile {peer.value}" if peer is not None and peer.ran else "")))
        checks = [("fixed", fixed), (f"original ({self.original_kind})", orig)] + ([(PEER, peer)] if peer else [])
        for label, out in checks:
            rows.append((f"check {label}", _check_text(out, self)))
        if self.training:
            shown = ", ".join(self.trainable[:6]) + (", …" if len(self.trainable) > 6 else "")
            how = f"; an SGD step (lr {self.lr:g}) after each of {self.steps} calls" if self.lr is not None else ""
            rows.append(("gradients of", f"{shown} ({plural(len(self.trainable), 'tensor')}){how}"))
        rows.append(("timings", self._timings_text()))
        graphs = f"fixed {self.graphs.get('fixed', 0)}, original {self.graphs.get('original', 0)}"
        if not self.on_cuda:
            graphs += " (eager mode: inputs on the CPU)" if self.gpu else " (eager mode: no GPU)"
        elif self.capture is False:
            graphs += " (capture off)"
        rows.append(("graphs captured", graphs))
        rows += [("note", n) for n in self.notes]
        return rows

    def _timings_text(self) -> str:
        order = [("eager", "eager"), ("fixed", "fixed"), ("original", f"original ({self.original_kind})"), ("peer", PEER)]
        times = []
        for key, name in order:
            if key in self.timings:
                low, high = self.spread.get(key, (self.timings[key], self.timings[key]))
                times.append(f"{name} {_us(self.timings[key])} ({_us(low, unit=False)}-{_us(high)})")
        if not times:
            return "-"
        how = f"median (10th-90th percentile) of {self.repeats} calls after {self.warmup} warm-up calls"
        if not self.on_cuda:
            # NOTE: on the CPU the regions run as plain Python: these numbers say nothing about CUDA graphs
            how += f", {self.threads} CPU threads; regions ran as plain Python, so these are no CUDA-graph timings"
        elif self.capture is False:
            how += "; capture off, so these are no CUDA-graph timings"
        return ", ".join(times) + f": {how}"

    def run_text(self) -> str:
        """Return the run section as text."""
        rows = self.run_rows()
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

    def run_html(self) -> str:
        """Return the run section as an HTML table."""
        from ..render.html import rows_table

        return rows_table(self.run_rows())

    def verdict_html(self) -> str:
        """Return the verdict as one HTML line, each side's phrase in the colour of its worst finding (red: it would
        crash, fails, computes a wrong result or differs from eager; amber: warnings; green: nothing wrong)."""
        from ..render.html import verdict_spans

        phrases = [(self._original_phrase(), self._level(self.original, self.results["original"])),
                   (self._fixed_phrase(), self._level(self.fixed, self.results["fixed"]))]
        peer = self._peer_phrase()
        if peer:
            peer_out = self.results["peer"]
            phrases.append((peer, "good" if peer_out.ok else "bad"))
        mode = self._mode_phrase()
        if mode:
            phrases.append((mode, "note"))
        return verdict_spans(phrases)

    def _level(self, report: Report, out: Outcome) -> str:
        """"bad", "warn" or "good": the worst of a side's defects and its run (a difference that random ops explain
        is no finding)."""
        if out.failure is not None or any(d.is_error for d in report.defects):
            return "bad"
        if self.executed and out.ran and not out.ok and not self.random_ops:
            return "bad"
        return "warn" if report.defects else "good"

    def to_text(self) -> str:
        """Return the whole comparison as text: verdict, both reports, the run section."""
        from .. import render

        return "\n\n".join(
            [
                self.verdict(),
                f"== original ({self.original_kind}) ==\n{render.report_text(self.original)}",
                f"== fixed ==\n{render.report_text(self.fixed)}",
                f"== run ==\n{self.run_text()}",
            ]
        )

    def to_html(self) -> str:
        """Return the whole comparison as static HTML: verdict, both reports side by side, the run section."""
        from .. import render

        return self.verdict_html() + render.side_by_side_html(self.original, self.fixed) + self.run_html()

    def _repr_mimebundle_(self, include=None, exclude=None):
        makers = {"text/plain": self.to_text, "text/html": self.to_html}
        wanted = [m for m in makers if (not include or m in include) and (not exclude or m not in exclude)]
        return {m: makers[m]() for m in wanted}


# ---------------------------------------------------------------------------------------------------
# compare


def _check_options(original: str, capture: Any, repeats: int, training: bool, lr: float | None,
                   peers: bool = False, execute: bool = True) -> None:
    if original not in ORIGINALS:
        raise ValueError(f"unknown original: {original!r} (must be one of {list(ORIGINALS)})")
    capture_mode(capture)
    if int(repeats) < 1:
        raise ValueError(f"repeats must be at least 1, not {repeats!r}")
    if lr is not None and not training:
        raise ValueError("lr needs training=True (an SGD step needs gradients)")
    if lr is not None and not lr > 0:
        raise ValueError(f"lr must be a positive number, not {lr!r}")
    if peers and not execute:
        raise ValueError("peers needs a run (torch.compile is timed): not with execute=False")


def _check_capture(capture: Any, cuda: bool) -> None:
    import torch

    if capture is not True:
        return
    if not torch.cuda.is_available():
        raise CaptureUnavailableError(
            "capturing CUDA graphs (capture on) needs a CUDA GPU, and torch sees none: "
            "use capture auto (regions then run eagerly) or off"
        )
    if not cuda:
        raise CaptureUnavailableError(
            "capturing CUDA graphs (capture on) needs the inputs on a CUDA device; they are all on the CPU"
        )


def _import_thunder(say: Callable[[str], None]) -> None:
    """Import thunder (4-5 s the first time, silent otherwise): say so first."""
    if "thunder" not in sys.modules:
        say("importing torch and thunder (the first time takes a few seconds)…")
    with warnings.catch_warnings():
        # NOTE: thunder warns at import about an optional executor nobody asked for
        warnings.filterwarnings("ignore", message="transformer_engine module not found")
        import thunder  # noqa: F401

        from ..diagnosis import analysis
        from .. import fix  # noqa: F401


def _run_all(eager: Any, compiled: Mapping[str, Any], plan: Any,
             say: Callable[[str], None]) -> tuple[Any, dict[str, Outcome], Any, list[str]]:
    """Run and time eager PyTorch, then check and time each compiled run (``runs.Run``) against it, in order.

    Returns:
        (eager's checked call, an `Outcome` per key of ``compiled``, the timings, notes on later failures).
    """
    say(f"running {plan.name} in eager PyTorch…")
    reference = runs.reference(eager, plan)
    timings, notes = runs.Timings(), []
    timings.add("eager", runs.time_calls(eager, plan))
    eager_params = runs.params(eager) if plan.lr is not None else None
    results: dict[str, Outcome] = {}
    for key, run in compiled.items():
        # NOTE: only a CUDA trace can hold a defect that kills the process (a capture hazard)
        fatal = _fatal_defect(run) if plan.cuda and run.trace_error is None else None
        if run.trace_error is not None:
            results[key] = Outcome(False, Failure.of(run.trace_error, "trace"))
        elif fatal is not None:
            say(f"not running the {key} version: {fatal.message}")
            results[key] = Outcome(False, Failure.predicted(fatal))
        else:
            results[key] = runs.check_and_time(run, reference, eager_params, timings, notes, plan, say)
    return reference, results, timings, notes


def _fatal_defect(run: Any) -> Defect | None:
    """The first defect of ``run``'s traces that would kill the process if it ran (None: none, or not a thunder run).

    A segmentation fault cannot be caught: in a notebook it takes the kernel and the user's namespace with it, so
    a version the checker says would crash is not called at all.
    """
    from ..diagnosis.analysis import analyze

    if run.jfn is None or not hasattr(run.jfn, "_lc_cd"):
        return None
    try:
        defects = analyze(run.jfn).defects
    except Exception:  # NOTE: a report that cannot be built predicts nothing; the run's own errors still show
        return None
    return next((d for d in defects if d.severity == "crashes the process"), None)


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def compare(
    fn: Callable[..., Any],
    args: tuple | list = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    original: str = "stock",
    training: bool = False,
    lr: float | None = None,
    repeats: int = 20,
    execute: bool = True,
    capture: bool | str = "auto",
    executors: Sequence[str] = (),
    peers: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Comparison:
    """Compile ``fn`` with the original and the fixed CUDA-graph transform, run both and check them against eager.

    Each run (eager, fixed, original) gets its own copy of the modules and trainable tensors ``fn``
    reaches, through its arguments, closure cells and the globals it names (`thunder_nb.notebook.reach.bind`),
    and fresh clones of the other input tensors on every call: runs never see each other's results,
    gradients or updates, and the caller's objects are never touched. With ``original="stock"``,
    thunder's fusion and del passes are used as they are; its runner is replaced by one that captures
    the same way on CUDA, records each graph and, without CUDA inputs (or with ``capture=False``),
    runs regions eagerly.

    Args:
        fn: a function (or ``torch.nn.Module``) that thunder can trace.
        args, kwargs: its inputs.
        original: ``"stock"`` (thunder's `CUDAGraphTransform`) or ``"legacy"`` (`LegacyCUDAGraphTransform`).
        training: call ``.backward()`` on the scalar result and compare the gradients of every tensor
            that requires grad that ``fn`` reaches (arguments, module parameters, closures, globals).
        lr: with ``training``, follow every call by an SGD step (``p -= lr * p.grad``) on each run's
            own parameters, and compare the parameters with eager's after the last step: training
            in its steady state, not just one step.
        repeats: calls timed per version (median and spread reported), after a few untimed ones.
        execute: False builds and analyses the traces only (nothing runs, nothing is timed).
        capture: ``"auto"`` (capture on CUDA, eager regions otherwise), True (capture; needs CUDA
            inputs), False (regions run eagerly).
        executors: fusion executors to put before thunder's defaults, for both transforms, by name
            (`thunder_nb.cudagraph.executors.EXECUTOR_NAMES`: ``"torchcompile"`` fuses with inductor; its first
            call compiles, which can take tens of seconds).
        peers: also check and time ``torch.compile(fn, mode="reduce-overhead")`` on its own copies; the
            verdict then gives the fixed side's speed against it too. Its failing is recorded, not raised.
        progress: called with a short status line ("tracing…", "running…") as work proceeds.

    Returns:
        A `Comparison`; the original failing (tracing or running) is recorded in it, not raised.

    Raises:
        TraceError: thunder cannot trace ``fn`` with these inputs (the message names the op and line).
        EagerError: ``fn`` itself raises, in eager PyTorch (the message names the line).
        CaptureUnavailableError: ``capture=True`` without a CUDA device or without CUDA inputs.
        CompareError: ``training=True`` without a tensor that requires grad, or without a scalar result.
        ValueError: an option has a value outside the documented ones.
    """
    _check_options(original, capture, repeats, training, lr, peers, execute)
    say = progress or (lambda message: None)
    _import_thunder(say)
    from .. import internals

    chosen = executor_list(tuple(executors))
    import torch

    from ..diagnosis.analysis import analyze
    from ..fix import EagerFallbackWarning

    args, kwargs, name = tuple(args), dict(kwargs or {}), _name(fn)
    eager = runs.Run.eager(fn, args, kwargs)
    cuda = runs.on_cuda(eager.bound)
    _check_capture(capture, cuda)
    if training and not eager.bound.trainable:
        raise CompareError(
            f"training needs a tensor that requires grad: an input of {name}, or a parameter of a module it "
            "reaches (as an argument, a closure variable or a global it names); none does "
            "(e.g. w.requires_grad_())"
        )
    plan = runs.Plan(name, training, lr, int(repeats), cuda)
    common = dict(function=name, original_kind=original, device="cuda" if cuda else EAGER_DEVICE,
                  gpu=torch.cuda.is_available(), capture=capture, training=training,
                  trainable=tuple(eager.bound.trainable) if training else (), peers=bool(peers))
    with warnings.catch_warnings():
        # NOTE: eager mode is stated in the Comparison (device, verdict); thunder's deprecation noise is not the user's
        warnings.filterwarnings("ignore", category=EagerFallbackWarning)
        warnings.filterwarnings("ignore", message=r"torch\.is_autocast_cpu_enabled")

        orig, fixed = runs.compile_both(fn, args, kwargs, original, capture, plan, say, chosen)
        functions = {"original": orig.jfn, "fixed": fixed.jfn}
        if not execute:
            orig_failed = Outcome(False, Failure.of(orig.trace_error, "trace")) if orig.trace_error else Outcome(False)
            return Comparison(
                original=analyze(orig.jfn, error=orig.trace_error), fixed=analyze(fixed.jfn),
                results={"original": orig_failed, "fixed": Outcome(False)},
                timings={}, graphs={"original": 0, "fixed": 0}, executed=False, functions=functions, **common,
            )

        # NOTE: the original runs last: a capture that fails must not disturb the other runs' device state
        peer = {"peer": runs.peer(fn, args, kwargs)} if peers else {}
        reference, results, timings, notes = _run_all(eager, {"fixed": fixed, **peer, "original": orig}, plan, say)
        say(f"analysing {name}…")
        return Comparison(
            original=analyze(orig.jfn, error=orig.error), fixed=analyze(fixed.jfn, error=fixed.error),
            results=results, timings=timings.medians, spread=timings.spread,
            graphs={"original": orig.runner.graphs_captured, "fixed": fixed.runner.graphs_captured},
            executed=True, eager_value=short(runs.detached(reference.value)), repeats=int(repeats),
            notes=tuple(notes), functions=functions, warmup=runs.WARMUP, threads=torch.get_num_threads(),
            lr=lr, steps=eager.steps, **common,
        )
