"""Compare results like ``torch.testing.assert_close``, nested and with numbers, and say where they first differ."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["ValueComparison", "compare_values", "first_difference", "NUMBER_RTOL", "NUMBER_ATOL"]

#: Tolerances for Python floats: float32's (an ``.item()`` number comes from a float32 tensor).
NUMBER_RTOL, NUMBER_ATOL = 1.3e-6, 1e-5


@dataclass(frozen=True, slots=True)
class ValueComparison:
    """How ``actual`` compares with ``expected``.

    ``max_abs_error`` is the largest absolute difference over all tensor elements and numbers
    compared (None when there were none); ``difference`` is the first difference, prefixed with
    its path (``[1]``, ``result``), or None when everything matches.
    """

    matches: bool
    max_abs_error: float | None
    difference: str | None


def compare_values(actual: Any, expected: Any, *, label: str = "result", expected_name: str = "expected") -> ValueComparison:
    """Compare nested tuples/lists/dicts of tensors, numbers and other values.

    Tensors must have the same shape and dtype and be close with ``torch.testing.assert_close``'s
    default tolerances for their dtype (NaNs equal); Python floats with float32's tolerances (NaNs
    equal); ints and bools exactly, an int never equals a float; anything else by ``==``.

    Args:
        actual: the value to judge.
        expected: the reference value.
        label: the path of the top-level value in messages.
        expected_name: how messages name the reference (``"eager's"``).
    """
    a_leaves, e_leaves = list(_leaves(actual, label)), list(_leaves(expected, label))
    if len(a_leaves) != len(e_leaves):
        return ValueComparison(False, None, f"{label}: {len(a_leaves)} parts, {expected_name} has {len(e_leaves)}")
    worst: float | None = None
    first: str | None = None
    for (path, a), (_, b) in zip(a_leaves, e_leaves):
        err, why = _compare_leaf(a, b, expected_name)
        if err is not None and not math.isnan(err):
            worst = err if worst is None else max(worst, err)
        if why is not None and first is None:
            first = f"{path}: {why}"
    return ValueComparison(first is None, worst, first)


def first_difference(actual: Any, expected: Any, *, label: str = "result") -> str | None:
    """Where ``actual`` first differs from ``expected`` (see `compare_values`), or None when they match."""
    return compare_values(actual, expected, label=label).difference


def _leaves(x: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(x, (list, tuple)):
        yield path, (type(x).__name__, len(x))
        for i, e in enumerate(x):
            yield from _leaves(e, f"{path}[{i}]")
    elif isinstance(x, dict):
        yield path, ("dict", tuple(x))
        for k, v in x.items():
            yield from _leaves(v, f"{path}[{k!r}]")
    else:
        yield path, x


def _compare_leaf(a: Any, b: Any, expected_name: str) -> tuple[float | None, str | None]:
    """(absolute error or None, why they differ or None) for two leaves."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return None, f"{type(a).__name__}, {expected_name} {type(b).__name__}"
        if a.shape != b.shape or a.dtype != b.dtype:
            return None, f"{a.dtype} {tuple(a.shape)}, {expected_name} {b.dtype} {tuple(b.shape)}"
        a_, b_ = a.detach().cpu(), b.detach().cpu()
        err = None
        if a_.numel() and (a_.is_floating_point() or a_.is_complex()):
            wide = torch.complex128 if a_.is_complex() else torch.float64
            err = float((a_.to(wide) - b_.to(wide)).abs().nan_to_num(0.0).max())
        try:
            torch.testing.assert_close(a_, b_, equal_nan=True)
        except AssertionError as e:
            text = str(e).strip()
            return err, text.splitlines()[0] + (" ..." if "\n" in text else "")
        return err, None
    numbers = (bool, int, float)
    if isinstance(a, numbers) and isinstance(b, numbers):
        if isinstance(a, float) != isinstance(b, float) or isinstance(a, bool) != isinstance(b, bool):
            return None, f"{type(a).__name__} {a!r}, {expected_name} {type(b).__name__} {b!r}"
        if not isinstance(a, float):
            return float(abs(a - b)), None if a == b else f"{a!r}, {expected_name} {b!r}"
        if math.isnan(a) and math.isnan(b):
            return 0.0, None
        err = abs(a - b)
        close = err <= NUMBER_ATOL + NUMBER_RTOL * abs(b)
        return err, None if close else f"{a!r}, {expected_name} {b!r}"
    try:
        same = bool(a == b)
    except Exception:
        same = False
    return None, None if same else f"{a!r}, {expected_name} {b!r}"[:200]
