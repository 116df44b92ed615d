"""What keeps a training iteration from one CUDA graph, read from thunder's traces: `capturability` and the refusal."""

from __future__ import annotations

import inspect
import linecache
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import internals
from ..cudagraph.call import without_cyclic_gc
from ..cudagraph.executors import jit_executors
from .optimizer import optimizer_plan
from .ranks import plan_buckets, ranks_of, refuse_data_parallel_wrappers
from .report import Blocker, Capturability

__all__ = ["capturability", "trace_blockers", "StepRefused", "loss_blocker", "refuse_no_grad", "refuse_fp16",
           "refuse_blockers"]

#: What to do about each kind of op that cannot be in a graph (`thunder_nb.diagnosis.ops.classify_bsym`'s reasons).
_FIXES = {
    "host-sync": ("host sync", "return the tensor and read it after the step (the step returns the loss: "
                               "`loss.item()` after the call reads the graph's result, with eager's value)"),
    "device-transfer": ("device transfer", "make the tensor on the model's device outside the step (device=...), "
                                           "and pass it in with the batch"),
    "cpu-op": ("cpu op", "make the tensor on the model's device (device=...): an op on host memory runs once at "
                         "recording and never again"),
    "host-data": ("host data", "replace the Python list or number array by a slice (x[:, -1:]) or a device tensor "
                               "made once outside the step; CUDA refuses a copy from pageable host memory while "
                               "recording"),
    "capture-dependent": ("capture-dependent", "set the attention's dropout to 0, or leave thunder's sdpa executor "
                                               "out: jit_step(..., executors=['no-sdpa'])"),
}

_PYTHON_SIDE = ("thunder runs the loss function's Python once, when it traces; no later step runs it (a print, a list "
                "append, a global or an `if` on the value keeps the first step's): return the loss and read "
                "loss.item() after the step")

_NOT_OPS = frozenset({"return", "python_return", "del", "python_del", "unpack_trivial", "unpack_sequence", "unpack_key",
                      "unpack_empty_dict", "unpack_attr", "clear_mutable_collection"})


class StepRefused(RuntimeError):
    """The iteration cannot be recorded as one CUDA graph: the message names the op, the user's line and the fix."""

    def __init__(self, blockers: Sequence[Blocker], reason: str = "cannot record this step as one CUDA graph"):
        self.blockers = tuple(blockers)
        first = self.blockers[0]
        n = len(self.blockers) - 1
        more = f" (and {n} more: see thunder_nb.step.capturability)" if n else ""
        super().__init__(f"jit_step {reason}: {first}{more}")


def thunder_jit(fn: Callable[..., Any], executors: Sequence[Any]) -> Any:
    """``thunder.jit(fn)`` with no graph transform, with ``executors`` as `thunder_nb.jit` takes them, its tracing
    with the cyclic garbage collector off (`thunder_nb.cudagraph.call.without_cyclic_gc`)."""
    import thunder

    internals.check_versions()  # NOTE: jit_step's, capturability's and compare_step's one VersionWarning
    return without_cyclic_gc(thunder.jit(fn, executors=jit_executors(executors)))


def split(batch: Sequence[Any], k: int) -> list[list[Any]]:
    """``batch`` as ``k`` micro-batches: each tensor chunked along dim 0, other values repeated."""
    if k == 1:
        return [list(batch)]
    parts = []
    for i, b in enumerate(batch):
        if isinstance(b, torch.Tensor):
            if b.dim() == 0 or b.shape[0] % k:
                raise ValueError(f"accumulate={k}: the batch's argument {i} has shape {tuple(b.shape)}, whose "
                                 f"first dimension does not split in {k} equal micro-batches")
            parts.append(b.chunk(k))
        else:
            parts.append([b] * k)
    return [list(p) for p in zip(*parts)]


# --- where the user's code is -----------------------------------------------------------------------


def _source_lines(traces: Sequence[Any]) -> tuple[dict[str, tuple[str, int]], dict[str, list[Any]]]:
    """Where the user's code made each value: (proxy name -> (file, line), op name -> [(file, line) or None, ...] in
    program order), from the traces that still carry source positions (thunder renames values when it splits the
    forward from the backward, so the second map pairs an op with the same op of an earlier trace by its order)."""
    by_name: dict[str, tuple[str, int]] = {}
    by_op: dict[str, list[Any]] = {}
    for trace in traces:
        ops: dict[str, list[Any]] = {}
        for b in trace.bound_symbols:
            at = internals.source_line(b)
            ops.setdefault(b.sym.name, []).append(at)
            if at is not None:
                for p in b.flat_proxy_outs:
                    by_name.setdefault(p.name, at)
        by_op.update((name, ats) for name, ats in ops.items() if any(ats))
    return by_name, by_op


