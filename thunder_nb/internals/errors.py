"""The private facts that tell failures apart: where torch raised an error (its lazy CUDA initialisation, a graph
capture), the table that reads thunder's message naming an op it cannot trace (`untraceable_op`), and thunder's own
limits that packaged models meet (`thunder_limit`)."""

from __future__ import annotations

import os
import re
import traceback
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any

__all__ = ["error_line", "raised_by_cuda_init", "raised_by_graph_capture", "UNTRACEABLE_REASONS", "untraceable_op",
           "thunder_limit"]


def error_line(e: BaseException) -> str:
    """``ValueError: boom``: the exception's type and the first line of its message."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def raised_by_cuda_init(e: BaseException) -> bool:
    """Whether ``e`` (or an error it was raised from) came out of torch's lazy CUDA initialisation: no usable GPU.

    torch raises a plain RuntimeError ("Found no NVIDIA driver", "no CUDA GPUs are available") or an
    AssertionError ("Torch not compiled with CUDA enabled") there; where it was raised tells them apart.
    """
    return _raised_in(e, "torch.cuda", ("_lazy_init",))


def raised_by_graph_capture(e: BaseException) -> bool:
    """Whether ``e`` (or an error it was raised from) came out of torch beginning or ending a CUDA-graph capture.

    An op that is illegal under capture (a host sync) invalidates it, and torch then raises a plain
    ``torch.AcceleratorError`` when the capture ends ("operation failed due to a previous error during
    capture"), from `torch.cuda.graphs`.
    """
    return _raised_in(e, "torch.cuda.graphs", ("capture_begin", "capture_end", "__enter__", "__exit__"))


def _raised_in(e: BaseException, module: str, functions: Sequence[str]) -> bool:
    return any(f.f_globals.get("__name__") == module and f.f_code.co_name in functions
               for err in _chain(e) for f in _frames(err.__traceback__))


def _chain(e: BaseException) -> Iterator[BaseException]:
    """``e`` and the errors it was raised from or while handling, each once."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _frames(tb: TracebackType | None) -> Iterator[Any]:
    while tb is not None:
        yield tb.tb_frame
        tb = tb.tb_next


#: Why thunder 0.2.6 refuses to trace an op (`untraceable_op`).
UNTRACEABLE_REASONS = ("data-dependent-shape", "boolean-mask", "data-dependent-value", "to-python", "python-scalar",
                       "unsupported")


# NOTE: thunder 0.2.6 raises a bare NotImplementedError for every op it cannot trace and names the op only in
# its message, so this table reads the message's first line: (pattern, reason; None: the error's cause decides)
_UNTRACEABLE_MESSAGES: tuple[tuple[str, str | None], ...] = (
    (r"registration for (\w+),", None),
    (r"(boolean) advanced indexing", "boolean-mask"),
    (r"casting a TensorProxy to a Python (\w+)", "python-scalar"),
    (r"Trying to call function ([\w.]+), but it is not yet supported", "unsupported"),
)


#: Python's name for the type thunder's message names ("casting a TensorProxy to a Python boolean").
_PYTHON_TYPES = {"boolean": "bool"}


#: thunder 0.2.6's own limits that packaged models meet, read from its messages (the first line of the error or of
#: any exception it chained): (pattern, `thunder_nb.diagnosis.failures.LIMITS` key).
_LIMIT_MESSAGES: tuple[tuple[str, str], ...] = (
    (r"torch\.where\(\) does not support only specifying a condition", "where-condition"),
    (r"Only inplace=False is currently supported in dropout", "dropout-inplace"),
    (r"grad_forward_sdpa: Expected all inputs to have same batch_size", "sdpa-batch"),
    (r"query and dout must have the same dtype", "sdpa-dtype"),
    (r"'wrapper_descriptor' object has no attribute '__self__'", "interpreter-slot-wrapper"),
    (r"Failed to find a gradient transform for bound symbol", "no-grad-transform"),
    (r"dictionary changed size during iteration", "interpreter-gc"),
    # NOTE: the whole message, a named tuple's field: ``x.max(dim=1).indices`` read from thunder's plain tuple
    (r"\A(values|indices|min|max)\Z", "named-tuple-fields"),
    # NOTE: thunder-nb's refusal (`thunder_nb.internals.random_ops.REFUSAL`) of thunder's wrong gradients
    (r"draws at random, and thunder 0\.2\.6 differentiates it by calling it again", "random-opaque-grad"),
    # NOTE: thunder-nb's refusal (`thunder_nb.internals.python_random.REFUSAL`) of a draw fixed at tracing
    (r"draws a Python random number, which thunder would draw once", "python-random"),
)


#: thunder's limits that raise with no message, by the function of thunder's that raises them.
_LIMIT_RAISERS: dict[str, str] = {
    "embedding_meta": "embedding-max-norm",  # NOTE: ``if max_norm is not None: raise NotImplementedError``
    # NOTE: ``assert provenance.inputs[0].inputs[0].ext_flag & EXT_FLAG_IS_MODULE``: a buffer set in a called module
    "get_parameter_or_buffer_or_submodule_name_and_root": "module-buffer-set",
}


def thunder_limit(e: BaseException) -> str | None:
    """The key of a known limit of thunder that ``e`` (or an exception it chains) reports, or None."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = str(e).strip()
        for pattern, key in _LIMIT_MESSAGES:
            if re.search(pattern, text):
                return key
        if not text and e.__traceback__ is not None:
            last = traceback.extract_tb(e.__traceback__)[-1]
            if last.name in _LIMIT_RAISERS and f"{os.sep}thunder{os.sep}" in last.filename:
                return _LIMIT_RAISERS[last.name]
        e = e.__cause__ or e.__context__
    return None


def untraceable_op(e: BaseException) -> tuple[str, str] | None:
    """``(op, reason)`` when ``e`` is thunder refusing to trace an op: ``("nonzero", "data-dependent-shape")``.

    ``op`` is the name the user called (``nonzero``, ``tolist``, ``float`` for ``float(x)``, ``torch._unique2``)
    and ``reason`` one of `UNTRACEABLE_REASONS`; None when ``e`` is something else.
    """
    if not isinstance(e, NotImplementedError):
        return None
    text = str(e).strip()
    first = text.splitlines()[0] if text else ""
    for pattern, reason in _UNTRACEABLE_MESSAGES:
        m = re.search(pattern, first)
        if m is None:
            continue
        op = _PYTHON_TYPES.get(m.group(1), m.group(1))
        reason = reason or _registration_reason(e.__cause__, op)
        return (op, reason) if reason is not None else None
    return None


def _registration_reason(cause: BaseException | None, op: str) -> str | None:
    """Why running an op on thunder's fake tensors failed, from the exception it raised there."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    if isinstance(cause, DynamicOutputShapeException):
        return "data-dependent-shape"
    if isinstance(cause, DataDependentOutputException):
        return "data-dependent-value"
    if op in ("tolist", "numpy"):  # NOTE: a plain RuntimeError from the fake tensor: these never trace
        return "to-python"
    return None

