"""The two capture modes tests run a case in: emulated on the CPU, real on the GPU (``-m gpu``), and the transforms
made for each (shared by tests/cudagraph/test_memory_safety.py and tests/diagnosis/test_checker.py)."""

from __future__ import annotations

import pytest
from thunder.transforms.cudagraph import CUDAGraphTransform

from thunder_nb.fix import FixedCUDAGraphTransform
from thunder_nb.testing import modes

MODES = ["emulated", pytest.param("gpu", marks=pytest.mark.gpu)]
#: Each test mode as a `thunder_nb.testing.modes` capture mode.
CAPTURE = {"emulated": "emulated", "gpu": True}


def device_of(mode: str) -> str:
    return "cuda" if mode == "gpu" else "cpu"


def capturing(mode: str):
    """Real capture on the GPU; on the CPU, the emulated one."""
    return modes.capturing(CAPTURE[mode])


def fixed(mode: str, **options) -> FixedCUDAGraphTransform:
    """A fixed transform that takes the capture path in ``mode``."""
    return modes.make_transform(FixedCUDAGraphTransform, CAPTURE[mode], **options)


def stock(mode: str) -> CUDAGraphTransform:
    """thunder's own transform, its runner behaving as thunder's and recording what it does."""
    return modes.stock_transform(CAPTURE[mode])
