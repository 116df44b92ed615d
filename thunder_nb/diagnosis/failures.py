"""Why a function failed, in words the user can act on: their own line, an op thunder cannot trace, a failed version."""

from __future__ import annotations

import os
import re
import sys
import sysconfig
import traceback
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from .. import internals
from ..internals import error_line

__all__ = ["Where", "Failure", "FAILURE_KINDS", "error_line", "user_frame", "where_text", "untraceable", "trace_failure",
           "explain_trace_failure", "NOTE_START", "LIMITS", "known_limit", "NO_GPU", "is_user_file"]

#: What a side says when thunder's own runner needs a GPU this machine does not have.
NO_GPU = "needs a GPU to run: thunder's transform captures CUDA graphs, and torch sees no GPU here; only its trace is shown"


@dataclass(frozen=True, slots=True)
class Where:
    """A line of the user's code: a notebook cell or a file."""

    filename: str
    line: int
    text: str  # the source line, stripped ("" when unknown)
    function: str

    def __str__(self) -> str:
        return where_text(self)


def user_frame(tb: TracebackType | None) -> Where | None:
    """The deepest frame of the user's own code in a traceback (thunder keeps the user's frames in its own)."""
    frames = [f for f in traceback.extract_tb(tb) if is_user_file(f.filename)]
    if not frames:
        return None
    f = frames[-1]
    return Where(f.filename, f.lineno or 0, (f.line or "").strip(), f.name)


def _cell_number(filename: str) -> int | None:
    """The execution count of the IPython cell compiled as ``filename`` (None: not a cell of this shell)."""
    if "IPython" not in sys.modules:
        return None
    from IPython import get_ipython

    shell = get_ipython()
    names = getattr(getattr(shell, "compile", None), "_filename_map", None) or {}
    return names.get(filename)


def where_text(where: Where) -> str:
    """``cell In[5], line 3: `return x.tolist()``` or ``loss.py:12: `...```."""
    n = _cell_number(where.filename)
    if n is not None:
        place = f"cell In[{n}], line {where.line}"
    else:
        path = where.filename
        if not path.startswith("<") and os.path.abspath(path).startswith(os.getcwd() + os.sep):
            path = os.path.relpath(path)
        place = f"{path}:{where.line}"
    return place + (f": `{where.text}`" if where.text else "")


# --- ops thunder 0.2.6 cannot trace -----------------------------------------------------------------

_DATA_SHAPE = (
    "its result's shape depends on the values in the tensor, and thunder 0.2.6 has no support for "
    "data-dependent shapes"
)
_KEEP_OUT = "Keep it outside the function you compile: compile the part before it and run the rest in eager PyTorch"

#: For each `internals.UNTRACEABLE_REASONS` entry: how the op is named (``{op}``: its name), and why it fails.
_UNTRACEABLE: dict[str, tuple[str, str]] = {
    "data-dependent-shape": ("{op}", _DATA_SHAPE),
    "boolean-mask": ("indexing with a boolean mask (x[mask])", _DATA_SHAPE),
    "data-dependent-value": ("{op}", "its result is a Python value computed from the tensor's data, which thunder "
                                     "0.2.6 cannot trace"),
    "to-python": (".{op}()", "it turns a tensor into Python data, which thunder 0.2.6 cannot trace (only .item() of "
                             "one number)"),
    "python-scalar": ("{op}() of a tensor", "thunder 0.2.6 traces the computation, not the values (an `if` on a "
                                            "tensor does this too); for one number, .item() works"),
    "unsupported": ("{op}", "thunder 0.2.6 has no support for it"),
}


