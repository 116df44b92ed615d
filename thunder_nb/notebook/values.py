"""Compare nested results (tensors, numbers, containers) with a reference's through the one judge of "equal"
(`thunder_nb.diagnosis.judge`), and print them in one short line."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..diagnosis.judge import NUMBER, Tolerance, judge, leaves

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

#: Default tolerances for Python floats and complex numbers (`thunder_nb.diagnosis.judge.NUMBER`).
NUMBER_RTOL, NUMBER_ATOL = NUMBER.rtol, NUMBER.atol
_VALUE_CHARS = 120


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
                   rtol: float | None = None, atol: float | None = None, without_graphs: Any = None) -> ValueComparison:
    """Compare nested tuples, lists and dicts of tensors, numbers and other values, leaf by leaf, as the one judge
    of "equal" does (`thunder_nb.diagnosis.judge.judge`: its rule is in that module's docstring).

    Tensors must have the same shape and dtype and be close (a value not finite where the reference's is finite is
    never close); ints and bools equal, and a number never equals one of another kind (an int that became a float
    differs); anything else by ``==``.

    Args:
        actual: the value to judge.
        expected: the reference value.
        label: the path of the top-level value in messages (``result``, ``grad``).
        reference: how messages name the reference (``expected``, ``eager's``).
        rtol, atol: tolerances for tensors and numbers; None (both) keeps each tensor's dtype's
            (`thunder_nb.diagnosis.judge.dtype_tolerance`) and float32's for numbers (`NUMBER_RTOL`, `NUMBER_ATOL`).
            Give both or neither.
        without_graphs: thunder's values without CUDA graphs from the same inputs: where ``expected`` is eager's,
            ``actual`` may differ from it as much as these do (the judge's rule 4).
    """
    if (rtol is None) != (atol is None):
        raise ValueError("give rtol and atol together, or neither")
    tolerance = None if rtol is None else Tolerance(rtol, atol)
    j = judge(actual, expected, without_graphs=without_graphs, tolerance=tolerance, label=label, reference=reference)
    return ValueComparison(j.equal, j.max_abs_error, j.difference)


def first_difference(actual: Any, expected: Any, *, label: str = "result", reference: str = "expected") -> str | None:
    """Where ``actual`` first differs from ``expected`` (see `compare_values`), or None when they match."""
    return compare_values(actual, expected, label=label, reference=reference).difference


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
