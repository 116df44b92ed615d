"""The steps of `thunder_nb.compare`: jit both transforms, then run eager PyTorch and each version on its own copies."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import internals
from ..cudagraph.capture import Capture
from ..diagnosis import failures
from ..diagnosis.failures import Failure, error_line
from ..diagnosis.protocols import RecordingRunner
from .outcome import PEER, PEER_MODE, CompareError, EagerError, Outcome, TraceError
from ..diagnosis.judge import Judgement, judge
from .reach import Bound, bind
from .values import short

__all__ = ["WARMUP", "Plan", "Ran", "Run", "Timings", "WithoutGraphs", "compile_both", "peer", "reference",
           "check_and_time", "params", "on_cuda", "detached"]

#: Calls made, untimed, before the timed ones.
WARMUP = 2
#: How value differences name eager PyTorch's value: ``result: 3, eager's 4``.
EAGER = "eager's"
#: `Timings` keys of each run's label (any other label is the original).
_TIMING_KEYS = {"fixed": "fixed", PEER: "peer"}


@dataclass(frozen=True, slots=True)
class Plan:
    """What every run does: the function's name for messages, training, SGD learning rate, timed calls, device."""

    name: str
    training: bool
    lr: float | None
    repeats: int
    cuda: bool


@dataclass(slots=True)
class Ran:
    """The checked call of a run: its value and gradients, or the error it raised."""

    value: Any = None
    grads: dict[str, Any] = field(default_factory=dict)
    error: BaseException | None = None


@dataclass(slots=True)
class Run:
    """One run: eager or a compiled version, with its own copy of what the function reaches."""

    label: str  # "eager", "fixed", "stock" or "legacy"
    bound: Bound
    transform: Any = None
    jfn: Any = None  # what is called: the jitted function (eager: the function itself)
    trace_error: BaseException | None = None
    ran: Ran | None = None
    steps: int = 0  # calls made (with training: training steps)
    mark_step: bool = False  # tell torch.compile's CUDA graph trees that a new step begins before each call

    @classmethod
    def eager(cls, fn: Any, args: tuple, kwargs: dict) -> Run:
        bound = bind(fn, args, kwargs)
        return cls("eager", bound, jfn=bound.fn)

    @property
    def runner(self) -> RecordingRunner:
        """The runner of a graph side's transform (thunder-nb's on both sides: the stock side's records too)."""
        runner = self.transform.cuda_graph_runner
        if not isinstance(runner, RecordingRunner):
            raise TypeError(f"{self.label}: its runner ({type(runner).__name__}) records nothing to read")
        return runner

    @property
    def error(self) -> BaseException | None:
        return self.trace_error or (self.ran.error if self.ran is not None else None)

    def call(self, training: bool) -> Any:
        """One call (and its backward, when training) on fresh inputs."""
        args, kwargs = self.bound.inputs()
        if self.mark_step:
            import torch

            # NOTE: reduce-overhead's CUDA graph trees reuse their output memory only once a new step is marked
            torch.compiler.cudagraph_mark_step_begin()
        out = self.jfn(*args, **kwargs)
        if training:
            out.backward()
        self.steps += 1
        return out

    def after_step(self, lr: float | None) -> None:
        """End a training step: an SGD step with ``lr``; without, drop the gradients (``zero_grad``)."""
        if lr is not None:
            self.bound.sgd_step(lr)
        else:
            self.bound.zero_grad()


# --- compiling --------------------------------------------------------------------------------------


def _original_transform(kind: str, capture: Capture) -> Any:
    from thunder.transforms.cudagraph import CUDAGraphTransform

    from ..fix import LegacyCUDAGraphTransform, ThunderNBRunner

    if kind == "legacy":
        return LegacyCUDAGraphTransform(capture=capture)
    transform = CUDAGraphTransform()
    # NOTE: thunder's own fusion and del passes, with a runner whose call path is the stock one on
    # CUDA (capture, replay) that also records graphs and, without CUDA, runs regions eagerly, so
    # the stock regions can be checked on CPU instead of failing for want of a driver
    transform.cuda_graph_runner = ThunderNBRunner(capture=capture, stock=True)
    return transform


def _trace(run: Run) -> None:
    """Build the traces of the run's jitted function for its inputs without running the computation."""
    args, kwargs = run.bound.inputs()
    internals.build_traces(run.jfn, *args, **kwargs)


def eager_error(name: str, e: BaseException) -> EagerError:
    """The function's own code raised: say so, and where."""
    where = failures.user_frame(e.__traceback__)
    at = " ({where})" if where is not None else ""
    return EagerError(f"{name} raised {error_line(e)}{at}: the function's own code fails, in eager PyTorch too", where)


