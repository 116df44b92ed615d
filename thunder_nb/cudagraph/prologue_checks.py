"""The prologue's checks made at once (`prologue.fast_module_lookups`): thunder's tensor checks and its checks of
numbers and strings.

The prologue's tensor checks (``check_tensor_metadata``: shape, device, dtype, ``requires_grad``)
where the shape is all plain ints (33 on the nanoGPT step) become one call of `tensor_checks`'
function after the last of them, which compares them all at once and, where that differs, checks
each tensor as thunder does (`check_tensor`); once a call passed, later calls are first proved by one C
guard of that call's tensor metadata (torch.compile's, `internals.metadata_guard`). Its checks of numbers and strings
(``check_number_type_and_value``: a module's ``training`` flag, its sizes, a config value, the
cache's flags; ``check_string_value``; 98 on the nanoGPT step) become one call of `value_checks`'
function, the same way. A check that fails raises, as thunder's does, and thunder then traces anew
(under ``python -O`` thunder's own tensor check, made of ``assert`` statements, checks nothing; this
one still does). The checks have no side effects, and any failing check makes the prologue fail, so
where they run in it changes nothing.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import internals

__all__ = ["check_tensor", "tensor_checks", "value_checks", "GUARD_REMAKES"]

_Tensor = torch.Tensor


def check_tensor(t: Any, shape: tuple[int, ...], device: str, dtype: torch.dtype, requires_grad: bool) -> None:
    """thunder's ``check_tensor_metadata`` for a shape of plain ints: the same test, with the shape compared at once."""
    if not (isinstance(t, _Tensor) and t.shape == shape and t.dtype == dtype and t.requires_grad == requires_grad
            and str(t.device) == device):
        raise AssertionError(f"expected tensor with {shape}, {device}, {dtype}, {requires_grad=}, got "
                             f"{tuple(t.shape) if isinstance(t, _Tensor) else type(t).__name__}"
                             + (f", {t.device}, {t.dtype}, {t.requires_grad}" if isinstance(t, _Tensor) else ""))


#: Calls whose tensors pass thunder's checks but not the C guard of an earlier call's metadata, before `tensor_checks`'
#: function stops making guards (metadata that keeps changing within the checks: strides, a tensor's Python type).
GUARD_REMAKES = 4


def _metadata_guard(tensors: tuple[Any, ...]) -> Callable[..., bool] | None:
    """A C check that ``ts`` have ``tensors``' metadata (`internals.metadata_guard`), a tensor given twice checked by
    identity; None where torch has none."""
    first: dict[int, int] = {}  # id of a tensor -> its first position
    once, repeats = [], []
    for i, t in enumerate(tensors):
        j = first.setdefault(id(t), i)
        if j == i:
            once.append(i)
        else:
            repeats.append((i, j))
    guard = internals.metadata_guard([tensors[i] for i in once])
    if guard is None or not repeats:
        return guard
    get = operator.itemgetter(*once) if len(once) > 1 else (lambda ts, i=once[0]: (ts[i],))
    repeats = tuple(repeats)

    def check(*ts: Any) -> bool:
        return guard(*get(ts)) and all(ts[i] is ts[j] for i, j in repeats)

    return check


def tensor_checks(specs: Sequence[tuple[tuple[int, ...], str, torch.dtype, bool]]) -> Any:
    """One function for many `check_tensor` calls: ``check(*tensors)`` raises where any tensor differs from its spec.

    ``specs[i]`` is ``(shape, device, dtype, requires_grad)`` of the i-th tensor. Once a call's tensors pass, the
    next calls are first proved by torch.compile's C guard of those tensors' metadata (`_metadata_guard`: Python
    type, dtype, device, ``requires_grad``, sizes and strides, each tensor's dispatch keys: everything the checks
    compare and more), one C call instead of five attribute reads per tensor (122 tensors on resnet18's training
    step); where the guard fails, the tensors are checked as before, and a failing check raises as thunder's does.
    """
    specs = tuple((tuple(shape), device, dtype, requires_grad) for shape, device, dtype, requires_grad in specs)
    expected = [(True, shape, dtype, requires_grad, torch.device(device)) for shape, device, dtype, requires_grad in specs]
    # NOTE: [the guard of the latest passing call's tensors (None: none yet, or given up), guards made so far]
    state: list[Any] = [None, 0]

    def check_tensors(*tensors: Any) -> None:
        guard = state[0]
        if guard is not None:
            try:
                if guard(*tensors):
                    return
            except Exception:  # NOTE: not a tensor where the guard has one: the checks below decide
                pass
        try:
            passed = [(isinstance(t, _Tensor), t.shape, t.dtype, t.requires_grad, t.device) for t in tensors] == expected
        except Exception:  # NOTE: not a tensor: the exact check below raises thunder's kind of error
            passed = False
        if not passed:
            for t, spec in zip(tensors, specs):
                check_tensor(t, *spec)
        if state[1] < GUARD_REMAKES:
            # NOTE: every tensor passed: a guard of their metadata proves the next call's where nothing changed
            state[1] += 1
            try:
                state[0] = _metadata_guard(tensors) if tensors else None
            except Exception:  # NOTE: a tensor torch's guard does not take: checked as before (a raise would retrace)
                state[0], state[1] = None, GUARD_REMAKES
        else:
            state[0] = None  # NOTE: the guard keeps failing where the checks pass: checked as before from now on

    return check_tensors


def value_checks(expected: Sequence[Any], strings: Sequence[bool]) -> Any:
    """One function for many of thunder's value checks: ``check(*values)`` raises where any differs.

    ``expected[i]`` is the value of a ``check_number_type_and_value`` (same type, equal, or both NaN) or,
    where ``strings[i]``, of a ``check_string_value`` (equal).
    """
    expected, strings = tuple(expected), tuple(strings)
    types = tuple(map(type, expected))

    def check_values(*values: Any) -> None:
        if values == expected and tuple(map(type, values)) == types:
            return
        for n, v, string in zip(values, expected, strings):  # NOTE: thunder's checks one by one: NaN, str subclasses
            if not (n == v if string else type(n) == type(v) and (n == v or (n != n and v != v))):
                raise AssertionError(f"expected {v!r} of type {type(v).__name__}, got {n!r} of type {type(n).__name__}")

    return check_values
