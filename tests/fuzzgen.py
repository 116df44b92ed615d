"""Moved into the package: the fuzzer is `thunder_nb.testing.fuzz`, emulated capture `thunder_nb.testing`.

This shim keeps ``fuzzgen.emulated_capture`` and ``fuzzgen.make_transform`` working for
tests/test_fix.py until it imports them from `thunder_nb.testing` and `thunder_nb.testing.modes`.
"""

from thunder_nb.testing import emulated_capture
from thunder_nb.testing.modes import make_transform

__all__ = ["emulated_capture", "make_transform"]