def _at(pos: tuple[str, int] | None) -> dict[str, Any]:
    """A `Blocker`'s ``where``, ``filename`` and ``line`` for the user's line ``(file, line)`` (none when unknown)."""
    if pos is None:
        return {"where": None}
    from ..diagnosis.failures import Where, where_text

    file, line = pos
    return {"where": where_text(Where(file, line, linecache.getline(file, line).strip(), "")), "filename": file,
            "line": line}


def caller_line() -> dict[str, Any]:
    """`_at` the line of the user's code that called into thunder-nb: the nearest frame outside the package."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # NOTE: thunder_nb/, not step/
    frame = inspect.currentframe()
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame = frame.f_back
    return _at((frame.f_code.co_filename, frame.f_lineno)) if frame is not None else _at(None)


def refuse_no_grad() -> None:
    """Refuse a step called under ``torch.no_grad()`` (or inference mode), naming the caller's line."""
    raise StepRefused([Blocker("grad mode", "torch.no_grad()", fix="call the step outside torch.no_grad() and "
                               "torch.inference_mode(); for a validation loss, call your loss function (or "
                               "thunder_nb.jit of it) under no_grad instead", trace="loss_fn", **caller_line())],
                      "needs grad mode")


def refuse_fp16(autocast: tuple) -> None:
    """Refuse float16 autocast (``autocast``: a batch key's autocast part): its gradients need loss scaling (a
    GradScaler), which the step cannot apply."""
    if len(autocast) > 1 and autocast[1] == torch.float16:
        raise StepRefused([Blocker(
            "autocast", "torch.autocast(dtype=torch.float16)",
            fix="float16 gradients need loss scaling (torch.amp.GradScaler), which the step cannot apply inside "
            "the graph: use torch.autocast(device, dtype=torch.bfloat16), whose range needs no scaler, or keep "
            "float16 and a GradScaler in a loop without jit_step", trace="loss_fn", **caller_line())],
            "cannot train under float16 autocast")


def _definition_line(fn: Any) -> dict[str, Any]:
    """`_at` the line that defines ``fn``."""
    try:
        code = inspect.unwrap(fn).__code__
    except AttributeError:
        return _at(None)
    return _at((code.co_filename, code.co_firstlineno))


def where_from_traceback(e: BaseException) -> dict[str, Any]:
    """`_at` the deepest line of the user's own code in ``e``'s traceback."""
    from ..diagnosis.failures import user_frame

    frame = user_frame(e.__traceback__)
    return _at((frame.filename, frame.line)) if frame else _at(None)


def loss_blocker(loss_fn: Any, returned: str, at: tuple[str, int] | None = None) -> Blocker:
    """The blocker of a loss function that returns ``returned`` ("(tensor, float)", "a tensor of shape (8,)") rather
    than one tensor of one element that requires grad; ``at``: the line that made it (default: the ``def``)."""
    return Blocker("loss", f"loss_fn returns {returned}",
                   fix="return the loss alone, one tensor of one element computed from the parameters (.mean() or "
                   ".sum() of a loss per sample); return other values from another function, or read them after the "
                   "step", trace="loss_fn", **(_at(at) if at is not None else _definition_line(loss_fn)))


def _return_line(fn: Any) -> tuple[str, int] | None:
    """The file and line of ``fn``'s one ``return`` statement (None: not one, or no source)."""
    import ast
    import textwrap

    try:
        code = inspect.unwrap(fn).__code__
        lines, first = inspect.getsourcelines(code)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (AttributeError, OSError, TypeError, SyntaxError):
        return None
    returns = [n for n in ast.walk(tree.body[0]) if isinstance(n, ast.Return)] if tree.body else []
    return (code.co_filename, first + returns[0].lineno - 1) if len(returns) == 1 else None


def returned_value(out: Any) -> str:
    """What a loss function returned, in `loss_blocker`'s words."""
    if not isinstance(out, torch.Tensor):
        return type(out).__name__
    return "a loss that does not require grad" if out.numel() == 1 else f"a tensor of shape {tuple(out.shape)}"


