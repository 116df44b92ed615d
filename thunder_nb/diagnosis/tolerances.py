"""The tolerances of the one judge of "equal" (`thunder_nb.diagnosis.judge`): the base tolerance of each kind of value
(its rule 3) and how far thunder without graphs may be from eager and still be a yardstick (its rule 4)."""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["Tolerance", "dtype_tolerance", "sane_bound", "EXACT", "NUMBER", "MODEL", "TRAINED", "AUTOCAST", "WIDEN",
           "SANE_FACTOR", "SANE_FRACTION"]


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