#: thunder's limits met on packaged models (`internals.thunder_limit` reads them): the component that refuses, and
#: what to try.
LIMITS: dict[str, tuple[str, str]] = {
    "where-condition": ("thunder's torch front end (thunder.torch.where)",
                        "torch.where(cond) with one argument has a data-dependent shape (litgpt's mixtral MoE routes "
                        "tokens with it): keep that part outside the compiled function, or use the three-argument "
                        "torch.where(cond, a, b)"),
    "dropout-inplace": ("thunder's torch front end (thunder.torch.dropout)",
                        "set inplace = False on each torch.nn.Dropout in model.modules(), which computes the same "
                        "(torchvision's mobilenet_v3 uses Dropout(inplace=True))"),
    "sdpa-batch": ("thunder's sdpa executor (thunder/executors/sdpaex.py, fused attention)",
                   "its fused attention refuses inputs whose batch sizes differ (a KV cache's broadcast batch); "
                   "leave it out: thunder_nb.jit(fn, executors=['no-sdpa']) or --executors no-sdpa. "
                   "thunder_nb.jit(fn) alone already keeps such attention away from it (litgpt's KV-cache decode "
                   "step runs so, token for token equal to eager, on the H200)"),
    "sdpa-dtype": ("thunder's sdpa executor (its fused attention's backward under torch.autocast)",
                   "with autocast around the call, the attention's backward gets a gradient of another dtype "
                   "than its inputs; thunder_nb.jit and jit_step take thunder-nb's sdpa executor, which casts it "
                   "(nanoGPT under autocast equal to eager on the H100); on thunder.jit's own path leave the executor "
                   "out: executors=['no-sdpa'] (--executors no-sdpa)"),
    "interpreter-slot-wrapper": ("thunder's interpreter (thunder/core/interpreter.py)",
                                 "thunder 0.2.6 cannot interpret a C slot wrapper that HF transformers 4.57 and "
                                 "5.x call while building the model's forward; no executor choice gets past it "
                                 "(the interpreter runs before any executor): compile a function of your own "
                                 "that does not go through transformers' code"),
    "interpreter-gc": ("thunder's interpreter (thunder/core/interpreter.py) meeting Python's garbage collector",
                       "a collection landed while thunder walked a dict that a weak reference's callback deletes from "
                       "(after torch.compile has run in the process, every module made inside the traced function "
                       "reads one): a race, so the same call may pass next time. thunder_nb.jit and jit_step trace "
                       "with the cyclic collector off and do not meet it; around thunder.jit's own first call, "
                       "gc.disable() before it and gc.enable() after"),
    "embedding-max-norm": ("thunder's embedding (thunder/core/prims.py), which has no max_norm",
                           "torch.nn.Embedding(max_norm=...) renormalizes the rows it reads in place at every "
                           "forward, which thunder 0.2.6 does not implement (it raises NotImplementedError with no "
                           "message): drop max_norm, or renormalize the weight outside the compiled function "
                           "(with torch.no_grad(): torch.embedding_renorm_(emb.weight, ids, max_norm, 2.0))"),
    "module-buffer-set": ("thunder's interpreter (thunder/core/jit_ext.py), which names a buffer a forward sets "
                          "again only where the compiled function is the module itself",
                          "a module's forward sets a buffer (self.count += 1, self.ema = 0.9 * self.ema + ...) inside "
                          "a function that calls the module (a loss function, jit_step's step), and thunder 0.2.6 "
                          "cannot name it there: write it in place, which thunder traces anywhere "
                          "(self.count.add_(1); with torch.no_grad(): self.ema.mul_(0.9).add_(0.1 * x)), or compile "
                          "the module itself: thunder_nb.jit(model)"),
    "named-tuple-fields": ("thunder's torch front end (thunder/torch/__init__.py), which returns torch's named "
                           "tuples as plain tuples",
                           "x.max(dim=...), x.min(dim=...), x.topk(k), x.sort(), x.median(dim), x.mode(dim), "
                           "x.kthvalue(k, dim), x.cummax(dim), x.cummin(dim) and torch.aminmax give a plain tuple "
                           "under thunder 0.2.6, which has no .values or .indices (.min, .max): index it instead, [0] "
                           "for the values and [1] for the indices (x.max(dim=1)[1] for x.max(dim=1).indices)"),
    "random-opaque-grad": ("thunder's automatic registration (thunder/torch/__init__.py), which differentiates an op "
                           "it has no rule for by calling it again",
                           "F.fractional_max_pool2d/3d (nn.FractionalMaxPool2d) draws its pooling windows at random, "
                           "and the second call would draw others, so thunder-nb refuses its gradient rather than give "
                           "a wrong one: use F.max_pool2d or F.adaptive_max_pool2d, or apply it outside the function "
                           "you compile; without a gradient (torch.no_grad(), evaluation) it runs"),
    "python-random": ("thunder's interpreter (thunder/core/jit_ext.py), which runs a call it has no rule for once, "
                      "while it traces, and keeps its result for every call",
                      "a draw of Python's random module or NumPy's (random.random(), np.random.rand()) would be the "
                      "first call's at every call: draw with torch instead, which thunder draws anew each call "
                      "(torch.rand(()), x.new_empty(shape).bernoulli_(p)), and for a layer skipped at random "
                      "(stochastic depth) multiply by a mask rather than branch: torchvision.ops.StochasticDepth, or "
                      "x + f(x) * x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(1 - p) / (1 - p)"),
    "no-grad-transform": ("thunder's autodiff (thunder/core/transforms.py), which has no backward for the op the "
                          "error names with these executors",
                          "where you named a fusion executor, it may have taken an op whose backward only thunder's "
                          "torch executor has (thunder's own torchcompile executor takes adaptive_avg_pool2d, the "
                          "pooling of torchvision's resnets, so): use thunder-nb's, which leaves such ops to the torch "
                          "executor (thunder_nb.jit(fn, executors=['torchcompile']) or --executors torchcompile), or "
                          "leave the executor out. With thunder's defaults, thunder 0.2.6 has no backward for that op "
                          "at all, even where its input needs no gradient: compute it outside the function you compile "
                          "(before it, on the batch), or write it with ops thunder differentiates"),
}


