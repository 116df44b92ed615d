"""thunder-nb: see, fix and run Lightning Thunder's CUDA-graph regions from a Jupyter notebook."""

from __future__ import annotations

from typing import Any

from .model import Defect, Island, Region, Report, Site, TraceReport, Value

__all__ = [
    "Defect",
    "Island",
    "Region",
    "Report",
    "Site",
    "TraceReport",
    "Value",
    "analyze",
    "analyze_trace",
    "check",
    "FixedCUDAGraphTransform",
    "LegacyCUDAGraphTransform",
    "recover_from_failed_capture",
    "compare",
    "Comparison",
    "load_ipython_extension",
]

__version__ = "0.1.0"


def analyze(jfn: Any, *, error: BaseException | str | None = None) -> Report:
    """Build the `Report` of a ``thunder.jit`` function after a call (see `thunder_nb.analysis.analyze`)."""
    from .analysis import analyze as _analyze

    return _analyze(jfn, error=error)


def analyze_trace(trace: Any) -> TraceReport:
    """Build the `TraceReport` of one thunder trace."""
    from .analysis import analyze_trace as _analyze_trace

    return _analyze_trace(trace)


def check(x: Any) -> list[Defect]:
    """Find defects in a `Report`, a thunder trace, or generated source text."""
    from .analysis import check as _check

    return _check(x)


def __getattr__(name: str) -> Any:
    # NOTE: the transforms import thunder (and torch); load them only when asked for
    if name in ("FixedCUDAGraphTransform", "LegacyCUDAGraphTransform", "recover_from_failed_capture"):
        from . import fix

        return getattr(fix, name)
    if name in ("compare", "Comparison"):
        from . import compare as _compare

        return getattr(_compare, name)
    raise AttributeError(f"module 'thunder_nb' has no attribute {name!r}")


def load_ipython_extension(ip: Any) -> None:
    """Register ``%%thunder_cudagraph`` (``%load_ext thunder_nb``)."""
    from .magics import ThunderCUDAGraphMagics

    ip.register_magics(ThunderCUDAGraphMagics)