# --- what stops a graph -----------------------------------------------------------------------------


def _ops(trace: Any) -> list[Any]:
    return [b for b in trace.bound_symbols if b.sym.name not in _NOT_OPS]


def trace_blockers(jfn: Any, loss_fn: Any, *, cuda: bool) -> tuple[list[Blocker], list[bool], int]:
    """What in ``jfn``'s last forward and backward traces cannot be in a graph, each with the user's line and the fix.

    Returns:
        (blockers, for each op whether it blocks (a host sync whose value only reaches Python first, then the
        forward then the backward trace's ops), the number of forward ops)
    """
    import thunder

    from ..diagnosis.ops import classify_bsym

    traces = thunder.last_traces(jfn)
    backward = thunder.last_backward_traces(jfn)
    by_name, by_op = _source_lines(traces)
    blockers: list[Blocker] = []
    flags: list[bool] = []
    forward_ops = _ops(traces[-1])
    for name, ops in (("forward", forward_ops), ("backward", _ops(backward[-1]) if backward else [])):
        seen: dict[str, int] = {}
        for b in ops:
            nth = seen[b.sym.name] = seen.get(b.sym.name, -1) + 1
            found = classify_bsym(b, cuda_trace=cuda)
            flags.append(found is not None)
            if found is None:
                continue
            kind, fix = _FIXES.get(found[0], (found[0], "keep it out of the step"))
            pos = next((by_name[p.name] for p in b.flat_proxy_outs if p.name in by_name), None)
            if pos is None and name == "forward":
                ats = by_op.get(b.sym.name, [])
                pos = ats[nth] if nth < len(ats) else None
            blockers.append(Blocker(kind, found[1], fix=fix, trace=name, **_at(pos)))
    for b in _python_only(traces[0], cuda=cuda):  # NOTE: not in the traces that run: one op outside the graph each,
        flags.insert(0, True)  # counted before the forward (the rest of the iteration can still be one graph)
        pos = next((by_name[p.name] for p in b.flat_proxy_outs if p.name in by_name), None)
        blockers.append(Blocker("python-side state", f"{b.sym.name} (its value only reaches Python)", fix=_PYTHON_SIDE,
                                trace="forward", **_at(pos)))
    out = internals.flat_output(traces[-1])
    if out is not None and not (len(out) == 1 and internals.is_tensor_proxy(out[0]) and out[0].numel == 1):
        kinds = ["tensor" if internals.is_tensor_proxy(p) else type(p).__name__.replace("Proxy", "").lower()
                 for p in out]
        one = len(out) == 1 and internals.is_tensor_proxy(out[0])
        at = _return_line(loss_fn) or next((by_name[p.name] for p in out if getattr(p, "name", None) in by_name), None)
        blockers.append(loss_blocker(loss_fn, f"a tensor of shape {tuple(out[0].shape)}" if one
                                     else f"({', '.join(kinds)})", at))
    if not backward:
        blockers.append(Blocker("loss", "no backward trace",
                                fix="the loss must depend on parameters that require grad, with grad mode on",
                                trace="loss_fn", **_definition_line(loss_fn)))
    return blockers, flags, len(forward_ops)


def _python_only(trace: Any, *, cuda: bool) -> list[Any]:
    """The host syncs of thunder's first trace (what the user's code called) whose value no op and no output uses:
    a ``.item()`` that is printed, logged, kept in a list, tested by an ``if``."""
    from ..diagnosis.ops import classify_bsym

    used = {p.name for b in trace.bound_symbols for p in b.flat_proxy_args}
    used.update(getattr(p, "name", None) for p in internals.flatten(trace.output))
    found = []
    for b in _ops(trace):
        kind = classify_bsym(b, cuda_trace=cuda)
        if kind is not None and kind[0] == "host-sync" and not any(p.name in used for p in b.flat_proxy_outs):
            found.append(b)
    return found