def known_limit(e: BaseException) -> tuple[str, str] | None:
    """(the thunder component that refuses, what to try) when ``e`` is one of thunder's known `LIMITS`."""
    key = internals.thunder_limit(e)
    return LIMITS[key] if key is not None else None


def untraceable(e: BaseException) -> tuple[str, str] | None:
    """Name the op thunder cannot trace and say why: ``("nonzero", "its result's shape depends ...")``; None if
    unknown."""
    known = internals.untraceable_op(e)
    if known is None:
        return None
    op, reason = known
    named, why = _UNTRACEABLE[reason]
    return named.format(op=op), why


def trace_failure(name: str, e: BaseException, where: Where | None) -> tuple[str, str]:
    """The message for thunder failing to trace ``name``, as (text with a ``{where}`` slot, advice)."""
    at = " ({where})" if where is not None else ""
    known = untraceable(e)
    if known is not None:
        op, why = known
        return f"thunder cannot trace {op} in {name}{at}: {why}", _KEEP_OUT
    limit = known_limit(e)
    if limit is not None:
        component, advice = limit
        return f"thunder cannot trace {name}{at}: {component} refuses it ({error_line(e)})", advice
    # NOTE: an unknown failure: its own first line, without thunder's internal exception reprs
    text = re.sub(r",? please use manual registration: .*", "", error_line(e))
    return f"thunder cannot trace {name}{at}: {text}", ""


#: The first words of the note `explain_trace_failure` adds (one per exception, however many wrappers it crosses).
NOTE_START = "thunder-nb: "


def explain_trace_failure(e: BaseException, name: str) -> None:
    """Add to ``e``, raised by thunder's path for ``name``, a note (PEP 678: shown under the traceback, by IPython too)
    with `trace_failure`'s words, where thunder cannot trace an op (`untraceable`) or meets one of its known `LIMITS`:
    thunder's own error is often a registration's internals or, for a limit, bare (``NotImplementedError()``). The
    exception, its type and its message stay thunder's, so ``except`` clauses catch it as before; any other error
    (the user's own code, a wrong argument) gets no note. Nothing on Python 3.10, which has no notes."""
    if not hasattr(e, "add_note") or any(str(n).startswith(NOTE_START) for n in getattr(e, "__notes__", ())):
        return
    if untraceable(e) is None and known_limit(e) is None:
        return
    where = user_frame(e.__traceback__)
    text, advice = trace_failure(name, e, where)
    e.add_note(NOTE_START + text.format(where=where) + (f". What to do: {advice}" if advice else ""))


# --- how a compiled version failed ------------------------------------------------------------------

#: `Failure.kind`: no GPU for thunder's own runner, a CUDA-graph capture that failed, thunder failing to
#: compile (trace) the function, any other error of a call, or a call not made because the checker found
#: that it would kill the process (`Failure.predicted`).
FAILURE_KINDS = ("no-gpu", "capture", "compile", "crash", "would-crash")


@dataclass(frozen=True, slots=True)
class Failure:
    """How a compiled version failed, judged by its exception's type and where torch raised it (not its text)."""

    kind: str  # a `FAILURE_KINDS` entry
    stage: str  # "trace" or "run"
    error_type: str  # the exception's class name: "UnboundLocalError"
    error: str  # `error_line`: "UnboundLocalError: cannot access local variable 't9' ..."

    @classmethod
    def predicted(cls, defect: Any) -> Failure:
        """A call not made: ``defect`` (severity "crashes the process") says it would kill the process."""
        return cls("would-crash", "run", defect.rule, f"not run: {defect.message}")

    @classmethod
    def of(cls, e: BaseException, stage: str) -> Failure:
        """Classify ``e``, raised while tracing (``stage="trace"``) or calling (``"run"``) a compiled function."""
        if internals.raised_by_cuda_init(e):
            kind = "no-gpu"
        elif stage == "run" and internals.raised_by_graph_capture(e):
            kind = "capture"
        else:
            kind = "compile" if stage == "trace" else "crash"
        return cls(kind, stage, type(e).__name__, error_line(e))


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    dirs.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # thunder_nb itself
    dirs.update(p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages")))
    return tuple(os.path.abspath(d) + os.sep for d in dirs)


_LIBRARY_DIRS = _library_dirs()


def is_user_file(filename: str) -> bool:
    """Whether code from ``filename`` is the user's (a notebook cell, a script) rather than Python's or a package's."""
    if not filename or filename.startswith("<frozen"):
        return False
    if filename.startswith("<"):  # "<ipython-input-3-...>", "<string>", "<stdin>"
        return True
    return not os.path.abspath(filename).startswith(_LIBRARY_DIRS)
