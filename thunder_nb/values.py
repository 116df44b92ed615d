"""Check nested results (tensors, numbers, containers) against eager PyTorch's and print them in one short line."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["map_tensors", "clone_tensor", "leaves", "compare_values", "short"]

#: Float tolerance for Python numbers (float32's, as torch.testing uses for f32 tensors).
_RTOL, _ATOL = 1.3e-6, 1e-5
_VALUE_CHARS = 120


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
    """A detached copy of ``t`` with its own storage: a leaf that requires grad as ``t`` does (a Parameter stays one)."""
    import torch

    c = t.detach().clone()
    if isinstance(t, torch.nn.Parameter):
        return torch.nn.Parameter(c, requires_grad=t.requires_grad)
    return c.requires_grad_(t.requires_grad)


def leaves(x: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Yield ``(path, leaf)`` for a nested value; containers yield their kind and size first."""
    if isinstance(x, (list, tuple)):
        yield path or "()", (type(x).__name__, len(x))
        for i, e in enumerate(x):
            yield from leaves(e, f"{path}[{i}]")
    elif isinstance(x, dict):
        yield path or "{}", ("dict", tuple(x))
        for k, v in x.items():
            yield from leaves(v, f"{path}[{k!r}]")
    else:
        yield path or "result", x


def compare_values(actual: Any, expected: Any) -> tuple[bool, float | None, str | None]:
    """Compare nested results like ``torch.testing.assert_close``; return (matches, max abs error, first difference)."""
    import torch

    a_leaves, e_leaves = list(leaves(actual)), list(leaves(expected))
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
            close = (a == b) if isinstance(a, (bool, int)) else ((_isnan(a) and _isnan(b)) or _isclose(a, b))
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