def _untraceable(name: str, fn: Any, args: tuple, kwargs: dict, error: BaseException) -> CompareError:
    """Why tracing failed: the user's code raises (in eager PyTorch too), or thunder cannot trace an op."""
    try:
        Run.eager(fn, args, kwargs).call(training=False)
    except Exception as e:
        return eager_error(name, e)
    where = failures.user_frame(error.__traceback__)
    message, advice = failures.trace_failure(name, error, where)
    return TraceError(message + (f". {advice}" if advice else ""), where)


def compile_both(fn: Any, args: tuple, kwargs: dict, original: str, capture: Capture, plan: Plan,
                 say: Callable[[str], None], executors: list[Any] | None = None) -> tuple[Run, Run]:
    """Jit ``fn`` with the original and the fixed transform, each on its own copies, and build their traces.

    ``executors``: thunder's executor list for both (None: thunder's defaults).

    Returns:
        (original, fixed); the original failing to trace is kept in its ``trace_error``.

    Raises:
        EagerError: the function's own code raises (tried in eager PyTorch when tracing fails).
        TraceError: thunder cannot trace it.
    """
    import thunder

    from ..fix import jit

    # NOTE: the fixed side is what `thunder_nb.jit` makes (one autograd Function per call); the original is what
    # thunder.jit makes by default
    fixed = Run("fixed", bind(fn, args, kwargs))
    fixed.jfn = jit(fixed.bound.fn, executors=executors or (), capture=capture)
    fixed.transform = internals.jit_transforms(fixed.jfn)[0]
    orig = Run(original, bind(fn, args, kwargs), _original_transform(original, capture))
    orig.jfn = thunder.jit(orig.bound.fn, transforms=[orig.transform],
                           **({"executors": executors} if executors is not None else {}))

    fusing = any(getattr(ex, "name", "").startswith("thunder_nb_torchcompile") for ex in executors or ())
    say(f"tracing {plan.name} with the fixed transform…" + (
        " (inductor compiles each fused group at the first call: seconds, tens of seconds for a model)"
        if fusing else ""))
    try:
        _trace(fixed)
    except Exception as e:
        raise _untraceable(plan.name, fn, args, kwargs, e) from e
    say(f"tracing {plan.name} with the {original} transform…")
    try:
        _trace(orig)
    except Exception as e:
        if not internals.has_traces(orig.jfn):
            raise TraceError(f"thunder cannot trace {plan.name} with the {original} transform: {error_line(e)}") from e
        orig.trace_error = e
    return orig, fixed


def peer(fn: Any, args: tuple, kwargs: dict) -> Run:
    """``torch.compile(fn, mode="reduce-overhead")`` on its own copies: the peer a fixed run is timed against.

    It compiles at its first call; a failure then (or here) is kept in the run, as a compiled version's is.
    """
    import torch

    run = Run(PEER, bind(fn, args, kwargs), mark_step=True)
    try:
        run.jfn = torch.compile(run.bound.fn, mode=PEER_MODE)
    except Exception as e:  # NOTE: torch.compile failing is a finding about the peer, reported in its Outcome
        run.trace_error = e
    return run


class WithoutGraphs:
    """Thunder without CUDA graphs, with the executors of the side it stands beside, on its own copies: the yardstick
    of how far thunder's own numerics take that side from eager (the one judge's rule 4,
    `thunder_nb.diagnosis.judge`). It runs only when the side differs from eager beyond the base tolerance, and then
    as many steps as the side took; where it fails, or draws random numbers, the base tolerance alone decides."""

    def __init__(self, fn: Any, args: tuple, kwargs: dict, executors: list[Any] | None, plan: Plan):
        self._fn, self._args, self._kwargs, self._executors, self._plan = fn, args, kwargs, executors, plan
        self._run: Run | None = None
        self._failed = False

    def checked(self) -> Ran | None:
        """Its checked call (value and gradients, as `reference`'s), made on first use; None where it failed."""
        if self._run is None and not self._failed:
            import thunder

            run = Run("thunder", bind(self._fn, self._args, self._kwargs))
            try:
                run.jfn = thunder.jit(run.bound.fn, **({"executors": self._executors}
                                                       if self._executors is not None else {}))
                _trace(run)
                self._failed = _draws_random(run.jfn)
            except Exception:  # NOTE: without a yardstick the base tolerance decides; the side's own run says the rest
                self._failed = True
            if not self._failed:
                run.ran = _check(run, self._plan)
                self._failed = run.ran.error is not None
            self._run = run
        return None if self._failed else self._run.ran

    def params_after(self, steps: int) -> dict[str, Any] | None:
        """Its trainable tensors after ``steps`` training steps (each followed by its SGD step), or None."""
        if self.checked() is None:
            return None
        run = self._run
        try:
            while run.steps < steps:
                run.call(self._plan.training)
                run.after_step(self._plan.lr)
        except Exception:  # NOTE: as in `checked`: no yardstick
            self._failed = True
            return None
        return params(run)


