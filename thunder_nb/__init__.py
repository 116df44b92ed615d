"""thunder-nb: see, fix and run Lightning Thunder's CUDA-graph regions from a Jupyter notebook."""

from __future__ import annotations

from typing import Any

from . import render  # NOTE: a Report shows itself through it (`diagnosis.model.VIEWS`); it never imports thunder
from .cudagraph.notices import install_warning_format
from .diagnosis.model import Defect, Outside, Region, Report, Site, TraceReport, Value

__all__ = [
    "Defect",
    "Outside",
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
    "jit",
    "jit_step",
    "capturability",
    "compare_step",
    "recover_from_failed_capture",
    "compare",
    "Comparison",
    "judge",
    "Judgement",
    "load_ipython_extension",
]

__version__ = "0.1.0"

# NOTE: thunder-nb's warnings, printed as one line addressed to the user (`thunder-nb: RecaptureWarning: ...`) in plain
# Python too, not as the library file and line of code that raised them; every other warning keeps its format
install_warning_format()


def analyze(jfn: Any, *, error: BaseException | str | None = None) -> Report:
    """Build the `Report` of a ``thunder.jit`` function after a call (see `thunder_nb.diagnosis.analysis.analyze`)."""
    from .diagnosis.analysis import analyze as _analyze

    return _analyze(jfn, error=error)


def analyze_trace(trace: Any) -> Report:
    """Build the `Report` of one thunder trace (its only trace is ``report.forward``, whatever its kind)."""
    from .diagnosis.analysis import analyze_trace as _analyze_trace

    tr = _analyze_trace(trace)
    labels = {getattr(b.sym.executor, "label", None) for b in trace.bound_symbols if getattr(b.sym, "is_fusion", False)}
    labels.discard(None)
    transform = labels.pop() if len(labels) == 1 else ("stock" if tr.regions else "none")
    return Report(function=tr.name, transform=transform, forward=tr)


def check(x: Any) -> list[Defect]:
    """Find defects in a `Report`, a thunder trace, or generated source text."""
    from .diagnosis.analysis import check as _check

    return _check(x)


def __getattr__(name: str) -> Any:
    # NOTE: the transforms import thunder (and torch); load them only when asked for
    if name in ("FixedCUDAGraphTransform", "LegacyCUDAGraphTransform", "recover_from_failed_capture", "jit"):
        from . import fix

        return getattr(fix, name)
    if name in ("jit_step", "capturability", "compare_step"):
        from . import step

        return getattr(step, name)
    if name in ("judge", "Judgement"):
        # NOTE: the one judge of "equal": every verdict of thunder-nb, the notebooks' included, asks it
        from .diagnosis import judge

        return getattr(judge, name)
    if name in ("compare", "Comparison"):
        from .notebook import comparison

        return getattr(comparison, name)
    raise AttributeError(f"module 'thunder_nb' has no attribute {name!r}")


def load_ipython_extension(ip: Any) -> None:
    """Register ``%%thunder_cudagraph`` (``%load_ext thunder_nb``)."""
    from .magics import ThunderCUDAGraphMagics

    ip.register_magics(ThunderCUDAGraphMagics)
