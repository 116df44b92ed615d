"""Compile a function with the original and the fixed CUDA-graph transform, check both against eager PyTorch.

`compare` is the Python API behind ``%%thunder_cudagraph``: it jits the function twice (thunder's
stock `CUDAGraphTransform`, or the July 2024 `LegacyCUDAGraphTransform`, against
`FixedCUDAGraphTransform`), builds both `Report`s, runs eager PyTorch on cloned inputs, compares
values (and gradients with ``training=True``), times the three and counts captured CUDA graphs. The
original failing is a finding kept in the `Comparison`, never an exception.
"""

from __future__ import annotations

import copy
import html
import math
import statistics
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .model import Defect, Report

__all__ = [
    "compare",
    "Comparison",
    "Outcome",
    "CompareError",
    "TraceError",
    "CaptureUnavailableError",
    "EagerError",
    "ORIGINALS",
    "CAPTURE_MODES",
    "EAGER_DEVICE",
]

#: The transforms a fixed run can be compared against.
ORIGINALS = ("stock", "legacy")
#: Accepted values of ``capture``.
CAPTURE_MODES = ("auto", True, False)
#: `Comparison.device` when no input is on a CUDA device.
EAGER_DEVICE = "cpu (eager mode: no CUDA graphs)"

#: Float tolerance for Python numbers (float32's, as torch.testing uses for f32 tensors).
_RTOL, _ATOL = 1.3e-6, 1e-5
_VALUE_CHARS = 120


class CompareError(Exception):
    """`compare` cannot do what was asked (the user must act: fix the function, inputs or options)."""


class TraceError(CompareError):
    """thunder cannot trace the function (so neither transform has anything to work on)."""


class CaptureUnavailableError(CompareError):
    """``capture=True`` was asked for, but there is no CUDA device (or the inputs are not on it)."""


class EagerError(CompareError):
    """The function fails in eager PyTorch, so there is no reference to check against."""