def _draws_random(jfn: Any) -> bool:
    """Whether ``jfn``'s last traces run an op that draws random numbers (its draws are not eager's, nor another
    run's: no yardstick)."""
    import thunder

    from ..diagnosis.ops import CAPTURE_DEPENDENT, RANDOM_NAMES

    def names(bsyms: Any) -> Any:
        for b in bsyms:
            yield b.sym.name
            yield from names(b.subsymbols)

    traces = [*thunder.last_traces(jfn)[-1:], *(thunder.last_backward_traces(jfn) or [])[-1:]]
    return any(n in RANDOM_NAMES or n in CAPTURE_DEPENDENT for t in traces for n in names(t.bound_symbols))


# --- running ----------------------------------------------------------------------------------------


def reference(eager: Run, plan: Plan) -> Ran:
    """Run eager PyTorch once (and its backward, when training): the values both versions are checked against.

    Raises:
        EagerError: the function raises.
        CompareError: training, and the result is not a scalar tensor that requires grad.
    """
    import torch

    try:
        value = eager.call(training=False)
    except Exception as e:
        raise eager_error(plan.name, e) from e
    if plan.training:
        if not (isinstance(value, torch.Tensor) and value.numel() == 1 and value.requires_grad):
            got = f"a {type(value).__name__}" if not isinstance(value, torch.Tensor) else (
                f"a tensor of shape {tuple(value.shape)}" + ("" if value.requires_grad else " that does not require grad")
            )
            raise CompareError(
                f"training needs {plan.name} to return a scalar tensor that requires grad; it returned {got}"
            )
        value.backward()
    ran = Ran(value=value, grads=eager.bound.grads() if plan.training else {})
    if plan.training:
        eager.after_step(plan.lr)
    return ran


def _check(run: Run, plan: Plan) -> Ran:
    """The checked call of a compiled version; its failing is a finding, kept in the result."""
    try:
        value = run.call(plan.training)
    except Exception as e:  # NOTE: a failing compiled function is a finding, reported in its Outcome
        return Ran(error=e)
    ran = Ran(value=value, grads=run.bound.grads() if plan.training else {})
    if plan.training:
        run.after_step(plan.lr)
    return ran


def _judged(actual: Any, expected: Any, plain: Any, *, label: str = "result") -> Judgement:
    """The one judge (`thunder_nb.diagnosis.judge.judge`) against eager's values, first at the base tolerance, then,
    where that says they differ and ``plain()`` gives thunder-without-graphs' values, within their own difference."""
    first = judge(actual, expected, label=label, reference=EAGER)
    if first.equal or plain is None:
        return first
    yardstick = plain()
    if yardstick is None:
        return first
    return judge(actual, expected, without_graphs=yardstick, label=label, reference=EAGER)


def _thunder_note(*judgements: Judgement | None) -> float | None:
    """Thunder-without-graphs' own largest difference from eager, where a verdict leaned on it (else None)."""
    leaned = [j.without_graphs_error for j in judgements if j is not None and j.widened]
    return max((e for e in leaned if e is not None), default=None) if leaned else None


def _outcome(run: Run, eager: Ran, training: bool, plain: WithoutGraphs | None = None) -> Outcome:
    ran = run.ran
    eager_regions = run.transform is not None and any(
        run.runner.region_stats(name).eager_calls for name in run.runner.python_callables
    )
    if ran.error is not None:
        return Outcome(False, Failure.of(ran.error, "run"), eager_regions=eager_regions)
    value = detached(ran.value)

    def thunder_value() -> Any:
        ref = plain.checked()
        return None if ref is None else detached(ref.value)

    def thunder_grads() -> Any:
        ref = plain.checked()
        return None if ref is None else ref.grads

    result = _judged(value, detached(eager.value), thunder_value if plain is not None else None)
    grads = (_judged(ran.grads, eager.grads, thunder_grads if plain is not None else None, label="grad")
             if training else None)
    return Outcome(True, value=short(value), matches=result.equal, max_abs_error=result.max_abs_error,
                   mismatch=result.difference or (grads.difference if grads else None),
                   grads_match=grads.equal if grads else None,
                   grads_max_abs_error=grads.max_abs_error if grads else None,
                   eager_regions=eager_regions, thunder_error=_thunder_note(result, grads))


