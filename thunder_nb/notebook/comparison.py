"""`compare`: compile a function with the original and the fixed CUDA-graph transform, run both, check them against
eager PyTorch."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import internals
from ..cudagraph.capture import Capture, only, parse_capture, resolve
from ..cudagraph.executors import executor_list, jit_executors
from ..diagnosis.failures import Failure
from ..diagnosis.model import Defect
from . import checks, runs
from .compared import Comparison
from .options import check_run, resolve_executors
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
from .without_graphs import WithoutGraphs

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


def _check_options(original: str, capture: Any, repeats: int, training: bool, lr: float | None,
                   peers: bool = False, execute: bool = True) -> Capture:
    """Check the options (the run's as the magic checks them: `options.check_run`); return ``capture`` parsed (AUTO,
    CUDA or OFF)."""
    if original not in ORIGINALS:
        raise ValueError(f"unknown original: {original!r} (must be one of {list(ORIGINALS)})")
    capture = only(parse_capture(capture), Capture.AUTO, Capture.CUDA, Capture.OFF, who="compare")
    check_run(repeats, training, lr, peers, execute)
    return capture


def _check_capture(capture: Capture, cuda: bool) -> None:
    """Refuse CUDA without a GPU, or with the inputs all on the CPU (`resolve`'s message)."""
    import torch

    if capture is not Capture.CUDA:
        return
    try:
        resolve(capture, None if not torch.cuda.is_available() else "cuda" if cuda else "cpu", what="the inputs")
    except ValueError as e:
        raise CaptureUnavailableError(str(e)) from None


def _import_thunder(say: Callable[[str], None]) -> None:
    """Import thunder (4-5 s the first time, silent otherwise): say so first."""
    if "thunder" not in sys.modules:
        say("importing torch and thunder (the first time takes a few seconds)…")
    with warnings.catch_warnings():
        # NOTE: thunder warns at import about an optional executor nobody asked for
        warnings.filterwarnings("ignore", message="transformer_engine module not found")
        import thunder  # noqa: F401

        from .. import fix  # noqa: F401
        from ..diagnosis import analysis  # noqa: F401


def _run_all(eager: Any, compiled: Mapping[str, Any], plan: Any, say: Callable[[str], None],
             plain: Mapping[str, Any] | None = None) -> tuple[Any, dict[str, Outcome], Any, list[str]]:
    """Run and time eager PyTorch, then check and time each compiled run (``runs.Run``) against it, in order.

    ``plain``: per key of ``compiled``, thunder without graphs with its executors (`WithoutGraphs`), run only
    where that version differs from eager beyond the base tolerance.

    Returns:
        (eager's checked call, an `Outcome` per key of ``compiled``, the timings, notes on later failures).
    """
    say(f"running {plan.name} in eager PyTorch…")
    reference = checks.reference(eager, plan)
    timings, notes = runs.Timings(), []
    timings.add("eager", runs.time_calls(eager, plan, say, f"{plan.name} in eager PyTorch"))
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
            results[key] = checks.check_and_time(run, reference, eager_params, timings, notes, plan, say,
                                                 (plain or {}).get(key))
    return reference, results, timings, notes


def _fatal_defect(run: Any) -> Defect | None:
    """The first defect of ``run``'s traces that would kill the process if it ran (None: none, or not a thunder run).

    A segmentation fault cannot be caught: in a notebook it takes the kernel and the user's namespace with it, so
    a version the checker says would crash is not called at all.
    """
    from ..diagnosis.analysis import analyze

    if run.jfn is None or not internals.is_jitted(run.jfn):
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
        capture: ``"auto"`` (capture on CUDA, eager regions otherwise), True or ``"on"`` (capture; needs CUDA
            inputs), False or ``"off"`` (regions run eagerly), or the `thunder_nb.cudagraph.capture.Capture` they stand
            for (the Comparison keeps that `Capture`).
        executors: fusion executors to put before thunder's defaults, for both transforms, by name
            (`thunder_nb.cudagraph.executors.EXECUTOR_NAMES`: ``"torchcompile"`` fuses with inductor; its first
            call compiles, which can take tens of seconds). The Comparison records them (`Comparison.executors`).
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
    capture = _check_options(original, capture, repeats, training, lr, peers, execute)
    say = progress or (lambda message: None)
    _import_thunder(say)
    names = resolve_executors(executors)
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
                  trainable=tuple(eager.bound.trainable) if training else (), peers=bool(peers), executors=names)
    with warnings.catch_warnings():
        # NOTE: eager mode is stated in the Comparison (device, verdict); thunder's deprecation noise is not the user's
        warnings.filterwarnings("ignore", category=EagerFallbackWarning)
        warnings.filterwarnings("ignore", message=r"torch\.is_autocast_cpu_enabled")

        orig, fixed = runs.compile_both(fn, args, kwargs, original, capture, plan, say, names)
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
        # NOTE: each thunder side's numerics without its graphs: the fixed side's executors are thunder_nb.jit's
        plain = {"fixed": WithoutGraphs(fn, args, kwargs, jit_executors(names), plan),
                 "original": WithoutGraphs(fn, args, kwargs, executor_list(names), plan)}
        reference, results, timings, notes = _run_all(eager, {"fixed": fixed, **peer, "original": orig}, plan, say,
                                                      plain)
        say(f"analysing {name}…")
        return Comparison(
            original=analyze(orig.jfn, error=orig.error), fixed=analyze(fixed.jfn, error=fixed.error),
            results=results, timings=timings.medians, spread=timings.spread,
            graphs={"original": orig.runner.graphs_captured, "fixed": fixed.runner.graphs_captured},
            executed=True, eager_value=short(runs.detached(reference.value)), repeats=int(repeats),
            notes=tuple(notes), functions=functions, warmup=runs.WARMUP, threads=torch.get_num_threads(),
            lr=lr, steps=eager.steps, **common,
        )