def refuse_blockers(jfn: Any, loss_fn: Callable[..., Any], first: Sequence[Any], device: torch.device,
                    optimizer_blocker: Blocker | None) -> None:
    """Raise `StepRefused` naming what keeps one iteration of ``loss_fn`` on the micro-batch ``first`` from one graph
    (thunder's traces built by ``jfn``, then read; the optimizer's blocker); nothing runs. Where thunder cannot trace
    ``loss_fn``, its error, with a note of what to do where it is known (`explain_trace_failure`), as at a call of
    `thunder_nb.jit`."""
    from ..diagnosis.failures import explain_trace_failure

    try:
        internals.build_traces(jfn, *first)
    except Exception as e:
        explain_trace_failure(e, getattr(loss_fn, "__name__", type(loss_fn).__name__))
        raise
    blockers, _, _ = trace_blockers(jfn, loss_fn, cuda=device.type == "cuda")
    if optimizer_blocker is not None:
        blockers.append(optimizer_blocker)
    if blockers:
        raise StepRefused(blockers)


def _shapes(batch: Sequence[Any]) -> str:
    return ", ".join(f"{list(b.shape)} {str(b.dtype).replace('torch.', '')}" if isinstance(b, torch.Tensor)
                     else repr(b) for b in batch)


def capturability(model: torch.nn.Module, loss_fn: Callable[..., Any], optimizer: torch.optim.Optimizer, *batch: Any,
                  accumulate: int = 1, executors: Sequence[Any] = (), ddp: bool | None = None,
                  process_group: Any = None, shard: bool = False) -> Capturability:
    """How much of one training iteration one CUDA graph holds, and what stops the rest (nothing runs).

    Builds thunder's forward and backward traces of ``loss_fn`` for ``batch`` (the first micro-batch with
    ``accumulate``) and reads them with the rules of `thunder_nb.diagnosis.ops` (host syncs, device transfers, host
    memory, capture-dependent attention), plus the optimizer's step and the loss's form. Each blocker carries the
    user's line and the fix. Across ranks (``ddp`` and ``process_group`` as `jit_step` takes them), the gradients'
    all-reduces are ops of the graph, one per bucket (``all_reduces``); with ``shard=True``, one reduce_scatter
    after the backward and one all_gather after the optimizer's step per dtype and device (``reduce_scatters``,
    as many all_gathers); a data-parallel wrapper raises TypeError.
    """
    refuse_data_parallel_wrappers(model, loss_fn)
    world = ranks_of(ddp, process_group, shard)
    name = getattr(loss_fn, "__name__", type(loss_fn).__name__)
    desc, opt_blocker = optimizer_plan(optimizer)
    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device if params else torch.device("cpu")
    first = split(batch, accumulate)[0]
    jfn = thunder_jit(loss_fn, executors)
    notes = [f"shapes: recorded for {_shapes(first)}; another shape records again"]
    try:
        internals.build_traces(jfn, *first)
    except Exception as e:
        from ..diagnosis.failures import error_line, known_limit, untraceable

        limit, op, known = known_limit(e), untraceable(e), internals.untraceable_op(e)
        kind = "thunder"
        if op is not None:  # NOTE: an op thunder cannot trace: nonzero, a boolean mask (a data-dependent shape), ...
            what, fix = op[0], f"{op[1]}: keep it outside the loss function (thunder compiles all of it)"
            if known is not None and known[1] in ("data-dependent-shape", "boolean-mask"):
                kind = "dynamic shape"
        else:
            what = error_line(e)[:200]
            fix = (f"{limit[0]}: {limit[1]}" if limit
                   else "see the error; jit_step(..., capture=False) trains uncaptured")
        blocker = Blocker(kind, what, fix=fix, trace="forward", **where_from_traceback(e))
        return Capturability(name, 1, 0, (blocker,), desc, tuple(notes))
    blockers, flags, _ = trace_blockers(jfn, loss_fn, cuda=device.type == "cuda")
    sharded = len({(p.dtype, p.device) for p in params}) if world is not None and shard else 0
    all_reduces = len(plan_buckets(params)) if world is not None and not shard else 0
    flags += [False] * (all_reduces + sharded)  # NOTE: after the backward, before the optimizer's step: in the graph
    flags.append(opt_blocker is not None)
    flags += [False] * sharded  # NOTE: the updated parameters' all_gathers, after the optimizer's step
    if opt_blocker is not None:
        blockers.append(opt_blocker)
    longest = run = 0
    for blocked in flags:
        run = 0 if blocked else run + 1
        longest = max(longest, run)
    if any(b.kind == "loss" for b in blockers) and not any(flags):  # NOTE: a loss of the wrong form blocks it all
        longest = 0
    return Capturability(name, len(flags), longest, tuple(blockers), desc, tuple(notes), all_reduces, world or 0,
                         sharded)