def time_calls(run: Run, plan: Plan, say: Callable[[str], None] | None = None, what: str = "") -> list[float]:
    """Microseconds of ``plan.repeats`` calls (and backwards), after `WARMUP` untimed ones; each a training step.
    ``say``: told the count of calls timed so far (``timing f with the fixed transform: 120 of 1000 calls…``), at
    most every half second, between calls."""
    import torch

    samples = []
    said = time.perf_counter()
    for i in range(WARMUP + plan.repeats):
        if say is not None and i > WARMUP and time.perf_counter() - said > 0.5:
            say(f"timing {what}: {i - WARMUP} of {plan.repeats} calls…")
            said = time.perf_counter()
        if plan.cuda:
            torch.cuda.synchronize()
        start = time.perf_counter_ns()
        run.call(plan.training)
        if plan.cuda:
            torch.cuda.synchronize()
        elapsed = (time.perf_counter_ns() - start) / 1000
        if plan.training:
            run.after_step(plan.lr)
        if i >= WARMUP:
            samples.append(elapsed)
    return samples


@dataclass(slots=True)
class Timings:
    """Median and 10th/90th percentile of each run's timed calls, in microseconds."""

    medians: dict[str, float] = field(default_factory=dict)
    spread: dict[str, tuple[float, float]] = field(default_factory=dict)

    def add(self, key: str, samples: list[float]) -> None:
        self.medians[key] = float(statistics.median(samples))
        if len(samples) < 2:
            self.spread[key] = (samples[0], samples[0])
        else:
            deciles = statistics.quantiles(samples, n=10, method="inclusive")
            # NOTE: interpolated deciles can miss the median by a rounding error (9.374 against 9.373999...)
            median = self.medians[key]
            self.spread[key] = (min(deciles[0], median), max(deciles[-1], median))


def params(run: Run) -> dict[str, Any]:
    """A snapshot of the run's trainable tensors, by name."""
    return {name: t.detach().clone() for name, t in run.bound.trainable.items()}


def check_and_time(run: Run, eager: Ran, eager_params: dict | None, timings: Timings, notes: list[str],
                   plan: Plan, say: Callable[[str], None], plain: WithoutGraphs | None = None) -> Outcome:
    """Check one compiled version against eager, time it, and (with ``lr``) compare its parameters after as many steps.

    ``plain``: thunder without graphs with this version's executors, asked only where the version differs from eager
    beyond the base tolerance (the one judge's rule 4)."""
    from .. import internals
    from ..fix import recover_from_failed_capture

    thunder_run = run.transform is not None
    what = f"the {run.label} transform" if thunder_run else run.label
    say(f"running {plan.name} with {what}…" + ("" if thunder_run else " (its first call compiles)"))
    stream = internals.current_stream() if plan.cuda else None  # NOTE: a failed capture leaves its stream current
    run.ran = _check(run, plan)
    if run.ran.error is not None and plan.cuda:
        recover_from_failed_capture(stream)
    outcome = _outcome(run, eager, plan.training, plain)
    if not outcome.ran:
        return outcome
    say(f"timing {plan.name} with {what} ({plan.repeats} calls)…")
    try:
        timings.add(_TIMING_KEYS.get(run.label, "original"), time_calls(run, plan, say, f"{plan.name} with {what}"))
    except Exception as e:  # NOTE: a later call failing is a finding too, not a crash of compare
        if plan.cuda:
            recover_from_failed_capture(stream)
        notes.append(f"{run.label}: a later call failed while timing: {error_line(e)}")
        return outcome
    if eager_params is None:
        return outcome

    def thunder_params() -> Any:
        found = plain.params_after(run.steps)
        return found

    checked = _judged(params(run), eager_params, thunder_params if plain is not None else None, label="parameter")
    if checked.difference:
        notes.append(f"{run.label}: after {run.steps} SGD steps, {checked.difference}")
    leaned = _thunder_note(checked)
    return dataclasses.replace(outcome, params_match=checked.equal, params_max_abs_error=checked.max_abs_error,
                               thunder_error=max((e for e in (outcome.thunder_error, leaned) if e is not None),
                                                 default=None))


def on_cuda(bound: Bound) -> bool:
    """Whether any tensor the function gets or reaches is on a CUDA device."""
    return any(t.is_cuda for t in bound.tensors())


def detached(value: Any) -> Any:
    import torch

    return value.detach() if isinstance(value, torch.Tensor) else value