# ---------------------------------------------------------------------------------------------------
# The result objects


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one compiled version (original or fixed) did against eager PyTorch."""

    ran: bool  # the call (and the backward, when training) returned
    error: str | None = None  # "UnboundLocalError: ...", when tracing or the call failed
    stage: str | None = None  # where it failed: "trace" or "run"
    value: str = ""  # a one-line repr of the result
    matches: bool | None = None  # the result equals eager's (None: not run)
    max_abs_error: float | None = None
    mismatch: str | None = None  # the first difference, when it does not match
    grads_match: bool | None = None  # None unless training
    grads_max_abs_error: float | None = None
    eager_regions: bool = False  # regions ran as plain Python (no graph captured for them)

    @property
    def ok(self) -> bool:
        """Ran, and its value (and gradients, when checked) match eager."""
        return self.ran and bool(self.matches) and self.grads_match is not False


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

    @property
    def on_cuda(self) -> bool:
        """True when the inputs are on a CUDA device."""
        return self.device == "cuda"

    def verdict(self) -> str:
        """Return the one-line verdict, e.g. ``original (stock): capture fails, item inside CUDAGraph1; fixed: ...``."""
        return "; ".join(p for p in (self._original_phrase(), self._fixed_phrase(), self._mode_phrase()) if p)

    def _original_phrase(self) -> str:
        out = self.results["original"]
        parts: list[str] = []
        if out.error:
            parts.append(_failure_phrase(out))
        errors = _by_priority(d for d in self.original.defects if d.severity == "error")
        if errors:
            phrase = _defect_phrase(self.original, errors[0])
            if len(errors) > 1:
                phrase += f" (+{len(errors) - 1} more)"
            if errors[0].rule == "host-sync-in-region" and not out.error and self.graphs.get("original", 0) == 0:
                phrase += " (capture would fail)"
            parts.append(phrase)
        elif self.original.defects:
            parts.append(_plural(len(self.original.defects), "warning"))
        if not out.error:
            parts.append(_run_phrase(out, self.training) if self.executed else "not run")
        return f"original ({self.original_kind}): " + ", ".join(parts)

    def _fixed_phrase(self) -> str:
        rep, out = self.fixed, self.results["fixed"]
        regions = sum(len(t.regions) for t in rep.traces)
        islands = sum(len(t.user_islands) for t in rep.traces)
        parts = [_plural(regions, "region"), _plural(islands, "island")]
        errors = _by_priority(d for d in rep.defects if d.severity == "error")
        if errors:
            parts.append(_plural(len(errors), "defect") + ": " + _defect_phrase(rep, errors[0]))
        if out.error:
            parts.append(_failure_phrase(out))
        elif not self.executed:
            parts.append("not run")
        else:
            parts.append(_run_phrase(out, self.training))
            eager_us, fixed_us = self.timings.get("eager"), self.timings.get("fixed")
            # NOTE: a speed-up is only claimed for captured graphs; eager-mode timings say nothing about them
            if self.graphs.get("fixed", 0) > 0 and eager_us and fixed_us:
                ratio = eager_us / fixed_us
                parts.append(f"{ratio:.1f}x faster than eager" if ratio >= 1 else f"{1 / ratio:.1f}x slower than eager")
        return "fixed: " + ", ".join(parts)

    def _mode_phrase(self) -> str:
        if not self.executed:
            return ""
        if not self.on_cuda:
            why = "inputs on the CPU" if self.gpu else "no GPU"
            return f"eager mode ({why}): no CUDA graph captured"
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
        rows.append(("value", f"eager {self.eager_value}; fixed {fixed.value or '-'}"
                     + (f"; original {orig.value}" if orig.ran else "")))
        for label, out in (("fixed", fixed), (f"original ({self.original_kind})", orig)):
            rows.append((f"check {label}", _check_text(out, self.training)))
        order = [("eager", "eager"), ("fixed", "fixed"), ("original", f"original ({self.original_kind})")]
        times = [f"{name} {_us(self.timings[key])}" for key, name in order if key in self.timings]
        rows.append(("timings", (", ".join(times) + f" (median of {self.repeats})") if times else "-"))
        graphs = f"fixed {self.graphs.get('fixed', 0)}, original {self.graphs.get('original', 0)}"
        if not self.on_cuda:
            graphs += " (eager mode: inputs on the CPU)" if self.gpu else " (eager mode: no GPU)"
        elif self.capture is False:
            graphs += " (capture off)"
        rows.append(("graphs captured", graphs))
        rows += [("note", n) for n in self.notes]
        return rows

    def run_text(self) -> str:
        """Return the run section as text."""
        rows = self.run_rows()
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

    def run_html(self) -> str:
        """Return the run section as an HTML table."""
        body = "".join(
            f"<tr><th style=\"text-align:left;padding-right:1em\">{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
            for k, v in self.run_rows()
        )
        return f'<table class="tnb-run">{body}</table>'

    def verdict_html(self) -> str:
        """Return the verdict as one HTML line."""
        bad = not self.results["fixed"].ok if self.executed else bool(self.fixed.defects)
        color = "#e03131" if bad else "#2b8a3e"
        return f'<div class="tnb-verdict" style="font-weight:600;color:{color}">{html.escape(self.verdict())}</div>'

    def to_text(self) -> str:
        """Return the whole comparison as text: verdict, both reports, the run section."""
        from . import render

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
        from . import render

        return self.verdict_html() + render.side_by_side_html(self.original, self.fixed) + self.run_html()

    def _repr_mimebundle_(self, include=None, exclude=None):
        makers = {"text/plain": self.to_text, "text/html": self.to_html}
        wanted = [m for m in makers if (not include or m in include) and (not exclude or m not in exclude)]
        return {m: makers[m]() for m in wanted}


# ---------------------------------------------------------------------------------------------------
# Phrases


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _us(x: float) -> str:
    return f"{x:.0f} us" if x >= 100 else f"{x:.1f} us"


def _failure_phrase(out: Outcome) -> str:
    err = out.error or ""
    kind = err.split(":", 1)[0]
    if out.stage == "run" and "captur" in err.lower():
        return "capture fails"
    if out.stage == "trace":
        return f"compile fails ({kind})"
    return f"crashes ({kind})"


def _run_phrase(out: Outcome, training: bool) -> str:
    if not out.ran:
        return "not run"
    if out.matches:
        text = "matches eager"
    else:
        err = f" (max abs error {out.max_abs_error:.3g})" if out.max_abs_error is not None else ""
        text = f"DIFFERS from eager{err}"
    if training:
        text += ", grads match" if out.grads_match else ", grads DIFFER"
    return text


def _check_text(out: Outcome, training: bool) -> str:
    if out.error:
        return f"fails at {out.stage}: {out.error}"
    if not out.ran:
        return "not run"
    text = _run_phrase(out, training)
    if out.max_abs_error is not None:
        text += f" (max abs error {out.max_abs_error:.3g}"
        if training and out.grads_max_abs_error is not None:
            text += f", grads {out.grads_max_abs_error:.3g}"
        text += ")"
    if out.mismatch:
        text += f": {out.mismatch}"
    return text


#: Which error a verdict names first: the one that breaks the run soonest, then the rest.
_PRIORITY = ("host-sync-in-region", "cpu-op-in-region", "use-after-del", "region-deletes-output")


def _by_priority(defects: Iterable[Defect]) -> list[Defect]:
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


def _defect_phrase(report: Report, d: Defect) -> str:
    """A few words for a defect: ``item inside CUDAGraph1``, ``t9 used after del in CUDAGraph1``."""
    where = d.region or "the top level"
    if d.rule in ("host-sync-in-region", "cpu-op-in-region"):
        op = _op_of(report, d)
        what = op.callee.rsplit(".", 1)[-1] if op is not None else (d.value or "an op")
        return f"{what} inside {where}"
    if d.rule == "use-after-del":
        return f"{d.value} used after del in {where}"
    if d.rule == "region-deletes-output":
        return f"{where} deletes its own output {d.value}"
    if d.rule == "region-deletes-outside-value":
        return f"{where} deletes {d.value} from outside it"
    if d.rule == "scalar-region-input":
        return f"number {d.value} into {where} (a graph per value)"
    return f"{d.rule} ({d.value or where})"


# ---------------------------------------------------------------------------------------------------
# Inputs, values and gradients


def _map_tensors(x: Any, fn: Callable[[Any], Any]) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # namedtuple
        return type(x)(*(_map_tensors(e, fn) for e in x))
    if isinstance(x, (list, tuple)):
        return type(x)(_map_tensors(e, fn) for e in x)
    if isinstance(x, dict):
        return {k: _map_tensors(v, fn) for k, v in x.items()}
    return x


def _clone_tensor(t: Any) -> Any:
    import torch

    c = t.detach().clone()
    if isinstance(t, torch.nn.Parameter):
        return torch.nn.Parameter(c, requires_grad=t.requires_grad)
    return c.requires_grad_(t.requires_grad)


def _leaves(x: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(x, (list, tuple)):
        yield path or "()", (type(x).__name__, len(x))
        for i, e in enumerate(x):
            yield from _leaves(e, f"{path}[{i}]")
    elif isinstance(x, dict):
        yield path or "{}", ("dict", tuple(x))
        for k, v in x.items():
            yield from _leaves(v, f"{path}[{k!r}]")
    else:
        yield path or "result", x


def _compare_values(actual: Any, expected: Any) -> tuple[bool, float | None, str | None]:
    """Compare nested results like ``torch.testing.assert_close``; return (matches, max abs error, first difference)."""
    import torch

    a_leaves, e_leaves = list(_leaves(actual)), list(_leaves(expected))
    if len(a_leaves) != len(e_leaves):
        return False, None, f"structure differs: {len(a_leaves)} parts against eager's {len(e_leaves)}"
    ok, worst, why = True, None, None

    def fail(msg: str) -> None:
        nonlocal ok, why
        ok = False
        why = why or msg

    for (path, a), (_, b) in zip(a_leaves, e_leaves):
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
                fail(f"{path}: {type(a).__name__} against eager's {type(b).__name__}")
                continue
            if a.shape != b.shape or a.dtype != b.dtype:
                fail(f"{path}: {a.dtype} {tuple(a.shape)} against eager's {b.dtype} {tuple(b.shape)}")
                continue
            a_, b_ = a.detach().cpu(), b.detach().cpu()
            if a_.numel():
                err = float((a_.to(torch.complex128 if a_.is_complex() else torch.float64)
                             - b_.to(torch.complex128 if b_.is_complex() else torch.float64)).abs().nan_to_num(0.0).max())
                worst = err if worst is None else max(worst, err)
            try:
                torch.testing.assert_close(a_, b_, equal_nan=True)
            except AssertionError as e:
                fail(f"{path}: " + str(e).strip().splitlines()[0])
        elif isinstance(a, (bool, int, float, complex)) and isinstance(b, (bool, int, float, complex)):
            if type(a) is not type(b) and not (isinstance(a, float) and isinstance(b, float)):
                fail(f"{path}: {type(a).__name__} {a!r} against eager's {type(b).__name__} {b!r}")
                continue
            err = abs(a - b) if not (_isnan(a) and _isnan(b)) else 0.0
            if not math.isnan(err):
                worst = err if worst is None else max(worst, err)
            close = (a == b) if isinstance(a, (bool, int)) else (
                (_isnan(a) and _isnan(b)) or _isclose(a, b)
            )
            if not close:
                fail(f"{path}: {a!r} against eager's {b!r}")
        else:
            try:
                same = bool(a == b)
            except Exception:
                same = False
            if not same:
                fail(f"{path}: {a!r} against eager's {b!r}"[:200])
    return ok, worst, why


def _isnan(x: Any) -> bool:
    return isinstance(x, (float, complex)) and x != x


def _isclose(a: Any, b: Any) -> bool:
    return abs(a - b) <= _ATOL + _RTOL * abs(b)


def _short(value: Any) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        dt = str(value.dtype).replace("torch.", "")
        head = f"tensor {dt}{list(value.shape)} on {value.device}"
        if value.numel() <= 6:
            nums = ", ".join(f"{float(v):.4g}" for v in value.detach().cpu().reshape(-1).tolist())
            head += f" [{nums}]"
        return head
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_short(v) for v in value)
        text = f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    else:
        text = repr(value).replace("\n", " ")
    return text if len(text) <= _VALUE_CHARS else text[: _VALUE_CHARS - 1] + "…"


# ---------------------------------------------------------------------------------------------------
# Running


@dataclass(slots=True)
class _Inputs:
    fn: Any  # the callable to run (a module is copied per run)
    args: tuple
    kwargs: dict


@dataclass(slots=True)
class _Ran:
    value: Any = None
    grads: dict[str, Any] = field(default_factory=dict)
    error: BaseException | None = None


def _fresh(fn: Any, args: tuple, kwargs: dict) -> _Inputs:
    import torch

    fn_copy = copy.deepcopy(fn) if isinstance(fn, torch.nn.Module) else fn
    return _Inputs(fn_copy, _map_tensors(args, _clone_tensor), _map_tensors(kwargs, _clone_tensor))


def _grad_leaves(inp: _Inputs) -> dict[str, Any]:
    """Every requires_grad input (and module parameter), by a stable name."""
    import torch

    out: dict[str, Any] = {}
    for path, leaf in _leaves((inp.args, inp.kwargs)):
        if isinstance(leaf, torch.Tensor) and leaf.requires_grad:
            out[f"input{path}"] = leaf
    if isinstance(inp.fn, torch.nn.Module):
        for name, p in inp.fn.named_parameters():
            if p.requires_grad:
                out[f"parameter {name}"] = p
    return out


def _call(callable_: Callable[..., Any], inp: _Inputs, training: bool) -> Any:
    out = callable_(*inp.args, **inp.kwargs)
    if training:
        out.backward()
    return out


def _run(callable_: Callable[..., Any], inp: _Inputs, training: bool) -> _Ran:
    try:
        value = _call(callable_, inp, training)
    except Exception as e:  # NOTE: a failing compiled function is a finding, reported in its Outcome
        return _Ran(error=e)
    grads = {k: t.grad for k, t in _grad_leaves(inp).items()} if training else {}
    return _Ran(value=value, grads=grads)


def _check_training_result(name: str, value: Any) -> None:
    import torch

    if not (isinstance(value, torch.Tensor) and value.numel() == 1 and value.requires_grad):
        got = f"a {type(value).__name__}" if not isinstance(value, torch.Tensor) else (
            f"a tensor of shape {tuple(value.shape)}" + ("" if value.requires_grad else " that does not require grad")
        )
        raise CompareError(f"training needs {name} to return a scalar tensor that requires grad; it returned {got}")


def _outcome(ran: _Ran, eager: _Ran, training: bool, runner: Any) -> Outcome:
    eager_regions = any(runner.region_stats(name).eager_calls for name in runner.python_callables)
    if ran.error is not None:
        return Outcome(False, _format_error(ran.error), "run", eager_regions=eager_regions)
    import torch

    value = ran.value.detach() if isinstance(ran.value, torch.Tensor) else ran.value
    matches, err, why = _compare_values(value, eager.value.detach() if isinstance(eager.value, torch.Tensor) else eager.value)
    g_ok, g_err = None, None
    if training:
        g_ok, g_err, g_why = _compare_values(ran.grads, eager.grads)
        why = why or (f"gradient {g_why}" if g_why else None)
    return Outcome(True, None, None, _short(value), matches, err, why, g_ok, g_err, eager_regions)


def _format_error(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _time_us(callable_: Callable[..., Any], make: Callable[[], _Inputs], training: bool, repeats: int, cuda: bool) -> float:
    import torch

    samples = []
    for _ in range(repeats):
        inp = make()
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter_ns()
        _call(callable_ if callable_ is not None else inp.fn, inp, training)
        if cuda:
            torch.cuda.synchronize()
        samples.append((time.perf_counter_ns() - start) / 1000)
    return float(statistics.median(samples))


def _recover_from_failed_capture() -> None:
    from .fix import recover_from_failed_capture

    recover_from_failed_capture()


def _on_cuda(fn: Any, args: tuple, kwargs: dict) -> bool:
    import torch

    tensors = [leaf for _, leaf in _leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)]
    if isinstance(fn, torch.nn.Module):
        tensors += list(fn.parameters()) + list(fn.buffers())
    return any(t.is_cuda for t in tensors)


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


# ---------------------------------------------------------------------------------------------------
# Compiling


def _original_transform(kind: str, capture: bool | str) -> Any:
    from thunder.transforms.cudagraph import CUDAGraphTransform

    from .fix import LegacyCUDAGraphTransform, ThunderNBRunner

    if kind == "legacy":
        return LegacyCUDAGraphTransform(capture=capture)
    transform = CUDAGraphTransform()
    # NOTE: thunder's own fusion and del passes, with a runner whose call path is the stock one on
    # CUDA (capture, replay) that also records graphs and, without CUDA, runs regions eagerly, so
    # the stock regions can be checked on CPU instead of failing for want of a driver
    transform.cuda_graph_runner = ThunderNBRunner(capture=capture, stock=True)
    return transform


def _trace(jfn: Any, inp: _Inputs) -> None:
    """Build the traces of ``jfn`` for these inputs without running the computation."""
    import thunder

    thunder.compile_data(jfn)._get_computation_and_inputs(*inp.args, **inp.kwargs)


def _traced(jfn: Any) -> bool:
    import thunder

    cs = thunder.compile_stats(jfn)
    return cs is not None and bool(cs.last_traces)


def _raise_trace_error(name: str, inp: _Inputs, error: BaseException) -> None:
    """Raise `TraceError` when plain thunder cannot trace ``fn`` either; else re-raise (a transform bug)."""
    import thunder

    try:
        _trace(thunder.jit(inp.fn), inp)
    except Exception as plain:
        raise TraceError(f"thunder cannot trace {name}: {_format_error(plain)}") from plain
    raise error


@dataclass(slots=True)
class _Side:
    """One compiled version: its transform, jitted function, own inputs, and how it went."""

    transform: Any
    jfn: Any
    inputs: _Inputs
    trace_error: BaseException | None = None
    ran: _Ran | None = None

    @property
    def runner(self) -> Any:
        return self.transform.cuda_graph_runner

    @property
    def error(self) -> BaseException | None:
        return self.trace_error or (self.ran.error if self.ran is not None else None)


def _check_options(original: str, capture: Any, repeats: int) -> None:
    if original not in ORIGINALS:
        raise ValueError(f"unknown original: {original!r} (must be one of {list(ORIGINALS)})")
    if not (capture is True or capture is False or capture == "auto"):
        raise ValueError(f"unknown capture: {capture!r} (must be one of {list(CAPTURE_MODES)})")
    if int(repeats) < 1:
        raise ValueError(f"repeats must be at least 1, not {repeats!r}")


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


def _compile(fn: Any, name: str, make: Callable[[], _Inputs], original: str, capture: Any,
             say: Callable[[str], None]) -> tuple[_Side, _Side]:
    """Jit ``fn`` with both transforms and build their traces; the original failing to compile is kept."""
    import thunder

    from .fix import FixedCUDAGraphTransform

    fixed = _Side(FixedCUDAGraphTransform(capture=capture), None, make())
    orig = _Side(_original_transform(original, capture), None, make())
    fixed.jfn = thunder.jit(fixed.inputs.fn, transforms=[fixed.transform])
    orig.jfn = thunder.jit(orig.inputs.fn, transforms=[orig.transform])

    say(f"tracing {name} with the fixed transform…")
    try:
        _trace(fixed.jfn, fixed.inputs)
    except Exception as e:
        _raise_trace_error(name, make(), e)
    say(f"tracing {name} with the {original} transform…")
    try:
        _trace(orig.jfn, orig.inputs)
    except Exception as e:
        if not _traced(orig.jfn):
            raise TraceError(f"thunder cannot trace {name} with the {original} transform: {_format_error(e)}") from e
        orig.trace_error = e
    return orig, fixed


def _reference(make: Callable[[], _Inputs], name: str, training: bool) -> _Ran:
    """Run eager PyTorch (and its backward, when training): the values both versions are checked against."""
    inputs = make()
    eager = _run(inputs.fn, inputs, training=False)
    if eager.error is not None:
        raise EagerError(f"{name} fails in eager PyTorch: {_format_error(eager.error)}") from eager.error
    if training:
        _check_training_result(name, eager.value)
        eager.value.backward()
        eager.grads = {k: t.grad for k, t in _grad_leaves(inputs).items()}
    return eager


def compare(
    fn: Callable[..., Any],
    args: tuple | list = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    original: str = "stock",
    training: bool = False,
    repeats: int = 20,
    execute: bool = True,
    capture: bool | str = "auto",
    progress: Callable[[str], None] | None = None,
) -> Comparison:
    """Compile ``fn`` with the original and the fixed CUDA-graph transform, run both and check them against eager.

    Each run gets its own clones of the inputs (``detach().clone().requires_grad_(...)``; a module
    is deep-copied), so runs never see each other's results or gradients. With
    ``original="stock"``, thunder's fusion and del passes are used as they are; its runner is
    replaced by one that captures the same way on CUDA, records each graph and, without CUDA inputs
    (or with ``capture=False``), runs regions eagerly.

    Args:
        fn: a function (or ``torch.nn.Module``) that thunder can trace.
        args, kwargs: its inputs.
        original: ``"stock"`` (thunder's `CUDAGraphTransform`) or ``"legacy"`` (`LegacyCUDAGraphTransform`).
        training: call ``.backward()`` on the scalar result and compare the gradients of every
            requires_grad input (and module parameter) too.
        repeats: calls timed per version (median reported).
        execute: False builds and analyses the traces only (nothing runs, nothing is timed).
        capture: ``"auto"`` (capture on CUDA, eager regions otherwise), True (capture; needs CUDA
            inputs), False (regions run eagerly).
        progress: called with a short status line ("tracing…", "running…") as work proceeds.

    Returns:
        A `Comparison`; the original failing (tracing or running) is recorded in it, not raised.

    Raises:
        TraceError: thunder cannot trace ``fn`` with these inputs.
        CaptureUnavailableError: ``capture=True`` without a CUDA device or without CUDA inputs.
        EagerError: ``fn`` fails in eager PyTorch.
        CompareError: ``training=True`` without an input that requires grad, or without a scalar result.
        ValueError: an option has a value outside the documented ones.
    """
    import torch

    with warnings.catch_warnings():
        # NOTE: thunder warns at import about an optional executor nobody asked for
        warnings.filterwarnings("ignore", message="transformer_engine module not found")
        from .analysis import analyze
        from .fix import EagerFallbackWarning

    _check_options(original, capture, repeats)
    args, kwargs, name = tuple(args), dict(kwargs or {}), _name(fn)
    cuda = _on_cuda(fn, args, kwargs)
    _check_capture(capture, cuda)
    if training and not _grad_leaves(_Inputs(fn, args, kwargs)):
        raise CompareError(f"training needs an input of {name} that requires grad (e.g. w.requires_grad_()); none does")
    say = progress or (lambda message: None)

    def make() -> _Inputs:
        return _fresh(fn, args, kwargs)

    common = dict(
        function=name,
        original_kind=original,
        device="cuda" if cuda else EAGER_DEVICE,
        gpu=torch.cuda.is_available(),
        capture=capture,
        training=training,
    )
    with warnings.catch_warnings():
        # NOTE: eager mode is stated in the Comparison (device, verdict); thunder's deprecation noise is not the user's
        warnings.filterwarnings("ignore", category=EagerFallbackWarning)
        warnings.filterwarnings("ignore", message=r"torch\.is_autocast_cpu_enabled")

        orig, fixed = _compile(fn, name, make, original, capture, say)
        functions = {"original": orig.jfn, "fixed": fixed.jfn}
        orig_failed = Outcome(False, _format_error(orig.trace_error), "trace") if orig.trace_error else None
        if not execute:
            return Comparison(
                original=analyze(orig.jfn, error=orig.trace_error),
                fixed=analyze(fixed.jfn),
                results={"original": orig_failed or Outcome(False), "fixed": Outcome(False)},
                timings={},
                graphs={"original": 0, "fixed": 0},
                executed=False,
                functions=functions,
                **common,
            )

        say(f"running {name} in eager PyTorch…")
        eager = _reference(make, name, training)
        timings = {"eager": _time_us(None, make, training, repeats, cuda)}
        results: dict[str, Outcome] = {}
        notes: list[str] = []
        # NOTE: the original runs last: a capture that fails must not disturb the fixed run's device state
        for key, side, label in (("fixed", fixed, "fixed"), ("original", orig, original)):
            if side.trace_error is not None:
                results[key] = orig_failed
                continue
            say(f"running {name} with the {label} transform…")
            side.ran = _run(side.jfn, side.inputs, training)
            if side.ran.error is not None and cuda:
                _recover_from_failed_capture()
            results[key] = _outcome(side.ran, eager, training, side.runner)
            if results[key].ran:
                say(f"timing {name} with the {label} transform ({repeats} calls)…")
                try:
                    timings[key] = _time_us(side.jfn, _reuse(side.inputs, make), training, repeats, cuda)
                except Exception as e:  # NOTE: a later call failing is a finding too, not a crash of compare
                    if cuda:
                        _recover_from_failed_capture()
                    notes.append(f"{label}: a later call failed while timing: {_format_error(e)}")

        say(f"analysing {name}…")
        return Comparison(
            original=analyze(orig.jfn, error=orig.error),
            fixed=analyze(fixed.jfn, error=fixed.error),
            results=results,
            timings=timings,
            graphs={"original": orig.runner.graphs_captured, "fixed": fixed.runner.graphs_captured},
            executed=True,
            eager_value=_short(eager.value.detach() if isinstance(eager.value, torch.Tensor) else eager.value),
            repeats=int(repeats),
            notes=tuple(notes),
            functions=functions,
            **common,
        )


def _reuse(inp: _Inputs, make: Callable[[], _Inputs]) -> Callable[[], _Inputs]:
    """Fresh input clones for a compiled function (its module copy is the one it was jitted from)."""

    def fresh() -> _Inputs:
        new = make()
        return _Inputs(inp.fn, new.args, new.kwargs)

    return fresh
