"""The runs of `thunder_nb.compare`, each version on its own copies of what the function reaches: eager PyTorch, both
transforms jitted (`compile_both`) and torch.compile's peer (`peer`), each called (`checked_call`, `time_calls`) with
what its calls gave kept."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import internals
from ..cudagraph.capture import Capture
from ..cudagraph.executors import executor_list
from ..diagnosis import failures
from ..diagnosis.failures import error_line
from ..diagnosis.protocols import RecordingRunner
from .outcome import PEER, PEER_MODE, CompareError, EagerError, TraceError
from .reach import Bound, bind

__all__ = ["WARMUP", "Plan", "Ran", "Run", "Timings", "compile_both", "peer", "build_traces", "eager_error",
           "checked_call", "time_calls", "params", "on_cuda", "detached"]

#: Calls made, untimed, before the timed ones.
WARMUP = 2


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


def build_traces(run: Run) -> None:
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
                 say: Callable[[str], None], executors: Sequence[str] = ()) -> tuple[Run, Run]:
    """Jit ``fn`` with the original and the fixed transform, each on its own copies, and build their traces.

    ``executors``: the fusion executors of both sides by name, as `thunder_nb.notebook.options.resolve_executors`
    resolved them (none: thunder's defaults); the fixed side takes them as `thunder_nb.jit` does, the original as
    ``thunder.jit``'s ``executors=`` (`thunder_nb.cudagraph.executors.executor_list`).

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
    fixed.jfn = jit(fixed.bound.fn, executors=executors, capture=capture)
    fixed.transform = internals.jit_transforms(fixed.jfn)[0]
    orig = Run(original, bind(fn, args, kwargs), _original_transform(original, capture))
    chosen = executor_list(executors)
    orig.jfn = thunder.jit(orig.bound.fn, transforms=[orig.transform],
                           **({"executors": chosen} if chosen is not None else {}))

    # NOTE: the torchcompile executors (`EXECUTOR_NAMES`: torchcompile, torchcompile_cat) fuse with inductor
    fusing = any(name.startswith("torchcompile") for name in executors)
    say(f"tracing {plan.name} with the fixed transform…" + (
        " (inductor compiles each fused group at the first call: seconds, tens of seconds for a model)"
        if fusing else ""))
    try:
        build_traces(fixed)
    except Exception as e:
        raise _untraceable(plan.name, fn, args, kwargs, e) from e
    say(f"tracing {plan.name} with the {original} transform…")
    try:
        build_traces(orig)
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


# --- calling ----------------------------------------------------------------------------------------


def checked_call(run: Run, plan: Plan) -> Ran:
    """The checked call of a compiled version; its failing is a finding, kept in the result."""
    try:
        value = run.call(plan.training)
    except Exception as e:  # NOTE: a failing compiled function is a finding, reported in its Outcome
        return Ran(error=e)
    ran = Ran(value=value, grads=run.bound.grads() if plan.training else {})
    if plan.training:
        run.after_step(plan.lr)
    return ran


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


def on_cuda(bound: Bound) -> bool:
    """Whether any tensor the function gets or reaches is on a CUDA device."""
    return any(t.is_cuda for t in bound.tensors())


def detached(value: Any) -> Any:
    import torch

    return value.detach() if isinstance(value, torch.Tensor) else value

