"""Capture modes for tests and the fuzzer: real capture, regions run eagerly, or emulated capture on the CPU."""

from __future__ import annotations

import contextlib
from typing import Any

from ..cudagraph.capture import Capture, parse_capture
from .emulate import emulated_capture

__all__ = ["CaptureMode", "MODES", "check_mode", "mode_name", "capturing", "make_transform", "stock_transform",
           "jit_capture", "emulate_runner"]

#: The tests' modes are `Capture`'s CUDA (real capture, needs a GPU), OFF (regions run eagerly) and EMULATED (the
#: runners' capture path with CPU stand-ins for graphs, `thunder_nb.testing.emulated_capture`); never AUTO.
CaptureMode = Capture

#: Each mode's short name, as the fuzzer's figures and the rule table use it.
MODES: dict[Capture, str] = {Capture.OFF: "eager", Capture.EMULATED: "emulated", Capture.CUDA: "real"}


def check_mode(capture: Any) -> Capture:
    """``capture`` parsed (`thunder_nb.cudagraph.capture.parse_capture`: True, False, ``"emulated"``, a `Capture`)
    and refused when it is AUTO: the tests name their mode."""
    mode = parse_capture(capture)
    if mode is Capture.AUTO:
        raise ValueError("the tests name their capture mode: True, False or 'emulated', not 'auto'")
    return mode


def mode_name(capture: Any) -> str:
    """``"real"``, ``"eager"`` or ``"emulated"``."""
    return MODES[check_mode(capture)]


def capturing(capture: Any) -> contextlib.AbstractContextManager:
    """The context to compile and run in: `emulated_capture` for EMULATED, nothing otherwise."""
    return emulated_capture() if check_mode(capture) is Capture.EMULATED else contextlib.nullcontext()


def jit_capture(capture: Any) -> Capture:
    """What a transform (or `thunder_nb.jit`) takes for the mode ``capture``: CUDA for CUDA, else OFF (EMULATED is set
    on its runner afterwards: `emulate_runner`)."""
    return Capture.CUDA if check_mode(capture) is Capture.CUDA else Capture.OFF


def emulate_runner(transform: Any, capture: Any) -> Any:
    """``transform`` with its runner on the capture path when the mode is EMULATED (its graphs are then
    `emulated_capture`'s stand-ins); return it."""
    if check_mode(capture) is Capture.EMULATED:
        transform.cuda_graph_runner.capture = Capture.EMULATED
    return transform


def make_transform(cls: type, capture: Any, **options: Any) -> Any:
    """A thunder-nb transform (``FixedCUDAGraphTransform``, ``LegacyCUDAGraphTransform``) in mode ``capture``."""
    return emulate_runner(cls(capture=jit_capture(capture), **options), capture)


def stock_transform(capture: Any) -> Any:
    """thunder's own ``CUDAGraphTransform`` in mode ``capture``, its runner's behaviour recorded.

    Its runner is ``ThunderNBRunner(stock=True)``: thunder's call path as it is (static inputs by
    position, outputs handed out as they are), which also records graphs and static inputs that
    received another tensor (the ``static-input-rebound`` rule), and runs regions eagerly when
    ``capture`` is OFF.
    """
    from thunder.transforms.cudagraph import CUDAGraphTransform

    from ..cudagraph.runner import ThunderNBRunner

    transform = CUDAGraphTransform()
    transform.cuda_graph_runner = ThunderNBRunner(capture=check_mode(capture), stock=True)
    return transform
