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

The tolerances are in `tolerances`, one value against eager's in `judge_leaf`; this module judges whole values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .judge_leaf import Leaf, leaves
from .tolerances import (
    AUTOCAST,
    EXACT,
    MODEL,
    NUMBER,
    SANE_FACTOR,
    SANE_FRACTION,
    TRAINED,
    WIDEN,
    Tolerance,
    dtype_tolerance,
    sane_bound,
)

__all__ = ["Tolerance", "Judgement", "judge", "assert_equal", "leaves", "yardstick_problem", "dtype_tolerance",
           "sane_bound", "EXACT", "NUMBER", "MODEL", "TRAINED", "AUTOCAST", "WIDEN", "SANE_FACTOR", "SANE_FRACTION"]

_DIFFERENCE_CHARS = 240


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
        leaf = Leaf.of(a, e, reference, tolerance)
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
        leaf = Leaf.of(p, e, "eager's", tolerance)
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

