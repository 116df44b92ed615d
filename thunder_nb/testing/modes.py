"""Capture modes for tests and the fuzzer: real capture, regions run eagerly, or emulated capture on the CPU."""

from __future__ import annotations

import contextlib
from typing import Any, Literal, Union

from ..cudagraph.capture import capture_mode
from .emulate import emulated_capture

__all__ = ["CaptureMode", "MODES", "check_mode", "mode_name", "capturing", "make_transform", "stock_transform"]

#: True: real CUDA-graph capture (needs a GPU); False: regions run eagerly; ``"emulated"``: the
#: runners' capture path with CPU stand-ins for graphs (`thunder_nb.testing.emulated_capture`).
CaptureMode = Union[bool, Literal["emulated"]]

#: Each mode's short name, as the fuzzer's figures and the rule table use it.
MODES: dict[Any, str] = {False: "eager", "emulated": "emulated", True: "real"}


def check_mode(capture: Any) -> CaptureMode:
    """Return ``capture`` if it is a `CaptureMode` (`thunder_nb.cudagraph.capture`'s True or False, or ``"emulated"``:
    the tests' third mode), else raise ValueError."""
    if capture == "emulated":
        return capture
    mode = capture_mode(capture)
    if mode == "auto":
        raise ValueError("the tests name their capture mode: True, False or 'emulated', not 'auto'")
    return mode


def mode_name(capture: CaptureMode) -> str:
    """``"real"``, ``"eager"`` or ``"emulated"``."""
    return MODES[check_mode(capture)]


def capturing(capture: CaptureMode) -> contextlib.AbstractContextManager:
    """The context to compile and run in: `emulated_capture` for ``"emulated"``, nothing otherwise."""
    return emulated_capture() if check_mode(capture) == "emulated" else contextlib.nullcontext()


def make_transform(cls: type, capture: CaptureMode, **options: Any) -> Any:
    """A thunder-nb transform (``FixedCUDAGraphTransform``, ``LegacyCUDAGraphTransform``) in mode ``capture``."""
    transform = cls(capture=check_mode(capture) is True, **options)
    if capture == "emulated":
        transform.cuda_graph_runner.capture = True  # NOTE: the runner's capture path, on emulated graphs
    return transform


def stock_transform(capture: CaptureMode) -> Any:
    """thunder's own ``CUDAGraphTransform`` in mode ``capture``, its runner's behaviour recorded.

    Its runner is ``ThunderNBRunner(stock=True)``: thunder's call path as it is (static inputs by
    position, outputs handed out as they are), which also records graphs and static inputs that
    received another tensor (the ``static-input-rebound`` rule), and runs regions eagerly when
    ``capture`` is False.
    """
    from thunder.transforms.cudagraph import CUDAGraphTransform

    from ..cudagraph.runner import ThunderNBRunner

    transform = CUDAGraphTransform()
    transform.cuda_graph_runner = ThunderNBRunner(capture=check_mode(capture) is not False, stock=True)
    return transform
