"""One value against eager's, for the one judge of "equal" (`thunder_nb.diagnosis.judge`): a nested value's leaves
(`leaves`), and for each (`Leaf`) what differs in kind and, for floating-point values, the numbers to weigh, in the
words of its messages."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .tolerances import EXACT, NUMBER, Tolerance, dtype_tolerance, sane_bound

__all__ = ["Leaf", "leaves", "tolerance_text"]


class Leaf:
    """One value against eager's: what differs in kind, and for floating-point values the numbers to weigh."""

    __slots__ = ("numeric", "error", "_mismatch", "_a", "_e", "_tol", "_shape", "_given", "_reference")

    def __init__(self, reference: str) -> None:
        self.numeric = False  # a float or complex value, judged with a tolerance
        self.error: float | None = None  # its largest absolute difference over elements finite on both sides
        self._mismatch: str | None = None  # a difference no tolerance covers: kind, shape, dtype, an exact value
        self._a: Any = None  # float64 or complex128, flattened
        self._e: Any = None
        self._tol = EXACT
        self._shape: tuple[int, ...] = ()  # a tensor's shape, for the index in messages
        self._given: tuple[Any, Any] | None = None  # Python numbers as given, for messages
        self._reference = reference

    @classmethod
    def of(cls, a: Any, e: Any, reference: str, tolerance: Tolerance | None) -> Leaf:
        import torch

        leaf = cls(reference)
        if isinstance(a, torch.Tensor) or isinstance(e, torch.Tensor):
            leaf._tensors(a, e, tolerance)
            return leaf
        kind_a, kind_e = _number_kind(a), _number_kind(e)
        if kind_a is not None and kind_e is not None:
            if kind_a != kind_e:
                leaf._mismatch = f"{type(a).__name__} {a!r}, {reference} {type(e).__name__} {e!r}"
            elif kind_a in ("bool", "int"):
                leaf.error = float(abs(a - e))
                leaf._mismatch = None if a == e else f"{a!r}, {reference} {e!r}"
            else:
                wide = torch.complex128 if kind_a == "complex" else torch.float64
                leaf._given = (a, e)
                leaf._numbers(torch.tensor([a], dtype=wide), torch.tensor([e], dtype=wide),
                              NUMBER if tolerance is None else tolerance)
            return leaf
        try:
            same = bool(a == e)
        except Exception:  # NOTE: values whose == raises or is not a truth value (arrays) count as different
            same = False
        leaf._mismatch = None if same else f"{a!r}, {reference} {e!r}"
        return leaf

    def _tensors(self, a: Any, e: Any, tolerance: Tolerance | None) -> None:
        import torch

        reference = self._reference
        if not (isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor)):
            self._mismatch = f"{type(a).__name__}, {reference} {type(e).__name__}"
            return
        if a.shape != e.shape or a.dtype != e.dtype:
            self._mismatch = f"{a.dtype} {tuple(a.shape)}, {reference} {e.dtype} {tuple(e.shape)}"
            return
        self._shape = tuple(a.shape)
        a_, e_ = a.detach().cpu().reshape(-1), e.detach().cpu().reshape(-1)
        if not (a_.is_floating_point() or a_.is_complex()):
            if a_.numel():
                self.error = float((a_.to(torch.float64) - e_.to(torch.float64)).abs().max())
            if not torch.equal(a_, e_):
                unequal = a_ != e_
                at = int(unequal.nonzero()[0, 0])
                self._mismatch = (f"{self._count(int(unequal.sum()))}{_element(a_[at])}{self._at(at)}, {reference} "
                                  f"{_element(e_[at])}")
            return
        wide = torch.complex128 if a_.is_complex() else torch.float64
        self._numbers(a_.to(wide), e_.to(wide), dtype_tolerance(a.dtype) if tolerance is None else tolerance)

    def _numbers(self, a: Any, e: Any, tolerance: Tolerance) -> None:
        """Float or complex values (flat, wide): non-finite ones first, then the finite ones' largest difference."""
        import torch

        self.numeric, self._a, self._e, self._tol = True, a, e, tolerance
        finite_e, finite_a = torch.isfinite(e), torch.isfinite(a)
        # NOTE: where eager's value is not finite the run's must be the same (NaN for NaN, the same inf); where eager's
        # is finite, so must the run's be: no tolerance takes a NaN
        same = (a == e) | (torch.isnan(a) & torch.isnan(e))
        bad = (~finite_e & ~same) | (finite_e & ~finite_a)
        if bool(bad.any()):
            at = int(bad.nonzero()[0, 0])
            what = "not finite: " if bool(finite_e[at]) else ""
            self._mismatch = (f"{self._count(int(bad.sum()))}{what}{self._show(a, at)}{self._at(at)}, "
                              f"{self._reference} {self._show(e, at)}")
        both = finite_e & finite_a
        if bool(both.any()):
            self.error = float((a[both] - e[both]).abs().max())

    @property
    def weighed(self) -> bool:
        """A float or complex value whose only differences from eager's are within some tolerance (none of kind, shape,
        exact value or finiteness)."""
        return self.numeric and self._mismatch is None

    def _count(self, n: int) -> str:
        """``3 of 64 elements differ: `` for a tensor of more than one element."""
        size = 1
        for d in self._shape:
            size *= d
        return f"{n} of {size} elements differ: " if self._given is None and size > 1 else ""

    def _at(self, flat: int) -> str:
        return f" at index {_index(flat, self._shape)}" if self._given is None and self._shape else ""

    def _show(self, x: Any, at: int) -> str:
        if self._given is not None:
            return repr(self._given[0 if x is self._a else 1])
        return _element(x[at])

    def why(self, atol: float | None = None) -> str | None:
        """Why the value is not equal to eager's at the base tolerance (its ``atol`` raised to ``atol`` when given),
        or None when it is."""
        if self._mismatch is not None or not self.numeric:
            return self._mismatch
        import torch

        tol = self._tol if atol is None else Tolerance(self._tol.rtol, max(self._tol.atol, atol))
        a, e = self._a, self._e
        both = torch.isfinite(a) & torch.isfinite(e)
        zero = torch.zeros((), dtype=torch.float64)
        diff = torch.where(both, (a - e).abs(), zero)
        beyond = diff > tol.atol + tol.rtol * torch.where(both, e.abs(), zero)
        if not bool(beyond.any()):
            return None
        at = int(torch.argmax(torch.where(beyond, diff, torch.full((), -1.0, dtype=torch.float64))))
        return (f"{self._count(int(beyond.sum()))}{self._show(a, at)}{self._at(at)}, {self._reference} "
                f"{self._show(e, at)} (difference {float(diff[at]):.3g}; {tolerance_text(tol)})")

    def insane(self) -> str | None:
        """Why thunder without graphs' value (this leaf's run) is no yardstick, or None: a mismatch no tolerance covers
        (not finite where eager is, another kind or exact value), or a difference beyond `sane_bound`."""
        if self._mismatch is not None or not self.numeric:
            return self._mismatch
        import torch

        finite = torch.isfinite(self._e)
        scale = float(self._e[finite].abs().max()) if bool(finite.any()) else 0.0
        bound = sane_bound(self._tol, scale)
        if self.error is not None and self.error > bound:
            return f"{self.error:.3g} from eager's, beyond {bound:.3g} (the sane bound for values up to {scale:.3g})"
        return None


def tolerance_text(tol: Tolerance) -> str:
    return "exact" if tol == EXACT else f"rtol {tol.rtol:.2g}, atol {tol.atol:.2g}"


def _element(x: Any) -> str:
    """One element for a message: a float to 8 significant digits, with its point (``1.0``, not ``1``)."""
    v = x.item()
    if not isinstance(v, float):
        return repr(v)
    text = f"{v:.8g}"
    return text if any(c in text for c in ".enia") else f"{text}.0"


def _index(flat: int, shape: Any) -> str:
    """``(1, 3)``: a flat index as the tensor's own (a plain number without a shape)."""
    if not shape:
        return str(flat)
    idx = []
    for n in reversed(tuple(shape)):
        idx.append(flat % n)
        flat //= n
    return str(tuple(reversed(idx)))


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


def _number_kind(x: Any) -> str | None:
    """``"bool"``, ``"int"``, ``"float"`` or ``"complex"`` for a Python number (subclasses too), else None."""
    for kind, cls in (("bool", bool), ("int", int), ("float", float), ("complex", complex)):
        if isinstance(x, cls):
            return kind
    return None

