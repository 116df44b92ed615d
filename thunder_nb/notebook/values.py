"""Compare nested results (tensors, numbers, containers) with a reference's, and print them in one short line."""

from __future__ import annotations

import cmath
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ValueComparison",
    "compare_values",
    "first_difference",
    "map_tensors",
    "clone_tensor",
    "leaves",
    "short",
    "NUMBER_RTOL",
    "NUMBER_ATOL",
]

#: Default tolerances for Python floats and complex numbers: float32's, as ``torch.testing.assert_close``
#: uses for float32 tensors (an ``.item()`` number comes from a float32 tensor).
NUMBER_RTOL, NUMBER_ATOL = 1.3e-6, 1e-5
_VALUE_CHARS = 120
_DIFFERENCE_CHARS = 200


@dataclass(frozen=True, slots=True)
class ValueComparison:
    """How a value compares with its reference.

    ``max_abs_error`` is the largest absolute difference over the tensor elements and numbers compared
    (None when there were none); ``difference`` is the first difference, prefixed with its path
    (``result[1]``, ``grad['w']``), or None when everything matches.
    """

    matches: bool
    max_abs_error: float | None
    difference: str | None


def compare_values(actual: Any, expected: Any, *, label: str = "result", reference: str = "expected",
                   rtol: float | None = None, atol: float | None = None) -> ValueComparison:
    """Compare nested tuples, lists and dicts of tensors, numbers and other values, leaf by leaf.

    Tensors must have the same shape and dtype and be close as ``torch.testing.assert_close`` judges
    (NaNs equal); floats and complex numbers close within ``atol + rtol * |expected|`` (NaNs equal); ints
    and bools equal, and a number never equals one of another kind (an int that became a float
    differs); anything else by ``==``.

    Args:
        actual: the value to judge.
        expected: the reference value.
        label: the path of the top-level value in messages (``result``, ``grad``).
        reference: how messages name the reference (``expected``, ``eager's``).
        rtol, atol: tolerances for tensors and numbers; None (both) keeps ``assert_close``'s defaults
            for each tensor's dtype and float32's (`NUMBER_RTOL`, `NUMBER_ATOL`) for numbers. Give both
            or neither.
    """
    if (rtol is None) != (atol is None):
        raise ValueError("give rtol and atol together, or neither")
    a_leaves, e_leaves = list(leaves(actual, label)), list(leaves(expected, label))
    if len(a_leaves) != len(e_leaves):
        return ValueComparison(False, None, f"{label}: {len(a_leaves)} parts, {reference} {len(e_leaves)}")
    worst: float | None = None
    first: str | None = None
    for (path, a), (_, b) in zip(a_leaves, e_leaves):
        err, why = _compare_leaf(a, b, reference, rtol, atol)
        if err is not None and err == err:  # NOTE: a NaN error (one side NaN) says nothing about the size
            worst = err if worst is None else max(worst, err)
        if why is not None and first is None:
            first = f"{path}: {why}"[:_DIFFERENCE_CHARS]
    return ValueComparison(first is None, worst, first)


def first_difference(actual: Any, expected: Any, *, label: str = "result", reference: str = "expected") -> str | None:
    """Where ``actual`` first differs from ``expected`` (see `compare_values`), or None when they match."""
    return compare_values(actual, expected, label=label, reference=reference).difference


def leaves(x: Any, path: str = "result") -> Iterator[tuple[str, Any]]:
    """Yield ``(path, leaf)`` for a nested value; containers yield their kind and size first."""
    if isinstance(x, (list, tuple)):
        yield path, (type(x).__name__, len(x))
        for i, e in enumerate(x):
            yield from leaves(e, f"{path}[{i}]")
    elif isinstance(x, dict):
        yield path, ("dict", tuple(x))
        for k, v in x.items():
            yield from leaves(v, f"{path}[{k!r}]")
    else:
        yield path, x


def _compare_leaf(a: Any, b: Any, reference: str, rtol: float | None, atol: float | None) -> tuple[float | None, str | None]:
    """(absolute error or None, why they differ or None) for two leaves."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return _compare_tensors(a, b, reference, rtol, atol)
    kind_a, kind_b = _number_kind(a), _number_kind(b)
    if kind_a is not None and kind_b is not None:
        if kind_a != kind_b:
            return None, f"{type(a).__name__} {a!r}, {reference} {type(b).__name__} {b!r}"
        if kind_a in ("bool", "int"):
            return float(abs(a - b)), None if a == b else f"{a!r}, {reference} {b!r}"
        if cmath.isnan(a) and cmath.isnan(b):
            return 0.0, None
        err = abs(a - b)
        rtol, atol = (NUMBER_RTOL, NUMBER_ATOL) if rtol is None else (rtol, atol)
        return err, None if err <= atol + rtol * abs(b) else f"{a!r}, {reference} {b!r}"
    try:
        same = bool(a == b)
    except Exception:  # NOTE: values whose == raises or is not a truth value (arrays) count as different
        same = False
    return None, None if same else f"{a!r}, {reference} {b!r}"


def _compare_tensors(a: Any, b: Any, reference: str, rtol: float | None, atol: float | None) -> tuple[float | None, str | None]:
    import torch

    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return None, f"{type(a).__name__}, {reference} {type(b).__name__}"
    if a.shape != b.shape or a.dtype != b.dtype:
        return None, f"{a.dtype} {tuple(a.shape)}, {reference} {b.dtype} {tuple(b.shape)}"
    a_, b_ = a.detach().cpu(), b.detach().cpu()
    err = None
    if a_.numel():
        wide = torch.complex128 if a_.is_complex() else torch.float64
        err = float((a_.to(wide) - b_.to(wide)).abs().nan_to_num(0.0).max())
    try:
        torch.testing.assert_close(a_, b_, equal_nan=True, rtol=rtol, atol=atol)
    except AssertionError as e:
        return err, str(e).strip().splitlines()[0]
    return err, None


def _number_kind(x: Any) -> str | None:
    """``"bool"``, ``"int"``, ``"float"`` or ``"complex"`` for a Python number (subclasses too), else None."""
    for kind, cls in (("bool", bool), ("int", int), ("float", float), ("complex", complex)):
        if isinstance(x, cls):
            return kind
    return None


def map_tensors(x: Any, fn: Callable[[Any], Any]) -> Any:
    """Apply ``fn`` to every tensor in nested lists, tuples (named ones too) and dicts; keep the rest."""
    import torch

    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # namedtuple
        return type(x)(*(map_tensors(e, fn) for e in x))
    if isinstance(x, (list, tuple)):
        return type(x)(map_tensors(e, fn) for e in x)
    if isinstance(x, dict):
        return {k: map_tensors(v, fn) for k, v in x.items()}
    return x


def clone_tensor(t: Any) -> Any:
    """A detached copy of ``t`` with its own storage: a leaf that requires grad as ``t`` does (a Parameter stays
    one)."""
    import torch

    c = t.detach().clone()
    if isinstance(t, torch.nn.Parameter):
        return torch.nn.Parameter(c, requires_grad=t.requires_grad)
    return c.requires_grad_(t.requires_grad)


def short(value: Any) -> str:
    """A one-line description of a result: ``tensor float32[8] on cpu``, numbers in full for up to 6 elements."""
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
        inner = ", ".join(short(v) for v in value)
        text = f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    else:
        text = repr(value).replace("\n", " ")
    return text if len(text) <= _VALUE_CHARS else text[: _VALUE_CHARS - 1] + "…"
