"""The one judge of "equal": a run's values against eager PyTorch's, with the tolerance thunder without CUDA graphs
earns on the same inputs.

Every place that says "equal" or "WRONG" asks `judge`: `thunder_nb.compare`'s verdict, `compare_step`, the zoo,
the fuzzer's oracle, the notebooks and the tests. Its rule:

1. Structure first: the same containers, the same tensor shapes and dtypes, the same kinds of numbers (an int that
   became a float differs); ints, bools and other values exactly.
2. A value that is not finite (NaN, inf) where eager's is finite is wrong, whatever else says otherwise; where
   eager's is not finite, the run's must be the same (NaN for NaN, inf of the same sign).
3. Floating-point values within the base tolerance, ``|run - eager| <= atol + rtol * |eager|`` element by element:
   the one given (`EXACT` where the same kernels run, `TRAINED` after optimizer steps, ...), else the dtype's own
   (`dtype_tolerance`: ``torch.testing.assert_close``'s table, never ``torch.allclose``'s 1e-8, which calls a
   last-bit difference of a value near zero wrong).
4. Beyond it, a run may differ from eager as much as thunder without graphs does (``without_graphs``: the same
   function, the same executors and inputs, no CUDA graphs): each value's ``atol`` becomes ``WIDEN`` times that
   reference's largest difference from eager there. The reference earns this only while it is sane itself: every
   value finite where eager's is, every exact part equal, and no float value further from eager than
   `sane_bound` (``SANE_FACTOR`` times the base tolerance, or ``SANE_FRACTION`` of the value's own scale, the
   larger). A reference that is not (thunder's torchcompile executor training resnet18 into NaN) widens nothing: the
   run then answers to eager's base tolerance alone, and the verdict says thunder without graphs is itself wrong.

CPUs differ in their SIMD kernels and thread counts, so the same thunder-against-eager comparison can be bit-exact on
one machine and 6e-8 apart on another (shared/THUNDER.md); rules 3 and 4 make both "equal".
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = ["Tolerance", "Judgement", "judge", "assert_equal", "leaves", "yardstick_problem", "dtype_tolerance",
           "sane_bound", "EXACT", "NUMBER", "MODEL", "TRAINED", "AUTOCAST", "WIDEN", "SANE_FACTOR", "SANE_FRACTION"]


class Tolerance(NamedTuple):
    """``|run - eager| <= atol + rtol * |eager|``, element by element (``rtol, atol = tolerance`` unpacks it)."""

    rtol: float
    atol: float


#: Where the same kernels run on the same inputs: bit for bit (NaN equal to NaN).
EXACT = Tolerance(0.0, 0.0)
#: Python floats and complex numbers: float32's, as ``torch.testing.assert_close`` takes for float32 tensors (an
#: ``.item()`` number comes from a float32 tensor).
NUMBER = Tolerance(1.3e-6, 1e-5)
#: A model's float32 outputs: many reductions, each of which thunder's kernels may order otherwise than eager's.
MODEL = Tolerance(1e-4, 1e-5)
#: Parameters, buffers and losses after optimizer steps: AdamW's normalised update turns a gradient's last-bit
#: difference into up to 1e-4 of a weight.
TRAINED = Tolerance(1e-4, 1e-4)
#: bfloat16 under autocast (thunder's cross-entropy runs in bfloat16 where eager's runs in float32).
AUTOCAST = Tolerance(2e-2, 2e-2)

#: How far a run may differ from eager, in multiples of thunder-without-graphs' own largest difference from eager on
#: that value. Where the graphs run that reference's own kernels the two are equal bit for bit, and 1 would do; 4
#: leaves room for a loop that grows any last-bit change (resnet18's BatchNorm over 4 samples at the zoo's size).
WIDEN = 4.0
#: Thunder without graphs is itself wrong on a value beyond this many times the base tolerance from eager's ...
SANE_FACTOR = 100.0
#: ... and beyond this fraction of the value's scale (its largest magnitude in eager's run), whichever is larger.
SANE_FRACTION = 0.1

_DIFFERENCE_CHARS = 240


def dtype_tolerance(dtype: Any) -> Tolerance:
    """The base tolerance of a tensor dtype (``torch.testing.assert_close``'s table); `EXACT` for integers and bools."""
    import torch

    table = {torch.float16: Tolerance(1e-3, 1e-5), torch.bfloat16: Tolerance(1.6e-2, 1e-5),
             torch.float32: Tolerance(1.3e-6, 1e-5), torch.float64: Tolerance(1e-7, 1e-7),
             torch.complex32: Tolerance(1e-3, 1e-5), torch.complex64: Tolerance(1.3e-6, 1e-5),
             torch.complex128: Tolerance(1e-7, 1e-7)}
    return table.get(dtype, EXACT)


def sane_bound(tolerance: Tolerance, scale: float) -> float:
    """The largest difference from eager thunder without graphs may have on a value of magnitude ``scale`` (its
    largest ``|eager|``) and still stand as the yardstick of a run's: see the module's rule 4."""
    return max(SANE_FACTOR * (tolerance.atol + tolerance.rtol * scale), SANE_FRACTION * scale)


@dataclass(frozen=True, slots=True)
class Judgement:
    """The verdict of `judge`.

    ``equal``: the run equals eager's values by the rule. ``difference``: the first value that does not, prefixed
    with its path (``grad['w']``), or None. ``max_abs_error``: the largest absolute difference from eager over the
    values compared (finite elements; None when there were none). ``without_graphs_error``: the same for thunder
    without graphs, when it was given. ``without_graphs_differs``: its first difference from eager at the base
    tolerance (thunder's own numerics), or None. ``without_graphs_wrong``: why it is no yardstick (not finite where
    eager is, an exact part unequal, a value beyond `sane_bound`), or None. ``widened``: the run is equal only
    within thunder-without-graphs' own difference from eager, not within the base tolerance.
    """

    equal: bool
    difference: str | None = None
    max_abs_error: float | None = None
    without_graphs_error: float | None = None
    without_graphs_differs: str | None = None
    without_graphs_wrong: str | None = None
    widened: bool = False

    @property
    def against(self) -> str:
        """What the run was found equal to (or measured against): eager, or eager within thunder's own rounding."""
        if self.widened:
            return "eager, within thunder without graphs' own difference"
        return "eager"

    def __str__(self) -> str:
        """``equal`` or ``WRONG: <the first difference>``: the word a notebook prints."""
        return "equal" if self.equal else f"WRONG: {self.difference}"


def judge(actual: Any, eager: Any, *, without_graphs: Any = None, tolerance: Tolerance | None = None,
          label: str = "result", reference: str = "eager's") -> Judgement:
    """Whether ``actual`` equals ``eager`` (nested tuples, lists and dicts of tensors, numbers and other values), by
    the rule in this module's docstring.

    Args:
        actual: the values of the run judged (a compiled function's result, gradients, parameters after training).
        eager: eager PyTorch's values from the same state and inputs.
        without_graphs: thunder's values without CUDA graphs (the same executors and inputs), the yardstick of how
            far thunder's own numerics take it from eager; None (left out): the base tolerance alone decides.
        tolerance: the base tolerance of every float value; None: each tensor's dtype's (`dtype_tolerance`) and
            `NUMBER` for Python floats.
        label: the path of the top-level value in messages (``result``, ``grad``).
        reference: how messages name eager's value (``eager's``, ``expected``).
    """
    a_leaves, e_leaves = list(leaves(actual, label)), list(leaves(eager, label))
    if len(a_leaves) != len(e_leaves):
        return Judgement(False, f"{label}: {len(a_leaves)} parts, {reference} {len(e_leaves)}")
    plain = _yardstick(without_graphs, e_leaves, label, tolerance) if without_graphs is not None else None
    worst: float | None = None
    first: str | None = None
    widened = False
    for i, ((path, a), (_, e)) in enumerate(zip(a_leaves, e_leaves)):
        leaf = _Leaf.of(a, e, reference, tolerance)
        if leaf.error is not None:
            worst = leaf.error if worst is None else max(worst, leaf.error)
        why = leaf.why()
        if why is not None and plain is not None and plain.wrong is None and leaf.weighed:
            allowance = plain.errors[i]
            if allowance is not None and allowance > 0:
                wider = leaf.why(WIDEN * allowance)
                if wider is None:
                    widened, why = True, None
                else:
                    why = f"{wider} (thunder without graphs differs by {allowance:.3g} here)"
        if why is not None and first is None:
            first = f"{path}: {why}"
    first = _cut(first)
    if first is not None and plain is not None and plain.wrong is not None:
        first = f"{first}; thunder without graphs is itself wrong: {_cut(plain.wrong)}"
    return Judgement(first is None, first, worst,
                     plain.error if plain is not None else None, _cut(plain.differs) if plain is not None else None,
                     _cut(plain.wrong) if plain is not None else None, widened and first is None)


def assert_equal(actual: Any, expected: Any, *, without_graphs: Any = None, tolerance: Tolerance | None = None,
                 label: str = "result", reference: str = "expected") -> Judgement:
    """`judge` for a test: the verdict where ``actual`` equals ``expected``; else AssertionError with the first
    difference (``tolerance=EXACT`` where the same kernels run)."""
    verdict = judge(actual, expected, without_graphs=without_graphs, tolerance=tolerance, label=label,
                    reference=reference)
    if not verdict.equal:
        raise AssertionError(str(verdict))
    return verdict


def yardstick_problem(without_graphs: Any, eager: Any, *, tolerance: Tolerance | None = None,
                      label: str = "result") -> str | None:
    """Why thunder-without-graphs' values are no yardstick of a run's difference from eager's (the rule's point 4:
    not finite where eager's are, an exact part unequal, a value beyond `sane_bound`), or None where they are one."""
    return _cut(_yardstick(without_graphs, list(leaves(eager, label)), label, tolerance).wrong)


def _cut(text: str | None) -> str | None:
    return text if text is None or len(text) <= _DIFFERENCE_CHARS else text[: _DIFFERENCE_CHARS - 1] + "…"


@dataclass(slots=True)
class _Yardstick:
    """Thunder without graphs against eager: its largest difference per leaf, its first difference, and whether it
    is no yardstick at all (``wrong``)."""

    errors: list[float | None]
    error: float | None
    differs: str | None
    wrong: str | None


def _yardstick(plain: Any, e_leaves: list[tuple[str, Any]], label: str, tolerance: Tolerance | None) -> _Yardstick:
    p_leaves = list(leaves(plain, label))
    if len(p_leaves) != len(e_leaves):
        why = f"{label}: {len(p_leaves)} parts, eager's {len(e_leaves)}"
        return _Yardstick([None] * len(e_leaves), None, why, why)
    errors: list[float | None] = []
    worst = differs = wrong = None
    for (path, p), (_, e) in zip(p_leaves, e_leaves):
        leaf = _Leaf.of(p, e, "eager's", tolerance)
        errors.append(leaf.error)
        if leaf.error is not None:
            worst = leaf.error if worst is None else max(worst, leaf.error)
        why = leaf.why()
        if why is not None and differs is None:
            differs = f"{path}: {why}"
        if why is not None and wrong is None:
            insane = leaf.insane()
            if insane is not None:
                wrong = f"{path}: {insane}"
    return _Yardstick(errors, worst, differs, wrong)


class _Leaf:
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
    def of(cls, a: Any, e: Any, reference: str, tolerance: Tolerance | None) -> _Leaf:
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
                f"{self._show(e, at)} (difference {float(diff[at]):.3g}; {_tol_text(tol)})")

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


def _tol_text(tol: Tolerance) -> str:
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
